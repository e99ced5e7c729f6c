//! `tokenyard.sched.Scheduler`'s failed KV loads (vLLM 0.33's `kv_load_failure_policy`,
//! `failed_recving` and `invalid_block_ids`). Conversions only; the core's side is
//! `sched::load_failures`.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tokenyard_core::sched::KvLoadFailurePolicy;

use super::PyScheduler;
use crate::convert::RequestId;
use crate::errors::OrRaise;
use crate::sched_connector::request_ids;
use crate::sched_output::id_list;

/// `handle_kv_load_failures`' answer: `(truncated, rescheduled, failed, num_affected_tokens)`.
type Report<'py> = (
    Vec<(Py<PyAny>, usize)>,
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    usize,
);

#[pymethods]
impl PyScheduler {
    /// vLLM 0.33's `kv_load_failure_policy`: `"recompute"` (the default) or `"fail"`.
    /// Raises ConfigError for any other name.
    #[getter]
    fn kv_load_failure_policy(&self) -> &'static str {
        self.inner.kv_load_failure_policy().name()
    }

    #[setter]
    fn set_kv_load_failure_policy(&mut self, py: Python<'_>, policy: &str) -> PyResult<()> {
        let policy = KvLoadFailurePolicy::from_name(policy).or_raise(py)?;
        self.inner.set_kv_load_failure_policy(policy);
        Ok(())
    }

    /// Loading requests whose load failed (whole or in part) and was not taken yet (vLLM
    /// 0.33's `failed_recving_kv_req_ids`), in no particular order.
    fn failed_load_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        id_list(py, &self.inner.failed_load_ids())
    }

    /// The engine's failed KV loads for the step being updated, applied before its outputs
    /// (see the core's `handle_kv_load_failures`): `failed_recving` (ids whose load failed
    /// whole), `invalid_block_ids` (blocks a load left invalid) and `num_scheduled_tokens`
    /// (the step's tokens by id). Returns `(truncated, rescheduled, failed,
    /// num_affected_tokens)`: every affected request with its computed tokens as cut back;
    /// running requests cut back to their valid prefix, whose outputs of this step are not
    /// to be given; requests the next update finishes with `FinishReason.ERROR` (policy
    /// `"fail"`); the tokens they lost. Raises ConfigError (several KV cache groups) or
    /// InputError, with nothing changed.
    #[pyo3(signature = (*, failed_recving = None, invalid_block_ids = None, num_scheduled_tokens = None))]
    fn handle_kv_load_failures<'py>(
        &mut self,
        py: Python<'py>,
        failed_recving: Option<&Bound<'py, PyAny>>,
        invalid_block_ids: Option<Vec<u32>>,
        num_scheduled_tokens: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Report<'py>> {
        let failed = match failed_recving {
            Some(obj) => request_ids(obj, "failed_recving")?,
            None => Vec::new(),
        };
        let mut scheduled = Vec::new();
        if let Some(dict) = num_scheduled_tokens {
            for (id, n) in dict.iter() {
                scheduled.push((RequestId::from_py(&id)?, n.extract::<usize>()?));
            }
        }
        let invalid = invalid_block_ids.unwrap_or_default();
        let report = self
            .inner
            .handle_kv_load_failures(&failed, &invalid, &scheduled)
            .map_err(|err| self.raise(py, err))?;
        let truncated = (report.truncated.into_iter())
            .map(|(id, n)| Ok((id.into_py(py)?, n)))
            .collect::<PyResult<Vec<_>>>()?;
        Ok((
            truncated,
            id_list(py, &report.rescheduled)?,
            id_list(py, &report.failed)?,
            report.num_affected_tokens,
        ))
    }
}
