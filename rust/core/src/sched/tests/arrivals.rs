//! Requests that arrive unlike a fresh generation prompt: under a model that samples no
//! token (vLLM 0.33's `num_sampled_tokens_per_step = 0`, pooling), and with tokens already
//! computed (a P/D decode side's request, `RequestSpec::num_computed_tokens`).

use super::*;
use crate::Error;

/// `config()` with `max_model_len` 8 and a budget of 4 (vLLM's pooling test's numbers).
fn pooling_config(num_sampled: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_model_len: 8,
        max_num_batched_tokens: 4,
        num_sampled_tokens_per_step: num_sampled,
        ..config()
    }
}

#[test]
fn a_pooling_prompt_fills_max_model_len_in_two_chunks_of_four() {
    let mut s = Scheduler::new(pooling_config(0), false).unwrap();
    s.add_request(0, prompt(0, 8)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
    // The last chunk reaches max_model_len (8 - 4 - 0 = 4), not one token short.
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 8);
    // The pooler output (given as one token) ends it at max_model_len.
    let finished = s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(finished, [(0, FinishReason::Length)]);
    s.check_invariants().unwrap();
}

#[test]
fn a_generation_model_keeps_a_token_of_room() {
    // The default (1): an 8-token prompt is refused, and a 7-token one gets 4 then 3.
    let mut s = Scheduler::new(pooling_config(1), false).unwrap();
    let err = s.add_request(0, prompt(0, 8)).unwrap_err();
    assert!(matches!(err, Error::Input { .. }), "{err:?}");
    assert!(err.to_string().contains("max_model_len=8"), "{err}");
    s.add_request(1, prompt(1, 7)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 4)]);
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 3)]);
    let Err(err) = Scheduler::<u32>::new(pooling_config(2), false) else {
        panic!("num_sampled_tokens_per_step = 2 was accepted");
    };
    assert!(
        err.to_string().contains("num_sampled_tokens_per_step"),
        "{err}"
    );
}

/// `config()` with a budget of 100 and prefix caching on.
fn cached_config() -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 100,
        enable_prefix_caching: true,
        ..config()
    }
}

fn computed(id: u32, len: usize, num_computed: usize) -> RequestSpec {
    RequestSpec {
        num_computed_tokens: num_computed,
        ..prompt(id, len)
    }
}

#[test]
fn a_request_arriving_computed_schedules_its_rest_with_blocks_for_all() {
    // 10 tokens, 9 computed: one token scheduled, blocks for all 10 (3 of 4 tokens), and
    // the two full blocks cached: a second request with that prompt hits 8 tokens.
    let mut s = Scheduler::new(cached_config(), false).unwrap();
    s.add_request(0, computed(0, 10, 9)).unwrap();
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 9);
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 1)]);
    assert_eq!(out.scheduled_new_reqs[0].block_ids.len(), 3);
    assert_eq!(s.num_free_blocks(), 64 - 3);
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 10);
    s.check_invariants().unwrap();
    s.update_from_output(&[sample(0, 7)]).unwrap();
    s.add_request(1, prompt(0, 10)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 1), (1, 2)]);
    s.check_invariants().unwrap();
}

#[test]
fn a_preempted_request_recomputes_the_tokens_it_arrived_with() {
    let mut s = Scheduler::new(cached_config(), false).unwrap();
    s.add_request(0, computed(0, 10, 9)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]);
    s.update_from_output(&[sample(0, 7)]).unwrap();
    let (reset, preempted) = s.reset_prefix_cache(true).unwrap();
    assert!(reset);
    assert_eq!(preempted, [0]);
    // Prompt and output, 11 tokens, from 0: nothing cached any more.
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 11)]);
    s.check_invariants().unwrap();
}

#[test]
fn computed_tokens_are_refused_unless_below_the_prompt_or_beside_unmodelled_groups() {
    let mut s = Scheduler::new(cached_config(), false).unwrap();
    let err = s.add_request(0, computed(0, 10, 10)).unwrap_err();
    assert!(err.to_string().contains("num_computed_tokens"), "{err}");
    assert!(err.to_string().contains("10"), "{err}");
    let hybrid = SchedulerConfig {
        kv_groups: vec![
            crate::kv::KvGroupSpec::FullAttention,
            crate::kv::KvGroupSpec::SlidingWindow { sliding_window: 8 },
        ],
        enable_prefix_caching: false,
        ..cached_config()
    };
    let mut s = Scheduler::new(hybrid.clone(), false).unwrap();
    s.add_request(0, computed(0, 10, 4)).unwrap();
    // A bounded-replay window beside it is not modelled.
    let replay = SchedulerConfig {
        kv_groups: vec![
            crate::kv::KvGroupSpec::FullAttention,
            crate::kv::KvGroupSpec::SlidingWindowReplay { sliding_window: 8 },
        ],
        ..hybrid
    };
    let mut s = Scheduler::new(replay, false).unwrap();
    let err = s.add_request(0, computed(0, 10, 4)).unwrap_err();
    assert!(err.to_string().contains("SlidingWindowReplay"), "{err}");
    s.add_request(1, prompt(1, 10)).unwrap();
}

#[test]
fn spec_padding_of_a_computed_arrival_leaves_room_for_the_sampled_token() {
    // vLLM 0.33's test_no_spec_decode_padding_up_to_max_model_len: k = 1, max_model_len
    // 32, a running decode, then a 31-token request with 30 computed: padding to 2 would
    // reach 32 with no room for the sampled token, so it gets its one token unpadded and
    // finishes at max_model_len. A 20-token one (19 computed) is padded.
    let cfg = SchedulerConfig {
        max_model_len: 32,
        num_speculative_tokens: 1,
        ..cached_config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(
        9,
        RequestSpec {
            max_tokens: 20,
            ..prompt(9, 4)
        },
    )
    .unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(9, 4)]);
    s.update_from_output(&[sample(9, 7)]).unwrap();
    s.add_request(0, computed(0, 31, 30)).unwrap();
    s.add_request(1, computed(1, 20, 19)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(9, 1), (0, 1), (1, 2)]);
    assert_eq!(
        out.scheduled_spec_decode_tokens,
        [(1, vec![PLACEHOLDER_DRAFT])]
    );
    let finished = s
        .update_from_output(&[sample(9, 7), sample(0, 7), sample(1, 7)])
        .unwrap();
    assert_eq!(finished, [(0, FinishReason::Length)]);
    s.check_invariants().unwrap();
}

#[test]
fn a_request_arriving_computed_is_served_before_earlier_waiting_ones() {
    // vLLM 0.33's `_enqueue_waiting_request` queues it with the block holders
    // (`_holds_kv_blocks`: `num_computed_tokens > 0`), which admission drains first: with
    // one sequence slot it runs first though it arrived last.
    let cfg = SchedulerConfig {
        max_num_seqs: 1,
        ..cached_config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 10)).unwrap();
    s.add_request(1, computed(1, 10, 9)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 1)]);
    s.check_invariants().unwrap();
}
