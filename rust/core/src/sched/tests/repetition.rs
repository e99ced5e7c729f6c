//! Repetition detection (vLLM 0.33's `check_sequence_repetition` in `check_stop`): checked
//! on the outputs after EOS, the stop ids and the length, from `min_tokens` outputs on, per
//! appended token (so a speculative step stops at the token completing the pattern).

use proptest::prelude::*;

use super::*;
use crate::sched::RepetitionDetection;

fn rule(max: usize, min: usize, count: usize) -> Option<RepetitionDetection> {
    Some(RepetitionDetection {
        max_pattern_size: max,
        min_pattern_size: min,
        min_count: count,
    })
}

/// Request 0 (4-token prompt, `max_tokens` 20) with `spec`'s stop rules, prefilled; then
/// its outputs fed one token a step. Returns the finish and at which output it came.
fn feed(
    repetition_detection: Option<RepetitionDetection>,
    min_tokens: usize,
    tokens: &[u32],
) -> Option<(usize, FinishReason)> {
    let mut s = Scheduler::new(config(), false).unwrap();
    let spec = RequestSpec {
        max_tokens: 20,
        repetition_detection,
        min_tokens,
        ..prompt(0, 4)
    };
    s.add_request(0, spec).unwrap();
    for (i, &token) in tokens.iter().enumerate() {
        s.schedule().unwrap();
        let finished = s.update_from_output(&[sample(0, token)]).unwrap();
        if let Some(&(_, reason)) = finished.first() {
            return Some((i + 1, reason));
        }
    }
    None
}

#[test]
fn pattern_of_two_thrice_stops_at_the_sixth_output() {
    let tokens = [1, 2, 1, 2, 1, 2, 1, 2];
    assert_eq!(
        feed(rule(2, 2, 3), 0, &tokens),
        Some((6, FinishReason::Repetition))
    );
    assert_eq!(FinishReason::Repetition.as_str(), "repetition");
}

#[test]
fn one_token_repeated_is_a_pattern_of_one_when_min_pattern_size_is_0() {
    // min_pattern_size 0 counts as 1: [5, 5, 5] ends the outputs at the third.
    assert_eq!(
        feed(rule(3, 0, 3), 0, &[4, 5, 5, 5]),
        Some((4, FinishReason::Repetition))
    );
    // From size 2 on, the same run is no pattern until it is 6 long (5 5 | 5 5 | 5 5).
    assert_eq!(
        feed(rule(3, 2, 3), 0, &[5; 8]),
        Some((6, FinishReason::Repetition))
    );
}

#[test]
fn min_tokens_defers_the_check() {
    // The pattern completes at output 6 but is only checked from output 8 on.
    let tokens = [1, 2, 1, 2, 1, 2, 1, 2, 1];
    assert_eq!(
        feed(rule(2, 2, 3), 8, &tokens),
        Some((8, FinishReason::Repetition))
    );
}

#[test]
fn the_length_comes_first() {
    // Output 3 completes [9] x 3 and reaches max_tokens 3: vLLM reports the length. (EOS
    // or a stop id cannot complete a pattern: its earlier copies stopped the request.)
    let mut s = Scheduler::new(config(), false).unwrap();
    let spec = RequestSpec {
        max_tokens: 3,
        repetition_detection: rule(1, 1, 3),
        ..prompt(0, 4)
    };
    s.add_request(0, spec).unwrap();
    let mut finished = Vec::new();
    for _ in 0..3 {
        s.schedule().unwrap();
        finished = s.update_from_output(&[sample(0, 9)]).unwrap();
    }
    assert_eq!(finished, [(0, FinishReason::Length)]);
}

#[test]
fn the_prompt_is_not_part_of_the_pattern() {
    // The 4-token prompt is [0, 0, 0, 0]: outputs [0, 0] do not make [0] x 3.
    assert_eq!(feed(rule(1, 1, 3), 0, &[0, 0, 1]), None);
}

#[test]
fn a_speculative_step_stops_at_the_token_completing_the_pattern() {
    // Outputs [3, 3] then a step accepting [3, 8, 8]: [3] x 3 completes at its first
    // token, the rest are dropped.
    let cfg = SchedulerConfig {
        num_speculative_tokens: 2,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    let spec = RequestSpec {
        max_tokens: 20,
        repetition_detection: rule(1, 1, 3),
        ..prompt(0, 4)
    };
    s.add_request(0, spec).unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[sample(0, 3)]).unwrap();
    s.schedule().unwrap();
    let with_drafts = SampledOutput {
        spec_token_ids: vec![1, 1],
        ..sample(0, 3)
    };
    s.update_from_output(&[with_drafts]).unwrap();
    s.schedule().unwrap();
    let accepted = SampledOutput {
        token_ids: vec![3, 8, 8],
        ..sample(0, 3)
    };
    let finished = s.update_from_output(&[accepted]).unwrap();
    assert_eq!(finished, [(0, FinishReason::Repetition)]);
}

#[test]
fn settings_vllm_refuses_are_refused() {
    let mut s = Scheduler::new(config(), false).unwrap();
    let bad = |r: Option<RepetitionDetection>, min_tokens| RequestSpec {
        repetition_detection: r,
        min_tokens,
        ..prompt(0, 4)
    };
    let err = s.add_request(0, bad(rule(2, 3, 3), 0)).unwrap_err();
    assert!(err.to_string().contains("repetition_detection"), "{err}");
    let err = s.add_request(0, bad(rule(2, 1, 1), 0)).unwrap_err();
    assert!(err.to_string().contains("min_count"), "{err}");
    // min_tokens defers only this rule: alone it would change nothing.
    let err = s.add_request(0, bad(None, 2)).unwrap_err();
    assert!(err.to_string().contains("min_tokens"), "{err}");
    // max_pattern_size 0 disables the rule, whatever min_count says (vLLM's).
    s.add_request(0, bad(rule(0, 0, 0), 2)).unwrap();
}

/// vLLM 0.33's `check_sequence_repetition`, index for index (`_has_repeating_pattern`).
fn vllm_rule(tokens: &[u32], max: usize, min: usize, count: usize) -> bool {
    let min = min.max(1);
    if max == 0 || count < 2 || min > max {
        return false;
    }
    for len in min..=max {
        if len * count > tokens.len() {
            return false;
        }
        let at = |back: usize| tokens[tokens.len() - back];
        let repeats = (1..=len).all(|n| (1..count).all(|m| at(len * m + n) == at(n)));
        if repeats {
            return true;
        }
    }
    false
}

proptest! {
    #[test]
    fn detects_as_vllm_checks(
        tokens in proptest::collection::vec(0u32..3, 0..40),
        max in 0usize..6, min in 0usize..6, count in 0usize..5,
    ) {
        let rule = RepetitionDetection { max_pattern_size: max, min_pattern_size: min, min_count: count };
        for end in 0..=tokens.len() {
            let outputs = &tokens[..end];
            prop_assert_eq!(rule.detects(outputs), vllm_rule(outputs, max, min, count));
        }
    }
}
