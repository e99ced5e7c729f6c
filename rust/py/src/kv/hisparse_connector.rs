//! `HiSparseConnectorPool`: the core's coordinator with vLLM 0.33's HiSparse connector
//! device half on it (`tokenyard_core::kv::HiSparseConnectorPool`), for checks against
//! vLLM beside `HiSparseDeviceResidency` (same interface). Conversions only.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokenyard_core::kv::{BlockId, DeviceTables, HiSparseConnectorPool};

use super::host_publication::{counts, hisparse_device_basics};
use super::on_request;
use crate::convert::{RequestId, count_arg, positive_field};
use crate::errors::{OrRaise, invariants};

/// The HiSparse connector's device half (caching off) over the core's KV coordinator.
#[pyclass(name = "HiSparseConnectorPool", module = "tokenyard._core")]
pub(crate) struct PyHiSparseConnectorPool {
    inner: HiSparseConnectorPool<RequestId>,
}

hisparse_device_basics!(PyHiSparseConnectorPool, HiSparseConnectorPool);

#[pymethods]
impl PyHiSparseConnectorPool {
    fn allocate_slots(&mut self, request_id: &Bound<'_, PyAny>, num_tokens: i64) -> PyResult<bool> {
        let py = request_id.py();
        let n = count_arg(py, "num_tokens", num_tokens, 1)?;
        let id = RequestId::from_py(request_id)?;
        self.inner.allocate_slots(id, n).or_raise(py)
    }

    fn advance_scheduled(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        num_computed_tokens: i64,
    ) -> PyResult<()> {
        let n = count_arg(
            request_id.py(),
            "num_computed_tokens",
            num_computed_tokens,
            0,
        )?;
        on_request(request_id, |id| self.inner.advance_scheduled(id, n))
    }

    /// `[(transfer_id, host_block_id, resident_block_id)]` planned since the last call.
    fn take_transfers(&mut self) -> Vec<(u64, BlockId, BlockId)> {
        self.inner
            .take_transfers()
            .into_iter()
            .map(|t| (t.transfer_id, t.host_block_id, t.resident_block_id))
            .collect()
    }

    /// `[(request_id, page)]` lost since the last call, in the order their blocks were
    /// handed out again.
    fn take_lost_pages(&mut self, py: Python<'_>) -> PyResult<Vec<(Py<PyAny>, usize)>> {
        (self.inner.take_lost_pages().into_iter())
            .map(|(id, page)| Ok((id.into_py(py)?, page)))
            .collect()
    }

    fn acknowledge(
        &mut self,
        py: Python<'_>,
        enqueued: &Bound<'_, PyDict>,
        completed: &Bound<'_, PyDict>,
    ) -> PyResult<()> {
        let enqueued = counts(enqueued, "enqueued")?;
        let completed = counts(completed, "completed")?;
        self.inner.acknowledge(&enqueued, &completed).or_raise(py)
    }

    fn free(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        on_request(request_id, |id| self.inner.free(id))
    }

    fn check(&self, py: Python<'_>) -> PyResult<()> {
        invariants(py, self.inner.check())
    }
}
