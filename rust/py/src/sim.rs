//! `tokenyard._core.simulate`: runs the core simulator on a config dict (built and checked
//! by `tokenyard.simulate`), a Python iterator of request chunks and, optionally, a Python
//! execution-time model. Returns the results as numpy arrays in a dict. Exceptions raised
//! by the iterator, the model or the progress callback come back unchanged.

use std::sync::{Arc, Mutex};

use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use rustc_hash::{FxHashMap, FxHashSet};
use tokenyard_core::sim::exec::Repeated;
use tokenyard_core::sim::{
    ArrivingRequest, Batch, BatchPlan, BatchShape, ExecModel, GapHistogram, GlobalPolicy,
    LinearModel, ReplicaLoad, ReplicaPolicy, ReplicaPolicyConfig, ReqIdx, RequestSource, Requests,
    RestartMode, RouteInfo, RoutePlugin, SglangLimits, SimConfig, SimOutput, SimRequest, Simulator,
    StageTime, VidurKind, VidurLimits,
};
use tokenyard_core::{Error, Result};

use crate::errors::{OrRaise, config_error};
use crate::exec::op_model;
use crate::sched::core_config;

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PySimRequestView>()?;
    module.add_function(wrap_pyfunction!(simulate, module)?)
}

/// A Python exception raised inside a callback, kept until the run returns.
type ErrorSlot = Arc<Mutex<Option<PyErr>>>;

fn keep(slot: &ErrorSlot, what: &str, err: PyErr) -> Error {
    let message = format!("{what} raised {err}");
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(err);
    Error::Plugin(message)
}

pub(crate) fn get<'py, T: for<'a> FromPyObject<'a, 'py>>(
    dict: &Bound<'py, PyDict>,
    key: &'static str,
) -> PyResult<T> {
    let value = dict
        .get_item(key)?
        .ok_or_else(|| config_error(dict.py(), key, "missing", "is required"))?;
    value.extract::<T>().map_err(|_| {
        let shown = value
            .repr()
            .map_or_else(|_| "?".to_string(), |r| r.to_string());
        config_error(dict.py(), key, shown, "has the wrong type")
    })
}

pub(crate) fn sub<'py>(
    dict: &Bound<'py, PyDict>,
    key: &'static str,
) -> PyResult<Bound<'py, PyDict>> {
    get::<Bound<'py, PyDict>>(dict, key)
}

fn vidur_limits(d: &Bound<'_, PyDict>) -> PyResult<VidurLimits> {
    Ok(VidurLimits {
        num_blocks: get(d, "num_blocks")?,
        block_size: get(d, "block_size")?,
        watermark_blocks: get(d, "watermark_blocks")?,
        batch_size_cap: get(d, "batch_size_cap")?,
        max_batch_size: get(d, "max_batch_size")?,
        num_stages: get(d, "num_stages")?,
        max_blocks_per_sequence: get(d, "max_blocks_per_sequence")?,
        max_tokens_in_batch: get(d, "max_tokens_in_batch")?,
        chunk_size: get(d, "chunk_size")?,
        max_waiting_iters: get(d, "max_waiting_iters")?,
        restart: RestartMode::parse(&get::<String>(d, "restart")?).or_raise(d.py())?,
    })
}

fn replica_policy(d: &Bound<'_, PyDict>) -> PyResult<ReplicaPolicyConfig> {
    let name: String = get(d, "policy")?;
    let vidur = |kind| {
        Ok(ReplicaPolicyConfig::Vidur(
            kind,
            vidur_limits(&sub(d, "vidur")?)?,
        ))
    };
    match name.as_str() {
        "vllm" => vidur(VidurKind::Vllm),
        "sarathi" => vidur(VidurKind::Sarathi),
        "orca" => vidur(VidurKind::Orca),
        "lightllm" => vidur(VidurKind::LightLlm),
        "faster_transformer" => vidur(VidurKind::FasterTransformer),
        // A `tokenyard.sched.SchedulerConfig`, read as the embeddable scheduler reads it.
        "vllm_v1" => Ok(ReplicaPolicyConfig::VllmV1(
            core_config(&get::<Bound<'_, PyAny>>(d, "vllm_v1")?)?.0,
        )),
        "sglang" => {
            let s = sub(d, "sglang")?;
            Ok(ReplicaPolicyConfig::Sglang(SglangLimits {
                num_pages: get(&s, "num_pages")?,
                page_size: get(&s, "page_size")?,
                max_running_requests: get(&s, "max_running_requests")?,
                max_extend_tokens: get(&s, "max_extend_tokens")?,
                graph_batch_sizes: get(&s, "graph_batch_sizes")?,
            }))
        }
        other => Err(config_error(
            d.py(),
            "replica.scheduler.policy",
            other,
            "unknown replica policy",
        )),
    }
}

fn linear_model(d: &Bound<'_, PyDict>) -> PyResult<LinearModel> {
    Ok(LinearModel {
        constant_s: get(d, "constant_s")?,
        per_prefill_token_s: get(d, "per_prefill_token_s")?,
        per_decode_token_s: get(d, "per_decode_token_s")?,
        per_decode_context_token_s: get(d, "per_decode_context_token_s")?,
        per_prefill_context_token_s: get(d, "per_prefill_context_token_s")?,
        cpu_overhead_s: get(d, "cpu_overhead_s")?,
    })
}

fn sim_config(d: &Bound<'_, PyDict>) -> PyResult<SimConfig> {
    let py = d.py();
    let policy: String = get(d, "global_policy")?;
    Ok(SimConfig {
        num_replicas: get(d, "num_replicas")?,
        num_stages: get(d, "num_stages")?,
        global_policy: GlobalPolicy::from_name(&policy, get(d, "balance")?).or_raise(py)?,
        replica_policy: replica_policy(&sub(d, "replica")?)?,
        exec: linear_model(&sub(d, "linear")?)?,
        seed: get(d, "seed")?,
        hash_block_size: get(d, "hash_block_size")?,
        sample_interval_s: get(d, "sample_interval_s")?,
        record_stages: get(d, "record_stages")?,
    })
}

/// Pulls `RequestChunk`s (see `tokenyard.workload`) from a Python iterator.
struct PySource<'py> {
    chunks: Bound<'py, PyAny>,
    progress: Option<Bound<'py, PyAny>>,
    error: ErrorSlot,
}

impl PySource<'_> {
    fn convert(chunk: &Bound<'_, PyAny>) -> PyResult<Vec<ArrivingRequest>> {
        let arrived: PyReadonlyArray1<'_, f64> = chunk.getattr("arrived_at")?.extract()?;
        let prefill: PyReadonlyArray1<'_, u32> = chunk.getattr("num_prefill_tokens")?.extract()?;
        let decode: PyReadonlyArray1<'_, u32> = chunk.getattr("num_decode_tokens")?.extract()?;
        let (arrived, prefill, decode) =
            (arrived.as_slice()?, prefill.as_slice()?, decode.as_slice()?);
        let offsets = chunk.getattr("hash_offsets")?;
        let hashes: Option<(Vec<u64>, Vec<u64>)> = if offsets.is_none() {
            None
        } else {
            let offsets: PyReadonlyArray1<'_, u64> = offsets.extract()?;
            let ids: PyReadonlyArray1<'_, u64> = chunk.getattr("hash_ids")?.extract()?;
            Some((offsets.as_slice()?.to_vec(), ids.as_slice()?.to_vec()))
        };
        let n = arrived.len();
        if prefill.len() != n || decode.len() != n {
            return Err(crate::errors::input_error(
                chunk.py(),
                "chunk",
                format!("{n}/{}/{}", prefill.len(), decode.len()),
                "arrived_at, num_prefill_tokens and num_decode_tokens differ in length",
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
}

impl RequestSource for PySource<'_> {
    fn next_chunk(&mut self) -> Result<Option<Vec<ArrivingRequest>>> {
        let next = self
            .chunks
            .call_method0("__next__")
            .map(Some)
            .or_else(|err| {
                if err.is_instance_of::<pyo3::exceptions::PyStopIteration>(self.chunks.py()) {
                    Ok(None)
                } else {
                    Err(err)
                }
            });
        match next.and_then(|chunk| chunk.map(|c| Self::convert(&c)).transpose()) {
            Ok(chunk) => Ok(chunk),
            Err(err) => Err(keep(&self.error, "the workload", err)),
        }
    }

    fn progress(&mut self, num_completed: u64) -> Result<()> {
        if let Some(callback) = &self.progress {
            callback
                .call1((num_completed,))
                .map_err(|err| keep(&self.error, "the progress callback", err))?;
        }
        Ok(())
    }
}

/// A Python callable as the execution-time model (the slow path).
struct PyExec<'py> {
    model: Bound<'py, PyAny>,
    error: ErrorSlot,
}

impl PyExec<'_> {
    fn call(&self, shape: &BatchShape, stage: u32, num_stages: u32) -> PyResult<StageTime> {
        let py = self.model.py();
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
        let answer = self.model.call((), Some(&kwargs))?;
        if let Ok(tuple) = answer.cast::<PyTuple>() {
            let (total_s, model_s): (f64, f64) = tuple.extract()?;
            return Ok(StageTime { total_s, model_s });
        }
        let total_s: f64 = answer.extract()?;
        Ok(StageTime {
            total_s,
            model_s: total_s,
        })
    }
}

impl ExecModel for PyExec<'_> {
    fn stage_time(&mut self, shape: &BatchShape, stage: u32, num_stages: u32) -> Result<StageTime> {
        self.call(shape, stage, num_stages)
            .map_err(|err| keep(&self.error, "the execution-time model", err))
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
        self.object
            .bind(py)
            .call_method1("route", (info, replicas))?
            .extract()
    }
}

impl RoutePlugin for PyRoutePlugin {
    fn route(&mut self, request: &RouteInfo<'_>, loads: &[ReplicaLoad]) -> Result<usize> {
        Python::attach(|py| self.call(py, request, loads))
            .map_err(|err| keep(&self.error, "the routing plugin's route()", err))
    }
}

/// A Python replica scheduler: `add_request(view)`, `next_batch() -> [(id, tokens)] | None`,
/// `on_batch_end(views)`, optionally `kv_usage()`. It decides who runs; the adapter checks
/// its answers and releases requests once they complete.
struct PyReplicaPlugin {
    object: Py<PyAny>,
    error: ErrorSlot,
    held: FxHashMap<u64, ReqIdx>,
    in_flight: FxHashSet<ReqIdx>,
    never_scheduled: FxHashSet<ReqIdx>,
}

impl PyReplicaPlugin {
    fn fail(&self, method: &str, err: PyErr) -> Error {
        keep(&self.error, &format!("the replica plugin's {method}"), err)
    }

    fn check_plan(&self, requests: &Requests, answer: Vec<(u64, u32)>) -> Result<BatchPlan> {
        let mut plan: BatchPlan = (Vec::new(), Vec::new());
        let mut seen = FxHashSet::default();
        for (id, n) in answer {
            let bad = |why: &str| Err(Error::Plugin(format!("next_batch: request {id} {why}")));
            let Some(&idx) = self.held.get(&id) else {
                return bad("is not held by this replica");
            };
            if self.in_flight.contains(&idx) || !seen.insert(idx) {
                return bad("is already in a batch");
            }
            let r = requests.get(idx);
            let limit = if r.is_prefill_complete {
                1
            } else {
                r.num_prefill_tokens - r.num_processed_tokens
            };
            if r.completed || n == 0 || n > limit {
                return bad(&format!("cannot take {n} tokens (at most {limit})"));
            }
            plan.0.push(idx);
            plan.1.push(n);
        }
        Ok(plan)
    }
}

impl ReplicaPolicy for PyReplicaPlugin {
    fn add_request(&mut self, requests: &mut Requests, idx: ReqIdx) -> Result<()> {
        let r = requests.get(idx);
        self.held.insert(r.id, idx);
        self.never_scheduled.insert(idx);
        Python::attach(|py| {
            self.object
                .bind(py)
                .call_method1("add_request", (view(r),))
                .map(|_| ())
        })
        .map_err(|err| self.fail("add_request()", err))
    }

    fn next_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        let answer: Option<Vec<(u64, u32)>> =
            Python::attach(|py| self.object.bind(py).call_method0("next_batch")?.extract())
                .map_err(|err| self.fail("next_batch()", err))?;
        let Some(answer) = answer.filter(|a| !a.is_empty()) else {
            return Ok(None);
        };
        let plan = self.check_plan(requests, answer)?;
        for &idx in &plan.0 {
            self.in_flight.insert(idx);
            self.never_scheduled.remove(&idx);
        }
        Ok(Some(plan))
    }

    fn on_batch_end(&mut self, requests: &mut Requests, batch: &Batch) -> Result<Vec<ReqIdx>> {
        let views: Vec<PySimRequestView> = batch
            .requests
            .iter()
            .map(|&idx| view(requests.get(idx)))
            .collect();
        Python::attach(|py| {
            self.object
                .bind(py)
                .call_method1("on_batch_end", (views,))
                .map(|_| ())
        })
        .map_err(|err| self.fail("on_batch_end()", err))?;
        let mut released = Vec::new();
        for &idx in &batch.requests {
            self.in_flight.remove(&idx);
            let r = requests.get(idx);
            if r.completed {
                self.held.remove(&r.id);
                released.push(idx);
            }
        }
        Ok(released)
    }

    fn num_pending(&self) -> usize {
        self.never_scheduled.len()
    }

    fn num_outstanding(&self) -> usize {
        self.held.len()
    }

    fn pending_prefill_tokens(&self, requests: &Requests) -> u64 {
        self.never_scheduled
            .iter()
            .map(|&idx| requests.get(idx).num_prefill_tokens as u64)
            .sum()
    }

    fn kv_usage(&self) -> f64 {
        Python::attach(|py| {
            let object = self.object.bind(py);
            if !object.hasattr("kv_usage").unwrap_or(false) {
                return 0.0;
            }
            object
                .call_method0("kv_usage")
                .and_then(|v| v.extract::<f64>())
                .unwrap_or(0.0)
        })
    }
}

/// Runs a simulation; see `tokenyard.simulate` for the config and the result.
#[pyfunction]
#[pyo3(signature = (config, chunks, *, exec_model=None, progress=None, route_plugin=None, replica_plugins=None))]
fn simulate<'py>(
    py: Python<'py>,
    config: &Bound<'py, PyDict>,
    chunks: &Bound<'py, PyAny>,
    exec_model: Option<Bound<'py, PyAny>>,
    progress: Option<Bound<'py, PyAny>>,
    route_plugin: Option<Py<PyAny>>,
    replica_plugins: Option<Vec<Py<PyAny>>>,
) -> PyResult<Bound<'py, PyDict>> {
    let sim_config = sim_config(config)?;
    let error = ErrorSlot::default();
    let mut source = PySource {
        chunks: chunks.try_iter()?.into_any(),
        progress,
        error: error.clone(),
    };
    let mut linear = sim_config.exec;
    let mut ops;
    let mut python_exec;
    let exec: &mut dyn ExecModel = match (exec_model, config.get_item("ops")?) {
        (Some(model), _) => {
            python_exec = PyExec {
                model,
                error: error.clone(),
            };
            &mut python_exec
        }
        (None, Some(spec)) if !spec.is_none() => {
            ops = op_model(spec.cast::<PyDict>()?)?;
            ops.validate(sim_config.num_stages).or_raise(py)?;
            &mut ops
        }
        (None, _) => &mut linear,
    };
    // `exec_repeat` (benches/predictor_cost.py): the model's cost, isolated by running it
    // twice per batch stage with the same answers.
    let times: u32 = match config.get_item("exec_repeat")? {
        Some(v) => v.extract()?,
        None => 1,
    };
    let mut repeated = Repeated { inner: exec, times };
    let exec: &mut dyn ExecModel = if times > 1 {
        &mut repeated
    } else {
        repeated.inner
    };
    let result = Simulator::new(sim_config, exec)
        .map(|sim| match route_plugin {
            Some(object) => sim.with_route_plugin(Box::new(PyRoutePlugin {
                object,
                error: error.clone(),
            })),
            None => sim,
        })
        .and_then(|sim| match replica_plugins {
            Some(objects) => sim.with_replica_policies(
                objects
                    .into_iter()
                    .map(|object| {
                        Box::new(PyReplicaPlugin {
                            object,
                            error: error.clone(),
                            held: FxHashMap::default(),
                            in_flight: FxHashSet::default(),
                            never_scheduled: FxHashSet::default(),
                        }) as Box<dyn ReplicaPolicy>
                    })
                    .collect(),
            ),
            None => Ok(sim),
        })
        .and_then(|sim| sim.run(&mut source));
    if let Some(err) = error.lock().unwrap_or_else(|e| e.into_inner()).take() {
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
    Ok(d)
}
