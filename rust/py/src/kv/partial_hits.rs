//! vLLM 0.33's fine-grained partial-hash-hit rules (`tokenyard_core::kv::partial_hits`):
//! whether a layout turns them on, and one group's fine-grained hit, as functions.

use pyo3::prelude::*;
use tokenyard_core::kv::{BlockId, find_fine_grained_hit, partial_hash_hits_enabled};

use super::group_spec;
use crate::errors::config_error;

/// vLLM 0.33's `partial_hash_hits_enabled` (no DCP): `groups` are tokenyard's KV group
/// specs, `block_sizes` each group's block size.
#[pyfunction(name = "partial_hash_hits_enabled")]
#[pyo3(signature = (groups, block_sizes, hash_block_size))]
pub(crate) fn hits_enabled(
    py: Python<'_>,
    groups: Vec<Bound<'_, PyAny>>,
    block_sizes: Vec<usize>,
    hash_block_size: usize,
) -> PyResult<bool> {
    if groups.len() != block_sizes.len() {
        let reason = format!("must give one size per group ({} groups)", groups.len());
        return Err(config_error(py, "block_sizes", block_sizes.len(), &reason));
    }
    let specs = (groups.iter().enumerate())
        .map(|(i, g)| group_spec(g, "groups", i))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(partial_hash_hits_enabled(
        &specs,
        &block_sizes,
        hash_block_size,
    ))
}

/// One full-attention (`mamba` false) or Mamba `align` group's fine-grained hit over a
/// request of `num_hashes` hash blocks: `cached[i]` is the block cached under hash block
/// `i`'s hash, or None. Returns the hit's blocks and its length in tokens.
#[pyfunction(name = "fine_grained_hit")]
#[pyo3(signature = (*, mamba, block_size, hash_block_size, cached, max_length, drop_eagle_block=false))]
pub(crate) fn fine_hit(
    py: Python<'_>,
    mamba: bool,
    block_size: usize,
    hash_block_size: usize,
    cached: Vec<Option<BlockId>>,
    max_length: usize,
    drop_eagle_block: bool,
) -> PyResult<(Vec<BlockId>, usize)> {
    if hash_block_size == 0
        || block_size <= hash_block_size
        || !block_size.is_multiple_of(hash_block_size)
    {
        let reason = format!("must be a larger multiple of hash_block_size={hash_block_size}");
        return Err(config_error(py, "block_size", block_size, &reason));
    }
    let lookup = |i: usize| cached.get(i).copied().flatten();
    let hit = find_fine_grained_hit(
        mamba,
        block_size,
        hash_block_size,
        cached.len(),
        max_length,
        drop_eagle_block,
        lookup,
    );
    Ok((hit.blocks, hit.num_tokens))
}
