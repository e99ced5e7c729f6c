//! Maps core errors to the Python classes defined in `tokenyard.errors`, so Python users
//! catch `ConfigError`, `InputError`, ... with the field/argument and value attached.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use tokenyard_core::Error;

static CONFIG_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INPUT_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static UNKNOWN_REQUEST_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static CAPACITY_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INTERNAL_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static POLICY_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static CONNECTOR_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn raise(
    py: Python<'_>,
    class: &PyOnceLock<Py<PyType>>,
    name: &str,
    message: String,
    field: Option<&str>,
    value: Option<&str>,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let class = class.import(py, "tokenyard.errors", name)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("field", field)?;
        kwargs.set_item("value", value)?;
        Ok(PyErr::from_value(class.call((message,), Some(&kwargs))?))
    };
    build().unwrap_or_else(|err| err)
}

/// The Python exception for a core error.
pub(crate) fn to_py_err(py: Python<'_>, err: Error) -> PyErr {
    let message = err.to_string();
    match &err {
        Error::Config { field, value, .. } => raise(
            py,
            &CONFIG_ERROR,
            "ConfigError",
            message,
            Some(field),
            Some(value),
        ),
        Error::Input { arg, value, .. } => raise(
            py,
            &INPUT_ERROR,
            "InputError",
            message,
            Some(arg),
            Some(value),
        ),
        Error::Rejected { request, .. } => raise(
            py,
            &INPUT_ERROR,
            "InputError",
            message,
            Some("request"),
            Some(&request.to_string()),
        ),
        Error::UnknownRequest(id) => raise(
            py,
            &UNKNOWN_REQUEST_ERROR,
            "UnknownRequestError",
            message,
            Some("request_id"),
            Some(id),
        ),
        Error::Plugin(_) => raise(
            py,
            &POLICY_ERROR,
            "PolicyError",
            message,
            Some("plugin"),
            None,
        ),
        Error::Internal(_) => raise(py, &INTERNAL_ERROR, "InternalError", message, None, None),
        Error::Connector { method, value, .. } => raise(
            py,
            &CONNECTOR_ERROR,
            "ConnectorError",
            message,
            Some(method),
            Some(value),
        ),
        Error::Stalled(_) => raise(
            py,
            &CAPACITY_ERROR,
            "CapacityError",
            message,
            Some("scheduling"),
            None,
        ),
        Error::Capacity { what, .. } => raise(
            py,
            &CAPACITY_ERROR,
            "CapacityError",
            message,
            Some(what),
            None,
        ),
    }
}

/// Reports a broken internal invariant (a bug in tokenyard) rather than hiding it.
pub(crate) fn invariants(py: Python<'_>, checked: Result<(), String>) -> PyResult<()> {
    checked.map_err(|message| raise(py, &INTERNAL_ERROR, "InternalError", message, None, None))
}

/// The error for a request id the object does not hold.
pub(crate) fn unknown_request(py: Python<'_>, request_id: &impl std::fmt::Debug) -> PyErr {
    to_py_err(py, Error::unknown_request(request_id))
}

/// `?`-friendly conversion of core results.
pub(crate) trait OrRaise<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> OrRaise<T> for tokenyard_core::Result<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|err| to_py_err(py, err))
    }
}

/// A config-field error raised from argument checks in the binding layer.
pub(crate) fn config_error(
    py: Python<'_>,
    field: &'static str,
    value: impl ToString,
    reason: &str,
) -> PyErr {
    to_py_err(py, Error::config(field, value.to_string(), reason))
}

/// An argument error raised from conversions in the binding layer.
pub(crate) fn input_error(
    py: Python<'_>,
    arg: &'static str,
    value: impl ToString,
    reason: &str,
) -> PyErr {
    to_py_err(py, Error::input(arg, value.to_string(), reason))
}

/// A Python exception raised inside a callback the core made (a plugin, the workload
/// iterator, the progress callback), kept until the call into the core returns and then
/// re-raised unchanged. One type for every caller.
#[derive(Clone, Default)]
pub(crate) struct ErrorSlot(std::sync::Arc<std::sync::Mutex<Option<PyErr>>>);

impl ErrorSlot {
    /// Keeps `err` and returns the core error that unwinds the call.
    pub(crate) fn keep(&self, what: &str, err: PyErr) -> Error {
        let message = format!("{what} raised {err}");
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(err);
        Error::Plugin(message)
    }

    /// Keeps `err` as the cause of the core error a callback returns, unless an earlier
    /// one is kept: a core call that goes on after a callback fails returns the first error.
    pub(crate) fn keep_cause(&self, err: PyErr) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(err);
    }

    /// The kept exception, if any (it wins over the core error it caused).
    pub(crate) fn take(&self) -> Option<PyErr> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}
