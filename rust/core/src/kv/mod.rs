//! KV-cache memory: three allocators behind one small trait.
//!
//! - [`CountingAllocator`] — Vidur's: only counts blocks per request.
//! - [`BlockPool`] — vLLM V1's: real block ids with ref counts, an LRU free queue and a
//!   block-hash prefix cache.
//! - [`RadixCache`] — SGLang's: a radix tree over token ids whose values are KV slots.
//!
//! [`RunBlockPool`] is the block pool over a free queue of runs ([`RunQueue`]): the same
//! answers block for block (`run_pool_tests`), and the step scheduler's pool.
//!
//! [`HostTier`] extends the block pool's prefix cache into host memory. [`KvCoordinator`]
//! is vLLM's KV cache coordinator: one group per layer kind of a hybrid model (full
//! attention, sliding window, chunked local, Mamba) over one pool of blocks.
//!
//! Invariant shared by all three (checked by `check_invariants` and by property tests):
//! memory is conserved — nothing is owned twice and nothing is lost.

mod block_hash;
mod block_ops;
mod block_pool;
mod cache_map;
mod coordinator;
mod counting;
mod free_queue;
mod hisparse_connector;
mod hisparse_residency;
mod hisparse_shared;
mod host_publication;
mod host_tier;
mod layer_groups;
mod lookahead;
mod loose_blocks;
mod named_cache;
#[cfg(test)]
mod named_pool_tests;
mod partial_cow;
mod partial_hits;
mod prefix_pool;
mod radix;
mod radix_pool;
#[cfg(test)]
mod run_pool_tests;
mod run_queue;

pub use block_hash::{
    BlockHash, content_block, hash_block, hash_block_id, hash_content, hash_full_blocks,
};
pub use block_pool::{BlockId, BlockPool, BlockPoolStats, CacheCall, ComputedBlocks, KvEvent};
pub use coordinator::{
    ExternalAllocation, GroupedComputedBlocks, KvCoordinator, MAX_NUM_GROUPS, group_block_hash,
    prefix_cacheable,
};
pub use counting::CountingAllocator;
pub use free_queue::{FreeBlockQueue, FreeQueue};
pub use hisparse_connector::{HiSparseConnectorKv, HiSparseConnectorPool};
pub use hisparse_residency::{DeviceResidency, DeviceTables, DeviceTransfer};
pub use host_publication::{HostPublication, HostTransfer};
pub use host_tier::HostTier;
pub use layer_groups::{
    KvGroupSpec, NULL_BLOCK, mamba_checkpoint_position, mamba_checkpoint_valid,
};
pub use lookahead::{PrefixRules, hash_full_blocks_lookahead};
pub use partial_cow::{
    AlignPartialState, CopyKind, CopyQueue, CowCopy, PartialEntries, PartialSlot,
    align_blocks_needed, align_partial_tail, allocate_align_partial, allocate_full_partial,
    full_blocks_needed, full_partial_tail, partial_slot,
};
pub use partial_hits::{
    FineHit, find_fine_grained_hit, mamba_checkpoint_valid_on, partial_hash_hits_enabled,
    partial_local_hit,
};
pub use prefix_pool::PrefixPool;
pub use radix::{MatchResult, NodeHandle, RadixCache};
pub use radix_pool::{RadixHit, RadixPool};
pub use run_queue::RunQueue;

/// The block pool over a free queue of runs: the same answers as [`BlockPool`], block for
/// block (checked by `run_pool_tests`), with a queue whose pops and pushes read entries
/// in order rather than links spread over the pool.
pub type RunBlockPool<R> = BlockPool<R, RunQueue>;

use std::fmt::Debug;
use std::hash::Hash;

/// A token id as the model sees it.
pub type TokenId = u32;

/// The largest pool any allocator accepts: block ids must fit in a `u32` with room for a
/// sentinel, and a pool this size is already far beyond any GPU.
pub const MAX_NUM_BLOCKS: usize = 1 << 30;

/// What identifies a request to an allocator: an integer, a string, or an arena index.
/// Ordered: vLLM breaks priority ties by request id.
pub trait RequestKey: Hash + Eq + Ord + Clone + Debug {}
impl<T: Hash + Eq + Ord + Clone + Debug> RequestKey for T {}

/// The view of a block allocator a scheduler needs to reason about memory pressure.
pub trait KvCapacity {
    /// Total blocks managed.
    fn num_total_blocks(&self) -> usize;
    /// Blocks that can be handed out right now (for a prefix-caching pool this includes
    /// cached blocks no request holds, which are evicted on demand).
    fn num_free_blocks(&self) -> usize;
    /// Fraction of blocks in use, in [0, 1].
    fn usage(&self) -> f64 {
        let total = self.num_total_blocks();
        (total - self.num_free_blocks()) as f64 / total as f64
    }
}

/// Checks a pool size shared by every allocator's constructor.
fn check_num_blocks(num_blocks: usize) -> crate::Result<()> {
    if num_blocks == 0 || num_blocks > MAX_NUM_BLOCKS {
        return Err(crate::Error::config(
            "num_blocks",
            num_blocks,
            format!("must be between 1 and {MAX_NUM_BLOCKS}"),
        ));
    }
    Ok(())
}

/// Checks a block size shared by the block pool's and the coordinator's constructors.
fn check_block_size(block_size: usize) -> crate::Result<()> {
    if block_size == 0 || block_size > block_pool::MAX_BLOCK_SIZE {
        return Err(crate::Error::config(
            "block_size",
            block_size,
            format!("must be between 1 and {}", block_pool::MAX_BLOCK_SIZE),
        ));
    }
    Ok(())
}

/// `vec![value; len]` for a pool's per-block arrays, or a `Config` error naming `field`
/// when the machine cannot give the memory: a size it cannot hold is refused, never an
/// abort of the process.
pub(crate) fn try_filled_vec<T: Clone>(
    len: usize,
    value: T,
    field: &'static str,
) -> crate::Result<Vec<T>> {
    let mut items = Vec::new();
    if items.try_reserve_exact(len).is_err() {
        return Err(crate::Error::config(
            field,
            len,
            format!(
                "the machine cannot allocate {} MB for it",
                (len as u64 * std::mem::size_of::<T>() as u64).div_ceil(1 << 20)
            ),
        ));
    }
    items.resize(len, value);
    Ok(items)
}

/// Argument checks shared by the block pools' `allocate_slots`.
fn check_allocation(
    request_id: &impl Debug,
    num_new_tokens: usize,
    is_admitted: bool,
    has_hit: bool,
) -> crate::Result<()> {
    if num_new_tokens == 0 {
        return Err(crate::Error::input(
            "num_new_tokens",
            0,
            "must be at least 1",
        ));
    }
    if is_admitted && has_hit {
        return Err(crate::Error::input(
            "new_computed_blocks",
            format!("{request_id:?}"),
            "only allowed on a request's first allocation",
        ));
    }
    Ok(())
}

/// An `extra_key` passed again must be the one used before (`None` keeps it): `used_before`
/// says where, e.g. "the lookup used".
#[inline]
fn check_extra_key(
    extra_key: Option<u64>,
    expected: Option<u64>,
    used_before: &str,
) -> crate::Result<()> {
    if extra_key.is_some() && extra_key != expected {
        return Err(extra_key_error(extra_key, expected, used_before));
    }
    Ok(())
}

/// `check_extra_key`'s error, apart: the check runs for every running request every step,
/// the formatting almost never.
#[cold]
fn extra_key_error(
    extra_key: Option<u64>,
    expected: Option<u64>,
    used_before: &str,
) -> crate::Error {
    crate::Error::input(
        "extra_key",
        format!("{extra_key:?}"),
        format!("{used_before} {expected:?}"),
    )
}

/// What a prefix lookup was over, kept with its hit: the hit handed to `allocate_slots`
/// must come from a lookup over the same token ids under the same extra key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LookupQuery {
    num_tokens: usize,
    extra_key: Option<u64>,
}

impl LookupQuery {
    fn check_matches(&self, num_token_ids: usize, extra_key: Option<u64>) -> crate::Result<()> {
        if self.num_tokens != num_token_ids {
            return Err(crate::Error::input(
                "new_computed_blocks",
                format!("lookup over {} tokens", self.num_tokens),
                format!("token_ids has {num_token_ids} tokens; pass the ids that were looked up"),
            ));
        }
        check_extra_key(extra_key, self.extra_key, "the lookup used")
    }
}

/// Blocks to add so `num_slots` token slots fit, given `num_held` blocks of `block_size`.
fn blocks_needed(num_slots: usize, block_size: usize, num_held: usize) -> usize {
    num_slots.div_ceil(block_size).saturating_sub(num_held)
}
