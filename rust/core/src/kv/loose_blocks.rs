//! Blocks held outside any request's table: vLLM 0.33's `BlockPool.get_new_blocks` called
//! directly (its tests take blocks by hand) and the references a queued block copy keeps on
//! its endpoints until the step that runs it is processed (`SchedulerOutput.
//! kv_cache_block_copies`, `sched::block_free`). Both pools keep one [`LooseBlocks`]; it
//! counts, per block, the references it holds, which the block's ref count includes.
//!
//! Invariant: a block's ref count is the requests holding it plus its loose references
//! (`check_pool_blocks` counts both), so a loose block is never free.

use rustc_hash::FxHashMap;

use super::BlockId;
use super::block_ops::{BlockMeta, Eviction, release_blocks, take_free_blocks};
use super::free_queue::FreeQueue;
use crate::{Error, Result};

/// The references held on blocks outside any request, per block.
#[derive(Debug, Clone, Default)]
pub(super) struct LooseBlocks {
    refs: FxHashMap<BlockId, u32>,
}

impl LooseBlocks {
    pub(super) fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// The loose references on `block`.
    pub(super) fn refs(&self, block: BlockId) -> u32 {
        self.refs.get(&block).copied().unwrap_or(0)
    }

    /// vLLM's `get_new_blocks(n)`: `n` blocks from the front of the free queue (evicting
    /// what they cached), each with one loose reference. `InputError` (`num_blocks`) when
    /// fewer than `n` are free by the count vLLM checks (`num_free`: the queue less the
    /// blocks a forced count withholds); nothing changes then. Cold: called by hand and by a copy-on-write,
    /// never on the replay's path.
    #[cold]
    #[inline(never)]
    pub(super) fn take(
        &mut self,
        free_queue: &mut impl FreeQueue,
        blocks: &mut [BlockMeta],
        eviction: &mut Eviction<'_>,
        (n, num_free): (usize, usize),
    ) -> Result<Vec<BlockId>> {
        if n > num_free {
            return Err(Error::input(
                "num_blocks",
                n,
                format!("only {num_free} blocks are free"),
            ));
        }
        let mut taken = Vec::with_capacity(n);
        take_free_blocks(free_queue, blocks, eviction, n, &mut taken);
        for &block in &taken {
            *self.refs.entry(block).or_default() += 1;
        }
        Ok(taken)
    }

    /// vLLM's `free_blocks` on loose references: drops one from each of `ordered` (first
    /// evicted first); a block left unheld goes back to the free queue. `InputError`
    /// (`block_ids`) naming a block without a loose reference left for it; nothing changes
    /// then.
    #[cold]
    #[inline(never)]
    pub(super) fn release(
        &mut self,
        free_queue: &mut impl FreeQueue,
        blocks: &mut [BlockMeta],
        ordered: &[BlockId],
    ) -> Result<()> {
        let mut wanted: FxHashMap<BlockId, u32> = FxHashMap::default();
        for &block in ordered {
            let n = wanted.entry(block).or_default();
            *n += 1;
            if *n > self.refs(block) {
                return Err(Error::input(
                    "block_ids",
                    block,
                    "holds no loose reference left to release (blocks of a request's table \
                     are freed with the request)",
                ));
            }
        }
        for &block in ordered {
            let refs = self.refs.get_mut(&block).expect("checked above");
            *refs -= 1;
            if *refs == 0 {
                self.refs.remove(&block);
            }
        }
        release_blocks(free_queue, blocks, ordered.iter().copied(), &mut Vec::new());
        Ok(())
    }

    /// vLLM's `BlockPool.touch` called from outside the scheduler (a connector keeping a
    /// block it copies from or into): one loose reference more on each of `block_ids`,
    /// which leaves the free queue if it was free (its cached hash stays, so it can still be
    /// hit, and it is not evicted until [`Self::release`] drops the reference).
    /// `InputError` (`block_ids`) naming an id past the pool or below `first_block` (the
    /// coordinator's null block); nothing changes then.
    #[cold]
    #[inline(never)]
    pub(super) fn touch(
        &mut self,
        free_queue: &mut impl FreeQueue,
        blocks: &mut [BlockMeta],
        block_ids: &[BlockId],
        first_block: usize,
    ) -> Result<()> {
        if let Some(&bad) =
            (block_ids.iter()).find(|&&b| (b as usize) < first_block || b as usize >= blocks.len())
        {
            return Err(Error::input(
                "block_ids",
                bad,
                format!(
                    "is not a block of this pool (blocks {first_block}..{})",
                    blocks.len()
                ),
            ));
        }
        for &block in block_ids {
            let meta = &mut blocks[block as usize];
            if meta.ref_cnt == 0 {
                free_queue.remove(block);
            }
            meta.ref_cnt += 1;
            *self.refs.entry(block).or_default() += 1;
        }
        Ok(())
    }

    /// Adds the loose references to `holders` (per block, its holders).
    pub(super) fn count_into(&self, holders: &mut [u32]) {
        for (&block, &n) in &self.refs {
            holders[block as usize] += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::kv::{BlockPool, KvCapacity, KvCoordinator, KvGroupSpec};

    #[test]
    fn taken_blocks_are_held_until_released() {
        let mut pool: BlockPool<u32> = BlockPool::new(4, 16, true).unwrap();
        let taken = pool.take_loose_blocks(2).unwrap();
        assert_eq!(taken, vec![0, 1]);
        assert_eq!(pool.num_free_blocks(), 2);
        assert_eq!(pool.ref_count(0), Some(1));
        pool.check_invariants().unwrap();
        pool.release_loose_blocks(&[1]).unwrap();
        assert_eq!(pool.num_free_blocks(), 3);
        assert_eq!(pool.ref_count(1), Some(0));
        pool.check_invariants().unwrap();
    }

    #[test]
    fn releasing_more_than_held_changes_nothing() {
        let mut pool: BlockPool<u32> = BlockPool::new(4, 16, true).unwrap();
        pool.take_loose_blocks(1).unwrap();
        let err = pool.release_loose_blocks(&[0, 0]).unwrap_err();
        assert!(err.to_string().contains("block_ids"), "{err}");
        assert_eq!(pool.ref_count(0), Some(1));
        pool.check_invariants().unwrap();
    }

    #[test]
    fn taking_more_than_free_is_refused() {
        let mut pool: BlockPool<u32> = BlockPool::new(4, 16, true).unwrap();
        let err = pool.take_loose_blocks(5).unwrap_err();
        assert!(err.to_string().contains("num_blocks"), "{err}");
        assert_eq!(pool.num_free_blocks(), 4);
    }

    #[test]
    fn a_held_block_blocks_the_prefix_cache_reset() {
        let mut pool: BlockPool<u32> = BlockPool::new(4, 16, true).unwrap();
        pool.take_loose_blocks(1).unwrap();
        assert!(!pool.reset_prefix_cache());
        pool.release_loose_blocks(&[0]).unwrap();
        assert!(pool.reset_prefix_cache());
    }

    #[test]
    fn the_coordinator_hands_out_blocks_past_the_null_block() {
        let groups = vec![KvGroupSpec::FullAttention, KvGroupSpec::FullAttention];
        let mut pool: KvCoordinator<u32> = KvCoordinator::new(groups, 5, 16, true).unwrap();
        let taken = pool.take_loose_blocks(2).unwrap();
        assert_eq!(taken, vec![1, 2]);
        assert_eq!(pool.ref_count(1), Some(1));
        pool.check_invariants().unwrap();
        assert!(!pool.reset_prefix_cache());
        pool.release_loose_blocks(&taken).unwrap();
        assert_eq!(pool.num_free_blocks(), 4);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn a_touched_block_outlives_its_request_and_returns_cached() {
        // vLLM's SimpleCPUOffloadScheduler touches the blocks it stores; the request's free
        // leaves them held, the connector's free_blocks puts them at the back, still cached.
        let mut pool: BlockPool<u32> = BlockPool::new(4, 4, true).unwrap();
        let prompt: Vec<u32> = (0..9).collect();
        let table = pool
            .allocate_slots(&1, &prompt, 9, 0, None, None)
            .unwrap()
            .unwrap();
        assert_eq!(table, vec![0, 1, 2]);
        pool.touch_loose_blocks(&[0, 1]).unwrap();
        assert_eq!(pool.ref_count(0), Some(2));
        pool.free(&1).unwrap();
        assert_eq!(pool.free_block_ids(), vec![2, 3]);
        assert_eq!(pool.ref_count(1), Some(1));
        pool.check_invariants().unwrap();
        // A touched free block leaves the queue; freed again, it is no longer evicted first.
        pool.touch_loose_blocks(&[3]).unwrap();
        assert_eq!(pool.free_block_ids(), vec![2]);
        pool.release_loose_blocks(&[3, 0, 1]).unwrap();
        assert_eq!(pool.free_block_ids(), vec![3, 2, 0, 1]);
        pool.check_invariants().unwrap();
        assert_eq!(
            pool.get_computed_blocks(&prompt, None).block_ids,
            vec![0, 1]
        );
    }

    #[test]
    fn touching_a_block_twice_takes_two_references() {
        let mut pool: BlockPool<u32> = BlockPool::new(4, 4, true).unwrap();
        pool.touch_loose_blocks(&[2, 2]).unwrap();
        assert_eq!(pool.ref_count(2), Some(2));
        assert_eq!(pool.num_free_blocks(), 3);
        assert!(!pool.reset_prefix_cache());
        pool.release_loose_blocks(&[2]).unwrap();
        assert_eq!(pool.num_free_blocks(), 3);
        pool.release_loose_blocks(&[2]).unwrap();
        assert_eq!(pool.num_free_blocks(), 4);
        assert!(pool.release_loose_blocks(&[2]).is_err());
        pool.check_invariants().unwrap();
    }

    #[test]
    fn touching_past_the_pool_changes_nothing() {
        let mut pool: BlockPool<u32> = BlockPool::new(4, 4, true).unwrap();
        let err = pool.touch_loose_blocks(&[1, 4]).unwrap_err();
        assert!(err.to_string().contains("block_ids"), "{err}");
        assert_eq!(pool.ref_count(1), Some(0));
        assert_eq!(pool.num_free_blocks(), 4);
        let groups = vec![KvGroupSpec::FullAttention, KvGroupSpec::FullAttention];
        let mut coordinator: KvCoordinator<u32> = KvCoordinator::new(groups, 5, 16, true).unwrap();
        let err = coordinator.touch_loose_blocks(&[0]).unwrap_err();
        assert!(err.to_string().contains("block_ids"), "{err}");
        coordinator.touch_loose_blocks(&[4]).unwrap();
        assert_eq!(coordinator.ref_count(4), Some(1));
        coordinator.check_invariants().unwrap();
        coordinator.release_loose_blocks(&[4]).unwrap();
        assert_eq!(coordinator.num_free_blocks(), 4);
    }
}
