//! The request of each cache call the KV pool records (`kv::event_log`), for adapters that
//! publish vLLM 0.33's detailed KV events (one `BlockStored` per cache call, built from
//! the request). The pool knows requests by slot, and a slot is reused once its request
//! has gone; so the log keeps each slot's last owner, and settles the pool's records into
//! request ids before a slot gets a new owner. Off by default: a scheduler without it pays
//! one branch per admission.

use super::Scheduler;
use super::kv::{Hit, Kv};
use crate::Result;
use crate::kv::{CacheCall, KvEvent, RequestKey};

/// The settled cache calls and each slot's last owner.
#[derive(Debug)]
pub(crate) struct CacheCallLog<R> {
    owners: Vec<Option<R>>,
    settled: Vec<CacheCall<R>>,
}

impl<R: RequestKey> Scheduler<R> {
    /// Starts recording, beside the prefix-cache events, each cache call's request, group
    /// and blocks, and each lookup's hit ([`Self::drain_kv_events_detailed`]). The
    /// block-hash pool and the coordinator record them: ConfigError (`kv_events`) for the
    /// radix pool and for the KV cache groups the coordinator does not record
    /// (`KvCoordinator::enable_cache_calls`).
    pub fn enable_kv_cache_calls(&mut self) -> Result<()> {
        self.kv.enable_cache_calls()?;
        let owners = (self.slots.iter())
            .map(|s| s.as_ref().map(|r| r.request_id.clone()))
            .collect();
        self.kv_cache_calls = Some(Box::new(CacheCallLog {
            owners,
            settled: Vec::new(),
        }));
        Ok(())
    }

    /// A lookup for `slot` found `hit` (vLLM 0.33's `get_computed_blocks`, which emits the
    /// hit's `BlockStored` for a request whose `kv_cache_report_mode` is `"full"`): noted
    /// as a reused call per group if the log is on and the hit is not empty.
    pub(super) fn note_kv_lookup(&mut self, slot: u32, hit: &Hit) {
        if self.kv_cache_calls.is_none() || hit.num_computed_tokens() == 0 {
            return;
        }
        match (&mut self.kv, hit) {
            (Kv::BlockHash(p), Hit::BlockHash(h)) => p.note_reused(&slot, h.block_ids.len()),
            (Kv::Hybrid(k), Hit::Hybrid(h)) => {
                k.pool.note_reused(&slot, h.block_ids.iter().map(Vec::len));
            }
            _ => {}
        }
    }

    /// Before `slot` gets a new owner: the pool's records so far, by request id.
    pub(super) fn settle_kv_cache_calls(&mut self) {
        let Some(log) = &mut self.kv_cache_calls else {
            return;
        };
        for call in self.kv.drain_cache_calls() {
            let slot = call.request as usize;
            let live = self.slots.get(slot).and_then(Option::as_ref);
            // The live request made it (settled before any slot changes owner); a freed
            // slot's was its last owner.
            let owner = (live.map(|r| r.request_id.clone()))
                .or_else(|| log.owners.get(slot).cloned().flatten());
            if let Some(request) = owner {
                log.settled.push(CacheCall {
                    at: call.at,
                    request,
                    group: call.group,
                    first_block: call.first_block,
                    end_block: call.end_block,
                    skipped: call.skipped,
                    reused: call.reused,
                    partial: call.partial,
                });
            }
        }
    }

    /// `slot` now holds `request_id` (after [`Self::settle_kv_cache_calls`]).
    pub(super) fn own_kv_slot(&mut self, slot: u32, request_id: &R) {
        if let Some(log) = &mut self.kv_cache_calls {
            let slot = slot as usize;
            if log.owners.len() <= slot {
                log.owners.resize(slot + 1, None);
            }
            log.owners[slot] = Some(request_id.clone());
        }
    }

    /// The prefix-cache events since the last drain with the cache calls that stored them
    /// (each call's `at` indexes the events). Without [`Self::enable_kv_cache_calls`], the
    /// calls are empty.
    pub fn drain_kv_events_detailed(&mut self) -> (Vec<KvEvent>, Vec<CacheCall<R>>) {
        self.settle_kv_cache_calls();
        let calls = (self.kv_cache_calls.as_mut())
            .map(|log| std::mem::take(&mut log.settled))
            .unwrap_or_default();
        (self.kv.drain_events(), calls)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{config, prompt};
    use super::*;
    use crate::sched::{PrefixCache, SchedulerConfig};

    fn scheduler() -> Scheduler<u32> {
        let cfg = SchedulerConfig {
            enable_prefix_caching: true,
            max_num_batched_tokens: 64,
            ..config()
        };
        let mut s = Scheduler::new(cfg, true).unwrap();
        s.enable_kv_cache_calls().unwrap();
        s
    }

    #[test]
    fn a_call_keeps_its_request_after_the_slot_is_reused() {
        // Request 0 caches 2 blocks of 4 (9-token prompt) and is aborted; request 1 takes
        // its slot before the drain: the call is still request 0's.
        let mut s = scheduler();
        s.add_request(0, prompt(0, 9)).unwrap();
        s.schedule().unwrap();
        s.abort(&[0]).unwrap();
        s.add_request(1, prompt(1, 5)).unwrap();
        s.schedule().unwrap();
        let (events, calls) = s.drain_kv_events_detailed();
        assert_eq!(events.len(), 3);
        let first = CacheCall {
            at: 0,
            request: 0,
            group: 0,
            first_block: 0,
            end_block: 2,
            skipped: Vec::new(),
            reused: false,
            partial: false,
        };
        let second = CacheCall {
            at: 2,
            request: 1,
            first_block: 0,
            end_block: 1,
            ..first.clone()
        };
        assert_eq!(calls, [first, second]);
    }

    #[test]
    fn the_radix_pool_refuses_cache_calls_by_name() {
        let cfg = SchedulerConfig {
            enable_prefix_caching: true,
            prefix_cache: PrefixCache::Radix,
            ..config()
        };
        let mut s = Scheduler::<u32>::new(cfg, true).unwrap();
        let err = s.enable_kv_cache_calls().unwrap_err();
        assert!(err.to_string().contains("kv_events"), "{err}");
    }
}
