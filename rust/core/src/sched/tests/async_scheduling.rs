//! Scheduling ahead of the outputs (async mode): placeholders, late outputs, held blocks.

use super::*;
use crate::sched::*;

#[test]
fn async_scheduling_schedules_ahead_and_drops_late_outputs_of_finished_requests() {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 2,
            ..prompt(0, 3)
        },
    )
    .unwrap();
    let first = s.schedule().unwrap();
    assert_eq!(scheduled(&first), [(0, 3)]);
    // Before step 1's token lands, step 2 already schedules the next decode.
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]);
    // With two steps in flight, vLLM 0.33's rule ((computed + 1) - (placeholders - 1) >=
    // prompt + max_tokens: 3 < 5) reads the second placeholder as a draft that may be
    // rejected, and schedules a third step.
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]);
    // Once one has landed, max_tokens=2 outputs are certain: nothing more is scheduled.
    let sample = |t| SampledOutput {
        request_id: 0,
        token_ids: vec![t],
        ..Default::default()
    };
    assert!(s.update_from_output(&[sample(1)]).unwrap().is_empty());
    assert!(s.schedule().unwrap().num_scheduled_tokens.is_empty());
    assert_eq!(
        s.update_from_output(&[sample(2)]).unwrap(),
        [(0, FinishReason::Length)]
    );
    assert!(!s.has_unfinished_requests());
    // The third step's output is late: dropped.
    assert!(s.update_from_output(&[sample(3)]).unwrap().is_empty());
    s.check_invariants().unwrap();
}

#[test]
fn async_scheduling_frees_a_finished_request_at_once_and_drops_its_late_output() {
    // vLLM 0.33 frees a request's blocks when it stops, even with its next step in flight
    // (nothing allocated after that step can write them before it ends).
    let mut s = Scheduler::new(config(), true).unwrap();
    s.add_request(
        0,
        RequestSpec {
            eos_token_id: Some(5),
            ..prompt(0, 3)
        },
    )
    .unwrap();
    s.schedule().unwrap(); // step 1: the prompt
    s.schedule().unwrap(); // step 2, in flight: the first decode
    let finished = s.update_from_output(&[sample(0, 5)]).unwrap();
    assert_eq!(finished, [(0, FinishReason::Stop)]);
    assert!(!s.has_unfinished_requests());
    assert_eq!(s.stats().kv_usage, 0.0);
    assert_eq!(s.num_outputs_in_flight(&0), 1);
    assert!(s.schedule().unwrap().num_scheduled_tokens.is_empty());
    assert!(s.update_from_output(&[sample(0, 9)]).unwrap().is_empty());
    assert_eq!(s.num_outputs_in_flight(&0), 0);
    s.check_invariants().unwrap();
}

#[test]
fn three_requests_stopping_on_eos_with_steps_in_flight_leave_no_block_held() {
    // Issue 30: three requests stopping on EOS while their next step is in flight left
    // the KV usage at 0.9 until late outputs that an engine may never deliver.
    let cfg = SchedulerConfig {
        num_blocks: 10,
        max_model_len: 32,
        max_num_batched_tokens: 64,
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    for id in 0..3 {
        let spec = RequestSpec {
            eos_token_id: Some(5),
            ..prompt(id, 11)
        };
        s.add_request(id, spec).unwrap();
    }
    assert_eq!(
        scheduled(&s.schedule().unwrap()),
        [(0, 11), (1, 11), (2, 11)]
    );
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1), (1, 1), (2, 1)]);
    assert!((s.stats().kv_usage - 0.9).abs() < 1e-9, "9 of 10 blocks");
    let eos: Vec<_> = (0..3).map(|id| sample(id, 5)).collect();
    assert_eq!(s.update_from_output(&eos).unwrap().len(), 3);
    assert_eq!(s.stats().kv_usage, 0.0);
    s.check_invariants().unwrap();
}

#[test]
fn async_scheduling_caches_the_blocks_of_landed_steps_in_the_update() {
    // vLLM 0.33 caches up to num_computed_tokens - num_in_flight_tokens in
    // update_from_output when the request has output placeholders: a block that the
    // landed steps completed is a prefix hit before the request's next allocation.
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    let spec = RequestSpec {
        max_tokens: 2,
        ..prompt(0, 3)
    };
    s.add_request(0, spec).unwrap();
    s.schedule().unwrap(); // step 1: 3 prompt tokens
    s.schedule().unwrap(); // step 2: the first output's KV, in flight
    s.update_from_output(&[sample(0, 7)]).unwrap(); // step 1 lands
    // Step 2 lands: the request stops (max_tokens) with its first block complete; no
    // allocation came after, so only the update can cache it.
    let finished = s.update_from_output(&[sample(0, 8)]).unwrap();
    assert_eq!(finished, [(0, FinishReason::Length)]);
    let mut full = prompt(0, 3).prompt_token_ids;
    full.extend([7, 8]);
    assert_eq!(s.num_cached_prefix_tokens(&full, None), 4);
    s.check_invariants().unwrap();
}

#[test]
fn async_scheduling_keeps_the_in_flight_token_of_a_request_preempted_meanwhile() {
    let cfg = SchedulerConfig {
        num_blocks: 3,
        max_model_len: 12,
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    for id in 0..2 {
        let spec = RequestSpec {
            max_tokens: 6,
            ..prompt(id, 4)
        };
        s.add_request(id, spec).unwrap();
    }
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4), (1, 4)]);
    // Step 2 needs a new block for each decode; one is free, so request 1 is preempted
    // while step 1 (which computes its first token) is still in flight.
    let second = s.schedule().unwrap();
    assert_eq!(scheduled(&second), [(0, 1)]);
    assert_eq!(second.preempted_req_ids, [1]);
    s.update_from_output(&[sample(0, 7), sample(1, 8)]).unwrap();
    assert_eq!(
        s.get_request(&1).unwrap().num_tokens(),
        5,
        "the token is kept"
    );
    s.update_from_output(&[sample(0, 7)]).unwrap();
    s.check_invariants().unwrap();
}
