//! The step scheduler's KV loads (`super::connector`): asking the connector what it can
//! load, parking a request in WAITING_FOR_REMOTE_KVS while its blocks fill, taking a load
//! that landed or failed, and letting landed loads go when they hold the memory a blocked
//! head needs while nothing runs.

use super::admission::{Admission, AdmissionTokens};
use super::budget::StepBudget;
use super::connector::{ExternalTokens, KvLoad};
use super::kv::{Hit, Kv};
use super::request::RequestStatus;
use super::scheduler::{Scheduler, StepPlan};
use crate::Result;
use crate::kv::{BlockId, ExternalAllocation, RequestKey};

impl<R: RequestKey> Scheduler<R> {
    /// With `false`, only waiting requests that hold KV blocks (their load began) are
    /// admitted; the rest keep their places (vLLM 0.33's `PauseState.PAUSED_NEW`, which lets
    /// those drain). `true` (the default) admits every waiting request.
    pub fn set_admit_new(&mut self, admit_new: bool) {
        self.admit_new = admit_new;
    }

    /// Whether a waiting request holds KV blocks, so it is served before the waiting
    /// requests that hold none: vLLM 0.33's `_holds_kv_blocks`, `num_computed_tokens > 0`
    /// or `WAITING_FOR_REMOTE_KVS` (here: blocks held, a remote-KV wait its caller decides,
    /// or computed tokens, as one that arrived computed has until admitted or preempted).
    pub(super) fn holds_kv(&self, slot: u32) -> bool {
        let request = self.req(slot);
        self.kv.block_ids(slot).is_some()
            || request.outside_wait == super::OutsideWait::HoldingKv
            || request.num_computed_tokens > 0
    }

    /// The head `head` cannot get memory and nothing runs, so nothing will free any: other
    /// waiting requests whose KV loads landed hold it (block holders are served first, so
    /// the head is itself a holder needing more blocks, or the holders ahead of it are
    /// still loading). Each is preempted and goes to the front of the requests holding
    /// nothing: its loaded blocks enter the prefix cache and are freed, so the head may
    /// evict them; when it is admitted again it hits what the cache still holds and, like
    /// any preempted request, asks its connector again. vLLM 0.33 keeps this from arising
    /// by starting a load only beside the blocks in-flight prefills still need, as
    /// `start_load` does too; this stays as the way out should it arise anyway, and changes
    /// no step in which anything runs. Returns whether any memory was released.
    pub(super) fn release_landed_loads(
        &mut self,
        head: u32,
        skipped: &[u32],
        plan: &mut StepPlan<R>,
    ) -> Result<bool> {
        let holders: Vec<u32> = (self.waiting.ordered().into_iter())
            .chain(skipped.iter().copied())
            .filter(|&slot| slot != head && self.holds_landed_load(slot))
            .collect();
        let mut requeue = Vec::new();
        for &slot in &holders {
            if self.landed.contains(&slot) {
                self.take_landed_load(slot)?;
            }
            // Skipped ones go back at the end of the pass, to the part they then belong to.
            if self.waiting.remove(slot) {
                requeue.push(slot);
            }
            if self.kv.block_ids(slot).is_none() {
                continue;
            }
            self.free_kv(slot)?;
            let request = self.req_mut(slot);
            request.status = RequestStatus::Preempted;
            request.num_computed_tokens = 0;
            request.num_external_computed_tokens = 0;
            request.num_preemptions += 1;
            request.inflight_prefill = false;
            plan.preempted.push(slot);
            self.num_preemptions += 1;
        }
        for &slot in requeue.iter().rev() {
            let key = self.priority_key(slot);
            self.waiting.push_front(slot, key, false);
        }
        Ok(!holders.is_empty())
    }

    /// Whether a waiting request holds blocks that no transfer is still writing into: a load
    /// that landed (or failed) whether or not it was taken yet.
    pub(super) fn holds_landed_load(&self, slot: u32) -> bool {
        if self.kv.block_ids(slot).is_none() {
            return false;
        }
        let request = self.req(slot);
        match request.status {
            RequestStatus::WaitingForRemoteKvs => self.landed.contains(&slot),
            // A session's blocks hold its computed turns, not a load (vLLM never lets them
            // go while it waits).
            RequestStatus::WaitingForStreamingInput => false,
            RequestStatus::Waiting => {
                !request.spec.resumable || request.num_external_computed_tokens > 0
            }
            _ => true,
        }
    }

    /// What the connector can load after the local (and host-tier) hit; no connector, or a
    /// request whose load failed before: nothing. `None`: ask again next step.
    pub(super) fn ask_connector(&mut self, slot: u32, hit: &Hit) -> Result<Option<ExternalTokens>> {
        let request = self.slots[slot as usize]
            .as_ref()
            .expect("waiting slot is live");
        let Some(connector) = self.connector.as_mut().filter(|_| !request.kv_load_failed) else {
            return Ok(Some(ExternalTokens::default()));
        };
        let local = hit.num_computed_tokens() + hit.num_host_tokens();
        let Some(mut external) = connector.get_num_new_matched_tokens(request, local)? else {
            return Ok(None);
        };
        // A synchronous load leaves at least the last token to compute (its logits).
        let most = request.num_tokens() - local - usize::from(!external.load_async);
        if external.num_tokens > most {
            return Err(crate::Error::connector(
                "get_num_new_matched_tokens",
                format!("{} tokens", external.num_tokens),
                format!(
                    "request {:?} has {} tokens and {local} hit locally: at most {most} can be \
                     loaded{}",
                    request.request_id,
                    request.num_tokens(),
                    if external.load_async {
                        ""
                    } else {
                        " (a synchronous load leaves the last token to compute)"
                    }
                ),
            ));
        }
        // vLLM 0.33: all of them or none, as far as their auxiliary outputs are kept.
        external.num_tokens = self.aux_cap_external(slot, local, external.num_tokens)?;
        external.load_async &= external.num_tokens > 0;
        Ok(Some(external))
    }

    /// Allocates slots for an asynchronous load (the connector's tokens and any host-tier
    /// hit) and parks the request in `WAITING_FOR_REMOTE_KVS`, in its place in the queue.
    pub(super) fn start_load(
        &mut self,
        slot: u32,
        hit: Hit,
        num_external_tokens: usize,
        plan: &mut StepPlan<R>,
    ) -> Result<Admission> {
        // vLLM 0.33 asks allocate_slots for the load's blocks too, with no new tokens.
        let allowed = self.allocation_allowed(slot, 0, 0)?;
        let num_loaded = hit.num_computed_tokens() + hit.num_host_tokens() + num_external_tokens;
        let allowed = allowed && self.host_pages_fit(slot, num_loaded);
        let request = self.slots[slot as usize].as_ref().expect("live");
        let (seq, lora_id) = (request.arrival_seq, request.spec.lora_id);
        // vLLM 0.33: a load holds its blocks with no progress and cannot be preempted, so
        // it starts only if they fit beside the blocks in-flight prefills still need and
        // one speculative step's (`reserved_blocks` in `allocate_slots`).
        let num_external = hit.num_host_tokens() + num_external_tokens;
        let num_loaded = hit.num_computed_tokens() + num_external;
        let needed =
            self.kv
                .num_blocks_to_allocate(slot, num_loaded, Some(&hit), num_external, false);
        let reserved = self.inflight_prefill_reserved_blocks() + self.spec_decode_step_blocks();
        if needed + reserved > self.kv.num_free_blocks() {
            self.blocked_head = Some((seq, hit));
            return Ok(Admission::Blocked);
        }
        let allocated = if !allowed {
            false
        } else if self.kv.hybrid_groups().is_some() {
            // The groups the load writes are not zeroed under it (vLLM 0.33's
            // `skip_zeroing_group_ids`).
            let loaded = self.loaded_groups(slot)?;
            let alloc = ExternalAllocation {
                num_external_tokens,
                skip_zeroing_groups: &loaded,
                ..ExternalAllocation::default()
            };
            let tokens = &self.slots[slot as usize]
                .as_ref()
                .expect("live")
                .all_token_ids;
            (self.kv).allocate_external_groups(slot, tokens, &hit, lora_id, alloc, false)?
        } else {
            let tokens = &self.slots[slot as usize]
                .as_ref()
                .expect("live")
                .all_token_ids;
            (self.kv).allocate_external(slot, tokens, num_external_tokens, &hit, lora_id)?
        };
        if !allocated {
            self.blocked_head = Some((seq, hit));
            return Ok(Admission::Blocked);
        }
        self.charge_host_pages(slot)?;
        let notified = if self.defer_load(slot, num_external_tokens) {
            Ok(())
        } else {
            self.notify_allocation(slot, num_external_tokens)
        };
        let request = self.req_mut(slot);
        request.status = RequestStatus::WaitingForRemoteKvs;
        request.num_external_computed_tokens = num_external_tokens;
        request.inflight_prefill = true;
        plan.kv_loads.push(KvLoad {
            request_id: request.request_id.clone(),
            num_external_tokens,
            num_host_tokens: hit.num_host_tokens(),
        });
        // Reported once the request is parked: an error leaves it loading, as a
        // connector's does.
        let num_loaded = hit.num_computed_tokens() + hit.num_host_tokens() + num_external_tokens;
        let loading = self.aux_request_loading(slot, num_loaded);
        notified.and(loading).map(|()| Admission::SteppedAside)
    }

    /// vLLM 0.33's `_inflight_prefill_reserved_blocks`: over the in-flight prefills, the
    /// blocks each still needs for its whole sequence (`_request_remaining_blocks`: its
    /// tokens up to `max_model_len`, plus one speculative step's under speculative decoding).
    fn inflight_prefill_reserved_blocks(&self) -> usize {
        let spec = match self.config.num_speculative_tokens {
            0 => 0,
            k => 1 + k + self.config.num_lookahead_tokens,
        };
        (self.slots.iter().enumerate())
            .filter_map(|(slot, r)| r.as_ref().filter(|r| r.inflight_prefill).map(|r| (slot, r)))
            .map(|(slot, r)| {
                let num_tokens = r.num_tokens().min(self.config.max_model_len);
                self.kv.remaining_blocks(slot as u32, num_tokens, spec)
            })
            .sum()
    }

    /// vLLM 0.33's `_spec_decode_step_blocks`: one speculative step's blocks (`1 + k +
    /// lookahead` slots) in each KV group that is not Mamba, each counted on the group's own
    /// block size (`cdiv(num_spec_decode_tokens, manager.block_size)`); 0 without
    /// speculation.
    fn spec_decode_step_blocks(&self) -> usize {
        let k = self.config.num_speculative_tokens;
        if k == 0 {
            return 0;
        }
        let slots = 1 + k + self.config.num_lookahead_tokens;
        let groups = &self.config.kv_groups;
        if groups.is_empty() {
            return slots.div_ceil(self.config.block_size);
        }
        (groups.iter().enumerate())
            .filter(|(_, g)| !g.is_mamba())
            .map(|(i, _)| slots.div_ceil(self.config.group_block_size(i)))
            .sum()
    }

    /// Tells the connector (if any) the request's blocks (vLLM's `update_state_after_alloc`).
    pub(super) fn notify_allocation(
        &mut self,
        slot: u32,
        num_external_tokens: usize,
    ) -> Result<()> {
        let Some(connector) = self.connector.as_mut() else {
            return Ok(());
        };
        let request = self.slots[slot as usize].as_ref().expect("live slot");
        if let Kv::Hybrid(_) = &self.kv {
            let tables = self.kv.group_block_ids(slot);
            let tables: Vec<&[BlockId]> = tables.iter().map(Vec::as_slice).collect();
            return connector.update_state_after_alloc_groups(
                request,
                &tables,
                num_external_tokens,
            );
        }
        let blocks = self.kv.block_ids(slot).unwrap_or_default();
        connector.update_state_after_alloc(request, blocks, num_external_tokens)
    }

    /// The KV cache groups the connector's load for `slot` restores (its
    /// `get_loaded_kv_cache_group_ids`, by default the prefix-cacheable ones).
    pub(super) fn loaded_groups(&mut self, slot: u32) -> Result<Vec<usize>> {
        let request = self.slots[slot as usize].as_ref().expect("live slot");
        let answer = match self.connector.as_mut() {
            Some(connector) => connector.get_loaded_kv_cache_group_ids(request)?,
            None => None,
        };
        let Some(groups) = answer else {
            return Ok(self.kv.prefix_cacheable_groups());
        };
        let num_groups = self.kv.hybrid_groups().map_or(1, <[_]>::len);
        if let Some(g) = groups.iter().find(|&&g| g >= num_groups) {
            return Err(crate::Error::connector(
                "get_loaded_kv_cache_group_ids",
                format!("{groups:?}"),
                format!("names group {g}; there are {num_groups} KV cache groups"),
            ));
        }
        Ok(groups)
    }

    /// vLLM 0.33's `_load_restores_replay_window`: whether the load of `slot` restores every
    /// bounded-replay group (a P/D transfer of the request's own blocks does; a prefix-cache
    /// store holds no window).
    fn load_restores_replay_window(&mut self, slot: u32) -> Result<bool> {
        let replayed: Vec<usize> = (self.kv.hybrid_groups().unwrap_or_default().iter())
            .enumerate()
            .filter(|(_, spec)| spec.prefix_replay_tokens() > 0)
            .map(|(g, _)| g)
            .collect();
        if replayed.is_empty() {
            return Ok(false);
        }
        let loaded = self.loaded_groups(slot)?;
        Ok(replayed.iter().all(|g| loaded.contains(g)))
    }

    /// vLLM 0.33's bounded-replay rules for what the connector offers beside the local hit
    /// (`schedule()`): unless the load restores the window, it is cut back to whole blocks (a
    /// hit ending short of a block boundary would start the replay in a block the window
    /// group retires), and a hit no longer than the window is not taken at all, local part
    /// included. Returns the tokens to load and whether the load carries the window (then
    /// nothing is replayed).
    pub(super) fn replay_rules(
        &mut self,
        slot: u32,
        hit: &mut Hit,
        external: ExternalTokens,
    ) -> Result<(ExternalTokens, bool)> {
        let window = self.config.prefix_replay_tokens();
        if window == 0 {
            return Ok((external, false));
        }
        let mut external = external;
        let window_loaded = external.num_tokens > 0 && self.load_restores_replay_window(slot)?;
        if !window_loaded {
            external.num_tokens -= external.num_tokens % self.config.block_size;
            external.load_async &= external.num_tokens > 0;
        }
        if self.drop_replayed_hit(hit, external.num_tokens, window_loaded) {
            external = ExternalTokens::default();
        }
        Ok((external, window_loaded))
    }

    /// vLLM 0.33's bounded-replay drop (`schedule()`, DSV4.1 SWA bounded replay): a hit
    /// whose local and `num_external` loaded tokens together are no longer than the
    /// replayed window would be recomputed in full and save nothing, so it is not adopted
    /// (nor its load: the caller's to forget), unless the load carries the window. The
    /// request's `shared_prefix_boundary` stays as the lookup set it (vLLM's does).
    /// Whether it dropped the hit.
    pub(super) fn drop_replayed_hit(
        &self,
        hit: &mut Hit,
        num_external: usize,
        window_loaded: bool,
    ) -> bool {
        let window = self.config.prefix_replay_tokens();
        let total = hit.num_computed_tokens() + num_external;
        let dropped = window > 0 && !window_loaded && 0 < total && total <= window;
        if dropped {
            hit.drop_hit();
        }
        dropped
    }

    /// A request whose KV was loaded (it holds blocks for `num_computed_tokens`) goes on
    /// like a running one: slots for the rest, no lookup. Its multimodal items past the
    /// computed tokens are scheduled as any admission's (vLLM 0.33's waiting branch for a
    /// request with computed tokens calls `_try_schedule_encoder_inputs` from them: items
    /// wholly inside the loaded prefix are never encoded; an item the prefix ends inside is
    /// encoded whole).
    pub(super) fn admit_loaded(
        &mut self,
        slot: u32,
        budget: &mut StepBudget,
        plan: &mut StepPlan<R>,
    ) -> Result<Admission> {
        let num_computed = self.req(slot).num_computed_tokens;
        if self.holds_prefill(slot, num_computed) {
            return Ok(Admission::Blocked);
        }
        let Some(AdmissionTokens { n, padded }) =
            self.admission_tokens(slot, num_computed, 0, budget.room(), plan)?
        else {
            return Ok(Admission::Blocked);
        };
        let fits = self.full_sequence_fits(slot, None);
        // A multimodal request meets that gate after its items are looked up (vLLM 0.33
        // checks it in allocate_slots, after the encoder step, whose lookups stand).
        let has_mm = !self.req(slot).spec.mm_features.is_empty();
        if !fits && !has_mm {
            return Ok(Admission::Blocked);
        }
        let (n, encoder) = self.schedule_encoder_inputs(slot, num_computed, n);
        if n == 0 {
            // vLLM 0.33 skips it (the encoder budget or cache is spent) and goes on.
            return Ok(Admission::SteppedAside);
        }
        // An encoder-decoder request encodes here only with nothing computed (a one-token
        // prompt loaded whole, which vLLM looks up again): its cross-attention blocks come
        // with this allocation, beside the blocks it holds.
        let num_encoder_tokens = self.cross_attention_tokens(slot, encoder.as_ref());
        let fits = self.with_cross_attention(slot, encoder.as_ref(), None, fits);
        if !fits {
            self.encoder_release(slot);
            return Ok(Admission::Blocked);
        }
        let request = self.slots[slot as usize].as_ref().expect("live");
        let known = self.kv.num_tokens(slot).unwrap_or(0);
        let new_tokens = &request.all_token_ids[known..];
        let lookahead = self.lookahead(num_computed + n);
        let with_ids = !self.lean_output;
        let lora_id = request.spec.lora_id;
        let in_flight = self.num_in_flight_tokens(slot);
        if !self.allocation_allowed(slot, n, lookahead)?
            || !self.host_pages_fit_running(slot, num_computed, n + lookahead)
        {
            self.encoder_release(slot);
            return Ok(Admission::Blocked);
        }
        // A load replayed after landing (bounded replay) left the pool's count at the loaded
        // tokens: only tokens past it need slots.
        let held = self.kv.num_computed_tokens(slot).unwrap_or(0);
        let n_slots = (num_computed + n).saturating_sub(held.max(num_computed));
        let blocks = if n_slots == 0 && lookahead == 0 && num_encoder_tokens == 0 {
            Some(Vec::new())
        } else {
            self.kv.allocate_in_flight(
                slot, new_tokens, n_slots, lookahead, None, lora_id, with_ids, in_flight,
            )?
        };
        let Some(blocks) = blocks else {
            self.encoder_release(slot);
            return Ok(Admission::Blocked);
        };
        self.commit_encoder_inputs(slot, encoder);
        // vLLM 0.33 tells the connector of every allocation in its waiting loop, a landed
        // load's too (`update_state_after_alloc` with no external tokens).
        let notified = self.notify_allocation(slot, 0);
        self.start_running(slot, num_computed, n, padded, blocks, budget, plan)?;
        notified.map(|()| Admission::Scheduled)
    }

    /// A loading request at the head of the queue: if its load landed, its blocks enter the
    /// prefix cache and it counts the loaded tokens as computed (all but the last token, if
    /// the load covered every one: the model needs it for logits, as in vLLM's
    /// `_update_waiting_for_remote_kv`); if the load failed (`sched::load_failures`), only
    /// the valid prefix its request counts is cached and computed, its blocks kept, or with
    /// none it drops its blocks and recomputes. Returns whether it can be admitted now.
    pub(super) fn take_landed_load(&mut self, slot: u32) -> Result<bool> {
        if !self.landed.contains(&slot) {
            return Ok(false);
        }
        let failed = self.failed_loads.remove(&slot);
        let num_valid = self.req(slot).num_computed_tokens;
        if failed && num_valid > 0 {
            return self.take_valid_prefix(slot, num_valid);
        }
        if failed {
            self.landed.remove(&slot);
            self.free_kv(slot)?;
            let ask_again = self.ask_again_after_failed_load;
            let request = self.req_mut(slot);
            request.num_computed_tokens = 0;
            request.num_external_computed_tokens = 0;
            request.kv_load_failed = !ask_again;
            request.status = RequestStatus::Waiting;
            return Ok(true);
        }
        self.landed.remove(&slot);
        let loaded = self
            .kv
            .num_computed_tokens(slot)
            .expect("a loading request");
        let num_tokens = self.req(slot).num_tokens();
        // vLLM 0.33's `_update_waiting_for_remote_kv`: a load without the bounded-replay
        // window replays the hit's last window (its blocks stay counted by the pool).
        let window = self.config.prefix_replay_tokens();
        let num_replay = if window > 0 && !self.load_restores_replay_window(slot)? {
            window.min(loaded)
        } else {
            0
        };
        if num_replay == 0 && loaded >= num_tokens {
            self.kv.rewind(slot, loaded + 1 - num_tokens)?;
        }
        self.kv.cache_loaded(slot)?;
        let request = self.req_mut(slot);
        request.num_computed_tokens = if num_replay > 0 {
            request.replay_start = loaded - num_replay;
            loaded - num_replay
        } else {
            loaded.min(num_tokens - 1)
        };
        request.status = RequestStatus::Waiting;
        Ok(true)
    }

    /// vLLM 0.33's `_update_waiting_for_remote_kv` for a load with invalid blocks: the
    /// valid `num_valid` tokens (whole blocks before the first invalid one) enter the prefix
    /// cache and count as computed; the blocks past them stay the request's, to recompute
    /// into. Bounded replay treats the load as one without its window (vLLM passes
    /// `window_loaded=False` for a failed load).
    fn take_valid_prefix(&mut self, slot: u32, num_valid: usize) -> Result<bool> {
        self.landed.remove(&slot);
        let loaded = self.kv.num_computed_tokens(slot).unwrap_or(0);
        match &mut self.kv {
            Kv::BlockHash(pool) => pool.truncate_computed_tokens(&slot, num_valid, false)?,
            kv => kv.rewind(slot, loaded.saturating_sub(num_valid))?,
        }
        self.kv.cache_loaded(slot)?;
        let window = self.config.prefix_replay_tokens();
        let num_replay = window.min(num_valid);
        let request = self.req_mut(slot);
        request.num_computed_tokens = num_valid - num_replay;
        request.replay_start = if num_replay > 0 {
            num_valid - num_replay
        } else {
            0
        };
        request.status = RequestStatus::Waiting;
        Ok(true)
    }
}
