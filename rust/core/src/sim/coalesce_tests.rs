//! The judge of coalesced decode steps (`crate::sched::multistep`): random clusters and
//! workloads run with `coalesce_decode_steps` on and off must give the same output bit for
//! bit: every per-request column, the token-gap histogram, the samples, the stage trace,
//! the replica totals, the event and batch counts.

use proptest::prelude::*;

use super::tests::{VecSource, config};
use super::*;
use crate::Result;
use crate::kv::KvGroupSpec;
use crate::sched::{Policy, SchedulerConfig};

/// Everything a run produced, as text: `{:?}` of an `f64` is its shortest round-trip form,
/// so two equal strings mean equal bits (NaNs aside, which these outputs only hold as
/// "never").
fn fingerprint(out: &SimOutput) -> String {
    format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{} {} {} {}",
        out.requests,
        out.token_gaps,
        out.samples,
        out.stages,
        out.replicas,
        out.makespan,
        out.num_events,
        out.num_batches,
        out.num_skipped_over_length
    )
}

#[derive(Debug, Clone)]
struct Case {
    num_replicas: u32,
    num_stages: u32,
    router: u8,
    caching: bool,
    chunked: bool,
    prioritize_prefill: bool,
    priority: bool,
    block_size: usize,
    num_blocks: usize,
    max_num_batched_tokens: usize,
    max_num_seqs: usize,
    coefficients: (f64, f64, f64, f64),
    concurrency: Option<u32>,
    /// KV cache groups beside full attention (none: the single-group pool).
    kv_groups: Vec<KvGroupSpec>,
    requests: Vec<ArrivingRequest>,
}

const MAX_MODEL_LEN: usize = 160;

/// A run's output and its KV cache events by batch (`engine::take_kv_event_log`: with
/// `prefix_affinity` routing, when each block was cached or evicted).
fn run_logged(case: &Case, coalesce: bool) -> (Result<SimOutput>, Vec<String>) {
    engine::take_kv_event_log();
    let out = run_case(case, coalesce);
    (out, engine::take_kv_event_log())
}

fn run_case(case: &Case, coalesce: bool) -> Result<SimOutput> {
    let sched = SchedulerConfig {
        block_size: case.block_size,
        num_blocks: case.num_blocks,
        max_model_len: MAX_MODEL_LEN,
        max_num_batched_tokens: case.max_num_batched_tokens,
        max_num_seqs: case.max_num_seqs,
        enable_chunked_prefill: case.chunked,
        prioritize_prefill: case.prioritize_prefill,
        policy: if case.priority {
            Policy::Priority
        } else {
            Policy::Fcfs
        },
        enable_prefix_caching: case.caching,
        kv_groups: case.kv_groups.clone(),
        ..SchedulerConfig::default()
    };
    let (c, a, b, d) = case.coefficients;
    let exec = exec::LinearModel {
        constant_s: c,
        per_prefill_token_s: a,
        per_decode_token_s: b,
        per_decode_context_token_s: d,
        per_prefill_context_token_s: 0.0,
        cpu_overhead_s: 0.0,
    };
    let mut cfg = config(ReplicaPolicyConfig::VllmV1(sched), case.num_stages, exec);
    cfg.num_replicas = case.num_replicas;
    cfg.hash_block_size = 4;
    cfg.sample_interval_s = [0.0, 0.05, 0.5][case.router as usize % 3];
    cfg.global_policy = match case.router % 4 {
        0 => GlobalPolicy::RoundRobin,
        1 => GlobalPolicy::Lor,
        2 => GlobalPolicy::LeastKvLoad,
        _ => GlobalPolicy::PrefixAffinity { balance: 0.5 },
    };
    cfg.concurrency = case.concurrency;
    cfg.coalesce_decode_steps = coalesce;
    let mut exec = cfg.exec;
    let sim = Simulator::new(cfg, &mut exec)?;
    sim.run(&mut VecSource(Some(case.requests.clone())))
}

/// A request: a prompt opening with one of 3 shared prefixes (or none), its own blocks
/// after; sessions re-send a growing context.
fn requests() -> impl Strategy<Value = Vec<ArrivingRequest>> {
    prop::collection::vec(
        (
            0.0f64..4.0,
            1u32..48,
            1u32..60,
            0u64..4,
            prop::option::weighted(0.3, 0u64..4),
            0.0f64..0.5,
        ),
        1..40,
    )
    .prop_map(|rows| {
        let mut at = 0.0;
        let mut own = 1000u64;
        rows.into_iter()
            .map(|(gap, prefill, decode, prefix, session, delay)| {
                at += gap * 0.2;
                let blocks = prefill.div_ceil(4) as u64;
                let mut ids: Vec<u64> = (0..blocks.min(3)).map(|i| prefix * 10 + i).collect();
                if prefix == 3 {
                    ids.clear();
                }
                while (ids.len() as u64) < blocks {
                    ids.push(own);
                    own += 1;
                }
                ArrivingRequest {
                    hash_ids: ids,
                    session,
                    delay_s: delay,
                    ..ArrivingRequest::new(at, prefill, decode)
                }
            })
            .collect()
    })
}

fn cases() -> impl Strategy<Value = Case> {
    (
        (1u32..5, prop::bool::weighted(0.8), 0u8..12, any::<bool>()),
        (
            prop::bool::weighted(0.8),
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.2),
        ),
        (prop::sample::select(vec![1usize, 2, 4, 16]), 0usize..3),
        (prop::sample::select(vec![16usize, 64, 2048]), 0usize..12),
        (0.001f64..0.05, 0.0f64..0.003, 0.0f64..0.002, 0.0f64..0.0002),
        prop::option::weighted(0.15, 1u32..6),
        (
            0u8..6,
            prop::sample::select(vec![1usize, 3, 4, 7, 8, 16, 20, 32]),
        ),
        requests(),
    )
        .prop_map(
            |(
                (num_replicas, one_stage, router, caching),
                (chunked, prioritize_prefill, priority),
                (block_size, tightness),
                (max_num_batched_tokens, max_num_seqs),
                coefficients,
                concurrency,
                (groups, window),
                requests,
            )| {
                // Half the cases run over vLLM's coordinator: full attention beside a
                // sliding window (gpt-oss) or a chunked local group (Llama 4).
                let full = KvGroupSpec::FullAttention;
                let kv_groups = match groups {
                    0..=2 => Vec::new(),
                    3 | 4 => vec![
                        full,
                        KvGroupSpec::SlidingWindow {
                            sliding_window: window,
                        },
                    ],
                    _ => vec![
                        full,
                        KvGroupSpec::ChunkedLocalAttention {
                            attention_chunk_size: window,
                        },
                    ],
                };
                // Tight pools preempt: just enough for the longest request, or a little more.
                let per_request = MAX_MODEL_LEN.div_ceil(block_size) * kv_groups.len().max(1);
                let num_blocks = per_request * [1, 2, 8][tightness] + 1;
                Case {
                    num_replicas,
                    num_stages: if one_stage { 1 } else { 2 },
                    router,
                    caching,
                    chunked,
                    prioritize_prefill,
                    priority,
                    block_size,
                    num_blocks,
                    max_num_batched_tokens,
                    max_num_seqs,
                    coefficients,
                    concurrency,
                    kv_groups,
                    requests,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn coalesced_decode_steps_change_nothing(case in cases()) {
        let (stepped, stepped_events) = run_logged(&case, false);
        let (coalesced, coalesced_events) = run_logged(&case, true);
        let first = stepped_events.iter().zip(&coalesced_events).position(|(a, b)| a != b);
        prop_assert!(
            stepped_events.len() == coalesced_events.len() && first.is_none(),
            "KV events differ at batch end {first:?} of {}",
            stepped_events.len()
        );
        match (stepped, coalesced) {
            (Ok(a), Ok(b)) => {
                let (a, b) = (fingerprint(&a), fingerprint(&b));
                if a != b {
                    let line = a.lines().zip(b.lines()).position(|(x, y)| x != y);
                    prop_assert!(false, "outputs differ (first differing section {line:?}):\nstepped   {a}\ncoalesced {b}");
                }
            }
            (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
            (a, b) => prop_assert!(false, "one run failed: {:?} vs {:?}", a.err(), b.err()),
        }
    }
}

/// The cases above coalesce: a long decode on one replica runs in windows.
#[test]
fn a_lone_long_decode_is_coalesced_and_identical() {
    let case = Case {
        num_replicas: 2,
        num_stages: 1,
        router: 3,
        caching: true,
        chunked: true,
        prioritize_prefill: false,
        priority: false,
        block_size: 4,
        num_blocks: 200,
        max_num_batched_tokens: 2048,
        max_num_seqs: 0,
        coefficients: (0.01, 0.001, 0.0005, 0.00001),
        concurrency: None,
        kv_groups: Vec::new(),
        requests: (0..12)
            .map(|i| ArrivingRequest {
                hash_ids: vec![1, 2, i + 100],
                ..ArrivingRequest::new(i as f64 * 0.3, 10, 100)
            })
            .collect(),
    };
    let a = fingerprint(&run_case(&case, false).unwrap());
    let lazy_before = engine::lazy_steps();
    let coalesced = run_case(&case, true).unwrap();
    assert_eq!(a, fingerprint(&coalesced));
    // A third of the steps were ended without a pass over their requests, which were
    // settled when released or when their window ended (`engine::lazy`).
    let num_lazy = engine::lazy_steps() - lazy_before;
    assert!(
        3 * num_lazy > coalesced.num_batches,
        "{num_lazy} of {}",
        coalesced.num_batches
    );
}

/// Over KV groups too: long decodes beside a sliding-window or chunked local group, on a
/// roomy pool and on one tight enough to preempt, give the stepped output (that windows
/// open over groups is `sched::tests::multistep::decode_windows_open_over_kv_groups`).
#[test]
fn long_decodes_over_kv_groups_are_coalesced_and_identical() {
    let window = KvGroupSpec::SlidingWindow { sliding_window: 7 };
    let chunked = KvGroupSpec::ChunkedLocalAttention {
        attention_chunk_size: 8,
    };
    for (group, num_blocks) in [(window, 400), (window, 90), (chunked, 400), (chunked, 90)] {
        let case = Case {
            num_replicas: 1,
            num_stages: 1,
            router: 0,
            caching: true,
            chunked: true,
            prioritize_prefill: false,
            priority: false,
            block_size: 4,
            num_blocks,
            max_num_batched_tokens: 2048,
            max_num_seqs: 0,
            coefficients: (0.01, 0.001, 0.0005, 0.00001),
            concurrency: None,
            kv_groups: vec![KvGroupSpec::FullAttention, group],
            requests: (0..12)
                .map(|i| ArrivingRequest {
                    hash_ids: vec![1, 2, i + 100],
                    ..ArrivingRequest::new(i as f64 * 0.3, 10, 100 + 3 * i as u32)
                })
                .collect(),
        };
        let stepped = run_case(&case, false).unwrap();
        let coalesced = run_case(&case, true).unwrap();
        assert_eq!(fingerprint(&stepped), fingerprint(&coalesced), "{group:?}");
    }
}

/// A request arriving during a window is admitted beside its decodes and joins it
/// (`sched::multistep_admit`): short prompts arriving among long decodes, on a roomy pool
/// and on one tight enough to preempt, with prompts that fit one step's budget and
/// prompts chunked over several (which end the window), FCFS and priority queues. Same
/// output as stepping; most steps still end lazily.
#[test]
fn requests_admitted_during_windows_join_them_and_change_nothing() {
    for (num_blocks, budget, priority) in [(400, 2048, false), (60, 2048, false), (400, 16, true)] {
        let case = Case {
            num_replicas: 1,
            num_stages: 1,
            // prefix_affinity: the replica records its KV cache events.
            router: 3,
            caching: true,
            chunked: true,
            prioritize_prefill: false,
            priority,
            block_size: 4,
            num_blocks,
            max_num_batched_tokens: budget,
            max_num_seqs: 0,
            coefficients: (0.01, 0.001, 0.0005, 0.00001),
            concurrency: None,
            kv_groups: Vec::new(),
            requests: (0..24)
                .map(|i| ArrivingRequest {
                    hash_ids: vec![1, 2, i + 100, i + 200],
                    ..ArrivingRequest::new(i as f64 * 0.13, 6 + (i % 5) as u32 * 3, 40 + i as u32)
                })
                .collect(),
        };
        let (stepped, stepped_events) = run_logged(&case, false);
        let stepped = fingerprint(&stepped.unwrap());
        let (admitted_before, lazy_before) =
            (crate::sched::admission_steps(), engine::lazy_steps());
        let (coalesced, coalesced_events) = run_logged(&case, true);
        let coalesced = coalesced.unwrap();
        let label = format!("{num_blocks} blocks, budget {budget}");
        assert_eq!(stepped, fingerprint(&coalesced), "{label}");
        assert!(!stepped_events.is_empty());
        assert!(
            stepped_events == coalesced_events,
            "{label}: KV events differ"
        );
        let num_admitted = crate::sched::admission_steps() - admitted_before;
        let num_lazy = engine::lazy_steps() - lazy_before;
        assert!(num_admitted >= 10, "{num_admitted} admission steps");
        assert!(
            2 * num_lazy > coalesced.num_batches,
            "{num_lazy} of {} steps lazy",
            coalesced.num_batches
        );
    }
}

/// A window that admits may outlive hundreds of requests: its lists drop the finished ones
/// (`DecodeWindow::compact`) and its ledger the steps no member owes (`lazy`). A long run
/// of arrivals into one replica's window, with prompts that hit and miss the prefix cache.
#[test]
fn a_window_outliving_its_requests_changes_nothing() {
    let case = Case {
        num_replicas: 1,
        num_stages: 1,
        router: 3,
        caching: true,
        chunked: true,
        prioritize_prefill: false,
        priority: false,
        block_size: 4,
        num_blocks: 2000,
        max_num_batched_tokens: 2048,
        max_num_seqs: 0,
        coefficients: (0.01, 0.001, 0.0005, 0.00001),
        concurrency: None,
        kv_groups: Vec::new(),
        requests: (0..300)
            .map(|i| ArrivingRequest {
                hash_ids: vec![1, 2, i % 7 + 50, i + 200],
                ..ArrivingRequest::new(
                    i as f64 * 0.15,
                    10 + (i % 4) as u32 * 2,
                    20 + (i * 37 % 120) as u32,
                )
            })
            .collect(),
    };
    let (stepped, stepped_events) = run_logged(&case, false);
    let before = crate::sched::admission_steps();
    let (coalesced, coalesced_events) = run_logged(&case, true);
    let coalesced = coalesced.unwrap();
    assert_eq!(fingerprint(&stepped.unwrap()), fingerprint(&coalesced));
    assert!(stepped_events == coalesced_events, "KV events differ");
    let num_admitted = crate::sched::admission_steps() - before;
    assert!(num_admitted >= 120, "{num_admitted} admission steps");
}
