use numpy::PyArray1;
use pyo3::prelude::*;
use tokenyard_core::kv::{NodeHandle, RadixCache};

use crate::convert::{count_arg, kv_values, positive_field, token_ids as read_token_ids};
use crate::errors::{OrRaise, invariants};

/// SGLang's radix prefix cache: a radix tree over token ids holding one KV slot index per
/// token, with lock counts protecting in-use prefixes and LRU eviction of unlocked leaves.
#[pyclass(name = "RadixCache", module = "tokenyard.kv")]
pub(crate) struct PyRadixCache {
    inner: RadixCache,
}

/// Names the last node of a match; lock it while a request uses the prefix.
#[pyclass(name = "NodeHandle", module = "tokenyard.kv", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash)]
pub(crate) struct PyNodeHandle {
    inner: NodeHandle,
}

#[pymethods]
impl PyNodeHandle {
    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// What `RadixCache.match_prefix` found.
#[pyclass(name = "MatchResult", module = "tokenyard.kv", frozen)]
pub(crate) struct PyMatchResult {
    #[pyo3(get)]
    matched_len: usize,
    #[pyo3(get)]
    values: Py<PyArray1<i64>>,
    #[pyo3(get)]
    handle: Py<PyNodeHandle>,
}

#[pymethods]
impl PyMatchResult {
    fn __repr__(&self) -> String {
        format!("MatchResult(matched_len={})", self.matched_len)
    }
}

#[pymethods]
impl PyRadixCache {
    #[new]
    #[pyo3(signature = (*, page_size = None))]
    fn new(py: Python<'_>, page_size: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let page_size = page_size.map_or(Ok(1), |p| positive_field(p, "page_size"))?;
        Ok(Self {
            inner: RadixCache::new(page_size).or_raise(py)?,
        })
    }

    #[getter]
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    #[getter]
    fn evictable_size(&self) -> usize {
        self.inner.evictable_size()
    }

    #[getter]
    fn protected_size(&self) -> usize {
        self.inner.protected_size()
    }

    #[getter]
    fn total_size(&self) -> usize {
        self.inner.total_size()
    }

    #[getter]
    fn num_nodes(&self) -> usize {
        self.inner.num_nodes()
    }

    fn match_prefix(&mut self, token_ids: &Bound<'_, PyAny>) -> PyResult<PyMatchResult> {
        let py = token_ids.py();
        let tokens = read_token_ids(token_ids, "token_ids")?;
        let found = self.inner.match_prefix(&tokens);
        Ok(PyMatchResult {
            matched_len: found.matched_len,
            values: PyArray1::from_vec(py, found.values).unbind(),
            handle: Py::new(
                py,
                PyNodeHandle {
                    inner: found.handle,
                },
            )?,
        })
    }

    fn insert(
        &mut self,
        token_ids: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let py = token_ids.py();
        let tokens = read_token_ids(token_ids, "token_ids")?;
        let values = kv_values(values, "values")?;
        self.inner.insert(&tokens, &values).or_raise(py)
    }

    fn lock(&mut self, py: Python<'_>, handle: PyRef<'_, PyNodeHandle>) -> PyResult<()> {
        self.inner.lock(handle.inner).or_raise(py)
    }

    fn unlock(&mut self, py: Python<'_>, handle: PyRef<'_, PyNodeHandle>) -> PyResult<()> {
        self.inner.unlock(handle.inner).or_raise(py)
    }

    fn evict<'py>(
        &mut self,
        py: Python<'py>,
        num_tokens: i64,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let num_tokens = count_arg(py, "num_tokens", num_tokens, 0)?;
        Ok(PyArray1::from_vec(py, self.inner.evict(num_tokens)))
    }

    fn reset(&mut self) {
        self.inner.reset();
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        invariants(py, self.inner.check_invariants())
    }

    fn __repr__(&self) -> String {
        format!(
            "RadixCache(page_size={}, total_size={}, evictable_size={}, protected_size={}, num_nodes={})",
            self.inner.page_size(),
            self.inner.total_size(),
            self.inner.evictable_size(),
            self.inner.protected_size(),
            self.inner.num_nodes()
        )
    }
}
