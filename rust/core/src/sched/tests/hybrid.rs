//! KV cache groups (`SchedulerConfig::kv_groups`): the step scheduler over vLLM's
//! coordinator. A window group frees what leaves its window, blocks are conserved, the
//! output carries a block table per group, and one full-attention group is today's pool.

use super::*;
use crate::kv::{KvGroupSpec, NULL_BLOCK};
use crate::sched::*;

const WINDOW: KvGroupSpec = KvGroupSpec::SlidingWindow { sliding_window: 8 };

/// gpt-oss's shape in miniature: a full-attention group and a window-8 group, block 4.
fn hybrid_config() -> SchedulerConfig {
    SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, WINDOW],
        ..config()
    }
}

fn live(table: &[u32]) -> usize {
    table.iter().filter(|&&b| b != NULL_BLOCK).count()
}

#[test]
fn a_window_group_holds_at_most_window_over_block_size_plus_one_live_blocks() {
    let mut s = Scheduler::new(hybrid_config(), false).unwrap();
    let spec = RequestSpec {
        max_tokens: 40,
        ..prompt(0, 6)
    };
    s.add_request(0, spec).unwrap();
    let mut decode_steps = 0;
    while s.has_unfinished_requests() {
        run_step(&mut s);
        let Some(r) = s.get_request(&0) else { break };
        let tables = s.group_block_ids(&0);
        let computed = r.num_computed_tokens;
        // The full group holds a block per 4 computed tokens; the window group (8 tokens,
        // block 4) keeps at most 8/4 + 1 = 3 of its blocks once the request decodes.
        assert_eq!(
            tables[0].len(),
            computed.div_ceil(4),
            "full group at {computed}"
        );
        assert_eq!(live(&tables[0]), tables[0].len());
        if computed > 6 {
            decode_steps += 1;
            assert!(
                live(&tables[1]) <= 8 / 4 + 1,
                "window group {:?}",
                tables[1]
            );
            assert_eq!(tables[1].len(), tables[0].len(), "nulls keep positions");
        }
    }
    assert!(decode_steps >= 30);
    // 45 tokens: the window group freed all but its last blocks, into the null block.
    assert_eq!(
        s.num_free_blocks(),
        64,
        "all returned (the null block is extra)"
    );
}

#[test]
fn blocks_are_conserved_across_groups_under_preemption() {
    // 11 usable blocks: three requests of 12-token prompts growing to 28 tokens need
    // 7 full + up to 3 window blocks each, so they preempt one another.
    let cfg = SchedulerConfig {
        num_blocks: 11,
        max_model_len: 32,
        ..hybrid_config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    for id in 0..3 {
        let spec = RequestSpec {
            max_tokens: 16,
            ..prompt(id, 12)
        };
        s.add_request(id, spec).unwrap();
    }
    let mut steps = 0;
    while s.has_unfinished_requests() && steps < 500 {
        run_step(&mut s); // checks the coordinator's invariants each step
        let held: usize = (0..3)
            .map(|id| {
                s.group_block_ids(&id)
                    .iter()
                    .map(|t| live(t))
                    .sum::<usize>()
            })
            .sum();
        assert!(held + s.num_free_blocks() <= 11, "no block owned twice");
        steps += 1;
    }
    assert!(!s.has_unfinished_requests());
    assert!(s.stats().num_preemptions > 0, "memory was short");
    assert_eq!(s.num_free_blocks(), 11);
}

#[test]
fn the_output_carries_a_block_table_per_group() {
    let mut s = Scheduler::new(hybrid_config(), false).unwrap();
    let spec = RequestSpec {
        max_tokens: 10,
        ..prompt(0, 10)
    };
    s.add_request(0, spec).unwrap();
    let out = run_step(&mut s);
    let new = &out.scheduled_new_reqs[0];
    assert!(new.block_ids.is_empty());
    assert_eq!(new.group_block_ids.len(), 2);
    // 10 tokens: 3 blocks per group; the window of 8 at token 10 still reads block 0.
    assert_eq!(new.group_block_ids[0].len(), 3);
    assert_eq!(new.group_block_ids[1].len(), 3);
    // Decodes 11 and 12 fit the third block; 13 opens a fourth in each group, and the
    // window group has freed block 0 (tokens 0-3, outside the window of token 12).
    run_step(&mut s);
    run_step(&mut s);
    let out = run_step(&mut s);
    let cached = &out.scheduled_running_reqs[0];
    assert!(cached.new_block_ids.is_empty());
    assert_eq!(
        cached
            .new_group_block_ids
            .iter()
            .map(Vec::len)
            .collect::<Vec<_>>(),
        [1, 1]
    );
    assert_eq!(s.group_block_ids(&0)[1][0], NULL_BLOCK);
    assert_eq!(
        s.block_ids(&0).unwrap(),
        s.group_block_ids(&0)[0].as_slice()
    );
}

/// Runs the same workload (a shared prefix, preemption, prefix hits) to the end and
/// returns every step's output.
fn outputs_of(cfg: SchedulerConfig) -> Vec<SchedulerOutput<u32>> {
    let mut s = Scheduler::new(cfg, false).unwrap();
    for id in 0..4 {
        let mut spec = prompt(0, 12);
        spec.prompt_token_ids.push(id);
        spec.max_tokens = 20;
        s.add_request(id, spec).unwrap();
    }
    let mut outs = Vec::new();
    while s.has_unfinished_requests() {
        outs.push(run_step(&mut s));
    }
    outs
}

#[test]
fn one_full_attention_group_is_the_single_group_pool() {
    let base = SchedulerConfig {
        num_blocks: 16,
        enable_prefix_caching: true,
        ..config()
    };
    let grouped = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention],
        ..base.clone()
    };
    assert!(!grouped.is_hybrid());
    let (a, b) = (outputs_of(base), outputs_of(grouped));
    assert!(a.iter().any(|o| !o.preempted_req_ids.is_empty()));
    assert_eq!(a, b);
    assert!(a[0].scheduled_new_reqs[0].group_block_ids.is_empty());
}

#[test]
fn a_window_model_runs_more_requests_at_once_than_its_full_attention_plan() {
    // 20 usable blocks of 4; four 30-token requests. As full attention each holds 8
    // blocks: two run at once. With a window of 8 each holds at most 3: all four.
    let base = SchedulerConfig {
        num_blocks: 20,
        max_model_len: 32,
        max_num_batched_tokens: 200,
        ..config()
    };
    let window = SchedulerConfig {
        kv_groups: vec![WINDOW],
        ..base.clone()
    };
    let mut peaks = Vec::new();
    for cfg in [base, window] {
        let mut s = Scheduler::new(cfg, false).unwrap();
        for id in 0..4 {
            let spec = RequestSpec {
                max_tokens: 22,
                ..prompt(id, 8)
            };
            s.add_request(id, spec).unwrap();
        }
        let mut peak = 0;
        while s.has_unfinished_requests() {
            run_step(&mut s);
            peak = peak.max(s.num_running());
        }
        peaks.push((peak, s.stats().num_preemptions));
    }
    assert_eq!(peaks[1], (4, 0));
    assert!(peaks[0].0 < 4 || peaks[0].1 > 0, "{peaks:?}");
}

fn config_error(cfg: SchedulerConfig) -> &'static str {
    match Scheduler::<u32>::new(cfg, false) {
        Err(crate::Error::Config { field, .. }) => field,
        Err(other) => panic!("not a config error: {other}"),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn combinations_the_coordinator_cannot_serve_are_refused_by_field() {
    let radix = SchedulerConfig {
        enable_prefix_caching: true,
        prefix_cache: PrefixCache::Radix,
        ..hybrid_config()
    };
    assert_eq!(config_error(radix), "prefix_cache");
    let host = SchedulerConfig {
        enable_prefix_caching: true,
        host_num_blocks: 8,
        ..hybrid_config()
    };
    assert_eq!(config_error(host), "host_num_blocks");
    let mamba = SchedulerConfig {
        enable_prefix_caching: true,
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::MAMBA],
        ..config()
    };
    assert_eq!(config_error(mamba), "enable_prefix_caching");
    let zero = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::SlidingWindow { sliding_window: 0 }],
        ..config()
    };
    assert_eq!(config_error(zero), "kv_groups");
}

#[test]
fn a_mamba_group_holds_one_block_per_request() {
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::MAMBA],
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 10)).unwrap();
    run_step(&mut s);
    run_step(&mut s);
    let tables = s.group_block_ids(&0);
    assert_eq!((tables[0].len(), tables[1].len()), (3, 1));
}

use proptest::prelude::*;

proptest! {
    /// Random workloads over random groups: every step's coordinator invariants hold
    /// (`run_step` checks them), every window group stays within its live-block bound on
    /// decode steps, every request finishes, and every block comes back.
    #[test]
    fn groups_conserve_blocks_and_every_request_finishes(
        prompts in prop::collection::vec((1usize..30, 1usize..8), 1..10),
        budget in 4usize..40,
        window in 1usize..12,
        chunk in 1usize..12,
        with_full in any::<bool>(),
        caching in any::<bool>(),
        // Enough for one 32-token request in every group, plus the null block.
        extra_blocks in 0usize..16,
    ) {
        let mut groups = vec![KvGroupSpec::SlidingWindow { sliding_window: window }];
        if with_full {
            groups.insert(0, KvGroupSpec::FullAttention);
        } else {
            groups.push(KvGroupSpec::ChunkedLocalAttention { attention_chunk_size: chunk });
        }
        let cfg = SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: 0,
            num_blocks: 2 * 8 + 1 + extra_blocks,
            block_size: 4,
            max_model_len: 32,
            enable_prefix_caching: caching,
            kv_groups: groups.clone(),
            ..SchedulerConfig::default()
        };
        let mut s = Scheduler::new(cfg.clone(), false).unwrap();
        for (id, &(len, max_tokens)) in prompts.iter().enumerate() {
            let spec = RequestSpec { max_tokens, ..prompt((id % 3) as u32, len) };
            s.add_request(id as u32, spec).unwrap();
        }
        let mut steps = 0;
        while s.has_unfinished_requests() {
            let out = run_step(&mut s);
            for &(id, n) in &out.num_scheduled_tokens {
                let Some(r) = s.get_request(&id) else { continue };
                let tables = s.group_block_ids(&id);
                for (spec, table) in groups.iter().zip(&tables) {
                    let bound = spec.max_live_blocks(n + cfg.num_lookahead_tokens, 4);
                    if let (Some(bound), true) = (bound, r.num_computed_tokens > 0) {
                        prop_assert!(live(table) <= bound, "{spec:?} {table:?} after {n}");
                    }
                }
            }
            steps += 1;
            prop_assert!(steps < 5000, "no progress");
        }
        prop_assert_eq!(s.num_free_blocks(), cfg.num_kv_blocks());
    }
}

/// Null blocks in the window group's table of request 0.
fn window_nulls(s: &Scheduler<u32>) -> usize {
    let tables = s.group_block_ids(&0);
    tables[1].iter().filter(|&&b| b == NULL_BLOCK).count()
}

/// vLLM 0.33's `test_swa_free_waits_for_in_flight_step` (and its chunked-local twin) in
/// miniature: an 18-token prefill, then decodes scheduled ahead (the first fits in the
/// prefill's last block). Returns the window group's
/// nulls after the decode scheduled while the prefill is in flight, and after the next.
fn nulls_while_the_prefill_is_in_flight(group: KvGroupSpec, async_scheduling: bool) -> [usize; 2] {
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, group],
        max_num_batched_tokens: 32,
        ..config()
    };
    let mut s = Scheduler::new(cfg, async_scheduling).unwrap();
    s.add_request(0, prompt(0, 18)).unwrap();
    let prefill = s.schedule().unwrap();
    if !async_scheduling {
        answer_step(&mut s, prefill);
        let decode = s.schedule().unwrap();
        let first = window_nulls(&s);
        answer_step(&mut s, decode);
        s.schedule().unwrap();
        return [first, window_nulls(&s)];
    }
    let free_after_prefill = s.num_free_blocks();
    let decode = s.schedule().unwrap();
    assert_eq!(scheduled(&decode), [(0, 1)]);
    let first = window_nulls(&s);
    if first == 0 {
        assert_eq!(s.num_free_blocks(), free_after_prefill, "nothing freed yet");
    }
    s.update_from_output(&[sample(0, 7)]).unwrap();
    s.schedule().unwrap();
    s.check_invariants().unwrap();
    [first, window_nulls(&s)]
}

#[test]
fn under_async_scheduling_a_window_frees_only_what_the_steps_that_landed_left_behind() {
    // Window 8, block 4: at 18 processed tokens the next one attends to 11..18, so blocks
    // 0-1 (tokens 0..8) leave the window. vLLM 0.33 frees on the processed-token basis
    // (`num_computed_tokens - num_in_flight_tokens`): not while the prefill is in flight
    // (18 - 18 = 0), but at the next allocation once it landed (19 - 1 = 18).
    assert_eq!(nulls_while_the_prefill_is_in_flight(WINDOW, true), [0, 2]);
    // Synchronous: the prefill has landed when the first decode allocates (18 - 0), and
    // the second frees block 2 (19: the window starts at token 12).
    assert_eq!(nulls_while_the_prefill_is_in_flight(WINDOW, false), [2, 3]);
}

#[test]
fn under_async_scheduling_a_local_chunk_is_freed_once_the_steps_reading_it_landed() {
    // Chunks of 8: at 18 processed tokens chunks 0-1 (tokens 0..16, blocks 0-3) are over.
    let chunked = KvGroupSpec::ChunkedLocalAttention {
        attention_chunk_size: 8,
    };
    assert_eq!(nulls_while_the_prefill_is_in_flight(chunked, true), [0, 4]);
    assert_eq!(nulls_while_the_prefill_is_in_flight(chunked, false), [4, 4]);
}

#[test]
fn prefill_chunks_in_flight_count_though_they_sample_nothing() {
    // vLLM 0.33 counts every step's scheduled tokens in flight, sampling or not. Budget 8,
    // a 20-token prompt: chunks of 8, 8 and 4 tokens, each scheduled before the one
    // before it landed.
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, WINDOW],
        max_num_batched_tokens: 8,
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    s.add_request(0, prompt(0, 20)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 8)]);
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 8)]);
    // The first chunk lands (it samples nothing: no output).
    s.update_from_output(&[]).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
    // 16 computed, 8 in flight: at 8 processed tokens the window starts at token 1, and
    // no block is wholly before it (at 16 it would start at 9: blocks 0-1 freed).
    assert_eq!(window_nulls(&s), 0);
    s.update_from_output(&[]).unwrap();
    // The last chunk samples; the decode after it is scheduled while it is in flight:
    // 20 computed, 4 in flight, 16 processed: blocks 0-1 (tokens 0..8) leave the window.
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]);
    assert_eq!(window_nulls(&s), 2);
    s.check_invariants().unwrap();
}

#[test]
fn a_drafts_update_lands_no_step_for_the_window() {
    // Drafts given between steps (vLLM's `update_draft_token_ids`) are no step's output:
    // the prefill stays in flight, so its window keeps every block until its own update.
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, WINDOW],
        max_num_batched_tokens: 32,
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    s.add_request(0, prompt(0, 18)).unwrap();
    s.schedule().unwrap();
    s.update_draft_token_ids(&[]).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]);
    assert_eq!(window_nulls(&s), 0, "the prefill has not landed");
    s.check_invariants().unwrap();
}
