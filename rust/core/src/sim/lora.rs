//! Multi-LoRA serving on a `vllm_v1` replica, after vLLM's `LRUCacheWorkerLoRAManager`:
//! a replica holds `max_loras` adapters in GPU slots and `max_cpu_loras` in host memory,
//! each an LRU. A batch whose adapter is not in a GPU slot copies it from host memory
//! (reading it from disk first when the host cache lacks it) before it runs, and that copy
//! time is added to each of the batch's stages (every pipeline stage loads its own layers'
//! share of the adapter, in parallel).
//!
//! Invariant: the adapters of a batch are all resident after [`AdapterCache::load`], since
//! the step scheduler never puts more than `max_loras` distinct adapters in a batch.

use super::arena::Requests;
use super::exec::StageTime;
use super::request::ReqIdx;
use crate::{Error, Result};

/// `[replica.lora]` as the core needs it (Python derives the bytes from the model).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// GPU slots (vLLM's `max_loras`); the step scheduler's `max_loras` gate is the same.
    pub max_loras: u32,
    /// Adapters cached in host memory (vLLM's `max_cpu_loras`), >= `max_loras`.
    pub max_cpu_loras: u32,
    /// Bytes one GPU of one pipeline stage copies for one adapter.
    pub adapter_bytes: f64,
    /// Host-to-GPU copy bandwidth (PCIe), bytes per second.
    pub host_to_device_bytes_per_s: f64,
    /// Disk-to-host read bandwidth, bytes per second.
    pub disk_bytes_per_s: f64,
}

impl LoraConfig {
    pub fn validate(&self) -> Result<()> {
        if self.max_loras == 0 {
            return Err(Error::config("replica.lora.max_loras", 0, "must be >= 1"));
        }
        if self.max_cpu_loras < self.max_loras {
            return Err(Error::config(
                "replica.lora.max_cpu_loras",
                self.max_cpu_loras,
                format!("must be >= max_loras = {}", self.max_loras),
            ));
        }
        let rates = [
            ("replica.lora.adapter_bytes", self.adapter_bytes, false),
            (
                "replica.lora.host_to_device_gbps",
                self.host_to_device_bytes_per_s,
                true,
            ),
            ("replica.lora.disk_gbps", self.disk_bytes_per_s, true),
        ];
        for (key, value, positive) in rates {
            let ok = value.is_finite() && if positive { value > 0.0 } else { value >= 0.0 };
            if !ok {
                let bound = if positive { "> 0" } else { ">= 0" };
                return Err(Error::config(
                    key,
                    value,
                    format!("must be a finite number {bound}"),
                ));
            }
        }
        Ok(())
    }
}

/// What LoRA adds to a batch: the tokens through adapted linears, the distinct adapters
/// whose weights the kernels read, and the adapter loads the batch waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoraShape {
    /// Tokens of requests that name an adapter (the punica kernels skip base-model rows).
    pub num_lora_tokens: u64,
    /// Distinct adapters in the batch (<= max_loras).
    pub num_adapters: u32,
    /// Adapters copied into a GPU slot for this batch.
    pub num_loads: u32,
    /// Of those, adapters first read from disk (not in the host cache).
    pub num_disk_loads: u32,
    /// Seconds each stage waits for the loads before it runs.
    pub load_s: f64,
}

/// Least recently used first; capacities are a handful of adapters, so a vector is enough.
#[derive(Debug, Clone, Default)]
struct Lru {
    capacity: usize,
    order: Vec<u64>,
}

impl Lru {
    /// Marks `id` most recently used; false if it was not resident.
    fn touch(&mut self, id: u64) -> bool {
        match self.order.iter().position(|&a| a == id) {
            Some(at) => {
                self.order.remove(at);
                self.order.push(id);
                true
            }
            None => false,
        }
    }

    /// Makes `id` resident and most recent, evicting the least recently used if full.
    fn insert(&mut self, id: u64) {
        if self.order.len() >= self.capacity {
            self.order.remove(0);
        }
        self.order.push(id);
    }
}

/// One replica's adapters: GPU slots and the host cache.
#[derive(Debug, Clone)]
pub struct AdapterCache {
    config: LoraConfig,
    gpu: Lru,
    host: Lru,
    /// Distinct adapters of the batch being formed (reused).
    batch: Vec<u64>,
}

impl AdapterCache {
    pub fn new(config: LoraConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            gpu: Lru {
                capacity: config.max_loras as usize,
                order: Vec::new(),
            },
            host: Lru {
                capacity: config.max_cpu_loras as usize,
                order: Vec::new(),
            },
            config,
            batch: Vec::new(),
        })
    }

    /// The LoRA shape of a batch of `num_tokens[i]` tokens of `ids[i]`, loading into GPU
    /// slots the adapters that are not there.
    pub fn load(
        &mut self,
        ids: &[ReqIdx],
        num_tokens: &[u32],
        requests: &Requests,
    ) -> Result<LoraShape> {
        let mut shape = LoraShape::default();
        self.batch.clear();
        for (&idx, &n) in ids.iter().zip(num_tokens) {
            if let Some(lora) = requests.get(idx).lora_id {
                shape.num_lora_tokens += n as u64;
                if !self.batch.contains(&lora) {
                    self.batch.push(lora);
                }
            }
        }
        if self.batch.len() > self.gpu.capacity {
            return Err(Error::Internal(format!(
                "a vllm_v1 batch holds {} adapters, more than replica.lora.max_loras = {}",
                self.batch.len(),
                self.gpu.capacity
            )));
        }
        shape.num_adapters = self.batch.len() as u32;
        // Touch the resident ones first, so loading a missing one never evicts one of
        // this batch's adapters (the batch fits in the slots). Using an adapter makes it
        // recent in both caches, as vLLM's `add_adapter` does.
        let mut missing = Vec::new();
        for &lora in &self.batch {
            let in_host = self.host.touch(lora);
            if !self.gpu.touch(lora) {
                missing.push((lora, in_host));
            }
        }
        let c = &self.config;
        for (lora, in_host) in missing {
            if !in_host {
                self.host.insert(lora);
                shape.num_disk_loads += 1;
                shape.load_s += c.adapter_bytes / c.disk_bytes_per_s;
            }
            self.gpu.insert(lora);
            shape.num_loads += 1;
            shape.load_s += c.adapter_bytes / c.host_to_device_bytes_per_s;
        }
        Ok(shape)
    }
}

/// A stage's time with the batch's adapter loads before it.
pub fn with_load(time: StageTime, shape: &LoraShape) -> StageTime {
    StageTime {
        total_s: time.total_s + shape.load_s,
        model_s: time.model_s,
    }
}

/// Refuses a request naming an adapter on a replica without `[replica.lora]`.
pub fn check_request(config: Option<&LoraConfig>, id: u64, lora_id: Option<u64>) -> Result<()> {
    match (config, lora_id) {
        (None, Some(lora)) => Err(Error::input(
            "lora_id",
            lora,
            format!(
                "request {id} names a LoRA adapter, and replica.lora is not set (LoRA \
                 serving is simulated on vllm_v1 replicas with a [replica.lora] section)"
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::request::SimRequest;

    fn cache(max_loras: u32, max_cpu_loras: u32) -> AdapterCache {
        AdapterCache::new(LoraConfig {
            max_loras,
            max_cpu_loras,
            adapter_bytes: 1000.0,
            host_to_device_bytes_per_s: 1e6,
            disk_bytes_per_s: 1e5,
        })
        .unwrap()
    }

    fn requests(loras: &[Option<u64>]) -> (Requests, Vec<ReqIdx>) {
        let mut requests = Requests::default();
        let ids = loras
            .iter()
            .enumerate()
            .map(|(i, &lora)| {
                let mut r = SimRequest::new(i as u64, 0.0, 4, 2, vec![]);
                r.lora_id = lora;
                requests.insert(r)
            })
            .collect();
        (requests, ids)
    }

    #[test]
    fn first_use_reads_disk_and_copies_then_hits() {
        let mut c = cache(1, 2);
        let (reqs, ids) = requests(&[Some(7), None, Some(7)]);
        let shape = c.load(&ids, &[3, 5, 2], &reqs).unwrap();
        assert_eq!((shape.num_lora_tokens, shape.num_adapters), (5, 1));
        assert_eq!((shape.num_loads, shape.num_disk_loads), (1, 1));
        // 1000 B at 1e5 B/s from disk, then 1000 B at 1e6 B/s over PCIe.
        assert!((shape.load_s - (0.01 + 0.001)).abs() < 1e-15);
        let again = c.load(&ids, &[1, 1, 1], &reqs).unwrap();
        assert_eq!((again.num_loads, again.load_s), (0, 0.0));
    }

    #[test]
    fn an_evicted_adapter_in_the_host_cache_pays_only_the_copy() {
        let mut c = cache(1, 2);
        let (reqs, ids) = requests(&[Some(1), Some(2)]);
        c.load(&ids[..1], &[1], &reqs).unwrap();
        c.load(&ids[1..], &[1], &reqs).unwrap(); // evicts 1 from the GPU slot
        let back = c.load(&ids[..1], &[1], &reqs).unwrap();
        assert_eq!((back.num_loads, back.num_disk_loads), (1, 0));
        assert!((back.load_s - 0.001).abs() < 1e-15);
    }

    #[test]
    fn an_adapter_in_use_stays_in_the_host_cache() {
        // One slot, two host entries: 1 is used again while 2 and 3 pass through, so the
        // host cache evicts 2, not 1, and 1 comes back without a disk read.
        let mut c = cache(1, 2);
        let (reqs, ids) = requests(&[Some(1), Some(2), Some(3)]);
        c.load(&ids[..1], &[1], &reqs).unwrap();
        c.load(&ids[1..2], &[1], &reqs).unwrap();
        c.load(&ids[..1], &[1], &reqs).unwrap(); // 1 recent again in both caches
        c.load(&ids[2..], &[1], &reqs).unwrap(); // host evicts 2
        let back = c.load(&ids[..1], &[1], &reqs).unwrap();
        assert_eq!((back.num_loads, back.num_disk_loads), (1, 0));
        let two = c.load(&ids[1..2], &[1], &reqs).unwrap();
        assert_eq!(two.num_disk_loads, 1);
    }

    #[test]
    fn a_batch_over_the_slots_is_refused() {
        let mut c = cache(1, 1);
        let (reqs, ids) = requests(&[Some(1), Some(2)]);
        assert!(c.load(&ids, &[1, 1], &reqs).is_err());
    }

    #[test]
    fn bad_configs_name_their_key() {
        let base = LoraConfig {
            max_loras: 2,
            max_cpu_loras: 2,
            adapter_bytes: 1.0,
            host_to_device_bytes_per_s: 1.0,
            disk_bytes_per_s: 1.0,
        };
        let cases = [
            (
                LoraConfig {
                    max_loras: 0,
                    ..base.clone()
                },
                "replica.lora.max_loras",
            ),
            (
                LoraConfig {
                    max_cpu_loras: 1,
                    ..base.clone()
                },
                "replica.lora.max_cpu_loras",
            ),
            (
                LoraConfig {
                    disk_bytes_per_s: 0.0,
                    ..base.clone()
                },
                "replica.lora.disk_gbps",
            ),
        ];
        for (config, key) in cases {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
    }
}

/// Whole runs: the step scheduler's gate and the adapter loads together.
#[cfg(test)]
mod scenario {
    use super::LoraConfig;
    use crate::Result;
    use crate::sched::SchedulerConfig;
    use crate::sim::batch::BatchShape;
    use crate::sim::exec::{ExecModel, LinearModel, StageTime};
    use crate::sim::{
        ArrivingRequest, ReplicaPolicyConfig, RequestSource, SimConfig, SimOutput, Simulator,
        VidurKind,
    };

    struct Source(Option<Vec<ArrivingRequest>>);
    impl RequestSource for Source {
        fn next_chunk(&mut self) -> Result<Option<Vec<ArrivingRequest>>> {
            Ok(self.0.take())
        }
    }

    /// One second per batch stage, whatever it holds.
    struct OneSecond;
    impl ExecModel for OneSecond {
        fn stage_time(&mut self, _: &BatchShape, _: u32, _: u32) -> Result<StageTime> {
            Ok(StageTime {
                total_s: 1.0,
                model_s: 1.0,
            })
        }
    }

    fn lora() -> LoraConfig {
        // 1000 B per adapter: 1 s from disk, 0.1 s over PCIe.
        LoraConfig {
            max_loras: 1,
            max_cpu_loras: 2,
            adapter_bytes: 1000.0,
            host_to_device_bytes_per_s: 1e4,
            disk_bytes_per_s: 1e3,
        }
    }

    fn config(policy: ReplicaPolicyConfig, lora: Option<LoraConfig>) -> SimConfig {
        let mut config = crate::sim::tests::config(policy, 1, LinearModel::default());
        config.lora = lora;
        config
    }

    fn v1(max_loras: usize) -> ReplicaPolicyConfig {
        ReplicaPolicyConfig::VllmV1(SchedulerConfig {
            block_size: 4,
            num_blocks: 64,
            max_model_len: 64,
            max_loras,
            ..SchedulerConfig::without_vllm_reservations()
        })
    }

    fn req(lora_id: Option<u64>) -> ArrivingRequest {
        ArrivingRequest {
            lora_id,
            ..ArrivingRequest::new(0.0, 4, 2)
        }
    }

    fn run(config: SimConfig, requests: Vec<ArrivingRequest>) -> Result<SimOutput> {
        Simulator::new(config, &mut OneSecond)?.run(&mut Source(Some(requests)))
    }

    #[test]
    fn two_adapters_one_slot_never_share_a_batch_and_first_uses_pay_the_load() {
        let out = run(
            config(v1(1), Some(lora())),
            vec![req(Some(1)), req(Some(2))],
        )
        .unwrap();
        // A (adapter 1): prefill batch 1 s + 1 s disk + 0.1 s copy = 2.1, decode to 3.1.
        // B (adapter 2) waits for A's slot: prefill 3.1 + 2.1 = 5.2, decode to 6.2.
        let t = &out.requests;
        let by_id = |id: u64| t.request_id.iter().position(|&r| r == id).unwrap();
        let (a, b) = (by_id(0), by_id(1));
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9;
        assert!(close(t.first_token_at[a], 2.1), "{}", t.first_token_at[a]);
        assert!(close(t.completed_at[a], 3.1));
        assert!(close(t.first_token_at[b], 5.2), "{}", t.first_token_at[b]);
        assert!(close(t.completed_at[b], 6.2));
        let stages = out.stages.unwrap();
        assert!(stages.num_requests.iter().all(|&n| n == 1), "never mixed");
        assert_eq!(stages.duration, vec![2.1, 1.0, 2.1, 1.0]);
        assert_eq!(out.replicas.lora_loads, vec![2]);
        assert_eq!(out.replicas.lora_disk_loads, vec![2]);
        assert!(close(out.replicas.lora_load_s[0], 2.2));
    }

    #[test]
    fn without_lora_requests_nothing_changes() {
        let with = run(config(v1(1), Some(lora())), vec![req(None), req(None)]).unwrap();
        let without = run(config(v1(0), None), vec![req(None), req(None)]).unwrap();
        assert_eq!(with.requests.completed_at, without.requests.completed_at);
        assert_eq!(with.replicas.lora_loads, vec![0]);
    }

    #[test]
    fn refusals_name_their_key() {
        let cases = [
            // A request naming an adapter, no [replica.lora].
            (config(v1(0), None), Some(3), "lora_id"),
            // GPU slots and the scheduler's gate disagree.
            (
                config(v1(2), Some(lora())),
                None,
                "replica.scheduler.vllm_v1.max_loras",
            ),
            // Another policy.
            (
                config(
                    ReplicaPolicyConfig::Vidur(VidurKind::Vllm, crate::sim::tests::limits()),
                    Some(lora()),
                ),
                None,
                "replica.lora",
            ),
        ];
        for (config, lora_id, key) in cases {
            let err = run(config, vec![req(lora_id)]).unwrap_err().to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
    }

    #[test]
    fn the_linear_model_refuses_lora_batches() {
        let mut linear = LinearModel::default();
        let err = Simulator::new(config(v1(1), Some(lora())), &mut linear)
            .unwrap()
            .run(&mut Source(Some(vec![req(Some(1))])))
            .unwrap_err()
            .to_string();
        assert!(err.contains("execution.model"), "{err}");
    }
}
