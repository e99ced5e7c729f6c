//! Coalesced decode steps (`sched::multistep`) against stepping: two schedulers get the same
//! requests; one steps, the other runs every decode window it can open, with arrivals
//! cutting windows as the simulator's do. After each step's scheduling the pool's cache
//! events and free blocks must agree; outside windows, every request's tokens, computed
//! count and block table must too.

use proptest::prelude::*;

use super::*;
use crate::kv::KvGroupSpec;

/// Outputs depend on the position only, so requests with one prompt write blocks with one
/// hash (the pool then finds them cached already).
fn token(_: &u32, position: usize) -> u32 {
    (position % 5) as u32 + 1
}

type State = (u32, Vec<u32>, usize, Vec<u32>, Vec<Vec<u32>>);

/// Each request's tokens, computed count and block tables (every group's, with several).
fn state(s: &Scheduler<u32>, ids: &[u32]) -> Vec<State> {
    ids.iter()
        .filter_map(|id| {
            let r = s.get_request(id)?;
            Some((
                *id,
                r.all_token_ids.clone(),
                r.num_computed_tokens,
                s.block_ids(id).unwrap_or_default().to_vec(),
                s.group_block_ids(id),
            ))
        })
        .collect()
}

/// Requests that sampled at the end of the step `out` (as `sim::replica::v1` picks them).
fn samplers(s: &Scheduler<u32>, out: &SchedulerOutput<u32>) -> Vec<u32> {
    (out.num_scheduled_tokens.iter())
        .map(|&(id, _)| id)
        .filter(|id| {
            s.get_request(id)
                .is_some_and(|r| r.num_computed_tokens >= r.num_tokens())
        })
        .collect()
}

/// Runs `arrivals` stepped and windowed; returns the steps run in windows.
fn check(
    caching: bool,
    block_size: usize,
    num_blocks: usize,
    kv_groups: &[KvGroupSpec],
    arrivals: &[(usize, usize, usize, usize)],
) -> std::result::Result<usize, TestCaseError> {
    let config = SchedulerConfig {
        kv_groups: kv_groups.to_vec(),
        max_num_batched_tokens: 24,
        block_size,
        num_blocks,
        max_model_len: 96,
        enable_prefix_caching: caching,
        ..SchedulerConfig::default()
    };
    let mut stepped = Scheduler::<u32>::new(config.clone(), false).unwrap();
    let mut windowed = Scheduler::<u32>::new(config, false).unwrap();
    for s in [&mut stepped, &mut windowed] {
        s.set_lean_output(true);
        s.enable_kv_events();
    }
    let mut window: Option<(DecodeWindow, Vec<u32>)> = None;
    let mut num_windowed_steps = 0;
    let ids: Vec<u32> = (0..arrivals.len() as u32).collect();
    for step in 0..400 {
        let due: Vec<u32> = (ids.iter().copied())
            .filter(|&i| arrivals[i as usize].0 == step)
            .collect();
        if !due.is_empty()
            && let Some((mut w, in_window)) = window.take()
        {
            windowed.catch_up_all(&mut w, token).unwrap();
            let finished = windowed.append_one_token_each(&in_window, token).unwrap();
            prop_assert!(finished.is_empty(), "a window ended early with finishes");
        }
        for &i in &due {
            let (_, prefix, len, max_tokens) = arrivals[i as usize];
            let spec = RequestSpec {
                prompt_token_ids: (0..len as u32).map(|t| (prefix as u32) * 100 + t).collect(),
                max_tokens,
                ignore_eos: true,
                ..RequestSpec::default()
            };
            stepped.add_request(i, spec.clone()).unwrap();
            windowed.add_request(i, spec).unwrap();
        }
        let out = stepped.schedule().unwrap();
        let stepped_events = stepped.drain_kv_events();
        if window.is_none()
            && let Some(w) = windowed.open_decode_window()
        {
            window = Some((w, windowed.running_ids()));
        }
        if let Some((w, in_window)) = &mut window
            && !windowed.form_decode_step(w, token).unwrap()
        {
            // Declined (it would preempt): the window ends after its last step.
            if w.num_formed() > 0 {
                windowed.catch_up_all(w, token).unwrap();
                let finished = windowed.append_one_token_each(in_window, token).unwrap();
                prop_assert!(finished.is_empty());
            }
            window = None;
        }
        let windowed_samplers = match &mut window {
            Some((_, in_window)) => {
                num_windowed_steps += 1;
                let expected: Vec<(u32, usize)> = in_window.iter().map(|&i| (i, 1)).collect();
                prop_assert_eq!(&out.num_scheduled_tokens, &expected, "step {}", step);
                None
            }
            None => {
                let theirs = windowed.schedule().unwrap();
                prop_assert_eq!(&out.num_scheduled_tokens, &theirs.num_scheduled_tokens);
                Some(samplers(&windowed, &theirs))
            }
        };
        prop_assert_eq!(
            &stepped_events,
            &windowed.drain_kv_events(),
            "cache events of step {}",
            step
        );
        prop_assert_eq!(
            stepped.num_free_blocks(),
            windowed.num_free_blocks(),
            "free blocks after step {}",
            step
        );
        let finished = stepped
            .append_one_token_each(&samplers(&stepped, &out), token)
            .unwrap();
        let theirs = match (windowed_samplers, &mut window) {
            (Some(list), _) => windowed.append_one_token_each(&list, token).unwrap(),
            (None, Some((w, in_window))) if w.num_formed() < w.num_steps() => {
                let done = windowed.end_decode_step(w, token).unwrap();
                in_window.retain(|id| !done.iter().any(|(d, _)| d == id));
                prop_assert_eq!(&finished, &done, "finished in window step {}", step);
                done
            }
            (None, _) => {
                let (mut w, in_window) = window.take().expect("in a window");
                windowed.catch_up_all(&mut w, token).unwrap();
                windowed.append_one_token_each(&in_window, token).unwrap()
            }
        };
        if window.is_none() {
            prop_assert_eq!(finished, theirs);
            prop_assert_eq!(
                state(&stepped, &ids),
                state(&windowed, &ids),
                "step {}",
                step
            );
        }
        if !stepped.has_unfinished_requests() && step > arrivals.iter().map(|a| a.0).max().unwrap()
        {
            break;
        }
    }
    prop_assert!(!stepped.has_unfinished_requests());
    prop_assert_eq!(stepped.num_free_blocks(), windowed.num_free_blocks());
    Ok(num_windowed_steps)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn decode_windows_make_the_moves_stepping_makes(
        caching in any::<bool>(),
        block_size in prop::sample::select(vec![1usize, 2, 4, 8]),
        tightness in 0usize..3,
        arrivals in prop::collection::vec((0usize..60, 0usize..3, 1usize..30, 1usize..60), 1..12),
    ) {
        // One more than the longest request needs (vLLM 0.33 reserves a null block).
        let num_blocks = 96usize.div_ceil(block_size) * [1, 2, 6][tightness] + 1;
        check(caching, block_size, num_blocks, &[], &arrivals)?;
    }

    /// The same over vLLM's coordinator: a full-attention group beside a sliding-window
    /// group (gpt-oss) or a chunked local one (Llama 4), whose window or chunk may or may
    /// not be a whole number of blocks (a chunk that is not declines windows), sometimes a
    /// second window group or a Mamba group first. Each
    /// group's block table, the free blocks and the tokens must agree with stepping.
    #[test]
    fn decode_windows_over_kv_groups_make_the_moves_stepping_makes(
        caching in any::<bool>(),
        block_size in prop::sample::select(vec![1usize, 2, 4, 8]),
        tightness in 0usize..3,
        window in prop::sample::select(vec![1usize, 3, 5, 8, 13, 16, 24]),
        chunked in prop::bool::weighted(0.3),
        second_window in prop::bool::weighted(0.2),
        mamba_first in prop::bool::weighted(0.15),
        mamba_per_block in any::<bool>(),
        arrivals in prop::collection::vec((0usize..60, 0usize..3, 1usize..30, 1usize..60), 1..12),
    ) {
        let mut groups = vec![KvGroupSpec::FullAttention];
        groups.push(if chunked {
            KvGroupSpec::ChunkedLocalAttention { attention_chunk_size: window }
        } else {
            KvGroupSpec::SlidingWindow { sliding_window: window }
        });
        if second_window {
            groups.push(KvGroupSpec::SlidingWindow { sliding_window: window + 3 });
        }
        // A recurrent group first: its states are not cached. One block per request, or
        // (`none` mode with a block shorter than the request) a slot per block, all but the
        // last state freed: that frees a block the step after the one opening a block.
        if mamba_first {
            let mamba = if mamba_per_block {
                KvGroupSpec::mamba_blocks(false, false, 0, 0, None).unwrap()
            } else {
                KvGroupSpec::MAMBA
            };
            groups.insert(0, mamba);
        }
        let caching = caching && !mamba_first;
        // Every group may hold a block per block_size tokens.
        let per_request = 96usize.div_ceil(block_size) * groups.len();
        let num_blocks = per_request * [1, 2, 6][tightness] + 1;
        check(caching, block_size, num_blocks, &groups, &arrivals)?;
    }
}

/// The windows the property test judges do open over KV groups, and run long.
#[test]
fn decode_windows_open_over_kv_groups() {
    let arrivals: Vec<_> = (0..8).map(|i| (i * 2, i % 3, 5 + 3 * i, 50)).collect();
    for (groups, caching) in [
        (
            vec![
                KvGroupSpec::FullAttention,
                KvGroupSpec::SlidingWindow { sliding_window: 5 },
            ],
            true,
        ),
        (
            vec![
                KvGroupSpec::FullAttention,
                KvGroupSpec::ChunkedLocalAttention {
                    attention_chunk_size: 8,
                },
            ],
            false,
        ),
    ] {
        // Tight enough that windows end at a step that would preempt.
        for num_blocks in [2 * 24 + 1, 200] {
            let windowed = check(caching, 4, num_blocks, &groups, &arrivals).unwrap();
            assert!(windowed > 40, "{groups:?} {num_blocks}: {windowed} steps");
        }
    }
}

#[test]
fn a_window_runs_until_its_last_request_finishes() {
    let mut s = Scheduler::<u32>::new(config(), false).unwrap();
    for (id, max_tokens) in [(1, 9), (2, 6)] {
        let spec = RequestSpec {
            max_tokens,
            ignore_eos: true,
            ..prompt(id, 3)
        };
        s.add_request(id, spec).unwrap();
    }
    run_step(&mut s); // both prefill, each samples one token
    let mut w = s.open_decode_window().expect("pure decode");
    // Request 1 has 8 outputs to go, request 2 has 5: 2 leaves after the fifth step.
    assert_eq!(w.num_steps(), 8);
    for step in 1..8 {
        assert!(s.form_decode_step(&mut w, token).unwrap());
        let finished = s.end_decode_step(&mut w, token).unwrap();
        let expected = if step == 5 {
            vec![(2, FinishReason::Length)]
        } else {
            vec![]
        };
        assert_eq!(finished, expected, "step {step}");
        assert_eq!(w.runs_in(1, step + 1), step < 5);
    }
    assert!(s.form_decode_step(&mut w, token).unwrap());
    assert!(s.form_decode_step(&mut w, token).is_err());
    s.catch_up_all(&mut w, token).unwrap();
    let finished = s.append_one_token_each(&[1], token).unwrap();
    assert_eq!(finished, vec![(1, FinishReason::Length)]);
    assert!(!s.has_unfinished_requests());
    assert_eq!(s.num_free_blocks(), 64);
}

/// A prompt's last token is a one-token step but a prefill chunk's (`prioritize_prefill`
/// schedules it first): no window opens on it, one opens on the next step.
#[test]
fn no_window_opens_on_a_prompts_last_token() {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 8,
        prioritize_prefill: true,
        ..config()
    };
    let mut s = Scheduler::<u32>::new(cfg, false).unwrap();
    let spec = RequestSpec {
        max_tokens: 6,
        ignore_eos: true,
        ..prompt(1, 9)
    };
    s.add_request(1, spec).unwrap();
    run_step(&mut s); // 8 of the 9 prompt tokens
    assert_eq!(s.get_request(&1).unwrap().num_computed_tokens, 8);
    assert!(s.open_decode_window().is_none());
    run_step(&mut s); // the last prompt token, sampling the first output
    assert!(s.open_decode_window().is_some());
}
