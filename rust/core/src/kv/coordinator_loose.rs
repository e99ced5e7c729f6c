//! The coordinator's blocks held outside any request (`kv::loose_blocks`): vLLM's
//! `BlockPool.get_new_blocks` and `free_blocks` called directly, and the endpoints of a
//! queued block copy (`sched::block_free`).

use super::{BlockId, Eviction, KvCapacity, KvCoordinator, RequestKey};
use crate::Result;

impl<R: RequestKey> KvCoordinator<R> {
    /// `BlockPool::take_loose_blocks` over the coordinator's pool (never the null block).
    pub fn take_loose_blocks(&mut self, num_blocks: usize) -> Result<Vec<BlockId>> {
        let num_free = self.num_free_blocks();
        let mut eviction = Eviction {
            cached: &mut self.cached,
            events: &mut self.events,
            host: &mut None,
            stats: &mut self.stats,
            secondary: Some(&mut self.secondary),
        };
        (self.loose).take(
            &mut self.free_queue,
            &mut self.blocks,
            &mut eviction,
            (num_blocks, num_free),
        )
    }

    /// `BlockPool::release_loose_blocks` over the coordinator's pool.
    pub fn release_loose_blocks(&mut self, ordered: &[BlockId]) -> Result<()> {
        (self.loose).release(&mut self.free_queue, &mut self.blocks, ordered)
    }

    /// `BlockPool::touch_loose_blocks` over the coordinator's pool. `InputError`
    /// (`block_ids`) for the null block (0; vLLM's `touch` skips it, so callers drop it) or
    /// an id past the pool; nothing changes then.
    pub fn touch_loose_blocks(&mut self, block_ids: &[BlockId]) -> Result<()> {
        (self.loose).touch(&mut self.free_queue, &mut self.blocks, block_ids, 1)
    }

    /// The references held on `block` outside any request.
    pub fn loose_refs(&self, block: BlockId) -> u32 {
        self.loose.refs(block)
    }
}
