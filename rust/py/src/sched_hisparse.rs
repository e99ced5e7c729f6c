//! `tokenyard.sched.Scheduler`'s HiSparse connector step calls (vLLM 0.33's
//! `HiSparseConnector`, prefix caching off). Conversions only; the core's side is
//! `sched::hisparse_step`.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokenyard_core::kv::{BlockId, DeviceTables};

use super::PyScheduler;
use crate::convert::RequestId;
use crate::kv::host_publication::counts;

#[pymethods]
impl PyScheduler {
    /// Turns vLLM 0.33's HiSparse connector on over the host pool and the KV groups, with
    /// at most `max_spill_pages` write-backs planned per step (vLLM:
    /// `max_model_len // block_size`). Raises ConfigError (see the core's
    /// `set_hisparse_connector`).
    #[pyo3(signature = (*, max_spill_pages))]
    fn set_hisparse_connector(&mut self, py: Python<'_>, max_spill_pages: usize) -> PyResult<()> {
        (self.inner.set_hisparse_connector(max_spill_pages)).map_err(|err| self.raise(py, err))
    }

    /// Whether the HiSparse connector is on.
    #[getter]
    fn hisparse_connector(&self) -> bool {
        self.inner.hisparse_connector()
    }

    /// The write-backs planned since the last call, `[(transfer_id, host_block_id,
    /// resident_block_id)]` (vLLM's `build_offload_command`).
    fn take_hisparse_transfers(
        &mut self,
        py: Python<'_>,
    ) -> PyResult<Vec<(u64, BlockId, BlockId)>> {
        let transfers = self.inner.take_hisparse_transfers();
        let transfers = transfers.map_err(|err| self.raise(py, err))?;
        Ok(transfers
            .into_iter()
            .map(|t| (t.transfer_id, t.host_block_id, t.resident_block_id))
            .collect())
    }

    /// `(host, indexer, resident row, hot)` block ids of the request (lost pages 0), or
    /// None when it holds no blocks or the connector is off.
    fn hisparse_tables(&self, request_id: &Bound<'_, PyAny>) -> PyResult<Option<DeviceTables>> {
        Ok(self.inner.hisparse_tables(&RequestId::from_py(request_id)?))
    }

    /// The workers' `{transfer_id: count}` reports (vLLM's `update_spills`), after the
    /// step's update. Raises InputError for a negative id or count.
    fn hisparse_acknowledge(
        &mut self,
        py: Python<'_>,
        enqueued: &Bound<'_, PyDict>,
        completed: &Bound<'_, PyDict>,
    ) -> PyResult<()> {
        let enqueued = counts(enqueued, "enqueued")?;
        let completed = counts(completed, "completed")?;
        let result = self.inner.hisparse_acknowledge(&enqueued, &completed);
        result.map_err(|err| self.raise(py, err))
    }

    /// The HiSparse host pool's free blocks, the next handed out first.
    fn hisparse_host_free_blocks(&self) -> Vec<BlockId> {
        self.inner.hisparse_host_free_blocks()
    }

    /// `[(request_id, page)]` lost to block reuse since the last call.
    fn take_hisparse_lost_pages(&mut self, py: Python<'_>) -> PyResult<Vec<(Py<PyAny>, usize)>> {
        (self.inner.take_hisparse_lost_pages().into_iter())
            .map(|(id, page)| Ok((id.into_py(py)?, page)))
            .collect()
    }

    /// vLLM's `has_pending_reclamation` (the connector's `has_pending_block_frees`).
    #[getter]
    fn hisparse_pending_reclamation(&self) -> bool {
        self.inner.hisparse_pending_reclamation()
    }

    /// Write-backs planned and not yet acknowledged (vLLM's `pending_spills`).
    #[getter]
    fn hisparse_num_pending_transfers(&self) -> usize {
        self.inner.hisparse_num_pending_transfers()
    }

    /// vLLM's `has_pending_work` (the connector's `has_pending_push_work`).
    #[getter]
    fn hisparse_pending_work(&self) -> bool {
        self.inner.hisparse_pending_work()
    }
}
