//! Behaviours of the step scheduler, each with numbers checkable by hand.

use super::*;
use crate::Error;
use proptest::prelude::*;

fn config() -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 0,
        max_num_batched_tokens: 10,
        block_size: 4,
        num_blocks: 64,
        max_model_len: 64,
        enable_prefix_caching: false,
        ..SchedulerConfig::default()
    }
}

fn prompt(id: u32, len: usize) -> RequestSpec {
    RequestSpec {
        prompt_token_ids: (0..len as u32).map(|t| id * 1000 + t).collect(),
        max_tokens: 4,
        ..RequestSpec::default()
    }
}

fn scheduled(out: &SchedulerOutput<u32>) -> Vec<(u32, usize)> {
    out.num_scheduled_tokens.clone()
}

/// A fake model: one token (`7`) for each request that caught up with its tokens.
fn run_step(s: &mut Scheduler<u32>) -> SchedulerOutput<u32> {
    let out = s.schedule().unwrap();
    let outputs: Vec<_> = out
        .num_scheduled_tokens
        .iter()
        .filter(|(id, _)| {
            let r = s.get_request(id).unwrap();
            r.num_computed_tokens >= r.num_tokens()
        })
        .map(|&(id, _)| SampledOutput {
            request_id: id,
            token_ids: vec![7],
            ..Default::default()
        })
        .collect();
    s.update_from_output(&outputs).unwrap();
    s.check_invariants().unwrap();
    out
}

#[test]
fn budget_caps_total_tokens_three_8_token_prompts_under_10_schedule_8_2_0() {
    let mut s = Scheduler::new(config(), false).unwrap();
    for id in 0..3 {
        s.add_request(id, prompt(id, 8)).unwrap();
    }
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 8), (1, 2)]);
    assert_eq!(out.total_num_scheduled_tokens, 10);
    assert_eq!(s.num_waiting(), 1);
}

#[test]
fn sequence_cap_admits_only_max_num_seqs() {
    let cfg = SchedulerConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 1000,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    for id in 0..10 {
        s.add_request(id, prompt(id, 2)).unwrap();
    }
    assert_eq!(s.schedule().unwrap().num_scheduled_tokens.len(), 4);
    assert_eq!(s.num_running(), 4);
}

#[test]
fn long_prefill_threshold_caps_a_request_chunk() {
    let cfg = SchedulerConfig {
        long_prefill_token_threshold: 16,
        max_num_batched_tokens: 1000,
        max_model_len: 200,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 100)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 16)]);
}

#[test]
fn running_is_served_before_waiting_is_admitted() {
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, prompt(0, 3)).unwrap();
    run_step(&mut s); // request 0 prefilled, now decoding
    s.add_request(1, prompt(1, 20)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 1), (1, 9)]);
}

#[test]
fn memory_exhaustion_stops_admission_without_preempting() {
    let cfg = SchedulerConfig {
        num_blocks: 4,
        max_model_len: 16,
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 14)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 14)]);
    assert!(out.preempted_req_ids.is_empty());
    assert_eq!(s.waiting_ids(), [1]);
}

#[test]
fn fully_cached_prompt_schedules_one_token() {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 8)).unwrap();
    run_step(&mut s);
    s.abort(&[0]).unwrap();
    s.add_request(1, prompt(0, 8)).unwrap(); // same 8 tokens: both blocks cached
    let out = s.schedule().unwrap();
    assert_eq!(
        scheduled(&out),
        [(1, 4)],
        "only whole blocks hit and the last token recomputes"
    );
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 4);
    let stats = s.stats();
    assert_eq!(
        (stats.prefix_cache_queries, stats.prefix_cache_hits),
        (16, 4)
    );
}

#[test]
fn radix_prefix_cache_serves_a_finished_requests_prompt() {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        prefix_cache: PrefixCache::Radix,
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 1,
            ..prompt(0, 10)
        },
    )
    .unwrap();
    run_step(&mut s); // finishes after one token; its 2 full pages go into the tree
    s.add_request(1, prompt(0, 10)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(1, 2)], "8 of 10 prompt tokens hit");
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 8);
    s.check_invariants().unwrap();
}

#[test]
fn radix_fully_cached_prompt_still_recomputes_its_last_token() {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        prefix_cache: PrefixCache::Radix,
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 1,
            ..prompt(0, 8)
        },
    )
    .unwrap();
    run_step(&mut s); // its two full pages (all 8 prompt tokens) go into the tree
    s.add_request(1, prompt(0, 8)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(
        scheduled(&out),
        [(1, 4)],
        "only the first page: the last token must run"
    );
    s.check_invariants().unwrap();
}

#[test]
fn fcfs_preempts_the_last_running_request_and_admits_nothing_that_step() {
    // 3 blocks of 4: two 4-token prompts fill 2 blocks; decoding needs a third each.
    let cfg = SchedulerConfig {
        num_blocks: 3,
        max_model_len: 12,
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 4)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    run_step(&mut s); // both prefilled, each sampled one token: 5 tokens, 1 block each
    s.add_request(2, prompt(2, 1)).unwrap();
    let out = s.schedule().unwrap();
    // Request 0 takes the free block; request 1 cannot grow and, being last, is preempted.
    assert_eq!(scheduled(&out), [(0, 1)]);
    assert_eq!(out.preempted_req_ids, [1]);
    assert_eq!(
        s.waiting_ids(),
        [1, 2],
        "the victim goes to the front; no admissions"
    );
    let victim = s.get_request(&1).unwrap();
    assert_eq!((victim.num_computed_tokens, victim.num_preemptions), (0, 1));
}

#[test]
fn priority_preempts_the_largest_priority_value() {
    let cfg = SchedulerConfig {
        num_blocks: 3,
        max_model_len: 12,
        max_num_batched_tokens: 100,
        policy: Policy::Priority,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(
        0,
        RequestSpec {
            priority: 5,
            ..prompt(0, 4)
        },
    )
    .unwrap();
    s.add_request(
        1,
        RequestSpec {
            priority: 1,
            ..prompt(1, 4)
        },
    )
    .unwrap();
    let out = run_step(&mut s);
    assert_eq!(
        scheduled(&out),
        [(1, 4), (0, 4)],
        "lower value = higher priority, admitted first"
    );
    let out = s.schedule().unwrap();
    // Request 1 grows into the last block; request 0 (priority 5) cannot and is the victim.
    assert_eq!(scheduled(&out), [(1, 1)]);
    assert_eq!(out.preempted_req_ids, [0]);
}

#[test]
fn a_preempted_request_is_resumed_first_and_recomputes_everything() {
    let cfg = SchedulerConfig {
        num_blocks: 3,
        max_model_len: 12,
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 4)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    run_step(&mut s);
    run_step(&mut s); // request 1 preempted
    s.abort(&[0]).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.scheduled_resumed_reqs.len(), 1);
    let resumed = &out.scheduled_resumed_reqs[0];
    assert_eq!(resumed.request_id, 1);
    assert_eq!(
        resumed.token_ids.len(),
        5,
        "prompt plus the token sampled before preemption"
    );
    assert_eq!(scheduled(&out), [(1, 5)]);
}

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
fn prioritize_prefill_gives_prefills_the_budget_first() {
    let cfg = SchedulerConfig {
        prioritize_prefill: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 3)).unwrap();
    run_step(&mut s);
    s.add_request(1, prompt(1, 20)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(
        scheduled(&out),
        [(1, 10)],
        "the new prompt takes the whole budget"
    );
}

#[test]
fn lora_gating_skips_requests_needing_another_adapter() {
    let cfg = SchedulerConfig {
        max_loras: 1,
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(
        0,
        RequestSpec {
            lora_id: Some(1),
            ..prompt(0, 2)
        },
    )
    .unwrap();
    s.add_request(
        1,
        RequestSpec {
            lora_id: Some(2),
            ..prompt(1, 2)
        },
    )
    .unwrap();
    s.add_request(
        2,
        RequestSpec {
            lora_id: Some(1),
            ..prompt(2, 2)
        },
    )
    .unwrap();
    s.add_request(3, prompt(3, 2)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 2), (2, 2), (3, 2)]);
    assert_eq!(s.waiting_ids(), [1], "the skipped request keeps its place");
}

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
    // max_tokens=2 outputs are in flight: nothing more is scheduled.
    assert!(s.schedule().unwrap().num_scheduled_tokens.is_empty());
    let sample = |t| SampledOutput {
        request_id: 0,
        token_ids: vec![t],
        ..Default::default()
    };
    assert!(s.update_from_output(&[sample(1)]).unwrap().is_empty());
    assert_eq!(
        s.update_from_output(&[sample(2)]).unwrap(),
        [(0, FinishReason::Length)]
    );
    assert!(!s.has_unfinished_requests());
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
    assert!(
        Scheduler::<u32>::new(too_long, false).is_err(),
        "longer than the KV capacity"
    );
    let no_chunking = SchedulerConfig {
        enable_chunked_prefill: false,
        ..config()
    };
    assert!(
        Scheduler::<u32>::new(no_chunking, false).is_err(),
        "budget below max_model_len"
    );
}

proptest! {
    #[test]
    fn budgets_hold_and_every_request_finishes(
        prompts in prop::collection::vec((1usize..30, 1usize..6), 1..12),
        budget in 1usize..40,
        max_seqs in 0usize..4,
        num_blocks in 8usize..24,
        caching in any::<bool>(),
        policy in prop_oneof![Just(Policy::Fcfs), Just(Policy::Priority)],
        prefix_cache in prop_oneof![Just(PrefixCache::BlockHash), Just(PrefixCache::Radix)],
    ) {
        let cfg = SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: max_seqs,
            num_blocks,
            block_size: 4,
            max_model_len: 32,
            enable_prefix_caching: caching,
            prefix_cache,
            policy,
            ..SchedulerConfig::default()
        };
        let mut s = Scheduler::new(cfg, false).unwrap();
        for (id, &(len, max_tokens)) in prompts.iter().enumerate() {
            let spec = RequestSpec { max_tokens, priority: (id % 3) as i64, ..prompt((id % 3) as u32, len) };
            s.add_request(id as u32, spec).unwrap();
        }
        let mut steps = 0;
        while s.has_unfinished_requests() {
            let out = run_step(&mut s);
            prop_assert!(out.total_num_scheduled_tokens <= budget);
            prop_assert!(out.num_scheduled_tokens.iter().all(|&(_, n)| n >= 1));
            prop_assert!(max_seqs == 0 || s.num_running() <= max_seqs);
            steps += 1;
            prop_assert!(steps < 5000, "no progress");
        }
    }
}

/// Admits shortest prompts first; preempts the request with the most tokens first.
struct ShortestFirst;

impl PolicyPlugin<u32> for ShortestFirst {
    fn order_waiting(&mut self, waiting: &[RequestView<u32>]) -> crate::Result<Vec<usize>> {
        let mut order: Vec<usize> = (0..waiting.len()).collect();
        order.sort_by_key(|&i| (waiting[i].num_prompt_tokens, waiting[i].request_id));
        Ok(order)
    }

    fn preemption_order(&mut self, running: &[RequestView<u32>]) -> crate::Result<Vec<usize>> {
        let mut order: Vec<usize> = (0..running.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(running[i].num_tokens));
        Ok(order)
    }
}

struct Broken;

impl PolicyPlugin<u32> for Broken {
    fn order_waiting(&mut self, waiting: &[RequestView<u32>]) -> crate::Result<Vec<usize>> {
        Ok(vec![0; waiting.len()])
    }

    fn preemption_order(&mut self, running: &[RequestView<u32>]) -> crate::Result<Vec<usize>> {
        Ok((0..running.len()).collect())
    }
}

#[test]
fn a_plugin_orders_admissions_and_chooses_victims() {
    let cfg = SchedulerConfig {
        num_blocks: 6,
        max_model_len: 20,
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_plugin(Box::new(ShortestFirst));
    s.add_request(0, prompt(0, 12)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    s.add_request(2, prompt(2, 8)).unwrap();
    let out = run_step(&mut s);
    // Shortest first; 4 + 8 + 12 tokens fill the 6 blocks exactly.
    assert_eq!(scheduled(&out), [(1, 4), (2, 8), (0, 12)]);
    // Next step every request needs a block; the longest (request 0) is the first victim.
    let out = s.schedule().unwrap();
    assert_eq!(out.preempted_req_ids, [0]);
}

#[test]
fn an_invalid_plugin_answer_is_an_error_and_changes_nothing() {
    let mut s = Scheduler::new(config(), false).unwrap();
    s.set_plugin(Box::new(Broken));
    s.add_request(0, prompt(0, 4)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    assert!(matches!(s.schedule(), Err(Error::Plugin(_))));
    assert_eq!(s.waiting_ids(), [0, 1]);
    assert_eq!(s.stats().num_steps, 0);
    s.check_invariants().unwrap();
}

fn sample(request_id: u32, token: u32) -> SampledOutput<u32> {
    SampledOutput {
        request_id,
        token_ids: vec![token],
        ..Default::default()
    }
}

#[test]
fn async_scheduling_holds_blocks_of_a_finished_request_until_its_in_flight_step_lands() {
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
    // Step 2 may still read the request's KV: its block stays allocated.
    assert!(s.stats().kv_usage > 0.0);
    assert!(s.schedule().unwrap().num_scheduled_tokens.is_empty());
    assert!(s.update_from_output(&[sample(0, 9)]).unwrap().is_empty());
    assert_eq!(s.stats().kv_usage, 0.0);
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
