//! The Python objects the event loop calls back (each takes the GIL back for the call):
//! the workload's chunk iterator and progress callback, a Python execution-time model, a
//! routing plugin and a replica plugin (checked by the core's `PluginReplica`).

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tokenyard_core::sim::{
    ArrivingRequest, BatchShape, ExecModel, ReplicaLoad, ReplicaPluginHost, RequestSource,
    RouteInfo, RoutePlugin, SimRequest, StageTime,
};
use tokenyard_core::{Error, Result};

use crate::errors::{ErrorSlot, input_error};

/// Pulls `RequestChunk`s (see `tokenyard.workload`) from a Python iterator.
pub(crate) struct PySource {
    pub(crate) chunks: Py<PyAny>,
    pub(crate) progress: Option<Py<PyAny>>,
    pub(crate) error: ErrorSlot,
}

fn convert_chunk(chunk: &Bound<'_, PyAny>) -> PyResult<Vec<ArrivingRequest>> {
    let arrived: PyReadonlyArray1<'_, f64> = chunk.getattr("arrived_at")?.extract()?;
    let prefill: PyReadonlyArray1<'_, u32> = chunk.getattr("num_prefill_tokens")?.extract()?;
    let decode: PyReadonlyArray1<'_, u32> = chunk.getattr("num_decode_tokens")?.extract()?;
    let (arrived, prefill, decode) = (arrived.as_slice()?, prefill.as_slice()?, decode.as_slice()?);
    let offsets = chunk.getattr("hash_offsets")?;
    // Read in place: each request copies its own ids out, the chunk's are not copied whole.
    let hash_arrays: Option<(PyReadonlyArray1<'_, u64>, PyReadonlyArray1<'_, u64>)> =
        if offsets.is_none() {
            None
        } else {
            Some((offsets.extract()?, chunk.getattr("hash_ids")?.extract()?))
        };
    let hashes = match &hash_arrays {
        Some((offsets, ids)) => Some((offsets.as_slice()?, ids.as_slice()?)),
        None => None,
    };
    let n = arrived.len();
    let session_ids = optional_array::<u64>(chunk, "session_ids")?;
    let delay_values = optional_array::<f64>(chunk, "delay_s")?;
    let sessions = session_ids.as_ref().map(|a| a.as_slice()).transpose()?;
    let delays = delay_values.as_ref().map(|a| a.as_slice()).transpose()?;
    let lora_values = optional_array::<i64>(chunk, "lora_ids")?;
    let loras = lora_values.as_ref().map(|a| a.as_slice()).transpose()?;
    let offsets_ok = hashes.as_ref().is_none_or(|(off, ids)| {
        off.len() == n + 1
            && off.windows(2).all(|w| w[0] <= w[1])
            && off.last().is_none_or(|&end| end as usize <= ids.len())
    });
    let columns_ok = sessions.is_none_or(|s| s.len() == n)
        && delays.is_none_or(|d| d.len() == n)
        && loras.is_none_or(|l| l.len() == n);
    if prefill.len() != n || decode.len() != n || !offsets_ok || !columns_ok {
        return Err(input_error(
            chunk.py(),
            "chunk",
            format!("{n}/{}/{}", prefill.len(), decode.len()),
            "arrived_at, num_prefill_tokens, num_decode_tokens, hash_offsets, session_ids, \
             delay_s and lora_ids do not line up",
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
            // u64::MAX is `tokenyard.workload.NO_SESSION`: a request on its own.
            session: sessions.map(|s| s[i]).filter(|&s| s != u64::MAX),
            delay_s: delays.map_or(0.0, |d| d[i]),
            // -1 (any negative id) is the base model.
            lora_id: loras.and_then(|l| u64::try_from(l[i]).ok()),
        })
        .collect())
}

/// A chunk's optional column (`None` when the chunk has no such attribute or it is None).
fn optional_array<'py, T: numpy::Element>(
    chunk: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Option<PyReadonlyArray1<'py, T>>> {
    match chunk.getattr(name) {
        Ok(value) if !value.is_none() => Ok(Some(value.extract()?)),
        _ => Ok(None),
    }
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
pub(crate) struct PyExec {
    pub(crate) model: Py<PyAny>,
    pub(crate) error: ErrorSlot,
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
        // Only LoRA batches tell a Python model about adapters (older callables need not
        // know the keywords).
        if shape.lora.num_lora_tokens > 0 {
            kwargs.set_item("num_lora_tokens", shape.lora.num_lora_tokens)?;
            kwargs.set_item("num_lora_adapters", shape.lora.num_adapters)?;
        }
        // Only under speculative decoding, so functions written before it keep working.
        if shape.num_spec_decode_tokens > 0 {
            kwargs.set_item("num_spec_decode_tokens", shape.num_spec_decode_tokens)?;
        }
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
pub(crate) struct PyRoutePlugin {
    pub(crate) object: Py<PyAny>,
    pub(crate) error: ErrorSlot,
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
pub(crate) struct PyReplicaHost {
    pub(crate) object: Py<PyAny>,
    pub(crate) error: ErrorSlot,
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
