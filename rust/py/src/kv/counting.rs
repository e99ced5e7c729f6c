use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tokenyard_core::kv::{CountingAllocator, KvCapacity};

use super::has_request;
use crate::convert::{RequestId, count_arg, positive_field};
use crate::errors::{OrRaise, invariants};

/// Vidur's block-counting KV allocator: how many blocks each request holds, with an
/// optional watermark kept free against new admissions.
#[pyclass(name = "CountingAllocator", module = "tokenyard.kv")]
pub(crate) struct PyCountingAllocator {
    inner: CountingAllocator<RequestId>,
}

#[pymethods]
impl PyCountingAllocator {
    #[new]
    #[pyo3(signature = (*, num_blocks, watermark_fraction = 0.0))]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        watermark_fraction: f64,
    ) -> PyResult<Self> {
        let num_blocks = positive_field(num_blocks, "num_blocks")?;
        let inner = CountingAllocator::new(num_blocks, watermark_fraction).or_raise(py)?;
        Ok(Self { inner })
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }

    #[getter]
    fn watermark_blocks(&self) -> usize {
        self.inner.watermark_blocks()
    }

    #[getter]
    fn num_allocated_blocks(&self) -> usize {
        self.inner.num_allocated_blocks()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    #[getter]
    fn usage(&self) -> f64 {
        self.inner.usage()
    }

    #[getter]
    fn num_requests(&self) -> usize {
        self.inner.num_requests()
    }

    fn can_allocate(&self, py: Python<'_>, num_blocks: i64) -> PyResult<bool> {
        Ok(self
            .inner
            .can_allocate(count_arg(py, "num_blocks", num_blocks, 0)?))
    }

    fn can_admit(&self, py: Python<'_>, num_blocks: i64) -> PyResult<bool> {
        Ok(self
            .inner
            .can_admit(count_arg(py, "num_blocks", num_blocks, 0)?))
    }

    fn allocate(&mut self, request_id: &Bound<'_, PyAny>, num_blocks: i64) -> PyResult<()> {
        let py = request_id.py();
        let request_id = RequestId::from_py(request_id)?;
        let num_blocks = count_arg(py, "num_blocks", num_blocks, 1)?;
        self.inner.allocate(request_id, num_blocks).or_raise(py)
    }

    #[pyo3(signature = (*request_ids))]
    fn free(&mut self, request_ids: &Bound<'_, PyTuple>) -> PyResult<usize> {
        let ids = request_ids
            .iter()
            .map(|id| RequestId::from_py(&id))
            .collect::<PyResult<Vec<_>>>()?;
        self.inner.free(&ids).or_raise(request_ids.py())
    }

    fn num_blocks_of(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        Ok(self
            .inner
            .num_blocks_of(&RequestId::from_py(request_id)?)
            .unwrap_or(0))
    }

    fn __contains__(&self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        has_request(request_id, |id| self.inner.num_blocks_of(id).is_some())
    }

    fn __len__(&self) -> usize {
        self.inner.num_requests()
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        invariants(py, self.inner.check_invariants())
    }

    fn __repr__(&self) -> String {
        format!(
            "CountingAllocator(num_blocks={}, num_allocated_blocks={}, watermark_blocks={}, num_requests={})",
            self.inner.num_blocks(),
            self.inner.num_allocated_blocks(),
            self.inner.watermark_blocks(),
            self.inner.num_requests()
        )
    }
}
