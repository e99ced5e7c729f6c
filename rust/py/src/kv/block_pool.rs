use numpy::PyArray1;
use pyo3::prelude::*;
use tokenyard_core::kv::{
    BlockHash, BlockId, BlockPool, BlockPoolStats, ComputedBlocks, HostTier, KvCapacity,
    hash_full_blocks,
};

use super::{allocate_slots, block_ref_count, has_request, of_request, on_request};
use crate::convert::{
    RequestId, count_arg, non_negative_field, positive_field, token_ids as read_token_ids,
};
use crate::errors::{OrRaise, invariants};

/// vLLM V1's prefix-caching block pool: block ids with ref counts, an LRU free queue and a
/// chained block-hash cache, plus each request's block table.
#[pyclass(name = "BlockPool", module = "tokenyard.kv")]
pub(crate) struct PyBlockPool {
    inner: BlockPool<RequestId>,
}

/// The cached prefix found by `BlockPool.get_computed_blocks`.
#[pyclass(name = "ComputedBlocks", module = "tokenyard.kv", frozen)]
pub(crate) struct PyComputedBlocks {
    inner: ComputedBlocks,
}

/// Prefix-cache lookups since the pool was built, and the host tier's traffic.
#[pyclass(name = "BlockPoolStats", module = "tokenyard.kv", frozen, get_all)]
pub(crate) struct PyBlockPoolStats {
    num_lookups: u64,
    num_query_tokens: u64,
    num_hit_tokens: u64,
    num_host_hit_tokens: u64,
    num_offloaded_blocks: u64,
    num_loaded_blocks: u64,
    hit_rate: f64,
}

impl From<BlockPoolStats> for PyBlockPoolStats {
    fn from(s: BlockPoolStats) -> Self {
        Self {
            num_lookups: s.num_lookups,
            num_query_tokens: s.num_query_tokens,
            num_hit_tokens: s.num_hit_tokens,
            num_host_hit_tokens: s.num_host_hit_tokens,
            num_offloaded_blocks: s.num_offloaded_blocks,
            num_loaded_blocks: s.num_loaded_blocks,
            hit_rate: s.hit_rate(),
        }
    }
}

#[pymethods]
impl PyBlockPoolStats {
    fn __repr__(&self) -> String {
        format!(
            "BlockPoolStats(num_lookups={}, num_query_tokens={}, num_hit_tokens={}, \
             num_host_hit_tokens={}, num_offloaded_blocks={}, num_loaded_blocks={}, \
             hit_rate={:.4})",
            self.num_lookups,
            self.num_query_tokens,
            self.num_hit_tokens,
            self.num_host_hit_tokens,
            self.num_offloaded_blocks,
            self.num_loaded_blocks,
            self.hit_rate
        )
    }
}

/// `host_num_blocks`: an int >= 0 (0: no tier), checked as a config field like the other
/// sizes (a bool or a float is a `ConfigError`), with a real default of 0.
pub(crate) struct HostNumBlocks(usize);

impl<'a, 'py> FromPyObject<'a, 'py> for HostNumBlocks {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        non_negative_field(&obj, "host_num_blocks").map(HostNumBlocks)
    }
}

fn block_array<'py>(py: Python<'py>, ids: Vec<BlockId>) -> Bound<'py, PyArray1<BlockId>> {
    PyArray1::from_vec(py, ids)
}

#[pymethods]
impl PyComputedBlocks {
    #[getter]
    fn block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<BlockId>> {
        PyArray1::from_slice(py, &self.inner.block_ids)
    }

    #[getter]
    fn num_computed_tokens(&self) -> usize {
        self.inner.num_computed_tokens
    }

    #[getter]
    fn num_host_computed_tokens(&self) -> usize {
        self.inner.num_host_tokens()
    }

    fn __repr__(&self) -> String {
        format!(
            "ComputedBlocks(num_computed_tokens={}, num_host_computed_tokens={}, block_ids={:?})",
            self.inner.num_computed_tokens,
            self.inner.num_host_tokens(),
            self.inner.block_ids
        )
    }
}

#[pymethods]
impl PyBlockPool {
    #[new]
    #[pyo3(
        signature = (*, num_blocks, block_size, enable_caching = true, host_num_blocks = HostNumBlocks(0)),
        text_signature = "(*, num_blocks, block_size, enable_caching=True, host_num_blocks=0)"
    )]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        enable_caching: bool,
        host_num_blocks: HostNumBlocks,
    ) -> PyResult<Self> {
        let num_blocks = positive_field(num_blocks, "num_blocks")?;
        let block_size = positive_field(block_size, "block_size")?;
        let mut inner = BlockPool::new(num_blocks, block_size, enable_caching).or_raise(py)?;
        if host_num_blocks.0 > 0 {
            inner = inner.with_host_tier(host_num_blocks.0).or_raise(py)?;
        }
        Ok(Self { inner })
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_total_blocks()
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    #[getter]
    fn enable_caching(&self) -> bool {
        self.inner.enable_caching()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    #[getter]
    fn num_used_blocks(&self) -> usize {
        self.inner.num_total_blocks() - self.inner.num_free_blocks()
    }

    #[getter]
    fn num_cached_blocks(&self) -> usize {
        self.inner.num_cached_blocks()
    }

    #[getter]
    fn num_cached_free_blocks(&self) -> usize {
        self.inner.num_cached_free_blocks()
    }

    #[getter]
    fn num_requests(&self) -> usize {
        self.inner.num_requests()
    }

    #[getter]
    fn host_num_blocks(&self) -> usize {
        self.inner.host_tier().map_or(0, HostTier::capacity)
    }

    #[getter]
    fn num_host_blocks(&self) -> usize {
        self.inner.host_tier().map_or(0, HostTier::len)
    }

    fn host_block_hashes(&self) -> Vec<u128> {
        let tier = self.inner.host_tier();
        tier.into_iter()
            .flat_map(HostTier::iter_lru)
            .map(|h| h.0)
            .collect()
    }

    #[getter]
    fn usage(&self) -> f64 {
        self.inner.usage()
    }

    fn stats(&self) -> PyBlockPoolStats {
        self.inner.stats().into()
    }

    #[pyo3(signature = (token_ids, *, extra_key = None))]
    fn get_computed_blocks(
        &mut self,
        token_ids: &Bound<'_, PyAny>,
        extra_key: Option<u64>,
    ) -> PyResult<PyComputedBlocks> {
        let tokens = read_token_ids(token_ids, "token_ids")?;
        let inner = self.inner.get_computed_blocks(&tokens, extra_key);
        Ok(PyComputedBlocks { inner })
    }

    #[pyo3(signature = (request_id, num_new_tokens, num_lookahead_tokens = 0, *, token_ids = None, new_computed_blocks = None, extra_key = None))]
    fn allocate_slots<'py>(
        &mut self,
        request_id: &Bound<'py, PyAny>,
        num_new_tokens: i64,
        num_lookahead_tokens: i64,
        token_ids: Option<&Bound<'py, PyAny>>,
        new_computed_blocks: Option<PyRef<'py, PyComputedBlocks>>,
        extra_key: Option<u64>,
    ) -> PyResult<Option<Bound<'py, PyArray1<BlockId>>>> {
        let hit = new_computed_blocks.as_ref().map(|h| &h.inner);
        let blocks = allocate_slots(
            request_id,
            num_new_tokens,
            num_lookahead_tokens,
            token_ids,
            |id, tokens, num_new, lookahead| {
                self.inner
                    .allocate_slots(id, tokens, num_new, lookahead, hit, extra_key)
            },
        )?;
        Ok(blocks.map(|ids| block_array(request_id.py(), ids)))
    }

    #[pyo3(signature = (request_id, num_external_tokens, *, token_ids, new_computed_blocks = None, extra_key = None))]
    fn allocate_slots_external<'py>(
        &mut self,
        request_id: &Bound<'py, PyAny>,
        num_external_tokens: i64,
        token_ids: &Bound<'py, PyAny>,
        new_computed_blocks: Option<PyRef<'py, PyComputedBlocks>>,
        extra_key: Option<u64>,
    ) -> PyResult<Option<Bound<'py, PyArray1<BlockId>>>> {
        let py = request_id.py();
        let request_id = RequestId::from_py(request_id)?;
        let num_external_tokens = count_arg(py, "num_external_tokens", num_external_tokens, 0)?;
        let tokens = read_token_ids(token_ids, "token_ids")?;
        let hit = new_computed_blocks.as_ref().map(|h| &h.inner);
        let num_new_blocks = self
            .inner
            .allocate_slots_external(&request_id, &tokens, num_external_tokens, hit, extra_key)
            .or_raise(py)?;
        Ok(num_new_blocks.map(|n| {
            let table = self.inner.block_ids(&request_id).unwrap_or_default();
            PyArray1::from_slice(py, &table[table.len() - n..])
        }))
    }

    fn cache_loaded_blocks(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        on_request(request_id, |id| self.inner.cache_loaded_blocks(id))
    }

    fn free(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        on_request(request_id, |id| self.inner.free(id))
    }

    fn block_ids<'py>(
        &self,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<BlockId>>> {
        let ids = of_request(request_id, |id| self.inner.block_ids(id))?;
        Ok(PyArray1::from_slice(request_id.py(), ids))
    }

    fn num_computed_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        of_request(request_id, |id| self.inner.num_computed_tokens(id))
    }

    fn free_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<BlockId>> {
        block_array(py, self.inner.free_block_ids())
    }

    fn ref_count(&self, py: Python<'_>, block_id: i64) -> PyResult<u32> {
        block_ref_count(py, block_id, |b| self.inner.ref_count(b))
    }

    fn reset_prefix_cache(&mut self) -> bool {
        self.inner.reset_prefix_cache()
    }

    /// vLLM 0.33's `BlockPool.touch` on blocks named by id (as a KV connector's scheduler
    /// side calls it): one reference more on each, held outside any request until
    /// `free_blocks`; a free block leaves the free queue, its cached hash kept.
    fn touch(&mut self, py: Python<'_>, block_ids: Vec<BlockId>) -> PyResult<()> {
        self.inner.touch_loose_blocks(&block_ids).or_raise(py)
    }

    /// vLLM 0.33's `BlockPool.free_blocks` on references taken by `touch` (first evicted
    /// first).
    fn free_blocks(&mut self, py: Python<'_>, block_ids: Vec<BlockId>) -> PyResult<()> {
        self.inner.release_loose_blocks(&block_ids).or_raise(py)
    }

    fn __contains__(&self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        has_request(request_id, |id| self.inner.block_ids(id).is_some())
    }

    fn __len__(&self) -> usize {
        self.inner.num_requests()
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        invariants(py, self.inner.check_invariants())
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockPool(num_blocks={}, block_size={}, enable_caching={}, host_num_blocks={}, num_free_blocks={}, num_cached_blocks={}, num_requests={})",
            self.inner.num_total_blocks(),
            self.inner.block_size(),
            if self.inner.enable_caching() {
                "True"
            } else {
                "False"
            },
            self.host_num_blocks(),
            self.inner.num_free_blocks(),
            self.inner.num_cached_blocks(),
            self.inner.num_requests()
        )
    }
}

/// The chained hashes of the full blocks of `token_ids`, as a `BlockPool` of this block
/// size computes them (128-bit ints); with `num_hash_lookahead_tokens`, each covering the
/// tokens after its block, for the blocks that have them.
#[pyfunction]
#[pyo3(signature = (token_ids, *, block_size, extra_key = None, num_hash_lookahead_tokens = 0))]
pub(crate) fn block_hashes(
    token_ids: &Bound<'_, PyAny>,
    block_size: i64,
    extra_key: Option<u64>,
    num_hash_lookahead_tokens: i64,
) -> PyResult<Vec<u128>> {
    let py = token_ids.py();
    let block_size = count_arg(py, "block_size", block_size, 1)?;
    let lookahead = count_arg(
        py,
        "num_hash_lookahead_tokens",
        num_hash_lookahead_tokens,
        0,
    )?;
    let tokens = read_token_ids(token_ids, "token_ids")?;
    let mut hashes: Vec<BlockHash> = Vec::new();
    if lookahead > 0 {
        tokenyard_core::kv::hash_full_blocks_lookahead(
            &mut hashes,
            &tokens,
            block_size,
            lookahead,
            extra_key,
            usize::MAX,
        );
    } else {
        hash_full_blocks(&mut hashes, &tokens, block_size, extra_key);
    }
    Ok(hashes.into_iter().map(|h| h.0).collect())
}

/// The keys a `KvCoordinator` (several KV groups) caches blocks of `group` under, for the
/// hashes `block_hashes` computes (its `block_hash`es; vLLM's
/// `make_block_hash_with_group_id`), in their order.
#[pyfunction]
#[pyo3(signature = (block_hashes, *, group))]
pub(crate) fn group_block_hashes(block_hashes: Vec<u128>, group: usize) -> Vec<u128> {
    (block_hashes.into_iter())
        .map(|hash| tokenyard_core::kv::group_block_hash(BlockHash(hash), group).0)
        .collect()
}
