//! A preempted request's outputs in flight under async scheduling (`sched::stale`, vLLM
//! 0.33's `num_stale_output_tokens` / `drop_stale_output`): delivered, and the request
//! waits for them before it is admitted again; or dropped, and it may resume at once.

use super::*;

#[test]
fn a_preempted_request_waits_for_its_stale_output_before_resuming() {
    // Async: preempted while its prefill's step is in flight. The next step skips it
    // (deferred); once that step's token (5) lands it resumes with 4 + 1 tokens.
    let mut s = Scheduler::new(config(), true).unwrap();
    s.set_wait_for_stale_outputs(true);
    s.add_request(0, prompt(0, 4)).unwrap();
    s.schedule().unwrap();
    s.preempt_request(&0).unwrap();
    let out = s.schedule().unwrap();
    assert!(out.num_scheduled_tokens.is_empty());
    assert_eq!(s.deferred_waiting_ids(), [0]);
    s.update_from_output(&[sample(0, 5)]).unwrap();
    s.update_from_output(&[]).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 5)]);
    assert_eq!(out.scheduled_resumed_reqs.len(), 1);
    s.check_invariants().unwrap();
}

#[test]
fn a_synchronous_scheduler_never_waits() {
    let mut s = Scheduler::new(config(), false).unwrap();
    s.set_wait_for_stale_outputs(true);
    s.add_request(0, prompt(0, 4)).unwrap();
    s.schedule().unwrap();
    s.preempt_request(&0).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
}

#[test]
fn dropped_stale_output_lets_the_victim_resume_at_once() {
    // 5 blocks of 4: two 8-token prompts fill 4; their first decodes need a block each, so
    // the second is preempted with its prefill's output in flight. With drops on (a KV
    // producer's), that output is no longer expected and it is admitted again as soon as
    // memory allows, here once the first finishes.
    let config = SchedulerConfig {
        num_blocks: 5,
        max_num_batched_tokens: 32,
        ..config()
    };
    for drop in [false, true] {
        let mut s = Scheduler::new(config.clone(), true).unwrap();
        s.set_wait_for_stale_outputs(true);
        s.set_drop_stale_output(drop);
        assert_eq!(s.drop_stale_output(), drop);
        s.add_request(
            0,
            RequestSpec {
                max_tokens: 2,
                ..prompt(0, 8)
            },
        )
        .unwrap();
        s.add_request(1, prompt(1, 8)).unwrap();
        assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 8), (1, 8)]);
        let out = s.schedule().unwrap();
        assert_eq!(out.preempted_req_ids, [1]);
        assert_eq!(s.num_outputs_in_flight(&1), usize::from(!drop));
        let first = if drop {
            vec![sample(0, 5)]
        } else {
            vec![sample(0, 5), sample(1, 5)]
        };
        s.update_from_output(&first).unwrap();
        s.check_invariants().unwrap();
        // Request 0 stops (max_tokens 2) on the second step's token.
        s.update_from_output(&[sample(0, 6)]).unwrap();
        let out = s.schedule().unwrap();
        // Delivered: resumes with its token (9 tokens); dropped: its 8 prompt tokens.
        assert_eq!(scheduled(&out), [(1, if drop { 8 } else { 9 })]);
        s.check_invariants().unwrap();
    }
}

#[test]
fn a_drafts_update_lands_no_step() {
    // Drafts given between steps (vLLM's update_draft_token_ids) are no step's output: the
    // preempted request still waits for its prefill's token. Sampled tokens are refused.
    let mut s = Scheduler::new(config(), true).unwrap();
    s.set_wait_for_stale_outputs(true);
    s.add_request(0, prompt(0, 4)).unwrap();
    s.add_request(1, prompt(1, 2)).unwrap();
    s.schedule().unwrap();
    s.preempt_request(&0).unwrap();
    let drafts = SampledOutput {
        request_id: 1,
        spec_token_ids: vec![3],
        ..Default::default()
    };
    s.update_draft_token_ids(&[drafts]).unwrap();
    assert_eq!(s.get_request(&1).unwrap().spec_token_ids, [3]);
    let out = s.schedule().unwrap();
    assert!(out.num_scheduled_tokens.iter().all(|&(id, _)| id != 0));
    assert!(s.update_draft_token_ids(&[sample(1, 5)]).is_err());
    s.check_invariants().unwrap();
}

#[test]
fn without_the_wait_a_victim_resumes_as_soon_as_it_fits() {
    // The default: an engine that does not update empty steps keeps its victims moving.
    let mut s = Scheduler::new(config(), true).unwrap();
    assert!(!s.wait_for_stale_outputs());
    s.add_request(0, prompt(0, 4)).unwrap();
    s.schedule().unwrap();
    s.preempt_request(&0).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
}
