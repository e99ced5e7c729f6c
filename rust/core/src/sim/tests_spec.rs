//! Speculative decoding in `vllm_v1` replicas, as named, hand-checkable scenarios.

use super::spec::{Acceptance, SpecConfig, SpecMethod};
use super::*;
use crate::Result;
use crate::sched::SchedulerConfig;

struct VecSource(Option<Vec<ArrivingRequest>>);

impl RequestSource for VecSource {
    fn next_chunk(&mut self) -> Result<Option<Vec<ArrivingRequest>>> {
        Ok(self.0.take())
    }
}

fn req(at: f64, prefill: u32, decode: u32) -> ArrivingRequest {
    ArrivingRequest::new(at, prefill, decode)
}

/// 1 s per step, 0.1 s per prefill token, 0.2 s per decode token (drafts included).
fn exec() -> LinearModel {
    LinearModel {
        constant_s: 1.0,
        per_prefill_token_s: 0.1,
        per_decode_token_s: 0.2,
        per_decode_context_token_s: 0.0,
        per_prefill_context_token_s: 0.0,
        cpu_overhead_s: 0.0,
    }
}

fn config(sched: SchedulerConfig, k: u32, acceptance: Acceptance) -> SimConfig {
    SimConfig {
        num_replicas: 1,
        num_stages: 1,
        global_policy: GlobalPolicy::RoundRobin,
        replica_policy: ReplicaPolicyConfig::VllmV1(sched),
        exec: exec(),
        seed: 7,
        hash_block_size: 16,
        sample_interval_s: 0.0,
        record_stages: true,
        over_length: OverLength::Error,
        concurrency: None,
        lora: None,
        speculative: Some(SpecConfig {
            method: SpecMethod::Ngram,
            num_speculative_tokens: k,
            acceptance,
        }),
        pd: None,
        kv_offload: None,
        coalesce_decode_steps: true,
        request_limit: None,
    }
}

fn sched(num_blocks: usize, budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 4,
        num_blocks,
        max_model_len: 64,
        max_num_batched_tokens: budget,
        enable_prefix_caching: false,
        ..SchedulerConfig::without_vllm_reservations()
    }
}

fn run(config: SimConfig, requests: Vec<ArrivingRequest>) -> SimOutput {
    let mut exec = config.exec;
    let sim = Simulator::new(config, &mut exec).unwrap();
    sim.run(&mut VecSource(Some(requests))).unwrap()
}

/// (prefill tokens, decode tokens) of each batch.
fn batches(out: &SimOutput) -> Vec<(u64, u64)> {
    let trace = out.stages.as_ref().unwrap();
    (0..trace.batch_id.len())
        .map(|i| (trace.num_prefill_tokens[i], trace.num_decode_tokens[i]))
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn all_drafts_accepted_emit_k_plus_one_tokens_per_step_and_stop_at_the_output_length() {
    // Prompt 10 (2 s) gives the first token at 2 s; then each step verifies 1 + 3 tokens
    // (1 + 0.2·4 = 1.8 s) and emits 4: 5, 9, then 10 (the last step's 4 trimmed to 1).
    let out = run(
        config(sched(64, 64), 3, Acceptance::Rate(1.0)),
        vec![req(0.0, 10, 10)],
    );
    assert_eq!(batches(&out), vec![(10, 0), (0, 4), (0, 4), (0, 4)]);
    let t = &out.requests;
    assert!(close(t.first_token_at[0], 2.0));
    assert!(
        close(t.completed_at[0], 2.0 + 3.0 * 1.8),
        "{}",
        t.completed_at[0]
    );
    assert_eq!(
        (
            t.spec_steps[0],
            t.spec_draft_tokens[0],
            t.spec_accepted_tokens[0]
        ),
        (3, 9, 9)
    );
}

#[test]
fn rejected_drafts_cost_their_verification_and_emit_one_token() {
    // Nothing accepted: 9 steps of 1.8 s each emit one token.
    let out = run(
        config(sched(64, 64), 3, Acceptance::Rate(0.0)),
        vec![req(0.0, 10, 10)],
    );
    let t = &out.requests;
    assert!(
        close(t.completed_at[0], 2.0 + 9.0 * 1.8),
        "{}",
        t.completed_at[0]
    );
    assert_eq!((t.spec_draft_tokens[0], t.spec_accepted_tokens[0]), (27, 0));
    // Exactly one accepted per step: 2 tokens a step, 5 steps for the 9 after the first.
    let one = Acceptance::Distribution(vec![0.0, 1.0, 0.0, 0.0]);
    let out = run(config(sched(64, 64), 3, one), vec![req(0.0, 10, 10)]);
    assert!(close(out.requests.completed_at[0], 2.0 + 5.0 * 1.8));
    assert_eq!(out.requests.spec_accepted_tokens[0], 5);
}

#[test]
fn a_short_budget_cuts_the_drafts_it_cannot_fit() {
    // Budget 5, two decoding requests: the first verifies 1 + 3, the second gets 1 token
    // and no drafts, so only the first's drafts are judged in that step.
    let out = run(
        config(sched(64, 5), 3, Acceptance::Rate(1.0)),
        vec![req(0.0, 2, 6), req(0.0, 2, 6)],
    );
    let b = batches(&out);
    assert_eq!(b[0], (4, 0), "both prompts in one step");
    assert_eq!(b[1], (0, 5), "4 + 1 within the budget of 5");
    let t = &out.requests;
    for i in 0..2 {
        assert!(t.spec_accepted_tokens[i] <= t.spec_draft_tokens[i]);
        assert!(t.spec_draft_tokens[i] <= 3 * t.spec_steps[i]);
    }
}

#[test]
fn preemption_under_tight_memory_still_finishes_every_request_exactly() {
    // 10 blocks of 4 tokens for 6 requests of up to 20 tokens plus 2 lookahead slots each:
    // requests are preempted and recomputed while drafts are in flight.
    let mut rng = Rng::new(3);
    for round in 0..20 {
        let requests: Vec<_> = (0..6)
            .map(|i| {
                req(
                    i as f64 * 0.5,
                    1 + rng.below(8) as u32,
                    1 + rng.below(12) as u32,
                )
            })
            .collect();
        let mut c = config(sched(10, 16), 2, Acceptance::Rate(0.6));
        c.seed = round;
        c.replica_policy = ReplicaPolicyConfig::VllmV1(SchedulerConfig {
            max_model_len: 30,
            ..sched(10, 16)
        });
        let out = run(c, requests.clone());
        let t = &out.requests;
        assert_eq!(
            t.len(),
            requests.len(),
            "round {round}: every request finished"
        );
        for i in 0..t.len() {
            assert!(t.completed_at[i] >= t.first_token_at[i]);
            assert!(t.spec_accepted_tokens[i] <= t.spec_draft_tokens[i]);
            assert!(t.spec_draft_tokens[i] <= 2 * t.spec_steps[i]);
        }
    }
}

#[test]
fn the_verify_tokens_of_a_request_are_decode_rows_of_one_attention_sequence() {
    let mut request = SimRequest::new(0, 0.0, 100, 10, vec![]);
    request.on_batch_end(1.0, 100); // prompt done: 101 tokens, the first output
    request.spec.in_flight_drafts = 3;
    let shape = BatchShape::of([&request], &[4]);
    assert_eq!((shape.num_requests, shape.num_decode_tokens), (1, 4));
    assert_eq!(shape.num_spec_decode_tokens, 3);
    assert_eq!(
        shape.sum_decode_context, 101,
        "the KV is read once for the 4 queries"
    );
    let f = exec::Features::of(&shape);
    assert_eq!(f.get(exec::Feature::NumTokens), 4.0, "4 GEMM rows");
    assert_eq!(f.get(exec::Feature::DecodeSequences), 1.0);
    assert_eq!(f.get(exec::Feature::DecodeAttentionKeys), 105.0);
    assert_eq!(f.get(exec::Feature::DecodeMeanContext), 105.0);
    // Without drafts every decode token is its own sequence, as before.
    request.spec.in_flight_drafts = 0;
    let plain = exec::Features::of(&BatchShape::of([&request], &[1]));
    assert_eq!(plain.get(exec::Feature::DecodeSequences), 1.0);
    assert_eq!(plain.get(exec::Feature::DecodeMeanContext), 102.0);
}

#[test]
fn speculation_outside_vllm_v1_is_refused_naming_the_method_key() {
    let mut c = config(sched(64, 64), 2, Acceptance::Rate(0.5));
    c.replica_policy = ReplicaPolicyConfig::Sglang(SglangLimits {
        num_pages: 64,
        page_size: 4,
        max_running_requests: 8,
        max_extend_tokens: 64,
        graph_batch_sizes: vec![],
    });
    let mut exec = exec();
    let err = Simulator::new(c, &mut exec).err().unwrap().to_string();
    assert!(err.contains("replica.speculative.method"), "{err}");
    // A drafter with a forward pass of its own reserves k lookahead slots, which count
    // against the KV: 64 + 2 tokens need more than 16 blocks of 4. N-gram lookup reserves
    // none (vLLM 0.33's `num_lookahead_tokens`), so 64 tokens fit.
    let mut c = config(sched(16, 64), 2, Acceptance::Rate(0.5));
    c.speculative.as_mut().unwrap().method = SpecMethod::Eagle;
    let err = Simulator::new(c, &mut exec).err().unwrap().to_string();
    assert!(err.contains("max_model_len"), "{err}");
    let c = config(sched(16, 64), 2, Acceptance::Rate(0.5));
    assert!(Simulator::new(c, &mut exec).is_ok());
}
