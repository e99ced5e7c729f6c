//! KV loads that failed (`sched::load_failures`), as vLLM 0.33's scheduler handles them: a
//! whole failure (`failed_recving`) and invalid blocks (`invalid_block_ids`) of an
//! asynchronous load (the request waits) or a synchronous one (the request runs), under
//! `kv_load_failure_policy` "recompute" and "fail". Block size 4.

use std::sync::{Arc, Mutex};

use super::*;
use crate::kv::BlockId;
use crate::sched::{ExternalTokens, FinishReason, KvConnector, KvLoadFailurePolicy, RequestStatus};

/// Offers `offer` tokens (at most all but the local hit), asynchronously or not; logs the
/// lookups as "match <id> after <local hit>".
struct Offer {
    offer: usize,
    load_async: bool,
    log: Arc<Mutex<Vec<String>>>,
}

impl KvConnector<u32> for Offer {
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<u32>,
        num_computed_tokens: usize,
    ) -> crate::Result<Option<ExternalTokens>> {
        (self.log.lock().unwrap()).push(format!(
            "match {} after {num_computed_tokens}",
            request.request_id
        ));
        let rest = request.num_tokens() - num_computed_tokens - usize::from(!self.load_async);
        Ok(Some(ExternalTokens {
            num_tokens: self.offer.min(rest),
            load_async: self.load_async,
        }))
    }

    fn update_state_after_alloc(
        &mut self,
        _: &Request<u32>,
        _: &[BlockId],
        _: usize,
    ) -> crate::Result<()> {
        Ok(())
    }

    fn request_finished(&mut self, _: &Request<u32>, _: &[BlockId]) -> crate::Result<bool> {
        Ok(false)
    }
}

fn with_offer(
    offer: usize,
    load_async: bool,
    policy: KvLoadFailurePolicy,
) -> (Scheduler<u32>, Arc<Mutex<Vec<String>>>) {
    let cfg = SchedulerConfig {
        num_blocks: 16,
        max_num_batched_tokens: 16,
        enable_prefix_caching: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let connector = Offer {
        offer,
        load_async,
        log: log.clone(),
    };
    s.set_connector(Box::new(connector)).unwrap();
    s.set_kv_load_failure_policy(policy);
    (s, log)
}

fn block(s: &Scheduler<u32>, id: u32, idx: usize) -> BlockId {
    s.block_ids(&id).unwrap()[idx]
}

#[test]
fn an_async_load_with_an_invalid_block_keeps_the_blocks_before_it() {
    // A 16-token prompt, 12 loaded asynchronously into 3 blocks; block 1 comes back invalid.
    let (mut s, log) = with_offer(12, true, KvLoadFailurePolicy::Recompute);
    s.add_request(0, prompt(0, 16)).unwrap();
    s.schedule().unwrap();
    let free = s.num_free_blocks();
    let bad = block(&s, 0, 1);
    let report = s.handle_kv_load_failures(&[], &[bad], &[]).unwrap();
    assert_eq!(report.rescheduled, [] as [u32; 0]);
    assert_eq!(report.failed, [] as [u32; 0]);
    assert_eq!(report.num_affected_tokens, 8, "12 loaded, 4 valid");
    let r = s.get_request(&0).unwrap();
    assert_eq!(
        r.status,
        RequestStatus::WaitingForRemoteKvs,
        "its load still runs"
    );
    assert_eq!(r.num_computed_tokens, 4);
    // A later report of a block past the cut changes nothing; one before it cuts further.
    let late = block(&s, 0, 2);
    s.handle_kv_load_failures(&[], &[late], &[]).unwrap();
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 4);
    s.check_invariants().unwrap();
    assert_eq!(s.num_free_blocks(), free, "the blocks stay the request's");
    // It lands: 4 tokens computed, 12 recomputed in the blocks it holds plus one more.
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 12)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 4);
    assert_eq!(
        s.num_free_blocks(),
        free - 1,
        "a fourth block for the last tokens"
    );
    // Only the valid block was cached at landing, then the recomputed ones: a second
    // request with the same prompt hits all 4 full blocks locally but the last token.
    s.add_request(1, prompt(0, 16)).unwrap();
    s.schedule().unwrap();
    assert_eq!(log.lock().unwrap().last().unwrap(), "match 1 after 12");
}

#[test]
fn an_async_load_whose_first_block_is_invalid_drops_its_blocks_and_asks_again() {
    let (mut s, log) = with_offer(8, true, KvLoadFailurePolicy::Recompute);
    s.set_ask_again_after_failed_load(true);
    let free = s.num_free_blocks();
    s.add_request(0, prompt(0, 12)).unwrap();
    s.schedule().unwrap();
    let bad = block(&s, 0, 0);
    s.handle_kv_load_failures(&[], &[bad], &[]).unwrap();
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 0);
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    // vLLM's `_update_waiting_for_remote_kv` with no valid token: the blocks are freed and
    // the request looked up anew (the connector is asked again and loads again).
    s.schedule().unwrap();
    assert_eq!(
        s.num_free_blocks(),
        free - 2,
        "freed, then 2 for the new load"
    );
    assert_eq!(
        s.get_request(&0).unwrap().status,
        RequestStatus::WaitingForRemoteKvs
    );
    assert_eq!(log.lock().unwrap().len(), 2);
}

#[test]
fn a_whole_failure_recomputes_or_fails_by_policy() {
    for policy in [KvLoadFailurePolicy::Recompute, KvLoadFailurePolicy::Fail] {
        let (mut s, _) = with_offer(8, true, policy);
        let free = s.num_free_blocks();
        s.add_request(0, prompt(0, 12)).unwrap();
        s.schedule().unwrap();
        // A request that is not loading is ignored, as vLLM ignores it.
        s.add_request(1, prompt(1, 4)).unwrap();
        assert_eq!(s.get_request(&1).unwrap().status, RequestStatus::Waiting);
        let report = s.handle_kv_load_failures(&[0, 1, 9], &[], &[]).unwrap();
        s.finish_kv_transfers(&[0], &[], &[]).unwrap();
        match policy {
            KvLoadFailurePolicy::Recompute => {
                assert_eq!(report.failed, [] as [u32; 0]);
                assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 0);
                let out = run_step(&mut s);
                assert_eq!(scheduled(&out)[0], (0, 12), "recomputed whole");
            }
            KvLoadFailurePolicy::Fail => {
                assert_eq!(report.failed, [0]);
                // Finished at the next update, after its outputs (vLLM's error_req_ids).
                assert!(s.get_request(&0).is_some());
                let finished = s.update_from_output(&[]).unwrap();
                assert_eq!(finished, [(0, FinishReason::Error)]);
                assert!(s.get_request(&0).is_none());
                assert_eq!(s.num_free_blocks(), free, "freed once the load reported");
            }
        }
        s.check_invariants().unwrap();
    }
}

#[test]
fn a_failed_loading_request_holds_its_blocks_until_its_load_reports() {
    let (mut s, _) = with_offer(8, true, KvLoadFailurePolicy::Fail);
    let free = s.num_free_blocks();
    s.add_request(0, prompt(0, 12)).unwrap();
    s.schedule().unwrap();
    let bad = block(&s, 0, 1);
    let report = s.handle_kv_load_failures(&[], &[bad], &[]).unwrap();
    assert_eq!(report.failed, [0]);
    s.update_from_output(&[]).unwrap();
    assert!(s.get_request(&0).is_none());
    assert_eq!(
        s.num_free_blocks(),
        free - 2,
        "the load still writes into them"
    );
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    assert_eq!(s.num_free_blocks(), free);
    s.check_invariants().unwrap();
}

/// A 12-token prompt with 8 tokens loaded synchronously: the step computes the last 4.
fn sync_loaded(policy: KvLoadFailurePolicy) -> (Scheduler<u32>, Arc<Mutex<Vec<String>>>) {
    let (mut s, log) = with_offer(8, false, policy);
    s.add_request(0, prompt(0, 12)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 4)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 8);
    (s, log)
}

#[test]
fn a_running_request_recomputes_from_its_first_invalid_block_in_the_blocks_it_holds() {
    let (mut s, log) = sync_loaded(KvLoadFailurePolicy::Recompute);
    let free = s.num_free_blocks();
    let bad = block(&s, 0, 1);
    let report = s.handle_kv_load_failures(&[], &[bad], &[(0, 4)]).unwrap();
    assert_eq!(report.rescheduled, [0]);
    assert_eq!(
        report.num_affected_tokens, 4,
        "8 computed before the step, 4 valid"
    );
    let r = s.get_request(&0).unwrap();
    assert_eq!(
        (r.status, r.num_computed_tokens),
        (RequestStatus::Running, 4)
    );
    assert_eq!(r.num_sampling_steps(), 0, "the step's output is dropped");
    // Its output is not given; the next step recomputes tokens 4..12 and samples.
    s.update_from_output(&[]).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(s.num_free_blocks(), free, "no block freed or taken");
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 8)]);
    assert_eq!(s.get_request(&0).unwrap().num_output_tokens(), 1);
    // The invalid block left the prefix cache while it was recomputed, then came back.
    s.add_request(1, prompt(0, 12)).unwrap();
    s.schedule().unwrap();
    assert_eq!(log.lock().unwrap().last().unwrap(), "match 1 after 8");
}

#[test]
fn invalid_blocks_stay_cached_under_recompute_and_are_evicted_under_fail() {
    for (policy, removed) in [
        (KvLoadFailurePolicy::Recompute, 0),
        (KvLoadFailurePolicy::Fail, 2),
    ] {
        let (mut s, _) = sync_loaded(policy);
        s.enable_kv_events();
        let bad = block(&s, 0, 1);
        s.handle_kv_load_failures(&[], &[bad], &[(0, 4)]).unwrap();
        // vLLM 0.33 evicts blocks 1 and 2 (cached when the step was formed) under "fail"
        // only; under "recompute" they stay cached and are not cached twice.
        let events = s.drain_kv_events();
        let count = |removed: bool| {
            (events.iter())
                .filter(|e| matches!(e, crate::kv::KvEvent::Removed(_)) == removed)
                .count()
        };
        assert_eq!((count(true), count(false)), (removed, 0), "{policy:?}");
        s.update_from_output(&[]).unwrap();
        s.schedule().unwrap();
        let stored = (s.drain_kv_events().into_iter())
            .filter(|e| matches!(e, crate::kv::KvEvent::Stored(_)))
            .count();
        assert_eq!(stored, 0, "{policy:?}: nothing cached again");
        s.check_invariants().unwrap();
    }
}

#[test]
fn a_shared_invalid_block_is_recomputed_by_the_first_request_only() {
    // Request 0 loads 8 tokens synchronously; request 1 shares its first block (a local hit).
    let (mut s, _) = with_offer(8, false, KvLoadFailurePolicy::Recompute);
    s.add_request(0, prompt(0, 12)).unwrap();
    let mut shared = prompt(0, 12);
    shared.prompt_token_ids[4..]
        .iter_mut()
        .for_each(|t| *t += 500);
    s.add_request(1, shared).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(block(&s, 0, 0), block(&s, 1, 0));
    let r1 = s.get_request(&1).unwrap().num_computed_tokens;
    let sched: Vec<(u32, usize)> = scheduled(&out);
    let bad = block(&s, 0, 0);
    let report = s.handle_kv_load_failures(&[], &[bad], &sched).unwrap();
    assert_eq!(report.rescheduled, [0, 1]);
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 0);
    // Request 1 keeps what it had before the step (request 0 recomputes the shared block).
    let n1 = sched.iter().find(|(id, _)| *id == 1).unwrap().1;
    assert_eq!(s.get_request(&1).unwrap().num_computed_tokens, r1 - n1);
    s.update_from_output(&[]).unwrap();
    s.check_invariants().unwrap();
}

#[test]
fn a_running_request_fails_and_its_invalid_blocks_leave_the_cache() {
    let (mut s, log) = sync_loaded(KvLoadFailurePolicy::Fail);
    let free = s.num_free_blocks() + 3;
    let bad = block(&s, 0, 1);
    let report = s.handle_kv_load_failures(&[], &[bad], &[(0, 4)]).unwrap();
    assert_eq!(report.failed, [0]);
    // Its output of the step is not given; the update finishes it and frees its blocks.
    let finished = s.update_from_output(&[]).unwrap();
    assert_eq!(finished, [(0, FinishReason::Error)]);
    assert!(s.get_request(&0).is_none());
    assert_eq!(s.num_free_blocks(), free);
    s.add_request(1, prompt(0, 12)).unwrap();
    s.schedule().unwrap();
    assert_eq!(log.lock().unwrap().last().unwrap(), "match 1 after 4");
    s.check_invariants().unwrap();
}

/// Async scheduling: a 12-token prompt with 8 tokens loaded synchronously, and two steps
/// in flight: the first computes the last 4 prompt tokens, the second the sampled one.
fn two_steps_in_flight() -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        num_blocks: 16,
        max_num_batched_tokens: 16,
        enable_prefix_caching: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    let offer = Offer {
        offer: 8,
        load_async: false,
        log: Arc::new(Mutex::new(Vec::new())),
    };
    s.set_connector(Box::new(offer)).unwrap();
    s.add_request(0, prompt(0, 12)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]);
    let r = s.get_request(&0).unwrap();
    assert_eq!((r.num_sampling_steps(), r.num_output_placeholders), (2, 2));
    s
}

#[test]
fn a_cut_with_a_later_step_in_flight_keeps_the_skipped_steps_placeholder() {
    // vLLM 0.33 scans the blocks of 13 - 4 = 9 computed tokens (the later step's count),
    // cuts at block 1 and skips the step's output without resolving its placeholder.
    let mut s = two_steps_in_flight();
    let bad = block(&s, 0, 1);
    let report = s.handle_kv_load_failures(&[], &[bad], &[(0, 4)]).unwrap();
    assert_eq!(report.rescheduled, [0]);
    assert_eq!(report.num_affected_tokens, 5);
    let r = s.get_request(&0).unwrap();
    assert_eq!(r.num_computed_tokens, 4);
    assert_eq!((r.num_sampling_steps(), r.num_output_placeholders), (1, 2));
    s.update_from_output(&[]).unwrap();
    // The later step lands and appends its token; one placeholder is left for good.
    s.update_from_output(&[sample(0, 7)]).unwrap();
    let r = s.get_request(&0).unwrap();
    assert_eq!((r.num_tokens(), r.num_output_placeholders), (13, 1));
    // It recomputes from the cut up to its tokens and the placeholder: 13 + 1 - 4.
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 10)]);
    let r = s.get_request(&0).unwrap();
    assert_eq!((r.num_computed_tokens, r.num_output_placeholders), (14, 2));
    s.check_invariants().unwrap();
}

#[test]
fn a_cut_whose_later_step_finishes_the_request_frees_its_blocks() {
    let mut s = two_steps_in_flight();
    let free = s.num_free_blocks();
    let bad = block(&s, 0, 0);
    s.handle_kv_load_failures(&[], &[bad], &[(0, 4)]).unwrap();
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 0);
    s.update_from_output(&[]).unwrap();
    s.abort(&[0]).unwrap();
    assert_eq!(
        s.num_outputs_in_flight(&0),
        1,
        "its later step's output is dropped"
    );
    s.update_from_output(&[sample(0, 7)]).unwrap();
    assert!(s.num_free_blocks() > free);
    assert_eq!(s.num_outputs_in_flight(&0), 0);
    s.check_invariants().unwrap();
}

#[test]
fn a_load_failed_whole_with_an_invalid_block_in_the_same_report_recomputes_everything() {
    // vLLM 0.33's `update_from_output` handles `failed_recving` before `invalid_block_ids`:
    // the request failed whole counts 0 computed tokens, so its invalid block cuts nothing.
    let (mut s, _) = with_offer(12, true, KvLoadFailurePolicy::Recompute);
    s.add_request(0, prompt(0, 16)).unwrap();
    s.schedule().unwrap();
    let bad = block(&s, 0, 1);
    let report = s.handle_kv_load_failures(&[0], &[bad], &[]).unwrap();
    assert_eq!(report.num_affected_tokens, 0);
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 0);
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    s.check_invariants().unwrap();
}
