//! A Python object as the step scheduler's encoder-cache connector (vLLM 0.33's
//! `ECConnectorBase` calls made while a step is formed: `has_cache_item(identifier)`,
//! `update_state_after_alloc(view, input_id)`, and `ensure_cache_available(view,
//! num_computed_tokens)` where the object has it) and while an update is applied
//! (`update_state_after_free(view, input_id)` where the object has it), and when a request
//! finishes (`request_finished(view)` where the object has it: a delay-free bool). Conversions and checks of its answers only;
//! what the scheduler does with them is the core's (`sched::encoder_connector`).

use pyo3::prelude::*;
use tokenyard_core::sched::{EncoderConnector, Request};
use tokenyard_core::{Error, Result};

use crate::convert::{RequestId, short_repr};
use crate::errors::ErrorSlot;
use crate::py_callee::PyCallee;
use crate::sched_connector::view;

const METHODS: [&str; 2] = ["has_cache_item", "update_state_after_alloc"];

/// A Python encoder-cache connector. Each call re-takes the GIL; an exception it raises is
/// kept in `error` and becomes the `__cause__` of the `ConnectorError` raised.
pub(crate) struct PyEncoderConnector {
    callee: PyCallee,
    /// Whether it has `ensure_cache_available` (optional: without it every output counts as
    /// at hand, vLLM's base answer).
    ensures: bool,
    /// Whether it has `update_state_after_free` (optional: vLLM's base does nothing).
    frees: bool,
    /// Whether it has `request_finished` (optional: without it no request's blocks are
    /// kept for it).
    finishes: bool,
}

impl PyEncoderConnector {
    /// Wraps `object` after checking it has the two methods (a `ConfigError` naming
    /// `field` otherwise).
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
            "an encoder-cache connector may only read what it is given",
        )?;
        let ensures = callee.has(object.py(), "ensure_cache_available");
        let frees = callee.has(object.py(), "update_state_after_free");
        let finishes = callee.has(object.py(), "request_finished");
        Ok(Self {
            callee,
            ensures,
            frees,
            finishes,
        })
    }
}

impl EncoderConnector<RequestId> for PyEncoderConnector {
    fn has_cache_item(&mut self, identifier: &str) -> Result<bool> {
        const METHOD: &str = "has_cache_item";
        Python::attach(|py| {
            let answer = self.callee.call(py, METHOD, (identifier,))?;
            // vLLM's connectors answer a bool (numpy's bool_ extracts too).
            answer
                .extract::<bool>()
                .map_err(|_| Error::connector(METHOD, short_repr(&answer), "must return a bool"))
        })
    }

    fn update_state_after_alloc(
        &mut self,
        request: &Request<RequestId>,
        input_id: usize,
    ) -> Result<()> {
        Python::attach(|py| {
            let args = (view(py, request)?, input_id);
            self.callee
                .call(py, "update_state_after_alloc", args)
                .map(drop)
        })
    }

    fn update_state_after_free(
        &mut self,
        request: &Request<RequestId>,
        input_id: usize,
    ) -> Result<()> {
        if !self.frees {
            return Ok(());
        }
        Python::attach(|py| {
            let args = (view(py, request)?, input_id);
            self.callee
                .call(py, "update_state_after_free", args)
                .map(drop)
        })
    }

    fn request_finished(&mut self, request: &Request<RequestId>) -> Result<bool> {
        const METHOD: &str = "request_finished";
        if !self.finishes {
            return Ok(false);
        }
        Python::attach(|py| {
            let answer = self.callee.call(py, METHOD, (view(py, request)?,))?;
            answer
                .extract::<bool>()
                .map_err(|_| Error::connector(METHOD, short_repr(&answer), "must return a bool"))
        })
    }

    fn ensure_cache_available(
        &mut self,
        request: &Request<RequestId>,
        num_computed_tokens: usize,
    ) -> Result<bool> {
        const METHOD: &str = "ensure_cache_available";
        if !self.ensures {
            return Ok(true);
        }
        Python::attach(|py| {
            let args = (view(py, request)?, num_computed_tokens);
            let answer = self.callee.call(py, METHOD, args)?;
            answer
                .extract::<bool>()
                .map_err(|_| Error::connector(METHOD, short_repr(&answer), "must return a bool"))
        })
    }
}

/// `object` as the core's connector (`None` stays `None`), its exceptions kept in `error`.
pub(crate) fn boxed(
    object: Option<&Bound<'_, PyAny>>,
    error: ErrorSlot,
) -> PyResult<Option<Box<dyn EncoderConnector<RequestId>>>> {
    let Some(object) = object else {
        return Ok(None);
    };
    let connector = PyEncoderConnector::new(object, "encoder_connector", error)?;
    Ok(Some(Box::new(connector)))
}
