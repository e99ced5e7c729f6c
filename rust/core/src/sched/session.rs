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
}

impl<R: RequestKey> Scheduler<R> {
    /// Requests parked between turns (`RequestStatus::WaitingForStreamingInput`).
    pub fn num_parked(&self) -> usize {
        self.parked.len()
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
        if update.max_tokens == 0 {
            return Err(Error::input("max_tokens", 0, "must be at least 1"));
        }
        let rule = update.repetition_detection.as_ref();
        super::request::check_stop_rules(rule, update.min_tokens)?;
        let request = self.req(slot);
        let keep_end = request.num_tokens() - 1;
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
        // vLLM asserts it: the dropped token was never computed.
        debug_assert!(keep_end >= request.num_computed_tokens);
        debug_assert!(self.kv.num_tokens(slot).unwrap_or(0) <= keep_end);
        let seq = self.next_arrival_seq;
        self.next_arrival_seq += 1;
        let block_size = self.config.block_size;
        let request = self.req_mut(slot);
        request.all_token_ids.truncate(keep_end);
        // A prompt source's hashes past the kept tokens named the dropped ones.
        request.prompt_block_hashes.truncate(keep_end / block_size);
        request
            .all_token_ids
            .extend_from_slice(&update.prompt_token_ids);
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
        let holds = request.num_computed_tokens > 0;
        self.kv.set_num_prompt_tokens(slot, num_prompt_tokens);
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
}
