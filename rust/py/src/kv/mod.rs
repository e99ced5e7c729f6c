//! Python classes of `tokenyard.kv`: thin wrappers over `tokenyard_core::kv`.

mod block_pool;
mod coordinator;
mod counting;
mod hisparse_connector;
pub(crate) mod host_publication;
mod partial_hits;
mod radix;

pub(crate) use coordinator::group_spec;
use pyo3::prelude::*;
use tokenyard_core::kv::{BlockId, TokenId};

use crate::convert::{RequestId, count_arg, token_ids as read_token_ids};
use crate::errors::{OrRaise, input_error, unknown_request};

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<counting::PyCountingAllocator>()?;
    module.add_class::<block_pool::PyBlockPool>()?;
    module.add_class::<block_pool::PyComputedBlocks>()?;
    module.add_class::<block_pool::PyBlockPoolStats>()?;
    module.add_function(wrap_pyfunction!(block_pool::block_hashes, module)?)?;
    module.add_function(wrap_pyfunction!(block_pool::group_block_hashes, module)?)?;
    module.add_class::<coordinator::PyKvCoordinator>()?;
    module.add_class::<coordinator::PyGroupedComputedBlocks>()?;
    module.add_class::<coordinator::PyFullAttentionSpec>()?;
    module.add_class::<coordinator::PySlidingWindowSpec>()?;
    module.add_class::<coordinator::PyChunkedLocalAttentionSpec>()?;
    module.add_class::<coordinator::PyMambaSpec>()?;
    module.add_class::<coordinator::PyCrossAttentionSpec>()?;
    module.add_class::<coordinator::PyHiSparseResidentSpec>()?;
    module.add_class::<coordinator::PyHiSparseHotSpec>()?;
    module.add_class::<host_publication::PyHostPublication>()?;
    module.add_class::<host_publication::PyDeviceResidency>()?;
    module.add_class::<hisparse_connector::PyHiSparseConnectorPool>()?;
    module.add_class::<radix::PyRadixCache>()?;
    module.add_class::<radix::PyMatchResult>()?;
    module.add_class::<radix::PyNodeHandle>()?;
    module.add_function(wrap_pyfunction!(partial_hits::hits_enabled, module)?)?;
    module.add_function(wrap_pyfunction!(partial_hits::fine_hit, module)?)?;
    Ok(())
}

/// `allocate_slots` of `BlockPool` and `KvCoordinator`: converts the arguments they share
/// (a missing `token_ids` is none) and runs `allocate(request_id, token_ids,
/// num_new_tokens, num_lookahead_tokens)` on them, raising its error.
fn allocate_slots<T>(
    request_id: &Bound<'_, PyAny>,
    num_new_tokens: i64,
    num_lookahead_tokens: i64,
    token_ids: Option<&Bound<'_, PyAny>>,
    allocate: impl FnOnce(&RequestId, &[TokenId], usize, usize) -> tokenyard_core::Result<T>,
) -> PyResult<T> {
    let py = request_id.py();
    let id = RequestId::from_py(request_id)?;
    let num_new_tokens = count_arg(py, "num_new_tokens", num_new_tokens, 1)?;
    let num_lookahead_tokens = count_arg(py, "num_lookahead_tokens", num_lookahead_tokens, 0)?;
    let token_ids = match token_ids {
        Some(obj) => read_token_ids(obj, "token_ids")?,
        None => Vec::new(),
    };
    allocate(&id, &token_ids, num_new_tokens, num_lookahead_tokens).or_raise(py)
}

/// Runs a core operation on the request `request_id` names, raising its error.
fn on_request<T>(
    request_id: &Bound<'_, PyAny>,
    op: impl FnOnce(&RequestId) -> tokenyard_core::Result<T>,
) -> PyResult<T> {
    let id = RequestId::from_py(request_id)?;
    op(&id).or_raise(request_id.py())
}

/// What `get` knows of the request `request_id` names; `UnknownRequestError` if nothing.
fn of_request<T>(
    request_id: &Bound<'_, PyAny>,
    get: impl FnOnce(&RequestId) -> Option<T>,
) -> PyResult<T> {
    let id = RequestId::from_py(request_id)?;
    get(&id).ok_or_else(|| unknown_request(request_id.py(), &id))
}

/// `__contains__`: whether `known` knows the request `request_id` names.
fn has_request(
    request_id: &Bound<'_, PyAny>,
    known: impl FnOnce(&RequestId) -> bool,
) -> PyResult<bool> {
    Ok(known(&RequestId::from_py(request_id)?))
}

/// The ref count `ref_count` gives the block `block_id`; an `InputError` past the pool.
fn block_ref_count(
    py: Python<'_>,
    block_id: i64,
    ref_count: impl FnOnce(BlockId) -> Option<u32>,
) -> PyResult<u32> {
    let block = count_arg(py, "block_id", block_id, 0)?;
    BlockId::try_from(block)
        .ok()
        .and_then(ref_count)
        .ok_or_else(|| input_error(py, "block_id", block_id, "no such block"))
}
