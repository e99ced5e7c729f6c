//! Encoder inputs of an encoder-decoder model (Whisper, BART-style plugins), as vLLM 0.33's
//! scheduler treats them when `is_encoder_decoder` is set (`_try_schedule_encoder_inputs`,
//! `_free_encoder_inputs` and `EncoderDecoderCacheManager` in `v1/core/sched/scheduler.py`
//! and `v1/core/encoder_cache_manager.py`). The encoder's input is not part of the decoder's
//! prompt: all of a request's items are encoded in the step that schedules its first decoder
//! tokens (vLLM sets `lo = 0` and skips every item once a token is computed), whatever
//! their placeholder ranges, and their outputs go to the cross-attention KV cache, sized by
//! their encoder tokens (`KvGroupSpec::CrossAttention`), not to the encoder cache. No item
//! is looked up or shared: the "cache" is a counter of free embedding slots, which an
//! allocation lowers and every free of an input raises.
//!
//! vLLM's counter is kept as vLLM keeps it, quirks included: `free` of a request raises it
//! by all of its inputs whether they were allocated or not (a request whose KV allocation
//! failed after its inputs were picked gives back slots it never took), and each update of
//! a step with the request in it, once it has a computed token, frees all of its inputs
//! again (`get_cached_input_ids` answers every input). The counter may so exceed the cache
//! size; it only limits a step's encoder inputs (`can_allocate`). Identifiers allocated in
//! a step are reported freed (`free_encoder_mm_hashes`) with the next step, the worker
//! dropping them once the step that encoded them ran (`get_freed_mm_hashes`).

use super::encoder::EncoderPick;
use super::output::SampledOutput;
use super::scheduler::Scheduler;
use crate::kv::RequestKey;
use crate::{Error, Result};

/// vLLM 0.33's `EncoderDecoderCacheManager`: free embedding slots and the identifiers
/// allocated in the current and the previous step.
#[derive(Debug, Clone)]
pub(super) struct EncoderDecoderCache {
    cache_size: usize,
    num_free_slots: usize,
    allocated: Vec<String>,
    to_free: Vec<String>,
}

impl EncoderDecoderCache {
    pub(super) fn new(cache_size: usize) -> Self {
        Self {
            cache_size,
            num_free_slots: cache_size,
            allocated: Vec::new(),
            to_free: Vec::new(),
        }
    }

    /// `can_allocate`: the input's embeddings fit the budget left, and beside the ones this
    /// request already picks, the free slots.
    fn can_allocate(
        &self,
        num_embeds: usize,
        budget: usize,
        num_embeds_to_schedule: usize,
    ) -> bool {
        num_embeds <= budget && num_embeds + num_embeds_to_schedule <= self.num_free_slots
    }

    fn allocate(&mut self, mm_hash: &str, num_embeds: usize) {
        self.num_free_slots = self.num_free_slots.saturating_sub(num_embeds);
        self.allocated.push(mm_hash.to_owned());
    }

    fn free(&mut self, num_embeds: usize) {
        self.num_free_slots = self.num_free_slots.saturating_add(num_embeds);
    }

    /// `get_freed_mm_hashes`: the previous step's identifiers; this step's wait a step.
    fn take_freed(&mut self) -> Vec<String> {
        std::mem::replace(&mut self.to_free, std::mem::take(&mut self.allocated))
    }

    pub(super) fn cache_size(&self) -> usize {
        self.cache_size
    }

    pub(super) fn num_free_slots(&self) -> usize {
        self.num_free_slots
    }
}

impl<R: RequestKey> Scheduler<R> {
    /// Treats encoder inputs as vLLM 0.33 does for an encoder-decoder model (assigning
    /// `Scheduler.is_encoder_decoder`), or, with `false`, as a decoder-only multimodal
    /// model's. Switching on gives an empty `EncoderDecoderCacheManager` of the encoder
    /// cache's size (`set_encoder_cache_size` then sizes it). Only while no live request
    /// has multimodal items (their inputs would change meaning mid-flight).
    pub fn set_encoder_decoder(&mut self, encoder_decoder: bool) -> Result<()> {
        if self.encoder.enc_dec.is_some() == encoder_decoder {
            return Ok(());
        }
        if self.num_mm_requests > 0 {
            return Err(Error::input(
                "is_encoder_decoder",
                encoder_decoder,
                format!(
                    "can change only while no request has multimodal items ({} do)",
                    self.num_mm_requests
                ),
            ));
        }
        self.encoder.enc_dec =
            encoder_decoder.then(|| EncoderDecoderCache::new(self.encoder.cache.cache_size()));
        Ok(())
    }

    /// Whether encoder inputs are treated as an encoder-decoder model's.
    pub fn is_encoder_decoder(&self) -> bool {
        self.encoder.enc_dec.is_some()
    }

    /// `_try_schedule_encoder_inputs` under `is_encoder_decoder`: with no token computed,
    /// every item starting before the scheduled range's end (all of them sit at position
    /// 0), in order, while the budget and the free slots allow; none once a token is
    /// computed. An item that does not fit stops the request's tokens before it (none if
    /// it starts at 0, as Whisper's does).
    pub(super) fn schedule_encoder_decoder_inputs(
        &mut self,
        slot: u32,
        num_computed: usize,
        mut n: usize,
    ) -> (usize, Option<EncoderPick>) {
        let request = self.slots[slot as usize]
            .as_ref()
            .expect("scheduled slot is live");
        let features = &request.spec.mm_features;
        if n == 0 || features.is_empty() || num_computed > 0 {
            return (n, None);
        }
        let Some(cache) = self.encoder.enc_dec.as_ref() else {
            return (n, None);
        };
        let window_end = n + self.config.num_prefill_lookahead;
        let hi = features.partition_point(|f| f.offset < window_end);
        let mut pick = EncoderPick {
            budget_left: self.encoder.budget,
            ..EncoderPick::default()
        };
        let mut num_embeds_to_schedule = 0;
        for (i, f) in features.iter().enumerate().take(hi) {
            let num_embeds = f.num_embeds();
            let allowed = super::encoder::hook_allows(
                &self.hooks,
                &mut self.encoder.connector_error,
                (request, i),
                pick.budget_left,
                num_embeds_to_schedule,
            );
            if !allowed || !cache.can_allocate(num_embeds, pick.budget_left, num_embeds_to_schedule)
            {
                n = n.min(f.offset);
                break;
            }
            if f.num_embeds_in(0, f.length.min(window_end - f.offset)) == 0 {
                continue;
            }
            num_embeds_to_schedule += num_embeds;
            pick.budget_left -= num_embeds;
            pick.inputs.push(i);
        }
        (n, Some(pick))
    }

    /// The encoder tokens of `pick`'s inputs when they go to cross-attention (an
    /// encoder-decoder model): what sizes the request's cross-attention blocks (vLLM's
    /// `num_encoder_tokens`, the inputs' embeddings); 0 otherwise.
    pub(super) fn cross_attention_tokens(&self, slot: u32, pick: Option<&EncoderPick>) -> usize {
        let (Some(_), Some(pick)) = (&self.encoder.enc_dec, pick) else {
            return 0;
        };
        let features = &self.req(slot).spec.mm_features;
        pick.inputs.iter().map(|&i| features[i].num_embeds()).sum()
    }

    /// `EncoderDecoderCacheManager.allocate` for each input of `inputs` of `slot`.
    pub(super) fn encoder_decoder_allocate(&mut self, slot: u32, inputs: &[usize]) {
        let features = &self.slots[slot as usize]
            .as_ref()
            .expect("live")
            .spec
            .mm_features;
        if let Some(cache) = self.encoder.enc_dec.as_mut() {
            for &i in inputs {
                cache.allocate(&features[i].identifier, features[i].num_embeds());
            }
        }
    }

    /// `EncoderDecoderCacheManager.free(request)`: every input of `slot` gives its slots
    /// back (allocated or not, as in vLLM).
    pub(super) fn encoder_decoder_free(&mut self, slot: u32) {
        let Some(request) = self.slots[slot as usize].as_ref() else {
            return;
        };
        if let Some(cache) = self.encoder.enc_dec.as_mut() {
            let features = &request.spec.mm_features;
            features.iter().for_each(|f| cache.free(f.num_embeds()));
        }
    }

    /// `_free_encoder_inputs` under `is_encoder_decoder` for the requests of the step an
    /// update lands (`batch`: slot and `arrival_seq`, in batch order): each running one
    /// with a token computed (less this update's rejected drafts) frees all its inputs,
    /// each reported to the encoder-cache connector (`update_state_after_free`; its first
    /// error is returned).
    pub(super) fn encoder_decoder_free_passed(
        &mut self,
        batch: &[(u32, u64)],
        outputs: &[SampledOutput<R>],
    ) -> Option<Error> {
        let mut error = None;
        for &(slot, arrival_seq) in batch {
            let Some(request) = self.slots[slot as usize].as_ref() else {
                continue;
            };
            if request.arrival_seq != arrival_seq || request.status != super::RequestStatus::Running
            {
                continue;
            }
            let rejected = outputs
                .iter()
                .find(|o| o.num_rejected_tokens > 0 && o.request_id == request.request_id)
                .map_or(0, |o| o.num_rejected_tokens);
            if request.num_computed_tokens > rejected {
                if let Some(connector) = self.ec_connector.as_mut().filter(|_| error.is_none()) {
                    // vLLM's `get_cached_input_ids` here: every input, in order.
                    error = (0..request.spec.mm_features.len())
                        .find_map(|i| connector.update_state_after_free(request, i).err());
                }
                self.encoder_decoder_free(slot);
            }
        }
        error
    }

    /// The identifiers this step's output reports freed, under `is_encoder_decoder`
    /// (`get_freed_mm_hashes`); `None` otherwise.
    pub(super) fn encoder_decoder_take_freed(&mut self) -> Option<Vec<String>> {
        self.encoder
            .enc_dec
            .as_mut()
            .map(EncoderDecoderCache::take_freed)
    }
}
