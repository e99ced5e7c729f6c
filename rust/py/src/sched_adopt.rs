//! `tokenyard.sched.Scheduler`'s requests and steps placed by the caller (vLLM's tests put a
//! request into `Scheduler.running` by hand and update it with a `SchedulerOutput` they
//! built). Conversions only; the core's side is `sched::adopt`.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyMapping};
use tokenyard_core::sched::OutsideStep;

use super::PyScheduler;
use super::args::{add_speculation, finished_list, sampled_outputs};
use crate::convert::{RequestId, token_ids};

#[pymethods]
impl PyScheduler {
    /// Moves `request_id`, queued and not yet scheduled, to the end of the running list with
    /// `output_token_ids` appended and `num_computed_tokens` of its tokens computed (blocks
    /// allocated for them). InputError for a request not queued untouched or computed
    /// tokens past its tokens; CapacityError when the pool cannot hold them.
    fn adopt_running(
        &mut self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        output_token_ids: &Bound<'_, PyAny>,
        num_computed_tokens: usize,
    ) -> PyResult<()> {
        let id = RequestId::from_py(request_id)?;
        let outputs = token_ids(output_token_ids, "output_token_ids")?;
        (self.inner)
            .adopt_running(&id, &outputs, num_computed_tokens)
            .map_err(|err| self.raise(py, err))
    }

    /// `update_from_output` for a step formed outside the scheduler: `step` maps each of its
    /// requests to `(num_scheduled_tokens, num_spec_tokens)` (tokens already counted as
    /// computed); the outputs are `update_from_output`'s and name only requests of `step`.
    /// Returns the requests that finished as `(request_id, reason)`.
    #[pyo3(signature = (step, sampled_token_ids, *, num_rejected_tokens = None, spec_token_ids = None))]
    fn update_from_outside_step<'py>(
        &mut self,
        step: &Bound<'py, PyMapping>,
        sampled_token_ids: &Bound<'py, PyMapping>,
        num_rejected_tokens: Option<&Bound<'py, PyMapping>>,
        spec_token_ids: Option<&Bound<'py, PyMapping>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = step.py();
        let mut entries = Vec::with_capacity(step.len()?);
        for item in step.items()?.iter() {
            let (key, (n, drafts)): (Bound<'py, PyAny>, (usize, usize)) = item.extract()?;
            entries.push(OutsideStep {
                request_id: RequestId::from_py(&key)?,
                num_scheduled_tokens: n,
                num_spec_tokens: drafts,
            });
        }
        let mut outputs = sampled_outputs(sampled_token_ids)?;
        if num_rejected_tokens.is_some() || spec_token_ids.is_some() {
            add_speculation(&mut outputs, num_rejected_tokens, spec_token_ids)?;
        }
        let finished = (self.inner)
            .update_from_outside_step(&entries, &outputs)
            .map_err(|err| self.raise(py, err))?;
        finished_list(py, finished)
    }
}
