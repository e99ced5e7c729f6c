//! Hand-computable scenarios under the linear model, and each replica policy's documented
//! behaviours (seed 000), as named tests.

use super::*;
use crate::Result;
use crate::sched::SchedulerConfig;

pub(super) struct VecSource(pub(super) Option<Vec<ArrivingRequest>>);

impl RequestSource for VecSource {
    fn next_chunk(&mut self) -> Result<Option<Vec<ArrivingRequest>>> {
        Ok(self.0.take())
    }
}

pub(super) fn req(at: f64, prefill: u32, decode: u32) -> ArrivingRequest {
    ArrivingRequest::new(at, prefill, decode)
}

/// `constant` seconds per iteration plus per-token terms; no CPU overhead.
pub(super) fn linear(constant: f64, per_prefill: f64, per_decode: f64) -> LinearModel {
    LinearModel {
        constant_s: constant,
        per_prefill_token_s: per_prefill,
        per_decode_token_s: per_decode,
        per_decode_context_token_s: 0.0,
        per_prefill_context_token_s: 0.0,
        cpu_overhead_s: 0.0,
    }
}

pub(super) fn limits() -> VidurLimits {
    VidurLimits {
        num_blocks: 64,
        block_size: 4,
        watermark_blocks: 0,
        batch_size_cap: 16,
        max_batch_size: 16,
        num_stages: 1,
        max_blocks_per_sequence: 8,
        max_tokens_in_batch: 4096,
        chunk_size: 8,
        max_waiting_iters: 2,
        restart: RestartMode::Recompute,
    }
}

/// One replica with `num_stages` stages (a Vidur policy's limits follow them).
pub(super) fn config(
    mut policy: ReplicaPolicyConfig,
    num_stages: u32,
    exec: LinearModel,
) -> SimConfig {
    if let ReplicaPolicyConfig::Vidur(_, limits) = &mut policy {
        limits.num_stages = num_stages;
    }
    SimConfig {
        num_replicas: 1,
        num_stages,
        global_policy: GlobalPolicy::RoundRobin,
        replica_policy: policy,
        exec,
        seed: 0,
        hash_block_size: 16,
        sample_interval_s: 0.0,
        record_stages: true,
        over_length: crate::sim::OverLength::Error,
        concurrency: None,
        lora: None,
        speculative: None,
        pd: None,
        kv_offload: None,
        coalesce_decode_steps: true,
        request_limit: None,
    }
}

pub(super) fn run(config: SimConfig, requests: Vec<ArrivingRequest>) -> SimOutput {
    let mut exec = config.exec;
    let sim = Simulator::new(config, &mut exec).unwrap();
    sim.run(&mut VecSource(Some(requests))).unwrap()
}

/// (first token, completion) per request id.
pub(super) fn times(out: &SimOutput) -> Vec<(u64, f64, f64)> {
    let t = &out.requests;
    let mut rows: Vec<_> = (0..t.len())
        .map(|i| (t.request_id[i], t.first_token_at[i], t.completed_at[i]))
        .collect();
    rows.sort_by_key(|r| r.0);
    rows
}

/// (prefill tokens, decode tokens) of each batch, in formation order.
fn batches(out: &SimOutput) -> Vec<(u64, u64)> {
    let trace = out.stages.as_ref().unwrap();
    (0..trace.batch_id.len())
        .filter(|&i| trace.stage[i] == 0)
        .map(|i| (trace.num_prefill_tokens[i], trace.num_decode_tokens[i]))
        .collect()
}

pub(super) fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn one_request_prefill_then_decodes_at_hand_computed_times() {
    // Prefill of 10: 1 + 0.1·10 = 2 s, the first token. Then 2 decodes of 1 + 0.2 = 1.2 s.
    for policy in [
        ReplicaPolicyConfig::Vidur(VidurKind::Vllm, limits()),
        ReplicaPolicyConfig::VllmV1(SchedulerConfig {
            block_size: 4,
            num_blocks: 64,
            max_model_len: 64,
            ..SchedulerConfig::without_vllm_reservations()
        }),
    ] {
        let out = run(
            config(policy, 1, linear(1.0, 0.1, 0.2)),
            vec![req(0.0, 10, 3)],
        );
        let [(0, first, done)] = times(&out)[..] else {
            panic!("one request")
        };
        assert!(close(first, 2.0) && close(done, 4.4), "{first} {done}");
        assert_eq!(out.requests.num_restarts[0], 0);
        assert!(close(out.requests.max_token_gap[0], 1.2));
    }
}

#[test]
fn orca_admits_at_the_next_iteration_faster_transformer_waits_for_the_batch() {
    // A (4 prompt, 4 out) at 0, B (4, 2) at 0.5; every iteration takes 1 s.
    let requests = || vec![req(0.0, 4, 4), req(0.5, 4, 2)];
    let orca = run(
        config(
            ReplicaPolicyConfig::Vidur(VidurKind::Orca, limits()),
            1,
            linear(1.0, 0.0, 0.0),
        ),
        requests(),
    );
    assert_eq!(times(&orca), [(0, 1.0, 4.0), (1, 2.0, 3.0)]);
    let ft = run(
        config(
            ReplicaPolicyConfig::Vidur(VidurKind::FasterTransformer, limits()),
            1,
            linear(1.0, 0.0, 0.0),
        ),
        requests(),
    );
    assert_eq!(times(&ft), [(0, 1.0, 4.0), (1, 5.0, 6.0)]);
}

#[test]
fn two_stage_pipeline_overlaps_batches_and_only_the_last_stage_completes_them() {
    // 2 s of model per batch split over 2 stages: 1 s per stage.
    let out = run(
        config(
            ReplicaPolicyConfig::Vidur(VidurKind::Vllm, limits()),
            2,
            linear(2.0, 0.0, 0.0),
        ),
        vec![req(0.0, 4, 2), req(0.5, 4, 2)],
    );
    // A: stages 0-1, 1-2 (first token at 2), decode 2-4. B: queued behind A's stage 0,
    // stages 1-2, 2-3 (first token 3), decode 3-5.
    assert_eq!(times(&out), [(0, 2.0, 4.0), (1, 3.0, 5.0)]);
    let trace = out.stages.unwrap();
    // Stage starts in time order: b1 s0 (0), b2 s0 and b1 s1 (1), b2 s1 and b3 s0 (2), ...
    assert_eq!(trace.stage, [0, 0, 1, 1, 0, 1, 0, 1]);
}

#[test]
fn vllm_preempts_the_latest_arrival_lifo_and_restarts_it_with_its_outputs_as_prefill() {
    // 16 tokens of KV for two requests that grow to 12 tokens each.
    let small = VidurLimits {
        num_blocks: 4,
        ..limits()
    };
    let out = run(
        config(
            ReplicaPolicyConfig::Vidur(VidurKind::Vllm, small),
            1,
            linear(1.0, 0.0, 0.0),
        ),
        vec![req(0.0, 4, 8), req(0.1, 4, 8)],
    );
    let t = &out.requests;
    let restarts: Vec<_> = (0..2)
        .map(|i| (t.request_id[i], t.num_restarts[i]))
        .collect();
    assert!(
        restarts.contains(&(0, 0)),
        "the first arrival is never the victim"
    );
    let (_, b_restarts) = restarts.iter().find(|r| r.0 == 1).copied().unwrap();
    assert!(b_restarts >= 1, "the latest arrival is the victim");
    // Each restart re-prefills B's prompt plus the outputs it had: 6, 7, ... tokens.
    let refills: Vec<u64> = batches(&out)
        .iter()
        .map(|b| b.0)
        .filter(|&p| p > 4)
        .collect();
    assert_eq!(refills.len(), b_restarts as usize);
    assert!(refills.windows(2).all(|w| w[1] > w[0]), "{refills:?}");
}

#[test]
fn sarathi_fills_a_chunk_budget_decodes_first_then_partial_prefills_then_new() {
    // chunk_size 8: A (20, 3) at 0 is cut 8, 8, 4; B (6, 2) arrives at 0.5 and takes the 4
    // tokens left of the third batch; then A's first decode (phase 1) and B's last 2 prompt
    // tokens (phase 2); then both decode, and both complete.
    let out = run(
        config(
            ReplicaPolicyConfig::Vidur(VidurKind::Sarathi, limits()),
            1,
            linear(1.0, 0.0, 0.0),
        ),
        vec![req(0.0, 20, 3), req(0.5, 6, 2)],
    );
    assert_eq!(
        batches(&out),
        [(8, 0), (8, 0), (8, 0), (2, 1), (0, 2)],
        "(prefill, decode) tokens per batch"
    );
}

#[test]
fn orca_reserves_the_maximum_blocks_per_sequence_at_admission() {
    // 16 blocks, 8 reserved per request: only two tiny requests run at once.
    let tight = VidurLimits {
        num_blocks: 16,
        ..limits()
    };
    let out = run(
        config(
            ReplicaPolicyConfig::Vidur(VidurKind::Orca, tight),
            1,
            linear(1.0, 0.0, 0.0),
        ),
        vec![req(0.0, 2, 2), req(0.0, 2, 2), req(0.0, 2, 2)],
    );
    assert_eq!(times(&out), [(0, 1.0, 2.0), (1, 1.0, 2.0), (2, 3.0, 4.0)]);
}

#[test]
fn lightllm_admits_only_if_the_worst_case_token_peak_fits() {
    let lightllm = |num_blocks| VidurLimits {
        num_blocks,
        block_size: 1,
        max_waiting_iters: 1,
        ..limits()
    };
    // A (10, 10) alone peaks at 20 tokens. With 30 slots, B (10, 10) arriving once A runs
    // would raise the worst case to max(9·1 + 11, 8·2 + 23) = 39: B waits for A to finish.
    let requests = || vec![req(0.0, 10, 10), req(1.5, 10, 10)];
    let policy = |n| ReplicaPolicyConfig::Vidur(VidurKind::LightLlm, lightllm(n));
    let t = times(&run(
        config(policy(30), 1, linear(1.0, 0.0, 0.0)),
        requests(),
    ));
    assert!(t[1].1 > t[0].2, "B's first token after A completes: {t:?}");
    // With 60 slots it fits, and B's prefill runs between A's decodes.
    let t = times(&run(
        config(policy(60), 1, linear(1.0, 0.0, 0.0)),
        requests(),
    ));
    assert!(t[1].1 < t[0].2, "B overlaps A: {t:?}");
}

#[test]
fn lightllm_max_waiting_iters_lets_a_prefill_in_between_decodes() {
    let limits = VidurLimits {
        num_blocks: 1000,
        block_size: 1,
        max_waiting_iters: 2,
        ..limits()
    };
    let out = run(
        config(
            ReplicaPolicyConfig::Vidur(VidurKind::LightLlm, limits),
            1,
            linear(1.0, 0.0, 0.0),
        ),
        vec![req(0.0, 4, 6), req(1.5, 4, 2)],
    );
    // A's prefill (0-1), A decodes (1-2); B waits: A decodes again (2-3), then after two
    // waiting decode iterations B's prefill runs alone (3-4); decodes of both follow.
    assert_eq!(batches(&out)[..4], [(4, 0), (0, 1), (0, 1), (4, 0)]);
}

#[test]
fn lightllm_rejects_block_sizes_and_pipelines_it_cannot_run() {
    let mut exec = linear(1.0, 0.0, 0.0);
    let bad_block = config(
        ReplicaPolicyConfig::Vidur(VidurKind::LightLlm, limits()),
        1,
        exec,
    );
    let err = Simulator::new(bad_block, &mut exec).err().unwrap();
    assert!(err.to_string().contains("block_size"), "{err}");
    let per_token = VidurLimits {
        block_size: 1,
        ..limits()
    };
    let staged = config(
        ReplicaPolicyConfig::Vidur(VidurKind::LightLlm, per_token),
        2,
        exec,
    );
    let err = Simulator::new(staged, &mut exec).err().unwrap();
    assert!(err.to_string().contains("pipeline"), "{err}");
}

#[test]
fn sglang_pads_decode_batches_to_graph_sizes_for_their_cost() {
    let sglang = ReplicaPolicyConfig::Sglang(SglangLimits {
        num_pages: 64,
        page_size: 4,
        max_running_requests: 8,
        max_extend_tokens: 64,
        graph_batch_sizes: vec![1, 2, 4, 8],
    });
    // Three requests prefill together (3 s), then decode as a batch of 3 padded to 4:
    // 1 + 4 · 0.5 = 3 s per decode.
    let out = run(
        config(sglang, 1, linear(1.0, 0.0, 0.5)),
        vec![req(0.0, 4, 2), req(0.0, 4, 2), req(0.0, 4, 2)],
    );
    assert!(
        times(&out)
            .iter()
            .all(|&(_, first, done)| close(first, 1.0) && close(done, 4.0))
    );
}

#[test]
fn bad_arrivals_are_errors_naming_the_field() {
    let mut exec = linear(1.0, 0.0, 0.0);
    let make = || {
        config(
            ReplicaPolicyConfig::Vidur(VidurKind::Vllm, limits()),
            1,
            linear(1.0, 0.0, 0.0),
        )
    };
    let backwards = vec![req(1.0, 4, 2), req(0.5, 4, 2)];
    let err = Simulator::new(make(), &mut exec)
        .unwrap()
        .run(&mut VecSource(Some(backwards)))
        .unwrap_err();
    assert!(err.to_string().contains("arrived_at"), "{err}");
    let empty_prompt = vec![req(0.0, 0, 2)];
    let err = Simulator::new(make(), &mut exec)
        .unwrap()
        .run(&mut VecSource(Some(empty_prompt)))
        .unwrap_err();
    assert!(err.to_string().contains("num_tokens"), "{err}");
    let too_big = vec![req(0.0, 1000, 2)];
    let err = Simulator::new(make(), &mut exec)
        .unwrap()
        .run(&mut VecSource(Some(too_big)))
        .unwrap_err();
    assert!(err.to_string().contains("blocks"), "{err}");
}

#[test]
fn an_over_length_request_is_one_input_error_naming_the_limit_for_every_policy() {
    let v1 = SchedulerConfig {
        block_size: 4,
        num_blocks: 64,
        max_model_len: 256,
        ..SchedulerConfig::without_vllm_reservations()
    };
    let sglang = SglangLimits {
        num_pages: 64,
        page_size: 4,
        max_running_requests: 16,
        max_extend_tokens: 64,
        graph_batch_sizes: vec![1, 2, 4],
    };
    let lightllm = VidurLimits {
        block_size: 1,
        num_blocks: 256,
        ..limits()
    };
    let policies = [
        (
            ReplicaPolicyConfig::Vidur(VidurKind::Vllm, limits()),
            "num_blocks",
        ),
        (
            ReplicaPolicyConfig::Vidur(VidurKind::Sarathi, limits()),
            "num_blocks",
        ),
        (
            ReplicaPolicyConfig::Vidur(VidurKind::Orca, limits()),
            "max_request_tokens",
        ),
        (
            ReplicaPolicyConfig::Vidur(VidurKind::LightLlm, lightllm),
            "num_blocks",
        ),
        (
            ReplicaPolicyConfig::Vidur(VidurKind::FasterTransformer, limits()),
            "max_request_tokens",
        ),
        (ReplicaPolicyConfig::VllmV1(v1), "max_model_len"),
        (ReplicaPolicyConfig::Sglang(sglang), "num_pages"),
    ];
    for (policy, setting) in policies {
        let name = policy.name();
        let text = rejection_of_request_1(config(policy, 1, linear(1.0, 0.0, 0.0)), 200, 200);
        assert!(
            text.contains("request 1 (200 prompt + 200 output"),
            "{name}: {text}"
        );
        assert!(text.contains(setting), "{name}: {text}");
    }
}

/// The error that stops a run whose request 1 (`prefill` + `decode` tokens, after a small
/// request 0) no replica can serve: a `Rejected` naming request 1, as its message.
fn rejection_of_request_1(config: SimConfig, prefill: u32, decode: u32) -> String {
    let name = config.replica_policy.name();
    let mut exec = config.exec;
    let sim = Simulator::new(config, &mut exec).unwrap();
    let requests = vec![req(0.0, 8, 2), req(1.0, prefill, decode)];
    let err = sim.run(&mut VecSource(Some(requests))).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, crate::Error::Rejected { request: 1, .. }),
        "{name}: {text}"
    );
    text
}

#[test]
fn over_length_skip_counts_the_request_and_runs_the_rest() {
    let mut exec = linear(1.0, 0.0, 0.0);
    let mut cfg = config(
        ReplicaPolicyConfig::Vidur(VidurKind::Vllm, limits()),
        1,
        exec,
    );
    cfg.over_length = OverLength::Skip;
    let sim = Simulator::new(cfg, &mut exec).unwrap();
    let requests = vec![req(0.0, 8, 2), req(1.0, 200, 200), req(2.0, 8, 2)];
    let out = sim.run(&mut VecSource(Some(requests))).unwrap();
    assert_eq!(out.num_skipped_over_length, 1);
    assert_eq!(out.requests.request_id, vec![0, 2]);
}

#[test]
fn the_request_limit_refuses_alike_for_every_policy_naming_its_setting() {
    let v1 = ReplicaPolicyConfig::VllmV1(SchedulerConfig {
        block_size: 16,
        num_blocks: 64,
        max_model_len: 1024,
        ..SchedulerConfig::without_vllm_reservations()
    });
    let sglang = ReplicaPolicyConfig::Sglang(SglangLimits {
        num_pages: 64,
        page_size: 16,
        max_running_requests: 8,
        max_extend_tokens: 64,
        graph_batch_sizes: vec![1, 2, 4, 8],
    });
    let policies = [
        ReplicaPolicyConfig::Vidur(VidurKind::Vllm, limits()),
        ReplicaPolicyConfig::Vidur(VidurKind::Sarathi, limits()),
        v1,
        sglang,
    ];
    for policy in policies {
        let name = policy.name();
        let mut cfg = config(policy, 1, linear(1.0, 0.0, 0.0));
        cfg.request_limit = Some(RequestLimit {
            max_tokens: 300,
            setting: "the model's context length of 300 tokens".into(),
        });
        // 250 + 51 fits every policy's memory, but not the deployment's limit.
        let text = rejection_of_request_1(cfg, 250, 51);
        assert!(
            text.contains("it exceeds the model's context length of 300 tokens"),
            "{name}: {text}"
        );
        assert!(!text.contains("invalid argument"), "{name}: {text}");
    }
}

#[test]
fn a_skipped_request_still_takes_its_routing_turn() {
    // Round robin over 2 replicas: the router places request 1 on replica 1 before the
    // replica rejects it, so request 2 goes to replica 0 and request 3 to replica 1.
    let mut exec = linear(1.0, 0.0, 0.0);
    let mut cfg = config(
        ReplicaPolicyConfig::Vidur(VidurKind::Vllm, limits()),
        1,
        exec,
    );
    cfg.num_replicas = 2;
    cfg.over_length = OverLength::Skip;
    let sim = Simulator::new(cfg, &mut exec).unwrap();
    let requests = vec![
        req(0.0, 8, 2),
        req(1.0, 200, 200),
        req(2.0, 8, 2),
        req(3.0, 8, 2),
    ];
    let out = sim.run(&mut VecSource(Some(requests))).unwrap();
    assert_eq!(out.num_skipped_over_length, 1);
    assert_eq!(out.requests.request_id, vec![0, 2, 3]);
    assert_eq!(out.requests.replica, vec![0, 0, 1]);
}

#[test]
fn the_registry_names_every_policy_once_with_its_section() {
    let names: Vec<&str> = REPLICA_POLICIES.iter().map(|e| e.name).collect();
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len());
    for entry in REPLICA_POLICIES {
        assert!(["vllm_v1", "vidur", "sglang"].contains(&entry.section));
    }
    assert!(ReplicaPolicyEntry::find("nope").is_err());
}

/// Requests in each batch, in order (stage 0).
fn batch_sizes(out: &SimOutput) -> Vec<u32> {
    let trace = out.stages.as_ref().unwrap();
    (0..trace.batch_id.len())
        .filter(|&i| trace.stage[i] == 0)
        .map(|i| trace.num_requests[i])
        .collect()
}

#[test]
fn vidur_batch_cap_is_batch_size_cap_over_stages_for_vllm_sarathi_and_lightllm() {
    // batch_size_cap 8 and 2 stages: at most 4 requests per batch, whatever the memory
    // planner's max batch size (here 2, which Vidur applies to orca only).
    let capped = VidurLimits {
        batch_size_cap: 8,
        max_batch_size: 2,
        ..limits()
    };
    let ten = || (0..10).map(|_| req(0.0, 2, 3)).collect::<Vec<_>>();
    for kind in [VidurKind::Vllm, VidurKind::Sarathi] {
        let out = run(
            config(
                ReplicaPolicyConfig::Vidur(kind, capped),
                2,
                linear(2.0, 0.0, 0.0),
            ),
            ten(),
        );
        let sizes = batch_sizes(&out);
        assert_eq!(sizes[0], 4, "{kind:?}: {sizes:?}");
        assert_eq!(sizes.iter().max(), Some(&4), "{kind:?}: {sizes:?}");
    }
    // One stage: the whole cap (8), not the planner's 2.
    let lightllm = VidurLimits {
        block_size: 1,
        num_blocks: 1000,
        ..capped
    };
    let out = run(
        config(
            ReplicaPolicyConfig::Vidur(VidurKind::LightLlm, lightllm),
            1,
            linear(1.0, 0.0, 0.0),
        ),
        ten(),
    );
    assert_eq!(batch_sizes(&out)[0], 8);
    // Orca keeps Vidur's `_max_batch_size` (planner ∧ cap), undivided by the stages.
    let out = run(
        config(
            ReplicaPolicyConfig::Vidur(VidurKind::Orca, capped),
            2,
            linear(2.0, 0.0, 0.0),
        ),
        ten(),
    );
    assert_eq!(batch_sizes(&out).iter().max(), Some(&2));
}

#[test]
fn lightllm_peak_uses_vidurs_token_counts() {
    // A (10, 10) at 0, B (10, 10) at 1.5, 1 s per iteration, max_waiting_iters 1. At 2.0 A
    // has processed 12 tokens; Vidur's tuples: A (12, 10 - 2 - 1 = 7), B (10 + 1, 10 - 2 =
    // 8). Sorted by remaining: B then A; peak = max(8·1 + 11, 7·2 + 23) = 37 < 38 blocks:
    // B's prefill runs 2-3. (Counting one more token each, 39 and 38 would keep B out
    // until 4.0, first token at 5.0.) With 37 blocks it waits one iteration: at 3.0, A
    // (13, 6): max(19, 6·2 + 24 = 36) < 37.
    let first_token_of_b = |num_blocks| {
        let limits = VidurLimits {
            num_blocks,
            block_size: 1,
            max_waiting_iters: 1,
            ..limits()
        };
        let out = run(
            config(
                ReplicaPolicyConfig::Vidur(VidurKind::LightLlm, limits),
                1,
                linear(1.0, 0.0, 0.0),
            ),
            vec![req(0.0, 10, 10), req(1.5, 10, 10)],
        );
        times(&out)[1].1
    };
    assert_eq!(first_token_of_b(38), 3.0);
    assert_eq!(first_token_of_b(37), 4.0);
}

#[test]
fn sarathi_restart_vidur_folds_a_partial_prefill_into_a_shorter_prompt() {
    // 7 blocks of 4 tokens, chunk 8, 1 s per iteration. A (4, 8) prefills 0-1. At 1.0 A
    // decodes (its 2nd block) and B (20, 2) is admitted (5 blocks) with a 7-token chunk.
    // At 2.0 every block is taken, so A's check for one free block fails and B, the latest
    // arrival, is the victim: it restarts with 7 of its 20 prompt tokens processed.
    let run_with = |restart| {
        let limits = VidurLimits {
            num_blocks: 7,
            restart,
            ..limits()
        };
        run(
            config(
                ReplicaPolicyConfig::Vidur(VidurKind::Sarathi, limits),
                1,
                linear(1.0, 0.0, 0.0),
            ),
            vec![req(0.0, 4, 8), req(0.5, 20, 2)],
        )
    };
    let vidur = run_with(RestartMode::Vidur);
    let recompute = run_with(RestartMode::Recompute);
    // Vidur: B's prompt becomes its 7 processed tokens; re-prefilled 2-3, that is its
    // first token (Vidur's prefill_completed_at), and the other 13 prompt tokens decode.
    let b = |out: &SimOutput| times(out)[1];
    assert_eq!(b(&vidur).1, 3.0, "{:?}", times(&vidur));
    assert!(b(&recompute).1 > 3.0, "{:?}", times(&recompute));
    assert_eq!(batches(&vidur)[..3], [(4, 0), (7, 1), (7, 1)]);
    for out in [&vidur, &recompute] {
        assert!(out.requests.num_restarts.iter().sum::<u32>() >= 1);
        assert_eq!(out.requests.len(), 2, "both complete");
    }
}

#[test]
fn a_broken_internal_invariant_is_an_internal_error_not_a_plugins() {
    // A KV transfer can only end on a replica that runs one: elsewhere it is a bug in the
    // simulator, reported as such (Python's InternalError), not blamed on a plugin.
    let mut policy = ReplicaPolicyConfig::Vidur(VidurKind::Vllm, limits())
        .build(16, false)
        .unwrap();
    let err = policy.finish_kv_transfer(0, true).unwrap_err();
    assert!(matches!(err, crate::Error::Internal(_)), "{err}");
    assert!(
        err.to_string()
            .starts_with("internal error (a bug in tokenyard): ")
    );
}
