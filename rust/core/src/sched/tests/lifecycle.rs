//! How requests end (stop conditions, abort), speculative rollback, and rejected input.

use super::*;
use crate::sched::*;

#[test]
fn requests_finish_on_max_tokens_eos_stop_ids_and_max_model_len() {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 100,
        max_model_len: 8,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 2,
            ..prompt(0, 2)
        },
    )
    .unwrap();
    s.add_request(
        1,
        RequestSpec {
            eos_token_id: Some(7),
            ..prompt(1, 2)
        },
    )
    .unwrap();
    s.add_request(
        2,
        RequestSpec {
            eos_token_id: Some(7),
            ignore_eos: true,
            stop_token_ids: vec![9],
            ..prompt(2, 2)
        },
    )
    .unwrap();
    s.add_request(
        3,
        RequestSpec {
            max_tokens: 100,
            ..prompt(3, 6)
        },
    )
    .unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.num_scheduled_tokens.len(), 4);
    let sample = |id, tokens: Vec<u32>| SampledOutput {
        request_id: id,
        token_ids: tokens,
        ..Default::default()
    };
    let finished = s
        .update_from_output(&[
            sample(0, vec![1]),
            sample(1, vec![7]),
            sample(2, vec![7]),
            sample(3, vec![1]),
        ])
        .unwrap();
    assert_eq!(finished, [(1, FinishReason::Stop)]);
    assert_eq!(
        s.schedule().unwrap().finished_req_ids,
        [1],
        "reported in the next step"
    );
    let finished = s
        .update_from_output(&[sample(0, vec![1]), sample(2, vec![9]), sample(3, vec![1])])
        .unwrap();
    assert_eq!(
        finished,
        [
            (0, FinishReason::Length),
            (2, FinishReason::Stop),
            (3, FinishReason::Length)
        ],
        "3 reached max_model_len=8"
    );
    assert!(!s.has_unfinished_requests());
    assert_eq!(s.schedule().unwrap().finished_req_ids, [0, 2, 3]);
}

#[test]
fn abort_frees_everything() {
    let cfg = SchedulerConfig {
        enable_prefix_caching: false,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 8)).unwrap();
    s.add_request(1, prompt(1, 8)).unwrap();
    s.schedule().unwrap();
    s.abort(&[0, 1]).unwrap();
    assert_eq!(s.stats().kv_usage, 0.0);
    assert!(!s.has_unfinished_requests());
    assert!(s.abort(&[0]).is_err());
    s.check_invariants().unwrap();
}

#[test]
fn rejected_speculative_tokens_roll_back() {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 100,
        num_lookahead_tokens: 3,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 50,
            ..prompt(0, 4)
        },
    )
    .unwrap();
    s.schedule().unwrap();
    let drafts = SampledOutput {
        request_id: 0,
        token_ids: vec![1],
        spec_token_ids: vec![2, 3, 4],
        ..Default::default()
    };
    s.update_from_output(&[drafts]).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 4)], "one new token plus three drafts");
    assert_eq!(out.scheduled_spec_decode_tokens, [(0, vec![2, 3, 4])]);
    // Two drafts accepted plus a bonus token; one rejected.
    let verified = SampledOutput {
        request_id: 0,
        token_ids: vec![2, 3, 5],
        num_rejected_tokens: 1,
        ..Default::default()
    };
    s.update_from_output(&[verified]).unwrap();
    // Positions 0..7 hold the prompt, 1, 2, 3 (computed); the bonus token 5 is not yet.
    let r = s.get_request(&0).unwrap();
    assert_eq!((r.num_computed_tokens, r.num_tokens()), (7, 8));
    s.check_invariants().unwrap();
}

#[test]
fn bad_requests_and_configs_are_rejected() {
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, prompt(0, 4)).unwrap();
    assert!(s.add_request(0, prompt(0, 4)).is_err(), "duplicate id");
    assert!(s.add_request(1, prompt(1, 0)).is_err(), "empty prompt");
    assert!(
        s.add_request(
            1,
            RequestSpec {
                max_tokens: 0,
                ..prompt(1, 4)
            }
        )
        .is_err()
    );
    assert!(
        s.add_request(1, prompt(1, 64)).is_err(),
        "no room for an output token"
    );
    let unknown = SampledOutput {
        request_id: 9,
        token_ids: vec![1],
        ..Default::default()
    };
    assert!(s.update_from_output(&[unknown]).is_err());
    assert_eq!(s.num_waiting(), 1);
    let too_long = SchedulerConfig {
        max_model_len: 1000,
        ..config()
    };
    // vLLM 0.33's Scheduler accepts a KV cache below max_model_len; the simulator does not.
    assert!(too_long.validate().is_err(), "longer than the KV capacity");
    assert!(Scheduler::<u32>::new(too_long, false).is_ok());
    let no_chunking = SchedulerConfig {
        enable_chunked_prefill: false,
        ..config()
    };
    assert!(
        Scheduler::<u32>::new(no_chunking, false).is_err(),
        "budget below max_model_len"
    );
}

#[test]
fn with_admit_new_off_waiting_requests_without_blocks_keep_their_places() {
    // vLLM's PAUSED_NEW: request 0 runs on, request 1 (holding no blocks) is not admitted
    // until admission is switched back on.
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, prompt(0, 4)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
    s.update_from_output(&[sample(0, 1)]).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    s.set_admit_new(false);
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]);
    s.update_from_output(&[sample(0, 1)]).unwrap();
    assert_eq!(s.waiting_ids(), [1]);
    s.set_admit_new(true);
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1), (1, 4)]);
}

#[test]
fn a_kv_cache_below_max_model_len_is_accepted_and_a_request_too_long_for_it_never_admits() {
    // As vLLM 0.33's Scheduler: 3 KV blocks of 4 (the null block aside) hold 12 tokens,
    // max_model_len is 64. A 20-token prompt never fits and blocks the queue (FCFS); the
    // scheduler still runs.
    let cfg = SchedulerConfig {
        block_size: 4,
        num_blocks: 4,
        max_model_len: 64,
        max_num_batched_tokens: 64,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 20)).unwrap();
    for _ in 0..3 {
        assert!(s.schedule().unwrap().num_scheduled_tokens.is_empty());
    }
    assert_eq!(s.num_waiting(), 1);
    s.abort(&[0]).unwrap();
    s.add_request(1, prompt(1, 6)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 6)]);
    s.check_invariants().unwrap();
}

#[test]
fn an_id_given_twice_in_one_update_is_refused_beside_a_long_queue() {
    // One request running, 999 waiting (more slots than an update's flags are kept for):
    // a repeated id is refused and nothing of the update is applied.
    let cfg = SchedulerConfig {
        max_num_seqs: 1,
        ..config()
    };
    for num_waiting in [0, 999] {
        let mut s = Scheduler::new(cfg.clone(), false).unwrap();
        for id in 0..=num_waiting {
            s.add_request(id, prompt(id, 4)).unwrap();
        }
        s.schedule().unwrap();
        assert!(s.update_from_output(&[sample(0, 5), sample(0, 6)]).is_err());
        assert_eq!(s.get_request(&0).unwrap().num_output_tokens(), 0);
        assert_eq!(s.update_from_output(&[sample(0, 5)]).unwrap(), []);
    }
}
