//! Python classes of `tokenyard.kv`: thin wrappers over `tokenyard_core::kv`.

mod block_pool;
mod coordinator;
mod counting;
mod radix;

use pyo3::prelude::*;

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<counting::PyCountingAllocator>()?;
    module.add_class::<block_pool::PyBlockPool>()?;
    module.add_class::<block_pool::PyComputedBlocks>()?;
    module.add_class::<block_pool::PyBlockPoolStats>()?;
    module.add_function(wrap_pyfunction!(block_pool::block_hashes, module)?)?;
    module.add_class::<coordinator::PyKvCoordinator>()?;
    module.add_class::<coordinator::PyGroupedComputedBlocks>()?;
    module.add_class::<coordinator::PyFullAttentionSpec>()?;
    module.add_class::<coordinator::PySlidingWindowSpec>()?;
    module.add_class::<coordinator::PyChunkedLocalAttentionSpec>()?;
    module.add_class::<coordinator::PyMambaSpec>()?;
    module.add_class::<radix::PyRadixCache>()?;
    module.add_class::<radix::PyMatchResult>()?;
    module.add_class::<radix::PyNodeHandle>()?;
    Ok(())
}
