//! vLLM 0.33's Mamba `align` split (`Scheduler._mamba_block_aligned_split`): prefill chunks
//! end on Mamba block boundaries and never run past the last reusable one; a clipped padded
//! decode drops its padding; an admission with no aligned chunk left waits.

use super::*;

fn split(block: usize) -> MambaAlignSplit {
    MambaAlignSplit::new(block)
}

#[test]
fn the_split_matches_vllm_by_hand() {
    // Blocks of 16, a 100-token prompt: the last reusable state is at (100 - 1) / 16 * 16
    // = 96 (one token left for the logits).
    let s = split(16).rule(0);
    assert_eq!(s.checkpoint_position(100), 96);
    // A chunk ending before the prompt's end ends on a boundary: [0, 40) -> [0, 32).
    assert_eq!(s.split(0, 40, 100, 100, 8192), 32);
    // The whole prompt stops at 96, the last reusable state; then the rest.
    assert_eq!(s.split(0, 100, 100, 100, 8192), 96);
    assert_eq!(s.split(96, 4, 100, 100, 8192), 4);
    // A chunk starting mid-block stops at the next boundary: [10, 60) -> [10, 16).
    assert_eq!(s.split(10, 50, 100, 100, 8192), 6);
    // Decodes (past the prompt and the outputs but the last) are not split.
    assert_eq!(s.split(101, 4, 100, 102, 8192), 4);
    // EAGLE's block drop moves the last reusable state one block back: 96 - 16 = 80.
    let eagle = MambaAlignSplit {
        drop_eagle_block: true,
        ..split(16)
    };
    assert_eq!(eagle.rule(0).split(0, 100, 100, 100, 8192), 80);
    // Three hash look-ahead tokens: (100 - 3) / 16 * 16 = 96.
    let lookahead = split(16).rule(3);
    assert_eq!(lookahead.checkpoint_position(100), 96);
    assert_eq!(lookahead.checkpoint_position(98), 80);
}

#[test]
fn a_block_wider_than_the_step_advances_sub_block_and_realigns() {
    // Blocks of 64 under a 40-token cap: [0, 40) is kept whole (no boundary inside it and
    // no aligned end fits), then [40, 80) stops at the boundary, 64.
    let s = split(64).rule(0);
    assert_eq!(s.split(0, 40, 200, 200, 40), 40);
    assert_eq!(s.split(40, 40, 200, 200, 40), 24);
    // A block that fits the cap: a chunk shorter than one block waits (0 tokens).
    assert_eq!(split(32).rule(0).split(0, 20, 200, 200, 40), 0);
}

#[test]
fn a_chunked_prefill_ends_each_chunk_on_a_mamba_block() {
    // Budget 10, Mamba blocks of 4, a 23-token prompt: [0, 8), [8, 16), [16, 20) (the last
    // reusable state, 22 / 4 * 4 = 20), [20, 23). Without the split: 10, 10, 3.
    let mut s = Scheduler::new(
        SchedulerConfig {
            mamba_align: Some(split(4)),
            ..config()
        },
        false,
    )
    .unwrap();
    s.add_request(0, prompt(0, 23)).unwrap();
    let chunks: Vec<usize> = (0..4).map(|_| scheduled(&run_step(&mut s))[0].1).collect();
    assert_eq!(chunks, [8, 8, 4, 3]);
    let mut plain = Scheduler::new(config(), false).unwrap();
    plain.add_request(0, prompt(0, 23)).unwrap();
    let chunks: Vec<usize> = (0..3)
        .map(|_| scheduled(&run_step(&mut plain))[0].1)
        .collect();
    assert_eq!(chunks, [10, 10, 3]);
}

#[test]
fn an_admission_left_without_an_aligned_chunk_waits_and_stops_the_queue() {
    // Budget 10, Mamba blocks of 8. Request 0 (5 tokens) takes 5; request 1 (20) would get
    // [0, 5), which holds no block boundary: vLLM's split gives 0 and admission stops, so
    // request 2 (3 tokens) waits too. Without the split: 5 for request 1.
    let cfg = SchedulerConfig {
        mamba_align: Some(split(8)),
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    for (id, len) in [(0, 5), (1, 20), (2, 3)] {
        s.add_request(id, prompt(id, len)).unwrap();
    }
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 5)]);
    // Step 2: request 0 decodes 1; request 1 gets [0, 8) of the 9 left; request 2's one
    // token left, [0, 1), holds no boundary either: it waits.
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 8)]);
    let mut plain = Scheduler::new(config(), false).unwrap();
    for (id, len) in [(0, 5), (1, 20), (2, 3)] {
        plain.add_request(id, prompt(id, len)).unwrap();
    }
    assert_eq!(scheduled(&run_step(&mut plain)), [(0, 5), (1, 5)]);
}

#[test]
fn a_padded_decode_the_split_clips_drops_its_padding() {
    // k = 3, Mamba blocks of 4. Request 1 arrives with 6 of its 7 prompt tokens computed:
    // padded to 1 + 3 = 4 ([6, 10)), the split stops it at the boundary 8, so the padding
    // is dropped, not shortened: one token, no drafts. Without the split: 4, 3 drafts.
    let run = |mamba_align| {
        let mut s = Scheduler::new(
            SchedulerConfig {
                num_speculative_tokens: 3,
                mamba_align,
                ..config()
            },
            false,
        )
        .unwrap();
        s.add_request(
            1,
            RequestSpec {
                num_computed_tokens: 6,
                ..prompt(1, 7)
            },
        )
        .unwrap();
        let out = s.schedule().unwrap();
        (scheduled(&out), out.scheduled_spec_decode_tokens.len())
    };
    assert_eq!(run(Some(split(4))), (vec![(1, 1)], 0));
    assert_eq!(run(None), (vec![(1, 4)], 1));
}

#[test]
fn a_block_size_of_zero_is_refused_by_name() {
    let err = Scheduler::<u32>::new(
        SchedulerConfig {
            mamba_align: Some(split(0)),
            ..config()
        },
        false,
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("mamba_align.block_size"), "{err}");
    let mut s = Scheduler::<u32>::new(config(), false).unwrap();
    assert!(s.set_mamba_align(Some(split(0))).is_err());
    s.set_mamba_align(Some(split(4))).unwrap();
    assert_eq!(s.mamba_align(), Some(split(4)));
}

// vLLM 0.33's drafter prefill look-ahead (`num_prefill_lookahead`), which the EAGLE case of
// the split meets at an image: `_reserve_prefill_lookahead` and the encoder window's
// `shift_computed_tokens`.

#[test]
fn a_chunk_never_ends_within_the_lookahead_of_the_prompt_end() {
    // Budget 10, look-ahead 3, a 12-token prompt: [0, 10) would leave 2 < 3, so the chunk
    // gives back 1 and leaves 3: 9, then 3. Without: 10, then 2.
    let chunks = |lookahead| {
        let mut s = Scheduler::new(
            SchedulerConfig {
                num_prefill_lookahead: lookahead,
                ..config()
            },
            false,
        )
        .unwrap();
        s.add_request(0, prompt(0, 12)).unwrap();
        let first = scheduled(&run_step(&mut s))[0].1;
        let second = scheduled(&run_step(&mut s))[0].1;
        (first, second)
    };
    assert_eq!(chunks(3), (9, 3));
    assert_eq!(chunks(0), (10, 2));
}

#[test]
fn the_encoder_window_reaches_the_lookahead_past_the_chunk() {
    // Budget 10, an image at [10, 14) of a 20-token prompt: [0, 10) ends just before it,
    // but a look-ahead of 1 reads token 10, so the image is encoded with this chunk.
    let encoded = |lookahead| {
        let mut s = Scheduler::new(
            SchedulerConfig {
                num_prefill_lookahead: lookahead,
                encoder: EncoderConfig {
                    max_num_encoder_input_tokens: 100,
                    encoder_cache_size: 100,
                    disable_chunked_mm_input: false,
                },
                ..config()
            },
            false,
        )
        .unwrap();
        let image = MmFeature {
            offset: 10,
            length: 4,
            identifier: "a".into(),
            is_embed: None,
        };
        s.add_request(
            0,
            RequestSpec {
                mm_features: vec![image],
                ..prompt(0, 20)
            },
        )
        .unwrap();
        let out = s.schedule().unwrap();
        (scheduled(&out), out.scheduled_encoder_inputs)
    };
    assert_eq!(encoded(1), (vec![(0, 10)], vec![(0, vec![0])]));
    assert_eq!(encoded(0), (vec![(0, 10)], vec![]));
}
