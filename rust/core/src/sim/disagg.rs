//! Disaggregated serving (seed 001's prefill and decode instances, seed 004 §7.3's KV
//! connectors): a prefill pool computes each prompt and its first token; the request's KV
//! then moves to a replica of the decode pool, which allocates blocks for it first and
//! holds the request in `WAITING_FOR_REMOTE_KVS` until it lands. This module owns the
//! decode pool's config and the links KV crosses: who sends to whom, over what, when.
//!
//! Links: replicas are placed on nodes of `gpus_per_node` GPUs in order, the prefill pool
//! first. A transfer between replicas of one node uses NVLink, otherwise the network; its
//! bandwidth is the per-GPU link's times the GPUs that send or receive in parallel (the
//! fewer of the two replicas'), so resharding between TP layouts costs what the narrower
//! side can move. Each replica has one port for KV traffic: a transfer starts when both
//! ends are free (FIFO in the order transfers are asked for) and holds both until it ends.

use super::config::ReplicaPolicyConfig;
use super::global::GlobalPolicy;
use super::host_tier::HostLink;
use crate::{Error, Result};

/// The decode pool and the KV link (`[cluster.decode]` and `[cluster.kv_transfer]`).
#[derive(Debug, Clone)]
pub struct PdConfig {
    pub num_decode_replicas: u32,
    pub decode_num_stages: u32,
    pub decode_policy: ReplicaPolicyConfig,
    pub decode_router: GlobalPolicy,
    pub link: KvLink,
    /// The decode replicas' host-tier link (`[replica.kv_offload]`, priced for the decode
    /// pool's device and layout); `None` = no tier there.
    pub decode_host_link: Option<HostLink>,
}

/// What a transfer costs: the KV's size and the links' figures (from the catalog).
///
/// Under vLLM's hybrid KV cache manager a connector moves each KV cache group's blocks
/// (NixlConnector is `SupportsHMA`): every token's KV of the full-attention layers, only
/// the window's of a sliding-window group (its earlier blocks are null blocks), and one
/// state per request of a Mamba / linear-attention group. Without groups the window and
/// state terms are 0 and every attention layer counts in `kv_bytes_per_token`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvLink {
    /// KV bytes of one token, all (full-attention) layers and heads (the same on both sides).
    pub kv_bytes_per_token: f64,
    /// Sliding-window layers moved as groups: the tokens a request keeps in them at most
    /// (its window and a block; 0 = no such group).
    pub window_tokens: u64,
    /// KV bytes per token of those sliding-window layers, all of them and their heads
    /// (moved for at most `window_tokens` of a request; 0 without such a group).
    pub window_bytes_per_token: f64,
    /// Linear-attention (Mamba / GDN) state bytes of one request, moved once per transfer.
    pub state_bytes: f64,
    pub gpus_per_node: u32,
    /// GPUs of one prefill / decode replica (TP x PP).
    pub prefill_gpus: u32,
    pub decode_gpus: u32,
    /// One GPU's bandwidth, one direction, in GB/s (10^9 bytes/s), and a transfer's fixed
    /// latency, within a node (NVLink) and across nodes (the network).
    pub nvlink_gbps: f64,
    pub nvlink_latency_s: f64,
    pub network_gbps: f64,
    pub network_latency_s: f64,
}

impl PdConfig {
    pub fn validate(&self, prefill_policy: &ReplicaPolicyConfig) -> Result<()> {
        if self.num_decode_replicas == 0 {
            return Err(Error::config(
                "cluster.decode.num_replicas",
                0,
                "a disaggregated cluster needs at least one decode replica",
            ));
        }
        if self.decode_num_stages == 0 {
            return Err(Error::config(
                "cluster.decode.num_pipeline_stages",
                0,
                "must be >= 1",
            ));
        }
        for (key, policy) in [
            ("replica.scheduler.policy", prefill_policy),
            ("cluster.decode.scheduler.policy", &self.decode_policy),
        ] {
            if !matches!(policy, ReplicaPolicyConfig::VllmV1(_)) {
                return Err(Error::config(
                    key,
                    policy.name(),
                    "prefill and decode pools run vllm_v1 replicas (their KV connectors)",
                ));
            }
        }
        if prefill_policy.block_size() != self.decode_policy.block_size() {
            return Err(Error::config(
                "cluster.decode.scheduler.vllm_v1.block_size",
                self.decode_policy.block_size(),
                format!(
                    "must equal the prefill pool's block size {} (blocks move as they are)",
                    prefill_policy.block_size()
                ),
            ));
        }
        if let (ReplicaPolicyConfig::VllmV1(p), ReplicaPolicyConfig::VllmV1(d)) =
            (prefill_policy, &self.decode_policy)
            && p.kv_group_block_sizes != d.kv_group_block_sizes
        {
            // Groups of different block sizes (Gemma 4): `block_size` is then the hash block
            // size, equal above; each group's blocks move as they are, so theirs agree too.
            return Err(Error::config(
                "cluster.decode.scheduler.vllm_v1.kv_group_block_sizes",
                format!("{:?}", d.kv_group_block_sizes),
                format!(
                    "must equal the prefill pool's KV groups' block sizes {:?} (each group's \
                     blocks move as they are)",
                    p.kv_group_block_sizes
                ),
            ));
        }
        self.decode_policy.validate()?;
        super::config::check_host_tier(
            "cluster.decode.kv_offload",
            &self.decode_policy,
            self.decode_host_link.as_ref(),
        )?;
        self.link.validate()
    }
}

impl KvLink {
    /// Bytes a transfer of `tokens` moves: every token's full-attention KV, the window
    /// group's at most `window_tokens`, and the request's state once.
    pub fn bytes(&self, tokens: u64) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        tokens as f64 * self.kv_bytes_per_token
            + tokens.min(self.window_tokens) as f64 * self.window_bytes_per_token
            + self.state_bytes
    }

    fn validate(&self) -> Result<()> {
        let positive = [
            (
                "cluster.kv_transfer.kv_bytes_per_token",
                self.kv_bytes_per_token,
            ),
            ("cluster.kv_transfer.nvlink_gbps", self.nvlink_gbps),
            ("cluster.kv_transfer.network_gbps", self.network_gbps),
        ];
        for (key, value) in positive {
            if !(value.is_finite() && value > 0.0) {
                return Err(Error::config(key, value, "must be a finite number > 0"));
            }
        }
        for (key, value) in [
            (
                "cluster.kv_transfer.window_bytes_per_token",
                self.window_bytes_per_token,
            ),
            ("cluster.kv_transfer.state_bytes", self.state_bytes),
            (
                "cluster.kv_transfer.nvlink_latency_s",
                self.nvlink_latency_s,
            ),
            (
                "cluster.kv_transfer.network_latency_s",
                self.network_latency_s,
            ),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(Error::config(key, value, "must be a finite number >= 0"));
            }
        }
        for (key, value) in [
            ("cluster.kv_transfer.gpus_per_node", self.gpus_per_node),
            ("cluster.kv_transfer.prefill_gpus", self.prefill_gpus),
            ("cluster.kv_transfer.decode_gpus", self.decode_gpus),
        ] {
            if value == 0 {
                return Err(Error::config(key, 0, "must be >= 1"));
            }
        }
        Ok(())
    }
}

/// One KV transfer, as scheduled on the links.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transfer {
    pub start: f64,
    pub end: f64,
}

/// The replicas' KV ports (prefill replicas first, then decode ones) and when each is free.
#[derive(Debug, Clone)]
pub struct Links {
    link: KvLink,
    num_prefill: u32,
    free_at: Vec<f64>,
}

impl Links {
    pub fn new(link: KvLink, num_prefill: u32, num_decode: u32) -> Self {
        Self {
            link,
            num_prefill,
            free_at: vec![0.0; (num_prefill + num_decode) as usize],
        }
    }

    /// The first GPU of replica `r` (global index: prefill replicas first) and its GPUs.
    fn gpus(&self, r: u32) -> (u64, u64) {
        let (p, d) = (self.link.prefill_gpus as u64, self.link.decode_gpus as u64);
        if r < self.num_prefill {
            (r as u64 * p, p)
        } else {
            (
                self.num_prefill as u64 * p + (r - self.num_prefill) as u64 * d,
                d,
            )
        }
    }

    /// The node replica `r` sits on, or `None` if it spans nodes.
    fn node(&self, r: u32) -> Option<u64> {
        let per_node = self.link.gpus_per_node as u64;
        let (first, n) = self.gpus(r);
        let node = first / per_node;
        ((first + n - 1) / per_node == node).then_some(node)
    }

    /// Seconds `tokens` of KV take from replica `src` to `dst`, once both ports are free.
    pub fn duration(&self, src: u32, dst: u32, tokens: u64) -> f64 {
        let l = &self.link;
        let same_node = matches!((self.node(src), self.node(dst)), (Some(a), Some(b)) if a == b);
        let (per_gpu_gbps, latency) = if same_node {
            (l.nvlink_gbps, l.nvlink_latency_s)
        } else {
            (l.network_gbps, l.network_latency_s)
        };
        let lanes = self.gpus(src).1.min(self.gpus(dst).1) as f64;
        latency + l.bytes(tokens) / (lanes * per_gpu_gbps * 1e9)
    }

    /// Schedules a transfer of `tokens` from `src` to `dst` asked for at `now`.
    pub fn transfer(&mut self, now: f64, src: u32, dst: u32, tokens: u64) -> Transfer {
        let (s, d) = (src as usize, dst as usize);
        let start = now.max(self.free_at[s]).max(self.free_at[d]);
        let end = start + self.duration(src, dst, tokens);
        self.free_at[s] = end;
        self.free_at[d] = end;
        Transfer { start, end }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link() -> KvLink {
        KvLink {
            kv_bytes_per_token: 1e6,
            window_tokens: 0,
            window_bytes_per_token: 0.0,
            state_bytes: 0.0,
            gpus_per_node: 4,
            prefill_gpus: 2,
            decode_gpus: 1,
            nvlink_gbps: 100.0,
            nvlink_latency_s: 1e-5,
            network_gbps: 10.0,
            network_latency_s: 1e-3,
        }
    }

    #[test]
    fn nvlink_within_a_node_the_network_across_and_the_narrower_side_sets_the_lanes() {
        // Prefill replicas on GPUs 0-1 and 2-3 (node 0); decode replicas on 4 and 5 (node 1).
        let mut links = Links::new(
            KvLink {
                gpus_per_node: 8,
                ..link()
            },
            2,
            2,
        );
        // 1000 tokens = 1 GB over one NVLink lane (decode has 1 GPU) at 100 GB/s.
        assert!((links.duration(0, 2, 1000) - (1e-5 + 0.01)).abs() < 1e-12);
        links = Links::new(link(), 2, 2);
        // Node 0 holds both prefill replicas, so decode replica 2 is on node 1: network.
        assert!((links.duration(1, 2, 1000) - (1e-3 + 0.1)).abs() < 1e-12);
    }

    #[test]
    fn hybrid_groups_move_the_window_and_one_state_beside_every_full_token() {
        let hybrid = KvLink {
            window_tokens: 144,
            window_bytes_per_token: 2e6,
            state_bytes: 5e7,
            ..link()
        };
        // 100 tokens: 100 x 1 MB + 100 x 2 MB (inside the window) + 50 MB of state.
        assert_eq!(hybrid.bytes(100), 1e8 + 2e8 + 5e7);
        // 1000 tokens: the window group moves only its 144 tokens.
        assert_eq!(hybrid.bytes(1000), 1e9 + 144.0 * 2e6 + 5e7);
        assert_eq!(
            hybrid.bytes(0),
            0.0,
            "nothing to load moves no state either"
        );
        let links = Links::new(hybrid, 1, 1);
        // One GPU a side, one node of 4: NVLink at 100 GB/s.
        let want = 1e-5 + hybrid.bytes(1000) / 100e9;
        assert!((links.duration(0, 1, 1000) - want).abs() < 1e-12);
        let bad = KvLink {
            state_bytes: -1.0,
            ..link()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("cluster.kv_transfer.state_bytes"), "{err}");
    }

    #[test]
    fn transfers_sharing_a_port_queue_behind_each_other() {
        let mut links = Links::new(link(), 2, 2);
        let a = links.transfer(0.0, 0, 2, 1000);
        let b = links.transfer(0.05, 1, 2, 1000);
        let c = links.transfer(0.05, 1, 3, 1000);
        assert_eq!(a.start, 0.0);
        assert_eq!(
            b.start, a.end,
            "decode replica 2's port is busy until a ends"
        );
        assert_eq!(c.start, b.end, "prefill replica 1's port is busy with b");
    }
}
