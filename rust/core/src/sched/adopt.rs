//! Requests and steps placed by the caller instead of formed by `schedule()` (vLLM 0.33's
//! own tests and model-runner harnesses put a request into `Scheduler.requests` and
//! `Scheduler.running` by hand, then hand `update_from_output` a `SchedulerOutput` they
//! built: vLLM's scheduler simply reads those containers). `adopt_running` moves a request
//! just queued into the running list with the tokens it already has, computed as the caller
//! says; `update_from_outside_step` applies the outputs of a step the caller formed over
//! such requests. Invariant kept: a running request holds blocks for all its computed
//! tokens (an adopted one gets them at adoption, where vLLM's would get them at its next
//! `schedule()`), so every later step, preemption and finish treats it as its own.

use super::Scheduler;
use super::output::SampledOutput;
use super::request::{FinishReason, RequestStatus};
use crate::kv::{RequestKey, TokenId};
use crate::{Error, Result};

/// One request's share of a step formed outside the scheduler: its id, the tokens the step
/// scheduled for it (already counted in its computed tokens, as vLLM's
/// `_update_after_schedule` counts them), and how many of those were draft tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutsideStep<R> {
    pub request_id: R,
    pub num_scheduled_tokens: usize,
    pub num_spec_tokens: usize,
}

impl<R: RequestKey> Scheduler<R> {
    /// Moves `request_id`, queued by `add_request` and not yet scheduled, to the end of the
    /// running list (vLLM's `scheduler.running.append(request)`): `output_token_ids` are
    /// appended to its prompt and `num_computed_tokens` of its tokens count as computed,
    /// with blocks allocated for them (no prefix hit is looked up, nothing is cached).
    ///
    /// Errors: `UnknownRequest`; `InputError` for a request that is not waiting untouched
    /// (scheduled, loading, preempted, a deferred prompt, multimodal items, a resumable
    /// session), computed tokens past its tokens, or tokens past `max_model_len`;
    /// `Capacity` when the pool cannot hold the computed tokens. Nothing changes on error.
    pub fn adopt_running(
        &mut self,
        request_id: &R,
        output_token_ids: &[TokenId],
        num_computed_tokens: usize,
    ) -> Result<()> {
        let slot = *self
            .index
            .get(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let request = self.req(slot);
        let untouched = request.status == RequestStatus::Waiting
            && request.num_preemptions == 0
            && request.num_computed_tokens == 0
            && request.spec.num_computed_tokens == 0
            && request.num_external_computed_tokens == 0
            && !request.prompt_is_deferred()
            && request.spec.mm_features.is_empty()
            && !request.spec.resumable
            && request.outside_wait == super::OutsideWait::None
            && self.kv.block_ids(slot).is_none();
        if !untouched {
            return Err(Error::input(
                "request_id",
                format!("{request_id:?}"),
                "is not a text request queued untouched (only such a request is adopted \
                 as running)",
            ));
        }
        let num_tokens = request.all_token_ids.len() + output_token_ids.len();
        if num_computed_tokens > num_tokens {
            return Err(Error::input(
                "num_computed_tokens",
                num_computed_tokens,
                format!("request {request_id:?} has {num_tokens} tokens"),
            ));
        }
        if num_tokens > self.config.max_model_len {
            return Err(Error::input(
                "output_token_ids",
                format!("{} tokens", output_token_ids.len()),
                format!(
                    "{num_tokens} tokens in all exceed max_model_len={}",
                    self.config.max_model_len
                ),
            ));
        }
        let mut token_ids = request.all_token_ids.clone();
        token_ids.extend_from_slice(output_token_ids);
        let lora_id = request.spec.lora_id;
        let free = self.kv.num_free_blocks();
        let requested = self.config.blocks_per_request(num_computed_tokens);
        if !self.host_pages_fit(slot, num_computed_tokens) {
            // HiSparse's host pool charges a running request's pages as admission does.
            let host = self.hisparse_host_pages();
            return Err(Error::Capacity {
                what: "the host pages of an adopted request's computed tokens",
                requested: host.map_or(0, |h| num_computed_tokens.div_ceil(h.block_size)),
                available: host.map_or(0, |h| h.num_free_blocks),
            });
        }
        let allocated = (self.kv).allocate(
            slot,
            &token_ids,
            num_computed_tokens,
            0,
            None,
            lora_id,
            false,
        )?;
        if allocated.is_none() {
            return Err(Error::Capacity {
                what: "the blocks of an adopted request's computed tokens",
                requested,
                available: free,
            });
        }
        self.charge_host_pages(slot)?;
        self.waiting.remove(slot);
        self.deferred.remove(&slot);
        let request = self.req_mut(slot);
        request.all_token_ids = token_ids;
        request.num_computed_tokens = num_computed_tokens;
        request.is_prefill_chunk = num_computed_tokens < num_tokens;
        request.status = RequestStatus::Running;
        self.running.push(slot);
        Ok(())
    }

    /// vLLM's `update_from_output` for a step formed outside the scheduler (`step`: each
    /// request's scheduled tokens, already counted as computed) and its `outputs`, which
    /// name only requests of `step`. The step is in flight for its requests that sample
    /// (those whose computed tokens reach their tokens), then their outputs apply as
    /// `update_from_output`'s do; it lands none of the scheduler's own steps. Returns the
    /// requests that finished, with why.
    ///
    /// Errors: `UnknownRequest`; `InputError` for a request of `step` that is not running,
    /// has a step of the scheduler's own in flight, or whose scheduled tokens are 0, exceed
    /// its computed tokens, or leave no token past its drafts; an output naming a request
    /// outside `step`; and `update_from_output`'s. Nothing changes on an input error.
    pub fn update_from_outside_step(
        &mut self,
        step: &[OutsideStep<R>],
        outputs: &[SampledOutput<R>],
    ) -> Result<Vec<(R, FinishReason)>> {
        let mut slots = Vec::with_capacity(step.len());
        for entry in step {
            slots.push(self.check_outside_entry(entry)?);
        }
        if let Some(output) = outputs
            .iter()
            .find(|o| !step.iter().any(|e| e.request_id == o.request_id))
        {
            return Err(Error::input(
                "request_id",
                format!("{:?}", output.request_id),
                "has an output but no tokens in the step formed outside the scheduler",
            ));
        }
        // Each entry's state before the step is put in flight, restored if the outputs are
        // refused.
        let mut saved = Vec::with_capacity(step.len());
        // The outside step lands in this update.
        let landing = self.num_updates + 1;
        for (entry, &slot) in step.iter().zip(&slots) {
            let request = self.req_mut(slot);
            saved.push((
                request.max_spec_in_flight,
                request.last_num_spec_tokens,
                request.is_prefill_chunk,
            ));
            let samples = request.num_computed_tokens >= request.num_tokens();
            request.last_num_spec_tokens = entry.num_spec_tokens;
            request.is_prefill_chunk = !samples;
            if samples {
                // vLLM 0.33 bounds none of a step's sampled tokens by its drafts (a runner
                // may sample several positions): the step allows what its output holds.
                let num_sampled = (outputs.iter())
                    .find(|o| o.request_id == entry.request_id)
                    .map_or(0, |o| o.token_ids.len());
                request
                    .in_flight_tokens
                    .push_back((landing, entry.num_scheduled_tokens));
                request.max_spec_in_flight = (request.max_spec_in_flight)
                    .max(entry.num_spec_tokens)
                    .max(num_sampled.saturating_sub(1));
            }
        }
        let checked = self.check_outputs(outputs);
        let output_slots = match checked {
            Ok(output_slots) => output_slots,
            Err(err) => {
                for (&slot, (max_spec, last_spec, prefill)) in slots.iter().zip(saved) {
                    let request = self.req_mut(slot);
                    if !request.is_prefill_chunk {
                        request.in_flight_tokens.pop_back();
                    }
                    request.max_spec_in_flight = max_spec;
                    request.last_num_spec_tokens = last_spec;
                    request.is_prefill_chunk = prefill;
                }
                return Err(err);
            }
        };
        let finished = self.apply_update(outputs, &output_slots)?;
        // A step of a request that sampled nothing stays in flight no longer.
        for &slot in &slots {
            if let Some(request) = self.slots[slot as usize].as_mut()
                && request.status == RequestStatus::Running
            {
                request.in_flight_tokens.clear();
                request.max_spec_in_flight = 0;
            }
        }
        Ok(finished)
    }

    fn check_outside_entry(&self, entry: &OutsideStep<R>) -> Result<u32> {
        let id = &entry.request_id;
        let slot = *self
            .index
            .get(id)
            .ok_or_else(|| Error::unknown_request(id))?;
        let request = self.req(slot);
        if request.status != RequestStatus::Running {
            return Err(Error::input(
                "request_id",
                format!("{id:?}"),
                "is not running",
            ));
        }
        if request.num_sampling_steps() > 0 || self.num_in_flight_tokens(slot) > 0 {
            return Err(Error::input(
                "request_id",
                format!("{id:?}"),
                "has a step of the scheduler's own in flight",
            ));
        }
        let n = entry.num_scheduled_tokens;
        if n == 0 || n > request.num_computed_tokens || entry.num_spec_tokens >= n {
            return Err(Error::input(
                "num_scheduled_tokens",
                format!("{n} for {id:?}"),
                format!(
                    "must be at least 1, at most its {} computed tokens, and more than its {} \
                     draft tokens",
                    request.num_computed_tokens, entry.num_spec_tokens
                ),
            ));
        }
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::tests::{config, prompt};
    use crate::sched::{RequestSpec, SchedulerConfig};

    fn sample(id: u32, tokens: Vec<TokenId>, rejected: usize) -> SampledOutput<u32> {
        SampledOutput {
            request_id: id,
            token_ids: tokens,
            num_rejected_tokens: rejected,
            spec_token_ids: Vec::new(),
        }
    }

    fn entry(id: u32, n: usize, drafts: usize) -> OutsideStep<u32> {
        OutsideStep {
            request_id: id,
            num_scheduled_tokens: n,
            num_spec_tokens: drafts,
        }
    }

    /// Requests 0 and 1 (6-token prompts, EOS 99, `max_tokens` 10) adopted with their
    /// prompts computed.
    fn two_adopted(k: usize) -> Scheduler<u32> {
        let cfg = SchedulerConfig {
            num_speculative_tokens: k,
            ..config()
        };
        let mut s = Scheduler::new(cfg, false).unwrap();
        for id in 0..2 {
            let spec = RequestSpec {
                max_tokens: 10,
                eos_token_id: Some(99),
                ..prompt(id, 6)
            };
            s.add_request(id, spec).unwrap();
            s.adopt_running(&id, &[], 6).unwrap();
        }
        s
    }

    #[test]
    fn an_adopted_request_runs_with_blocks_for_its_computed_tokens() {
        // 6 computed tokens in blocks of 4: 2 blocks each, 64 - 4 left; both running.
        let s = two_adopted(0);
        assert_eq!(s.running_ids(), [0, 1]);
        assert_eq!(s.num_waiting(), 0);
        assert_eq!(s.num_free_blocks(), 60);
        assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 6);
        s.check_invariants().unwrap();
    }

    #[test]
    fn an_outside_step_stops_on_eos_and_keeps_the_other_running() {
        // Request 0 samples EOS (finished, its 2 blocks freed); 1 samples 5 and runs on.
        let mut s = two_adopted(0);
        let step = [entry(0, 1, 0), entry(1, 1, 0)];
        let done = s
            .update_from_outside_step(&step, &[sample(0, vec![99], 0), sample(1, vec![5], 0)])
            .unwrap();
        assert_eq!(done, [(0, FinishReason::Stop)]);
        assert_eq!(s.running_ids(), [1]);
        assert_eq!(s.num_free_blocks(), 62);
        assert_eq!(s.get_request(&1).unwrap().num_tokens(), 7);
        s.check_invariants().unwrap();
        // The next step is the scheduler's own: request 1 decodes its sampled token.
        let out = s.schedule().unwrap();
        assert_eq!(out.num_scheduled_tokens, [(1, 1)]);
    }

    #[test]
    fn accepted_drafts_past_a_stop_are_dropped_and_rejected_ones_roll_back() {
        // k = 2. Request 0: 3 scheduled (2 drafts), samples [10, 99, 12]: stops at 99, the
        // 12 dropped (computed 6 - 1 = 5). Request 1: 3 scheduled (2 drafts), 1 rejected,
        // samples [13, 14]: computed 6 - 1 = 5, tokens 8.
        let mut s = two_adopted(2);
        let step = [entry(0, 3, 2), entry(1, 3, 2)];
        let outputs = [sample(0, vec![10, 99, 12], 0), sample(1, vec![13, 14], 1)];
        let done = s.update_from_outside_step(&step, &outputs).unwrap();
        assert_eq!(done, [(0, FinishReason::Stop)]);
        let r1 = s.get_request(&1).unwrap();
        assert_eq!((r1.num_computed_tokens, r1.num_tokens()), (5, 8));
        s.check_invariants().unwrap();
    }

    #[test]
    fn refused_outside_steps_change_nothing() {
        let mut s = two_adopted(0);
        // More tokens than computed; an output outside the step; more rejected tokens than
        // drafts.
        assert!(s.update_from_outside_step(&[entry(0, 7, 0)], &[]).is_err());
        assert!(
            s.update_from_outside_step(&[entry(0, 1, 0)], &[sample(1, vec![5], 0)])
                .is_err()
        );
        assert!(
            s.update_from_outside_step(&[entry(0, 2, 1)], &[sample(0, vec![5], 2)])
                .is_err()
        );
        let r0 = s.get_request(&0).unwrap();
        assert_eq!((r0.num_sampling_steps(), r0.num_tokens()), (0, 6));
        // The request is not in flight: a plain update of it is still refused.
        assert!(s.update_from_output(&[sample(0, vec![5], 0)]).is_err());
    }

    #[test]
    fn a_step_formed_outside_may_sample_several_positions() {
        // One token scheduled, no drafts, three sampled (a multi-position runner): all
        // appended, 6 + 3 = 9 tokens, computed still 6.
        let mut s = two_adopted(0);
        let done = s
            .update_from_outside_step(&[entry(0, 1, 0)], &[sample(0, vec![3, 4, 5], 0)])
            .unwrap();
        assert!(done.is_empty());
        let r0 = s.get_request(&0).unwrap();
        assert_eq!((r0.num_computed_tokens, r0.num_tokens()), (6, 9));
        assert_eq!(r0.num_sampling_steps(), 0);
    }

    #[test]
    fn only_untouched_waiting_requests_are_adopted() {
        let mut s = Scheduler::new(config(), false).unwrap();
        s.add_request(0, prompt(0, 4)).unwrap();
        // Computed past its tokens; unknown; then scheduled by the scheduler itself.
        assert!(s.adopt_running(&0, &[], 5).is_err());
        assert!(s.adopt_running(&1, &[], 1).is_err());
        s.schedule().unwrap();
        assert!(s.adopt_running(&0, &[], 4).is_err());
        // 4 + 61 = 65 tokens, past max_model_len 64.
        s.add_request(2, prompt(2, 4)).unwrap();
        let outputs: Vec<TokenId> = vec![1; 61];
        assert!(s.adopt_running(&2, &outputs, 65).is_err());
        assert_eq!(s.num_waiting(), 1);
    }
}
