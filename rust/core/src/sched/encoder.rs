//! Multimodal encoder inputs in the step (vLLM 0.33's `Scheduler._try_schedule_encoder_inputs`
//! and its callers, `v1/core/sched/scheduler.py`). A request's items (images, audio clips)
//! sit at placeholder ranges of its prompt; before the decoder computes any token of an
//! item's range, the item's encoder output must be in the encoder cache (`encoder_cache`),
//! cached from an earlier step or request, or computed this step under the encoder compute
//! budget (`max_num_encoder_input_tokens`, in embeddings) and with room in the cache. When
//! neither, the request's tokens stop just before the item (none if it already passed the
//! item's start, as after a prefix hit). A request lets go of an item once its computed
//! tokens pass it, and of all of them when it finishes or is preempted.
//!
//! Invariant: the cache's references are the items of live requests (`EncoderCache::check`
//! for the cache's own counters).

use super::encoder_cache::EncoderCache;
use super::output::{SampledOutput, SchedulerOutput};
use super::scheduler::Scheduler;
use super::{RequestSpec, SchedulerConfig};
use crate::kv::RequestKey;
use crate::{Error, Result};

/// The encoder options of vLLM 0.33's `SchedulerConfig`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncoderConfig {
    /// Encoder embeddings computed per step, all requests together (0: vLLM's default,
    /// `max_num_batched_tokens`). vLLM raises it to the model's largest item
    /// (`compute_mm_encoder_budget`); here an item larger than it is refused at
    /// `add_request`.
    pub max_num_encoder_input_tokens: usize,
    /// Embeddings the encoder cache holds (0: `max_num_batched_tokens`, vLLM's default).
    pub encoder_cache_size: usize,
    /// Never schedule part of an item's placeholder range: a chunk that would end inside
    /// one stops before it.
    pub disable_chunked_mm_input: bool,
}

impl EncoderConfig {
    /// The compute budget per step, in embeddings.
    pub fn compute_budget(&self, max_num_batched_tokens: usize) -> usize {
        match self.max_num_encoder_input_tokens {
            0 => max_num_batched_tokens,
            n => n,
        }
    }

    /// The cache's size, in embeddings.
    pub fn cache_size(&self, max_num_batched_tokens: usize) -> usize {
        match self.encoder_cache_size {
            0 => max_num_batched_tokens,
            n => n,
        }
    }
}

/// One multimodal item of a prompt (vLLM's `MultiModalFeatureSpec` with its
/// `PlaceholderRange`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MmFeature {
    /// Where its placeholder range starts in the prompt.
    pub offset: usize,
    /// Its placeholder tokens.
    pub length: usize,
    /// The cache key (vLLM's `mm_hash`): items with equal identifiers share one entry.
    pub identifier: String,
    /// Which placeholder positions take an encoder embedding (vLLM's `is_embed`); `None`:
    /// all of them.
    pub is_embed: Option<Vec<bool>>,
}

impl MmFeature {
    /// Encoder embeddings the item makes: what it costs in the budget and holds in the cache.
    pub fn num_embeds(&self) -> usize {
        self.is_embed
            .as_ref()
            .map_or(self.length, |mask| mask.iter().filter(|&&e| e).count())
    }

    /// Embeddings at placeholder positions `[start, end)` (relative to `offset`).
    pub(super) fn num_embeds_in(&self, start: usize, end: usize) -> usize {
        match &self.is_embed {
            None => end.saturating_sub(start),
            Some(mask) => mask[start.min(end)..end].iter().filter(|&&e| e).count(),
        }
    }
}

/// More steps than any engine keeps in flight (vLLM's batch queue holds 2, or the
/// pipeline's depth): the bound of `Encoder::batches`.
const MAX_STEPS_IN_FLIGHT: usize = 64;

/// The scheduler's encoder state: the cache (keyed by slot) and this step's budget.
pub(super) struct Encoder {
    pub(super) cache: EncoderCache<u32>,
    budget_per_step: usize,
    /// Budget left in this step.
    pub(super) budget: usize,
    /// Under `is_encoder_decoder`, vLLM's `EncoderDecoderCacheManager`, which then stands
    /// in for `cache` (`sched::encoder_decoder`).
    pub(super) enc_dec: Option<super::encoder_decoder::EncoderDecoderCache>,
    /// Inputs to encode this step, by request, in scheduling order.
    step_inputs: Vec<(u32, Vec<usize>)>,
    /// The steps not yet updated, oldest first: each one's scheduled requests that have
    /// items, in batch order, by slot and `arrival_seq` (a slot may hold another request by
    /// the update). An update frees the passed items of the oldest step's requests, as
    /// vLLM 0.33's `update_from_output` runs `_free_encoder_inputs` over the requests of
    /// the step it updates, not of the latest one (two differ under async scheduling).
    batches: std::collections::VecDeque<Vec<(u32, u64)>>,
    /// Requests whose item's identifier is cached with another embedding count (vLLM 0.33
    /// finishes them with an error at the next update), by slot and `arrival_seq` (a slot
    /// may hold another request by then).
    mismatched: Vec<(u32, u64)>,
    /// The first error of the encoder-cache connector (or of a step hook's
    /// `allow_encoder_input`) in the step being formed: the step is completed without its
    /// answer and kept, and `schedule` returns the error.
    pub(super) connector_error: Option<Error>,
}

impl Encoder {
    pub(super) fn new(config: &SchedulerConfig) -> Self {
        let budget = config.encoder.compute_budget(config.max_num_batched_tokens);
        Self {
            cache: EncoderCache::new(config.encoder.cache_size(config.max_num_batched_tokens)),
            budget_per_step: budget,
            budget,
            enc_dec: None,
            step_inputs: Vec::new(),
            batches: std::collections::VecDeque::new(),
            mismatched: Vec::new(),
            connector_error: None,
        }
    }
}

/// What `schedule_encoder_inputs` decided for one request, applied by
/// `commit_encoder_inputs` only if the request is scheduled.
#[derive(Default)]
pub(super) struct EncoderPick {
    pub(super) inputs: Vec<usize>,
    /// Items the encoder-cache connector holds (`sched::encoder_connector`): they take
    /// cache room, not encoder budget, and are not encoded.
    pub(super) external: Vec<usize>,
    /// Items whose identifier an earlier input of this request encodes this step.
    pub(super) duplicates: Vec<usize>,
    pub(super) budget_left: usize,
}

impl<R: RequestKey> Scheduler<R> {
    /// `add_request`'s checks on the items: sorted, disjoint, inside the prompt, each able
    /// to be scheduled one day (within the budget and the cache; whole under
    /// `disable_chunked_mm_input`).
    pub(super) fn check_mm_features(
        &self,
        spec: &RequestSpec,
        num_prompt_tokens: usize,
    ) -> Result<()> {
        self.check_mm_items(&spec.mm_features, num_prompt_tokens)
    }

    /// [`Self::check_mm_features`] over `features` (a request's, or a streaming-input
    /// session's with its next chunk's appended, `sched::session`).
    pub(super) fn check_mm_items(
        &self,
        features: &[MmFeature],
        num_prompt_tokens: usize,
    ) -> Result<()> {
        if features.is_empty() {
            return Ok(());
        }
        // Beside a KV connector the admission paths schedule the items past the loaded
        // prefix (`sched::admission`, `sched::loads::admit_loaded`), as vLLM 0.33 does; an
        // encoder-decoder model's once nothing is computed (a loaded prefix skips them,
        // `schedule_encoder_decoder_inputs`). The host tier has no vLLM counterpart to
        // check it against.
        if self.config.host_num_blocks > 0 {
            return Err(Error::input(
                "mm_features",
                features.len(),
                "multimodal requests with a host KV tier (host_num_blocks) are not modelled",
            ));
        }
        let cfg = &self.config;
        // The budget and cache size now in force (`set_encoder_budget`, `set_encoder_cache_size`).
        let budget = self.encoder.budget_per_step;
        let enc_dec = self.encoder.enc_dec.as_ref();
        let cache_size = enc_dec.map_or(self.encoder.cache.cache_size(), |c| c.cache_size());
        let (mut end, mut last_offset) = (0, 0);
        for (i, f) in features.iter().enumerate() {
            let bad = |why: String| Error::input("mm_features", format!("item {i} {f:?}"), why);
            if f.length == 0 {
                return Err(bad("must have at least one placeholder token".into()));
            }
            // An encoder-decoder model's ranges count encoder tokens, not the decoder's
            // prompt: they need only be sorted (a session's later input, placed after the
            // kept tokens, may start inside the first one's range).
            let start = if enc_dec.is_some() { last_offset } else { end };
            if i > 0 && f.offset < start {
                return Err(bad(format!(
                    "must start at or after the previous item's end ({end}): items are \
                     sorted by offset and disjoint"
                )));
            }
            end = f.offset.saturating_add(f.length);
            last_offset = f.offset;
            // An encoder-decoder model's encoder input is not in the decoder's prompt.
            if end > num_prompt_tokens && enc_dec.is_none() {
                return Err(bad(format!(
                    "must lie inside the {num_prompt_tokens}-token prompt"
                )));
            }
            if f.is_embed.as_ref().is_some_and(|m| m.len() != f.length) {
                return Err(bad(
                    "is_embed must have one entry per placeholder token".into()
                ));
            }
            let num_embeds = f.num_embeds();
            if num_embeds > budget {
                return Err(bad(format!(
                    "needs {num_embeds} encoder embeddings, more than \
                     max_num_encoder_input_tokens={budget} (vLLM raises the budget to the \
                     largest item; it would never be scheduled)"
                )));
            }
            if num_embeds > cache_size {
                return Err(bad(format!(
                    "needs {num_embeds} encoder embeddings, more than \
                     encoder_cache_size={cache_size}"
                )));
            }
            if cfg.encoder.disable_chunked_mm_input
                && enc_dec.is_none()
                && f.length > cfg.max_num_batched_tokens
            {
                return Err(bad(format!(
                    "is longer than max_num_batched_tokens={} under \
                     disable_chunked_mm_input (vLLM refuses such a model at start-up)",
                    cfg.max_num_batched_tokens
                )));
            }
        }
        Ok(())
    }

    /// A new step: the full encoder budget, no inputs yet.
    pub(super) fn encoder_begin_step(&mut self) {
        self.encoder.budget = self.encoder.budget_per_step;
        self.encoder.step_inputs.clear();
    }

    /// vLLM 0.33's `_try_schedule_encoder_inputs`: the tokens `n` the request at `slot`
    /// (with `num_computed` computed) may take given its items in `[num_computed,
    /// num_computed + n)`, and the inputs to encode for them. Looking items up references
    /// the cached ones, as in vLLM, whether or not the request is then scheduled.
    pub(super) fn schedule_encoder_inputs(
        &mut self,
        slot: u32,
        num_computed: usize,
        mut n: usize,
    ) -> (usize, Option<EncoderPick>) {
        let request = self.slots[slot as usize]
            .as_ref()
            .expect("scheduled slot is live");
        let (features, arrival_seq) = (&request.spec.mm_features, request.arrival_seq);
        if n == 0 || features.is_empty() {
            return (n, None);
        }
        if self.encoder.enc_dec.is_some() {
            return self.schedule_encoder_decoder_inputs(slot, num_computed, n);
        }
        // vLLM 0.33's `shift_computed_tokens`: a drafter's prefill look-ahead reads the next
        // `num_prefill_lookahead` tokens, whose encoder outputs must be there too.
        let shift = self.config.num_prefill_lookahead;
        let window_end = num_computed + n + shift;
        // Items overlapping [num_computed, window_end) (vLLM's get_mm_features_in_window).
        let lo = features.partition_point(|f| f.offset + f.length < num_computed + 1);
        let hi = features.partition_point(|f| f.offset < window_end);
        let cache = &mut self.encoder.cache;
        let mut pick = EncoderPick {
            budget_left: self.encoder.budget,
            ..EncoderPick::default()
        };
        let mut to_schedule: Vec<(&str, usize)> = Vec::new();
        let mut num_embeds_to_schedule = 0;
        for (i, f) in features.iter().enumerate().take(hi).skip(lo) {
            let (start, num_embeds) = (f.offset, f.num_embeds());
            if self.config.encoder.disable_chunked_mm_input
                && num_computed <= start
                && num_computed + n < start + f.length
            {
                // vLLM rolls back past the look-ahead too, so it stops before the item.
                n = start.saturating_sub(num_computed + shift);
                break;
            }
            let id = f.identifier.as_str();
            if let Some(&(_, scheduled)) = to_schedule.iter().find(|(h, _)| *h == id) {
                if scheduled != num_embeds {
                    self.encoder.mismatched.push((slot, arrival_seq));
                    return (0, None);
                }
                pick.duplicates.push(i);
                continue;
            }
            if cache.cached_num_embeds(id).is_some_and(|c| c != num_embeds) {
                self.encoder.mismatched.push((slot, arrival_seq));
                return (0, None);
            }
            if cache.check_and_update_cache(&slot, i, id) {
                continue;
            }
            let allowed = hook_allows(
                &self.hooks,
                &mut self.encoder.connector_error,
                (request, i),
                pick.budget_left,
                num_embeds_to_schedule,
            );
            if !allowed || !cache.can_allocate(num_embeds, pick.budget_left, num_embeds_to_schedule)
            {
                // The encoder sees an item whole (bidirectional attention): stop before it.
                n = if num_computed < start {
                    n.min(start - num_computed)
                } else {
                    0
                };
                break;
            }
            let start_rel = num_computed.saturating_sub(start);
            let end_rel = f.length.min(window_end - start);
            if f.num_embeds_in(start_rel, end_rel) == 0 {
                continue;
            }
            // vLLM 0.33: an item the encoder-cache connector holds is loaded (a consumer)
            // or was published already (a producer): cache room, no encoder work.
            let held = match self.ec_connector.as_mut() {
                Some(c) if self.encoder.connector_error.is_none() => {
                    c.has_cache_item(id).unwrap_or_else(|err| {
                        self.encoder.connector_error = Some(err);
                        false
                    })
                }
                _ => false,
            };
            if held {
                num_embeds_to_schedule += num_embeds;
                to_schedule.push((id, num_embeds));
                pick.external.push(i);
                continue;
            }
            num_embeds_to_schedule += num_embeds;
            pick.budget_left -= num_embeds;
            to_schedule.push((id, num_embeds));
            pick.inputs.push(i);
        }
        (n, Some(pick))
    }

    /// The request at `slot` was scheduled with `pick`: its inputs take budget and cache
    /// room (vLLM's `_allocate_encoder_inputs`).
    pub(super) fn commit_encoder_inputs(&mut self, slot: u32, pick: Option<EncoderPick>) {
        let Some(pick) = pick else { return };
        if pick.inputs.is_empty() && pick.external.is_empty() {
            return;
        }
        if self.encoder.enc_dec.is_some() {
            self.encoder_decoder_allocate(slot, &pick.inputs);
            self.encoder.budget = pick.budget_left;
            self.encoder.step_inputs.push((slot, pick.inputs));
            return;
        }
        let request = self.slots[slot as usize].as_ref().expect("live");
        let features = &request.spec.mm_features;
        let cache = &mut self.encoder.cache;
        for &i in pick.inputs.iter().chain(&pick.external) {
            let f = &features[i];
            cache.allocate(&slot, i, &f.identifier, f.num_embeds());
            // vLLM's `_allocate_encoder_inputs` tells the connector of each allocation.
            if let Some(c) = self.ec_connector.as_mut()
                && self.encoder.connector_error.is_none()
                && let Err(err) = c.update_state_after_alloc(request, i)
            {
                self.encoder.connector_error = Some(err);
            }
        }
        if pick.inputs.is_empty() {
            for &i in &pick.duplicates {
                cache.check_and_update_cache(&slot, i, &features[i].identifier);
            }
            return;
        }
        for &i in &pick.duplicates {
            cache.check_and_update_cache(&slot, i, &features[i].identifier);
        }
        self.encoder.budget = pick.budget_left;
        self.encoder.step_inputs.push((slot, pick.inputs));
    }

    /// Drops every reference of the request at `slot` (it finished, was preempted, or could
    /// not be admitted after its items were looked up).
    pub(super) fn encoder_release(&mut self, slot: u32) {
        let Some(request) = self.slots[slot as usize].as_ref() else {
            return;
        };
        let features = &request.spec.mm_features;
        if features.is_empty() {
            return;
        }
        if self.encoder.enc_dec.is_some() {
            // The cross-attention tokens set for the allocation refused go with it.
            self.kv.set_encoder_tokens(0);
            self.encoder_decoder_free(slot);
            return;
        }
        self.encoder
            .cache
            .free(&slot, |i| features[i].identifier.clone());
    }

    /// A preempted request: its references go, and inputs it had this step give their
    /// budget back (vLLM restores it when a scheduled request is preempted).
    pub(super) fn encoder_preempted(&mut self, slot: u32) {
        if let Some(pos) = self
            .encoder
            .step_inputs
            .iter()
            .position(|(s, _)| *s == slot)
        {
            let (_, inputs) = self.encoder.step_inputs.remove(pos);
            let features = &self.req(slot).spec.mm_features;
            self.encoder.budget += inputs
                .iter()
                .map(|&i| features[i].num_embeds())
                .sum::<usize>();
        }
        self.encoder_release(slot);
    }

    /// The step's encoder fields of `out` (`scheduled`: its requests in batch order), and
    /// the requests whose passed items the update that lands this step frees.
    pub(super) fn encoder_end_step(
        &mut self,
        scheduled: &[(u32, usize)],
        out: &mut SchedulerOutput<R>,
    ) {
        if !self.async_scheduling {
            // A synchronous engine updates each step before it asks for the next.
            self.encoder.batches.clear();
        } else if self.encoder.batches.len() == MAX_STEPS_IN_FLIGHT {
            // An engine that never updates some steps must not grow the queue.
            self.encoder.batches.pop_front();
        }
        let mut batch = Vec::new();
        // With no request holding items the update frees nothing: a text-only step skips
        // the scan.
        if self.num_mm_requests > 0 {
            for &(slot, _) in scheduled {
                let request = self.req(slot);
                if !request.spec.mm_features.is_empty() {
                    batch.push((slot, request.arrival_seq));
                }
            }
        }
        self.encoder.batches.push_back(batch);
        out.scheduled_encoder_inputs = std::mem::take(&mut self.encoder.step_inputs)
            .into_iter()
            .map(|(slot, inputs)| (self.req(slot).request_id.clone(), inputs))
            .collect();
        out.free_encoder_mm_hashes = match self.encoder_decoder_take_freed() {
            Some(freed) => freed,
            None => self.encoder.cache.take_freed(),
        };
    }

    /// vLLM 0.33's `_free_encoder_inputs` in `update_from_output`, over the requests of the
    /// step this update lands (the oldest not yet updated; under async scheduling the
    /// latest may be a step later), in batch order: an item whose range lies wholly before
    /// the tokens computed for sure (less rejected drafts and outputs in flight) is let go.
    /// `num_computed_tokens` already counts the steps scheduled since, as in vLLM. Runs
    /// before `outputs` are applied, with their rejections counted as vLLM counts them.
    /// Each item let go is reported to the encoder-cache connector
    /// (`update_state_after_free`); its first error is returned (later items are still let
    /// go, the connector no longer told).
    pub(super) fn encoder_free_passed(&mut self, outputs: &[SampledOutput<R>]) -> Option<Error> {
        let batch = self.encoder.batches.pop_front()?;
        if self.encoder.enc_dec.is_some() {
            return self.encoder_decoder_free_passed(&batch, outputs);
        }
        if batch.is_empty() || !self.encoder.cache.has_requests() {
            return None;
        }
        let mut error = None;
        // Rejections are rare: look them up in a short list, not every output.
        let rejections: Vec<(&R, usize)> = outputs
            .iter()
            .filter(|o| o.num_rejected_tokens > 0)
            .map(|o| (&o.request_id, o.num_rejected_tokens))
            .collect();
        for &(slot, arrival_seq) in &batch {
            let Some(request) = self.slots[slot as usize].as_ref() else {
                continue;
            };
            // A request that finished since (its slot may hold another): vLLM's update
            // skips a request it no longer holds.
            if request.arrival_seq != arrival_seq || request.status != super::RequestStatus::Running
            {
                continue;
            }
            let rejected = rejections
                .iter()
                .find(|(id, _)| **id == request.request_id)
                .map_or(0, |&(_, n)| n);
            let placeholders = request.num_output_placeholders.saturating_sub(rejected);
            let done = request
                .num_computed_tokens
                .saturating_sub(rejected)
                .saturating_sub(placeholders);
            let features = &request.spec.mm_features;
            for i in self.encoder.cache.cached_input_ids(&slot) {
                let f = &features[i];
                if f.offset + f.length <= done {
                    self.encoder
                        .cache
                        .free_encoder_input(&slot, i, &f.identifier);
                    if let Some(connector) = self.ec_connector.as_mut().filter(|_| error.is_none())
                    {
                        error = connector.update_state_after_free(request, i).err();
                    }
                }
            }
        }
        error
    }

    /// Requests found with an identifier cached under another embedding count since the last
    /// call (vLLM 0.33 finishes them with an error at the next update).
    pub(super) fn take_encoder_mismatches(&mut self) -> Vec<u32> {
        let mut flagged = std::mem::take(&mut self.encoder.mismatched);
        flagged.sort_unstable();
        flagged.dedup();
        flagged
            .into_iter()
            .filter(|&(slot, seq)| {
                self.slots[slot as usize]
                    .as_ref()
                    .is_some_and(|r| r.arrival_seq == seq)
            })
            .map(|(slot, _)| slot)
            .collect()
    }

    /// Sets the encoder compute budget per step, in embeddings, from the next step on, as
    /// assigning vLLM 0.33's `Scheduler.max_num_encoder_input_tokens` does (taken as given:
    /// 0 schedules no encoder input). Requests already queued keep their items; one larger
    /// than the budget waits, as in vLLM, until the budget grows.
    pub fn set_encoder_budget(&mut self, max_num_encoder_input_tokens: usize) {
        self.encoder.budget_per_step = max_num_encoder_input_tokens;
    }

    /// The encoder compute budget per step, in embeddings.
    pub fn encoder_budget(&self) -> usize {
        self.encoder.budget_per_step
    }

    /// Replaces the encoder cache with an empty one of `cache_size` embeddings, as
    /// assigning a new `EncoderCacheManager` to vLLM 0.33's `Scheduler.encoder_cache_manager`
    /// does. Only while no live request references an entry (their items would point into
    /// a cache that no longer holds them); freeable entries are dropped, and reported freed
    /// with the next step (the worker drops their outputs).
    pub fn set_encoder_cache_size(&mut self, cache_size: usize) -> Result<()> {
        if self.encoder.enc_dec.is_some() {
            // vLLM's `EncoderDecoderCacheManager` assigned: a fresh counter.
            if self.num_mm_requests > 0 {
                return Err(Error::input(
                    "encoder_cache_size",
                    cache_size,
                    "can change only while no request has multimodal items",
                ));
            }
            let enc_dec = super::encoder_decoder::EncoderDecoderCache::new(cache_size);
            self.encoder.enc_dec = Some(enc_dec);
            return Ok(());
        }
        let cache = &mut self.encoder.cache;
        if cache.has_requests() {
            return Err(Error::input(
                "encoder_cache_size",
                cache_size,
                "can change only while no request holds an encoder cache entry",
            ));
        }
        let mut freed = cache.take_freed();
        freed.extend(cache.entries().map(str::to_owned));
        *cache = EncoderCache::new(cache_size);
        cache.report_freed(freed);
        Ok(())
    }

    /// The encoder cache's entries: each identifier with the requests referencing it (none:
    /// freeable), by identifier.
    pub fn encoder_cache_entries(&self) -> Vec<(String, Vec<R>)> {
        let cache = &self.encoder.cache;
        let mut entries: Vec<(String, Vec<R>)> = cache
            .entries()
            .map(|mm_hash| {
                let ids = cache.referencing(mm_hash).into_iter();
                let ids = ids.filter_map(|&slot| self.slots[slot as usize].as_ref());
                (
                    mm_hash.to_owned(),
                    ids.map(|r| r.request_id.clone()).collect(),
                )
            })
            .collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        entries
    }

    /// The freeable entries, oldest first (the eviction order), with their embeddings.
    pub fn encoder_cache_freeable(&self) -> Vec<(String, usize)> {
        let cache = &self.encoder.cache;
        (cache.freeable_ids().into_iter())
            .map(|h| (h.to_owned(), cache.cached_num_embeds(h).unwrap_or(0)))
            .collect()
    }

    /// Identifiers evicted from the encoder cache since the last step's output took them.
    pub fn encoder_cache_freed(&self) -> Vec<String> {
        self.encoder.cache.freed().to_vec()
    }

    /// The encoder cache's counters: embeddings free, free or freeable, and in all.
    pub fn encoder_cache_usage(&self) -> (usize, usize, usize) {
        if let Some(c) = &self.encoder.enc_dec {
            // Nothing is kept past its request: free and freeable slots are one count.
            return (c.num_free_slots(), c.num_free_slots(), c.cache_size());
        }
        let cache = &self.encoder.cache;
        (
            cache.num_free_slots(),
            cache.num_freeable_slots(),
            cache.cache_size(),
        )
    }

    /// Requests referencing the encoder cache's entry `mm_hash` (0: freeable or absent).
    pub fn encoder_cache_refs(&self, mm_hash: &str) -> usize {
        self.encoder.cache.num_refs(mm_hash)
    }

    /// Whether the encoder cache holds an entry for `mm_hash` (referenced or freeable).
    pub fn encoder_cache_contains(&self, mm_hash: &str) -> bool {
        self.encoder.cache.contains(mm_hash)
    }

    /// The encoder side of `check_invariants`: the cache's counters, and its references
    /// held by live requests only.
    pub(super) fn check_encoder(&self) -> std::result::Result<(), String> {
        self.encoder.cache.check()?;
        for (slot, request) in self.slots.iter().enumerate() {
            if request.is_none()
                && !self
                    .encoder
                    .cache
                    .cached_input_ids(&(slot as u32))
                    .is_empty()
            {
                return Err(format!(
                    "the encoder cache holds inputs of freed slot {slot}"
                ));
            }
        }
        Ok(())
    }
}

/// A caller's `can_allocate` (`StepHooks::allow_encoder_input`), asked before the cache's
/// own check on both of vLLM 0.33's paths (`_try_schedule_encoder_inputs`): one that
/// refuses leaves the cache untouched, as vLLM's replaced method does. Without hooks, or
/// once a hook or connector failed this step (the step then fails), the cache decides.
pub(super) fn hook_allows<R: RequestKey>(
    hooks: &Option<Box<dyn super::hooks::StepHooks<R>>>,
    connector_error: &mut Option<Error>,
    (request, input_index): (&super::request::Request<R>, usize),
    budget_left: usize,
    num_embeds_to_schedule: usize,
) -> bool {
    let Some(hooks) = hooks.as_ref().filter(|_| connector_error.is_none()) else {
        return true;
    };
    (hooks.allow_encoder_input(request, input_index, budget_left, num_embeds_to_schedule))
        .unwrap_or_else(|err| {
            *connector_error = Some(err);
            false
        })
}
