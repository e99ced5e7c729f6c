//! Read-only views of the scheduler's KV pool (block states, cached blocks, free list, block
//! tables, invariants): inspection, O(blocks), never on a step's path. Split from `kv.rs`.

use super::Kv;
use crate::kv::{BlockHash, BlockId, KvCapacity, PrefixPool};

impl Kv {
    /// Per block of the block-hash pool or the coordinator, how many requests hold it and
    /// the hash it caches (the coordinator's block 0 is the null block: 0 and `None`).
    /// Empty for the radix pool, whose pages carry no per-block state. O(blocks).
    pub fn block_states(&self) -> Vec<(u32, Option<BlockHash>)> {
        match self {
            Kv::BlockHash(p) => (0..p.num_total_blocks() as BlockId)
                .map(|b| (p.ref_count(b).unwrap_or(0), p.block_hash(b)))
                .collect(),
            Kv::Radix(_) => Vec::new(),
            Kv::Hybrid(h) => (0..h.pool.num_total_blocks() as BlockId + 1)
                .map(|b| (h.pool.ref_count(b).unwrap_or(0), h.pool.block_hash(b)))
                .collect(),
        }
    }

    /// The block of `group` caching `hash` (`BlockPool::cached_block`; the single pool
    /// has group 0 only); `None` for the radix pool.
    pub fn cached_block(&self, hash: BlockHash, group: usize) -> Option<BlockId> {
        match self {
            Kv::BlockHash(p) => (group == 0).then(|| p.cached_block(hash)).flatten(),
            Kv::Radix(_) => None,
            Kv::Hybrid(h) => (group < h.pool.groups().len())
                .then(|| h.pool.cached_block(hash, group))
                .flatten(),
        }
    }

    /// Free block ids, next to be handed out first (empty for the radix pool).
    pub fn free_block_ids(&self) -> Vec<BlockId> {
        match self {
            Kv::BlockHash(p) => p.free_block_ids(),
            Kv::Radix(_) => Vec::new(),
            Kv::Hybrid(h) => h.pool.free_block_ids(),
        }
    }

    /// The slot's block table of each group (one for a single pool), `None` if it holds
    /// no blocks.
    pub fn block_tables(&self, slot: u32) -> Option<Vec<Vec<BlockId>>> {
        match self {
            Kv::Hybrid(h) => Some(
                (h.pool.block_ids(&slot)?)
                    .into_iter()
                    .map(<[BlockId]>::to_vec)
                    .collect(),
            ),
            _ => Some(vec![self.block_ids(slot)?.to_vec()]),
        }
    }

    /// Per group, the slot's leading blocks registered in the prefix cache (vLLM's
    /// `num_cached_block`), `None` if it holds no blocks or the pool is the radix one.
    pub fn num_cached_blocks_of(&self, slot: u32) -> Option<Vec<usize>> {
        match self {
            Kv::BlockHash(p) => Some(vec![p.num_cached_blocks_of(&slot)?]),
            Kv::Radix(_) => None,
            Kv::Hybrid(h) => Some(h.pool.num_cached_blocks_of(&slot)?.to_vec()),
        }
    }

    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        match self {
            Kv::BlockHash(p) => PrefixPool::<u32>::check_invariants(p),
            Kv::Radix(p) => PrefixPool::<u32>::check_invariants(p),
            Kv::Hybrid(h) => h.pool.check_invariants(),
        }
    }
}
