//! `tokenyard.sched.Scheduler`'s KV views: the pool's blocks, hashes, free list and tables
//! per request or group, prefix probes, the calls vLLM's tests make on its `KVCacheManager`
//! directly (`kv_*_outside`, per-group hits, evictions) and new-block zeroing. Conversions
//! only; the core's side is `sched::kv_inspect` and `sched::kv_outside`.

use numpy::PyArray1;
use pyo3::prelude::*;

use super::PyScheduler;
use crate::convert::RequestId;
use crate::errors::{OrRaise, unknown_request};

#[pymethods]
impl PyScheduler {
    /// Tokens of `token_ids` the prefix cache holds (a probe: nothing is allocated).
    #[pyo3(signature = (token_ids, *, lora_id=None))]
    fn num_cached_prefix_tokens(
        &mut self,
        token_ids: &Bound<'_, PyAny>,
        lora_id: Option<u64>,
    ) -> PyResult<usize> {
        let token_ids = crate::convert::token_ids(token_ids, "token_ids")?;
        Ok(self.inner.num_cached_prefix_tokens(&token_ids, lora_id))
    }

    /// Each KV group's own prefix hit over `block_hashes` (the core's hashes of a query's
    /// first full blocks, `tokenyard.kv.block_hashes`), no longer than `max_length` tokens,
    /// not reconciled (vLLM 0.33's `find_longest_cache_hit_per_group`): a tuple of each
    /// group's block array and a list of their hit lengths. ConfigError without groups.
    fn kv_hits_per_group<'py>(
        &self,
        py: Python<'py>,
        block_hashes: Vec<u128>,
        max_length: usize,
    ) -> PyResult<(Bound<'py, pyo3::types::PyTuple>, Vec<usize>)> {
        let hashes: Vec<_> = block_hashes
            .into_iter()
            .map(tokenyard_core::kv::BlockHash)
            .collect();
        let (blocks, lengths) = (self.inner)
            .kv_hits_per_group(&hashes, max_length)
            .or_raise(py)?;
        Ok((crate::sched_output::group_tuple(py, &blocks)?, lengths))
    }

    /// vLLM's `allocate_slots` for a request the scheduler does not hold (`sched::kv_outside`):
    /// `token_ids` not given before, `num_new_tokens` more computed. Each group's new blocks
    /// (a tuple of arrays), or None when they do not fit.
    #[pyo3(signature = (request_id, token_ids, num_new_tokens, *, lora_id=None))]
    fn kv_allocate_outside<'py>(
        &mut self,
        request_id: &Bound<'py, PyAny>,
        token_ids: &Bound<'py, PyAny>,
        num_new_tokens: usize,
        lora_id: Option<u64>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyTuple>>> {
        let py = request_id.py();
        let id = RequestId::from_py(request_id)?;
        let token_ids = crate::convert::token_ids(token_ids, "token_ids")?;
        let new = (self.inner)
            .kv_allocate_outside(&id, &token_ids, num_new_tokens, lora_id)
            .or_raise(py)?;
        new.map(|g| crate::sched_output::group_tuple(py, &g))
            .transpose()
    }

    /// The tokens given and computed of a request given blocks by `kv_allocate_outside`,
    /// or None.
    fn kv_outside_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<Option<(usize, usize)>> {
        let id = RequestId::from_py(request_id)?;
        Ok(self.inner.kv_outside_tokens(&id))
    }

    /// Frees the blocks of a request given blocks by `kv_allocate_outside` (InputError for
    /// any other).
    fn kv_free_outside(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = RequestId::from_py(request_id)?;
        self.inner.kv_free_outside(&id).or_raise(request_id.py())
    }

    /// Takes `block_ids` out of the prefix cache (vLLM's `BlockPool.evict_blocks`):
    /// ConfigError without KV groups, InputError for an id past the pool.
    fn kv_evict_blocks(&mut self, py: Python<'_>, block_ids: Vec<u32>) -> PyResult<()> {
        self.inner.kv_evict_blocks(&block_ids).or_raise(py)
    }

    /// The request's block table (its KV block ids in order); empty if it holds none.
    fn block_ids<'py>(
        &self,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let py = request_id.py();
        let id = RequestId::from_py(request_id)?;
        if self.inner.get_request(&id).is_none() {
            return Err(unknown_request(py, &id));
        }
        Ok(PyArray1::from_slice(
            py,
            self.inner.block_ids(&id).unwrap_or_default(),
        ))
    }

    /// With several KV groups, the request's block table of each group (a tuple of arrays,
    /// null blocks as 0); an empty tuple with one group (see `block_ids`).
    fn group_block_ids<'py>(
        &self,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        let py = request_id.py();
        let id = RequestId::from_py(request_id)?;
        if self.inner.get_request(&id).is_none() {
            return Err(unknown_request(py, &id));
        }
        let tables = self.inner.group_block_ids(&id);
        crate::sched_output::group_tuple(py, &tables)
    }

    /// Per KV block, the requests holding it, in block-id order: the single pool's own ids
    /// (vLLM's less one), or with several KV groups the coordinator's (block 0 is vLLM's
    /// null block). Empty for the radix pool.
    fn block_ref_counts<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        let counts: Vec<u32> = (self.inner.kv_block_states().into_iter())
            .map(|(ref_cnt, _)| ref_cnt)
            .collect();
        PyArray1::from_vec(py, counts)
    }

    /// Per KV block, in the order of `block_ref_counts`, the 128-bit hash it caches
    /// (tokenyard's, not vLLM's), or `None`.
    fn block_hashes(&self) -> Vec<Option<u128>> {
        (self.inner.kv_block_states().into_iter())
            .map(|(_, hash)| hash.map(|h| h.0))
            .collect()
    }

    /// The KV block of `group` caching the 128-bit hash `block_hash` (tokenyard's, as
    /// `tokenyard.kv.block_hashes` computes it), or `None` (vLLM's
    /// `BlockPool.get_cached_block`; ids as in `block_ref_counts`).
    #[pyo3(signature = (block_hash, group = 0))]
    fn cached_block_id(&self, block_hash: u128, group: usize) -> Option<u32> {
        (self.inner).cached_block(tokenyard_core::kv::BlockHash(block_hash), group)
    }

    /// Free KV block ids, next to be handed out first (ids as in `block_ref_counts`).
    fn free_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        PyArray1::from_vec(py, self.inner.kv_free_block_ids())
    }

    /// The requests holding a block table in the KV pool, finished ones whose blocks a KV
    /// transfer holds included, in no order.
    fn kv_request_ids<'py>(&self, py: Python<'py>) -> PyResult<Vec<Py<PyAny>>> {
        (self.inner.kv_request_ids().into_iter())
            .map(|id| id.into_py(py))
            .collect()
    }

    /// The request's block table of each KV group (one with a single group; ids as in
    /// `block_ref_counts`), or `None` if it holds none.
    fn kv_block_tables<'py>(
        &self,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyTuple>>> {
        let id = RequestId::from_py(request_id)?;
        (self.inner.kv_block_tables(&id))
            .map(|tables| crate::sched_output::group_tuple(request_id.py(), &tables))
            .transpose()
    }

    /// Per KV group, the request's leading blocks registered in the prefix cache (vLLM's
    /// `num_cached_block`), or `None` if it holds no blocks.
    fn num_cached_blocks_of(&self, request_id: &Bound<'_, PyAny>) -> PyResult<Option<Vec<usize>>> {
        let id = RequestId::from_py(request_id)?;
        Ok(self.inner.kv_num_cached_blocks(&id))
    }

    /// Zeroes new KV blocks before use (vLLM 0.33's `needs_kv_cache_zeroing`; several KV
    /// groups only, a `ConfigError` otherwise); `take_new_block_ids` hands them out.
    fn set_kv_cache_zeroing(&mut self, py: Python<'_>, on: bool) -> PyResult<()> {
        (self.inner.set_kv_cache_zeroing(on)).map_err(|err| self.raise(py, err))
    }

    /// The KV blocks to zero handed out since the last call, group by group (vLLM's
    /// `SchedulerOutput.new_block_ids_to_zero`).
    fn take_new_block_ids<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        PyArray1::from_vec(py, self.inner.take_new_block_ids())
    }

    /// Frees what the request's KV groups no longer attend to on the processed-token basis
    /// (vLLM 0.33's `_connector_finished`); returns each group's table after.
    fn prune_skipped_blocks<'py>(
        &mut self,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        let py = request_id.py();
        let id = RequestId::from_py(request_id)?;
        let tables = (self.inner.prune_skipped_blocks(&id)).map_err(|err| self.raise(py, err))?;
        crate::sched_output::group_tuple(py, &tables)
    }
}
