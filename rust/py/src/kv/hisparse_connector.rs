//! `HiSparseConnectorPool`: the core's coordinator with vLLM 0.33's HiSparse connector
//! device half on it (`tokenyard_core::kv::HiSparseConnectorPool`), for checks against
//! vLLM beside `HiSparseDeviceResidency` (same interface). Conversions only.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokenyard_core::kv::{BlockId, DeviceTables, HiSparseConnectorPool};

use super::host_publication::counts;
use super::on_request;
use crate::convert::{RequestId, count_arg, positive_field};
use crate::errors::{OrRaise, invariants};

/// The HiSparse connector's device half (caching off) over the core's KV coordinator.
#[pyclass(name = "HiSparseConnectorPool", module = "tokenyard._core")]
pub(crate) struct PyHiSparseConnectorPool {
    inner: HiSparseConnectorPool<RequestId>,
}

#[pymethods]
impl PyHiSparseConnectorPool {
    #[new]
    #[pyo3(signature = (
        *, num_blocks, host_num_blocks, block_size, blocks_per_request,
        max_admission_blocks_per_request, max_spill_pages
    ))]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        host_num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        blocks_per_request: &Bound<'_, PyAny>,
        max_admission_blocks_per_request: &Bound<'_, PyAny>,
        max_spill_pages: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let inner = HiSparseConnectorPool::new(
            positive_field(num_blocks, "num_blocks")?,
            positive_field(host_num_blocks, "hisparse_host_num_blocks")?,
            positive_field(block_size, "block_size")?,
            positive_field(blocks_per_request, "blocks_per_request")?,
            positive_field(
                max_admission_blocks_per_request,
                "max_admission_blocks_per_request",
            )?,
            positive_field(max_spill_pages, "max_spill_pages")?,
        )
        .or_raise(py)?;
        Ok(Self { inner })
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    fn free_blocks(&self) -> Vec<BlockId> {
        self.inner.free_blocks()
    }

    fn host_free_blocks(&self) -> Vec<BlockId> {
        self.inner.host_free_blocks()
    }

    /// `(host, indexer, resident row, hot)` block ids, or None.
    fn tables(&self, request_id: &Bound<'_, PyAny>) -> PyResult<Option<DeviceTables>> {
        Ok(self.inner.tables(&RequestId::from_py(request_id)?))
    }

    fn has_pending_work(&self) -> bool {
        self.inner.has_pending_work()
    }

    fn has_pending_reclamation(&self) -> bool {
        self.inner.has_pending_reclamation()
    }

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
