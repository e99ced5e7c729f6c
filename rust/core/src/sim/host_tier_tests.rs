//! The host-memory KV tier in the simulator, by hand: blocks evicted from a replica's GPU
//! pool are offloaded to host memory; a later prompt that hits them there waits for them to
//! cross the host link, then computes only the rest.

use super::tests::{VecSource, close, linear, req};
use super::*;
use crate::sched::SchedulerConfig;

/// 8 GPU blocks of 4 tokens, 16 in host memory.
fn v1(host_num_blocks: usize) -> ReplicaPolicyConfig {
    ReplicaPolicyConfig::VllmV1(SchedulerConfig {
        block_size: 4,
        num_blocks: 8,
        max_model_len: 32,
        max_num_batched_tokens: 64,
        enable_prefix_caching: true,
        host_num_blocks,
        ..SchedulerConfig::without_vllm_reservations()
    })
}

/// 0.01 s per token plus 0.05 s per load.
const LINK: HostLink = HostLink {
    seconds_per_token: 0.01,
    latency_s: 0.05,
};

fn config(host_num_blocks: usize) -> SimConfig {
    let mut config = super::tests::config(v1(host_num_blocks), 1, linear(1.0, 0.1, 0.2));
    config.hash_block_size = 4;
    config.kv_offload = (host_num_blocks > 0).then_some(KvOffload {
        link: LINK,
        host_hit_weight: 0.5,
    });
    config
}

fn run(config: SimConfig, requests: Vec<ArrivingRequest>) -> SimOutput {
    let mut exec = config.exec;
    let sim = Simulator::new(config, &mut exec).unwrap();
    sim.run(&mut VecSource(Some(requests))).unwrap()
}

fn with_ids(at: f64, prefill: u32, ids: &[u64]) -> ArrivingRequest {
    let mut r = req(at, prefill, 2);
    r.hash_ids = ids.to_vec();
    r
}

/// A: 16 tokens (ids 1-4); B: 24 other tokens, which evict A's blocks; C: A's prompt again.
fn three_requests() -> Vec<ArrivingRequest> {
    vec![
        with_ids(0.0, 16, &[1, 2, 3, 4]),
        with_ids(10.0, 24, &[5, 6, 7, 8, 9, 10]),
        with_ids(20.0, 16, &[1, 2, 3, 4]),
    ]
}

#[test]
fn a_prompt_evicted_to_host_memory_is_loaded_back_over_the_host_link() {
    let without = run(config(0), three_requests());
    let with = run(config(16), three_requests());
    // A holds 5 blocks (16 prompt tokens and its one decode); when it ends they are freed
    // last block first, so B (7 blocks: the 3 never used, then A's) evicts all of A's but
    // the first. Without a tier, C hits that first block only and computes 12 tokens:
    // 1 + 0.1 x 12 = 2.2 s.
    let t = &without.requests;
    assert_eq!((t.prefix_hit_tokens[2], t.host_hit_tokens[2]), (4, 0));
    assert!(close(t.first_token_at[2], 22.2));
    // With one, A's evicted blocks went to host memory. C's lookup finds its first block on
    // the GPU and the next two in host memory (never the whole prompt: its last block is
    // computed): 0.05 + 8 x 0.01 = 0.13 s of load, then 1 + 0.1 x 4 = 1.4 s for the rest.
    let t = &with.requests;
    assert_eq!(
        (
            t.prefix_hit_tokens[2],
            t.host_hit_tokens[2],
            t.host_load_tokens[2]
        ),
        (12, 8, 8)
    );
    assert!(close(t.host_load_s[2], 0.13) && close(t.host_load_wait_s[2], 0.0));
    assert!(
        close(t.first_token_at[2], 20.0 + 0.13 + 1.4),
        "{}",
        t.first_token_at[2]
    );
    assert_eq!(t.host_load_tokens[..2], [0, 0]);
    let replicas = &with.replicas;
    assert_eq!(replicas.host_loaded_blocks, [2]);
    assert!(replicas.host_offloaded_blocks[0] >= 3);
}

#[test]
fn a_host_tier_without_its_link_or_a_link_without_a_tier_is_refused() {
    let mut c = config(16);
    c.kv_offload = None;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("replica.kv_offload"), "{err}");
    let mut c = config(0);
    c.kv_offload = Some(KvOffload {
        link: LINK,
        host_hit_weight: 0.5,
    });
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("replica.kv_offload"), "{err}");
    let mut c = config(16);
    c.kv_offload.as_mut().unwrap().host_hit_weight = 2.0;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("host_hit_weight"), "{err}");
}
