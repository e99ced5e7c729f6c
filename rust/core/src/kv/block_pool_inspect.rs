//! The block pool's read-only views: its counts and stats, a request's table and token
//! counts, a block's ref count and hash, the free queue's order, and the invariant check
//! (O(blocks), for tests and inspection); and the forced free count vLLM's tests set.

use super::{
    BlockHash, BlockId, BlockMeta, BlockPool, BlockPoolStats, FreeQueue, HostTier, RequestKey,
};
use crate::kv::block_ops::{check_cached_count, check_pool_blocks, count_holders};
use crate::{Error, Result};

impl<R: RequestKey, Q: FreeQueue> BlockPool<R, Q> {
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    pub fn stats(&self) -> BlockPoolStats {
        self.stats
    }

    /// Blocks registered in the prefix cache (held or free), copies of a hash included.
    pub fn num_cached_blocks(&self) -> usize {
        self.cached.num_blocks()
    }

    /// Free blocks that still hold a cached prefix (evicted, LRU first, on demand).
    /// O(free blocks): meant for stats, not for a hot path.
    pub fn num_cached_free_blocks(&self) -> usize {
        (self.free_queue.ids().into_iter())
            .filter(|&b| self.blocks[b as usize].cached)
            .count()
    }

    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// The host tier, if the pool has one.
    pub fn host_tier(&self) -> Option<&HostTier> {
        self.host.as_ref()
    }

    /// The request's block table, or `None` if it holds no blocks.
    pub fn block_ids(&self, request_id: &R) -> Option<&[BlockId]> {
        self.requests
            .get(request_id)
            .map(|r| r.block_ids.as_slice())
    }

    /// Tokens of the request whose KV has slots and counts as computed.
    pub fn num_computed_tokens(&self, request_id: &R) -> Option<usize> {
        self.requests.get(request_id).map(|r| r.num_computed_tokens)
    }

    /// Token ids of the request the pool has been given.
    pub fn num_tokens(&self, request_id: &R) -> Option<usize> {
        self.requests.get(request_id).map(|r| r.num_tokens)
    }

    /// Free block ids in eviction order (front first). O(free blocks).
    pub fn free_block_ids(&self) -> Vec<BlockId> {
        self.free_queue.ids()
    }

    pub fn ref_count(&self, block_id: BlockId) -> Option<u32> {
        self.blocks.get(block_id as usize).map(|b| b.ref_cnt)
    }

    /// The hash a block caches (`None` if it caches none, or past the pool).
    pub fn block_hash(&self, block_id: BlockId) -> Option<BlockHash> {
        self.blocks.get(block_id as usize).and_then(BlockMeta::hash)
    }

    /// Leading blocks of the request registered in the prefix cache (vLLM's
    /// `num_cached_block`), or `None` if it holds no blocks.
    pub fn num_cached_blocks_of(&self, request_id: &R) -> Option<usize> {
        self.requests.get(request_id).map(|r| r.num_cached_blocks)
    }

    /// The requests the pool holds an entry (a block table) for, in no order.
    pub fn request_ids(&self) -> impl Iterator<Item = &R> {
        self.requests.keys()
    }

    /// The block caching `hash`, if one does (vLLM's `BlockPool.get_cached_block`).
    pub fn cached_block(&self, hash: BlockHash) -> Option<BlockId> {
        self.cached.get(&hash, self.blocks.as_slice())
    }

    /// Describes the first broken invariant, if any. O(blocks + held blocks).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut holders = vec![0u32; self.blocks.len()];
        for (id, request) in &self.requests {
            if count_holders(&mut holders, request.block_ids.iter().copied()) {
                return Err(format!("request {id:?} holds a block twice"));
            }
            // Not `num_computed_tokens`: a failed load's truncation leaves cached blocks
            // past them until they are recomputed (`truncate_computed_tokens`).
            if request.num_cached_blocks * self.block_size > request.num_tokens {
                return Err(format!(
                    "request {id:?} cached blocks past its known tokens"
                ));
            }
            if request.block_ids.len() * self.block_size < request.num_computed_tokens {
                return Err(format!(
                    "request {id:?} has fewer slots than computed tokens"
                ));
            }
        }
        self.loose.count_into(&mut holders);
        check_pool_blocks(&self.blocks, &self.free_queue, &self.cached, &holders, 0)?;
        let num_hashes = self
            .blocks
            .iter()
            .filter_map(BlockMeta::hash)
            .collect::<rustc_hash::FxHashSet<_>>()
            .len();
        if num_hashes != self.cached.num_hashes() {
            return Err(format!(
                "blocks hold {num_hashes} distinct hashes but the cache map counts {}",
                self.cached.num_hashes()
            ));
        }
        check_cached_count(&self.blocks, &self.cached)?;
        self.host
            .as_ref()
            .map_or(Ok(()), HostTier::check_invariants)
    }
}

impl<R: RequestKey, Q: FreeQueue> BlockPool<R, Q> {
    /// Forces the free count to `num_free_blocks` as vLLM's tests set
    /// `FreeKVCacheBlockQueue.num_free_blocks`: the queue keeps its blocks and order, every
    /// fit check and the count read `num_free_blocks` from now on, and the difference stays
    /// as blocks are taken and freed (vLLM's counter moves with its list).
    ///
    /// # Errors
    /// `Input` naming `num_free_blocks` above the blocks the queue holds (vLLM would hand
    /// out its list's sentinel).
    pub fn force_num_free_blocks(&mut self, num_free_blocks: usize) -> Result<()> {
        let free = self.free_queue.len();
        if num_free_blocks > free {
            return Err(Error::input(
                "num_free_blocks",
                num_free_blocks,
                format!("above the {free} blocks the free queue holds"),
            ));
        }
        self.withheld = free - num_free_blocks;
        Ok(())
    }
}
