//! A Python object as a scheduler policy plugin (the slow path, for experiments). Its own
//! exceptions are kept and re-raised unchanged by the scheduler's Python methods.

use pyo3::prelude::*;
use pyo3::types::PyList;
use rustc_hash::FxHashMap;
use tokenyard_core::sched::{PolicyPlugin, RequestStatus, RequestView};
use tokenyard_core::{Error, Result};

use crate::convert::RequestId;
use crate::errors::ErrorSlot;

/// What a plugin sees of a request.
#[pyclass(name = "RequestView", module = "tokenyard.sched", frozen, get_all)]
pub(crate) struct PyRequestView {
    request_id: Py<PyAny>,
    num_prompt_tokens: usize,
    num_tokens: usize,
    num_computed_tokens: usize,
    max_tokens: usize,
    priority: i64,
    arrival_time: f64,
    num_preemptions: u32,
    status: &'static str,
    shared_prefix_boundary: usize,
}

impl PyRequestView {
    /// The view of `v`, showing `shown` as its id.
    pub(crate) fn new<R>(py: Python<'_>, shown: RequestId, v: &RequestView<R>) -> PyResult<Self> {
        Ok(Self {
            request_id: shown.into_py(py)?,
            num_prompt_tokens: v.num_prompt_tokens,
            num_tokens: v.num_tokens,
            num_computed_tokens: v.num_computed_tokens,
            max_tokens: v.max_tokens,
            priority: v.priority,
            arrival_time: v.arrival_time,
            num_preemptions: v.num_preemptions,
            status: status_name(v.status),
            shared_prefix_boundary: v.shared_prefix_boundary,
        })
    }
}

#[pymethods]
impl PyRequestView {
    fn __repr__(&self, py: Python<'_>) -> String {
        let id = self
            .request_id
            .bind(py)
            .repr()
            .map_or_else(|_| "?".into(), |r| r.to_string());
        format!(
            "RequestView(request_id={id}, status={:?}, num_tokens={}, num_computed_tokens={})",
            self.status, self.num_tokens, self.num_computed_tokens
        )
    }
}

fn status_name(status: RequestStatus) -> &'static str {
    match status {
        RequestStatus::Waiting => "waiting",
        RequestStatus::WaitingForRemoteKvs => "waiting_for_remote_kvs",
        RequestStatus::Running => "running",
        RequestStatus::Preempted => "preempted",
        RequestStatus::WaitingForStreamingInput => "waiting_for_streaming_input",
        RequestStatus::Finished(_) => "finished",
    }
}

pub(crate) struct PyPlugin {
    pub(crate) object: Py<PyAny>,
    pub(crate) error: ErrorSlot,
}

/// The id a plugin sees for a request: the embeddable scheduler's own request id, or, in a
/// simulated `vllm_v1` replica, the request's position in the workload.
pub(crate) trait PluginKey: Clone {
    fn shown(view: &RequestView<Self>) -> RequestId;
}

impl PluginKey for RequestId {
    fn shown(view: &RequestView<Self>) -> RequestId {
        view.request_id.clone()
    }
}

impl PluginKey for u32 {
    fn shown(view: &RequestView<Self>) -> RequestId {
        let id = view.external_id.unwrap_or(u64::from(view.request_id));
        RequestId::Int(i64::try_from(id).unwrap_or(i64::MAX))
    }
}

impl PyPlugin {
    /// Checks that `object` has the protocol's methods.
    pub(crate) fn check(object: &Bound<'_, PyAny>, field: &'static str) -> PyResult<()> {
        for method in ["order_waiting", "preemption_order"] {
            if !object.hasattr(method)? {
                let shown = object.repr().map_or_else(|_| "?".into(), |r| r.to_string());
                return Err(crate::errors::config_error(
                    object.py(),
                    field,
                    shown,
                    &format!("has no method {method}()"),
                ));
            }
        }
        Ok(())
    }

    fn ask<R: PluginKey>(
        &self,
        method: &'static str,
        views: &[RequestView<R>],
    ) -> Result<Vec<usize>> {
        Python::attach(|py| {
            let answer = self.call(py, method, views);
            answer.map_err(|err| self.error.keep(method, reentry_error(py, method, err)))?
        })
    }

    /// Calls the method; `Err` for a Python exception, `Ok(Err)` for an invalid answer.
    fn call<R: PluginKey>(
        &self,
        py: Python<'_>,
        method: &'static str,
        views: &[RequestView<R>],
    ) -> PyResult<Result<Vec<usize>>> {
        let list = PyList::empty(py);
        let mut position = FxHashMap::default();
        for (i, v) in views.iter().enumerate() {
            let shown = R::shown(v);
            position.insert(shown.clone(), i);
            list.append(Py::new(py, PyRequestView::new(py, shown, v)?)?)?;
        }
        let answer = self.object.bind(py).call_method1(method, (list,))?;
        let mut order = Vec::with_capacity(views.len());
        for id in answer.try_iter()? {
            let id = RequestId::from_py(&id?)?;
            match position.get(&id) {
                Some(&i) => order.push(i),
                None => {
                    return Ok(Err(Error::Plugin(format!(
                        "{method} returned {id:?}, which it was not given"
                    ))));
                }
            }
        }
        Ok(Ok(order))
    }
}

impl<R: PluginKey> PolicyPlugin<R> for PyPlugin {
    fn order_waiting(&mut self, waiting: &[RequestView<R>]) -> Result<Vec<usize>> {
        self.ask("order_waiting", waiting)
    }

    fn preemption_order(&mut self, running: &[RequestView<R>]) -> Result<Vec<usize>> {
        self.ask("preemption_order", running)
    }
}

/// Whether `err` is PyO3's refusal to borrow the scheduler: a callback (a plugin, a KV
/// connector) called back into it while it was asking.
pub(crate) fn is_reentry(py: Python<'_>, err: &PyErr) -> bool {
    err.is_instance_of::<pyo3::exceptions::PyRuntimeError>(py)
        && err.to_string().contains("Already")
}

/// A plugin that calls back into the scheduler while it is being asked finds it borrowed;
/// PyO3's `RuntimeError` says so in its words, this says it in ours.
fn reentry_error(py: Python<'_>, method: &str, err: PyErr) -> PyErr {
    if !is_reentry(py, &err) {
        return err;
    }
    crate::errors::to_py_err(
        py,
        Error::Plugin(format!(
            "{method}() called back into the Scheduler while it was asking the plugin; a \
             plugin may only read the request views it is given"
        )),
    )
}
