//! KV connectors (vLLM V1's scheduler-side interface): asynchronous loads park a request in
//! WAITING_FOR_REMOTE_KVS, synchronous ones count as computed, failed ones recompute, and
//! finished requests' blocks wait for their sends.

use std::sync::{Arc, Mutex};

use super::*;
use crate::kv::BlockId;
use crate::sched::{ExternalTokens, KvConnector, KvLoad, RequestStatus};

/// Offers up to `offer` tokens (`None`: every token after the local hit), loads asynchronously
/// or not, keeps finished requests' blocks for a send when `delay_free`; logs its calls.
#[derive(Default)]
struct FakeConnector {
    offer: Option<usize>,
    load_async: bool,
    delay_free: bool,
    undecided: bool,
    log: Arc<Mutex<Vec<String>>>,
}

impl KvConnector<u32> for FakeConnector {
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<u32>,
        num_computed_tokens: usize,
    ) -> crate::Result<Option<ExternalTokens>> {
        self.log.lock().unwrap().push(format!(
            "match {} after {num_computed_tokens}",
            request.request_id
        ));
        if self.undecided {
            return Ok(None);
        }
        let rest = request.num_tokens() - num_computed_tokens;
        let num_tokens = self.offer.map_or(rest, |offer| offer.min(rest));
        Ok(Some(ExternalTokens {
            num_tokens,
            load_async: self.load_async,
        }))
    }

    fn update_state_after_alloc(
        &mut self,
        request: &Request<u32>,
        block_ids: &[BlockId],
        num_external_tokens: usize,
    ) -> crate::Result<()> {
        self.log.lock().unwrap().push(format!(
            "alloc {} {} blocks {num_external_tokens} external",
            request.request_id,
            block_ids.len()
        ));
        Ok(())
    }

    fn request_finished(
        &mut self,
        request: &Request<u32>,
        block_ids: &[BlockId],
    ) -> crate::Result<bool> {
        self.log.lock().unwrap().push(format!(
            "finished {} {} blocks",
            request.request_id,
            block_ids.len()
        ));
        Ok(self.delay_free)
    }
}

fn with_connector(connector: FakeConnector) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        num_blocks: 8,
        max_model_len: 32,
        enable_prefix_caching: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_connector(Box::new(connector)).unwrap();
    s
}

fn free_blocks(s: &Scheduler<u32>) -> usize {
    s.num_free_blocks()
}

#[test]
fn an_async_load_waits_for_remote_kvs_then_recomputes_only_the_last_token() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut s = with_connector(FakeConnector {
        load_async: true,
        log: log.clone(),
        ..FakeConnector::default()
    });
    s.add_request(0, prompt(0, 10)).unwrap();
    let out = s.schedule().unwrap();
    assert!(scheduled(&out).is_empty(), "loading requests run nothing");
    assert_eq!(
        out.kv_loads,
        [KvLoad {
            request_id: 0,
            num_external_tokens: 10,
            num_host_tokens: 0
        }]
    );
    let r = s.get_request(&0).unwrap();
    assert_eq!(r.status, RequestStatus::WaitingForRemoteKvs);
    assert_eq!(s.block_ids(&0).unwrap().len(), 3, "ceil(10 / 4) blocks");
    s.check_invariants().unwrap();
    // Until the engine reports the load, the request stays parked.
    assert!(scheduled(&s.schedule().unwrap()).is_empty());
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    // All 10 tokens landed; the last is recomputed for its logits, as in vLLM.
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 1)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 9);
    assert_eq!(s.get_request(&0).unwrap().num_output_tokens(), 1);
    // Told of the allocation after the landing too, with nothing to load (vLLM 0.33's
    // waiting loop calls `update_state_after_alloc` for every request it allocates).
    assert_eq!(
        *log.lock().unwrap(),
        [
            "match 0 after 0",
            "alloc 0 3 blocks 10 external",
            "alloc 0 3 blocks 0 external"
        ]
    );
}

#[test]
fn loaded_blocks_become_prefix_hits_only_once_they_land() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut s = with_connector(FakeConnector {
        offer: Some(8),
        load_async: true,
        log: log.clone(),
        ..FakeConnector::default()
    });
    s.add_request(0, prompt(0, 10)).unwrap();
    s.schedule().unwrap();
    // The same prompt while the first load is in flight: nothing of it is cached yet.
    s.add_request(1, prompt(0, 10)).unwrap();
    s.schedule().unwrap();
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    s.schedule().unwrap();
    s.add_request(2, prompt(0, 10)).unwrap();
    s.schedule().unwrap();
    let log = log.lock().unwrap();
    let asked: Vec<_> = log.iter().filter(|l| l.starts_with("match")).collect();
    assert_eq!(
        asked,
        ["match 0 after 0", "match 1 after 0", "match 2 after 8"]
    );
}

#[test]
fn a_sync_load_counts_as_computed_and_leaves_the_budget_to_others() {
    let mut s = with_connector(FakeConnector {
        offer: Some(6),
        ..FakeConnector::default()
    });
    s.add_request(0, prompt(0, 10)).unwrap();
    s.add_request(1, prompt(1, 10)).unwrap();
    let out = run_step(&mut s);
    // 6 of request 0's tokens are loaded: it computes 4, request 1 (also 6 loaded) the
    // remaining budget of 6, i.e. 4.
    assert_eq!(scheduled(&out), [(0, 4), (1, 4)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 6);
    assert!(
        out.kv_loads.is_empty(),
        "synchronous loads are not waited for"
    );
}

#[test]
fn a_failed_load_falls_back_to_recompute_without_asking_again() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut s = with_connector(FakeConnector {
        load_async: true,
        log: log.clone(),
        ..FakeConnector::default()
    });
    s.add_request(0, prompt(0, 10)).unwrap();
    s.schedule().unwrap();
    s.finish_kv_transfers(&[], &[], &[0]).unwrap();
    let out = run_step(&mut s);
    assert_eq!(
        scheduled(&out),
        [(0, 10)],
        "the whole prompt, within the budget"
    );
    assert!(s.get_request(&0).unwrap().kv_load_failed);
    assert_eq!(
        log.lock().unwrap().len(),
        3,
        "asked once: {:?}",
        log.lock().unwrap()
    );
}

#[test]
fn a_finished_request_keeps_its_blocks_until_its_send_completes() {
    let mut s = with_connector(FakeConnector {
        offer: Some(0),
        delay_free: true,
        ..FakeConnector::default()
    });
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 1,
            ..prompt(0, 10)
        },
    )
    .unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 10)]);
    assert!(s.get_request(&0).is_none(), "finished");
    assert_eq!(free_blocks(&s), 5, "3 of 8 blocks held for the send");
    assert_eq!(s.num_kv_transfers(), (0, 1));
    s.finish_kv_transfers(&[], &[0], &[]).unwrap();
    assert_eq!(free_blocks(&s), 8);
    assert_eq!(s.num_kv_transfers(), (0, 0));
    s.check_invariants().unwrap();
}

#[test]
fn an_undecided_connector_leaves_the_request_in_place_and_others_go_ahead() {
    let mut s = with_connector(FakeConnector {
        undecided: true,
        ..FakeConnector::default()
    });
    s.add_request(0, prompt(0, 4)).unwrap();
    let out = s.schedule().unwrap();
    assert!(scheduled(&out).is_empty());
    assert_eq!(s.waiting_ids(), [0]);
}

#[test]
fn aborting_a_loading_request_holds_its_blocks_until_the_load_stops() {
    let mut s = with_connector(FakeConnector {
        load_async: true,
        ..FakeConnector::default()
    });
    s.add_request(0, prompt(0, 10)).unwrap();
    s.schedule().unwrap();
    s.abort(&[0]).unwrap();
    assert_eq!(free_blocks(&s), 5, "the load may still write into them");
    s.check_invariants().unwrap();
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    assert_eq!(free_blocks(&s), 8);
    s.check_invariants().unwrap();
}

#[test]
fn bad_transfer_reports_and_offers_are_refused() {
    let mut s = with_connector(FakeConnector {
        load_async: true,
        ..FakeConnector::default()
    });
    s.add_request(0, prompt(0, 10)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    s.schedule().unwrap();
    // Request 1 loads too; 2 is unknown: nothing is applied.
    assert!(s.finish_kv_transfers(&[0, 2], &[], &[]).is_err());
    assert!(scheduled(&s.schedule().unwrap()).is_empty());
    assert!(
        s.finish_kv_transfers(&[], &[0], &[]).is_err(),
        "no send for a live request"
    );
    let mut s = with_connector(FakeConnector {
        offer: Some(10),
        ..FakeConnector::default()
    });
    s.add_request(0, prompt(0, 10)).unwrap();
    assert!(
        s.schedule().is_err(),
        "a synchronous load must leave the last token"
    );
    let radix = SchedulerConfig {
        enable_prefix_caching: true,
        prefix_cache: PrefixCache::Radix,
        ..config()
    };
    let mut s: Scheduler<u32> = Scheduler::new(radix, false).unwrap();
    assert!(s.set_connector(Box::new(FakeConnector::default())).is_err());
}

/// A connector that fails in the method named by `fail` (switchable from the test).
fn failing(fail: &Arc<Mutex<Option<&'static str>>>, inner: FakeConnector) -> FailingConnector {
    FailingConnector {
        fail: fail.clone(),
        inner,
    }
}

struct FailingConnector {
    fail: Arc<Mutex<Option<&'static str>>>,
    inner: FakeConnector,
}

impl FailingConnector {
    fn check(&self, method: &'static str) -> crate::Result<()> {
        match *self.fail.lock().unwrap() {
            Some(m) if m == method => Err(crate::Error::connector(method, "boom", "raised")),
            _ => Ok(()),
        }
    }
}

impl KvConnector<u32> for FailingConnector {
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<u32>,
        num_computed_tokens: usize,
    ) -> crate::Result<Option<ExternalTokens>> {
        self.check("get_num_new_matched_tokens")?;
        self.inner
            .get_num_new_matched_tokens(request, num_computed_tokens)
    }

    fn update_state_after_alloc(
        &mut self,
        request: &Request<u32>,
        block_ids: &[BlockId],
        num_external_tokens: usize,
    ) -> crate::Result<()> {
        self.check("update_state_after_alloc")?;
        self.inner
            .update_state_after_alloc(request, block_ids, num_external_tokens)
    }

    fn request_finished(
        &mut self,
        request: &Request<u32>,
        block_ids: &[BlockId],
    ) -> crate::Result<bool> {
        self.check("request_finished")?;
        self.inner.request_finished(request, block_ids)
    }
}

fn with_failing(fail: &Arc<Mutex<Option<&'static str>>>, inner: FakeConnector) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        num_blocks: 8,
        max_model_len: 32,
        enable_prefix_caching: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_connector(Box::new(failing(fail, inner))).unwrap();
    s
}

fn failed_in(result: crate::Result<impl std::fmt::Debug>, method: &str) {
    match result {
        Err(crate::Error::Connector { method: m, .. }) if m == method => {}
        other => panic!("expected a connector error in {method}, got {other:?}"),
    }
}

#[test]
fn a_connector_error_while_admitting_keeps_the_step_formed_so_far_for_the_next_call() {
    let fail = Arc::new(Mutex::new(None));
    let mut s = with_failing(
        &fail,
        FakeConnector {
            offer: Some(0),
            ..FakeConnector::default()
        },
    );
    s.add_request(0, prompt(0, 4)).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 4)]);
    *fail.lock().unwrap() = Some("get_num_new_matched_tokens");
    s.add_request(1, prompt(1, 4)).unwrap();
    failed_in(s.schedule(), "get_num_new_matched_tokens");
    s.check_invariants().unwrap();
    // Request 0's decode was planned (its slot allocated) before request 1 was reached:
    // that step is not lost, the next call returns it.
    *fail.lock().unwrap() = None;
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 1)]);
    assert_eq!(s.waiting_ids(), [1]);
    s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 4)]);
}

#[test]
fn a_failed_update_state_after_alloc_keeps_the_admission_it_reports() {
    let fail = Arc::new(Mutex::new(Some("update_state_after_alloc")));
    let mut s = with_failing(
        &fail,
        FakeConnector {
            offer: Some(6),
            ..FakeConnector::default()
        },
    );
    s.add_request(0, prompt(0, 10)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    failed_in(s.schedule(), "update_state_after_alloc");
    s.check_invariants().unwrap();
    *fail.lock().unwrap() = None;
    // Request 0's blocks were allocated before the connector failed: it runs the 4 tokens
    // after the 6 loaded; admission stopped there, so request 1 waits for the next step.
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 4)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 6);
    assert_eq!(s.waiting_ids(), [1]);
}

#[test]
fn a_failed_update_state_after_alloc_for_an_async_load_still_parks_the_request() {
    let fail = Arc::new(Mutex::new(Some("update_state_after_alloc")));
    let mut s = with_failing(
        &fail,
        FakeConnector {
            load_async: true,
            ..FakeConnector::default()
        },
    );
    s.add_request(0, prompt(0, 10)).unwrap();
    failed_in(s.schedule(), "update_state_after_alloc");
    s.check_invariants().unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.kv_loads.len(), 1, "the kept step reports the load");
    assert_eq!(
        s.get_request(&0).unwrap().status,
        RequestStatus::WaitingForRemoteKvs
    );
    // The engine learns the connector cannot load it and reports the load failed.
    *fail.lock().unwrap() = None;
    s.finish_kv_transfers(&[], &[], &[0]).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 10)]);
}

#[test]
fn a_failed_request_finished_still_finishes_and_frees_and_applies_the_rest() {
    let fail = Arc::new(Mutex::new(None));
    let mut s = with_failing(
        &fail,
        FakeConnector {
            offer: Some(0),
            delay_free: true,
            ..FakeConnector::default()
        },
    );
    for id in [0, 1] {
        let spec = RequestSpec {
            max_tokens: 1,
            ..prompt(id, 4)
        };
        s.add_request(id, spec).unwrap();
    }
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4), (1, 4)]);
    *fail.lock().unwrap() = Some("request_finished");
    failed_in(
        s.update_from_output(&[sample(0, 7), sample(1, 7)]),
        "request_finished",
    );
    s.check_invariants().unwrap();
    assert!(!s.has_unfinished_requests(), "both outputs were applied");
    // Not asked to hold them (it failed), the scheduler frees the blocks.
    assert_eq!(s.num_kv_transfers(), (0, 0));
    assert_eq!(free_blocks(&s), 8);
    assert_eq!(s.schedule().unwrap().finished_req_ids, [0, 1]);
}

#[test]
fn a_failed_request_finished_in_abort_still_aborts_every_request() {
    let fail = Arc::new(Mutex::new(None));
    let mut s = with_failing(
        &fail,
        FakeConnector {
            offer: Some(0),
            ..FakeConnector::default()
        },
    );
    s.add_request(0, prompt(0, 4)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    run_step(&mut s);
    *fail.lock().unwrap() = Some("request_finished");
    failed_in(s.abort(&[0, 1]), "request_finished");
    s.check_invariants().unwrap();
    assert!(!s.has_unfinished_requests());
    assert_eq!(free_blocks(&s), 8);
}

#[test]
fn aborting_a_request_whose_load_was_already_reported_frees_its_blocks_at_once() {
    for failed in [false, true] {
        let mut s = with_connector(FakeConnector {
            load_async: true,
            ..FakeConnector::default()
        });
        s.add_request(0, prompt(0, 10)).unwrap();
        s.schedule().unwrap();
        let (landed, lost): (&[u32], &[u32]) = if failed { (&[], &[0]) } else { (&[0], &[]) };
        s.finish_kv_transfers(landed, &[], lost).unwrap();
        // Reported, but not yet taken by a step: nothing will write into the blocks any
        // more and nothing will report the load again (vLLM frees them here too).
        s.abort(&[0]).unwrap();
        assert_eq!(s.num_kv_transfers(), (0, 0));
        assert_eq!(free_blocks(&s), 8);
        s.check_invariants().unwrap();
    }
}

#[test]
fn a_one_token_prompt_loaded_whole_recomputes_its_token_in_the_blocks_it_holds() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut s = with_connector(FakeConnector {
        load_async: true,
        log: log.clone(),
        ..FakeConnector::default()
    });
    s.add_request(0, prompt(0, 1)).unwrap();
    assert_eq!(s.schedule().unwrap().kv_loads.len(), 1);
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    // The loaded token is its last, so nothing counts as computed; it still holds the
    // block the load landed in, and goes on from there without a new lookup or offer.
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 1)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 0);
    assert_eq!(out.scheduled_new_reqs[0].block_ids.len(), 1);
    let asked = log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("match"))
        .count();
    assert_eq!(asked, 1);
}

/// Loads asynchronously, for each request it names, that many tokens after the local hit
/// (`usize::MAX`: all of them); nothing for the others, or after a preemption.
struct LoadsFor(Vec<(u32, usize)>);

impl KvConnector<u32> for LoadsFor {
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<u32>,
        num_computed_tokens: usize,
    ) -> crate::Result<Option<ExternalTokens>> {
        let rest = request.num_tokens() - num_computed_tokens;
        let offer = (self.0.iter())
            .find(|(id, _)| *id == request.request_id && request.num_preemptions == 0)
            .map_or(0, |&(_, n)| n.min(rest));
        Ok(Some(ExternalTokens {
            num_tokens: offer,
            load_async: true,
        }))
    }

    fn request_finished(&mut self, _: &Request<u32>, _: &[BlockId]) -> crate::Result<bool> {
        Ok(false)
    }
}

fn with_loads(loads: Vec<(u32, usize)>) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        num_blocks: 8,
        max_model_len: 32,
        max_num_batched_tokens: 32,
        enable_prefix_caching: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_connector(Box::new(LoadsFor(loads))).unwrap();
    s
}

fn drain(s: &mut Scheduler<u32>) {
    for _ in 0..40 {
        if !s.has_unfinished_requests() {
            break;
        }
        run_step(s);
    }
    assert!(!s.has_unfinished_requests());
    assert_eq!(free_blocks(s), 8);
}

#[test]
fn a_landed_load_is_served_before_waiting_requests_that_hold_nothing() {
    // vLLM 0.33's kv_holding_waiting: request 1's landed blocks must not wait behind
    // request 0, which cannot get the memory they hold.
    let mut s = with_loads(vec![(1, usize::MAX)]);
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 8,
            ..prompt(0, 20)
        },
    )
    .unwrap(); // 5 blocks
    s.add_request(
        1,
        RequestSpec {
            max_tokens: 1,
            ..prompt(1, 12)
        },
    )
    .unwrap(); // loads 3
    let out = run_step(&mut s);
    assert_eq!((scheduled(&out), out.kv_loads.len()), (vec![(0, 20)], 1));
    // Request 0 needs a 6th block at token 21; request 1 holds 3 of the 8: 0 preempts itself.
    let out = run_step(&mut s);
    assert_eq!(out.preempted_req_ids, [0]);
    assert_eq!(s.waiting_ids(), [1, 0], "the block holder is first in line");
    s.finish_kv_transfers(&[1], &[], &[]).unwrap();
    // 1 computes its last prompt token in the blocks it holds; 0 (6 blocks) still waits.
    let out = run_step(&mut s);
    assert_eq!(
        (scheduled(&out), out.preempted_req_ids.len()),
        (vec![(1, 1)], 0)
    );
    // 1 finished with that step and freed its blocks: 0 is admitted, its 20 tokens hit.
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 1)]);
    drain(&mut s);
}

#[test]
fn a_second_load_waits_for_the_first_prefill_instead_of_wedging_it() {
    // Request 1 loads 8 of its 20 tokens (2 blocks), request 2 would load all 20 (5
    // blocks). vLLM 0.33 starts 2's load only beside the 3 blocks 1's prefill still needs:
    // 5 + 3 > 6 free, so 2 waits holding nothing, and 1 is never starved of the memory
    // (before this rule, both loads started and 2's landed blocks had to be let go).
    let mut s = with_loads(vec![(1, 8), (2, usize::MAX)]);
    s.add_request(
        1,
        RequestSpec {
            max_tokens: 2,
            ..prompt(1, 20)
        },
    )
    .unwrap();
    s.add_request(
        2,
        RequestSpec {
            max_tokens: 2,
            ..prompt(2, 20)
        },
    )
    .unwrap();
    let out = run_step(&mut s);
    assert_eq!((scheduled(&out).len(), out.kv_loads.len()), (0, 1));
    assert_eq!(free_blocks(&s), 6);
    assert_eq!(s.get_request(&2).unwrap().status, RequestStatus::Waiting);
    s.finish_kv_transfers(&[1], &[], &[]).unwrap();
    let out = run_step(&mut s);
    assert!(out.preempted_req_ids.is_empty());
    assert_eq!(scheduled(&out), [(1, 12)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 8);
    drain_landing_loads(&mut s);
    assert_eq!(free_blocks(&s), 8);
}

#[test]
fn a_landed_load_of_the_whole_prompt_is_padded_under_speculative_decoding() {
    // vLLM 0.33 pads a request whose KV landed but its last token (the decode side of
    // disaggregated serving): k = 2, the 10 loaded tokens leave token 9, so 1 + 2 = 3 tokens,
    // two placeholder drafts; slots 9 + 3 = 12 (3 blocks, as the load took).
    let cfg = SchedulerConfig {
        num_blocks: 8,
        max_model_len: 32,
        enable_prefix_caching: true,
        num_speculative_tokens: 2,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_connector(Box::new(FakeConnector {
        load_async: true,
        ..FakeConnector::default()
    }))
    .unwrap();
    s.add_request(0, prompt(0, 10)).unwrap();
    s.schedule().unwrap();
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 3)]);
    assert_eq!(
        out.scheduled_spec_decode_tokens,
        [(0, vec![PLACEHOLDER_DRAFT, PLACEHOLDER_DRAFT])]
    );
    assert_eq!(s.block_ids(&0).unwrap().len(), 3);
    s.check_invariants().unwrap();
}

#[test]
fn a_synchronous_load_of_all_but_the_last_token_is_padded_too() {
    // The same with a synchronous load of 9 tokens: the step computes token 9 and two
    // placeholders (slots for the placeholders come in a second allocation).
    let cfg = SchedulerConfig {
        num_blocks: 8,
        max_model_len: 32,
        enable_prefix_caching: true,
        num_speculative_tokens: 2,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_connector(Box::new(FakeConnector {
        offer: Some(9),
        ..FakeConnector::default()
    }))
    .unwrap();
    s.add_request(0, prompt(0, 10)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 3)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 9);
    assert_eq!(s.block_ids(&0).unwrap().len(), 3);
    s.check_invariants().unwrap();
}

#[test]
fn a_load_starts_only_beside_the_blocks_in_flight_prefills_still_need() {
    // vLLM 0.33's test_async_load_reservation_prevents_wedge_e2e in blocks of 4: A (32
    // tokens, 8 blocks) and B (20 tokens, 5 blocks) each load 16 tokens, in 9 blocks. B's
    // whole sequence fits beside A's load (5 free), but not beside the 4 more blocks A
    // still needs: B's load does not start, so the two can never wedge each other.
    let cfg = SchedulerConfig {
        num_blocks: 9,
        max_model_len: 64,
        max_num_batched_tokens: 64,
        enable_prefix_caching: true,
        scheduler_reserve_full_isl: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_connector(Box::new(LoadsFor(vec![(0, 16), (1, 16)])))
        .unwrap();
    s.add_request(0, prompt(0, 32)).unwrap();
    s.add_request(1, prompt(1, 20)).unwrap();
    let out = run_step(&mut s);
    assert_eq!(out.kv_loads.len(), 1);
    assert_eq!(
        s.get_request(&0).unwrap().status,
        RequestStatus::WaitingForRemoteKvs
    );
    assert_eq!(s.get_request(&1).unwrap().status, RequestStatus::Waiting);
    assert!(s.block_ids(&1).is_none());
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 16)]);
    assert_eq!(s.get_request(&1).unwrap().num_preemptions, 0);
    assert!(s.block_ids(&1).is_none());
    drain_landing_loads(&mut s);
    assert_eq!(free_blocks(&s), 9);
}

/// Runs steps until nothing is left, each load landing the step after it starts.
fn drain_landing_loads(s: &mut Scheduler<u32>) {
    for _ in 0..60 {
        if !s.has_unfinished_requests() {
            return;
        }
        let out = run_step(s);
        let loads: Vec<u32> = out.kv_loads.iter().map(|l| l.request_id).collect();
        s.finish_kv_transfers(&loads, &[], &[]).unwrap();
    }
    panic!("requests left after 60 steps");
}
