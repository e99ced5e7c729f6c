//! `HiSparseHostPublication` and `HiSparseDeviceResidency`: the core's models of vLLM
//! 0.33's HiSparse connector, host publication (`tokenyard_core::kv::HostPublication`) and
//! device residency with caching off (`kv::DeviceResidency`), for checks against vLLM and
//! the Python reference models. Conversions only.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokenyard_core::kv::{BlockId, DeviceResidency, DeviceTables, HostPublication};

use super::on_request;
use crate::convert::{RequestId, count_arg, positive_field, token_ids as read_token_ids};
use crate::errors::{OrRaise, input_error, invariants};

/// vLLM 0.33's HiSparse host pool with prefix caching on, as the HiSparse connector's
/// write-backs and the worker's acknowledgements drive it.
#[pyclass(name = "HiSparseHostPublication", module = "tokenyard._core")]
pub(crate) struct PyHostPublication {
    inner: HostPublication<RequestId>,
}

/// `{transfer_id: count}` as (id, count) pairs, in the dict's order.
pub(crate) fn counts(dict: &Bound<'_, PyDict>, arg: &'static str) -> PyResult<Vec<(u64, u32)>> {
    let py = dict.py();
    dict.iter()
        .map(|(id, count)| {
            let id: i64 = id.extract()?;
            let count: i64 = count.extract()?;
            if id < 0 || !(0..=i64::from(u32::MAX)).contains(&count) {
                return Err(input_error(
                    py,
                    arg,
                    format!("{{{id}: {count}}}"),
                    "ids and counts are non-negative",
                ));
            }
            Ok((id as u64, count as u32))
        })
        .collect()
}

#[pymethods]
impl PyHostPublication {
    #[new]
    #[pyo3(signature = (*, num_blocks, block_size, max_spill_pages))]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        max_spill_pages: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let num_blocks = positive_field(num_blocks, "hisparse_host_num_blocks")?;
        let block_size = positive_field(block_size, "block_size")?;
        let max_spill_pages = positive_field(max_spill_pages, "max_spill_pages")?;
        let inner = HostPublication::new(num_blocks, block_size, max_spill_pages).or_raise(py)?;
        Ok(Self { inner })
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    fn free_blocks(&self) -> Vec<BlockId> {
        self.inner.free_blocks()
    }

    fn published_blocks(&self) -> Vec<BlockId> {
        self.inner.published_blocks()
    }

    fn ref_count(&self, block_id: BlockId) -> u32 {
        self.inner.ref_count(block_id)
    }

    fn table(&self, request_id: &Bound<'_, PyAny>) -> PyResult<Option<Vec<BlockId>>> {
        Ok(self
            .inner
            .table(&RequestId::from_py(request_id)?)
            .map(<[BlockId]>::to_vec))
    }

    fn hit_blocks(&self, token_ids: &Bound<'_, PyAny>) -> PyResult<Vec<BlockId>> {
        Ok(self
            .inner
            .hit_blocks(&read_token_ids(token_ids, "token_ids")?))
    }

    fn has_pending_work(&self) -> bool {
        self.inner.has_pending_work()
    }

    fn has_pending_host_reclamation(&self) -> bool {
        self.inner.has_pending_host_reclamation()
    }

    #[pyo3(signature = (request_id, token_ids, max_new_tokens = None))]
    fn admit(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
        max_new_tokens: Option<i64>,
    ) -> PyResult<Option<usize>> {
        let py = request_id.py();
        let tokens = read_token_ids(token_ids, "token_ids")?;
        let max_new_tokens = max_new_tokens
            .map(|n| count_arg(py, "max_new_tokens", n, 1))
            .transpose()?;
        let id = RequestId::from_py(request_id)?;
        self.inner.admit(id, tokens, max_new_tokens).or_raise(py)
    }

    fn step(&mut self, request_id: &Bound<'_, PyAny>, num_new_tokens: i64) -> PyResult<bool> {
        let n = count_arg(request_id.py(), "num_new_tokens", num_new_tokens, 1)?;
        on_request(request_id, |id| self.inner.step(id, n))
    }

    fn decode(&mut self, request_id: &Bound<'_, PyAny>, token_id: u32) -> PyResult<bool> {
        on_request(request_id, |id| self.inner.decode(id, token_id))
    }

    /// `[(transfer_id, host_block_id)]` planned since the last call.
    fn take_transfers(&mut self) -> Vec<(u64, BlockId)> {
        self.inner
            .take_transfers()
            .into_iter()
            .map(|t| (t.transfer_id, t.host_block_id))
            .collect()
    }

    fn acknowledge(
        &mut self,
        py: Python<'_>,
        enqueued: &Bound<'_, PyDict>,
        completed: &Bound<'_, PyDict>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let enqueued = counts(enqueued, "enqueued")?;
        let completed = counts(completed, "completed")?;
        let live = self.inner.acknowledge(&enqueued, &completed).or_raise(py)?;
        live.into_iter().map(|id| id.into_py(py)).collect()
    }

    fn publish_ready(&mut self, request_ids: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let ids = request_ids
            .iter()
            .map(RequestId::from_py)
            .collect::<PyResult<Vec<_>>>()?;
        self.inner.publish_ready(&ids);
        Ok(())
    }

    #[pyo3(signature = (request_id, *, finished = true))]
    fn free(&mut self, request_id: &Bound<'_, PyAny>, finished: bool) -> PyResult<()> {
        on_request(request_id, |id| self.inner.free(id, finished))
    }

    fn check(&self, py: Python<'_>) -> PyResult<()> {
        invariants(py, self.inner.check())
    }
}

/// The constructor and read-outs `HiSparseDeviceResidency` and `HiSparseConnectorPool` share
/// (one interface over two cores, so vLLM checks run on either): `$py` wraps `$core` as
/// `inner`.
macro_rules! hisparse_device_basics {
    ($py:ty, $core:ident) => {
        #[pymethods]
        impl $py {
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
                let inner = $core::new(
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

            /// `(host, indexer, resident, hot)` block ids, or None.
            fn tables(&self, request_id: &Bound<'_, PyAny>) -> PyResult<Option<DeviceTables>> {
                Ok(self.inner.tables(&RequestId::from_py(request_id)?))
            }

            fn has_pending_work(&self) -> bool {
                self.inner.has_pending_work()
            }

            fn has_pending_reclamation(&self) -> bool {
                self.inner.has_pending_reclamation()
            }
        }
    };
}
pub(crate) use hisparse_device_basics;

/// The HiSparse connector's device half with prefix caching off (the core's
/// `kv::DeviceResidency`), for checks against vLLM and the Python reference model.
#[pyclass(name = "HiSparseDeviceResidency", module = "tokenyard._core")]
pub(crate) struct PyDeviceResidency {
    inner: DeviceResidency<RequestId>,
}

hisparse_device_basics!(PyDeviceResidency, DeviceResidency);

#[pymethods]
impl PyDeviceResidency {
    #[pyo3(signature = (request_id, num_tokens, max_new_tokens = None))]
    fn admit(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        num_tokens: i64,
        max_new_tokens: Option<i64>,
    ) -> PyResult<bool> {
        let py = request_id.py();
        let num_tokens = count_arg(py, "num_tokens", num_tokens, 1)?;
        let max_new_tokens = max_new_tokens
            .map(|n| count_arg(py, "max_new_tokens", n, 1))
            .transpose()?;
        let id = RequestId::from_py(request_id)?;
        self.inner
            .admit(id, num_tokens, max_new_tokens)
            .or_raise(py)
    }

    fn step(&mut self, request_id: &Bound<'_, PyAny>, num_new_tokens: i64) -> PyResult<bool> {
        let n = count_arg(request_id.py(), "num_new_tokens", num_new_tokens, 1)?;
        on_request(request_id, |id| self.inner.step(id, n))
    }

    fn decode(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        on_request(request_id, |id| self.inner.decode(id))
    }

    /// vLLM's `allocate_slots` as its scheduler calls it: the tables grow to back
    /// `num_tokens` slots (a new request admitted); nothing planned until
    /// `advance_scheduled`. False when the pools cannot back them.
    fn allocate_slots(&mut self, request_id: &Bound<'_, PyAny>, num_tokens: i64) -> PyResult<bool> {
        let py = request_id.py();
        let n = count_arg(py, "num_tokens", num_tokens, 1)?;
        let id = RequestId::from_py(request_id)?;
        self.inner.allocate_slots(id, n).or_raise(py)
    }

    /// vLLM's `advance_scheduled` for one request: write-backs planned for the pages
    /// sealed by `num_computed_tokens`, then its residency updated.
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
