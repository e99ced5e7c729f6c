//! Phase 2 of a step: admitting waiting requests in order (block holders first) until
//! the token budget, the sequence cap, LoRA slots or KV memory says stop.

use super::budget::StepBudget;
use super::kv::Hit;
use super::outside_wait::OutsideWait;
use super::request::{DeferredPrompt, PLACEHOLDER_DRAFT, RequestStatus};
use super::scheduler::{Scheduler, StepPlan};
use super::update::reserved_outputs;
use crate::kv::{BlockId, ExternalAllocation, RequestKey};
use crate::{Error, Result};

/// What an admission computes this step (`Scheduler::admission_tokens`).
pub(super) struct AdmissionTokens {
    pub(super) n: usize,
    /// Padded with `n - 1` placeholder drafts.
    pub(super) padded: bool,
}

/// What became of the request at the head of the waiting queue.
pub(super) enum Admission {
    Scheduled,
    /// It does not fit (budget or memory): admission stops here (head-of-line blocking).
    Blocked,
    /// It steps aside for now, keeping its place: its KV is being loaded, or the connector
    /// cannot tell yet what it can load.
    SteppedAside,
}

impl<R: RequestKey> Scheduler<R> {
    /// Phase 2: admits waiting requests in order (block holders first) until the budget, the
    /// sequence cap or memory says stop (head-of-line blocking: a request that does not fit
    /// stops admission).
    /// An error while admitting (the connector's) stops admission too, and is returned for
    /// `schedule` to report once the step is consistent.
    pub(super) fn schedule_waiting(
        &mut self,
        budget: &mut StepBudget,
        plan: &mut StepPlan<R>,
    ) -> Result<Option<crate::Error>> {
        if self.config.max_loras > 0 {
            // vLLM counts the adapters of the running requests scheduled in this step; we
            // count every running request's, so the running set never holds more than
            // max_loras adapters and no later step needs more GPU slots than there are
            // (vLLM's schedule() asserts the scheduled running requests hold at most
            // max_loras adapters; a step after one that left some unscheduled can fail it).
            for &slot in &self.running {
                if let Some(lora) = self.req(slot).spec.lora_id {
                    plan.loras.insert(lora);
                }
            }
        }
        let mut skipped = Vec::new();
        let mut admission_error = None;
        while budget.is_open() {
            let Some(slot) = self.waiting.peek() else {
                break;
            };
            let max_seqs = self.config.max_num_seqs;
            // Parked sessions keep their model-runner slots (vLLM 0.33, its counter less
            // the chunks of sessions whose wait was set by hand: `sched::session`).
            let active = self.running.len() + self.parked.len();
            if max_seqs > 0 && active >= max_seqs + self.num_unparked_resumes {
                break;
            }
            // Block holders come first: the first request holding none ends admission.
            if !self.admit_new && !self.holds_kv(slot) {
                break;
            }
            let request = self.req(slot);
            let (status, outside) = (request.status, request.outside_wait != OutsideWait::None);
            // A wait its caller decides (`sched::outside_wait`): asked here, as vLLM 0.33
            // asks `_handle_blocked_waiting_request`.
            let waits_outside = outside
                && match self.outside_wait_over(slot) {
                    Ok(over) => !over,
                    Err(err) => {
                        admission_error = Some(err);
                        break;
                    }
                };
            let loading = status == RequestStatus::WaitingForRemoteKvs;
            // A parked session waits for its next input (`sched::session`).
            let parked = status == RequestStatus::WaitingForStreamingInput;
            // A preempted request whose stale output will still be delivered waits for it
            // (`sched::stale`).
            if waits_outside
                || parked
                || (loading && !self.take_landed_load(slot)?)
                || self.awaits_stale_output(slot)
                || self.lora_gated(slot, plan)
            {
                self.waiting.pop();
                self.deferred.insert(slot);
                skipped.push(slot);
                continue;
            }
            match self.admit(slot, budget, plan) {
                Ok(Admission::Scheduled) => {}
                Ok(Admission::Blocked) => {
                    if self.running.is_empty() && self.release_landed_loads(slot, &skipped, plan)? {
                        continue;
                    }
                    break;
                }
                Ok(Admission::SteppedAside) => {
                    self.waiting.pop();
                    self.deferred.insert(slot);
                    skipped.push(slot);
                }
                Err(err) => {
                    admission_error = Some(err);
                    break;
                }
            }
        }
        for slot in skipped.into_iter().rev() {
            let key = self.priority_key(slot);
            self.waiting.push_front(slot, key, self.holds_kv(slot));
        }
        if !self.defer_prefills {
            // A release step: did it leave requests waiting that it did not skip?
            self.prefill_capacity_bound = self.waiting.len() > self.deferred.len();
        }
        Ok(admission_error)
    }

    /// Seed 004 §3.3.1: with `max_loras` adapters already in the batch, a request needing
    /// another one waits (skipped, keeping its place).
    fn lora_gated(&self, slot: u32, plan: &StepPlan<R>) -> bool {
        let max_loras = self.config.max_loras;
        match self.req(slot).spec.lora_id {
            Some(lora) => {
                max_loras > 0 && plan.loras.len() >= max_loras && !plan.loras.contains(&lora)
            }
            None => false,
        }
    }

    /// The hit of `get_computed_blocks` for a request whose diverged hit no load backs
    /// (its hashes reused), its shared-prefix boundary the request's (as vLLM 0.33's
    /// reconciling lookup sets it), dropped if no longer than a bounded-replay window (as
    /// an admission's hit is, [`Self::drop_replayed_hit`]).
    fn reconciled_hit(&mut self, slot: u32, diverged: Hit, max_hit_tokens: usize) -> Hit {
        let request = self.slots[slot as usize].as_ref().expect("live");
        let (tokens, lora_id) = (&request.all_token_ids, request.spec.lora_id);
        let earlier = Some(diverged);
        let mut hit = (self.kv).lookup(tokens, lora_id, earlier, Vec::new(), max_hit_tokens);
        self.note_kv_lookup(slot, &hit);
        self.req_mut(slot).shared_prefix_boundary = hit.shared_prefix_boundary();
        self.drop_replayed_hit(&mut hit, 0, false);
        hit
    }

    /// Tries to admit the request at the head of the waiting queue. A connector error leaves
    /// the request as it was if its blocks were not allocated yet, and admitted (or loading)
    /// if they were: the scheduler's state stays consistent either way.
    fn admit(
        &mut self,
        slot: u32,
        budget: &mut StepBudget,
        plan: &mut StepPlan<R>,
    ) -> Result<Admission> {
        let holds = self.kv.block_ids(slot).is_some();
        let num_computed = self.req(slot).num_computed_tokens;
        // vLLM 0.33's branch for a request with computed tokens (a landed load, a resumed
        // session, an arrival computed) asks the encoder-cache connector first.
        if (holds || num_computed > 0)
            && self.ec_connector.is_some()
            && self.ec_transfer_pending(slot, num_computed)
        {
            return Ok(Admission::SteppedAside);
        }
        // A landed load holds blocks even when none of its tokens count as computed (a
        // one-token prompt loaded whole recomputes that token in them).
        if holds {
            return self.admit_loaded(slot, budget, plan);
        }
        // Only a request that arrived with computed tokens counts some before it holds
        // blocks (preemption and failed loads reset the count with the blocks).
        if num_computed > 0 {
            return self.admit_computed(slot, budget, plan);
        }
        self.make_deferred_prompt(slot)?;
        // vLLM 0.33 caps the hit where the auxiliary outputs of its blocks are no longer
        // kept (`sched::aux_outputs`).
        let max_cache_hit = self.aux_max_cache_hit(slot)?;
        let request = self.slots[slot as usize]
            .as_ref()
            .expect("waiting slot is live");
        let lora_id = request.spec.lora_id;
        let seq = request.arrival_seq;
        let earlier = self
            .blocked_head
            .take()
            .filter(|(blocked, _)| *blocked == seq)
            .map(|(_, hit)| hit);
        // An earlier hit carries the hashes; otherwise the source's, kept since the prompt
        // was made (a preempted request is looked up with them again).
        let known = match earlier {
            Some(_) => Vec::new(),
            None => request.prompt_block_hashes.clone(),
        };
        let max_hit_tokens = max_cache_hit
            .unwrap_or(usize::MAX)
            .min(self.host_published_tokens());
        // vLLM 0.33's `_get_local_prefix_cache_hit`: a connector that restores lagging
        // recurrent states takes full attention's hit (`hit_diverged` when a Mamba group
        // lags behind it).
        let divergent =
            (self.connector.as_ref()).is_some_and(|c| c.supports_divergent_local_hybrid_hits());
        let tokens = &request.all_token_ids;
        let (mut hit, hit_diverged) = if divergent {
            (self.kv).lookup_for_connector(tokens, lora_id, earlier, known, max_hit_tokens)
        } else {
            let hit = (self.kv).lookup(tokens, lora_id, earlier, known, max_hit_tokens);
            (hit, false)
        };
        self.note_kv_lookup(slot, &hit);
        // vLLM 0.33 sets the boundary with the lookup; a bounded-replay drop keeps it.
        self.req_mut(slot).shared_prefix_boundary = hit.shared_prefix_boundary();
        let replay_window = self.config.prefix_replay_tokens();
        // With a connector the rule applies to the local and loaded tokens together
        // (`replay_rules`, after the connector is asked with the local hit).
        let connector = self.connector.is_some();
        if !connector {
            self.drop_replayed_hit(&mut hit, 0, false);
        }
        let fits = self.full_sequence_fits(slot, Some(&hit));
        // A multimodal request is refused by that gate only after its items are looked up
        // (vLLM 0.33 checks it in allocate_slots, after the encoder step, whose lookups and
        // evictions stand).
        let has_mm = !self.req(slot).spec.mm_features.is_empty();
        // With several KV groups the loaded tokens shorten a window group's need: the gate
        // waits for the connector's answer (vLLM 0.33 asks it before allocate_slots).
        let gate_after_connector = connector && !self.kv.is_block_hash();
        if !fits && !gate_after_connector && (!has_mm || hit.num_host_tokens() > 0) {
            self.blocked_head = Some((seq, hit));
            return Ok(Admission::Blocked);
        }
        let Some(external) = self.ask_connector(slot, &hit)? else {
            return Ok(Admission::SteppedAside);
        };
        let (external, window_loaded) = self.replay_rules(slot, &mut hit, external)?;
        if hit_diverged && external.num_tokens == 0 {
            // No loaded tokens back the deeper hit, whose boundary has no valid Mamba
            // state: the boundary every group agrees on (vLLM 0.33's `schedule()`).
            hit = self.reconciled_hit(slot, hit, max_hit_tokens);
        } else if hit_diverged {
            let num_tokens = self.req(slot).num_tokens();
            self.kv.record_kept_lookup(num_tokens, &hit);
        }
        let fits = if gate_after_connector {
            self.full_sequence_fits_loaded(slot, &hit, external.num_tokens)
        } else {
            fits
        };
        if !fits && gate_after_connector && !has_mm {
            self.blocked_head = Some((seq, hit));
            return Ok(Admission::Blocked);
        }
        if self.ec_connector.is_some() {
            // vLLM 0.33's `_ec_transfer_pending` after the lookup and the connector, with
            // the tokens computed less a replayed tail (the inputs it recomputes).
            let num_computed = hit.num_computed_tokens() + external.num_tokens;
            let at = if window_loaded {
                num_computed
            } else {
                num_computed.saturating_sub(replay_window)
            };
            if self.ec_transfer_pending(slot, at) {
                return Ok(Admission::SteppedAside);
            }
        }
        if hit.num_host_tokens() > 0 || (external.load_async && external.num_tokens > 0) {
            // A multimodal request's gate, deferred past its encoder step above, meets an
            // asynchronous load's allocation (vLLM 0.33 schedules no encoder input for it).
            let admission = if fits {
                self.start_load(slot, hit, external.num_tokens, plan)?
            } else {
                self.blocked_head = Some((seq, hit));
                Admission::Blocked
            };
            if matches!(admission, Admission::Blocked) {
                // vLLM's `encoder_cache_manager.free(request)` when `allocate_slots`
                // refuses: nothing held then, but an `EncoderDecoderCacheManager` gives
                // back the slots of every input all the same.
                self.encoder_release(slot);
            }
            return Ok(admission);
        }
        let mut num_computed = hit.num_computed_tokens() + external.num_tokens;
        if self.holds_prefill(slot, num_computed) {
            self.blocked_head = Some((seq, hit));
            return Ok(Admission::Blocked);
        }
        // vLLM 0.33's `_mark_prefix_replay`: the hit's last window is recomputed to rebuild
        // the bounded-replay group; its blocks stay adopted (no slots are allocated for it).
        let num_replay = if window_loaded {
            0
        } else {
            num_computed.min(replay_window)
        };
        if replay_window > 0 {
            self.req_mut(slot).replay_start = if window_loaded {
                0
            } else {
                num_computed - num_replay
            };
            num_computed -= num_replay;
        }
        let Some(AdmissionTokens { n, mut padded }) =
            self.admission_tokens(slot, num_computed, num_replay, budget.room(), plan)?
        else {
            self.blocked_head = Some((seq, hit));
            return Ok(Admission::Blocked);
        };
        let (n, encoder) = self.schedule_encoder_inputs(slot, num_computed, n);
        let mut n = self.reserve_prefill_lookahead(slot, num_computed, n);
        if n == 0 {
            // vLLM 0.33 skips it (the encoder budget or cache is spent) and goes on.
            return Ok(Admission::SteppedAside);
        }
        let fits = self.with_cross_attention(slot, encoder.as_ref(), Some(&hit), fits);
        let lookahead = self.lookahead(num_computed + n);
        // vLLM 0.33 asks allocate_slots here, which checks the fit (sched::hooks).
        let allowed = self.allocation_allowed(slot, n, lookahead)?
            && self.host_pages_fit(slot, num_computed + n + lookahead);
        if !fits || !allowed {
            self.encoder_release(slot);
            self.blocked_head = Some((seq, hit));
            return Ok(Admission::Blocked);
        }
        let tokens = &self.slots[slot as usize]
            .as_ref()
            .expect("live")
            .all_token_ids;
        let with_ids = !self.lean_output;
        let allocated = if external.num_tokens > 0 && !self.kv.is_block_hash() {
            // Several KV groups: the loaded tokens and those past the replayed tail at once.
            let alloc = ExternalAllocation {
                num_external_tokens: external.num_tokens,
                num_new_tokens: n.saturating_sub(num_replay),
                num_lookahead_tokens: lookahead,
                cache: true,
                skip_zeroing_groups: &[],
            };
            (self.kv)
                .allocate_external_groups(slot, tokens, &hit, lora_id, alloc, with_ids)?
                .then(Vec::new)
        } else if external.num_tokens > 0 {
            // Loaded before the step runs: slots for the loaded and the computed tokens at
            // once, all cached as computed ones are. Placeholder drafts get theirs after,
            // and are dropped if those do not fit (vLLM allocates all at once and would
            // wait; a known gap, documented).
            let known_new = if padded { 1 } else { n };
            let loaded_and_new = external.num_tokens + known_new;
            let fits = self
                .kv
                .allocate_external(slot, tokens, loaded_and_new, &hit, lora_id)?;
            if fits {
                self.kv.cache_loaded(slot)?;
                if padded
                    && self
                        .kv
                        .allocate(slot, &[], n - known_new, 0, None, lora_id, false)?
                        .is_none()
                {
                    (n, padded) = (known_new, false);
                }
            }
            fits.then(Vec::new)
        } else {
            // Replayed tokens are counted in the adopted hit: only those past it need slots.
            let past_hit = n.saturating_sub(num_replay);
            (self.kv).allocate(
                slot,
                tokens,
                past_hit,
                lookahead,
                Some(&hit),
                lora_id,
                with_ids,
            )?
        };
        let Some(mut blocks) = allocated else {
            self.encoder_release(slot);
            self.blocked_head = Some((seq, hit));
            return Ok(Admission::Blocked);
        };
        self.commit_encoder_inputs(slot, encoder);
        if external.num_tokens > 0 && with_ids && self.kv.is_block_hash() {
            blocks = self.kv.block_ids(slot).unwrap_or_default().to_vec();
        }
        let notified = self.notify_allocation(slot, external.num_tokens);
        self.start_running(slot, num_computed, n, padded, blocks, budget, plan)?;
        notified.map(|()| Admission::Scheduled)
    }

    /// A request that arrived with `num_computed_tokens` (`RequestSpec::num_computed_tokens`)
    /// at its first admission, as vLLM 0.33 admits a waiting request whose
    /// `num_computed_tokens > 0`: no prefix lookup and no connector query; new blocks for
    /// the computed tokens and the chunk at once (`allocate_slots` with nothing held), their
    /// full blocks cached as the chunk's are.
    fn admit_computed(
        &mut self,
        slot: u32,
        budget: &mut StepBudget,
        plan: &mut StepPlan<R>,
    ) -> Result<Admission> {
        self.make_deferred_prompt(slot)?;
        let num_computed = self.req(slot).num_computed_tokens;
        let fits = self.full_sequence_fits_arrived(slot, num_computed);
        let has_mm = !self.req(slot).spec.mm_features.is_empty();
        if (!fits && !has_mm) || self.holds_prefill(slot, num_computed) {
            return Ok(Admission::Blocked);
        }
        let Some(AdmissionTokens { n, padded }) =
            self.admission_tokens(slot, num_computed, 0, budget.room(), plan)?
        else {
            return Ok(Admission::Blocked);
        };
        let (n, encoder) = self.schedule_encoder_inputs(slot, num_computed, n);
        let n = self.reserve_prefill_lookahead(slot, num_computed, n);
        if n == 0 {
            return Ok(Admission::SteppedAside);
        }
        let fits = self.with_cross_attention(slot, encoder.as_ref(), None, fits);
        let lookahead = self.lookahead(num_computed + n);
        let allowed = self.allocation_allowed(slot, n, lookahead)?
            && self.host_pages_fit(slot, num_computed + n + lookahead);
        if !fits || !allowed {
            self.encoder_release(slot);
            return Ok(Admission::Blocked);
        }
        let request = self.slots[slot as usize].as_ref().expect("live");
        let lora_id = request.spec.lora_id;
        let with_ids = !self.lean_output;
        let allocated = self.kv.allocate_arrived(
            slot,
            &request.all_token_ids,
            num_computed,
            n,
            lookahead,
            lora_id,
            with_ids,
        )?;
        let Some(blocks) = allocated else {
            self.encoder_release(slot);
            return Ok(Admission::Blocked);
        };
        self.commit_encoder_inputs(slot, encoder);
        let notified = self.notify_allocation(slot, 0);
        self.start_running(slot, num_computed, n, padded, blocks, budget, plan)?;
        notified.map(|()| Admission::Scheduled)
    }

    /// Makes the prompt of `slot` if it is deferred and not made yet (its first admission
    /// attempt), reserving room for its outputs as `add_request` does, and keeps the block
    /// hashes the source gave with it (`Request::prompt_block_hashes`).
    fn make_deferred_prompt(&mut self, slot: u32) -> Result<()> {
        let request = self.slots[slot as usize]
            .as_mut()
            .expect("waiting slot is live");
        if !request.prompt_is_deferred() {
            return Ok(());
        }
        let Some(source) = self.prompt_source.as_mut() else {
            return Err(Error::Plugin(
                "a deferred prompt needs a prompt source (Scheduler::set_prompt_source)".into(),
            ));
        };
        let num_prompt_tokens = request.num_prompt_tokens;
        let DeferredPrompt {
            token_ids: mut tokens,
            block_hashes,
        } = source.prompt(&request.request_id, num_prompt_tokens);
        if tokens.len() != num_prompt_tokens {
            return Err(Error::Plugin(format!(
                "the prompt source made {} tokens for a {num_prompt_tokens}-token prompt",
                tokens.len()
            )));
        }
        tokens.reserve_exact(reserved_outputs(
            request.spec.max_tokens,
            self.config.max_model_len,
            num_prompt_tokens,
        ));
        request.all_token_ids = tokens;
        // A source's hashes are the legacy ones: a hash look-ahead recomputes its own.
        if self.config.num_hash_lookahead_tokens == 0 {
            request.prompt_block_hashes = block_hashes;
        }
        Ok(())
    }

    /// Sets the cross-attention tokens of the allocation about to be made for `slot` (the
    /// encoder tokens of `pick`'s inputs, under `is_encoder_decoder`) and answers whether
    /// the request passes the full-sequence gate with them: vLLM 0.33 counts a
    /// cross-attention group's blocks in that gate (`get_num_blocks_to_allocate` with
    /// `num_encoder_tokens`), which it checks after the encoder step. `fits`: the gate's
    /// answer without them.
    pub(super) fn with_cross_attention(
        &mut self,
        slot: u32,
        pick: Option<&super::encoder::EncoderPick>,
        hit: Option<&Hit>,
        fits: bool,
    ) -> bool {
        let num_encoder_tokens = self.cross_attention_tokens(slot, pick);
        if num_encoder_tokens == 0 || !fits {
            return fits;
        }
        // Taken by the allocation that follows a pass (a load brings no encoder tokens:
        // encoder-decoder inputs are picked only with nothing computed); cleared on a
        // refusal.
        self.kv.set_encoder_tokens(num_encoder_tokens);
        let fits = self.full_sequence_fits(slot, hit);
        if !fits {
            self.kv.set_encoder_tokens(0);
        }
        fits
    }

    /// A held step stops admission at a request with prompt left to compute beyond its last
    /// token (one loaded or hit whole but that token has no prefill to hold).
    pub(super) fn holds_prefill(&self, slot: u32, num_computed: usize) -> bool {
        self.defer_prefills && num_computed + 1 < self.req(slot).num_tokens()
    }

    /// vLLM 0.33's `scheduler_reserve_full_isl` gate at admission: the request's whole
    /// sequence (up to `max_model_len`) must fit beside what it holds or hits.
    pub(super) fn full_sequence_fits(&self, slot: u32, hit: Option<&Hit>) -> bool {
        self.full_sequence_fits_with(slot, |n| self.kv.full_sequence_fits(slot, n, hit))
    }

    /// [`Self::full_sequence_fits`] for the first admission of a request that arrived with
    /// `num_computed` tokens (no hit).
    fn full_sequence_fits_arrived(&self, slot: u32, num_computed: usize) -> bool {
        self.full_sequence_fits_with(slot, |n| {
            self.kv.full_sequence_fits_arrived(slot, n, num_computed)
        })
    }

    /// The gate with the KV check `kv_fits(num_tokens)` given.
    fn full_sequence_fits_with(&self, slot: u32, kv_fits: impl FnOnce(usize) -> bool) -> bool {
        if !self.config.scheduler_reserve_full_isl {
            return true;
        }
        let num_tokens = self.req(slot).num_tokens().min(self.config.max_model_len);
        kv_fits(num_tokens) && self.host_pages_fit(slot, num_tokens)
    }

    /// [`Self::full_sequence_fits`] for an admission that also loads `num_external_tokens`
    /// after `hit`.
    fn full_sequence_fits_loaded(&self, slot: u32, hit: &Hit, num_external_tokens: usize) -> bool {
        if !self.config.scheduler_reserve_full_isl {
            return true;
        }
        let num_tokens = self.req(slot).num_tokens().min(self.config.max_model_len);
        self.kv
            .full_sequence_fits_loaded(slot, num_tokens, hit, num_external_tokens)
            && self.host_pages_fit(slot, num_tokens)
    }

    /// Sets vLLM 0.33's `num_sampled_tokens_per_step` (`SchedulerConfig`) from the next
    /// step, as assigning it on a built vLLM scheduler does: 0 (a pooling or diffusion
    /// model) keeps no room for a sampled token and pads no admission with drafts.
    pub fn set_num_sampled_tokens_per_step(&mut self, num_sampled: usize) -> Result<()> {
        if num_sampled > 1 {
            return Err(Error::config(
                "num_sampled_tokens_per_step",
                num_sampled,
                "must be 1, or 0 for a pooling or diffusion model (vLLM 0.33's values)",
            ));
        }
        self.config.num_sampled_tokens_per_step = num_sampled;
        Ok(())
    }

    /// Sets the input slots a parallel drafter takes per scheduled request
    /// (`SchedulerConfig::num_draft_slots_per_request`, vLLM 0.33's
    /// `max_num_new_slots_for_drafting`) from the next step.
    pub fn set_num_draft_slots_per_request(&mut self, num_draft_slots: usize) {
        self.config.num_draft_slots_per_request = num_draft_slots;
    }

    /// `num_draft_slots_per_request` in force.
    pub fn num_draft_slots_per_request(&self) -> usize {
        self.config.num_draft_slots_per_request
    }

    /// `num_sampled_tokens_per_step` in force.
    pub fn num_sampled_tokens_per_step(&self) -> usize {
        self.config.num_sampled_tokens_per_step
    }

    /// Tokens a new admission computes this step, after `num_computed` hit or loaded ones
    /// (`num_replay` of a hit rewound for bounded replay past them);
    /// `None` if it must wait (its prompt, or its padded decode, does not fit `budget`, the
    /// step's room for one request: `sched::budget`).
    ///
    /// vLLM 0.33 (`pad_spec_decode`): with `k` speculative tokens, an admission left with
    /// one token to compute (a model that samples a token per step: its drafts are
    /// rejectable), in a step that schedules no running prefill, while running
    /// requests were scheduled or it hit (or loaded) a prefix, computes `1 + k`: its token
    /// and `k` placeholder drafts, if they leave a token's room under `max_model_len`; if
    /// `1 + k` exceeds the budget, admission stops ("prefer to not schedule than schedule
    /// un-padded"). A long-prefill threshold below `1 + k` drops the padding (vLLM would
    /// fail its assertion there; its Mamba alignment drops it the same way).
    pub(super) fn admission_tokens(
        &self,
        slot: u32,
        num_computed: usize,
        num_replay: usize,
        budget: usize,
        plan: &StepPlan<R>,
    ) -> Result<Option<AdmissionTokens>> {
        let mut n = self.req(slot).num_tokens() - num_computed;
        let k = self.config.num_speculative_tokens;
        let mut padded = false;
        if n == 1
            && k > 0
            && self.config.pad_spec_decode
            && self.config.num_sampled_tokens_per_step > 0
            && !plan.prefill_scheduled
            && (plan.num_running_scheduled() > 0 || num_computed > 0)
            && num_computed + 1 + k + self.config.num_sampled_tokens_per_step
                <= self.config.max_model_len
        {
            if 1 + k > budget {
                return Ok(None);
            }
            (n, padded) = (1 + k, true);
        }
        let threshold = self.step_threshold;
        if threshold > 0 && n > threshold {
            n = if padded { 1 } else { threshold };
            padded = false;
        }
        if !self.config.enable_chunked_prefill && n > budget {
            return Ok(None);
        }
        n = n.min(budget);
        if self.config.mamba_align.is_some() {
            // vLLM 0.33: the Mamba `align` split, then "no aligned chunk fits" waits, and a
            // padded decode the split clips drops its padding rather than shortening it.
            // vLLM 0.33 measures the chunk from the hit's end, before `_mark_prefix_replay`
            // rewinds it (`start` counts `num_new_local_computed_tokens`): `num_replay`.
            n = self.mamba_aligned(slot, num_computed + num_replay, n)?;
            if n == 0 {
                return Ok(None);
            }
            if padded && n != 1 + k {
                (n, padded) = (1, false);
            }
        }
        Ok(Some(AdmissionTokens { n, padded }))
    }

    /// The admitted request leaves the waiting queue and runs `n` tokens this step
    /// (`padded`: its last `n - 1` are placeholder drafts).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_running(
        &mut self,
        slot: u32,
        num_computed: usize,
        n: usize,
        padded: bool,
        blocks: Vec<BlockId>,
        budget: &mut StepBudget,
        plan: &mut StepPlan<R>,
    ) -> Result<()> {
        self.charge_host_pages(slot)?;
        self.waiting.pop();
        self.running.push(slot);
        self.deferred.remove(&slot);
        plan.prefill_admitted |= num_computed + 1 < self.req(slot).num_tokens();
        let request = self.req_mut(slot);
        if padded {
            request.spec_token_ids = vec![PLACEHOLDER_DRAFT; n - 1];
        }
        let was_preempted = request.status == RequestStatus::Preempted;
        request.status = RequestStatus::Running;
        request.num_computed_tokens = num_computed;
        // vLLM 0.33 tracks a request still prefilling after this chunk (or loaded and
        // promoted now: it stays tracked until a step of it samples).
        request.inflight_prefill |= num_computed + n < request.num_tokens();
        if let Some(lora) = request.spec.lora_id {
            plan.loras.insert(lora);
        }
        plan.admitted.insert(slot, was_preempted);
        plan.scheduled.push((slot, n));
        plan.set_blocks(slot, blocks);
        budget.take(n);
        Ok(())
    }
}
