//! Token budget, sequence cap, chunk caps, prefill priority, LoRA gating; the budget property.

use super::*;
use crate::sched::*;
use proptest::prelude::*;

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

fn threshold_config(adaptive: bool) -> SchedulerConfig {
    SchedulerConfig {
        long_prefill_token_threshold: 16,
        long_prefill_token_threshold_adaptive: adaptive,
        max_num_batched_tokens: 100,
        max_model_len: 200,
        ..config()
    }
}

#[test]
fn long_prefill_threshold_caps_each_request_when_several_compete() {
    let mut s = Scheduler::new(threshold_config(false), false).unwrap();
    s.add_request(0, prompt(0, 100)).unwrap();
    s.add_request(1, prompt(1, 100)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 16), (1, 16)]);
}

#[test]
fn long_prefill_threshold_leaves_a_lone_request_the_whole_budget() {
    // vLLM 0.33: with one request running or waiting there is nobody to starve.
    let mut s = Scheduler::new(threshold_config(false), false).unwrap();
    s.add_request(0, prompt(0, 150)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 100)]);
}

#[test]
fn adaptive_threshold_is_floored_at_a_fair_share_of_the_budget() {
    // Three requests: a fair share of 100 tokens is 33, above the threshold of 16.
    let mut s = Scheduler::new(threshold_config(true), false).unwrap();
    for id in 0..3 {
        s.add_request(id, prompt(id, 100)).unwrap();
    }
    assert_eq!(
        scheduled(&s.schedule().unwrap()),
        [(0, 33), (1, 33), (2, 33)]
    );
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

proptest! {
    #[test]
    fn budgets_hold_and_every_request_finishes(
        prompts in prop::collection::vec((1usize..30, 1usize..6), 1..12),
        budget in 1usize..40,
        max_seqs in 0usize..4,
        // One more than a 32-token request needs: vLLM's null block.
        num_blocks in 9usize..24,
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
            // Distinct arrival times: vLLM's rule for full ties can livelock (`PriorityTies`).
            let spec = RequestSpec { max_tokens, priority: (id % 3) as i64, arrival_time: id as f64, ..prompt((id % 3) as u32, len) };
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
