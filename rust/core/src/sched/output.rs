//! What one `schedule()` call decides, in vLLM V1's vocabulary (`SchedulerOutput`), and
//! what the engine reports back after running it.

use crate::kv::{BlockId, TokenId};

/// A request scheduled for the first time, or resumed after preemption (it recomputes, so
/// the engine needs its whole token list and block table again).
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequestData<R> {
    pub request_id: R,
    /// Prompt for a new request; prompt + output so far for a resumed one.
    pub token_ids: Vec<TokenId>,
    /// Its block table (empty with several KV groups: see `group_block_ids`).
    pub block_ids: Vec<BlockId>,
    /// With several KV groups (`SchedulerConfig::kv_groups`), one block table per group
    /// (vLLM's `block_ids` tuple; null blocks, id 0, where a group no longer attends);
    /// empty otherwise.
    pub group_block_ids: Vec<Vec<BlockId>>,
    /// Tokens already computed (prefix-cache hit) before this step.
    pub num_computed_tokens: usize,
    pub lora_id: Option<u64>,
}

/// A request that was running before this step.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedRequestData<R> {
    pub request_id: R,
    /// Blocks appended to its table this step (empty with several KV groups).
    pub new_block_ids: Vec<BlockId>,
    /// With several KV groups, the blocks appended to each group's table this step;
    /// empty otherwise.
    pub new_group_block_ids: Vec<Vec<BlockId>>,
    pub num_computed_tokens: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerOutput<R> {
    pub scheduled_new_reqs: Vec<NewRequestData<R>>,
    pub scheduled_resumed_reqs: Vec<NewRequestData<R>>,
    pub scheduled_running_reqs: Vec<CachedRequestData<R>>,
    /// Tokens per scheduled request, in batch order.
    pub num_scheduled_tokens: Vec<(R, usize)>,
    pub total_num_scheduled_tokens: usize,
    /// Draft tokens to verify this step, per request that has them.
    pub scheduled_spec_decode_tokens: Vec<(R, Vec<TokenId>)>,
    pub preempted_req_ids: Vec<R>,
    /// Requests that finished (or were aborted) since the previous step.
    pub finished_req_ids: Vec<R>,
    /// KV loads that began this step; their requests wait in `WAITING_FOR_REMOTE_KVS`
    /// until `Scheduler::finish_kv_transfers` reports them landed.
    pub kv_loads: Vec<super::KvLoad<R>>,
    /// Per request whose items the encoder runs this step, their indices in its
    /// `mm_features` (vLLM's `scheduled_encoder_inputs`), in scheduling order.
    pub scheduled_encoder_inputs: Vec<(R, Vec<usize>)>,
    /// Identifiers the encoder cache evicted since the last step (vLLM's
    /// `free_encoder_mm_hashes`): the worker drops those outputs.
    pub free_encoder_mm_hashes: Vec<String>,
}

/// The engine's result for one request of a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampledOutput<R> {
    pub request_id: R,
    /// Accepted tokens, in order (none for a chunk that did not finish the prompt).
    pub token_ids: Vec<TokenId>,
    /// Speculative tokens scheduled this step that the model rejected.
    pub num_rejected_tokens: usize,
    /// Drafts proposed for the next step.
    pub spec_token_ids: Vec<TokenId>,
}

/// Counters since the scheduler was built, plus the current queue sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SchedulerStats {
    pub num_waiting: usize,
    /// Of `num_waiting`, those the admission scan skipped (vLLM 0.33's `deferred_waiting`,
    /// its stats' `num_skipped_waiting_reqs`).
    pub num_deferred_waiting: usize,
    pub num_running: usize,
    pub kv_usage: f64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    pub num_steps: u64,
}
