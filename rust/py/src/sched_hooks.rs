//! Python callables as the step scheduler's step hooks (`sched::hooks`): vLLM's
//! `allocate_slots`, `_mamba_block_aligned_split` and the encoder cache's `can_allocate` as a
//! caller replaced them, and the
//! running requests' live priorities. Conversions
//! and checks of their answers only; an exception they raise is kept and re-raised
//! unchanged by the scheduler's method.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};
use tokenyard_core::sched::{Request, StepHooks};
use tokenyard_core::{Error, Result};

use crate::convert::RequestId;
use crate::errors::ErrorSlot;

/// `allocate(request_id, num_new_tokens, num_lookahead_tokens) -> bool` and
/// `mamba_split(request_id, start, num_new_tokens, core_split) -> int`, either optional.
/// `priority(request_id) -> int | None`, the third, optional too.
pub(crate) struct PyStepHooks {
    pub(crate) allocate: Option<Py<PyAny>>,
    pub(crate) mamba_split: Option<Py<PyAny>>,
    pub(crate) priority: Option<Py<PyAny>>,
    /// `pending_block_frees() -> bool`, optional: vLLM 0.33's connector
    /// `has_pending_block_frees` (HiSparse's pending reclamation).
    pub(crate) pending_block_frees: Option<Py<PyAny>>,
    /// `encoder_can_allocate(request_id, input_index, budget_left, num_embeds_to_schedule)
    /// -> bool`, optional: vLLM 0.33's `EncoderCacheManager.can_allocate` as replaced.
    pub(crate) encoder_can_allocate: Option<Py<PyAny>>,
    /// `waiting_ready(request_id) -> bool`, optional: vLLM 0.33's
    /// `_handle_blocked_waiting_request` for a wait its caller decides.
    pub(crate) waiting_ready: Option<Py<PyAny>>,
    pub(crate) error: ErrorSlot,
}

impl StepHooks<RequestId> for PyStepHooks {
    fn allow_allocation(
        &self,
        request: &Request<RequestId>,
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
    ) -> Result<bool> {
        let Some(allocate) = &self.allocate else {
            return Ok(true);
        };
        Python::attach(|py| {
            let id = (request.request_id.clone().into_py(py))
                .map_err(|err| self.error.keep("allocate", err))?;
            let answer = (allocate.bind(py))
                .call1((id, num_new_tokens, num_lookahead_tokens))
                .and_then(|a| a.is_truthy())
                .map_err(|err| self.error.keep("allocate", err))?;
            Ok(answer)
        })
    }

    fn mamba_split(
        &self,
        request: &Request<RequestId>,
        start: usize,
        num_new_tokens: usize,
        core_split: usize,
    ) -> Result<usize> {
        let Some(split) = &self.mamba_split else {
            return Ok(core_split);
        };
        Python::attach(|py| {
            let id = (request.request_id.clone().into_py(py))
                .map_err(|err| self.error.keep("mamba_split", err))?;
            let answer = (split.bind(py))
                .call1((id, start, num_new_tokens, core_split))
                .map_err(|err| self.error.keep("mamba_split", err))?;
            let is_int = answer.is_instance_of::<PyInt>() && !answer.is_instance_of::<PyBool>();
            match is_int.then(|| answer.extract::<usize>().ok()).flatten() {
                Some(n) => Ok(n),
                None => Err(Error::Plugin(format!(
                    "mamba_split: returned {answer}, not a token count (an int >= 0)"
                ))),
            }
        })
    }

    fn priority(&self, request: &Request<RequestId>) -> Result<Option<i64>> {
        let Some(priority) = &self.priority else {
            return Ok(None);
        };
        Python::attach(|py| {
            let id = (request.request_id.clone().into_py(py))
                .map_err(|err| self.error.keep("priority", err))?;
            let answer = (priority.bind(py))
                .call1((id,))
                .map_err(|err| self.error.keep("priority", err))?;
            if answer.is_none() {
                return Ok(None);
            }
            let is_int = answer.is_instance_of::<PyInt>() && !answer.is_instance_of::<PyBool>();
            match is_int.then(|| answer.extract::<i64>().ok()).flatten() {
                Some(p) => Ok(Some(p)),
                None => Err(Error::Plugin(format!(
                    "priority: returned {answer}, not a priority (an int in i64's range)"
                ))),
            }
        })
    }

    fn allow_encoder_input(
        &self,
        request: &Request<RequestId>,
        input_index: usize,
        budget_left: usize,
        num_embeds_to_schedule: usize,
    ) -> Result<bool> {
        let Some(can_allocate) = &self.encoder_can_allocate else {
            return Ok(true);
        };
        Python::attach(|py| {
            let id = (request.request_id.clone().into_py(py))
                .map_err(|err| self.error.keep("encoder_can_allocate", err))?;
            (can_allocate.bind(py))
                .call1((id, input_index, budget_left, num_embeds_to_schedule))
                .and_then(|a| a.is_truthy())
                .map_err(|err| self.error.keep("encoder_can_allocate", err))
        })
    }

    fn pending_block_frees(&self) -> Result<bool> {
        let Some(pending) = &self.pending_block_frees else {
            return Ok(false);
        };
        Python::attach(|py| {
            (pending.bind(py))
                .call0()
                .and_then(|a| a.is_truthy())
                .map_err(|err| self.error.keep("pending_block_frees", err))
        })
    }

    fn waiting_ready(&self, request: &Request<RequestId>) -> Result<bool> {
        let Some(ready) = &self.waiting_ready else {
            return Ok(false);
        };
        Python::attach(|py| {
            let id = (request.request_id.clone().into_py(py))
                .map_err(|err| self.error.keep("waiting_ready", err))?;
            (ready.bind(py))
                .call1((id,))
                .and_then(|a| a.is_truthy())
                .map_err(|err| self.error.keep("waiting_ready", err))
        })
    }
}
