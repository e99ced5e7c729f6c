//! `tokenyard.sched`'s step output and stats: `SchedulerOutput`, whose fields are converted
//! lazily on access (and read in bulk as arrays), `NewRequestData`, `CachedRequestData`
//! and `SchedulerStats`.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tokenyard_core::sched::{NewRequestData, SchedulerOutput, SchedulerStats};

use crate::convert::RequestId;
use crate::sched_connector::kv_loads;

/// A request scheduled for the first time, or resumed after preemption.
#[pyclass(name = "NewRequestData", module = "tokenyard.sched", frozen)]
pub(crate) struct PyNewRequestData {
    inner: NewRequestData<RequestId>,
}

#[pymethods]
impl PyNewRequestData {
    #[getter]
    fn req_id(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.inner.request_id.clone().into_py(py)
    }
    #[getter]
    fn token_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        PyArray1::from_slice(py, &self.inner.token_ids)
    }
    #[getter]
    fn block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        PyArray1::from_slice(py, &self.inner.block_ids)
    }
    #[getter]
    fn group_block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        group_tuple(py, &self.inner.group_block_ids)
    }
    #[getter]
    fn num_computed_tokens(&self) -> usize {
        self.inner.num_computed_tokens
    }
    #[getter]
    fn lora_id(&self) -> Option<u64> {
        self.inner.lora_id
    }
    #[getter]
    fn replay_start(&self) -> usize {
        self.inner.replay_start
    }
    fn __repr__(&self) -> String {
        format!(
            "NewRequestData(req_id={:?}, num_tokens={}, num_blocks={}, num_computed_tokens={})",
            self.inner.request_id,
            self.inner.token_ids.len(),
            self.inner.block_ids.len(),
            self.inner.num_computed_tokens
        )
    }
}

/// The requests that were already running, as parallel sequences (vLLM's layout).
#[pyclass(
    name = "CachedRequestData",
    module = "tokenyard.sched",
    frozen,
    get_all
)]
pub(crate) struct PyCachedRequestData {
    req_ids: Py<PyList>,
    new_block_ids: Py<PyList>,
    new_group_block_ids: Py<PyList>,
    num_computed_tokens: Py<PyArray1<u64>>,
}

/// One array per KV group (vLLM's `block_ids` tuple); empty with a single group.
pub(crate) fn group_tuple<'py>(
    py: Python<'py>,
    tables: &[Vec<tokenyard_core::kv::BlockId>],
) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, tables.iter().map(|t| PyArray1::from_slice(py, t)))
}

type Int64Array<'py> = Bound<'py, PyArray1<i64>>;

/// One step's decisions. Fields are built from the Rust result when read: keep a local
/// rather than reading a field in a loop.
#[pyclass(name = "SchedulerOutput", module = "tokenyard.sched", frozen)]
pub(crate) struct PySchedulerOutput {
    pub(crate) inner: SchedulerOutput<RequestId>,
}

pub(crate) fn id_list<'py>(py: Python<'py>, ids: &[RequestId]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for id in ids {
        list.append(id.clone().into_py(py)?)?;
    }
    Ok(list)
}

/// The ids as integers, or InputError naming the str one (`field`: the per-id reading).
fn int_ids<'a>(
    py: Python<'_>,
    ids: impl Iterator<Item = &'a RequestId>,
    field: &str,
) -> PyResult<Vec<i64>> {
    ids.map(|id| match id {
        RequestId::Int(i) => Ok(*i),
        RequestId::Str(_) => Err(crate::errors::input_error(
            py,
            "request_id",
            format!("{id:?}"),
            &format!("arrays need integer request ids; read {field}"),
        )),
    })
    .collect()
}

fn new_requests(
    py: Python<'_>,
    reqs: &[NewRequestData<RequestId>],
) -> PyResult<Vec<Py<PyNewRequestData>>> {
    reqs.iter()
        .map(|r| Py::new(py, PyNewRequestData { inner: r.clone() }))
        .collect()
}

#[pymethods]
impl PySchedulerOutput {
    #[getter]
    fn scheduled_new_reqs(&self, py: Python<'_>) -> PyResult<Vec<Py<PyNewRequestData>>> {
        new_requests(py, &self.inner.scheduled_new_reqs)
    }

    #[getter]
    fn scheduled_resumed_reqs(&self, py: Python<'_>) -> PyResult<Vec<Py<PyNewRequestData>>> {
        new_requests(py, &self.inner.scheduled_resumed_reqs)
    }

    #[getter]
    fn scheduled_cached_reqs(&self, py: Python<'_>) -> PyResult<PyCachedRequestData> {
        let running = &self.inner.scheduled_running_reqs;
        let ids: Vec<RequestId> = running.iter().map(|r| r.request_id.clone()).collect();
        let blocks = PyList::empty(py);
        let group_blocks = PyList::empty(py);
        for r in running {
            blocks.append(PyArray1::from_slice(py, &r.new_block_ids))?;
            group_blocks.append(group_tuple(py, &r.new_group_block_ids)?)?;
        }
        let computed: Vec<u64> = running
            .iter()
            .map(|r| r.num_computed_tokens as u64)
            .collect();
        Ok(PyCachedRequestData {
            req_ids: id_list(py, &ids)?.unbind(),
            new_block_ids: blocks.unbind(),
            new_group_block_ids: group_blocks.unbind(),
            num_computed_tokens: PyArray1::from_vec(py, computed).unbind(),
        })
    }

    #[getter]
    fn num_scheduled_tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (id, n) in &self.inner.num_scheduled_tokens {
            dict.set_item(id.clone().into_py(py)?, n)?;
        }
        Ok(dict)
    }

    /// `num_scheduled_tokens` as two int64 arrays in batch order, `(request_ids,
    /// num_tokens)`: the bulk path for integer request ids.
    fn num_scheduled_tokens_arrays<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Int64Array<'py>, Int64Array<'py>)> {
        let scheduled = &self.inner.num_scheduled_tokens;
        let ids = int_ids(
            py,
            scheduled.iter().map(|(id, _)| id),
            "num_scheduled_tokens",
        )?;
        let counts = scheduled.iter().map(|&(_, n)| n as i64).collect();
        Ok((PyArray1::from_vec(py, ids), PyArray1::from_vec(py, counts)))
    }

    /// `scheduled_cached_reqs` as arrays in its order, for integer request ids:
    /// `(request_ids, num_computed_tokens, num_new_block_ids, new_block_ids)`, the last
    /// the new blocks of all of them concatenated (`num_new_block_ids[i]` each).
    fn scheduled_cached_reqs_arrays<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        Int64Array<'py>,
        Int64Array<'py>,
        Int64Array<'py>,
        Bound<'py, PyArray1<u32>>,
    )> {
        let running = &self.inner.scheduled_running_reqs;
        let ids = int_ids(
            py,
            running.iter().map(|r| &r.request_id),
            "scheduled_cached_reqs",
        )?;
        let computed = running
            .iter()
            .map(|r| r.num_computed_tokens as i64)
            .collect();
        let counts = running
            .iter()
            .map(|r| r.new_block_ids.len() as i64)
            .collect();
        let blocks: Vec<u32> = running
            .iter()
            .flat_map(|r| r.new_block_ids.iter().copied())
            .collect();
        Ok((
            PyArray1::from_vec(py, ids),
            PyArray1::from_vec(py, computed),
            PyArray1::from_vec(py, counts),
            PyArray1::from_vec(py, blocks),
        ))
    }

    #[getter]
    fn total_num_scheduled_tokens(&self) -> usize {
        self.inner.total_num_scheduled_tokens
    }

    #[getter]
    fn scheduled_spec_decode_tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (id, tokens) in &self.inner.scheduled_spec_decode_tokens {
            dict.set_item(id.clone().into_py(py)?, PyArray1::from_slice(py, tokens))?;
        }
        Ok(dict)
    }

    #[getter]
    fn preempted_req_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        id_list(py, &self.inner.preempted_req_ids)
    }

    #[getter]
    fn finished_req_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        id_list(py, &self.inner.finished_req_ids)
    }

    #[getter]
    fn kv_loads(&self, py: Python<'_>) -> PyResult<Vec<Py<crate::sched_connector::PyKvLoad>>> {
        kv_loads(py, &self.inner.kv_loads)
    }

    #[getter]
    fn scheduled_encoder_inputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::sched_encoder::scheduled_encoder_inputs(py, &self.inner)
    }

    #[getter]
    fn free_encoder_mm_hashes(&self) -> Vec<String> {
        self.inner.free_encoder_mm_hashes.clone()
    }

    /// `(src, dst)` block copies run before this step's forward (vLLM 0.33's).
    #[getter]
    fn kv_cache_block_copies(&self) -> Vec<(u32, u32)> {
        self.inner.kv_cache_block_copies.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "SchedulerOutput(new={}, resumed={}, running={}, total_num_scheduled_tokens={}, preempted={}, finished={}, kv_loads={})",
            self.inner.scheduled_new_reqs.len(),
            self.inner.scheduled_resumed_reqs.len(),
            self.inner.scheduled_running_reqs.len(),
            self.inner.total_num_scheduled_tokens,
            self.inner.preempted_req_ids.len(),
            self.inner.finished_req_ids.len(),
            self.inner.kv_loads.len()
        )
    }
}

/// Queue sizes, KV usage and counters since the scheduler was built.
#[pyclass(name = "SchedulerStats", module = "tokenyard.sched", frozen)]
pub(crate) struct PySchedulerStats {
    pub(crate) inner: SchedulerStats,
}

#[pymethods]
impl PySchedulerStats {
    #[getter]
    fn num_waiting(&self) -> usize {
        self.inner.num_waiting
    }
    #[getter]
    fn num_deferred_waiting(&self) -> usize {
        self.inner.num_deferred_waiting
    }
    #[getter]
    fn num_running(&self) -> usize {
        self.inner.num_running
    }
    #[getter]
    fn kv_usage(&self) -> f64 {
        self.inner.kv_usage
    }
    #[getter]
    fn prefix_cache_queries(&self) -> u64 {
        self.inner.prefix_cache_queries
    }
    #[getter]
    fn prefix_cache_hits(&self) -> u64 {
        self.inner.prefix_cache_hits
    }
    #[getter]
    fn num_preemptions(&self) -> u64 {
        self.inner.num_preemptions
    }
    #[getter]
    fn num_steps(&self) -> u64 {
        self.inner.num_steps
    }
    fn __repr__(&self) -> String {
        let s = &self.inner;
        format!(
            "SchedulerStats(num_waiting={}, num_running={}, kv_usage={:.4}, prefix_cache_queries={}, \
             prefix_cache_hits={}, num_preemptions={}, num_steps={})",
            s.num_waiting,
            s.num_running,
            s.kv_usage,
            s.prefix_cache_queries,
            s.prefix_cache_hits,
            s.num_preemptions,
            s.num_steps
        )
    }
}
