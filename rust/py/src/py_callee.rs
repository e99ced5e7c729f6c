//! A Python object the scheduler calls while it forms a step (a KV, auxiliary-output or
//! encoder-cache connector): its methods checked once when it is set, and each call's Python
//! exception turned into a core error, the exception kept as the `__cause__` of the
//! `ConnectorError` the scheduler's method raises.

use pyo3::prelude::*;
use tokenyard_core::{Error, Result};

use crate::convert::short_repr;
use crate::errors::ErrorSlot;
use crate::plugin::is_reentry;

pub(crate) struct PyCallee {
    object: Py<PyAny>,
    error: ErrorSlot,
    /// What the object may do while it is asked, said when it calls back into the
    /// scheduler (which is borrowed for the step).
    may_only: &'static str,
}

impl PyCallee {
    /// Wraps `object` after checking it has each of `methods` (a `ConfigError` naming
    /// `field` otherwise).
    pub(crate) fn new(
        object: &Bound<'_, PyAny>,
        field: &'static str,
        error: ErrorSlot,
        methods: &[&str],
        may_only: &'static str,
    ) -> PyResult<Self> {
        for method in methods {
            if !object.hasattr(method)? {
                return Err(crate::errors::config_error(
                    object.py(),
                    field,
                    short_repr(object),
                    &format!("has no method {method}()"),
                ));
            }
        }
        Ok(Self {
            object: object.clone().unbind(),
            error,
            may_only,
        })
    }

    /// Whether the object has the optional `method`.
    pub(crate) fn has(&self, py: Python<'_>, method: &str) -> bool {
        self.object.bind(py).hasattr(method).unwrap_or(false)
    }

    /// Calls `method`; a Python exception becomes a core error naming the method.
    pub(crate) fn call<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        args: impl pyo3::call::PyCallArgs<'py>,
    ) -> Result<Bound<'py, PyAny>> {
        let answer = self.object.bind(py).call_method1(method, args);
        answer.map_err(|err| {
            let error = if is_reentry(py, &err) {
                Error::connector(method, "a call back into the Scheduler", self.may_only)
            } else {
                Error::connector(method, &err, "raised an exception")
            };
            self.error.keep_cause(err);
            error
        })
    }
}
