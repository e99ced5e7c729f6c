//! Encoder-decoder models (`Scheduler::set_encoder_decoder`, `KvGroupSpec::CrossAttention`):
//! a request's cross-attention blocks are sized by its encoder input, allocated once with
//! its first decoder tokens, and held to its end; the encoder inputs follow vLLM 0.33's
//! `EncoderDecoderCacheManager` (numbers from vLLM's `test_scheduler.py` cross-attention
//! cases, block 16).

use super::*;
use crate::kv::KvGroupSpec;
use crate::sched::*;

fn audio(length: usize, id: &str) -> MmFeature {
    MmFeature {
        offset: 0,
        length,
        identifier: id.into(),
        is_embed: None,
    }
}

fn with_audio(id: u32, encoder_tokens: Option<usize>) -> RequestSpec {
    RequestSpec {
        mm_features: encoder_tokens.map_or(Vec::new(), |n| vec![audio(n, &format!("a{id}"))]),
        max_tokens: 3,
        ..prompt(id, 100)
    }
}

/// Whisper's layout in miniature: self-attention and cross-attention groups of 16-token
/// blocks, 8192 tokens a step (vLLM's `_create_encoder_decoder_scheduler`).
fn whisper(num_blocks: usize) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::CrossAttention],
        max_num_batched_tokens: 8192,
        max_model_len: 8192,
        num_blocks,
        block_size: 16,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_encoder_decoder(true).unwrap();
    s
}

#[test]
fn cross_attention_blocks_follow_each_requests_encoder_length() {
    let mut s = whisper(10_000);
    let lengths = [500, 1000, 200, 1, 15, 16, 17, 160, 161, 1500];
    for (id, &n) in lengths.iter().enumerate() {
        s.add_request(id as u32, with_audio(id as u32, Some(n)))
            .unwrap();
    }
    s.add_request(99, with_audio(99, None)).unwrap();
    let out = run_step(&mut s);
    assert_eq!(out.num_scheduled_tokens.len(), lengths.len() + 1);
    for (id, &n) in lengths.iter().enumerate() {
        let tables = s.group_block_ids(&(id as u32));
        assert_eq!(tables[0].len(), 100_usize.div_ceil(16), "decoder {id}");
        assert_eq!(tables[1].len(), n.div_ceil(16), "encoder {n}");
    }
    // A text-only request has no encoder input: no cross-attention block.
    assert!(s.group_block_ids(&99)[1].is_empty());
    // Decoding adds decoder blocks only; the cross-attention tables stay as allocated.
    while s.has_unfinished_requests() {
        run_step(&mut s);
        if let Some(tables) = s.get_request(&0).map(|_| s.group_block_ids(&0)) {
            assert_eq!(tables[1].len(), 500_usize.div_ceil(16));
        }
    }
    assert_eq!(s.num_free_blocks(), 10_000, "every block back");
}

#[test]
fn without_encoder_decoder_mode_a_cross_group_gets_no_blocks_and_items_stay_in_the_prompt() {
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::CrossAttention],
        max_num_batched_tokens: 8192,
        max_model_len: 8192,
        num_blocks: 1000,
        block_size: 16,
        ..config()
    };
    let mut s: Scheduler<u32> = Scheduler::new(cfg, false).unwrap();
    assert!(!s.is_encoder_decoder());
    // A decoder-only model's item must lie inside the prompt.
    let err = s.add_request(0, with_audio(0, Some(500))).unwrap_err();
    assert!(
        err.to_string().contains("inside the 100-token prompt"),
        "{err}"
    );
    s.add_request(1, with_audio(1, Some(50))).unwrap();
    run_step(&mut s);
    assert!(s.group_block_ids(&1)[1].is_empty());
    // The mode changes only while no request has items.
    assert!(s.set_encoder_decoder(true).is_err());
}

#[test]
fn the_encoder_budget_holds_a_second_request_to_the_next_step() {
    // Budget 600 embeddings: one 500-token input a step. The second request's input sits
    // at position 0, so none of its tokens is scheduled (vLLM: num_new_tokens = 0).
    let mut s = whisper(10_000);
    s.set_encoder_budget(600);
    s.add_request(0, with_audio(0, Some(500))).unwrap();
    s.add_request(1, with_audio(1, Some(500))).unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 100)]);
    assert_eq!(out.scheduled_encoder_inputs, [(0, vec![0])]);
    assert!(s.group_block_ids(&1).is_empty(), "request 1 holds no block");
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 1), (1, 100)]);
    assert_eq!(out.scheduled_encoder_inputs, [(1, vec![0])]);
    assert_eq!(s.group_block_ids(&1)[1].len(), 32);
}

#[test]
fn the_counter_and_freed_hashes_follow_vllms_encoder_decoder_cache_manager() {
    let mut s = whisper(10_000);
    s.set_encoder_cache_size(1000).unwrap();
    assert_eq!(s.encoder_cache_usage(), (1000, 1000, 1000));
    s.add_request(0, with_audio(0, Some(300))).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(s.encoder_cache_usage().0, 700, "allocated");
    assert!(out.free_encoder_mm_hashes.is_empty());
    answer_step(&mut s, out);
    // The update frees the request's inputs once it has a computed token.
    assert_eq!(s.encoder_cache_usage().0, 1000);
    // get_freed_mm_hashes: a step's identifiers are reported with the next step.
    let out = run_step(&mut s);
    assert_eq!(out.free_encoder_mm_hashes, ["a0"]);
    // vLLM's counter is raised by every update of a step holding the request, past the
    // cache's size (its `get_cached_input_ids` answers every input).
    assert_eq!(s.encoder_cache_usage().0, 1300);
}

#[test]
fn the_full_sequence_gate_counts_cross_attention_blocks() {
    // 100 decoder tokens need 7 blocks, a 500-token input 32 more: 38 blocks hold either,
    // not both.
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::CrossAttention],
        max_num_batched_tokens: 8192,
        max_model_len: 103,
        num_blocks: 38,
        block_size: 16,
        scheduler_reserve_full_isl: true,
        ..config()
    };
    let mut s: Scheduler<u32> = Scheduler::new(cfg, false).unwrap();
    s.set_encoder_decoder(true).unwrap();
    s.add_request(0, with_audio(0, Some(500))).unwrap();
    assert!(s.schedule().unwrap().num_scheduled_tokens.is_empty());
    s.add_request(1, with_audio(1, Some(400))).unwrap();
    let out = s.schedule().unwrap();
    assert!(
        out.num_scheduled_tokens.is_empty(),
        "FCFS: 0 blocks the queue"
    );
    assert_eq!(
        s.encoder_cache_usage().0,
        s.encoder_cache_usage().2 + 500 * 2
    );
}

#[test]
fn prefix_caching_is_refused_beside_a_cross_attention_group() {
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::CrossAttention],
        enable_prefix_caching: true,
        ..config()
    };
    let Err(err) = Scheduler::<u32>::new(cfg, false) else {
        panic!("prefix caching beside a cross-attention group was accepted")
    };
    assert!(err.to_string().contains("enable_prefix_caching"), "{err}");
}

/// A caller's `can_allocate` that refuses every encoder input (vLLM 0.33 asks the replaced
/// method on the encoder-decoder path too, `_try_schedule_encoder_inputs`).
struct RefuseEncoderInputs;
impl crate::sched::StepHooks<u32> for RefuseEncoderInputs {
    fn allow_encoder_input(
        &self,
        _request: &Request<u32>,
        _input_index: usize,
        _budget_left: usize,
        _num_embeds_to_schedule: usize,
    ) -> crate::Result<bool> {
        Ok(false)
    }
}

#[test]
fn a_refused_encoder_input_holds_back_a_whisper_request() {
    // Whisper's audio sits at position 0: refused, none of the decoder tokens run.
    let mut s = whisper(100);
    s.set_step_hooks(Some(Box::new(RefuseEncoderInputs)));
    s.add_request(0, with_audio(0, Some(200))).unwrap();
    let out = run_step(&mut s);
    assert!(out.num_scheduled_tokens.is_empty());
    assert!(out.scheduled_encoder_inputs.is_empty());
    s.set_step_hooks(None);
    let out = run_step(&mut s);
    assert_eq!(out.num_scheduled_tokens.len(), 1);
}
