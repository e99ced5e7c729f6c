//! The typed config objects `_core.simulate` takes (`SimConfig`, `ReplicaSpec`,
//! `LinearModel`): each converts its arguments and has the core check them as it is built.

use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokenyard_core::sim::spec::{Acceptance, SpecConfig, SpecMethod};
use tokenyard_core::sim::{
    GlobalPolicy, HostLink, KvLink, KvOffload, LinearModel, LoraConfig, OverLength, PdConfig,
    ReplicaPolicyConfig, ReplicaPolicyEntry, RequestLimit, RestartMode, SglangLimits, SimConfig,
    VidurKind, VidurLimits,
};

use crate::errors::{OrRaise, input_error};
use crate::sched_config::core_config;

/// One replica policy with its limits, every size already derived.
#[pyclass(name = "ReplicaSpec", module = "tokenyard._core", frozen)]
pub(crate) struct PyReplicaSpec {
    inner: ReplicaPolicyConfig,
}

#[pymethods]
impl PyReplicaSpec {
    /// One of Vidur's five schedulers.
    #[staticmethod]
    #[pyo3(signature = (policy, *, num_blocks, block_size, watermark_blocks, batch_size_cap,
        max_batch_size, num_stages, max_blocks_per_sequence, max_tokens_in_batch, chunk_size,
        max_waiting_iters, restart))]
    #[allow(clippy::too_many_arguments)]
    fn vidur(
        py: Python<'_>,
        policy: &str,
        num_blocks: u32,
        block_size: u32,
        watermark_blocks: u32,
        batch_size_cap: u32,
        max_batch_size: u32,
        num_stages: u32,
        max_blocks_per_sequence: u32,
        max_tokens_in_batch: u32,
        chunk_size: u32,
        max_waiting_iters: u32,
        restart: &str,
    ) -> PyResult<Self> {
        let kind = match ReplicaPolicyEntry::find(policy).or_raise(py)?.name {
            "vllm" => VidurKind::Vllm,
            "sarathi" => VidurKind::Sarathi,
            "orca" => VidurKind::Orca,
            "lightllm" => VidurKind::LightLlm,
            "faster_transformer" => VidurKind::FasterTransformer,
            other => {
                return Err(input_error(py, "policy", other, "is not one of Vidur's"));
            }
        };
        let limits = VidurLimits {
            num_blocks,
            block_size,
            watermark_blocks,
            batch_size_cap,
            max_batch_size,
            num_stages,
            max_blocks_per_sequence,
            max_tokens_in_batch,
            chunk_size,
            max_waiting_iters,
            restart: RestartMode::parse(restart).or_raise(py)?,
        };
        Self::checked(py, ReplicaPolicyConfig::Vidur(kind, limits))
    }

    /// vLLM V1's step scheduler, configured by a `tokenyard.sched.SchedulerConfig`.
    #[staticmethod]
    fn vllm_v1(config: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (core, _async) = core_config(config)?;
        Self::checked(config.py(), ReplicaPolicyConfig::VllmV1(core))
    }

    /// Mini-SGLang's scheduler.
    #[staticmethod]
    #[pyo3(signature = (*, num_pages, page_size, max_running_requests, max_extend_tokens,
        graph_batch_sizes))]
    fn sglang(
        py: Python<'_>,
        num_pages: u32,
        page_size: u32,
        max_running_requests: u32,
        max_extend_tokens: u32,
        graph_batch_sizes: Vec<u32>,
    ) -> PyResult<Self> {
        Self::checked(
            py,
            ReplicaPolicyConfig::Sglang(SglangLimits {
                num_pages,
                page_size,
                max_running_requests,
                max_extend_tokens,
                graph_batch_sizes,
            }),
        )
    }

    /// Replica plugins given to `simulate(replica_plugins=...)`.
    #[staticmethod]
    fn plugin(block_size: u32) -> Self {
        Self {
            inner: ReplicaPolicyConfig::External { block_size },
        }
    }

    #[getter]
    fn policy(&self) -> &'static str {
        self.inner.name()
    }

    /// Why a request of these lengths can never run on one replica (naming the limiting
    /// setting), or `None`.
    fn request_limit(&self, num_prefill_tokens: u32, num_decode_tokens: u32) -> Option<String> {
        self.inner
            .request_limit(num_prefill_tokens, num_decode_tokens)
    }

    fn __repr__(&self) -> String {
        format!("ReplicaSpec({:?})", self.inner)
    }
}

impl PyReplicaSpec {
    /// Builds one replica once, so a bad limit fails here, naming its field.
    fn checked(py: Python<'_>, inner: ReplicaPolicyConfig) -> PyResult<Self> {
        inner.validate().or_raise(py)?;
        Ok(Self { inner })
    }
}

/// The linear execution-time model's coefficients.
#[pyclass(name = "LinearModel", module = "tokenyard._core", frozen)]
#[derive(Clone)]
pub(crate) struct PyLinearModel {
    inner: LinearModel,
}

#[pymethods]
impl PyLinearModel {
    #[new]
    #[pyo3(signature = (*, constant_s, per_prefill_token_s, per_decode_token_s,
        per_decode_context_token_s, per_prefill_context_token_s, cpu_overhead_s))]
    fn new(
        py: Python<'_>,
        constant_s: f64,
        per_prefill_token_s: f64,
        per_decode_token_s: f64,
        per_decode_context_token_s: f64,
        per_prefill_context_token_s: f64,
        cpu_overhead_s: f64,
    ) -> PyResult<Self> {
        let inner = LinearModel {
            constant_s,
            per_prefill_token_s,
            per_decode_token_s,
            per_decode_context_token_s,
            per_prefill_context_token_s,
            cpu_overhead_s,
        };
        inner.validate().or_raise(py)?;
        Ok(Self { inner })
    }
}

/// Speculative decoding of `vllm_v1` replicas; exactly one acceptance form is given.
#[pyclass(name = "SpeculativeConfig", module = "tokenyard._core", frozen)]
#[derive(Clone)]
pub(crate) struct PySpeculativeConfig {
    inner: SpecConfig,
}

#[pymethods]
impl PySpeculativeConfig {
    #[new]
    #[pyo3(signature = (*, method, num_speculative_tokens, acceptance_rate=None,
        acceptance_rates=None, accepted_distribution=None))]
    fn new(
        py: Python<'_>,
        method: &str,
        num_speculative_tokens: u32,
        acceptance_rate: Option<f64>,
        acceptance_rates: Option<Vec<f64>>,
        accepted_distribution: Option<Vec<f64>>,
    ) -> PyResult<Self> {
        let acceptance = match (acceptance_rate, acceptance_rates, accepted_distribution) {
            (Some(alpha), None, None) => Acceptance::Rate(alpha),
            (None, Some(rates), None) => Acceptance::PerPosition(rates),
            (None, None, Some(probs)) => Acceptance::Distribution(probs),
            _ => {
                return Err(crate::errors::config_error(
                    py,
                    "replica.speculative.acceptance_rate",
                    "several or none",
                    "give exactly one of acceptance_rate, acceptance_rates, \
                     accepted_distribution",
                ));
            }
        };
        let inner = SpecConfig {
            method: SpecMethod::parse(method).or_raise(py)?,
            num_speculative_tokens,
            acceptance,
        };
        inner.validate().or_raise(py)?;
        Ok(Self { inner })
    }

    #[getter]
    fn method(&self) -> &'static str {
        self.inner.method.name()
    }
}

/// A whole simulation's config, checked by the core when it is built.
#[pyclass(name = "SimConfig", module = "tokenyard._core", frozen)]
pub(crate) struct PySimConfig {
    pub(crate) inner: SimConfig,
}

#[pymethods]
impl PySimConfig {
    #[new]
    #[pyo3(signature = (*, num_replicas, num_stages, global_policy, balance, replica, linear,
        seed, hash_block_size, sample_interval_s, record_stages, over_length, concurrency=None,
        lora=None, speculative=None, decode=None, kv_offload=None,
        coalesce_decode_steps=true, request_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_replicas: u32,
        num_stages: u32,
        global_policy: &str,
        balance: f64,
        replica: &PyReplicaSpec,
        linear: &PyLinearModel,
        seed: u64,
        hash_block_size: u32,
        sample_interval_s: f64,
        record_stages: bool,
        over_length: &str,
        concurrency: Option<u32>,
        lora: Option<&Bound<'_, PyDict>>,
        speculative: Option<&PySpeculativeConfig>,
        decode: Option<&Bound<'_, PyDict>>,
        kv_offload: Option<&Bound<'_, PyDict>>,
        coalesce_decode_steps: bool,
        request_limit: Option<(u64, String)>,
    ) -> PyResult<Self> {
        let lora = lora.map(lora_config).transpose()?;
        let pd = decode.map(pd_config).transpose()?;
        let kv_offload = kv_offload
            .map(|d| -> PyResult<KvOffload> {
                Ok(KvOffload {
                    link: host_link(d)?,
                    host_hit_weight: dict_item(d, "kv_offload", "host_hit_weight")?.extract()?,
                })
            })
            .transpose()?;
        let inner = SimConfig {
            num_replicas,
            num_stages,
            global_policy: GlobalPolicy::from_name(global_policy, balance).or_raise(py)?,
            replica_policy: replica.inner.clone(),
            exec: linear.inner,
            seed,
            hash_block_size,
            sample_interval_s,
            record_stages,
            over_length: OverLength::parse(over_length).or_raise(py)?,
            concurrency,
            lora,
            speculative: speculative.map(|s| s.inner.clone()),
            pd,
            kv_offload,
            coalesce_decode_steps,
            request_limit: request_limit.map(|(max_tokens, setting)| RequestLimit {
                max_tokens,
                setting,
            }),
        };
        inner.validate().or_raise(py)?;
        Ok(Self { inner })
    }

    #[getter]
    fn replica_policy(&self) -> &'static str {
        self.inner.replica_policy.name()
    }
}

/// The decode pool as the core takes it: `{num_replicas, num_stages, replica (a
/// ReplicaSpec), global_policy, balance, link: {kv_bytes_per_token, gpus_per_node,
/// prefill_gpus, decode_gpus, nvlink_gbps, nvlink_latency_s, network_gbps,
/// network_latency_s; optional window_tokens, window_bytes_per_token, state_bytes}}` (checked by `SimConfig::validate`).
fn pd_config(d: &Bound<'_, PyDict>) -> PyResult<PdConfig> {
    let py = d.py();
    fn get<'py>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        d.get_item(key)?
            .ok_or_else(|| PyKeyError::new_err(format!("decode: missing {key:?}")))
    }
    let link = get(d, "link")?;
    let link = link.cast::<PyDict>()?;
    let policy: String = get(d, "global_policy")?.extract()?;
    let balance: f64 = get(d, "balance")?.extract()?;
    let replica = get(d, "replica")?;
    let decode_host_link = match d.get_item("host_link")? {
        Some(link) if !link.is_none() => Some(host_link(link.cast::<PyDict>()?)?),
        _ => None,
    };
    Ok(PdConfig {
        num_decode_replicas: get(d, "num_replicas")?.extract()?,
        decode_num_stages: get(d, "num_stages")?.extract()?,
        decode_policy: replica.cast::<PyReplicaSpec>()?.get().inner.clone(),
        decode_router: GlobalPolicy::from_name(&policy, balance).or_raise(py)?,
        link: KvLink {
            kv_bytes_per_token: get(link, "kv_bytes_per_token")?.extract()?,
            // Hybrid KV groups' terms (vLLM's hybrid manager with a connector); absent: 0.
            window_tokens: match link.get_item("window_tokens")? {
                Some(v) => v.extract()?,
                None => 0,
            },
            window_bytes_per_token: match link.get_item("window_bytes_per_token")? {
                Some(v) => v.extract()?,
                None => 0.0,
            },
            state_bytes: match link.get_item("state_bytes")? {
                Some(v) => v.extract()?,
                None => 0.0,
            },
            gpus_per_node: get(link, "gpus_per_node")?.extract()?,
            prefill_gpus: get(link, "prefill_gpus")?.extract()?,
            decode_gpus: get(link, "decode_gpus")?.extract()?,
            nvlink_gbps: get(link, "nvlink_gbps")?.extract()?,
            nvlink_latency_s: get(link, "nvlink_latency_s")?.extract()?,
            network_gbps: get(link, "network_gbps")?.extract()?,
            network_latency_s: get(link, "network_latency_s")?.extract()?,
        },
        decode_host_link,
    })
}

/// `d[key]`, or a `KeyError` naming the mapping `what`.
fn dict_item<'py>(d: &Bound<'py, PyDict>, what: &str, key: &str) -> PyResult<Bound<'py, PyAny>> {
    d.get_item(key)?
        .ok_or_else(|| PyKeyError::new_err(format!("{what}: missing {key:?}")))
}

/// A host tier's link as the core takes it: `{seconds_per_token, latency_s}`.
fn host_link(d: &Bound<'_, PyDict>) -> PyResult<HostLink> {
    Ok(HostLink {
        seconds_per_token: dict_item(d, "kv_offload", "seconds_per_token")?.extract()?,
        latency_s: dict_item(d, "kv_offload", "latency_s")?.extract()?,
    })
}

/// `[replica.lora]` as the core takes it: `{max_loras, max_cpu_loras, adapter_bytes,
/// host_to_device_bytes_per_s, disk_bytes_per_s}` (checked by `SimConfig::validate`).
fn lora_config(d: &Bound<'_, PyDict>) -> PyResult<LoraConfig> {
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(key)?
            .ok_or_else(|| PyKeyError::new_err(format!("lora: missing {key:?}")))
    };
    Ok(LoraConfig {
        max_loras: get("max_loras")?.extract()?,
        max_cpu_loras: get("max_cpu_loras")?.extract()?,
        adapter_bytes: get("adapter_bytes")?.extract()?,
        host_to_device_bytes_per_s: get("host_to_device_bytes_per_s")?.extract()?,
        disk_bytes_per_s: get("disk_bytes_per_s")?.extract()?,
    })
}
