//! A Python object as the step scheduler's KV connector (vLLM V1's scheduler-side
//! `KVConnectorBase_V1` methods), the loads a step starts (`KvLoad`), and the request-id
//! lists `finish_kv_transfers` takes. Conversions and checks of the connector's answers only;
//! what the scheduler does with them is the core's (`sched::connector`).

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString, PyTuple};
use tokenyard_core::kv::BlockId;
use tokenyard_core::sched::{ExternalTokens, KvConnector, KvLoad, Request, RequestView};
use tokenyard_core::{Error, Result};

use crate::convert::{RequestId, short_repr};
use crate::errors::{ErrorSlot, input_error};
use crate::plugin::PyRequestView;
use crate::py_callee::PyCallee;

const METHODS: [&str; 3] = [
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "request_finished",
];

/// A Python connector. Each call re-takes the GIL; an exception it raises is kept in
/// `error` and becomes the `__cause__` of the `ConnectorError` the scheduler's method raises.
pub(crate) struct PyConnector(PyCallee, bool);

impl PyConnector {
    /// Wraps `object` after checking it has the protocol's methods (a `ConfigError` naming
    /// `field` otherwise). Its optional `supports_divergent_local_hybrid_hits` (vLLM 0.33's
    /// property; false when absent) is read now: a connector's capability, not per request.
    pub(crate) fn new(
        object: &Bound<'_, PyAny>,
        field: &'static str,
        error: ErrorSlot,
    ) -> PyResult<Self> {
        let callee = PyCallee::new(
            object,
            field,
            error,
            &METHODS,
            "a connector may only read the request view and block ids it is given while the Scheduler asks it",
        )?;
        let divergent = match object.getattr_opt("supports_divergent_local_hybrid_hits")? {
            Some(value) => value.is_truthy()?,
            None => false,
        };
        Ok(Self(callee, divergent))
    }
}

pub(crate) fn view(py: Python<'_>, request: &Request<RequestId>) -> Result<Py<PyRequestView>> {
    let view = RequestView::of(request);
    PyRequestView::new(py, view.request_id.clone(), &view)
        .and_then(|v| Py::new(py, v))
        .map_err(|err| {
            Error::input(
                "request_id",
                format!("{:?}", request.request_id),
                err.to_string(),
            )
        })
}

/// A count the connector returned: an int (not a bool) >= 0.
pub(crate) fn count(value: &Bound<'_, PyAny>) -> Option<usize> {
    let int = value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>();
    int.then(|| value.extract::<usize>().ok()).flatten()
}

impl KvConnector<RequestId> for PyConnector {
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<RequestId>,
        num_computed_tokens: usize,
    ) -> Result<Option<ExternalTokens>> {
        const METHOD: &str = "get_num_new_matched_tokens";
        Python::attach(|py| {
            let answer = self
                .0
                .call(py, METHOD, (view(py, request)?, num_computed_tokens))?;
            if answer.is_none() {
                return Ok(None);
            }
            let pair = answer.cast::<PyTuple>().ok().filter(|t| t.len() == 2);
            let parts = pair.map(|t| (t.get_item(0), t.get_item(1)));
            if let Some((Ok(num_tokens), Ok(load_async))) = parts
                && let Ok(load_async) = load_async.extract::<bool>()
            {
                // vLLM's (None, False): the connector cannot tell yet.
                if num_tokens.is_none() {
                    return Ok(None);
                }
                if let Some(num_tokens) = count(&num_tokens) {
                    return Ok(Some(ExternalTokens {
                        num_tokens,
                        load_async,
                    }));
                }
            }
            Err(Error::connector(
                METHOD,
                short_repr(&answer),
                "must return (num_tokens, load_async): an int >= 0 (or None: ask again next \
                 step) and a bool; or None",
            ))
        })
    }

    fn update_state_after_alloc(
        &mut self,
        request: &Request<RequestId>,
        block_ids: &[BlockId],
        num_external_tokens: usize,
    ) -> Result<()> {
        Python::attach(|py| {
            let blocks = PyArray1::from_slice(py, block_ids);
            let args = (view(py, request)?, blocks, num_external_tokens);
            self.0.call(py, "update_state_after_alloc", args).map(drop)
        })
    }

    /// Several KV groups: the connector gets a tuple of arrays, one per group.
    fn update_state_after_alloc_groups(
        &mut self,
        request: &Request<RequestId>,
        block_ids: &[&[BlockId]],
        num_external_tokens: usize,
    ) -> Result<()> {
        Python::attach(|py| {
            let args = (
                view(py, request)?,
                groups(py, block_ids)?,
                num_external_tokens,
            );
            self.0.call(py, "update_state_after_alloc", args).map(drop)
        })
    }

    fn request_finished(
        &mut self,
        request: &Request<RequestId>,
        block_ids: &[BlockId],
    ) -> Result<bool> {
        Python::attach(|py| {
            let blocks = PyArray1::from_slice(py, block_ids).into_any();
            self.finished(py, request, blocks)
        })
    }

    /// Several KV groups: the connector gets a tuple of arrays, one per group.
    fn request_finished_groups(
        &mut self,
        request: &Request<RequestId>,
        block_ids: &[&[BlockId]],
    ) -> Result<bool> {
        Python::attach(|py| {
            let tables = groups(py, block_ids)?.into_any();
            self.finished(py, request, tables)
        })
    }

    fn supports_divergent_local_hybrid_hits(&self) -> bool {
        self.1
    }

    /// An optional method: without it, the default groups.
    fn get_loaded_kv_cache_group_ids(
        &mut self,
        request: &Request<RequestId>,
    ) -> Result<Option<Vec<usize>>> {
        const METHOD: &str = "get_loaded_kv_cache_group_ids";
        Python::attach(|py| {
            if !self.0.has(py, METHOD) {
                return Ok(None);
            }
            let answer = self.0.call(py, METHOD, (view(py, request)?,))?;
            if answer.is_none() {
                return Ok(None);
            }
            let ids = (answer.try_iter().ok())
                .and_then(|items| items.map(|i| i.ok().as_ref().and_then(count)).collect());
            ids.map(Some).ok_or_else(|| {
                Error::connector(
                    METHOD,
                    short_repr(&answer),
                    "must return an iterable of KV cache group indices (ints >= 0), or None",
                )
            })
        })
    }
}

/// Each group's block table as a tuple of arrays.
fn groups<'py>(py: Python<'py>, block_ids: &[&[BlockId]]) -> Result<Bound<'py, PyTuple>> {
    let arrays = block_ids.iter().map(|t| PyArray1::from_slice(py, t));
    PyTuple::new(py, arrays).map_err(|err| Error::connector("block_ids", &err, "tuple"))
}

impl PyConnector {
    /// `request_finished(view, blocks)`, its answer checked.
    fn finished(
        &self,
        py: Python<'_>,
        request: &Request<RequestId>,
        blocks: Bound<'_, PyAny>,
    ) -> Result<bool> {
        const METHOD: &str = "request_finished";
        {
            let answer = self.0.call(py, METHOD, (view(py, request)?, blocks))?;
            // vLLM returns (delay_free_blocks, kv_transfer_params); tokenyard has no use for
            // the params, so a bare bool is enough.
            let delay = match answer.cast::<PyTuple>() {
                Ok(pair) if pair.len() == 2 => pair.get_item(0).ok(),
                Ok(_) => None,
                Err(_) => Some(answer.clone()),
            };
            delay.and_then(|d| d.extract::<bool>().ok()).ok_or_else(|| {
                Error::connector(
                    METHOD,
                    short_repr(&answer),
                    "must return a bool (or vLLM's (bool, kv_transfer_params))",
                )
            })
        }
    }
}

/// A KV load that began this step: the engine moves `num_external_tokens` tokens (and
/// `num_host_tokens` from the host tier) into the request's blocks, then reports it through
/// `Scheduler.finish_kv_transfers`.
#[pyclass(name = "KvLoad", module = "tokenyard.sched", frozen, get_all)]
pub(crate) struct PyKvLoad {
    request_id: Py<PyAny>,
    num_external_tokens: usize,
    num_host_tokens: usize,
}

#[pymethods]
impl PyKvLoad {
    fn __repr__(&self, py: Python<'_>) -> String {
        let id = self.request_id.bind(py);
        format!(
            "KvLoad(request_id={}, num_external_tokens={}, num_host_tokens={})",
            short_repr(id),
            self.num_external_tokens,
            self.num_host_tokens
        )
    }
}

pub(crate) fn kv_loads(py: Python<'_>, loads: &[KvLoad<RequestId>]) -> PyResult<Vec<Py<PyKvLoad>>> {
    loads
        .iter()
        .map(|load| {
            let load = PyKvLoad {
                request_id: load.request_id.clone().into_py(py)?,
                num_external_tokens: load.num_external_tokens,
                num_host_tokens: load.num_host_tokens,
            };
            Py::new(py, load)
        })
        .collect()
}

/// An iterable of request ids (a lone id, even a str, is refused: it is not a list of them).
pub(crate) fn request_ids(obj: &Bound<'_, PyAny>, arg: &'static str) -> PyResult<Vec<RequestId>> {
    let py = obj.py();
    let not_ids = || {
        input_error(
            py,
            arg,
            short_repr(obj),
            "must be an iterable of request ids",
        )
    };
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyInt>() {
        return Err(not_ids());
    }
    obj.try_iter()
        .map_err(|_| not_ids())?
        .map(|id| RequestId::from_py(&id?))
        .collect()
}
