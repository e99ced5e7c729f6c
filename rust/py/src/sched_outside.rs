//! `tokenyard.sched.Scheduler`'s waits its caller decides (vLLM's blocked waiting statuses the
//! core does not model) and the queue parts. Conversions only; the core's side is
//! `sched::outside_wait`.

use pyo3::prelude::*;

use super::PyScheduler;
use crate::convert::RequestId;

#[pymethods]
impl PyScheduler {
    /// The waiting requests served first (vLLM 0.33's `kv_holding_waiting`), in order.
    fn holding_waiting_ids<'py>(&self, py: Python<'py>) -> PyResult<Vec<Py<PyAny>>> {
        self.inner
            .holding_waiting_ids()
            .into_iter()
            .map(|id| id.into_py(py))
            .collect()
    }

    /// Makes a waiting request's wait its caller's (`holds_kv`: served with the block
    /// holders, a remote-KV wait): skipped, keeping its place, until the step hook
    /// `waiting_ready` answers true when admission reaches it, or `end_outside_wait`;
    /// with `defer` (the default) counted as skipped (vLLM's `deferred_waiting`).
    #[pyo3(signature = (request_id, holds_kv, defer = true))]
    fn wait_outside(
        &mut self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        holds_kv: bool,
        defer: bool,
    ) -> PyResult<()> {
        let id = RequestId::from_py(request_id)?;
        self.inner
            .wait_outside(&id, holds_kv, defer)
            .map_err(|err| self.raise(py, err))
    }

    /// Ends a request's outside wait; whether it had one.
    fn end_outside_wait(
        &mut self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let id = RequestId::from_py(request_id)?;
        self.inner
            .end_outside_wait(&id)
            .map_err(|err| self.raise(py, err))
    }

    /// Whether the request is live and waits outside.
    fn waits_outside(&self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = RequestId::from_py(request_id)?;
        Ok(self.inner.waits_outside(&id))
    }

    /// Moves a waiting request holding no blocks to the back of the block holders
    /// (`holding`) or of the rest.
    fn requeue_waiting(
        &mut self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        holding: bool,
    ) -> PyResult<()> {
        let id = RequestId::from_py(request_id)?;
        self.inner
            .requeue_waiting(&id, holding)
            .map_err(|err| self.raise(py, err))
    }
}
