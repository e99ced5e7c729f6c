//! Opt-in detail beside the block pool's cache events ([`KvEvent`]): what each cache call
//! cached, as vLLM 0.33 publishes it (`BlockPool.cache_full_blocks`: one `BlockStored` per
//! call, the request's blocks `num_cached_blocks..num_full_blocks` of one KV cache group,
//! with the tokens, parent hash and extra keys an adapter reads from its own request).
//!
//! The router's hot path reads only [`KvEvent`]; this log exists only when a caller asks
//! for it ([`BlockPool::enable_cache_calls`]), and a pool without it pays one branch per
//! allocation or cache call. Invariant: each [`CacheCall`] names the `Stored` events its
//! call pushed, `at..at + CacheCall::num_stored()` in the events drained with it (a lookup's
//! reused blocks, `reused`, push none). The coordinator (several KV cache groups) keeps
//! the same log (`coordinator_events`).

use super::{BlockPool, ComputedBlocks, FreeQueue, KvEvent, NewTokens, RequestKey};
use crate::Result;

/// One cache call of one request: vLLM's `BlockStored` for the request's blocks
/// `first_block..end_block` of KV cache group `group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheCall<R> {
    /// Where the call's first `Stored` is among the events since their last drain (its
    /// `Stored` events follow it, one per block not `skipped`).
    pub at: usize,
    pub request: R,
    pub group: u32,
    pub first_block: usize,
    pub end_block: usize,
    /// Blocks of `first_block..end_block` the call did not cache: null blocks and those
    /// a window group never hits (vLLM's `cache_full_blocks` skips them in the event's
    /// hashes and extra keys, not in its tokens). Empty for the single-group pool.
    pub skipped: Vec<usize>,
    /// A prefix hit's blocks `0..end_block` reused at a lookup, not cached (vLLM 0.33's
    /// `emit_cached_block_events`, published for a request whose `kv_cache_report_mode`
    /// is `"full"`): no `Stored` events are pushed for it.
    pub reused: bool,
    /// A partial prefix entry (vLLM 0.33's `BlockPool.cache_partial_block`): the hash at
    /// the end of hash block `end_block - 1` (blocks of the hash block size here,
    /// `first_block` = `end_block - 1`) registered on one block of the group, one `Stored`
    /// event. Beside differing block sizes only.
    pub partial: bool,
}

impl<R> CacheCall<R> {
    /// The `Stored` events the call pushed (`events[at..at + num_stored()]`).
    pub fn num_stored(&self) -> usize {
        if self.reused {
            0
        } else {
            self.end_block - self.first_block - self.skipped.len()
        }
    }
}

impl<R: RequestKey, Q: FreeQueue> BlockPool<R, Q> {
    /// Starts recording each cache call ([`CacheCall`]) beside the cache events, which it
    /// turns on too. Drain both at once: a call's `at` counts from the events' last drain.
    pub fn enable_cache_calls(&mut self) {
        self.enable_events();
        self.cache_calls.get_or_insert_with(Vec::new);
    }

    /// The cache calls since the last drain, oldest first (empty unless enabled).
    pub fn drain_cache_calls(&mut self) -> Vec<CacheCall<R>> {
        self.cache_calls
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Notes a lookup's hit of `num_blocks` blocks for `request_id` ([`CacheCall::reused`]),
    /// if the log is on and the hit is not empty.
    pub fn note_reused(&mut self, request_id: &R, num_blocks: usize) {
        let (Some(calls), Some(events)) = (&mut self.cache_calls, &self.events) else {
            return;
        };
        if num_blocks > 0 {
            calls.push(CacheCall {
                at: events.len(),
                request: request_id.clone(),
                group: 0,
                first_block: 0,
                end_block: num_blocks,
                skipped: Vec::new(),
                reused: true,
                partial: false,
            });
        }
    }

    /// `allocate` noting the cache call it makes, if the log is on.
    pub(super) fn allocate_noted(
        &mut self,
        request_id: &R,
        new: NewTokens<'_>,
        new_computed: Option<&ComputedBlocks>,
        extra_key: Option<u64>,
    ) -> Result<Option<usize>> {
        let mark = self.cache_mark();
        let allocated = self.allocate(request_id, new, new_computed, extra_key);
        // Without the log (the usual case) no call: this runs for every running request.
        if mark.is_some() {
            self.note_cache_call(request_id, mark);
        }
        allocated
    }

    /// Before a call that may cache blocks: the number of events so far (`None`: no log).
    pub(super) fn cache_mark(&self) -> Option<usize> {
        self.cache_calls.as_ref()?;
        Some(self.events.as_ref().map_or(0, Vec::len))
    }

    /// After it: the `Stored` events pushed since `mark` are the call's (they follow its
    /// evictions' events), its last block the request's last cached one.
    pub(super) fn note_cache_call(&mut self, request_id: &R, mark: Option<usize>) {
        let (Some(mark), Some(calls), Some(events)) = (mark, &mut self.cache_calls, &self.events)
        else {
            return;
        };
        let Some(first) = events[mark..]
            .iter()
            .position(|e| matches!(e, KvEvent::Stored(_)))
        else {
            return;
        };
        let at = mark + first;
        debug_assert!(events[at..].iter().all(|e| matches!(e, KvEvent::Stored(_))));
        let Some(request) = self.requests.get(request_id) else {
            return;
        };
        let end_block = request.num_cached_blocks;
        calls.push(CacheCall {
            at,
            request: request_id.clone(),
            group: 0,
            first_block: end_block - (events.len() - at),
            end_block,
            skipped: Vec::new(),
            reused: false,
            partial: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::BlockHash;

    fn tokens(n: usize, base: u32) -> Vec<u32> {
        (base..base + n as u32).collect()
    }

    #[test]
    fn each_cache_call_names_its_stored_events() {
        // 4 blocks of 4 tokens; one request caches 2 blocks, then 1 more on a decode step.
        let mut pool: BlockPool<u32> = BlockPool::new(4, 4, true).unwrap();
        pool.enable_cache_calls();
        let prompt = tokens(9, 0);
        pool.allocate_slots(&1, &prompt, 9, 0, None, None).unwrap();
        pool.cache_blocks(&1, &[]).unwrap();
        let calls = pool.drain_cache_calls();
        let events = pool.drain_events();
        assert_eq!(events.len(), 2);
        let call = CacheCall {
            at: 0,
            request: 1,
            group: 0,
            first_block: 0,
            end_block: 2,
            skipped: Vec::new(),
            reused: false,
            partial: false,
        };
        assert_eq!(calls, vec![call]);
        let mut longer = prompt.clone();
        longer.extend(tokens(3, 100));
        pool.allocate_slots(&1, &longer, 3, 0, None, None).unwrap();
        let calls = pool.drain_cache_calls();
        assert_eq!(pool.drain_events().len(), 1);
        assert_eq!((calls[0].first_block, calls[0].end_block), (2, 3));
    }

    #[test]
    fn a_call_after_evictions_starts_at_its_first_stored_event() {
        // 2 blocks: request 1 caches both and frees them; request 2's allocation evicts
        // both (two Removed) and then caches one block of its own.
        let mut pool: BlockPool<u32> = BlockPool::new(2, 4, true).unwrap();
        pool.enable_cache_calls();
        pool.allocate_slots(&1, &tokens(8, 0), 8, 0, None, None)
            .unwrap();
        pool.free(&1).unwrap();
        pool.drain_events();
        pool.drain_cache_calls();
        pool.allocate_slots(&2, &tokens(6, 50), 6, 0, None, None)
            .unwrap();
        let events = pool.drain_events();
        let calls = pool.drain_cache_calls();
        assert!(matches!(
            events[..],
            [
                KvEvent::Removed(_),
                KvEvent::Removed(_),
                KvEvent::Stored(BlockHash(_))
            ]
        ));
        assert_eq!(
            (calls[0].at, calls[0].first_block, calls[0].end_block),
            (2, 0, 1)
        );
    }

    #[test]
    fn a_reused_hit_is_noted_where_it_happens_without_stored_events() {
        let mut pool: BlockPool<u32> = BlockPool::new(4, 4, true).unwrap();
        pool.enable_cache_calls();
        pool.allocate_slots(&1, &tokens(8, 0), 8, 0, None, None)
            .unwrap();
        pool.note_reused(&2, 0);
        pool.note_reused(&2, 2);
        let calls = pool.drain_cache_calls();
        assert_eq!(pool.drain_events().len(), 2);
        let reused = &calls[1];
        assert_eq!((reused.at, reused.request, reused.end_block), (2, 2, 2));
        assert!(reused.reused && reused.num_stored() == 0);
        assert_eq!(calls.len(), 2, "an empty hit is not noted");
    }

    #[test]
    fn without_the_log_nothing_is_recorded() {
        let mut pool: BlockPool<u32> = BlockPool::new(4, 4, true).unwrap();
        pool.enable_events();
        pool.allocate_slots(&1, &tokens(8, 0), 8, 0, None, None)
            .unwrap();
        assert_eq!(pool.drain_events().len(), 2);
        assert!(pool.drain_cache_calls().is_empty());
    }
}
