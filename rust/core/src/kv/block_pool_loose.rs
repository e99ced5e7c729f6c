//! The block pool's blocks held outside any request (`kv::loose_blocks`): vLLM's
//! `BlockPool.get_new_blocks` and `free_blocks` called directly.

use super::{BlockId, BlockPool, Eviction, FreeQueue, KvCapacity, RequestKey};
use crate::Result;

impl<R: RequestKey, Q: FreeQueue> BlockPool<R, Q> {
    /// vLLM 0.33's `BlockPool.get_new_blocks(num_blocks)`: that many blocks from the front
    /// of the free queue (evicting their cached prefixes, as an allocation does), each
    /// held once outside any request until [`Self::release_loose_blocks`].
    ///
    /// Errors: `InputError` (`num_blocks`) when fewer blocks are free; nothing changes.
    pub fn take_loose_blocks(&mut self, num_blocks: usize) -> Result<Vec<BlockId>> {
        let num_free = self.num_free_blocks();
        let mut eviction = Eviction {
            cached: &mut self.cached,
            events: &mut self.events,
            host: &mut self.host,
            stats: &mut self.stats,
            secondary: None,
        };
        (self.loose).take(
            &mut self.free_queue,
            &mut self.blocks,
            &mut eviction,
            (num_blocks, num_free),
        )
    }

    /// vLLM 0.33's `BlockPool.free_blocks` on blocks held outside any request: drops one
    /// such reference from each of `ordered` (first evicted first).
    ///
    /// Errors: `InputError` (`block_ids`) for a block without such a reference left;
    /// nothing changes.
    pub fn release_loose_blocks(&mut self, ordered: &[BlockId]) -> Result<()> {
        (self.loose).release(&mut self.free_queue, &mut self.blocks, ordered)
    }

    /// vLLM 0.33's `BlockPool.touch` on blocks named by id (a connector's scheduler side
    /// keeping the blocks it copies): one reference more on each, held outside any request
    /// until [`Self::release_loose_blocks`]; a free block leaves the free queue, keeping its
    /// cached hash (it is not evicted meanwhile, and a prefix hit still finds it).
    ///
    /// Errors: `InputError` (`block_ids`) for an id past the pool; nothing changes.
    pub fn touch_loose_blocks(&mut self, block_ids: &[BlockId]) -> Result<()> {
        (self.loose).touch(&mut self.free_queue, &mut self.blocks, block_ids, 0)
    }

    /// The references held on `block` outside any request.
    pub fn loose_refs(&self, block: BlockId) -> u32 {
        self.loose.refs(block)
    }
}
