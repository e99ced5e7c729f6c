//! Speculative decoding's two vLLM 0.33 rules: a one-token admission padded to `1 + k` with
//! placeholder drafts (`pad_spec_decode`), and blocks that accepted drafts complete cached
//! in the update (`cache_accepted_drafts`); and drafts of a prefill chunk dropped.

use super::*;
use crate::kv::KvEvent;

/// `config()` (budget 10, blocks of 4, 64 blocks, `max_model_len` 64) with `k` drafts.
fn spec_config(k: usize) -> SchedulerConfig {
    SchedulerConfig {
        num_speculative_tokens: k,
        ..config()
    }
}

fn output(id: u32, tokens: Vec<u32>, rejected: usize, drafts: Vec<u32>) -> SampledOutput<u32> {
    SampledOutput {
        request_id: id,
        token_ids: tokens,
        num_rejected_tokens: rejected,
        spec_token_ids: drafts,
    }
}

/// Request 0 (4-token prompt) prefills in step 1 and samples; the caller adds more.
fn one_decoding(cfg: SchedulerConfig) -> Scheduler<u32> {
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 20,
            ..prompt(0, 4)
        },
    )
    .unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
    s.update_from_output(&[sample(0, 7)]).unwrap();
    s
}

#[test]
fn a_one_token_prompt_joining_a_decode_is_padded_to_one_plus_k() {
    // k = 2. Step 2: request 0 decodes 1; request 1's whole prompt is one token, so it is
    // scheduled 1 + 2 = 3 tokens, two of them placeholder drafts (3 of the 9 left).
    let mut s = one_decoding(spec_config(2));
    s.add_request(1, prompt(1, 1)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 1), (1, 3)]);
    assert_eq!(
        out.scheduled_spec_decode_tokens,
        [(1, vec![PLACEHOLDER_DRAFT, PLACEHOLDER_DRAFT])]
    );
    assert_eq!(s.get_request(&1).unwrap().num_computed_tokens, 3);
    // Placeholders are never accepted: one token, two rejected, computed back to 1.
    s.update_from_output(&[sample(0, 7), output(1, vec![8], 2, vec![])])
        .unwrap();
    let r = s.get_request(&1).unwrap();
    assert_eq!((r.num_computed_tokens, r.num_tokens()), (1, 2));
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1), (1, 1)]);
    s.check_invariants().unwrap();
}

#[test]
fn pad_spec_decode_off_schedules_the_one_token() {
    let mut s = one_decoding(SchedulerConfig {
        pad_spec_decode: false,
        ..spec_config(2)
    });
    s.add_request(1, prompt(1, 1)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 1), (1, 1)]);
    assert!(out.scheduled_spec_decode_tokens.is_empty());
}

#[test]
fn a_one_token_prompt_alone_is_not_padded() {
    // Nothing running was scheduled and nothing was hit: vLLM pads only beside decodes.
    let mut s = Scheduler::new(spec_config(2), false).unwrap();
    s.add_request(0, prompt(0, 1)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]);
}

#[test]
fn a_padded_admission_that_does_not_fit_stops_admission() {
    // Budget 5, k = 4: request 0 decodes 1, leaving 4 < 1 + 4. Request 1 (one token) is not
    // admitted unpadded, and request 2 (3 tokens, which would fit) waits behind it.
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 5,
        ..spec_config(4)
    };
    let mut s = one_decoding(cfg.clone());
    s.add_request(1, prompt(1, 1)).unwrap();
    s.add_request(2, prompt(2, 3)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]);
    // The rule before vLLM 0.33 admits both.
    let mut s = one_decoding(SchedulerConfig {
        pad_spec_decode: false,
        ..cfg
    });
    s.add_request(1, prompt(1, 1)).unwrap();
    s.add_request(2, prompt(2, 3)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1), (1, 1), (2, 3)]);
}

#[test]
fn no_padding_in_a_step_that_serves_a_running_prefill() {
    // Budget 16: request 0's 20-token prompt takes 16, then its last 4 (a prefill chunk) in
    // step 2, beside request 1's one token, unpadded.
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 16,
        ..spec_config(2)
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 20)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 16)]);
    s.update_from_output(&[]).unwrap();
    s.add_request(1, prompt(1, 1)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4), (1, 1)]);
}

/// Caching on, k = 2: request 0 (9-token prompt) runs to its end, leaving its two full
/// blocks (8 tokens) cached.
fn after_a_cached_prompt(max_model_len: usize, k: usize) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        max_model_len,
        ..spec_config(k)
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 1,
            ..prompt(0, 9)
        },
    )
    .unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[sample(0, 7)]).unwrap();
    assert!(!s.has_unfinished_requests());
    s
}

#[test]
fn a_prompt_hit_but_its_last_token_is_padded_even_alone() {
    // The same 9 tokens hit 8: one left, so 1 + 2 = 3 tokens (slots 8 + 3 = 11: 3 blocks).
    let mut s = after_a_cached_prompt(64, 2);
    s.add_request(1, prompt(0, 9)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(1, 3)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 8);
    assert_eq!(s.block_ids(&1).unwrap().len(), 3);
}

#[test]
fn padding_leaves_room_for_the_sampled_token_under_max_model_len() {
    // max_model_len 12: 8 hit + 1 + k + 1 sampled must fit. k = 2 fits (12), k = 3 (13) is
    // not padded.
    let mut s = after_a_cached_prompt(12, 2);
    s.add_request(1, prompt(0, 9)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 3)]);
    let mut s = after_a_cached_prompt(12, 3);
    s.add_request(1, prompt(0, 9)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 1)]);
}

#[test]
fn a_threshold_below_one_plus_k_drops_the_padding() {
    // Threshold 2 < 1 + 2 with two requests competing: request 1 gets its one token.
    let mut s = one_decoding(SchedulerConfig {
        long_prefill_token_threshold: 2,
        ..spec_config(2)
    });
    s.add_request(1, prompt(1, 1)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 1), (1, 1)]);
    assert!(out.scheduled_spec_decode_tokens.is_empty());
}

/// Caching on, k = 3, events on: request 0 (4-token prompt, `max_tokens` 5) prefills and
/// samples 100 with drafts 101, 102, 103; step 2 verifies them (positions 4..7) and the
/// model accepts all three and adds 104: five outputs, so it finishes in that update.
fn all_drafts_accepted_at_the_end(
    cache_accepted_drafts: bool,
    async_scheduling: bool,
) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        cache_accepted_drafts,
        ..spec_config(3)
    };
    let mut s = Scheduler::new(cfg, async_scheduling).unwrap();
    s.enable_kv_events();
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 5,
            ..prompt(0, 4)
        },
    )
    .unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[output(0, vec![100], 0, vec![101, 102, 103])])
        .unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
    assert_eq!(
        s.drain_kv_events().len(),
        1,
        "the prompt's block, at allocation"
    );
    let finished = s
        .update_from_output(&[output(0, vec![101, 102, 103, 104], 0, vec![])])
        .unwrap();
    assert_eq!(finished, [(0, FinishReason::Length)]);
    s
}

#[test]
fn blocks_that_accepted_drafts_complete_are_cached_in_the_update() {
    // Positions 4..7 (100 and the three accepted drafts) fill block 1: cached in the update
    // although the request finished there. A prompt of those 8 tokens and one more hits 8.
    let mut s = all_drafts_accepted_at_the_end(true, false);
    assert!(matches!(s.drain_kv_events()[..], [KvEvent::Stored(_)]));
    let mut tokens = prompt(0, 4).prompt_token_ids;
    tokens.extend([100, 101, 102, 103, 9]);
    s.add_request(
        1,
        RequestSpec {
            prompt_token_ids: tokens,
            max_tokens: 1,
            ..RequestSpec::default()
        },
    )
    .unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 8);
}

#[test]
fn under_async_scheduling_they_are_cached_in_the_update_when_no_step_is_in_flight() {
    // The same steps, each output landing before the next schedule(): nothing of the
    // request is in flight at its last update, so vLLM caches there too.
    let mut s = all_drafts_accepted_at_the_end(true, true);
    assert!(matches!(s.drain_kv_events()[..], [KvEvent::Stored(_)]));
}

#[test]
fn cache_accepted_drafts_off_never_caches_them_once_the_request_finished() {
    let mut s = all_drafts_accepted_at_the_end(false, false);
    assert!(s.drain_kv_events().is_empty());
    let mut tokens = prompt(0, 4).prompt_token_ids;
    tokens.extend([100, 101, 102, 103, 9]);
    s.add_request(
        1,
        RequestSpec {
            prompt_token_ids: tokens,
            max_tokens: 1,
            ..RequestSpec::default()
        },
    )
    .unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 4);
}

#[test]
fn drafts_proposed_for_a_prefill_chunk_are_dropped() {
    // Budget 10, 20-token prompt: step 1 is a chunk of 10 that samples nothing; drafts
    // given for it are dropped (vLLM's update_draft_token_ids), so step 2 is the next 10.
    let mut s = Scheduler::new(spec_config(2), false).unwrap();
    s.add_request(0, prompt(0, 20)).unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[output(0, vec![], 0, vec![5, 6])])
        .unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 10)]);
    assert!(out.scheduled_spec_decode_tokens.is_empty());
}

#[test]
fn lookahead_slots_stop_at_max_model_len() {
    // max_model_len 12, 3 lookahead slots: an 11-token prompt needs 11 slots (3 blocks),
    // not 14 (4 blocks): vLLM caps a request's slots at max_model_len.
    let cfg = SchedulerConfig {
        max_model_len: 12,
        num_lookahead_tokens: 3,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 11)).unwrap();
    s.schedule().unwrap();
    assert_eq!(s.block_ids(&0).unwrap().len(), 3);
}

#[test]
fn accepted_drafts_past_a_stop_are_dropped_and_its_block_is_not_cached() {
    // Caching on, k = 3, EOS 2: a 5-token prompt samples 100 (position 5); drafts 101, 2,
    // 103 are all accepted, with 104 after. The request stops at the EOS (position 7), so 103
    // and 104 are dropped and, as in vLLM, its computed tokens cover all but the last: 7.
    // Block 1 (positions 4..7) is full of known tokens but not computed, so not cached.
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        ..spec_config(3)
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 10,
            eos_token_id: Some(2),
            ..prompt(0, 5)
        },
    )
    .unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[output(0, vec![100], 0, vec![101, 2, 103])])
        .unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
    let finished = s
        .update_from_output(&[output(0, vec![101, 2, 103, 104], 0, vec![])])
        .unwrap();
    assert_eq!(finished, [(0, FinishReason::Stop)]);
    let mut tokens = prompt(0, 5).prompt_token_ids;
    tokens.extend([100, 101, 2, 9]);
    s.add_request(
        1,
        RequestSpec {
            prompt_token_ids: tokens,
            max_tokens: 1,
            ..RequestSpec::default()
        },
    )
    .unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 4);
}
