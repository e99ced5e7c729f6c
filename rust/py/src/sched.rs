//! `tokenyard.sched`: the step scheduler. Conversions only: request and step arguments are
//! `sched_args`'s, the config object's fields `sched_config`'s, the step's output and stats
//! `sched_output`'s, the KV views `sched_kv`'s (a second `#[pymethods]` block, pyo3's
//! `multiple-pymethods`).

use pyo3::prelude::*;
use pyo3::types::{PyList, PyMapping};
use tokenyard_core::sched::{MambaAlignSplit, SampledOutput, Scheduler};

use crate::convert::RequestId;
use crate::errors::ErrorSlot;
use crate::errors::{OrRaise, invariants, unknown_request};
use crate::plugin::PyPlugin;
use crate::sched_config::core_config;
use crate::sched_connector::{PyConnector, request_ids};
use crate::sched_output::{
    PyCachedRequestData, PyNewRequestData, PySchedulerOutput, PySchedulerStats, id_list,
};
use args::{abort_ids, add_speculation, kv_event, request_spec, sampled_arrays, sampled_outputs};

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyScheduler>()?;
    module.add_class::<PySchedulerOutput>()?;
    module.add_class::<PyNewRequestData>()?;
    module.add_class::<PyCachedRequestData>()?;
    module.add_class::<PySchedulerStats>()?;
    module.add_class::<crate::plugin::PyRequestView>()?;
    module.add_class::<crate::sched_connector::PyKvLoad>()?;
    module.add_class::<crate::sched_encoder::PyEncoderCache>()?;
    Ok(())
}

/// vLLM V1's step scheduler: `add_request`, then per step `schedule()` and
/// `update_from_output(...)`.
#[pyclass(name = "Scheduler", module = "tokenyard.sched")]
pub(crate) struct PyScheduler {
    inner: Scheduler<RequestId>,
    plugin_error: ErrorSlot,
    connector_error: ErrorSlot,
    /// `update_from_output_arrays`' outputs, kept from call to call (`sampled_arrays`).
    spare_outputs: Vec<SampledOutput<RequestId>>,
}

impl PyScheduler {
    /// The Python exception for a core error: a plugin's own exception unchanged, a
    /// connector's error with the exception it raised (if any) as its cause.
    fn raise(&self, py: Python<'_>, err: tokenyard_core::Error) -> PyErr {
        if let Some(plugin_err) = self.plugin_error.take() {
            return plugin_err;
        }
        let cause = self.connector_error.take();
        let is_connector = matches!(err, tokenyard_core::Error::Connector { .. });
        let py_err = crate::errors::to_py_err(py, err);
        if is_connector {
            py_err.set_cause(py, cause);
        }
        py_err
    }
}

#[pymethods]
impl PyScheduler {
    #[new]
    #[pyo3(signature = (config, *, plugin = None, connector = None))]
    fn new(
        config: &Bound<'_, PyAny>,
        plugin: Option<&Bound<'_, PyAny>>,
        connector: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let py = config.py();
        let (core, async_scheduling) = core_config(config)?;
        let mut inner = Scheduler::new(core, async_scheduling).or_raise(py)?;
        let plugin_error = ErrorSlot::default();
        if let Some(object) = plugin {
            PyPlugin::check(object, "plugin")?;
            let object = object.clone().unbind();
            inner.set_plugin(Box::new(PyPlugin {
                object,
                error: plugin_error.clone(),
            }));
        }
        let connector_error = ErrorSlot::default();
        if let Some(object) = connector {
            let connector = PyConnector::new(object, "connector", connector_error.clone())?;
            inner.set_connector(Box::new(connector)).or_raise(py)?;
        }
        Ok(Self {
            inner,
            plugin_error,
            connector_error,
            spare_outputs: Vec::new(),
        })
    }

    #[pyo3(signature = (request_id, prompt_token_ids, max_tokens, *, priority = None, arrival_time = None,
        eos_token_id = None, stop_token_ids = None, ignore_eos = false, lora_id = None,
        mm_features = None, num_computed_tokens = None, resumable = false,
        repetition_detection = None, min_tokens = None))]
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        prompt_token_ids: &Bound<'_, PyAny>,
        max_tokens: &Bound<'_, PyAny>,
        priority: Option<&Bound<'_, PyAny>>,
        arrival_time: Option<f64>,
        eos_token_id: Option<&Bound<'_, PyAny>>,
        stop_token_ids: Option<&Bound<'_, PyAny>>,
        ignore_eos: bool,
        lora_id: Option<&Bound<'_, PyAny>>,
        mm_features: Option<&Bound<'_, PyAny>>,
        num_computed_tokens: Option<&Bound<'_, PyAny>>,
        resumable: bool,
        repetition_detection: Option<&Bound<'_, PyAny>>,
        min_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = request_id.py();
        let id = RequestId::from_py(request_id)?;
        let mut spec = request_spec(
            prompt_token_ids,
            max_tokens,
            priority,
            arrival_time,
            eos_token_id,
            stop_token_ids,
            ignore_eos,
            lora_id,
            mm_features,
            num_computed_tokens,
            resumable,
        )?;
        (spec.repetition_detection, spec.min_tokens) =
            args::repetition_args(repetition_detection, min_tokens)?;
        self.inner.add_request(id, spec).or_raise(py)
    }

    #[pyo3(signature = (*, throttle_prefills = false))]
    fn schedule(&mut self, py: Python<'_>, throttle_prefills: bool) -> PyResult<PySchedulerOutput> {
        match self.inner.schedule_throttled(throttle_prefills) {
            Ok(inner) => Ok(PySchedulerOutput { inner }),
            Err(err) => Err(self.raise(py, err)),
        }
    }

    #[pyo3(signature = (sampled_token_ids, *, num_rejected_tokens = None, spec_token_ids = None))]
    fn update_from_output<'py>(
        &mut self,
        sampled_token_ids: &Bound<'py, PyMapping>,
        num_rejected_tokens: Option<&Bound<'py, PyMapping>>,
        spec_token_ids: Option<&Bound<'py, PyMapping>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = sampled_token_ids.py();
        let mut outputs = sampled_outputs(sampled_token_ids)?;
        if num_rejected_tokens.is_some() || spec_token_ids.is_some() {
            add_speculation(&mut outputs, num_rejected_tokens, spec_token_ids)?;
        }
        self.apply_outputs(py, &outputs)
    }

    /// Drafts proposed after a step's update (vLLM's `update_draft_token_ids`): each
    /// request's drafts replace its own, as `update_from_output(..., spec_token_ids=)`
    /// with no sampled tokens, but no step's output.
    fn update_draft_token_ids(&mut self, spec_token_ids: &Bound<'_, PyMapping>) -> PyResult<()> {
        let py = spec_token_ids.py();
        let mut outputs = Vec::new();
        add_speculation(&mut outputs, None, Some(spec_token_ids))?;
        self.inner
            .update_draft_token_ids(&outputs)
            .map_err(|err| self.raise(py, err))
    }

    /// [`Self::update_from_output`] in bulk, for integer request ids: `request_ids[i]`
    /// sampled `num_sampled[i]` tokens (one each when omitted), taken in order from
    /// `sampled_token_ids`. No speculation. The same checks and the same result.
    #[pyo3(signature = (request_ids, sampled_token_ids, num_sampled = None))]
    fn update_from_output_arrays<'py>(
        &mut self,
        request_ids: &Bound<'py, PyAny>,
        sampled_token_ids: &Bound<'py, PyAny>,
        num_sampled: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = request_ids.py();
        let mut outputs = std::mem::take(&mut self.spare_outputs);
        let result = sampled_arrays(
            py,
            request_ids,
            sampled_token_ids,
            num_sampled,
            &mut outputs,
        )
        .and_then(|()| self.apply_outputs(py, &outputs));
        self.spare_outputs = outputs;
        result
    }

    fn abort(&mut self, request_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = abort_ids(request_ids)?;
        let py = request_ids.py();
        self.inner.abort(&ids).map_err(|err| self.raise(py, err))
    }

    // Shown with the empty tuples the stub gives as defaults; `None` means the same here.
    #[pyo3(
        signature = (*, finished_recving = None, finished_sending = None, failed_recving = None),
        text_signature = "($self, *, finished_recving=(), finished_sending=(), failed_recving=())"
    )]
    fn finish_kv_transfers(
        &mut self,
        py: Python<'_>,
        finished_recving: Option<&Bound<'_, PyAny>>,
        finished_sending: Option<&Bound<'_, PyAny>>,
        failed_recving: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ids = |obj: Option<&Bound<'_, PyAny>>, arg| match obj {
            Some(obj) => request_ids(obj, arg),
            None => Ok(Vec::new()),
        };
        let recving = ids(finished_recving, "finished_recving")?;
        let sending = ids(finished_sending, "finished_sending")?;
        let failed = ids(failed_recving, "failed_recving")?;
        self.inner
            .finish_kv_transfers(&recving, &sending, &failed)
            .or_raise(py)
    }

    /// vLLM's `reset_prefix_cache`: forgets every cached prefix if no request holds blocks;
    /// with `preempt_running`, preempts the running requests first. Returns whether the
    /// cache was reset and the ids preempted.
    #[pyo3(signature = (*, preempt_running = false))]
    fn reset_prefix_cache<'py>(
        &mut self,
        py: Python<'py>,
        preempt_running: bool,
    ) -> PyResult<(bool, Bound<'py, PyList>)> {
        let (reset, preempted) = self
            .inner
            .reset_prefix_cache(preempt_running)
            .map_err(|err| self.raise(py, err))?;
        Ok((reset, id_list(py, &preempted)?))
    }

    /// Starts recording prefix-cache events (vLLM's KV events) for `drain_kv_events`.
    fn enable_kv_events(&mut self) {
        self.inner.enable_kv_events();
    }

    /// Prefix-cache events since the last call, oldest first: `(kind, block_hash)` with
    /// kind `"stored"`, `"removed"`, `"host_stored"`, `"host_removed"` or `"all_cleared"`
    /// (hash 0).
    fn drain_kv_events(&mut self) -> Vec<(&'static str, u128)> {
        let events = self.inner.drain_kv_events().into_iter();
        events.map(kv_event).collect()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    /// Forces the free-block count the fit checks read (vLLM's tests set
    /// `FreeKVCacheBlockQueue.num_free_blocks`); the free queue keeps its order.
    fn force_num_free_blocks(&mut self, py: Python<'_>, num_free_blocks: usize) -> PyResult<()> {
        self.inner
            .force_num_free_blocks(num_free_blocks)
            .map_err(|err| self.raise(py, err))
    }

    #[getter]
    fn num_kv_transfers(&self) -> (usize, usize) {
        self.inner.num_kv_transfers()
    }

    fn has_unfinished_requests(&self) -> bool {
        self.inner.has_unfinished_requests()
    }

    #[getter]
    fn num_waiting(&self) -> usize {
        self.inner.num_waiting()
    }

    /// Streaming-input sessions parked between turns (`resume_session`).
    #[getter]
    fn num_parked(&self) -> usize {
        self.inner.num_parked()
    }

    /// Chunks taken by sessions whose wait was set by hand (`resume_unparked_session`).
    #[getter]
    fn num_unparked_resumes(&self) -> usize {
        self.inner.num_unparked_resumes()
    }

    /// The parked session's next input chunk (vLLM 0.33's `_update_request_as_session`): its
    /// last sampled token is dropped, its other outputs and `prompt_token_ids` become its
    /// prompt, and it waits with its blocks and computed tokens.
    /// `at_stop`: the chunk was queued while the session ran and is taken as its turn
    /// stops (it is not among the requests admission skipped).
    #[pyo3(signature = (request_id, prompt_token_ids, max_tokens, *, arrival_time = 0.0,
        eos_token_id = None, stop_token_ids = None, ignore_eos = false,
        repetition_detection = None, min_tokens = None, at_stop = false, mm_features = None))]
    #[allow(clippy::too_many_arguments)]
    fn resume_session(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        prompt_token_ids: &Bound<'_, PyAny>,
        max_tokens: &Bound<'_, PyAny>,
        arrival_time: f64,
        eos_token_id: Option<&Bound<'_, PyAny>>,
        stop_token_ids: Option<&Bound<'_, PyAny>>,
        ignore_eos: bool,
        repetition_detection: Option<&Bound<'_, PyAny>>,
        min_tokens: Option<&Bound<'_, PyAny>>,
        at_stop: bool,
        mm_features: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = request_id.py();
        let id = RequestId::from_py(request_id)?;
        let mut update = crate::sched_session::session_update(
            prompt_token_ids,
            max_tokens,
            arrival_time,
            eos_token_id,
            stop_token_ids,
            ignore_eos,
        )?;
        (update.repetition_detection, update.min_tokens) =
            args::repetition_args(repetition_detection, min_tokens)?;
        if let Some(items) = mm_features.filter(|m| !m.is_none()) {
            update.mm_features = crate::sched_encoder::mm_features(items)?;
        }
        if at_stop {
            self.inner.resume_queued_session(&id, update).or_raise(py)
        } else {
            self.inner.resume_session(&id, update).or_raise(py)
        }
    }

    /// A chunk for a session whose streaming wait a caller set by hand on a request never
    /// scheduled (vLLM 0.33's `_update_request_as_session`): `output_token_ids` (appended
    /// by hand) join its tokens, the last is dropped, and `num_computed_tokens` of the
    /// kept ones and the chunk count as computed.
    #[pyo3(signature = (request_id, output_token_ids, num_computed_tokens, prompt_token_ids,
        max_tokens, *, arrival_time = 0.0, eos_token_id = None, stop_token_ids = None,
        ignore_eos = false, repetition_detection = None, min_tokens = None, mm_features = None))]
    #[allow(clippy::too_many_arguments)]
    fn resume_unparked_session(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        output_token_ids: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
        prompt_token_ids: &Bound<'_, PyAny>,
        max_tokens: &Bound<'_, PyAny>,
        arrival_time: f64,
        eos_token_id: Option<&Bound<'_, PyAny>>,
        stop_token_ids: Option<&Bound<'_, PyAny>>,
        ignore_eos: bool,
        repetition_detection: Option<&Bound<'_, PyAny>>,
        min_tokens: Option<&Bound<'_, PyAny>>,
        mm_features: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = request_id.py();
        let id = RequestId::from_py(request_id)?;
        let outputs = crate::convert::token_ids(output_token_ids, "output_token_ids")?;
        let num_computed = crate::convert::int_arg(
            num_computed_tokens,
            "num_computed_tokens",
            0,
            u32::MAX as i128,
        )? as usize;
        let mut update = crate::sched_session::session_update(
            prompt_token_ids,
            max_tokens,
            arrival_time,
            eos_token_id,
            stop_token_ids,
            ignore_eos,
        )?;
        (update.repetition_detection, update.min_tokens) =
            args::repetition_args(repetition_detection, min_tokens)?;
        if let Some(items) = mm_features.filter(|m| !m.is_none()) {
            update.mm_features = crate::sched_encoder::mm_features(items)?;
        }
        (self.inner)
            .resume_unparked_session(&id, &outputs, num_computed, update)
            .or_raise(py)
    }

    /// The session finishes at its next stop instead of parking.
    fn end_session(&mut self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = RequestId::from_py(request_id)?;
        self.inner.end_session(&id).or_raise(py)
    }

    /// Whether a request preempted within a step drops its outputs in flight (vLLM 0.33's
    /// `drop_stale_output` for a KV connector that `requires_kv_delivery`).
    #[getter]
    fn drop_stale_output(&self) -> bool {
        self.inner.drop_stale_output()
    }
    #[setter]
    fn set_drop_stale_output(&mut self, drop: bool) {
        self.inner.set_drop_stale_output(drop);
    }

    /// Whether a request preempted under async scheduling waits for its delivered outputs
    /// in flight before it is admitted again (vLLM 0.33's rule; needs an update per step).
    #[getter]
    fn wait_for_stale_outputs(&self) -> bool {
        self.inner.wait_for_stale_outputs()
    }
    #[setter]
    fn set_wait_for_stale_outputs(&mut self, wait: bool) {
        self.inner.set_wait_for_stale_outputs(wait);
    }

    #[getter]
    fn num_running(&self) -> usize {
        self.inner.num_running()
    }

    #[getter]
    fn num_executed_steps(&self) -> i64 {
        self.inner.num_executed_steps()
    }

    #[getter]
    fn last_prefill_step(&self) -> i64 {
        self.inner.last_prefill_step()
    }

    #[getter]
    fn prefill_capacity_bound(&self) -> bool {
        self.inner.prefill_capacity_bound()
    }

    fn deferred_waiting_ids<'py>(&self, py: Python<'py>) -> PyResult<Vec<Py<PyAny>>> {
        self.inner
            .deferred_waiting_ids()
            .into_iter()
            .map(|id| id.into_py(py))
            .collect()
    }

    fn running_ids<'py>(&self, py: Python<'py>) -> PyResult<Vec<Py<PyAny>>> {
        self.inner
            .running_ids()
            .into_iter()
            .map(|id| id.into_py(py))
            .collect()
    }

    fn waiting_ids<'py>(&self, py: Python<'py>) -> PyResult<Vec<Py<PyAny>>> {
        self.inner
            .waiting_ids()
            .into_iter()
            .map(|id| id.into_py(py))
            .collect()
    }

    /// With `False`, only waiting requests holding KV blocks are admitted (vLLM's PAUSED_NEW).
    fn set_admit_new(&mut self, admit_new: bool) {
        self.inner.set_admit_new(admit_new);
    }

    fn num_computed_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = RequestId::from_py(request_id)?;
        match self.inner.get_request(&id) {
            Some(r) => Ok(r.num_computed_tokens),
            None => Err(unknown_request(request_id.py(), &id)),
        }
    }

    /// Whether the request waits for its KV load (`WAITING_FOR_REMOTE_KVS`): not yet
    /// reported, or reported and not yet taken by an admission pass.
    fn waiting_for_remote_kvs(&self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = RequestId::from_py(request_id)?;
        match self.inner.get_request(&id) {
            Some(r) => Ok(r.status == tokenyard_core::sched::RequestStatus::WaitingForRemoteKvs),
            None => Err(unknown_request(request_id.py(), &id)),
        }
    }

    /// Outputs still expected for the request (its sampling steps in flight), live or
    /// finished; 0 for an id the scheduler has never seen or has done with.
    fn num_outputs_in_flight(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = RequestId::from_py(request_id)?;
        Ok(self.inner.num_outputs_in_flight(&id))
    }

    fn num_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = RequestId::from_py(request_id)?;
        match self.inner.get_request(&id) {
            Some(r) => Ok(r.num_tokens()),
            None => Err(unknown_request(request_id.py(), &id)),
        }
    }

    fn stats(&self) -> PySchedulerStats {
        PySchedulerStats {
            inner: self.inner.stats(),
        }
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        invariants(py, self.inner.check_invariants())
    }

    /// Preempts a running request from outside a step (vLLM's `_preempt_request` called
    /// directly): blocks freed, back at the head of the waiting queue; its steps in flight
    /// still deliver their outputs.
    fn preempt_request(&mut self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = RequestId::from_py(request_id)?;
        self.inner.preempt_request(&id).or_raise(py)
    }

    /// Sets (`None`: removes) the auxiliary-output connector (`sched_aux`, vLLM 0.33's
    /// `AuxOutputSchedulerConnector`). Raises `ConfigError` for an object without its three
    /// methods, or with the radix pool.
    fn set_aux_output_connector(
        &mut self,
        py: Python<'_>,
        connector: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let boxed = crate::sched_aux::boxed(connector, self.connector_error.clone())?;
        self.inner.set_aux_output_connector(boxed).or_raise(py)
    }

    /// Sets (`None`: removes) the encoder-cache connector (`sched_ec`, vLLM 0.33's
    /// `ECConnectorBase`). Raises `ConfigError` for an object without its two methods.
    fn set_encoder_connector(&mut self, connector: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let boxed = crate::sched_ec::boxed(connector, self.connector_error.clone())?;
        self.inner.set_encoder_connector(boxed);
        Ok(())
    }

    /// The encoder compute budget per step, in embeddings; settable (from the next step on,
    /// as given: 0 encodes nothing).
    #[getter]
    fn encoder_budget(&self) -> usize {
        self.inner.encoder_budget()
    }

    #[setter]
    fn set_encoder_budget(&mut self, max_num_encoder_input_tokens: usize) {
        self.inner.set_encoder_budget(max_num_encoder_input_tokens);
    }

    /// vLLM 0.33's Mamba `align` split (`need_mamba_block_aligned_split`) as
    /// `(block_size, drop_eagle_block, num_hash_lookahead_tokens)`, or `None` when off; the
    /// look-ahead is the scheduler's (`num_hash_lookahead_tokens`).
    #[getter]
    fn mamba_align(&self) -> Option<(usize, bool, usize)> {
        let lookahead = self.inner.num_hash_lookahead_tokens();
        (self.inner.mamba_align()).map(|s| (s.block_size, s.drop_eagle_block, lookahead))
    }

    /// Turns the Mamba `align` split on over blocks of `block_size` tokens (0: off) from
    /// the next step (ConfigError for nothing else: every size >= 1 is valid).
    #[pyo3(signature = (block_size, drop_eagle_block=false))]
    fn set_mamba_align(
        &mut self,
        py: Python<'_>,
        block_size: usize,
        drop_eagle_block: bool,
    ) -> PyResult<()> {
        let split = (block_size > 0).then_some(MambaAlignSplit {
            block_size,
            drop_eagle_block,
        });
        self.inner
            .set_mamba_align(split)
            .map_err(|err| self.raise(py, err))
    }

    /// Routes the step's allocations, Mamba splits and (priority policy) the running
    /// requests' priorities at a preemption through Python callables from the next step
    /// (`allocate(request_id, num_new_tokens, num_lookahead_tokens) -> bool`,
    /// `mamba_split(request_id, start, num_new_tokens, core_split) -> int`,
    /// `priority(request_id) -> int | None`, `pending_block_frees() -> bool` when a running
    /// request's allocation finds no room, `encoder_can_allocate(request_id, input_index,
    /// budget_left, num_embeds_to_schedule) -> bool` before an encoder input is given cache
    /// room, `waiting_ready(request_id) -> bool` when admission reaches a request waiting
    /// outside); none: off.
    #[pyo3(signature = (*, allocate=None, mamba_split=None, priority=None, pending_block_frees=None,
        encoder_can_allocate=None, waiting_ready=None))]
    #[allow(clippy::too_many_arguments)]
    fn set_step_hooks(
        &mut self,
        allocate: Option<Py<PyAny>>,
        mamba_split: Option<Py<PyAny>>,
        priority: Option<Py<PyAny>>,
        pending_block_frees: Option<Py<PyAny>>,
        encoder_can_allocate: Option<Py<PyAny>>,
        waiting_ready: Option<Py<PyAny>>,
    ) {
        let any = allocate.is_some()
            || mamba_split.is_some()
            || priority.is_some()
            || pending_block_frees.is_some()
            || encoder_can_allocate.is_some()
            || waiting_ready.is_some();
        let hooks = any.then(|| {
            Box::new(crate::sched_hooks::PyStepHooks {
                allocate,
                mamba_split,
                priority,
                pending_block_frees,
                encoder_can_allocate,
                waiting_ready,
                error: self.plugin_error.clone(),
            }) as Box<dyn tokenyard_core::sched::StepHooks<RequestId>>
        });
        self.inner.set_step_hooks(hooks);
    }

    /// Input slots a parallel drafter takes per scheduled request beside its tokens (vLLM
    /// 0.33's `max_num_new_slots_for_drafting`); settable, from the next step on.
    #[getter]
    fn num_draft_slots_per_request(&self) -> usize {
        self.inner.num_draft_slots_per_request()
    }

    #[setter]
    fn set_num_draft_slots_per_request(&mut self, num_draft_slots: usize) {
        self.inner.set_num_draft_slots_per_request(num_draft_slots);
    }

    /// vLLM 0.33's `num_sampled_tokens_per_step` (1, or 0 for a pooling or diffusion
    /// model); settable, from the next step on (ConfigError for another value).
    #[getter]
    fn num_sampled_tokens_per_step(&self) -> usize {
        self.inner.num_sampled_tokens_per_step()
    }

    #[setter]
    fn set_num_sampled_tokens_per_step(&mut self, py: Python<'_>, num: usize) -> PyResult<()> {
        self.inner
            .set_num_sampled_tokens_per_step(num)
            .map_err(|err| self.raise(py, err))
    }

    /// The drafter's prefill look-ahead (vLLM 0.33's `num_prefill_lookahead`); settable,
    /// from the next step on.
    #[getter]
    fn num_prefill_lookahead(&self) -> usize {
        self.inner.num_prefill_lookahead()
    }

    #[setter]
    fn set_num_prefill_lookahead(&mut self, num_prefill_lookahead: usize) {
        self.inner.set_num_prefill_lookahead(num_prefill_lookahead);
    }

    /// Tokens past each block that its hash covers (vLLM 0.33's
    /// `num_hash_lookahead_tokens`); settable while no request holds blocks.
    #[getter]
    fn num_hash_lookahead_tokens(&self) -> usize {
        self.inner.num_hash_lookahead_tokens()
    }

    #[setter]
    fn set_num_hash_lookahead_tokens(&mut self, py: Python<'_>, lookahead: i64) -> PyResult<()> {
        let Ok(lookahead) = usize::try_from(lookahead) else {
            let field = "num_hash_lookahead_tokens";
            return Err(crate::errors::config_error(
                py,
                field,
                lookahead,
                "must be >= 0",
            ));
        };
        self.inner
            .set_num_hash_lookahead_tokens(lookahead)
            .map_err(|err| self.raise(py, err))
    }

    /// Whether encoder inputs are an encoder-decoder model's (vLLM 0.33's
    /// `is_encoder_decoder`: encoded with the first decoder tokens, sizing the
    /// cross-attention groups, counted by `EncoderDecoderCacheManager`).
    #[getter]
    fn is_encoder_decoder(&self) -> bool {
        self.inner.is_encoder_decoder()
    }

    /// Sets it (only while no request has multimodal items: InputError otherwise).
    fn set_encoder_decoder(&mut self, py: Python<'_>, encoder_decoder: bool) -> PyResult<()> {
        self.inner
            .set_encoder_decoder(encoder_decoder)
            .map_err(|err| self.raise(py, err))
    }

    /// Replaces the encoder cache with an empty one of `cache_size` embeddings (only while
    /// no request holds an entry: InputError otherwise).
    fn set_encoder_cache_size(&mut self, py: Python<'_>, cache_size: usize) -> PyResult<()> {
        self.inner
            .set_encoder_cache_size(cache_size)
            .map_err(|err| self.raise(py, err))
    }

    /// The encoder cache's entries: `(mm_hash, request ids referencing it)`, by `mm_hash`
    /// (no ids: freeable).
    fn encoder_cache_entries<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Vec<(String, Vec<Py<PyAny>>)>> {
        let mut entries = Vec::new();
        for (mm_hash, ids) in self.inner.encoder_cache_entries() {
            let ids = ids.into_iter().map(|id| id.into_py(py));
            entries.push((mm_hash, ids.collect::<PyResult<Vec<_>>>()?));
        }
        Ok(entries)
    }

    /// The freeable entries, oldest first: `(mm_hash, num_embeds)`.
    fn encoder_cache_freeable(&self) -> Vec<(String, usize)> {
        self.inner.encoder_cache_freeable()
    }

    /// Identifiers evicted since the last step's `free_encoder_mm_hashes`.
    fn encoder_cache_freed(&self) -> Vec<String> {
        self.inner.encoder_cache_freed()
    }

    /// The encoder cache's `(num_free_slots, num_freeable_slots, cache_size)`.
    fn encoder_cache_usage(&self) -> (usize, usize, usize) {
        self.inner.encoder_cache_usage()
    }

    /// Requests referencing the encoder cache's entry `mm_hash`; `None` if none is held.
    fn encoder_cache_refs(&self, mm_hash: &str) -> Option<usize> {
        self.inner
            .encoder_cache_contains(mm_hash)
            .then(|| self.inner.encoder_cache_refs(mm_hash))
    }
}

#[path = "sched_args.rs"]
mod args;

#[path = "sched_kv.rs"]
mod kv_views;

#[path = "sched_kv_events.rs"]
mod kv_events;

#[path = "sched_adopt.rs"]
mod adopt;
#[path = "sched_block_free.rs"]
mod block_free;
#[path = "sched_hisparse.rs"]
mod hisparse;
#[path = "sched_load_failures.rs"]
mod load_failures;
#[path = "sched_outside.rs"]
mod outside;
