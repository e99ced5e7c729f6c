//! vLLM 0.33's fine-grained partial hash hits (`--prefix-match-unit` below a Mamba `align`
//! block): requests are hashed at `hash_block_size`, and a prefix hit may end on any hash
//! boundary, inside a group's block. What a hit is, per group, and when the rule is on:
//!
//! - **On** (`partial_hash_hits_enabled`, vllm/v1/core/kv_cache_utils.py): some Mamba
//!   `align` group's block is larger than the hash block, and every other prefix-cacheable
//!   group either has the hash block size or a manager that supports fine-grained lookups
//!   (`supports_fine_grained_hash_lookup`: full attention and Mamba; a sliding window turns
//!   the rule off). Hits then land on the hash block size
//!   (`HybridKVCacheCoordinator._cache_hit_alignment_tokens`).
//! - **Full attention** (`FullAttentionManager.find_longest_cache_hit`, fine-grained mode):
//!   the longest run of cached full blocks (each keyed by its last hash block's hash), then
//!   one more block whose interior hash boundary is cached (a partial tail entry), the
//!   highest first; EAGLE's drop takes one hash block off.
//! - **Mamba** (`MambaManager.find_longest_cache_hit`, fine-grained mode): right to left
//!   over hash boundaries, the first cached state wins; the blocks before it are nulls.
//! - **Copy-on-write**: a hit that ends inside one of a group's blocks
//!   (`_has_partial_local_hit`) shares a block the owner keeps writing, so the request
//!   takes a private block in its place and the step copies the shared one into it
//!   (`_apply_cow`, `_pending_cow_copies`); [`partial_local_hit`] says which slot.
//!
//! The pure rules live here; the coordinator does not serve the layout yet (the adapter
//! refuses it by name), so nothing calls them outside the tests.
//!
//! Invariant: a hit is a multiple of `hash_block_size` and no longer than `max_length`; a
//! group's hit blocks cover `ceil(hit / block_size)` slots.

use super::block_pool::BlockId;
use super::layer_groups::{KvGroupSpec, NULL_BLOCK};

/// vLLM 0.33's `partial_hash_hits_enabled` (no DCP) over the groups, each with its block
/// size, and the hash block size: a Mamba `align` group larger than the hash block, and no
/// other prefix-cacheable group off the hash block size whose manager lacks fine-grained
/// lookups.
pub fn partial_hash_hits_enabled(
    groups: &[KvGroupSpec],
    block_sizes: &[usize],
    hash_block_size: usize,
) -> bool {
    let sized = || groups.iter().zip(block_sizes.iter().copied());
    let fine_mamba = sized().any(|(g, size)| g.is_mamba_align() && size > hash_block_size);
    fine_mamba
        && sized().all(|(g, size)| {
            !g.caches_blocks() || fine_grained_lookup(g) || size == hash_block_size
        })
}

/// vLLM 0.33's `supports_fine_grained_hash_lookup` of the group's manager.
fn fine_grained_lookup(group: &KvGroupSpec) -> bool {
    matches!(
        group,
        KvGroupSpec::FullAttention | KvGroupSpec::MambaAlign { .. }
    )
}

/// vLLM 0.33's `is_mamba_prefill_checkpoint_valid` with its two sizes apart: whether a
/// backend writing checkpoints at multiples of `alignment` tokens past a chunk's start can
/// export the state at `checkpoint` from inside the chunk `[start, end)` (a start on the
/// hash grid, a Mamba block of state past the chunk's initial state, a hash block of work
/// before the checkpoint, strictly inside the chunk).
pub fn mamba_checkpoint_valid_on(
    start: usize,
    end: usize,
    checkpoint: usize,
    hash_block_size: usize,
    mamba_block_size: usize,
    alignment: usize,
) -> bool {
    let block = mamba_block_size as i64;
    let initial_state_col = (start as i64 - 1).div_euclid(block);
    let checkpoint_col = end.div_ceil(mamba_block_size) as i64 - 2;
    start.is_multiple_of(hash_block_size)
        && checkpoint_col > initial_state_col
        && start + hash_block_size <= checkpoint
        && start < checkpoint
        && checkpoint < end
        && (checkpoint - start).is_multiple_of(alignment)
}

/// One group's fine-grained hit: its table of hit blocks and the hit in tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FineHit {
    pub blocks: Vec<BlockId>,
    pub num_tokens: usize,
}

/// vLLM 0.33's fine-grained `find_longest_cache_hit` of a full-attention (`mamba` false)
/// or Mamba `align` group of `block_size`, a multiple of `hash_block_size` and larger, over
/// a request hashed into `num_hashes` hash blocks, a hit no longer than `max_length`.
/// `lookup(i)` answers the block cached under hash block `i`'s hash (the hash of the
/// request's first `(i + 1) * hash_block_size` tokens), or `None`. `drop_eagle_block`
/// (full attention only: vLLM's Mamba finder never drops) takes a hash block off the hit.
pub fn find_fine_grained_hit(
    mamba: bool,
    block_size: usize,
    hash_block_size: usize,
    num_hashes: usize,
    max_length: usize,
    drop_eagle_block: bool,
    mut lookup: impl FnMut(usize) -> Option<BlockId>,
) -> FineHit {
    let scale = block_size / hash_block_size;
    let mut blocks = Vec::new();
    if mamba {
        let max_units = (max_length / hash_block_size).min(num_hashes);
        for fine in (0..max_units).rev() {
            if let Some(block) = lookup(fine) {
                blocks.resize(fine / scale, NULL_BLOCK);
                blocks.push(block);
                let num_tokens = (fine + 1) * hash_block_size;
                return FineHit { blocks, num_tokens };
            }
        }
        return FineHit {
            blocks,
            num_tokens: 0,
        };
    }
    // Phase 1: full blocks from the start, each keyed by its last hash block's hash
    // (`BlockHashListWithBlockSize`).
    let max_blocks = (max_length / block_size).min(num_hashes / scale);
    for i in 0..max_blocks {
        let Some(block) = lookup((i + 1) * scale - 1) else {
            break;
        };
        blocks.push(block);
    }
    let mut hit = blocks.len() * block_size;
    // Phase 2: the next block's interior boundaries, highest first.
    let first = blocks.len() * scale;
    let last = (first + scale - 1)
        .min(max_length / hash_block_size)
        .min(num_hashes);
    if let Some((fine, block)) = (first..last).rev().find_map(|f| lookup(f).map(|b| (f, b))) {
        blocks.push(block);
        hit = (fine + 1) * hash_block_size;
    }
    if drop_eagle_block && hit > 0 {
        hit -= hash_block_size;
    }
    blocks.truncate(hit.div_ceil(block_size));
    FineHit {
        blocks,
        num_tokens: hit,
    }
}

/// vLLM 0.33's `_has_partial_local_hit` and the slot `add_local_computed_blocks` records
/// for the copy-on-write (`_partial_hit_reqs`): a local hit of `num_local_computed_tokens`
/// over `hit_blocks` that ends inside a block of `block_size` gives the index of that
/// block and the shared block the request must copy instead of writing; `None` otherwise.
pub fn partial_local_hit(
    hit_blocks: &[BlockId],
    num_local_computed_tokens: usize,
    block_size: usize,
) -> Option<(usize, BlockId)> {
    let last = *hit_blocks.last()?;
    (!num_local_computed_tokens.is_multiple_of(block_size))
        .then_some((num_local_computed_tokens / block_size, last))
}

#[cfg(test)]
#[path = "partial_hits_tests.rs"]
mod tests;
