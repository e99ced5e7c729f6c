//! `tokenyard._core.simulate` and the typed config objects it takes (`SimConfig`,
//! `ReplicaSpec`, `LinearModel`), built and checked by `tokenyard.simulate`. Conversions
//! only: the policy registry, the plugin adapter and every check live in the core. The GIL
//! is released while the event loop runs; callbacks into Python take it back.

use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tokenyard_core::sched::PolicyPlugin;
use tokenyard_core::sim::exec::Repeated;
use tokenyard_core::sim::{
    ArrivingRequest, BatchShape, ExecModel, GapHistogram, GlobalPolicy, LinearModel, OpModel,
    OverLength, PluginReplica, REPLICA_POLICIES, ReplicaLoad, ReplicaPluginHost, ReplicaPolicy,
    ReplicaPolicyConfig, ReplicaPolicyEntry, RequestSource, RestartMode, RouteInfo, RoutePlugin,
    SglangLimits, SimConfig, SimOutput, SimRequest, Simulator, StageTime, VidurKind, VidurLimits,
};
use tokenyard_core::{Error, Result};

use crate::errors::{ErrorSlot, OrRaise, input_error};
use crate::exec::PyCompiledOps;
use crate::plugin::PyPlugin;
use crate::sched::core_config;

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PySimRequestView>()?;
    module.add_class::<PyReplicaSpec>()?;
    module.add_class::<PyLinearModel>()?;
    module.add_class::<PySimConfig>()?;
    let registry = PyDict::new(module.py());
    for entry in REPLICA_POLICIES {
        let info = PyDict::new(module.py());
        info.set_item("section", entry.section)?;
        info.set_item("pipeline_parallel", entry.pipeline_parallel)?;
        info.set_item("summary", entry.summary)?;
        registry.set_item(entry.name, info)?;
    }
    module.add("REPLICA_POLICIES", registry)?;
    module.add("GLOBAL_POLICIES", GlobalPolicy::NAMES.to_vec())?;
    module.add_function(wrap_pyfunction!(simulate, module)?)
}

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

/// A whole simulation's config, checked by the core when it is built.
#[pyclass(name = "SimConfig", module = "tokenyard._core", frozen)]
pub(crate) struct PySimConfig {
    inner: SimConfig,
}

#[pymethods]
impl PySimConfig {
    #[new]
    #[pyo3(signature = (*, num_replicas, num_stages, global_policy, balance, replica, linear,
        seed, hash_block_size, sample_interval_s, record_stages, over_length))]
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
    ) -> PyResult<Self> {
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
        };
        inner.validate().or_raise(py)?;
        Ok(Self { inner })
    }

    #[getter]
    fn replica_policy(&self) -> &'static str {
        self.inner.replica_policy.name()
    }
}

/// Pulls `RequestChunk`s (see `tokenyard.workload`) from a Python iterator.
struct PySource {
    chunks: Py<PyAny>,
    progress: Option<Py<PyAny>>,
    error: ErrorSlot,
}

fn convert_chunk(chunk: &Bound<'_, PyAny>) -> PyResult<Vec<ArrivingRequest>> {
    let arrived: PyReadonlyArray1<'_, f64> = chunk.getattr("arrived_at")?.extract()?;
    let prefill: PyReadonlyArray1<'_, u32> = chunk.getattr("num_prefill_tokens")?.extract()?;
    let decode: PyReadonlyArray1<'_, u32> = chunk.getattr("num_decode_tokens")?.extract()?;
    let (arrived, prefill, decode) = (arrived.as_slice()?, prefill.as_slice()?, decode.as_slice()?);
    let offsets = chunk.getattr("hash_offsets")?;
    let hashes: Option<(Vec<u64>, Vec<u64>)> = if offsets.is_none() {
        None
    } else {
        let offsets: PyReadonlyArray1<'_, u64> = offsets.extract()?;
        let ids: PyReadonlyArray1<'_, u64> = chunk.getattr("hash_ids")?.extract()?;
        Some((offsets.as_slice()?.to_vec(), ids.as_slice()?.to_vec()))
    };
    let n = arrived.len();
    let offsets_ok = hashes.as_ref().is_none_or(|(off, ids)| {
        off.len() == n + 1
            && off.windows(2).all(|w| w[0] <= w[1])
            && off.last().is_none_or(|&end| end as usize <= ids.len())
    });
    if prefill.len() != n || decode.len() != n || !offsets_ok {
        return Err(input_error(
            chunk.py(),
            "chunk",
            format!("{n}/{}/{}", prefill.len(), decode.len()),
            "arrived_at, num_prefill_tokens, num_decode_tokens and hash_offsets do not line up",
        ));
    }
    Ok((0..n)
        .map(|i| ArrivingRequest {
            arrived_at: arrived[i],
            num_prefill_tokens: prefill[i],
            num_decode_tokens: decode[i],
            hash_ids: hashes.as_ref().map_or_else(Vec::new, |(off, ids)| {
                ids[off[i] as usize..off[i + 1] as usize].to_vec()
            }),
        })
        .collect())
}

impl RequestSource for PySource {
    fn next_chunk(&mut self) -> Result<Option<Vec<ArrivingRequest>>> {
        Python::attach(|py| {
            let chunks = self.chunks.bind(py);
            match chunks.call_method0("__next__") {
                Ok(chunk) => convert_chunk(&chunk).map(Some),
                Err(err) if err.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => Ok(None),
                Err(err) => Err(err),
            }
        })
        .map_err(|err| self.error.keep("the workload", err))
    }

    fn progress(&mut self, num_completed: u64) -> Result<()> {
        let Some(callback) = &self.progress else {
            return Ok(());
        };
        Python::attach(|py| callback.bind(py).call1((num_completed,)).map(|_| ()))
            .map_err(|err| self.error.keep("the progress callback", err))
    }
}

/// A Python callable as the execution-time model (the slow path).
struct PyExec {
    model: Py<PyAny>,
    error: ErrorSlot,
}

/// A finite number >= 0 that a Python callback returned; anything else is a
/// `PolicyError` naming the callback and what it should return.
fn number(value: &Bound<'_, PyAny>, what: &str, expected: &str) -> PyResult<f64> {
    let is_number = value.is_instance_of::<pyo3::types::PyFloat>()
        || (value.is_instance_of::<pyo3::types::PyInt>()
            && !value.is_instance_of::<pyo3::types::PyBool>());
    match value.extract::<f64>() {
        Ok(s) if is_number && s.is_finite() && s >= 0.0 => Ok(s),
        _ => Err(crate::errors::to_py_err(
            value.py(),
            Error::Plugin(format!(
                "{what} returned {}; it must return {expected}",
                value
                    .repr()
                    .map_or_else(|_| "?".to_string(), |r| r.to_string())
            )),
        )),
    }
}

fn seconds(value: &Bound<'_, PyAny>) -> PyResult<f64> {
    number(
        value,
        "the execution-time model",
        "seconds (a finite number >= 0) or a (total_s, model_s) pair of them",
    )
}

impl PyExec {
    fn call(
        &self,
        py: Python<'_>,
        shape: &BatchShape,
        stage: u32,
        num_stages: u32,
    ) -> PyResult<StageTime> {
        let kwargs = PyDict::new(py);
        kwargs.set_item("num_requests", shape.num_requests)?;
        kwargs.set_item("num_prefill_tokens", shape.num_prefill_tokens)?;
        kwargs.set_item("num_decode_tokens", shape.num_decode_tokens)?;
        kwargs.set_item("sum_decode_context", shape.sum_decode_context)?;
        kwargs.set_item("sum_prefill_context", shape.sum_prefill_context)?;
        kwargs.set_item("sum_prefill_squared", shape.sum_prefill_squared)?;
        kwargs.set_item("num_padding_rows", shape.num_padding_rows)?;
        kwargs.set_item("stage", stage)?;
        kwargs.set_item("num_stages", num_stages)?;
        let answer = self.model.bind(py).call((), Some(&kwargs))?;
        if let Ok(pair) = answer.cast::<PyTuple>()
            && pair.len() == 2
        {
            let total_s = seconds(&pair.get_item(0)?)?;
            let model_s = seconds(&pair.get_item(1)?)?;
            return Ok(StageTime { total_s, model_s });
        }
        let total_s = seconds(&answer)?;
        Ok(StageTime {
            total_s,
            model_s: total_s,
        })
    }
}

impl ExecModel for PyExec {
    fn stage_time(&mut self, shape: &BatchShape, stage: u32, num_stages: u32) -> Result<StageTime> {
        Python::attach(|py| self.call(py, shape, stage, num_stages))
            .map_err(|err| self.error.keep("the execution-time model", err))
    }
}

/// What a replica-policy plugin sees of a request.
#[pyclass(
    name = "SimRequestView",
    module = "tokenyard.simulation",
    frozen,
    get_all
)]
pub(crate) struct PySimRequestView {
    request_id: u64,
    arrived_at: f64,
    num_prefill_tokens: u32,
    num_decode_tokens: u32,
    num_processed_tokens: u32,
    is_prefill_complete: bool,
    completed: bool,
    num_restarts: u32,
}

#[pymethods]
impl PySimRequestView {
    fn __repr__(&self) -> String {
        format!(
            "SimRequestView(request_id={}, processed={}/{}+{}, completed={})",
            self.request_id,
            self.num_processed_tokens,
            self.num_prefill_tokens,
            self.num_decode_tokens,
            self.completed
        )
    }
}

fn view(r: &SimRequest) -> PySimRequestView {
    PySimRequestView {
        request_id: r.id,
        arrived_at: r.arrived_at,
        num_prefill_tokens: r.num_prefill_tokens,
        num_decode_tokens: r.num_decode_tokens,
        num_processed_tokens: r.num_processed_tokens,
        is_prefill_complete: r.is_prefill_complete,
        completed: r.completed,
        num_restarts: r.num_restarts,
    }
}

/// A Python global scheduler: `route(request, replicas) -> int`.
struct PyRoutePlugin {
    object: Py<PyAny>,
    error: ErrorSlot,
}

impl PyRoutePlugin {
    fn call(
        &self,
        py: Python<'_>,
        request: &RouteInfo<'_>,
        loads: &[ReplicaLoad],
    ) -> PyResult<usize> {
        let info = PyDict::new(py);
        info.set_item("request_id", request.request_id)?;
        info.set_item("arrived_at", request.arrived_at)?;
        info.set_item("num_prefill_tokens", request.num_prefill_tokens)?;
        info.set_item("num_decode_tokens", request.num_decode_tokens)?;
        info.set_item("hash_ids", request.hash_ids.to_vec())?;
        let replicas = PyList::empty(py);
        for load in loads {
            let d = PyDict::new(py);
            d.set_item("num_pending", load.num_pending)?;
            d.set_item("num_outstanding", load.num_outstanding)?;
            d.set_item("queued_prefill_tokens", load.queued_prefill_tokens)?;
            d.set_item("kv_usage", load.kv_usage)?;
            replicas.append(d)?;
        }
        let answer = self
            .object
            .bind(py)
            .call_method1("route", (info, replicas))?;
        let index = crate::convert::int_arg(&answer, "route()", 0, loads.len() as i128 - 1)
            .map_err(|_| {
                crate::errors::to_py_err(
                    py,
                    Error::Plugin(format!(
                        "the routing plugin's route() returned {}; it must return a replica \
                         index in [0, {})",
                        answer
                            .repr()
                            .map_or_else(|_| "?".to_string(), |r| r.to_string()),
                        loads.len()
                    )),
                )
            })?;
        Ok(index as usize)
    }
}

impl RoutePlugin for PyRoutePlugin {
    fn route(&mut self, request: &RouteInfo<'_>, loads: &[ReplicaLoad]) -> Result<usize> {
        Python::attach(|py| self.call(py, request, loads))
            .map_err(|err| self.error.keep("the routing plugin's route()", err))
    }
}

/// A Python replica scheduler (docs/plugins.md); the core's `PluginReplica` checks it.
struct PyReplicaHost {
    object: Py<PyAny>,
    error: ErrorSlot,
}

impl PyReplicaHost {
    fn call<T>(&self, method: &str, f: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>) -> Result<T> {
        Python::attach(|py| f(self.object.bind(py))).map_err(|err| {
            self.error
                .keep(&format!("the replica plugin's {method}()"), err)
        })
    }
}

fn plan_entry(item: &Bound<'_, PyAny>) -> PyResult<(u64, u32)> {
    let bad = || {
        crate::errors::to_py_err(
            item.py(),
            Error::Plugin(format!(
                "next_batch() gave {}; each entry must be a (request_id, num_tokens) pair of \
                 ints",
                item.repr()
                    .map_or_else(|_| "?".to_string(), |r| r.to_string())
            )),
        )
    };
    let pair = item.cast::<PyTuple>().map_err(|_| bad())?;
    if pair.len() != 2 {
        return Err(bad());
    }
    let id = crate::convert::int_arg(&pair.get_item(0)?, "request_id", 0, u64::MAX as i128)
        .map_err(|_| bad())?;
    let n = crate::convert::int_arg(&pair.get_item(1)?, "num_tokens", 0, u32::MAX as i128)
        .map_err(|_| bad())?;
    Ok((id as u64, n as u32))
}

impl ReplicaPluginHost for PyReplicaHost {
    fn add_request(&mut self, request: &SimRequest) -> Result<()> {
        self.call("add_request", |o| {
            o.call_method1("add_request", (view(request),)).map(|_| ())
        })
    }

    fn next_batch(&mut self) -> Result<Option<Vec<(u64, u32)>>> {
        self.call("next_batch", |o| {
            let answer = o.call_method0("next_batch")?;
            if answer.is_none() {
                return Ok(None);
            }
            let list = answer.cast::<PyList>().map_err(|_| {
                crate::errors::to_py_err(
                    o.py(),
                    Error::Plugin("next_batch() must return a list or None".into()),
                )
            })?;
            list.iter()
                .map(|item| plan_entry(&item))
                .collect::<PyResult<_>>()
                .map(Some)
        })
    }

    fn on_batch_end(&mut self, batch: &[&SimRequest]) -> Result<()> {
        let views: Vec<PySimRequestView> = batch.iter().map(|r| view(r)).collect();
        self.call("on_batch_end", |o| {
            o.call_method1("on_batch_end", (views,)).map(|_| ())
        })
    }

    fn kv_usage(&mut self) -> Result<f64> {
        self.call("kv_usage", |o| {
            if !o.hasattr("kv_usage")? {
                return Ok(0.0);
            }
            number(
                &o.call_method0("kv_usage")?,
                "kv_usage()",
                "a fraction in [0, 1]",
            )
        })
    }
}

/// Runs a simulation; see `tokenyard.simulate` for the config and the result.
#[pyfunction]
#[pyo3(signature = (config, chunks, *, exec_model=None, progress=None, route_plugin=None,
    replica_plugins=None, policy_plugins=None, exec_repeat=1))]
#[allow(clippy::too_many_arguments)]
fn simulate<'py>(
    py: Python<'py>,
    config: &PySimConfig,
    chunks: &Bound<'py, PyAny>,
    exec_model: Option<&Bound<'py, PyAny>>,
    progress: Option<Py<PyAny>>,
    route_plugin: Option<Py<PyAny>>,
    replica_plugins: Option<Vec<Py<PyAny>>>,
    policy_plugins: Option<Vec<Bound<'py, PyAny>>>,
    exec_repeat: u32,
) -> PyResult<Bound<'py, PyDict>> {
    let sim_config = config.inner.clone();
    let error = ErrorSlot::default();
    let mut source = PySource {
        chunks: chunks.try_iter()?.into_any().unbind(),
        progress,
        error: error.clone(),
    };
    let mut exec: Box<dyn ExecModel> = match exec_model {
        None => Box::new(sim_config.exec),
        Some(model) => match model.cast::<PyCompiledOps>() {
            Ok(ops) => {
                let ops: OpModel = ops.get().model();
                ops.validate(sim_config.num_stages).or_raise(py)?;
                Box::new(ops)
            }
            Err(_) => Box::new(PyExec {
                model: model.clone().unbind(),
                error: error.clone(),
            }),
        },
    };
    let replicas: Option<Vec<Box<dyn ReplicaPolicy>>> = replica_plugins.map(|objects| {
        objects
            .into_iter()
            .map(|object| {
                let host = PyReplicaHost {
                    object,
                    error: error.clone(),
                };
                Box::new(PluginReplica::new(host)) as Box<dyn ReplicaPolicy>
            })
            .collect()
    });
    type StepPlugin = Box<dyn PolicyPlugin<u32>>;
    let step_plugins: Option<Vec<StepPlugin>> = policy_plugins
        .map(|objects| {
            objects
                .into_iter()
                .map(|object| {
                    PyPlugin::check(&object, "replica.scheduler.policy_plugin")?;
                    Ok(Box::new(PyPlugin {
                        object: object.unbind(),
                        error: error.clone(),
                    }) as StepPlugin)
                })
                .collect::<PyResult<_>>()
        })
        .transpose()?;
    let route = route_plugin.map(|object| PyRoutePlugin {
        object,
        error: error.clone(),
    });
    let result = py.detach(|| {
        // `exec_repeat` (benches/predictor_cost.py): the model's cost, isolated by asking it
        // several times per batch stage for the same answers.
        let mut repeated = Repeated {
            inner: exec.as_mut(),
            times: exec_repeat.max(1),
        };
        let sim = match replicas {
            Some(policies) => Simulator::with_replica_policies(sim_config, &mut repeated, policies),
            None => Simulator::new(sim_config, &mut repeated),
        }?;
        let sim = match route {
            Some(plugin) => sim.with_route_plugin(Box::new(plugin)),
            None => sim,
        };
        let sim = match step_plugins {
            Some(plugins) => sim.with_policy_plugins(plugins)?,
            None => sim,
        };
        sim.run(&mut source)
    });
    if let Some(err) = error.take() {
        return Err(err);
    }
    to_dict(py, result.or_raise(py)?)
}

fn to_dict(py: Python<'_>, out: SimOutput) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let t = out.requests;
    let requests = PyDict::new(py);
    requests.set_item("request_id", t.request_id.into_pyarray(py))?;
    requests.set_item("replica", t.replica.into_pyarray(py))?;
    requests.set_item("arrived_at", t.arrived_at.into_pyarray(py))?;
    requests.set_item("scheduled_at", t.scheduled_at.into_pyarray(py))?;
    requests.set_item("first_token_at", t.first_token_at.into_pyarray(py))?;
    requests.set_item("completed_at", t.completed_at.into_pyarray(py))?;
    requests.set_item("num_prefill_tokens", t.num_prefill_tokens.into_pyarray(py))?;
    requests.set_item("num_decode_tokens", t.num_decode_tokens.into_pyarray(py))?;
    requests.set_item("num_restarts", t.num_restarts.into_pyarray(py))?;
    requests.set_item("prefix_hit_tokens", t.prefix_hit_tokens.into_pyarray(py))?;
    requests.set_item("max_token_gap", t.max_token_gap.into_pyarray(py))?;
    requests.set_item("execution_time", t.execution_time.into_pyarray(py))?;
    requests.set_item(
        "model_execution_time",
        t.model_execution_time.into_pyarray(py),
    )?;
    d.set_item("requests", requests)?;

    let edges: Vec<f64> = (0..=GapHistogram::NUM_BUCKETS)
        .map(GapHistogram::bucket_start)
        .collect();
    d.set_item("token_gap_counts", out.token_gaps.counts.into_pyarray(py))?;
    d.set_item("token_gap_edges", edges.into_pyarray(py))?;

    let s = out.samples;
    let samples = PyDict::new(py);
    samples.set_item("time", s.time.into_pyarray(py))?;
    samples.set_item("replica", s.replica.into_pyarray(py))?;
    samples.set_item("kv_usage", s.kv_usage.into_pyarray(py))?;
    samples.set_item("batch_size", s.batch_size.into_pyarray(py))?;
    samples.set_item("num_outstanding", s.num_outstanding.into_pyarray(py))?;
    d.set_item("samples", samples)?;

    if let Some(trace) = out.stages {
        let stages = PyDict::new(py);
        stages.set_item("replica", trace.replica.into_pyarray(py))?;
        stages.set_item("stage", trace.stage.into_pyarray(py))?;
        stages.set_item("batch_id", trace.batch_id.into_pyarray(py))?;
        stages.set_item("start", trace.start.into_pyarray(py))?;
        stages.set_item("duration", trace.duration.into_pyarray(py))?;
        stages.set_item("num_requests", trace.num_requests.into_pyarray(py))?;
        stages.set_item(
            "num_prefill_tokens",
            trace.num_prefill_tokens.into_pyarray(py),
        )?;
        stages.set_item(
            "num_decode_tokens",
            trace.num_decode_tokens.into_pyarray(py),
        )?;
        d.set_item("stages", stages)?;
    }

    let r = out.replicas;
    let replicas = PyDict::new(py);
    replicas.set_item("busy_time", r.busy_time.into_pyarray(py))?;
    replicas.set_item("num_batches", r.num_batches.into_pyarray(py))?;
    replicas.set_item("sum_batch_size", r.sum_batch_size.into_pyarray(py))?;
    replicas.set_item("num_prefill_tokens", r.num_prefill_tokens.into_pyarray(py))?;
    replicas.set_item("num_decode_tokens", r.num_decode_tokens.into_pyarray(py))?;
    d.set_item("replicas", replicas)?;

    d.set_item("makespan", out.makespan)?;
    d.set_item("num_events", out.num_events)?;
    d.set_item("num_batches", out.num_batches)?;
    d.set_item("num_skipped_over_length", out.num_skipped_over_length)?;
    Ok(d)
}
