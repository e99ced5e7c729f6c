//! KV connectors, scheduler side (vLLM V1's `KVConnectorBase_V1`; seed 004 §7.3): an object
//! that knows of KV outside this pool — a prefill instance's cache in disaggregated serving,
//! a host-memory or remote tier — and moves it in and out.
//!
//! The scheduler asks it at admission how many tokens after the local prefix hit it can
//! load (`get_num_new_matched_tokens`). An asynchronous load parks the request in
//! `WAITING_FOR_REMOTE_KVS` with blocks allocated for those tokens; the engine reports the
//! load finished (or failed: the request then recomputes) through
//! `Scheduler::finish_kv_transfers`. When a request finishes, the connector may keep its
//! blocks until their send completes (`request_finished` returns `true`). Loaded blocks
//! enter the prefix cache only once they have landed.

use super::request::Request;
use crate::Result;
use crate::kv::BlockId;

/// What a connector can load for a request: `num_tokens` after its local prefix hit, and
/// whether the load runs asynchronously (the request waits in `WAITING_FOR_REMOTE_KVS`)
/// or lands before the step that computes the rest (vLLM's `load_kv_async`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExternalTokens {
    pub num_tokens: usize,
    pub load_async: bool,
}

/// vLLM V1's scheduler-side connector interface (the three calls its `Scheduler` makes).
pub trait KvConnector<R>: Send + Sync {
    /// Tokens after `num_computed_tokens` (the local prefix hit) that can be loaded from
    /// outside; `None` when the connector cannot tell yet (the request keeps its place and
    /// is asked again next step). Asked whenever a request with nothing computed is
    /// admitted, including after a preemption.
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<R>,
        num_computed_tokens: usize,
    ) -> Result<Option<ExternalTokens>>;

    /// Blocks were allocated for an admitted request: its whole block table, of which
    /// `num_external_tokens` (after the local hit) are to be loaded.
    fn update_state_after_alloc(
        &mut self,
        request: &Request<R>,
        block_ids: &[BlockId],
        num_external_tokens: usize,
    ) -> Result<()> {
        // A connector that loads nothing asynchronously has nothing to track.
        let _ = (request, block_ids, num_external_tokens);
        Ok(())
    }

    /// The request finished while holding `block_ids`. `true`: the connector is sending
    /// them; the scheduler keeps them until the engine reports the send finished.
    fn request_finished(&mut self, request: &Request<R>, block_ids: &[BlockId]) -> Result<bool>;
}

/// A load that began this step (tokenyard's addition to `SchedulerOutput`; vLLM hands it to
/// the workers inside its connector metadata).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLoad<R> {
    pub request_id: R,
    /// Tokens the connector loads (after the local and host-tier hits).
    pub num_external_tokens: usize,
    /// Tokens loaded from the pool's host-memory tier.
    pub num_host_tokens: usize,
}
