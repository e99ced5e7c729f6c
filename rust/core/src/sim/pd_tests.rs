//! Disaggregated serving, by hand: prefill on one replica, the KV over the link at its
//! rate, decode steps on another; link contention; the decode side's prefix cache.

use super::tests::{VecSource, close, linear, req};
use super::*;
use crate::sched::SchedulerConfig;

fn v1(num_blocks: usize) -> ReplicaPolicyConfig {
    ReplicaPolicyConfig::VllmV1(SchedulerConfig {
        block_size: 4,
        num_blocks,
        max_model_len: 64,
        max_num_batched_tokens: 64,
        enable_prefix_caching: true,
        ..SchedulerConfig::without_vllm_reservations()
    })
}

/// 1 MB per token; one GPU per replica, one per node: every transfer crosses the network
/// at 1 GB/s with 1 ms latency, so 10 tokens take 0.001 + 0.01 s.
pub(super) fn link() -> KvLink {
    KvLink {
        kv_bytes_per_token: 1e6,
        window_tokens: 0,
        window_bytes_per_token: 0.0,
        state_bytes: 0.0,
        gpus_per_node: 1,
        prefill_gpus: 1,
        decode_gpus: 1,
        nvlink_gbps: 100.0,
        nvlink_latency_s: 0.0,
        network_gbps: 1.0,
        network_latency_s: 1e-3,
    }
}

fn pd_config(num_prefill: u32, num_decode: u32) -> SimConfig {
    let mut config = super::tests::config(v1(64), 1, linear(1.0, 0.1, 0.2));
    config.num_replicas = num_prefill;
    config.pd = Some(PdConfig {
        num_decode_replicas: num_decode,
        decode_num_stages: 1,
        decode_policy: v1(64),
        decode_router: GlobalPolicy::RoundRobin,
        link: link(),
        decode_host_link: None,
    });
    config
}

fn run(config: SimConfig, requests: Vec<ArrivingRequest>) -> SimOutput {
    let mut exec = config.exec;
    let sim = Simulator::new(config, &mut exec).unwrap();
    sim.run(&mut VecSource(Some(requests))).unwrap()
}

#[test]
fn one_request_prefills_crosses_the_link_and_decodes_at_hand_computed_times() {
    let out = run(pd_config(1, 1), vec![req(0.0, 10, 3)]);
    let t = &out.requests;
    // Prefill of 10 on replica 0: 1 + 0.1 x 10 = 2 s, the first token.
    assert!(close(t.first_token_at[0], 2.0));
    // 10 tokens of KV: 0.001 + 1e7 / 1e9 = 0.011 s, landing at 2.011. Then two decode
    // steps of 1 + 0.2 = 1.2 s on replica 1: tokens 2 and 3 at 3.211 and 4.411.
    assert_eq!(t.kv_transfer_tokens[0], 10);
    assert!(close(t.kv_transfer_s[0], 0.011));
    assert!(close(t.kv_transfer_wait_s[0], 0.0));
    assert!(close(t.completed_at[0], 4.411));
    assert!(
        close(t.max_token_gap[0], 1.211),
        "the gap before token 2 has the transfer"
    );
    assert_eq!((t.prefill_replica[0], t.replica[0]), (0, 1));
    let busy = &out.replicas.busy_time;
    assert!(close(busy[0], 2.0) && close(busy[1], 2.4));
}

#[test]
fn a_one_token_request_never_leaves_the_prefill_pool() {
    let out = run(pd_config(1, 1), vec![req(0.0, 10, 1)]);
    let t = &out.requests;
    assert!(close(t.completed_at[0], 2.0));
    assert_eq!(
        (t.prefill_replica[0], t.replica[0], t.kv_transfer_tokens[0]),
        (-1, 0, 0)
    );
}

#[test]
fn transfers_into_one_decode_replica_queue_on_its_port() {
    // Two prefill replicas finish at 2.0 together; both send 10 tokens to decode replica 2.
    let out = run(pd_config(2, 1), vec![req(0.0, 10, 2), req(0.0, 10, 2)]);
    let t = &out.requests;
    let mut waits: Vec<f64> = t.kv_transfer_wait_s.clone();
    waits.sort_by(f64::total_cmp);
    assert!(close(waits[0], 0.0) && close(waits[1], 0.011), "{waits:?}");
}

#[test]
fn the_decode_side_prefix_cache_shortens_the_transfer() {
    // A 12-token prompt, then the same prompt, then one sharing its first 8 tokens, far
    // apart. On the decode replica the second finds all 12 prompt tokens cached (nothing
    // crosses the link) and the third its first two blocks of 4 (4 tokens cross).
    let turn = |at: f64, ids: [u64; 3]| {
        let mut r = req(at, 12, 2);
        r.hash_ids = ids.to_vec();
        r
    };
    let requests = vec![
        turn(0.0, [1, 2, 3]),
        turn(100.0, [1, 2, 3]),
        turn(200.0, [1, 2, 9]),
    ];
    let mut config = pd_config(1, 1);
    config.hash_block_size = 4;
    let out = run(config, requests);
    assert_eq!(out.requests.kv_transfer_tokens, [12, 0, 4]);
}

#[test]
fn every_request_completes_once_and_decode_never_starts_before_its_kv_lands() {
    let requests: Vec<_> = (0..40)
        .map(|i| req(i as f64 * 0.3, 5 + (i * 7 % 23), 1 + (i * 5 % 9)))
        .collect();
    let out = run(pd_config(2, 3), requests);
    let t = &out.requests;
    let mut ids = t.request_id.clone();
    ids.sort_unstable();
    assert_eq!(ids, (0..40).collect::<Vec<_>>());
    for i in 0..t.len() {
        if t.num_decode_tokens[i] > 1 {
            let landed = t.first_token_at[i] + t.kv_transfer_wait_s[i] + t.kv_transfer_s[i];
            assert!(t.replica[i] >= 2, "decoded in the decode pool");
            // The second token needs a decode step after the KV landed.
            assert!(t.first_token_at[i] + t.max_token_gap[i] >= landed + 1.2 - 1e-9);
        }
    }
}

#[test]
fn bad_pool_configs_name_their_key() {
    let mut config = pd_config(1, 1);
    config.pd.as_mut().unwrap().num_decode_replicas = 0;
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("cluster.decode.num_replicas"), "{err}");
    let mut config = pd_config(1, 1);
    config.pd.as_mut().unwrap().link.network_gbps = 0.0;
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("cluster.kv_transfer.network_gbps"), "{err}");
    let mut config = pd_config(1, 1);
    config.replica_policy = ReplicaPolicyConfig::Vidur(VidurKind::Vllm, super::tests::limits());
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("replica.scheduler.policy"), "{err}");
}

/// `v1(num_blocks)` with KV groups of block sizes `sizes` (hashed at 4, as Gemma 4's
/// layouts hash at the gcd).
fn v1_groups(num_blocks: usize, sizes: &[usize]) -> ReplicaPolicyConfig {
    let ReplicaPolicyConfig::VllmV1(mut c) = v1(num_blocks) else {
        unreachable!()
    };
    c.kv_group_block_sizes = sizes.into();
    ReplicaPolicyConfig::VllmV1(c)
}

#[test]
fn the_pools_groups_must_share_their_block_sizes_beside_the_hash_block_size() {
    // Both pools hash at 4; the decode pool's groups take blocks of 4 and 4 against the
    // prefill pool's 8 and 4: refused naming the decode pool's key and both sizes.
    let mut config = pd_config(1, 1);
    config.replica_policy = v1_groups(64, &[8, 4]);
    config.pd.as_mut().unwrap().decode_policy = v1_groups(64, &[4, 4]);
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("cluster.decode.scheduler.vllm_v1.kv_group_block_sizes")
            && err.contains("[4, 4]")
            && err.contains("[8, 4]"),
        "{err}"
    );
    // Groups on one side only disagree too; equal groups pass this check (the pool's own
    // validation then wants the groups these hand configs lack).
    let key = "cluster.decode.scheduler.vllm_v1.kv_group_block_sizes";
    config.pd.as_mut().unwrap().decode_policy = v1(64);
    assert!(config.validate().unwrap_err().to_string().contains(key));
    config.pd.as_mut().unwrap().decode_policy = v1_groups(64, &[8, 4]);
    let err = config
        .validate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(!err.contains(key), "{err}");
}

#[test]
fn a_request_restarted_on_the_prefill_replica_still_decodes_once_on_the_decode_side() {
    // Prefill replica: 8 blocks of 4, 16 tokens a step. A takes 16 then 4 tokens, B 12;
    // then A finishes and keeps its 5 blocks for the send, so B (needing 2 more) preempts
    // itself and restarts once its turn comes again. On the decode replica B must be
    // treated as handed over (its prompt and first token done), not as restarted there.
    let mut config = pd_config(1, 1);
    config.replica_policy = ReplicaPolicyConfig::VllmV1(SchedulerConfig {
        block_size: 4,
        num_blocks: 8,
        max_model_len: 32,
        max_num_batched_tokens: 16,
        enable_prefix_caching: true,
        ..SchedulerConfig::without_vllm_reservations()
    });
    let out = run(config, vec![req(0.0, 20, 3), req(0.0, 20, 3)]);
    let t = &out.requests;
    assert_eq!(t.len(), 2);
    for i in 0..2 {
        assert_eq!((t.prefill_replica[i], t.replica[i]), (0, 1));
        assert_eq!(t.kv_transfer_tokens[i], 20);
        assert!(t.completed_at[i] > t.first_token_at[i]);
    }
    let b = (t.request_id[0] != 1) as usize;
    assert_eq!(t.num_restarts[b], 1, "B restarted on the prefill replica");
}

#[test]
fn the_block_budget_counts_the_decode_pool_before_allocating() {
    // Each pool alone fits the budget; together they do not: refused, nothing allocated.
    let half = (crate::sim::MAX_CLUSTER_BLOCKS / 2) as usize;
    let mut config = pd_config(1, 2);
    config.replica_policy = v1(half);
    config.pd.as_mut().unwrap().decode_policy = v1(half);
    let mut exec = config.exec;
    let err = Simulator::new(config, &mut exec)
        .err()
        .expect("over the budget");
    let text = err.to_string();
    assert!(
        matches!(
            err,
            crate::Error::Config {
                field: "cluster.num_replicas",
                ..
            }
        ),
        "{text}"
    );
    assert!(text.contains("2 decode replicas"), "{text}");
}
