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
                return Err(Error::config(key, value, "must be a finite number > 0"));
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
            return Err(Error::Plugin(format!(
                "a vllm_v1 batch holds {} adapters, more than replica.lora.max_loras = {}",
                self.batch.len(),
                self.gpu.capacity
            )));
        }
        shape.num_adapters = self.batch.len() as u32;
        // Touch the resident ones first, so loading a missing one never evicts one of
        // this batch's adapters (the batch fits in the slots).
        let mut missing = Vec::new();
        for &lora in &self.batch {
            if !self.gpu.touch(lora) {
                missing.push(lora);
            }
        }
        let c = &self.config;
        for lora in missing {
            if !self.host.touch(lora) {
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
