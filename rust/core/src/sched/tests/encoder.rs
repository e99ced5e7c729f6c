//! Multimodal items under the encoder budget and the encoder cache (vLLM 0.33's
//! `_try_schedule_encoder_inputs` and `EncoderCacheManager`), with numbers checkable by hand.

use super::*;
use crate::sched::*;

/// An image item of `length` placeholder tokens at `offset` (shared by the encoder tests).
pub(super) fn image(offset: usize, length: usize, id: &str) -> MmFeature {
    MmFeature {
        offset,
        length,
        identifier: id.into(),
        is_embed: None,
    }
}

pub(super) fn mm_prompt(id: u32, len: usize, items: Vec<MmFeature>) -> RequestSpec {
    RequestSpec {
        mm_features: items,
        max_tokens: 2,
        ..prompt(id, len)
    }
}

pub(super) fn enc_config(budget: usize, cache: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 2048,
        num_blocks: 1024,
        block_size: 16,
        max_model_len: 4096,
        encoder: EncoderConfig {
            max_num_encoder_input_tokens: budget,
            encoder_cache_size: cache,
            disable_chunked_mm_input: false,
        },
        ..config()
    }
}

fn encoder_inputs(out: &SchedulerOutput<u32>) -> Vec<(u32, Vec<usize>)> {
    out.scheduled_encoder_inputs.clone()
}

#[test]
fn image_past_the_budget_left_schedules_only_the_text_before_it() {
    // Budget 600: request 0's 100-token image leaves 500, less than request 1's 576-token
    // image at offset 10, so request 1 computes its 10 text tokens only.
    let mut s = Scheduler::new(enc_config(600, 4096), false).unwrap();
    s.add_request(0, mm_prompt(0, 110, vec![image(0, 100, "a")]))
        .unwrap();
    s.add_request(1, mm_prompt(1, 600, vec![image(10, 576, "b")]))
        .unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 110), (1, 10)]);
    assert_eq!(encoder_inputs(&out), [(0, vec![0])]);
    // The next step has the whole budget again: the image and the rest of the prompt.
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 1), (1, 590)]);
    assert_eq!(encoder_inputs(&out), [(1, vec![0])]);
}

#[test]
fn text_before_the_image_then_the_image_when_its_chunk_reaches_it() {
    // An image beyond this step's chunk costs nothing this step.
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 50,
        ..enc_config(600, 4096)
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, mm_prompt(0, 120, vec![image(60, 40, "a")]))
        .unwrap();
    let out = run_step(&mut s);
    assert_eq!(
        (scheduled(&out), encoder_inputs(&out)),
        (vec![(0, 50)], vec![])
    );
    // The chunk [50, 100) covers the image: it is encoded whole, once.
    let out = run_step(&mut s);
    assert_eq!(
        (scheduled(&out), encoder_inputs(&out)),
        (vec![(0, 50)], vec![(0, vec![0])])
    );
    let out = run_step(&mut s);
    assert_eq!(
        (scheduled(&out), encoder_inputs(&out)),
        (vec![(0, 20)], vec![])
    );
}

#[test]
fn two_requests_with_the_same_image_share_one_entry() {
    let mut s = Scheduler::new(enc_config(1000, 1000), false).unwrap();
    s.add_request(0, mm_prompt(0, 600, vec![image(10, 576, "cat")]))
        .unwrap();
    s.add_request(1, mm_prompt(1, 600, vec![image(20, 576, "cat")]))
        .unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 600), (1, 600)]);
    // Encoded once, for request 0; request 1 hits the entry request 0 allocated.
    assert_eq!(encoder_inputs(&out), [(0, vec![0])]);
    assert_eq!(s.encoder_cache_refs("cat"), 2);
    assert_eq!(s.encoder_cache_usage(), (424, 424, 1000));
    answer_step(&mut s, out);
    // Both passed the image: the entry stays, freeable.
    assert_eq!(s.encoder_cache_refs("cat"), 0);
    assert!(s.encoder_cache_contains("cat"));
    assert_eq!(s.encoder_cache_usage(), (424, 1000, 1000));
}

#[test]
fn a_full_cache_holds_the_next_image_back_until_an_entry_is_freeable_then_evicts_it() {
    // Cache 600: request 0's 576-token image is referenced while request 0's chunk stops
    // inside it, so request 1's 100-token image does not fit (24 free, nothing freeable).
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 300,
        ..enc_config(600, 600)
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, mm_prompt(0, 590, vec![image(0, 576, "big")]))
        .unwrap();
    s.add_request(1, mm_prompt(1, 120, vec![image(5, 100, "small")]))
        .unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 300)]);
    // Request 1 could not even run its 5 text tokens: the budget was spent on request 0.
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 290), (1, 5)]);
    assert!(out.free_encoder_mm_hashes.is_empty());
    // Request 0 passed its image at that step's update: the entry is freeable, and request
    // 1's image evicts it.
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 1), (1, 115)]);
    assert_eq!(encoder_inputs(&out), [(1, vec![0])]);
    assert_eq!(out.free_encoder_mm_hashes, ["big"]);
    assert!(!s.encoder_cache_contains("big"));
}

#[test]
fn a_prefix_hit_past_the_image_start_without_its_encoding_schedules_no_token() {
    // Request 0 computes a 41-token prompt with image x at [20, 40) and finishes (its KV
    // blocks stay cached, its encoder entry freeable). Request 1's image evicts x from the
    // 20-embedding encoder cache and spends the step's budget; request 2, request 0's prompt
    // again, hits 32 tokens, past x's start: without x it can compute nothing, and steps
    // aside. The next step re-encodes x (evicting request 1's passed image).
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        ..enc_config(20, 20)
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    let mut first = mm_prompt(0, 41, vec![image(20, 20, "x")]);
    first.max_tokens = 1;
    let tokens = first.prompt_token_ids.clone();
    s.add_request(0, first).unwrap();
    run_step(&mut s);
    assert!(s.get_request(&0).is_none());
    assert_eq!(s.encoder_cache_refs("x"), 0);
    s.add_request(1, mm_prompt(1, 25, vec![image(0, 20, "e")]))
        .unwrap();
    let again = RequestSpec {
        prompt_token_ids: tokens,
        ..mm_prompt(2, 41, vec![image(20, 20, "x")])
    };
    s.add_request(2, again).unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(1, 25)]);
    assert_eq!(out.free_encoder_mm_hashes, ["x"]);
    assert_eq!(s.deferred_waiting_ids(), [2]);
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(1, 1), (2, 9)]);
    assert_eq!(s.get_request(&2).unwrap().num_computed_tokens, 41);
    assert_eq!(encoder_inputs(&out), [(2, vec![0])]);
    assert_eq!(out.free_encoder_mm_hashes, ["e"]);
}

#[test]
fn disable_chunked_mm_input_stops_a_chunk_before_an_image_it_would_split() {
    let run = |disable: bool| {
        let mut cfg = SchedulerConfig {
            max_num_batched_tokens: 32,
            ..enc_config(600, 600)
        };
        cfg.encoder.disable_chunked_mm_input = disable;
        let mut s = Scheduler::new(cfg, false).unwrap();
        s.add_request(0, mm_prompt(0, 50, vec![image(20, 20, "a")]))
            .unwrap();
        (0..2)
            .map(|_| scheduled(&run_step(&mut s)))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(false), [vec![(0, 32)], vec![(0, 18)]]);
    assert_eq!(run(true), [vec![(0, 20)], vec![(0, 30)]]);
}

#[test]
fn a_mask_without_embeddings_in_the_chunk_encodes_nothing_yet() {
    // `is_embed`: only the last 4 of 10 placeholders take embeddings; a chunk covering the
    // first 6 needs no encoder output (vLLM's get_embeds_indices_in_range).
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 16,
        ..enc_config(600, 600)
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    let mut item = image(10, 10, "m");
    item.is_embed = Some([vec![false; 6], vec![true; 4]].concat());
    s.add_request(0, mm_prompt(0, 30, vec![item])).unwrap();
    let out = run_step(&mut s);
    assert_eq!(
        (scheduled(&out), encoder_inputs(&out)),
        (vec![(0, 16)], vec![])
    );
    let out = run_step(&mut s);
    assert_eq!(
        (scheduled(&out), encoder_inputs(&out)),
        (vec![(0, 14)], vec![(0, vec![0])])
    );
    assert_eq!(s.encoder_cache_usage().0, 596);
}

#[test]
fn an_identifier_cached_with_another_size_finishes_the_request_with_an_error() {
    let mut s = Scheduler::new(enc_config(600, 600), false).unwrap();
    s.add_request(0, mm_prompt(0, 30, vec![image(0, 10, "dup")]))
        .unwrap();
    s.add_request(1, mm_prompt(1, 30, vec![image(0, 12, "dup")]))
        .unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 30)]);
    let finished = s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(finished, [(1, FinishReason::Error)]);
    s.check_invariants().unwrap();
}

#[test]
fn preemption_lets_go_of_the_victims_entries_and_a_resume_hits_them() {
    // Five 16-token blocks. Step 1: request 0 (32 tokens, 2 blocks) and 35 tokens of
    // request 1 (3 blocks), whose chunk reaches into its image at [30, 40): encoded and
    // referenced. Step 2: request 0's decode needs a third block; request 1 is preempted
    // and lets go of its image, which stays cached (freeable).
    let cfg = SchedulerConfig {
        num_blocks: 5,
        max_num_batched_tokens: 67,
        ..enc_config(100, 100)
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    let mut first = mm_prompt(0, 32, vec![image(0, 20, "a")]);
    first.max_tokens = 20;
    s.add_request(0, first).unwrap();
    s.add_request(1, mm_prompt(1, 40, vec![image(30, 10, "b")]))
        .unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 32), (1, 35)]);
    assert_eq!(encoder_inputs(&out), [(0, vec![0]), (1, vec![0])]);
    assert_eq!(s.encoder_cache_refs("b"), 1);
    let out = run_step(&mut s);
    assert_eq!(
        (scheduled(&out), out.preempted_req_ids.clone()),
        (vec![(0, 1)], vec![1])
    );
    assert_eq!(s.encoder_cache_refs("b"), 0);
    assert_eq!(s.encoder_cache_usage(), (70, 100, 100));
    // Request 1 recomputes after request 0 finishes, from the cached image.
    let mut encoded = Vec::new();
    for _ in 0..100 {
        if !s.has_unfinished_requests() {
            break;
        }
        encoded.extend(run_step(&mut s).scheduled_encoder_inputs);
    }
    assert!(!s.has_unfinished_requests());
    assert_eq!(encoded, []);
    assert_eq!(s.encoder_cache_usage(), (70, 100, 100));
}

#[test]
fn add_request_refuses_items_that_could_never_be_scheduled() {
    let mut s = Scheduler::new(enc_config(500, 600), false).unwrap();
    let err = |s: &mut Scheduler<u32>, id, spec| s.add_request(id, spec).unwrap_err().to_string();
    let big = err(&mut s, 0, mm_prompt(0, 600, vec![image(10, 576, "a")]));
    assert!(big.contains("max_num_encoder_input_tokens=500"), "{big}");
    let outside = err(&mut s, 1, mm_prompt(1, 20, vec![image(10, 11, "a")]));
    assert!(outside.contains("inside the 20-token prompt"), "{outside}");
    let overlap = err(
        &mut s,
        2,
        mm_prompt(2, 40, vec![image(0, 10, "a"), image(5, 10, "b")]),
    );
    assert!(
        overlap.contains("sorted by offset and disjoint"),
        "{overlap}"
    );
    let mut masked = image(0, 4, "m");
    masked.is_embed = Some(vec![true; 3]);
    let mask = err(&mut s, 3, mm_prompt(3, 40, vec![masked]));
    assert!(mask.contains("is_embed"), "{mask}");
    let mut cfg = enc_config(600, 600);
    cfg.max_num_batched_tokens = 100;
    cfg.encoder.disable_chunked_mm_input = true;
    let mut s = Scheduler::new(cfg, false).unwrap();
    let whole = err(&mut s, 0, mm_prompt(0, 300, vec![image(0, 200, "a")]));
    assert!(whole.contains("disable_chunked_mm_input"), "{whole}");
    let host = SchedulerConfig {
        host_num_blocks: 8,
        enable_prefix_caching: true,
        ..enc_config(600, 600)
    };
    let mut s = Scheduler::new(host, false).unwrap();
    let tier = err(&mut s, 0, mm_prompt(0, 30, vec![image(0, 10, "a")]));
    assert!(tier.contains("host_num_blocks"), "{tier}");
}

#[test]
fn add_request_refuses_an_item_whose_end_overflows() {
    // offset + length past usize::MAX: refused (it wrapped to 1 in a release build).
    let mut s = Scheduler::new(enc_config(600, 600), false).unwrap();
    let spec = mm_prompt(0, 20, vec![image(usize::MAX, 2, "a")]);
    let err = s.add_request(0, spec).unwrap_err().to_string();
    assert!(err.contains("inside the 20-token prompt"), "{err}");
}

#[test]
fn random_multimodal_traffic_keeps_the_cache_consistent_and_ends_empty() {
    // A seeded stream of requests with shared and private images through a small pool
    // (preemptions), a small budget and a small cache; invariants after every step.
    let mut seed = 12345u64;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) % n) as usize
    };
    for round in 0..20 {
        let cfg = SchedulerConfig {
            num_blocks: 12 + next(20),
            block_size: 8,
            max_num_batched_tokens: 24 + next(64),
            max_model_len: 128,
            enable_prefix_caching: next(2) == 0,
            encoder: EncoderConfig {
                max_num_encoder_input_tokens: 24 + next(16),
                encoder_cache_size: 40 + next(40),
                disable_chunked_mm_input: next(3) == 0,
            },
            ..config()
        };
        let mut s = Scheduler::new(cfg, false).unwrap();
        let mut added = 0u32;
        for step in 0..300 {
            if added < 12 && next(3) == 0 {
                let len = 20 + next(60);
                let mut items = Vec::new();
                let mut at = next(6);
                while at + 4 < len && items.len() < 3 {
                    let length = (4 + next(20)).min(len - at).min(24);
                    items.push(image(at, length, &format!("img{}-{length}", next(4))));
                    at += length + next(8);
                }
                let mut spec = mm_prompt(added, len, items);
                spec.prompt_token_ids = (0..len as u32)
                    .map(|t| (t % 7) + 1000 * (added % 3))
                    .collect();
                spec.max_tokens = 1 + next(8);
                s.add_request(added, spec).unwrap();
                added += 1;
            }
            if step % 37 == 0 && added > 0 {
                let _ = s.abort(&[next(added as u64) as u32]);
            }
            run_step(&mut s);
        }
        for _ in 0..2000 {
            if !s.has_unfinished_requests() {
                break;
            }
            run_step(&mut s);
        }
        assert!(!s.has_unfinished_requests(), "round {round}: requests left");
        let (_, freeable, size) = s.encoder_cache_usage();
        assert_eq!(
            freeable, size,
            "round {round}: a reference outlived its request"
        );
    }
}

#[test]
fn a_mismatch_flagged_in_two_steps_in_flight_finishes_the_request_once() {
    let mut s = Scheduler::new(enc_config(600, 600), true).unwrap();
    s.add_request(0, mm_prompt(0, 30, vec![image(0, 10, "dup")]))
        .unwrap();
    s.add_request(1, mm_prompt(1, 30, vec![image(0, 12, "dup")]))
        .unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 30)]);
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]);
    let finished = s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(finished, [(1, FinishReason::Error)]);
    s.check_invariants().unwrap();
    // Request 0 reaches its 2 tokens; request 1 is not reported again.
    let finished = s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(finished, [(0, FinishReason::Length)]);
}

#[test]
fn items_are_scheduled_and_let_go_over_kv_groups() {
    // A full group and a window-8 group (block 4), budget 10 tokens and 8 embeddings:
    // request 0's 6-token image at 2 and request 1's at 0 share one identifier.
    let cfg = SchedulerConfig {
        kv_groups: vec![
            crate::kv::KvGroupSpec::FullAttention,
            crate::kv::KvGroupSpec::SlidingWindow { sliding_window: 8 },
        ],
        encoder: EncoderConfig {
            max_num_encoder_input_tokens: 8,
            encoder_cache_size: 8,
            disable_chunked_mm_input: false,
        },
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, mm_prompt(0, 20, vec![image(2, 6, "a")]))
        .unwrap();
    s.add_request(1, mm_prompt(1, 20, vec![image(0, 6, "a")]))
        .unwrap();
    let (mut steps, mut inputs) = (Vec::new(), Vec::new());
    while s.has_unfinished_requests() {
        let out = run_step(&mut s);
        steps.push(scheduled(&out));
        inputs.push(encoder_inputs(&out));
    }
    // Request 0 encodes the image in its first chunk and lets go of it at that update; the
    // entry stays, so request 1 (admitted at step 3, its image at 0) finds it cached.
    assert_eq!(
        steps,
        [
            vec![(0, 10)],
            vec![(0, 10)],
            vec![(0, 1), (1, 9)],
            vec![(1, 10)],
            vec![(1, 1)],
            vec![(1, 1)],
        ]
    );
    assert_eq!(inputs[0], [(0, vec![0])]);
    assert!(inputs[1..].iter().all(Vec::is_empty), "{inputs:?}");
    assert_eq!(s.num_free_blocks(), 64);
    assert_eq!(s.encoder_cache_refs("a"), 0);
}

#[test]
fn under_async_scheduling_an_update_lets_go_of_the_items_of_its_own_step_only() {
    // vLLM 0.33's `update_from_output` runs `_free_encoder_inputs` over the requests of the
    // step it updates. Request 1 arrives while step A (request 0) is in flight and passes
    // its image in step B: A's update leaves its reference alone, B's lets it go.
    let mut s = Scheduler::new(enc_config(600, 600), true).unwrap();
    s.add_request(0, prompt(0, 20)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 20)]);
    s.add_request(1, mm_prompt(1, 120, vec![image(10, 100, "a")]))
        .unwrap();
    let step_b = s.schedule().unwrap();
    assert_eq!(scheduled(&step_b), [(0, 1), (1, 120)]);
    assert_eq!(encoder_inputs(&step_b), [(1, vec![0])]);
    s.update_from_output(&[sample(0, 7)]).unwrap();
    // Before 2026-11-27 A's update freed it (it scanned the latest step's requests).
    assert_eq!(s.encoder_cache_refs("a"), 1);
    assert_eq!(s.encoder_cache_usage(), (500, 500, 600));
    s.update_from_output(&[sample(0, 7), sample(1, 7)]).unwrap();
    assert_eq!(s.encoder_cache_refs("a"), 0);
    assert_eq!(s.encoder_cache_usage(), (500, 600, 600));
    s.check_invariants().unwrap();
}

#[test]
fn under_async_scheduling_a_chunk_in_flight_counts_as_computed_when_the_older_step_lands() {
    // As in vLLM 0.33, the tokens computed at an update already count the chunks scheduled
    // since: request 0's image [60, 100) is covered by step B's chunk [50, 100), and A's
    // update (A computed [0, 50)) lets it go.
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 50,
        ..enc_config(600, 600)
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    s.add_request(0, mm_prompt(0, 120, vec![image(60, 40, "a")]))
        .unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 50)]);
    let step_b = s.schedule().unwrap();
    assert_eq!(encoder_inputs(&step_b), [(0, vec![0])]);
    assert_eq!(s.encoder_cache_refs("a"), 1);
    s.update_from_output(&[]).unwrap();
    assert_eq!(s.encoder_cache_refs("a"), 0);
    s.check_invariants().unwrap();
}
