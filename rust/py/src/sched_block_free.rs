//! `tokenyard.sched.Scheduler`'s deferred block frees and loads, blocks held outside any
//! request and their copies, the HiSparse host pool. Conversions only; the core's side is
//! `sched::block_free` and `sched::hisparse`.

use pyo3::prelude::*;

use super::PyScheduler;
use crate::convert::RequestId;
use crate::errors::unknown_request;

#[pymethods]
impl PyScheduler {
    /// vLLM 0.33's `defer_block_free`: blocks of a request finished or preempted while a
    /// step that served it is in flight return to the pool only once that step is
    /// processed (`step_processed`).
    #[getter]
    fn defer_block_free(&self) -> bool {
        self.inner.defer_block_free()
    }

    #[setter]
    fn set_defer_block_free(&mut self, defer: bool) {
        self.inner.set_defer_block_free(defer);
    }

    /// vLLM 0.33's `defer_async_loads`: an asynchronous load admitted while a step is in
    /// flight starts (`update_state_after_alloc`) once that step is processed.
    #[getter]
    fn defer_async_loads(&self) -> bool {
        self.inner.defer_async_loads()
    }

    #[setter]
    fn set_defer_async_loads(&mut self, defer: bool) {
        self.inner.set_defer_async_loads(defer);
    }

    /// Whether a request whose load failed asks the connector again when next admitted
    /// (vLLM 0.33's `kv_load_failure_policy = "recompute"`); off by default.
    #[getter]
    fn ask_again_after_failed_load(&self) -> bool {
        self.inner.ask_again_after_failed_load()
    }

    #[setter]
    fn set_ask_again_after_failed_load(&mut self, on: bool) {
        self.inner.set_ask_again_after_failed_load(on);
    }

    /// Whether tokens given for a running request's prefill chunk are appended as its
    /// output (vLLM 0.33's `update_from_output`); off by default (InputError).
    #[getter]
    fn append_prefill_chunk_outputs(&self) -> bool {
        self.inner.append_prefill_chunk_outputs()
    }

    #[setter]
    fn set_append_prefill_chunk_outputs(&mut self, on: bool) {
        self.inner.set_append_prefill_chunk_outputs(on);
    }

    /// vLLM 0.33's HiSparse host page pool (`hisparse_host_num_blocks`, the null block
    /// included, and the source group's `block_size`): one host block per block of the
    /// first KV group a request holds, the whole prompt's pages checked at admission;
    /// `num_blocks=None`: off. `source_group`: where vLLM's source group sits among its
    /// groups, so the per-group block ids carry the host tables there. Raises ConfigError
    /// (see the core's `set_hisparse_host_pages` and `set_hisparse_source_group`).
    #[pyo3(signature = (num_blocks=None, block_size=None, source_group=None))]
    fn set_hisparse_host_pages(
        &mut self,
        py: Python<'_>,
        num_blocks: Option<usize>,
        block_size: Option<usize>,
        source_group: Option<usize>,
    ) -> PyResult<()> {
        let block_size = block_size.unwrap_or(self.inner.config().block_size);
        let pool = num_blocks.map(|n| (n, block_size));
        let result = self.inner.set_hisparse_host_pages(pool);
        let result = match (result, pool) {
            (Ok(()), Some(_)) => self.inner.set_hisparse_source_group(source_group),
            (result, _) => result,
        };
        result.map_err(|err| self.raise(py, err))
    }

    /// The HiSparse host pool as `(num_blocks, block_size, num_free_blocks)`, or None.
    #[getter]
    fn hisparse_host_pages(&self) -> Option<(usize, usize, usize)> {
        (self.inner.hisparse_host_pages()).map(|h| (h.num_blocks, h.block_size, h.num_free_blocks))
    }

    /// The requests whose prefill is in flight (vLLM 0.33's `_inflight_prefills`).
    fn inflight_prefill_ids<'py>(&self, py: Python<'py>) -> PyResult<Vec<Py<PyAny>>> {
        (self.inner.inflight_prefill_ids().into_iter())
            .map(|id| id.into_py(py))
            .collect()
    }

    /// Requests whose asynchronous load waits for a step in flight before it starts.
    fn deferred_load_ids<'py>(&self, py: Python<'py>) -> PyResult<Vec<Py<PyAny>>> {
        (self.inner.deferred_load_ids().into_iter())
            .map(|id| id.into_py(py))
            .collect()
    }

    #[getter]
    fn sched_step_seq(&self) -> u64 {
        self.inner.sched_step_seq()
    }

    #[getter]
    fn processed_step_seq(&self) -> u64 {
        self.inner.processed_step_seq()
    }

    /// The oldest step in flight that scheduled any token was processed: deferred frees
    /// whose fence it reaches return to the pool.
    fn step_processed(&mut self, py: Python<'_>) -> PyResult<()> {
        self.inner
            .step_processed()
            .map_err(|err| self.raise(py, err))
    }

    /// The deferred frees, oldest first: `(fence_step, block_ids)`.
    fn deferred_frees(&self) -> Vec<(u64, Vec<u32>)> {
        self.inner.deferred_frees()
    }

    /// vLLM 0.33's `BlockPool.get_new_blocks`: `num_blocks` free blocks held outside any
    /// request. Raises ConfigError over the radix pool, InputError when fewer are free.
    fn take_loose_blocks(&mut self, py: Python<'_>, num_blocks: usize) -> PyResult<Vec<u32>> {
        (self.inner.take_loose_blocks(num_blocks)).map_err(|err| self.raise(py, err))
    }

    /// vLLM 0.33's `BlockPool.free_blocks` on blocks from `take_loose_blocks`. Raises
    /// InputError for a block without such a reference left (one a queued copy retains).
    fn free_loose_blocks(&mut self, py: Python<'_>, block_ids: Vec<u32>) -> PyResult<()> {
        (self.inner.free_loose_blocks(&block_ids)).map_err(|err| self.raise(py, err))
    }

    /// vLLM 0.33's `BlockPool.touch` on blocks named by id: one reference more on each,
    /// held outside any request until `free_loose_blocks` (a free block leaves the free
    /// queue, its cached hash kept). Raises ConfigError over the radix pool, InputError for
    /// an id that is not a block of the pool (nothing changes then).
    fn touch_loose_blocks(&mut self, py: Python<'_>, block_ids: Vec<u32>) -> PyResult<()> {
        (self.inner.touch_loose_blocks(&block_ids)).map_err(|err| self.raise(py, err))
    }

    /// Queues `(src, dst)` block copies for the next step's `kv_cache_block_copies`; each
    /// endpoint's reference from `take_loose_blocks` is retained until that step is
    /// processed. Raises InputError (nothing queued) for an endpoint without one.
    fn queue_block_copies(&mut self, py: Python<'_>, copies: Vec<(u32, u32)>) -> PyResult<()> {
        (self.inner.queue_block_copies(&copies)).map_err(|err| self.raise(py, err))
    }

    /// The copies queued and not yet carried by a step.
    fn pending_block_copies(&self) -> Vec<(u32, u32)> {
        self.inner.pending_block_copies().to_vec()
    }

    /// Hands the queued copies to a step formed without `schedule()` (a paused engine's
    /// empty step), releasing their endpoints as that step's would be.
    fn take_pending_block_copies(&mut self) -> Vec<(u32, u32)> {
        self.inner.take_pending_block_copies()
    }

    /// The latest step numbered while frees are deferred that served the request.
    fn last_sched_seq(&self, request_id: &Bound<'_, PyAny>) -> PyResult<u64> {
        let id = RequestId::from_py(request_id)?;
        match self.inner.get_request(&id) {
            Some(r) => Ok(r.last_sched_seq),
            None => Err(unknown_request(request_id.py(), &id)),
        }
    }
}
