//! The coordinator's KV cache events, as vLLM 0.33's one block pool publishes them beside
//! several KV cache groups (`BlockPool.cache_full_blocks` per group manager, `BlockRemoved`
//! per evicted hash with its group, `AllBlocksCleared` once per reset): the same
//! [`KvEvent`]s and [`CacheCall`]s as the single-group pool's log (`kv::event_log`). A
//! block's hash in the events is its group-keyed one (`group_key`), so the same tokens
//! cached in two groups are two hashes, as vLLM's `BlockHashWithGroupId` are.
//!
//! Off unless asked for ([`KvCoordinator::enable_cache_calls`]): a coordinator without it
//! pays one branch per cache call and nothing per block. Invariant: each call's `Stored`
//! events are `events[at..at + num_stored()]`, in group order within an allocation, after
//! that allocation's evictions.

use super::super::block_ops::SecondaryHashes;
use super::{BlockHash, BlockId, CacheCall, KvCoordinator, KvEvent, KvGroupSpec, RequestKey};
use crate::{Error, Result};

/// Where a cache call records its events: the coordinator's log and its partial entries,
/// borrowed apart from the request's entry, and the request's id.
pub(super) struct EventSink<'a, R> {
    pub(super) events: &'a mut Vec<KvEvent>,
    pub(super) calls: &'a mut Vec<CacheCall<R>>,
    pub(super) secondary: &'a mut SecondaryHashes,
    pub(super) request: &'a R,
}

impl<'a, R: RequestKey> EventSink<'a, R> {
    /// The sink for `request` if the log is on.
    pub(super) fn of(
        events: &'a mut Option<Vec<KvEvent>>,
        calls: &'a mut Option<Vec<CacheCall<R>>>,
        secondary: &'a mut SecondaryHashes,
        request: &'a R,
    ) -> Option<Self> {
        match (events, calls) {
            (Some(events), Some(calls)) => Some(Self {
                events,
                calls,
                secondary,
                request,
            }),
            _ => None,
        }
    }

    /// Group `g`'s cache call over the request's blocks `first..end`: `stored` the
    /// (block index, group-keyed hash) of each block it cached, in order, after the
    /// `Removed` events of the partial entries they replaced (`replaced`; vLLM's
    /// partial-to-full promotion in `cache_full_blocks` removes them before its event).
    pub(super) fn cache_call(
        &mut self,
        g: usize,
        first: usize,
        end: usize,
        replaced: impl IntoIterator<Item = BlockHash>,
        stored: impl IntoIterator<Item = (usize, BlockHash)>,
    ) {
        self.events
            .extend(replaced.into_iter().map(KvEvent::Removed));
        let at = self.events.len();
        let mut skipped = Vec::new();
        let mut next = first;
        for (i, hash) in stored {
            skipped.extend(next..i);
            next = i + 1;
            self.events.push(KvEvent::Stored(hash));
        }
        skipped.extend(next..end);
        self.calls.push(CacheCall {
            at,
            request: self.request.clone(),
            group: g as u32,
            first_block: first,
            end_block: end,
            skipped,
            reused: false,
            partial: false,
        });
    }

    /// Group `g`'s partial entry (vLLM's `BlockPool.cache_partial_block`): the hash `key`
    /// at the end of hash block `hash_block` registered on `block`, beside its cached hash
    /// (`secondary`) or as it (`primary`), unless `block` already holds it (vLLM's
    /// `already_cached`: nothing published). Returns whether it was new.
    pub(super) fn partial_entry(
        &mut self,
        g: usize,
        hash_block: usize,
        block: BlockId,
        key: BlockHash,
        primary: Option<BlockHash>,
    ) -> bool {
        if primary == Some(key) {
            return false;
        }
        if primary.is_some() {
            let entries = self.secondary.entry(block).or_default();
            if entries.contains(&key) {
                return false;
            }
            entries.push(key);
        }
        self.calls.push(CacheCall {
            at: self.events.len(),
            request: self.request.clone(),
            group: g as u32,
            first_block: hash_block,
            end_block: hash_block + 1,
            skipped: Vec::new(),
            reused: false,
            partial: true,
        });
        self.events.push(KvEvent::Stored(key));
        true
    }
}

impl<R: RequestKey> KvCoordinator<R> {
    /// Starts recording the KV cache events with each cache call's request, group and
    /// blocks ([`Self::drain_events`], [`Self::drain_cache_calls`]), partial entries
    /// included (a full-attention group's prompt tail beside differing block sizes).
    /// ConfigError (`kv_events`) with prefix caching on for what is not recorded as vLLM
    /// publishes it: HiSparse and bounded-replay groups, a Mamba `align` group's prefill
    /// checkpoint block (its re-keyed partial entries), and differing block sizes under
    /// EAGLE's drop or a hash look-ahead (partial entries that are a block's own hash).
    pub fn enable_cache_calls(&mut self) -> Result<()> {
        if self.enable_caching {
            let odd = self.groups.iter().position(|spec| {
                spec.is_hisparse()
                    || spec.prefill_checkpoint_alignment().is_some()
                    || matches!(spec, KvGroupSpec::SlidingWindowReplay { .. })
            });
            if let Some(g) = odd {
                return Err(Error::config(
                    "kv_events",
                    format!("{:?}", self.groups[g]),
                    format!(
                        "KV cache events are not recorded beside HiSparse, bounded-replay or \
                         checkpointing Mamba groups (groups[{g}] is one)"
                    ),
                ));
            }
            if self.sizes.keeps_partial_tails() {
                // A partial entry may then be a block's own hash, promoted or replaced
                // later (vLLM's partial-to-full promotion): not recorded.
                return Err(Error::config(
                    "kv_events",
                    "partial tail entries",
                    "KV cache events are not recorded beside differing block sizes under \
                     EAGLE's drop or a hash look-ahead",
                ));
            }
        }
        self.events.get_or_insert_with(Vec::new);
        self.cache_calls.get_or_insert_with(Vec::new);
        Ok(())
    }

    /// The KV cache events since the last drain, oldest first (empty unless enabled).
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The cache calls since the last drain, oldest first; drain the events with them.
    pub fn drain_cache_calls(&mut self) -> Vec<CacheCall<R>> {
        (self.cache_calls.as_mut())
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Notes a lookup's hit for `request_id` ([`CacheCall::reused`], vLLM 0.33's
    /// `KVCacheCoordinator.emit_cached_block_events`): each group's `num_blocks` blocks,
    /// nulls counted, for every group whose list is not empty. Nothing if the log is off
    /// or the hit is empty.
    pub fn note_reused(&mut self, request_id: &R, num_blocks: impl IntoIterator<Item = usize>) {
        let (Some(calls), Some(events)) = (&mut self.cache_calls, &self.events) else {
            return;
        };
        for (g, n) in num_blocks.into_iter().enumerate() {
            if n > 0 {
                calls.push(CacheCall {
                    at: events.len(),
                    request: request_id.clone(),
                    group: g as u32,
                    first_block: 0,
                    end_block: n,
                    skipped: Vec::new(),
                    reused: true,
                    partial: false,
                });
            }
        }
    }

    /// A `Removed` event for `hash` if the log is on (an eviction outside a taking of
    /// free blocks: `evict_blocks`).
    pub(super) fn note_removed(&mut self, hash: BlockHash) {
        if let Some(events) = &mut self.events {
            events.push(KvEvent::Removed(hash));
        }
    }

    /// An `AllCleared` event if the log is on (a reset that succeeded).
    pub(super) fn note_all_cleared(&mut self) {
        if let Some(events) = &mut self.events {
            events.push(KvEvent::AllCleared);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::NULL_BLOCK;

    fn tokens(n: usize, base: u32) -> Vec<u32> {
        (base..base + n as u32).collect()
    }

    fn hybrid(num_blocks: usize) -> KvCoordinator<u32> {
        let groups = vec![
            KvGroupSpec::FullAttention,
            KvGroupSpec::SlidingWindow { sliding_window: 4 },
        ];
        let mut c = KvCoordinator::new(groups, num_blocks, 4, true).unwrap();
        c.enable_cache_calls().unwrap();
        c
    }

    #[test]
    fn each_group_caches_in_its_own_call_after_the_evictions() {
        // Two groups of 4-token blocks, window 4: a 12-token prompt caches blocks 0..3 in
        // full attention and, in the window group, the same blocks: nothing is skipped yet
        // on admission (no block is outside the window before the allocation).
        let mut c = hybrid(16);
        c.allocate_slots(&1, &tokens(12, 0), 12, 0, None, None)
            .unwrap()
            .unwrap();
        let events = c.drain_events();
        let calls = c.drain_cache_calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].group, calls[0].at, calls[0].num_stored()),
            (0, 0, 3)
        );
        assert_eq!(calls[1].group, 1);
        assert_eq!(calls[1].at, 3);
        assert_eq!(events.len(), 3 + calls[1].num_stored());
        // The same tokens are two hashes, one per group.
        assert_ne!(events[0], events[3]);
    }

    #[test]
    fn a_window_groups_null_blocks_are_skipped_and_evictions_name_the_group_hash() {
        let mut c = hybrid(16);
        c.allocate_slots(&1, &tokens(8, 0), 8, 0, None, None)
            .unwrap()
            .unwrap();
        // A decode step past 16 tokens: the window group frees its first blocks (nulls in
        // their place), then caches blocks 2..4, the nulls skipped.
        let longer = tokens(16, 100);
        c.allocate_slots(&1, &longer[..8], 8, 0, None, None)
            .unwrap()
            .unwrap();
        let calls = c.drain_cache_calls();
        let window = calls.iter().rfind(|c| c.group == 1).unwrap();
        assert_eq!((window.first_block, window.end_block), (2, 4));
        let table = c.group_block_ids(&1, 1).unwrap().to_vec();
        let nulls: Vec<usize> = (2..4).filter(|&i| table[i] == NULL_BLOCK).collect();
        assert_eq!(window.skipped, nulls);
        let stored = c.drain_events();
        c.free(&1).unwrap();
        // Evicting every cached block names each group-keyed hash once.
        c.take_loose_blocks(15).unwrap();
        let removed: Vec<KvEvent> = c.drain_events();
        let num_stored = stored.len();
        assert_eq!(removed.len(), num_stored);
        for event in &removed {
            let KvEvent::Removed(hash) = event else {
                panic!("{event:?}")
            };
            assert!(stored.contains(&KvEvent::Stored(*hash)));
        }
    }

    #[test]
    fn a_reset_and_a_reused_hit_are_recorded() {
        let mut c = hybrid(16);
        c.allocate_slots(&1, &tokens(12, 0), 12, 0, None, None)
            .unwrap()
            .unwrap();
        c.free(&1).unwrap();
        c.drain_events();
        c.drain_cache_calls();
        c.note_reused(&2, [2, 0]);
        assert!(c.reset_prefix_cache());
        assert_eq!(c.drain_events(), [KvEvent::AllCleared]);
        let calls = c.drain_cache_calls();
        assert_eq!(calls.len(), 1);
        assert!(calls[0].reused && calls[0].end_block == 2 && calls[0].at == 0);
    }

    #[test]
    fn hisparse_and_eagles_partial_tails_are_refused_by_name() {
        let hot = KvGroupSpec::HiSparseHot {
            blocks_per_request: 2,
        };
        let groups = vec![KvGroupSpec::FullAttention, hot];
        let mut c = KvCoordinator::<u32>::new(groups, 16, 4, true).unwrap();
        let err = c.enable_cache_calls().unwrap_err();
        assert!(err.to_string().contains("kv_events"), "{err}");
        assert!(c.drain_events().is_empty());
        let mut c = gemma_like();
        c.set_eagle_block_drop(true).unwrap();
        let err = c.enable_cache_calls().unwrap_err();
        assert!(err.to_string().contains("EAGLE"), "{err}");
    }

    #[test]
    fn a_mamba_align_group_and_chunked_local_attention_are_recorded() {
        for other in [
            KvGroupSpec::MAMBA_ALIGN,
            KvGroupSpec::ChunkedLocalAttention {
                attention_chunk_size: 8,
            },
        ] {
            let groups = vec![KvGroupSpec::FullAttention, other];
            let mut c = KvCoordinator::<u32>::new(groups, 16, 4, true).unwrap();
            c.enable_cache_calls().unwrap();
            c.allocate_slots(&1, &tokens(12, 0), 12, 0, None, None)
                .unwrap()
                .unwrap();
            let calls = c.drain_cache_calls();
            assert_eq!(calls.iter().map(|c| c.group).collect::<Vec<_>>(), [0, 1]);
        }
    }

    /// Full attention in blocks of 8 beside a window of 8 in blocks of 4, hashed every 4
    /// tokens (the scheduler block size 8), the events on.
    fn gemma_like() -> KvCoordinator<u32> {
        let groups = vec![
            KvGroupSpec::FullAttention,
            KvGroupSpec::SlidingWindow { sliding_window: 8 },
        ];
        let mut c = KvCoordinator::new(groups, 20, 4, true).unwrap();
        c.set_group_block_sizes(&[8, 4]).unwrap();
        c
    }

    #[test]
    fn a_prompts_tail_inside_a_full_block_is_a_partial_entry_removed_after_it() {
        // A 13-token prompt: its last hash boundary below 13 is 12, inside full attention's
        // block 1 (tokens 8..16). Cached once 16 tokens are computed (the scheduler block
        // boundary): block 1's own call, then the partial entry (hash block 2), then the
        // window's call (vLLM's FullAttentionManager.cache_blocks, then
        // _cache_partial_tail_block, group by group).
        let mut c = gemma_like();
        c.enable_cache_calls().unwrap();
        c.allocate_slots(&1, &tokens(13, 0), 13, 0, None, None)
            .unwrap()
            .unwrap();
        let num_first = c.drain_events().len();
        c.drain_cache_calls();
        c.allocate_slots(&1, &tokens(3, 13), 3, 0, None, None)
            .unwrap()
            .unwrap();
        let events = c.drain_events();
        let calls = c.drain_cache_calls();
        let shape: Vec<_> = (calls.iter())
            .map(|c| (c.group, c.first_block, c.end_block, c.partial, c.at))
            .collect();
        assert_eq!(shape[..2], [(0, 1, 2, false, 0), (0, 2, 3, true, 1)]);
        assert_eq!(shape[2].0, 1);
        let KvEvent::Stored(partial) = events[1] else {
            panic!("{events:?}")
        };
        let own = events[0];
        // Cached again (a second step): already registered, nothing new.
        c.cache_blocks(&1, &[]).unwrap();
        assert!(c.drain_events().is_empty());
        // Evicting every block: the partial entry's removal follows block 1's own.
        c.free(&1).unwrap();
        c.take_loose_blocks(19).unwrap();
        let removed = c.drain_events();
        let at = removed.iter().position(|e| {
            *e == KvEvent::Removed(match own {
                KvEvent::Stored(h) => h,
                other => panic!("{other:?}"),
            })
        });
        assert_eq!(removed[at.unwrap() + 1], KvEvent::Removed(partial));
        assert_eq!(removed.len(), num_first + events.len());
    }

    #[test]
    fn without_the_log_nothing_is_recorded() {
        let groups = vec![KvGroupSpec::FullAttention];
        let mut c = KvCoordinator::<u32>::new(groups, 16, 4, true).unwrap();
        c.allocate_slots(&1, &tokens(12, 0), 12, 0, None, None)
            .unwrap()
            .unwrap();
        c.note_reused(&1, [3]);
        assert!(c.drain_events().is_empty() && c.drain_cache_calls().is_empty());
    }
}
