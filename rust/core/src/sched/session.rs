//! Streaming-input sessions (vLLM 0.33's resumable requests: `Scheduler.
//! _handle_stopped_request`, `_update_request_as_session`). A resumable request whose turn
//! stops (EOS, a stop id, `max_tokens`) is parked instead of finished: it leaves the running
//! list for the back of the waiting requests that hold blocks (vLLM's `kv_holding_waiting`),
//! where admission skips it; it keeps its blocks and its model-runner slot (it counts
//! against `max_num_seqs` at admission), its computed tokens fall back to the frontier its
//! landed outputs reached, and the outputs of its steps still in flight are the caller's to
//! drop (vLLM's `drop_stale_output`). `resume_session` then drops the turn's last sampled
//! token, makes the kept outputs and the next input chunk its prompt, and lets it be
//! admitted from the place it parked at, like a landed load: no lookup, slots for what it
//! has not computed. Invariant: a parked request is in `parked` and in the waiting queue,
//! with status `WaitingForStreamingInput`, among the block holders iff it has computed
//! tokens (a request preempted before its stop landed holds none, and resumes by lookup).
//!
//! Two edges vLLM 0.33's `Scheduler` accepts too. A session whose first chunk is empty is
//! queued: each step that reaches it finds nothing to compute and skips it (vLLM's
//! `num_new_tokens == 0` skip, past the `assert num_new_tokens > 0` its `schedule()` fails
//! when assertions are on), so it never stops and never parks. And a chunk for a session
//! whose wait a caller set by hand on a request never scheduled
//! (`resume_unparked_session`): it takes the chunk where it waits and is admitted from the
//! computed tokens the caller set, as vLLM admits a waiting request with
//! `num_computed_tokens > 0` (no lookup, slots for all its tokens at once).

use super::request::{FinishReason, RequestStatus};
use super::scheduler::Scheduler;
use crate::kv::{RequestKey, TokenId};
use crate::{Error, Result};

/// The next input chunk of a parked session (vLLM 0.33's `StreamingUpdate`): what replaces
/// the request's sampling settings for its next turn.
#[derive(Debug, Clone, Default)]
pub struct SessionUpdate {
    /// Appended to the prompt after the kept outputs (may be empty).
    pub prompt_token_ids: Vec<TokenId>,
    pub max_tokens: usize,
    pub arrival_time: f64,
    pub eos_token_id: Option<TokenId>,
    pub stop_token_ids: Vec<TokenId>,
    pub ignore_eos: bool,
    pub repetition_detection: Option<super::RepetitionDetection>,
    pub min_tokens: usize,
    /// The chunk's multimodal items, offsets counted from its first token (vLLM's
    /// `StreamingUpdate.mm_features`): placed after the session's kept tokens and appended
    /// to its items, whose indices stay (vLLM's `_update_request_as_session`, `base =
    /// session.num_tokens` once the last sampled token is dropped).
    pub mm_features: Vec<super::MmFeature>,
}

impl<R: RequestKey> Scheduler<R> {
    /// Requests parked between turns (`RequestStatus::WaitingForStreamingInput`).
    pub fn num_parked(&self) -> usize {
        self.parked.len()
    }

    /// Chunks taken by sessions whose wait was set by hand (`resume_unparked_session`),
    /// which vLLM 0.33 takes off its parked-session counter all the same.
    pub fn num_unparked_resumes(&self) -> usize {
        self.num_unparked_resumes
    }

    /// Whether a request whose turn stopped for `reason` parks instead of finishing.
    pub(super) fn parks(&self, slot: u32, reason: FinishReason) -> bool {
        matches!(
            reason,
            FinishReason::Stop | FinishReason::Length | FinishReason::Repetition
        ) && self.req(slot).spec.resumable
    }

    /// vLLM 0.33's `_handle_stopped_request` for a resumable request with no update queued:
    /// computed tokens back to the materialized frontier (computed less the outputs in
    /// flight), drafts and placeholders dropped, its sampling steps in flight no longer
    /// expected (their outputs are stale), out of the running list, blocks kept.
    pub(super) fn park(&mut self, slot: u32) -> Result<()> {
        let request = self.req(slot);
        let was_running = request.status == RequestStatus::Running;
        let frontier = request
            .num_computed_tokens
            .saturating_sub(request.num_output_placeholders);
        if let Some(held) = self.kv.num_computed_tokens(slot)
            && held > frontier
        {
            self.kv.rewind(slot, held - frontier)?;
        }
        // A preempted request stops on a step in flight's output too (vLLM's
        // `stopped_preempted_reqs`): it leaves the waiting queue to be requeued as parked.
        if was_running {
            self.running.retain(|&s| s != slot);
        } else {
            self.waiting.remove(slot);
        }
        let request = self.req_mut(slot);
        request.num_computed_tokens = frontier;
        request.spec_token_ids.clear();
        request.num_output_placeholders = 0;
        request.status = RequestStatus::WaitingForStreamingInput;
        self.mark_stale(slot, true);
        self.parked.insert(slot);
        // vLLM's `_enqueue_waiting_request`: a blocked status counts as skipped at once, and
        // it goes last among the requests holding blocks (if it holds any: a preempted one
        // holds none).
        self.deferred.insert(slot);
        let key = self.priority_key(slot);
        let holds = self.holds_kv(slot);
        self.waiting.push_back_in_part(slot, key, holds);
        Ok(())
    }

    /// The session ends at its next stop: it finishes then instead of parking (vLLM 0.33's
    /// end marker queued behind a running session's turn, taken when the turn stops).
    /// Errors if the request is unknown.
    pub fn end_session(&mut self, request_id: &R) -> Result<()> {
        let slot =
            *(self.index.get(request_id)).ok_or_else(|| Error::unknown_request(request_id))?;
        self.req_mut(slot).spec.resumable = false;
        Ok(())
    }

    /// vLLM 0.33's `_update_request_as_session`: the parked session `request_id` takes its
    /// next input chunk. Its last sampled token is dropped (the model never computed it), its
    /// other outputs and `update.prompt_token_ids` become its prompt, `update` replaces its
    /// sampling settings and arrival time, and it waits where it parked, among the requests
    /// holding blocks, keeping its computed tokens.
    ///
    /// Errors (nothing changed) if the request is unknown or not parked, or if the new
    /// prompt leaves no room for an output token under `max_model_len`.
    pub fn resume_session(&mut self, request_id: &R, update: SessionUpdate) -> Result<()> {
        let slot =
            *(self.index.get(request_id)).ok_or_else(|| Error::unknown_request(request_id))?;
        if !self.parked.contains(&slot) {
            return Err(Error::input(
                "request_id",
                format!("{request_id:?}"),
                "is not a session waiting for streaming input",
            ));
        }
        let request = self.req(slot);
        let keep_end = request.num_tokens() - 1;
        self.check_chunk(slot, keep_end, &update)?;
        // vLLM asserts it: the dropped token was never computed.
        debug_assert!(keep_end >= request.num_computed_tokens);
        debug_assert!(self.kv.num_tokens(slot).unwrap_or(0) <= keep_end);
        let holds = request.num_computed_tokens > 0;
        self.take_chunk(slot, keep_end, update);
        self.parked.remove(&slot);
        if !holds && self.holds_kv(slot) {
            // Nothing computed to keep (vLLM would keep its blocks; not modelled): it
            // starts over with a prefix lookup, among the requests holding none.
            self.free_kv(slot)?;
            self.waiting.remove(slot);
            let key = self.priority_key(slot);
            self.waiting.push_back(slot, key);
        }
        Ok(())
    }

    /// [`Self::resume_session`] for the chunk queued while the session ran, taken when its
    /// turn stops (vLLM 0.33's `_handle_stopped_request`): the session never waited
    /// blocked, so it is not among the requests admission skipped (vLLM enqueues it as
    /// `WAITING`, outside `deferred_waiting`). Errors as `resume_session`.
    pub fn resume_queued_session(&mut self, request_id: &R, update: SessionUpdate) -> Result<()> {
        self.resume_session(request_id, update)?;
        if let Some(&slot) = self.index.get(request_id) {
            self.deferred.remove(&slot);
        }
        Ok(())
    }

    /// vLLM 0.33's `_update_request_as_session` for a session whose
    /// `WAITING_FOR_STREAMING_REQ` status a caller set by hand on a request queued and never
    /// scheduled (it holds no blocks, none of its tokens computed here): `output_token_ids`
    /// (appended by hand) join its tokens, its last token is dropped, the kept ones and the
    /// chunk make its prompt, and `num_computed_tokens` of them count as computed, as the
    /// caller set them. It stays where it waits in the queue; admission then takes it from
    /// those computed tokens (no prefix lookup, slots for all its tokens at once, vLLM's
    /// branch for a waiting request with `num_computed_tokens > 0`).
    ///
    /// Errors (nothing changed) if the request is unknown, is parked (`resume_session`),
    /// is not a session queued untouched, has no token to drop, counts its last token as
    /// computed (vLLM asserts it is not), or as `resume_session` for the chunk.
    pub fn resume_unparked_session(
        &mut self,
        request_id: &R,
        output_token_ids: &[TokenId],
        num_computed_tokens: usize,
        update: SessionUpdate,
    ) -> Result<()> {
        let slot =
            *(self.index.get(request_id)).ok_or_else(|| Error::unknown_request(request_id))?;
        let request = self.req(slot);
        let untouched = matches!(
            request.status,
            RequestStatus::Waiting | RequestStatus::Preempted
        ) && request.spec.resumable
            && request.num_computed_tokens == 0
            && request.num_external_computed_tokens == 0
            && !request.prompt_is_deferred()
            && !self.parked.contains(&slot)
            && self.kv.block_ids(slot).is_none();
        if !untouched {
            return Err(Error::input(
                "request_id",
                format!("{request_id:?}"),
                "is not a streaming-input session queued untouched (a parked one resumes \
                 with resume_session)",
            ));
        }
        let num_tokens = request.num_tokens() + output_token_ids.len();
        let Some(keep_end) = num_tokens.checked_sub(1) else {
            return Err(Error::input(
                "num_computed_tokens",
                num_computed_tokens,
                format!("session {request_id:?} has no token to drop (vLLM asserts one)"),
            ));
        };
        if num_computed_tokens > keep_end {
            return Err(Error::input(
                "num_computed_tokens",
                num_computed_tokens,
                format!(
                    "covers the last token of session {request_id:?} (at most {keep_end}; \
                     vLLM 0.33's _update_request_as_session asserts it)"
                ),
            ));
        }
        // The chunk's items go after the kept tokens, as a parked session's do; admission
        // schedules them from the computed tokens set (an arrival's path, `admit_computed`).
        self.check_chunk(slot, keep_end, &update)?;
        let request = self.req_mut(slot);
        request.all_token_ids.extend_from_slice(output_token_ids);
        request.num_computed_tokens = num_computed_tokens;
        self.take_chunk(slot, keep_end, update);
        // vLLM decrements its parked-session counter, which never counted this one.
        self.num_unparked_resumes += 1;
        Ok(())
    }

    /// The chunk's checks: `max_tokens`, its stop rules, room for an output token under
    /// `max_model_len` once it follows the session's `keep_end` kept tokens, and its
    /// multimodal items placed there, after the session's own (`add_request`'s checks on
    /// them all, over the new prompt).
    fn check_chunk(&self, slot: u32, keep_end: usize, update: &SessionUpdate) -> Result<()> {
        if update.max_tokens == 0 {
            return Err(Error::input("max_tokens", 0, "must be at least 1"));
        }
        let rule = update.repetition_detection.as_ref();
        super::request::check_stop_rules(rule, update.min_tokens)?;
        let num_prompt_tokens = keep_end + update.prompt_token_ids.len();
        let max_prompt = self.config.max_model_len - self.config.num_sampled_tokens_per_step;
        if num_prompt_tokens > max_prompt {
            return Err(Error::input(
                "prompt_token_ids",
                format!("{num_prompt_tokens} tokens with the session's"),
                format!(
                    "must leave room for one output token under max_model_len={}",
                    self.config.max_model_len
                ),
            ));
        }
        if !update.mm_features.is_empty() {
            // An encoder-decoder model's go after the kept tokens too: vLLM 0.33 never
            // encodes them once a token is computed (`schedule_encoder_decoder_inputs`;
            // with its asserts on, its `start_pos == 0` assert fails there instead).
            let mut features = self.req(slot).spec.mm_features.clone();
            features.extend(shifted(&update.mm_features, keep_end));
            self.check_mm_items(&features, num_prompt_tokens)?;
        }
        Ok(())
    }

    /// The session's tokens past `keep_end` are dropped, the chunk's appended as prompt,
    /// and its settings replace the session's; it waits (`Waiting`) as a new arrival in
    /// the order of arrivals, where it is in the queue.
    fn take_chunk(&mut self, slot: u32, keep_end: usize, update: SessionUpdate) {
        let seq = self.next_arrival_seq;
        self.next_arrival_seq += 1;
        let block_size = self.config.block_size;
        let request = self.req_mut(slot);
        let gains_mm = request.spec.mm_features.is_empty() && !update.mm_features.is_empty();
        request
            .spec
            .mm_features
            .extend(shifted(&update.mm_features, keep_end));
        request.all_token_ids.truncate(keep_end);
        // A prompt source's hashes past the kept tokens named the dropped ones.
        request.prompt_block_hashes.truncate(keep_end / block_size);
        request
            .all_token_ids
            .extend_from_slice(&update.prompt_token_ids);
        let num_prompt_tokens = request.all_token_ids.len();
        request.num_prompt_tokens = num_prompt_tokens;
        request.spec.max_tokens = update.max_tokens;
        request.spec.arrival_time = update.arrival_time;
        request.spec.eos_token_id = update.eos_token_id;
        request.spec.stop_token_ids = update.stop_token_ids;
        request.spec.ignore_eos = update.ignore_eos;
        request.spec.repetition_detection = update.repetition_detection;
        request.spec.min_tokens = update.min_tokens;
        request.arrival_seq = seq;
        request.is_prefill_chunk = true;
        request.status = RequestStatus::Waiting;
        self.kv.set_num_prompt_tokens(slot, num_prompt_tokens);
        // A session's first items: its steps now join the encoder's per-step scan.
        self.num_mm_requests += usize::from(gains_mm);
    }
}

/// A chunk's items with their offsets moved past the session's `base` kept tokens.
fn shifted(features: &[super::MmFeature], base: usize) -> impl Iterator<Item = super::MmFeature> {
    features.iter().map(move |f| super::MmFeature {
        offset: f.offset + base,
        ..f.clone()
    })
}
