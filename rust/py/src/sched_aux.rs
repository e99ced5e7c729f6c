//! A Python object as the step scheduler's auxiliary-output connector (vLLM 0.33's
//! `AuxOutputSchedulerConnector` calls made while a step is formed:
//! `max_cache_hit(view, block_hashes, block_ids)`,
//! `cap_external_hit(view, num_local, num_external, block_hashes, block_ids)`,
//! `request_loading(view, num_tokens)`; the lists are `sched::CachedBlocks`). Conversions and checks of its answers only; what
//! the scheduler does with them is the core's (`sched::aux_outputs`).

use pyo3::prelude::*;
use tokenyard_core::sched::{AuxOutputConnector, CachedBlocks, Request};
use tokenyard_core::{Error, Result};

use crate::convert::{RequestId, short_repr};
use crate::errors::ErrorSlot;
use crate::py_callee::PyCallee;
use crate::sched_connector::{count, view};

const METHODS: [&str; 3] = ["max_cache_hit", "cap_external_hit", "request_loading"];

/// A Python auxiliary-output connector. Each call re-takes the GIL; an exception it raises
/// is kept in `error` and becomes the `__cause__` of the `ConnectorError` raised.
pub(crate) struct PyAuxOutputConnector(PyCallee);

impl PyAuxOutputConnector {
    /// Wraps `object` after checking it has the three methods (a `ConfigError` naming
    /// `field` otherwise).
    pub(crate) fn new(
        object: &Bound<'_, PyAny>,
        field: &'static str,
        error: ErrorSlot,
    ) -> PyResult<Self> {
        PyCallee::new(
            object,
            field,
            error,
            &METHODS,
            "an auxiliary-output connector may only read the request view it is given",
        )
        .map(Self)
    }

    /// A token count the connector answered, or an error naming the method.
    fn tokens(method: &'static str, answer: &Bound<'_, PyAny>) -> Result<usize> {
        count(answer).ok_or_else(|| {
            Error::connector(
                method,
                short_repr(answer),
                "must return an int >= 0 (tokens)",
            )
        })
    }
}

impl AuxOutputConnector<RequestId> for PyAuxOutputConnector {
    fn max_cache_hit(
        &mut self,
        request: &Request<RequestId>,
        blocks: CachedBlocks<'_>,
    ) -> Result<usize> {
        const METHOD: &str = "max_cache_hit";
        Python::attach(|py| {
            let (hashes, ids) = lists(blocks);
            let answer = self.0.call(py, METHOD, (view(py, request)?, hashes, ids))?;
            Self::tokens(METHOD, &answer)
        })
    }

    fn cap_external_hit(
        &mut self,
        request: &Request<RequestId>,
        num_local: usize,
        num_external: usize,
        blocks: CachedBlocks<'_>,
    ) -> Result<usize> {
        const METHOD: &str = "cap_external_hit";
        Python::attach(|py| {
            let (hashes, ids) = lists(blocks);
            let args = (view(py, request)?, num_local, num_external, hashes, ids);
            let answer = self.0.call(py, METHOD, args)?;
            Self::tokens(METHOD, &answer)
        })
    }

    fn request_loading(&mut self, request: &Request<RequestId>, num_tokens: usize) -> Result<()> {
        Python::attach(|py| {
            let args = (view(py, request)?, num_tokens);
            self.0.call(py, "request_loading", args).map(drop)
        })
    }
}

/// The request's block hashes (128-bit ints) and cached block ids (`None` where none caches
/// the hash), for the Python side's answers to vLLM's `get_cached_block`.
fn lists(blocks: CachedBlocks<'_>) -> (Vec<u128>, Vec<Option<u32>>) {
    let hashes = blocks.block_hashes.iter().map(|h| h.0).collect();
    (hashes, blocks.block_ids.to_vec())
}

/// `object` as the core's connector (`None` stays `None`), its exceptions kept in `error`.
pub(crate) fn boxed(
    object: Option<&Bound<'_, PyAny>>,
    error: ErrorSlot,
) -> PyResult<Option<Box<dyn AuxOutputConnector<RequestId>>>> {
    let Some(object) = object else {
        return Ok(None);
    };
    let connector = PyAuxOutputConnector::new(object, "aux_output_connector", error)?;
    Ok(Some(Box::new(connector)))
}
