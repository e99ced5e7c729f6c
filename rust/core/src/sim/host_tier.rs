//! The host-memory KV tier in the simulator (`[replica.kv_offload]`): a `vllm_v1` replica's
//! block pool offloads evicted cached blocks to host memory (`crate::kv::host_tier`), and a
//! prefix hit that continues there parks its request in `WAITING_FOR_REMOTE_KVS` while the
//! blocks come back. This module prices those loads: each replica has one host link (its
//! GPUs' PCIe links, each loading its own shard of the layers and heads at once), and loads
//! take it one at a time in the order they begin.

use super::disagg::Transfer;
use crate::{Error, Result};

/// What one replica's host-to-GPU load costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLink {
    /// Seconds per token of KV: one GPU's share of a token's KV over its PCIe link.
    pub seconds_per_token: f64,
    /// Fixed cost of one load.
    pub latency_s: f64,
}

impl HostLink {
    /// Checks the figures (both pools take them from `[replica.kv_offload]`).
    pub fn validate(&self) -> Result<()> {
        if !(self.seconds_per_token.is_finite() && self.seconds_per_token >= 0.0) {
            return Err(Error::config(
                "replica.kv_offload.host_to_device_gbps",
                self.seconds_per_token,
                "must give a finite load time per token >= 0",
            ));
        }
        if !(self.latency_s.is_finite() && self.latency_s >= 0.0) {
            return Err(Error::config(
                "replica.kv_offload.latency_us",
                self.latency_s,
                "must be a finite number >= 0",
            ));
        }
        Ok(())
    }

    pub fn duration(&self, tokens: u64) -> f64 {
        self.latency_s + tokens as f64 * self.seconds_per_token
    }
}

/// Every replica's host link (`None`: a replica without a host tier) and when it is free.
#[derive(Debug, Clone)]
pub struct HostPorts {
    links: Vec<Option<HostLink>>,
    free_at: Vec<f64>,
}

impl HostPorts {
    pub fn new(links: Vec<Option<HostLink>>) -> Self {
        let free_at = vec![0.0; links.len()];
        Self { links, free_at }
    }

    /// Schedules a load of `tokens` into replica `r`, asked for at `now`.
    pub fn load(&mut self, now: f64, r: usize, tokens: u64) -> Result<Transfer> {
        let Some(link) = self.links[r] else {
            return Err(Error::Internal(format!(
                "replica {r} loaded blocks from a host tier it does not have"
            )));
        };
        let start = now.max(self.free_at[r]);
        let end = start + link.duration(tokens);
        self.free_at[r] = end;
        Ok(Transfer { start, end })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_into_one_replica_queue_and_other_replicas_load_at_once() {
        let link = HostLink {
            seconds_per_token: 1e-6,
            latency_s: 1e-5,
        };
        let mut ports = HostPorts::new(vec![Some(link), Some(link), None]);
        let a = ports.load(0.0, 0, 1000).unwrap();
        assert_eq!(a.start, 0.0);
        assert!((a.end - (1e-5 + 1e-3)).abs() < 1e-15);
        let b = ports.load(0.0005, 0, 1000).unwrap();
        assert_eq!(b.start, a.end, "replica 0's link is busy until a ends");
        assert_eq!(ports.load(0.0005, 1, 1000).unwrap().start, 0.0005);
        assert!(ports.load(0.0, 2, 10).is_err(), "replica 2 has no tier");
    }
}
