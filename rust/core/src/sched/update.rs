//! Requests in and out of the scheduler: admission to the waiting queue, the engine's
//! sampled tokens (stop conditions, speculative rollback), aborts (the invariant check is
//! `sched::invariants`).

use super::Scheduler;
use super::budget::StepBudget;
use super::output::SampledOutput;
use super::outside_wait::OutsideWait;
use super::request::{FinishReason, Request, RequestSpec, RequestStatus};
use super::scheduler::FinishedInFlight;
use crate::kv::{KvGroupSpec, RequestKey, TokenId};
use crate::{Error, Result};

/// The most output tokens a new request's token vector reserves room for.
const RESERVED_OUTPUT_TOKENS: usize = 4096;

/// Room a new prompt's vector reserves for outputs: capped, so a queue of requests with a
/// huge `max_tokens` does not hold memory for outputs most will never sample (past the cap
/// the vector grows as usual).
pub(super) fn reserved_outputs(
    max_tokens: usize,
    max_model_len: usize,
    num_prompt_tokens: usize,
) -> usize {
    max_tokens
        .min(max_model_len - num_prompt_tokens)
        .min(RESERVED_OUTPUT_TOKENS)
}

impl<R: RequestKey> Scheduler<R> {
    /// Queues a new request.
    pub fn add_request(&mut self, request_id: R, mut spec: RequestSpec) -> Result<()> {
        if self.index.contains_key(&request_id) {
            return Err(Error::input(
                "request_id",
                format!("{request_id:?}"),
                "is already queued or running",
            ));
        }
        let num_deferred = spec.num_deferred_prompt_tokens;
        if num_deferred > 0 && !spec.prompt_token_ids.is_empty() {
            return Err(Error::input(
                "num_deferred_prompt_tokens",
                num_deferred,
                "must be 0 when prompt_token_ids are given",
            ));
        }
        if num_deferred > 0 && self.prompt_source.is_none() {
            return Err(Error::input(
                "num_deferred_prompt_tokens",
                num_deferred,
                "needs a prompt source (Scheduler::set_prompt_source)",
            ));
        }
        let num_prompt_tokens = spec.prompt_token_ids.len().max(num_deferred);
        // vLLM 0.33 queues a streaming-input session whose first chunk is empty
        // (`sched::session`: it is skipped at each step, nothing to compute).
        if num_prompt_tokens == 0 && !spec.resumable {
            return Err(Error::input("prompt_token_ids", "[]", "must not be empty"));
        }
        if spec.max_tokens == 0 {
            return Err(Error::input("max_tokens", 0, "must be at least 1"));
        }
        // vLLM 0.33 keeps room for the token a step samples, none for a pooling model.
        let max_prompt = self.config.max_model_len - self.config.num_sampled_tokens_per_step;
        if num_prompt_tokens > max_prompt {
            return Err(Error::input(
                "prompt_token_ids",
                format!("{num_prompt_tokens} tokens"),
                format!(
                    "must leave room for one output token under max_model_len={}",
                    self.config.max_model_len
                ),
            ));
        }
        self.check_computed_on_arrival(&spec, num_prompt_tokens)?;
        super::request::check_stop_rules(spec.repetition_detection.as_ref(), spec.min_tokens)?;
        self.check_mm_features(&spec, num_prompt_tokens)?;
        if !spec.arrival_time.is_finite() {
            return Err(Error::input(
                "arrival_time",
                spec.arrival_time,
                "must be finite",
            ));
        }
        // The prompt moves into `all_token_ids` with room for the outputs reserved up front:
        // a copy, or regrowing a long prompt's vector as outputs arrive, cost a tenth of a
        // replay's time in page faults and memmove. A deferred prompt reserves when it is
        // made.
        let mut all_token_ids = std::mem::take(&mut spec.prompt_token_ids);
        if num_deferred == 0 {
            all_token_ids.reserve_exact(reserved_outputs(
                spec.max_tokens,
                self.config.max_model_len,
                num_prompt_tokens,
            ));
        }
        let request = Request {
            request_id: request_id.clone(),
            all_token_ids,
            num_prompt_tokens,
            num_computed_tokens: spec.num_computed_tokens,
            spec,
            status: RequestStatus::Waiting,
            spec_token_ids: Vec::new(),
            num_output_placeholders: 0,
            in_flight_tokens: std::collections::VecDeque::new(),
            max_spec_in_flight: 0,
            unlanded_steps: std::collections::VecDeque::new(),
            num_preemptions: 0,
            last_num_spec_tokens: 0,
            is_prefill_chunk: true,
            arrival_seq: self.next_arrival_seq,
            num_external_computed_tokens: 0,
            kv_load_failed: false,
            inflight_prefill: false,
            last_sched_seq: 0,
            prompt_block_hashes: Vec::new(),
            replay_start: 0,
            shared_prefix_boundary: 0,
            last_step: 0,
            stale_until_step: 0,
            drop_stale_output: false,
            outside_wait: OutsideWait::None,
        };
        self.next_arrival_seq += 1;
        self.num_mm_requests += usize::from(!request.spec.mm_features.is_empty());
        self.settle_kv_cache_calls();
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(request);
                slot
            }
            None => {
                self.slots.push(Some(request));
                (self.slots.len() - 1) as u32
            }
        };
        self.own_kv_slot(slot, &request_id);
        self.index.insert(request_id, slot);
        self.kv.set_num_prompt_tokens(slot, num_prompt_tokens);
        let key = self.priority_key(slot);
        // One that arrives computed waits with the block holders (vLLM 0.33's
        // `_enqueue_waiting_request` asks `_holds_kv_blocks`).
        let holds_kv = self.holds_kv(slot);
        self.waiting.push_back_in_part(slot, key, holds_kv);
        Ok(())
    }

    /// `RequestSpec::num_computed_tokens`: less than the prompt (a token is left for the
    /// model's logits, as vLLM's scheduler asserts), and over KV groups whose first
    /// allocation for them is modelled (full attention, windows, chunked local, Mamba).
    fn check_computed_on_arrival(
        &self,
        spec: &RequestSpec,
        num_prompt_tokens: usize,
    ) -> Result<()> {
        let num_computed = spec.num_computed_tokens;
        if num_computed == 0 {
            return Ok(());
        }
        if num_computed >= num_prompt_tokens {
            return Err(Error::input(
                "num_computed_tokens",
                num_computed,
                format!("must be less than the prompt's {num_prompt_tokens} tokens"),
            ));
        }
        // Served over full attention, windows, chunked local attention and Mamba groups
        // (`KvCoordinator::allocate_slots_arrived`); the rest are not modelled.
        let unserved = self.config.kv_groups.iter().find(|g| {
            !(g.is_mamba()
                || matches!(
                    g,
                    KvGroupSpec::FullAttention
                        | KvGroupSpec::SlidingWindow { .. }
                        | KvGroupSpec::ChunkedLocalAttention { .. }
                ))
        });
        if let Some(group) = unserved {
            return Err(Error::input(
                "num_computed_tokens",
                num_computed,
                format!(
                    "is served beside full attention, sliding windows, chunked local \
                     attention and Mamba groups only, not beside {group:?} (not modelled)"
                ),
            ));
        }
        Ok(())
    }

    /// Applies the engine's results for the latest step(s): appends sampled tokens, checks
    /// stop conditions, rolls back rejected speculative tokens and records new drafts.
    /// All-or-nothing: an unknown or repeated id fails the call before anything changes.
    /// Returns the requests that finished, with why. A KV connector's error in
    /// `request_finished`, or an encoder-cache connector's in `update_state_after_free`, is
    /// returned after the whole update is applied (see `finish`); the
    /// requests that finished are then only reported in the next step's `finished_req_ids`.
    /// Under async scheduling, call it once per step scheduled, empty steps included, in
    /// order, as vLLM's engine does: each call lands the oldest step not yet updated (its
    /// requests let go of the encoder items they passed).
    pub fn update_from_output(
        &mut self,
        outputs: &[SampledOutput<R>],
    ) -> Result<Vec<(R, FinishReason)>> {
        let slots = self.check_outputs(outputs)?;
        // The oldest step not yet updated lands (a drafts' update lands none).
        self.num_updates += 1;
        let ec_error = self.encoder_free_passed(outputs);
        self.in_flight_land_step();
        let finished = self.apply_update(outputs, &slots)?;
        ec_error.map_or(Ok(finished), Err)
    }

    /// Drafts proposed after a step's update (vLLM's `update_draft_token_ids`): outputs
    /// with drafts and no tokens, applied as `update_from_output` applies them, except that
    /// they are no step's output: they land no step (a preempted request's stale outputs,
    /// `sched::stale`, the tokens in flight, the encoder items a step passed).
    pub fn update_draft_token_ids(&mut self, outputs: &[SampledOutput<R>]) -> Result<()> {
        if let Some(output) = outputs.iter().find(|o| !o.token_ids.is_empty()) {
            return Err(Error::input(
                "sampled_token_ids",
                format!(
                    "{} tokens for {:?}",
                    output.token_ids.len(),
                    output.request_id
                ),
                "a drafts' update carries no sampled tokens",
            ));
        }
        let slots = self.check_outputs(outputs)?;
        self.apply_update(outputs, &slots).map(drop)
    }

    /// `slots`: `check_outputs`' answer for `outputs` (ids are distinct, so applying one
    /// output changes no other's).
    pub(super) fn apply_update(
        &mut self,
        outputs: &[SampledOutput<R>],
        slots: &[Option<u32>],
    ) -> Result<Vec<(R, FinishReason)>> {
        let mut finished = Vec::new();
        let mut connector_error = None;
        for (output, &slot) in outputs.iter().zip(slots) {
            let Some(slot) = slot else {
                self.drop_late_output(&output.request_id)?;
                continue;
            };
            if let Some(reason) = self.apply_output(slot, output)? {
                finished.push((output.request_id.clone(), reason));
                if self.parks(slot, reason) {
                    self.park(slot)?;
                } else if let Err(err) = self.finish(slot, reason) {
                    connector_error.get_or_insert(err);
                }
            }
        }
        // vLLM 0.33's `error_req_ids`, finished after the step's outputs.
        let mut errors = self.take_encoder_mismatches();
        if !self.pending_load_errors.is_empty() {
            errors.extend(self.take_load_errors());
        }
        for slot in errors {
            finished.push((self.req(slot).request_id.clone(), FinishReason::Error));
            if let Err(err) = self.finish(slot, FinishReason::Error) {
                connector_error.get_or_insert(err);
            }
        }
        connector_error.map_or(Ok(finished), Err)
    }

    /// A late output of a request that already finished (async scheduling): dropped, as
    /// vLLM 0.33 drops the output of a request it no longer holds. Its blocks were freed
    /// when it finished.
    fn drop_late_output(&mut self, request_id: &R) -> Result<()> {
        let in_flight = self
            .finished_in_flight
            .get_mut(request_id)
            .expect("checked by the caller");
        in_flight.outputs_left -= 1;
        if in_flight.outputs_left == 0 {
            self.finished_in_flight.remove(request_id);
        }
        Ok(())
    }

    /// Outputs still expected for `request_id`: its steps in flight that sample, whether it
    /// is live or finished (a finished request's late outputs are dropped when they land).
    pub fn num_outputs_in_flight(&self, request_id: &R) -> usize {
        if let Some(in_flight) = self.finished_in_flight.get(request_id) {
            return in_flight.outputs_left;
        }
        self.index
            .get(request_id)
            .map_or(0, |&slot| self.req(slot).num_sampling_steps())
    }

    /// Checks one update's outputs; returns each one's slot, `None` for a request that
    /// finished with outputs in flight (a late output, dropped).
    pub(super) fn check_outputs(&self, outputs: &[SampledOutput<R>]) -> Result<Vec<Option<u32>>> {
        let twice = |id: &R| {
            Error::input(
                "request_id",
                format!("{id:?}"),
                "appears twice in one update",
            )
        };
        // Live ids are told apart by slot (one id per slot): a flag per slot, not a hash
        // set of ids (which cost a probe and a rehash per request per step); a set of slots
        // where the slots (a long waiting queue) far outnumber the outputs.
        let mut seen_slots = SeenSlots::new(self.slots.len(), outputs.len());
        let mut seen_finished = rustc_hash::FxHashSet::default();
        let mut slots = Vec::with_capacity(outputs.len());
        for output in outputs {
            let id = &output.request_id;
            if !self.finished_in_flight.is_empty() && self.finished_in_flight.contains_key(id) {
                if !seen_finished.insert(id) {
                    return Err(twice(id));
                }
                slots.push(None);
                continue;
            }
            let slot = *self
                .index
                .get(id)
                .ok_or_else(|| Error::unknown_request(id))?;
            if !seen_slots.insert(slot) {
                return Err(twice(id));
            }
            slots.push(Some(slot));
            let request = self.req(slot);
            // A request preempted after its step was launched (async scheduling, or several
            // batches in flight) still gets that step's (valid) tokens; it recomputes them
            // with the rest when it resumes.
            let may_sample = matches!(
                request.status,
                RequestStatus::Running | RequestStatus::Preempted
            );
            if !may_sample && !output.token_ids.is_empty() {
                return Err(Error::input(
                    "request_id",
                    format!("{id:?}"),
                    "is not running",
                ));
            }
            // A prefill chunk samples nothing; vLLM 0.33's `update_from_output` appends what
            // the runner returns for it all the same (`append_prefill_chunk_outputs`).
            if !output.token_ids.is_empty()
                && request.num_sampling_steps() == 0
                && !(self.append_prefill_chunk_outputs
                    && request.is_prefill_chunk
                    && request.status == RequestStatus::Running)
            {
                return Err(Error::input(
                    "request_id",
                    format!("{id:?}"),
                    "samples in no step in flight (its tokens were not scheduled, or this \
                     step's output was already given)",
                ));
            }
            let most = 1 + request.max_spec_in_flight;
            if output.token_ids.len() > most {
                return Err(Error::input(
                    "sampled_token_ids",
                    format!("{} tokens for {id:?}", output.token_ids.len()),
                    format!("at most {most} can be sampled (1 + its scheduled draft tokens)"),
                ));
            }
            // The step reported may be an earlier one than the latest (async scheduling):
            // bounded by the most drafts any step in flight verifies.
            let most_drafts = request.last_num_spec_tokens.max(request.max_spec_in_flight);
            if output.num_rejected_tokens > most_drafts {
                return Err(Error::input(
                    "num_rejected_tokens",
                    format!("{} for {id:?}", output.num_rejected_tokens),
                    format!("only {most_drafts} speculative tokens were scheduled"),
                ));
            }
        }
        Ok(slots)
    }

    fn apply_output(
        &mut self,
        slot: u32,
        output: &SampledOutput<R>,
    ) -> Result<Option<FinishReason>> {
        let running = self.req(slot).status == RequestStatus::Running;
        if output.num_rejected_tokens > 0 && running {
            self.kv.rewind(slot, output.num_rejected_tokens)?;
            let request = self.req_mut(slot);
            request.num_computed_tokens -= output.num_rejected_tokens;
            request.num_output_placeholders = request
                .num_output_placeholders
                .saturating_sub(output.num_rejected_tokens);
        }
        let request = self.req_mut(slot);
        let had_placeholders = request.num_output_placeholders > 0;
        // vLLM's update_draft_token_ids: a request whose step did not sample (a prefill
        // chunk) keeps no drafts.
        if request.is_prefill_chunk {
            request.spec_token_ids.clear();
        } else {
            request.spec_token_ids.clone_from(&output.spec_token_ids);
        }
        let verified_drafts = request.last_num_spec_tokens.max(request.max_spec_in_flight) > 0;
        let num_tokens_before = request.num_tokens();
        let reason = self.append_sampled(slot, &output.token_ids);
        // Tokens after the one that stopped the request (accepted drafts past an EOS) are
        // dropped; as in vLLM 0.33's `_update_request_with_output`, its computed tokens then
        // cover all its tokens but the last.
        let num_dropped = num_tokens_before + output.token_ids.len() - self.req(slot).num_tokens();
        if num_dropped > 0 && running {
            self.kv.rewind(slot, num_dropped)?;
            self.req_mut(slot).num_computed_tokens -= num_dropped;
        }
        // vLLM 0.33's `update_from_output` caches the full blocks of the tokens computed by
        // the steps that landed (`num_computed_tokens - num_in_flight_tokens`) whenever the
        // request had output placeholders (async scheduling) or speculative decoding is on,
        // before a request that stopped frees its blocks: blocks completed by accepted
        // drafts, or by steps that ran ahead of their outputs, are prefix hits at once.
        let spec_rule = self.config.cache_accepted_drafts
            && (verified_drafts || self.config.num_speculative_tokens > 0);
        if (had_placeholders || spec_rule) && running && !output.token_ids.is_empty() {
            let known = self.kv.num_tokens(slot).unwrap_or(0);
            let request = self.slots[slot as usize].as_ref().expect("live");
            let in_flight: usize = request.in_flight_tokens.iter().map(|&(_, n)| n).sum();
            // At most the tokens it has: an output of a step dropped by a reset-preemption,
            // handed back after the request resumed, is taken for the new step's and would
            // otherwise reach past them (vLLM caches up to the tokens it has hashed).
            let landed = (request.num_computed_tokens.saturating_sub(in_flight))
                .min(request.all_token_ids.len());
            // The pool caches up to the tokens it knows: give it those up to `landed`. (It
            // never knows more: its tokens come from allocations, which see only landed
            // outputs.)
            if landed >= known {
                let new_token_ids = &request.all_token_ids[known..landed];
                match self.config.num_hash_lookahead_tokens {
                    0 => self.kv.cache_blocks(slot, new_token_ids)?,
                    // vLLM's block hasher hashes with the tokens sampled past them.
                    lookahead => {
                        let end = (landed + lookahead).min(request.all_token_ids.len());
                        let ahead = &request.all_token_ids[landed..end];
                        self.kv.cache_blocks_ahead(slot, new_token_ids, ahead)?;
                    }
                }
            }
        }
        Ok(reason)
    }

    /// Appends sampled tokens, stopping at the first that ends the request.
    fn append_sampled(&mut self, slot: u32, token_ids: &[TokenId]) -> Option<FinishReason> {
        let max_model_len = self.config.max_model_len;
        let request = self.req_mut(slot);
        if !token_ids.is_empty() {
            // Every returned token resolves a placeholder, those after a stop included.
            request.num_output_placeholders = request
                .num_output_placeholders
                .saturating_sub(token_ids.len());
            request.in_flight_tokens.pop_front();
            if request.in_flight_tokens.is_empty() {
                request.max_spec_in_flight = 0;
            }
        }
        for &token in token_ids {
            request.all_token_ids.push(token);
            if let Some(reason) = stop_reason(request, token, max_model_len) {
                return Some(reason);
            }
        }
        None
    }

    /// The simulator's bulk form of `update_from_output`: one token for each of `ids`
    /// (distinct, running), with no speculation. Skips building per-request outputs and
    /// the duplicate check, which cost more than the update itself at this rate.
    /// Appends one sampled token to each of `ids`: `token(id, position)` gives the token
    /// at `position` (the request's current length).
    pub(crate) fn append_one_token_each(
        &mut self,
        ids: &[R],
        mut token: impl FnMut(&R, usize) -> TokenId,
    ) -> Result<Vec<(R, FinishReason)>> {
        let mut finished = Vec::new();
        for id in ids {
            self.append_one_token(id, None, &mut token, &mut finished)?;
        }
        Ok(finished)
    }

    /// [`Self::append_one_token_each`] of `(id, slot hint)` pairs (`step_samplers`): a hint
    /// whose slot still holds the request spares looking it up by id (a hash probe per
    /// request per step); a stale one is looked up as before.
    pub(crate) fn append_one_token_each_at(
        &mut self,
        ids: &[(R, u32)],
        mut token: impl FnMut(&R, usize) -> TokenId,
    ) -> Result<Vec<(R, FinishReason)>> {
        let mut finished = Vec::new();
        for (id, hint) in ids {
            self.append_one_token(id, Some(*hint), &mut token, &mut finished)?;
        }
        Ok(finished)
    }

    fn append_one_token(
        &mut self,
        id: &R,
        hint: Option<u32>,
        token: &mut impl FnMut(&R, usize) -> TokenId,
        finished: &mut Vec<(R, FinishReason)>,
    ) -> Result<()> {
        if !self.finished_in_flight.is_empty() && self.finished_in_flight.contains_key(id) {
            return self.drop_late_output(id);
        }
        // A live request in the hinted slot with this id is the one the index maps it to.
        let hinted = hint.filter(|&slot| {
            (self.slots.get(slot as usize))
                .is_some_and(|r| r.as_ref().is_some_and(|r| r.request_id == *id))
        });
        let slot = match hinted {
            Some(slot) => slot,
            None => *self
                .index
                .get(id)
                .ok_or_else(|| Error::unknown_request(id))?,
        };
        if self.req(slot).status != RequestStatus::Running {
            return Err(Error::input(
                "request_id",
                format!("{id:?}"),
                "is not running",
            ));
        }
        self.req_mut(slot).spec_token_ids.clear();
        let sampled = token(id, self.req(slot).num_tokens());
        if let Some(reason) = self.append_sampled(slot, &[sampled]) {
            finished.push((id.clone(), reason));
            if self.parks(slot, reason) {
                self.park(slot)?;
            } else {
                self.finish(slot, reason)?;
            }
        }
        Ok(())
    }

    /// Aborts requests wherever they are; all-or-nothing on unknown ids. A KV connector's
    /// error in `request_finished` is returned once every request is aborted.
    pub fn abort(&mut self, request_ids: &[R]) -> Result<()> {
        for id in request_ids {
            if !self.index.contains_key(id) {
                return Err(Error::unknown_request(id));
            }
        }
        let mut connector_error = None;
        for id in request_ids {
            if let Some(&slot) = self.index.get(id)
                && let Err(err) = self.finish(slot, FinishReason::Abort)
            {
                connector_error.get_or_insert(err);
            }
        }
        connector_error.map_or(Ok(()), Err)
    }

    /// Removes a request for good, freeing its blocks (their full blocks stay cached). The
    /// outputs of steps still in flight (`num_sampling_steps()`: a request aborted or stopped
    /// while another of its steps runs) are dropped when they land. The blocks are freed at
    /// once even then, as vLLM 0.33 frees them (a batch in flight still reads them, but
    /// nothing allocated after it can write them before it ends: the device runs steps in
    /// order), unless block frees are deferred (`defer_block_free`, which vLLM sets for a
    /// KV-consumer connector with several batches in flight: a connector's load is not
    /// ordered against the device's steps); the blocks then wait for the newest step
    /// scheduled (`sched::block_free`).
    ///
    /// The connector (if any) is asked about every finished request, whatever its status
    /// (vLLM 0.33's `_free_request`), then the encoder-cache connector (if any), and
    /// either may keep its blocks until their send completes;
    /// a request aborted while its KV loads keeps them until the load stops writing. Both
    /// are freed when `finish_kv_transfers` reports the transfer.
    ///
    /// If the connector's `request_finished` fails, the request still finishes (a request
    /// left running past its stop would never finish at `max_model_len`) and its blocks are
    /// freed, as if the connector had not asked to keep them; the error is returned after.
    pub(super) fn finish(&mut self, slot: u32, reason: FinishReason) -> Result<()> {
        self.encoder_release(slot);
        let request = self.slots[slot as usize].as_ref().expect("live");
        let in_flight = request.num_sampling_steps();
        let status = request.status;
        let mut connector_error = None;
        // A load already reported (landed or failed) writes nothing more and will not be
        // reported again: only a load still in flight holds the blocks. A deferred load
        // never started (`sched::block_free`): nothing will report it.
        let load_holds = status == RequestStatus::WaitingForRemoteKvs
            && !self.drop_deferred_load(slot)
            && !self.landed.contains(&slot);
        // vLLM 0.33's `_free_request` asks the connector about every finished request,
        // whatever its status (`_connector_finished`).
        let connector_holds = match self.connector_finished(slot) {
            Ok(holds) => holds,
            Err(err) => {
                connector_error = Some(err);
                false
            }
        };
        // vLLM ORs the encoder-cache connector's answer into the KV connector's.
        let ec_holds = self.ec_request_finished(slot).unwrap_or_else(|err| {
            connector_error.get_or_insert(err);
            false
        });
        let for_transfer = load_holds || connector_holds || ec_holds;
        if status == RequestStatus::Running {
            self.running.retain(|&s| s != slot);
        } else {
            self.parked.remove(&slot);
            self.waiting.remove(slot);
        }
        let mut request = self.slots[slot as usize]
            .take()
            .expect("finishing a live request");
        self.num_mm_requests -= usize::from(!request.spec.mm_features.is_empty());
        request.status = RequestStatus::Finished(reason);
        self.index.remove(&request.request_id);
        self.landed.remove(&slot);
        self.failed_loads.remove(&slot);
        self.deferred.remove(&slot);
        if in_flight > 0 {
            self.finished_in_flight.insert(
                request.request_id.clone(),
                FinishedInFlight {
                    outputs_left: in_flight,
                },
            );
        }
        if for_transfer {
            let hold = (slot, request.last_sched_seq);
            self.transfer_holds.insert(request.request_id.clone(), hold);
        } else {
            self.free_or_defer(slot, request.last_sched_seq)?;
        }
        self.finished_since_last_step.push(request.request_id);
        connector_error.map_or(Ok(()), Err)
    }

    /// Whether tokens given for a running request's prefill chunk (a step that samples
    /// nothing) are appended as its output, as vLLM 0.33's `update_from_output` appends
    /// whatever the runner returns for a scheduled request (`_update_request_with_output`;
    /// its runner returns none for a chunk, its tests hand one). Off by default: an
    /// `InputError` names the request.
    pub fn set_append_prefill_chunk_outputs(&mut self, on: bool) {
        self.append_prefill_chunk_outputs = on;
    }

    pub fn append_prefill_chunk_outputs(&self) -> bool {
        self.append_prefill_chunk_outputs
    }

    /// vLLM's `reset_prefix_cache`: forgets every cached prefix, which needs every block
    /// free. With `preempt_running`, the running requests are preempted first (the last
    /// first, so they resume in running order) and the outputs of their steps in flight
    /// are dropped. Returns whether the cache was reset, and the requests preempted.
    pub fn reset_prefix_cache(&mut self, preempt_running: bool) -> Result<(bool, Vec<R>)> {
        let mut preempted = Vec::new();
        if preempt_running {
            let mut plan = super::scheduler::StepPlan::default();
            while let Some(&slot) = self.running.last() {
                let slot = self.preempt(slot, &mut StepBudget::default(), &mut plan)?;
                self.mark_stale(slot, true);
                preempted.push(self.req(slot).request_id.clone());
            }
        }
        Ok((self.kv.reset_prefix_cache(), preempted))
    }
}

/// The slots one update names so far: flags when the outputs cover a good share of the
/// slots (a batch of running requests), a hash set when they do not (a long waiting queue).
enum SeenSlots {
    Flags(Vec<bool>),
    Set(rustc_hash::FxHashSet<u32>),
}

impl SeenSlots {
    fn new(num_slots: usize, num_outputs: usize) -> Self {
        if num_slots <= 8 * num_outputs.max(64) {
            Self::Flags(vec![false; num_slots])
        } else {
            Self::Set(rustc_hash::FxHashSet::default())
        }
    }

    /// Whether `slot` is new to this update (and notes it).
    fn insert(&mut self, slot: u32) -> bool {
        match self {
            Self::Flags(flags) => !std::mem::replace(&mut flags[slot as usize], true),
            Self::Set(set) => set.insert(slot),
        }
    }
}

/// vLLM's stop check after each appended token (0.33's `check_stop`): EOS first, then the
/// stop ids, then length — so a last token that is EOS or a stop id reports `Stop` — then,
/// from `min_tokens` outputs on, repetition.
fn stop_reason<R>(request: &Request<R>, token: u32, max_model_len: usize) -> Option<FinishReason> {
    if !request.spec.ignore_eos && request.spec.eos_token_id == Some(token) {
        return Some(FinishReason::Stop);
    }
    if request.spec.stop_token_ids.contains(&token) {
        return Some(FinishReason::Stop);
    }
    if request.num_tokens() >= max_model_len
        || request.num_output_tokens() >= request.spec.max_tokens
    {
        return Some(FinishReason::Length);
    }
    match &request.spec.repetition_detection {
        Some(rule) if request.num_output_tokens() >= request.spec.min_tokens => {
            let outputs = &request.all_token_ids[request.num_prompt_tokens..];
            rule.detects(outputs).then_some(FinishReason::Repetition)
        }
        _ => None,
    }
}
