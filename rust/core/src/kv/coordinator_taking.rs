//! How the coordinator lends one admitted request's entry and its free blocks to a load or
//! a HiSparse region, group by group (split from `coordinator.rs`).

use super::super::RequestKey;
use super::super::block_ops::{BlockMeta, Eviction, SecondaryHashes, take_free_block};
use super::super::block_pool::{BlockId, BlockPoolStats, KvEvent};
use super::super::cache_map::CacheMap;
use super::super::free_queue::FreeBlockQueue;
use super::super::layer_groups::KvGroupSpec;
use super::{CoordinatedRequest, KvCoordinator};

/// What a load or a HiSparse region borrows of the coordinator to give one admitted
/// request blocks group by group: the groups, the request's entry, a taker of free blocks
/// and the zeroing record, all at once.
pub(super) struct Taking<'a> {
    pub(super) groups: &'a [KvGroupSpec],
    /// Each group's block size.
    pub(super) sizes: &'a [usize],
    pub(super) request: &'a mut CoordinatedRequest,
    pub(super) taker: BlockTaker<'a>,
    pub(super) zeroing: &'a mut Option<Vec<Vec<BlockId>>>,
}

/// Takes free blocks (least recently freed first, evicting what they cached), beside a
/// request's entry.
pub(super) struct BlockTaker<'a> {
    pub(super) free_queue: &'a mut FreeBlockQueue,
    pub(super) blocks: &'a mut [BlockMeta],
    pub(super) cached: &'a mut CacheMap,
    pub(super) stats: &'a mut BlockPoolStats,
    pub(super) events: &'a mut Option<Vec<KvEvent>>,
    pub(super) secondary: &'a mut SecondaryHashes,
}

impl BlockTaker<'_> {
    /// `n` free blocks (the coordinator keeps no host tier).
    pub(super) fn take(&mut self, n: usize) -> Vec<BlockId> {
        let mut eviction = Eviction {
            cached: self.cached,
            events: self.events,
            host: &mut None,
            stats: self.stats,
            secondary: Some(self.secondary),
        };
        (0..n)
            .map(|_| take_free_block(self.free_queue, self.blocks, &mut eviction))
            .collect()
    }
}

impl<R: RequestKey> KvCoordinator<R> {
    /// [`Taking`] for `request_id`, which must be admitted.
    pub(super) fn taking(&mut self, request_id: &R) -> Taking<'_> {
        let Self {
            groups,
            requests,
            blocks,
            free_queue,
            cached,
            stats,
            zeroing,
            sizes,
            events,
            secondary,
            ..
        } = self;
        Taking {
            groups,
            sizes: &sizes.groups,
            request: requests.get_mut(request_id).expect("admitted"),
            taker: BlockTaker {
                free_queue,
                blocks,
                cached,
                stats,
                events,
                secondary,
            },
            zeroing,
        }
    }
}

/// Keeps `added` blocks of group `g` for zeroing when new blocks are zeroed and the group
/// holds attention KV (vLLM 0.33 zeroes no Mamba state block: `_record_new_block_ids`).
pub(super) fn record_for_zeroing(
    zeroing: &mut Option<Vec<Vec<BlockId>>>,
    g: usize,
    spec: &KvGroupSpec,
    added: &[BlockId],
) {
    if let Some(per_group) = zeroing
        && !spec.is_mamba()
    {
        per_group[g].extend_from_slice(added);
    }
}
