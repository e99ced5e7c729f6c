//! Naming KV blocks by trace id (`IdBlockHashes`) against hashing their tokens, on whole
//! simulations: the same random conversation-like workloads (prompts that repeat earlier
//! ids, ids that reach past the prompt into the output, private tails) through one, two
//! or P/D replicas, `prefix_affinity` routing, a host tier and a small GPU pool that
//! preempts, give the same result table with names on and off (`NAME_BY_ID`).

use super::NAME_BY_ID;
use crate::sched::SchedulerConfig;
use crate::sim::tests::{VecSource, linear, req};
use crate::sim::*;

fn v1(num_blocks: usize, host_num_blocks: usize) -> ReplicaPolicyConfig {
    ReplicaPolicyConfig::VllmV1(SchedulerConfig {
        block_size: 4,
        num_blocks,
        max_model_len: 100,
        max_num_batched_tokens: 32,
        enable_chunked_prefill: true,
        enable_prefix_caching: true,
        host_num_blocks,
        ..SchedulerConfig::without_vllm_reservations()
    })
}

/// A small LCG: the workloads need no statistics, only variety.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// 40 requests in 5 chains of turns over `hash_block_size`-token trace blocks.
fn workload(seed: u64, hash_block_size: u32) -> Vec<ArrivingRequest> {
    let mut draw = Draw(seed);
    let block = u64::from(hash_block_size);
    let mut chains: Vec<Vec<u64>> = vec![Vec::new(); 5];
    let mut next_id = 1;
    let mut at = 0.0;
    (0..40)
        .map(|_| {
            let chain = &mut chains[draw.below(5) as usize];
            // Keep a prefix of the chain's ids (a later turn, or a sibling), add new ones.
            let keep = draw.below(chain.len() as u64 + 1) as usize;
            chain.truncate(keep.max(chain.len().saturating_sub(2)));
            for _ in 0..=draw.below(3) {
                chain.push(next_id);
                next_id += 1;
            }
            let covered = chain.len() as u64 * block;
            // Ending inside the ids, at their end, or past them (a private tail).
            let prefill = (covered - draw.below(block + 1) + draw.below(3) * 3).clamp(1, 70);
            let decode = 1 + draw.below(20);
            let mut r = req(at, prefill as u32, decode as u32);
            // Sometimes the ids reach past the prompt: its output is the next turn's.
            let num_ids = if draw.below(3) == 0 {
                chain.len()
            } else {
                (prefill.div_ceil(block) as usize).min(chain.len())
            };
            r.hash_ids = chain[..num_ids].to_vec();
            at += draw.below(4) as f64 * 0.5;
            r
        })
        .collect()
}

fn run(
    config: &SimConfig,
    requests: Vec<ArrivingRequest>,
    by_id: bool,
) -> crate::Result<SimOutput> {
    NAME_BY_ID.set(by_id);
    let config = config.clone();
    let mut exec = config.exec;
    let out =
        Simulator::new(config, &mut exec).and_then(|sim| sim.run(&mut VecSource(Some(requests))));
    NAME_BY_ID.set(true);
    out
}

fn configs(hash_block_size: u32) -> Vec<SimConfig> {
    let base = |policy| {
        let mut c = crate::sim::tests::config(policy, 1, linear(1.0, 0.1, 0.2));
        c.hash_block_size = hash_block_size;
        c
    };
    let single = base(v1(36, 0));
    let mut routed = base(v1(40, 16));
    routed.num_replicas = 2;
    routed.global_policy = GlobalPolicy::PrefixAffinity { balance: 0.01 };
    routed.kv_offload = Some(KvOffload {
        link: HostLink {
            seconds_per_token: 0.01,
            latency_s: 0.05,
        },
        host_hit_weight: 0.5,
    });
    let mut pd = base(v1(40, 0));
    pd.num_replicas = 2;
    pd.global_policy = GlobalPolicy::PrefixAffinity { balance: 0.01 };
    pd.pd = Some(PdConfig {
        num_decode_replicas: 2,
        decode_num_stages: 1,
        decode_policy: v1(40, 0),
        decode_router: GlobalPolicy::PrefixAffinity { balance: 0.01 },
        link: crate::sim::pd_tests::link(),
        decode_host_link: None,
    });
    vec![single, routed, pd]
}

#[test]
fn naming_blocks_by_id_simulates_exactly_as_hashing_their_tokens() {
    let seeds: u64 = std::env::var("TOKENYARD_ID_NAME_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let (mut num_hits, mut num_restarts, mut num_host) = (0u64, 0u64, 0u64);
    let (mut num_cases, mut num_ok) = (0, 0);
    for hash_block_size in [4, 8, 16] {
        for (c, config) in configs(hash_block_size).iter().enumerate() {
            for seed in 0..seeds {
                let case = format!("trace blocks of {hash_block_size}, config {c}, seed {seed}");
                let requests = workload(seed, hash_block_size);
                let named = run(config, requests.clone(), true);
                let hashed = run(config, requests, false);
                // A run the simulator refuses (a tiny pool can stall it) must be refused
                // the same way both times.
                let table = |out: &crate::Result<SimOutput>| match out {
                    Ok(out) => format!("{:?}", out.requests),
                    Err(err) => format!("{err:?}"),
                };
                assert_eq!(table(&named), table(&hashed), "{case}");
                num_cases += 1;
                let Ok(out) = named else { continue };
                num_ok += 1;
                let t = &out.requests;
                num_hits += t
                    .prefix_hit_tokens
                    .iter()
                    .map(|&h| u64::from(h))
                    .sum::<u64>();
                num_restarts += t.num_restarts.iter().map(|&r| u64::from(r)).sum::<u64>();
                num_host += t.host_hit_tokens.iter().map(|&h| u64::from(h)).sum::<u64>();
            }
        }
    }
    assert!(num_ok * 5 >= num_cases * 4, "{num_ok} of {num_cases} ran");
    assert!(
        num_hits > 0 && num_restarts > 0 && num_host > 0,
        "hits {num_hits}, restarts {num_restarts}, host hits {num_host}"
    );
}
