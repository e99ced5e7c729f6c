//! KV memory: admission limits, prefix hits (block hash and radix), preemption and resumption.

use super::*;
use crate::sched::*;

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

fn tied(priority_ties: PriorityTies, num_blocks: usize) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        policy: Policy::Priority,
        priority_ties,
        num_blocks,
        max_num_batched_tokens: 64,
        max_model_len: num_blocks * 4,
        ..config()
    };
    Scheduler::new(cfg, false).unwrap()
}

#[test]
fn priority_ties_admit_the_smaller_request_id_first_as_vllm_does() {
    // Equal priority and arrival time; only one fits (3 blocks of 4 for 9 tokens, 4 blocks).
    for (ties, first) in [(PriorityTies::Vllm, 3), (PriorityTies::ArrivalOrder, 5)] {
        let mut s = tied(ties, 4);
        s.add_request(5, prompt(5, 9)).unwrap();
        s.add_request(3, prompt(3, 9)).unwrap();
        assert_eq!(scheduled(&s.schedule().unwrap()), [(first, 9)], "{ties:?}");
    }
}

#[test]
fn priority_ties_preempt_the_first_tied_running_request_as_vllm_does() {
    // Two tied 8-token prompts in 5 blocks of 4: both need a third block for their 9th
    // token; 0 takes the last free one, and 1 must preempt. vLLM's `max()` picks the first
    // tied request in running order (0); arrival order picks the latest (1, itself).
    for (ties, victim) in [(PriorityTies::Vllm, 0), (PriorityTies::ArrivalOrder, 1)] {
        let mut s = tied(ties, 5);
        s.add_request(0, prompt(0, 8)).unwrap();
        s.add_request(1, prompt(1, 8)).unwrap();
        run_step(&mut s);
        let out = run_step(&mut s);
        assert_eq!(out.preempted_req_ids, [victim], "{ties:?}");
        assert_eq!(scheduled(&out), [(1 - victim, 1)], "{ties:?}");
    }
}
