//! A request as the step scheduler tracks it: `num_tokens = prompt + output`, of which
//! `num_computed_tokens` have KV in the cache; the scheduler's one rule is to give each
//! request tokens until it catches up.

use super::outside_wait::OutsideWait;
use crate::kv::{BlockHash, TokenId};

/// A draft the scheduler makes up when it pads a newly admitted one-token request to
/// `1 + num_speculative_tokens` tokens (`SchedulerConfig::pad_spec_decode`): vLLM 0.33's
/// `-1`, which no model samples, so it is always rejected.
pub const PLACEHOLDER_DRAFT: TokenId = TokenId::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    Waiting,
    /// Waiting for KV that a connector is loading (vLLM's `WAITING_FOR_REMOTE_KVS`): it
    /// holds blocks for the tokens being loaded and stays in the waiting queue.
    WaitingForRemoteKvs,
    Running,
    Preempted,
    /// A resumable request whose turn stopped, parked with its blocks until its next input
    /// chunk (vLLM 0.33's `WAITING_FOR_STREAMING_REQ`; `sched::session`): in neither the
    /// waiting queue nor the running list, but it keeps its model-runner slot.
    WaitingForStreamingInput,
    Finished(FinishReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Reached `max_tokens` or `max_model_len`.
    Length,
    /// Sampled the EOS token or a stop token.
    Stop,
    Abort,
    /// vLLM 0.33's `FINISHED_ERROR`: an item's identifier was cached with another
    /// embedding count (`sched::encoder`).
    Error,
    /// vLLM 0.33's `FINISHED_REPETITION`: its outputs end in a repeated pattern
    /// ([`RepetitionDetection`]).
    Repetition,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
            FinishReason::Repetition => "repetition",
        }
    }
}

/// What the caller says about a new request.
#[derive(Debug, Clone, Default)]
pub struct RequestSpec {
    /// Moved into `Request::all_token_ids` when the scheduler takes the request (one copy
    /// of a long prompt, not two); empty in a queued request's spec.
    pub prompt_token_ids: Vec<TokenId>,
    pub max_tokens: usize,
    pub priority: i64,
    pub arrival_time: f64,
    pub eos_token_id: Option<TokenId>,
    pub stop_token_ids: Vec<TokenId>,
    pub ignore_eos: bool,
    pub lora_id: Option<u64>,
    /// The caller's own id for the request, shown to policy plugins instead of the key
    /// (the simulator's workload position).
    pub external_id: Option<u64>,
    /// A prompt given by length only (`prompt_token_ids` empty): the scheduler's
    /// [`PromptSource`] makes its tokens when they are first needed. 0: the prompt is
    /// `prompt_token_ids`.
    pub num_deferred_prompt_tokens: usize,
    /// Its multimodal items, sorted by offset (`sched::encoder`); empty for a text prompt.
    pub mm_features: Vec<super::MmFeature>,
    /// Prompt tokens whose KV is already computed when it arrives (vLLM 0.33's request
    /// added with `num_computed_tokens > 0`: a P/D decode side's). Its first admission
    /// counts them as computed, with no prefix lookup and no connector query, and
    /// allocates new blocks for them with its first chunk; once preempted it recomputes
    /// them. Less than the prompt.
    pub num_computed_tokens: usize,
    /// A streaming-input session (vLLM 0.33's `Request.resumable`): when a turn stops it is
    /// parked with its blocks instead of finishing, and `Scheduler::resume_session` extends
    /// its prompt with the next input chunk (`sched::session`).
    pub resumable: bool,
    /// Stops the request when its outputs end in a repeated pattern (vLLM 0.33's
    /// `SamplingParams.repetition_detection`); `None`: never.
    pub repetition_detection: Option<RepetitionDetection>,
    /// Outputs before which repetition is not checked (vLLM 0.33's `min_tokens`, which
    /// `check_stop` tests after EOS, the stop ids and the length, so it defers only this
    /// rule; vLLM's sampler keeps EOS and stop ids from being sampled before it).
    pub min_tokens: usize,
}

/// A request's repetition rule and `min_tokens`: the rule's settings as vLLM accepts them,
/// and `min_tokens` only beside a rule (it defers nothing else).
pub(super) fn check_stop_rules(
    rule: Option<&RepetitionDetection>,
    min_tokens: usize,
) -> crate::Result<()> {
    match rule {
        Some(rule) => rule.check(),
        None if min_tokens > 0 => Err(crate::Error::input(
            "min_tokens",
            min_tokens,
            "defers only repetition detection (vLLM 0.33's check_stop): set \
             repetition_detection or leave min_tokens 0",
        )),
        None => Ok(()),
    }
}

/// vLLM 0.33's `RepetitionDetectionParams` as `check_sequence_repetition`
/// (`v1/core/sched/utils.py`) applies them to a request's output tokens after each
/// appended token: for each pattern length `n` from `min_pattern_size` (0 counts as 1) up
/// to `max_pattern_size`, while `n * min_count` outputs exist, the last `n` outputs
/// repeated `min_count` times in a row end the outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepetitionDetection {
    pub max_pattern_size: usize,
    pub min_pattern_size: usize,
    pub min_count: usize,
}

impl RepetitionDetection {
    /// The settings vLLM accepts (`RepetitionDetectionParams.__post_init__`): the sizes
    /// ordered, and with `max_pattern_size > 0` a `min_count` of at least 2.
    pub fn check(&self) -> crate::Result<()> {
        if self.min_pattern_size > self.max_pattern_size {
            return Err(crate::Error::input(
                "repetition_detection",
                format!("{self:?}"),
                "min_pattern_size must not exceed max_pattern_size",
            ));
        }
        if self.max_pattern_size > 0 && self.min_count < 2 {
            return Err(crate::Error::input(
                "repetition_detection",
                format!("{self:?}"),
                "min_count must be at least 2 (max_pattern_size 0 disables detection)",
            ));
        }
        Ok(())
    }

    /// Whether `outputs` end in a pattern repeated `min_count` times (vLLM 0.33's
    /// `check_sequence_repetition`, same order and early exit).
    pub fn detects(&self, outputs: &[TokenId]) -> bool {
        let (max, count) = (self.max_pattern_size, self.min_count);
        if max == 0 || count < 2 {
            return false;
        }
        for len in self.min_pattern_size.max(1)..=max {
            if len * count > outputs.len() {
                return false;
            }
            // The last `len * count` outputs are the last `len` repeated (vLLM's
            // `_has_repeating_pattern`).
            let tail = &outputs[outputs.len() - len * count..];
            let pattern = &tail[tail.len() - len..];
            if tail.chunks_exact(len).all(|chunk| chunk == pattern) {
                return true;
            }
        }
        false
    }
}

/// A prompt a [`PromptSource`] made: its tokens, and optionally the block hashes of its
/// first full blocks (under the scheduler's `block_size` and the request's `lora_id` as
/// extra key), which spare the pool hashing those blocks. They may run past the prompt,
/// into outputs whose tokens the source knows ahead. Either they are exactly what the
/// block-hash pool would compute from the tokens, or the source names blocks by content
/// in its own way (`kv::hash_block_id`): then it must name *every* block of that content
/// so, in every request it makes, since the pool hashes the blocks after these from their
/// tokens. The request keeps them across preemption (vLLM's `Request.block_hashes`), so
/// the pool never hashes those blocks itself, nor reads their tokens: under a lean
/// scheduler (`Scheduler::set_lean_output`), which hands out no token ids, a source may
/// leave those tokens 0 (the simulator does). Exception: a request that arrives with
/// computed tokens (`RequestSpec::num_computed_tokens`) is admitted without a lookup and
/// hashed from its tokens, so a source naming blocks its own way must not be combined
/// with such requests (the simulator's are not).
#[derive(Debug, Clone, Default)]
pub struct DeferredPrompt {
    pub token_ids: Vec<TokenId>,
    pub block_hashes: Vec<BlockHash>,
}

/// Makes the tokens of prompts given by length only
/// (`RequestSpec::num_deferred_prompt_tokens`), at the request's first admission attempt.
/// A simulator whose replicas queue thousands of requests then holds a prompt's tokens
/// only from its admission on, not from its arrival.
pub trait PromptSource<R>: Send + Sync {
    /// The `num_tokens`-token prompt of `request_id` (asked once per request).
    fn prompt(&mut self, request_id: &R, num_tokens: usize) -> DeferredPrompt;
    /// The source as its own type, for its owner (`Scheduler::prompt_source_mut`).
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

#[derive(Debug, Clone)]
pub struct Request<R> {
    pub request_id: R,
    pub spec: RequestSpec,
    /// Prompt then output token ids; empty while a deferred prompt
    /// (`RequestSpec::num_deferred_prompt_tokens`) waits for its first admission attempt.
    pub all_token_ids: Vec<TokenId>,
    /// The prompt's length: `all_token_ids[..num_prompt_tokens]` is the prompt.
    pub num_prompt_tokens: usize,
    pub num_computed_tokens: usize,
    pub status: RequestStatus,
    /// Draft tokens proposed for the next step (speculative decoding).
    pub spec_token_ids: Vec<TokenId>,
    /// Output tokens scheduled but not yet returned (async scheduling): as in vLLM 0.33,
    /// each sampling step in flight counts its sampled token and its drafts.
    pub num_output_placeholders: usize,
    /// Each step in flight in which this request samples, as (the step's number,
    /// `Scheduler::num_steps` when it was formed; the tokens it scheduled), oldest first
    /// (vLLM 0.33's `num_in_flight_tokens`, by step, of the sampling steps):
    /// `update_from_output` accepts tokens for it only while one is in flight, and caches
    /// blocks up to the tokens of the steps that landed.
    pub in_flight_tokens: std::collections::VecDeque<(u64, usize)>,
    /// The most draft tokens any of those steps verifies: a step's output holds at most
    /// one more token than its drafts.
    pub max_spec_in_flight: usize,
    /// Under async scheduling with window groups, (step, tokens) of each step that served
    /// it, sampling or not, oldest first; those of steps not yet updated are vLLM 0.33's
    /// `num_in_flight_tokens` (`Scheduler::num_in_flight_tokens`).
    pub unlanded_steps: std::collections::VecDeque<(u64, usize)>,
    pub num_preemptions: u32,
    /// Draft tokens scheduled in the request's latest step: at most this many can be
    /// rejected.
    pub last_num_spec_tokens: usize,
    /// Its latest step left known tokens (or outputs in flight) to compute: it did not
    /// sample (vLLM's `is_prefill_chunk`). Drafts proposed for it are dropped, and a step
    /// serving it pads no admission.
    pub is_prefill_chunk: bool,
    /// Order of arrival at this scheduler: the FCFS key and the priority tie-break.
    pub arrival_seq: u64,
    /// Tokens a KV connector loaded for it at its latest admission (vLLM's
    /// `num_external_computed_tokens`).
    pub num_external_computed_tokens: usize,
    /// A connector's load for it failed: it recomputes, and the connector is not asked again.
    pub kv_load_failed: bool,
    /// Its prefill is in flight (vLLM 0.33's `Scheduler._inflight_prefills`): an
    /// asynchronous KV load began, or it was admitted with prompt left past its chunk; it
    /// leaves once a step it is in samples, or when it is preempted or ends. The blocks
    /// such requests still need for their whole sequence are kept free when a load starts.
    pub inflight_prefill: bool,
    /// The latest step that served it, numbered while block frees are deferred (vLLM
    /// 0.33's `last_sched_seq`; `Scheduler::sched_step_seq`), else 0.
    pub last_sched_seq: u64,
    /// Block hashes its [`PromptSource`] gave with the prompt (`DeferredPrompt`), kept for
    /// every lookup of the request, preempted or not.
    pub prompt_block_hashes: Vec<BlockHash>,
    /// Where the replay of its latest prefix hit starts (vLLM 0.33's
    /// `Request.replay_start`, SWA bounded replay): the hit's tokens from here on are
    /// recomputed to rebuild a `SlidingWindowReplay` group; 0 without replay.
    pub replay_start: usize,
    /// vLLM 0.33's `Request.shared_prefix_boundary`, set by each prefix lookup: where the
    /// longest single KV group's hit ends when it runs past the hit the groups agree on (a
    /// shared prefix a Mamba `align` group has no state for yet), else 0. The Mamba
    /// `align` split stops a chunk at its block-floored position.
    pub shared_prefix_boundary: usize,
    /// The latest step that served it (`Scheduler::num_steps` then); at its latest
    /// preemption (or park), that step: its outputs up to it are stale; and whether they
    /// are dropped rather than delivered (vLLM 0.33's `drop_stale_output`; `sched::stale`).
    pub last_step: u64,
    pub stale_until_step: u64,
    pub drop_stale_output: bool,
    /// A wait its caller decides (`sched::outside_wait`, [`OutsideWait`]); `None` for the
    /// rest.
    pub outside_wait: OutsideWait,
}

impl<R> Request<R> {
    /// Steps in flight in which this request samples.
    pub fn num_sampling_steps(&self) -> usize {
        self.in_flight_tokens.len()
    }

    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// The prompt's tokens (empty for a deferred prompt not yet made).
    pub fn prompt_token_ids(&self) -> &[TokenId] {
        &self.all_token_ids[..self.num_prompt_tokens.min(self.all_token_ids.len())]
    }

    pub fn num_tokens(&self) -> usize {
        // A deferred prompt counts before its tokens exist.
        self.all_token_ids.len().max(self.num_prompt_tokens)
    }

    pub fn num_output_tokens(&self) -> usize {
        self.num_tokens() - self.num_prompt_tokens
    }

    /// Whether the prompt is deferred and not made yet.
    pub fn prompt_is_deferred(&self) -> bool {
        self.all_token_ids.len() < self.num_prompt_tokens
    }

    /// Tokens the request still needs computed: known ones, drafts and in-flight outputs.
    /// None once the outputs in flight already reach `max_tokens` (async scheduling).
    pub fn num_pending_tokens(&self) -> usize {
        // vLLM 0.33: (computed + 1) - (placeholders - 1) tokens are certain even if every
        // draft in flight is rejected; at max_tokens no further step is needed.
        if self.num_output_placeholders > 0
            && self.num_computed_tokens + 2
                >= self.num_output_placeholders + self.num_prompt_tokens + self.spec.max_tokens
        {
            return 0;
        }
        (self.num_tokens() + self.spec_token_ids.len() + self.num_output_placeholders)
            .saturating_sub(self.num_computed_tokens)
    }

    /// Whether the request is still computing its prompt (its next step is not a decode).
    pub fn is_prefilling(&self) -> bool {
        self.num_computed_tokens < self.num_prompt_tokens()
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.status, RequestStatus::Finished(_))
    }
}
