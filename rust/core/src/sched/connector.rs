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

use super::Scheduler;
use super::request::{Request, RequestStatus};
use crate::kv::{BlockId, KvGroupSpec, RequestKey};
use crate::{Error, Result};

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

    /// [`Self::update_state_after_alloc`] with several KV cache groups: each group's block
    /// table (null blocks, id 0, where a group no longer attends). By default the connector
    /// sees the first group's.
    fn update_state_after_alloc_groups(
        &mut self,
        request: &Request<R>,
        block_ids: &[&[BlockId]],
        num_external_tokens: usize,
    ) -> Result<()> {
        let first = block_ids.first().copied().unwrap_or_default();
        self.update_state_after_alloc(request, first, num_external_tokens)
    }

    /// [`Self::request_finished`] with several KV cache groups (vLLM 0.33's
    /// `SupportsHMA.request_finished_all_groups`). By default the connector sees the first
    /// group's blocks.
    fn request_finished_groups(
        &mut self,
        request: &Request<R>,
        block_ids: &[&[BlockId]],
    ) -> Result<bool> {
        let first = block_ids.first().copied().unwrap_or_default();
        self.request_finished(request, first)
    }

    /// Whether the connector's loads restore a lagging recurrent (Mamba) state at a deeper
    /// full-attention hit (vLLM 0.33's `supports_divergent_local_hybrid_hits`): the local
    /// hit beside it is then full attention's, kept when the connector loads past it
    /// (`KvCoordinator::get_computed_blocks_for_connector`). Default: no.
    fn supports_divergent_local_hybrid_hits(&self) -> bool {
        false
    }

    /// The KV cache groups the connector's load restores for `request` (vLLM 0.33's
    /// `get_loaded_kv_cache_group_ids`), asked after it offered tokens with several
    /// groups. `None` (the default): the groups a prefix-cache store holds, every group but
    /// a bounded-replay window; a connector moving the request's own blocks (P/D) restores
    /// every group, the window included, which then needs no replay.
    fn get_loaded_kv_cache_group_ids(
        &mut self,
        request: &Request<R>,
    ) -> Result<Option<Vec<usize>>> {
        let _ = request;
        Ok(None)
    }
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

impl<R: RequestKey> Scheduler<R> {
    /// vLLM 0.33's `_connector_finished` for the request in `slot` (a connector set):
    /// with KV groups what left the windows on the processed-token basis is freed first,
    /// then the connector gets each group's table (empty for a request holding no blocks),
    /// an attention group's clipped to the blocks of its computed tokens
    /// ([`Self::connector_block_tables`]); whether it keeps the blocks for a transfer.
    pub(super) fn connector_finished(&mut self, slot: u32) -> Result<bool> {
        if self.connector.is_none() {
            return Ok(false);
        }
        let tables = self.connector_block_tables(slot);
        let tables: Vec<&[BlockId]> = tables.iter().map(Vec::as_slice).collect();
        let request = self.slots[slot as usize].as_ref().expect("live");
        let connector = self.connector.as_mut().expect("checked");
        if !self.config.is_hybrid() {
            return connector.request_finished(request, tables[0]);
        }
        connector.request_finished_groups(request, &tables)
    }

    /// The block tables `_connector_finished` hands the connector, one per KV group: with
    /// several, first the blocks that left a window on the processed-token basis are freed
    /// (`remove_skipped_blocks`). Then vLLM 0.33's
    /// `KVCacheManager.get_block_ids_for_computed_tokens`: an attention group's table
    /// (full, sliding-window, chunked-local) is clipped to `cdiv(num_computed_tokens,
    /// block_size)` blocks, so lookahead slots and the slots of rejected drafts are not
    /// handed over; a recurrent, cross-attention or HiSparse group's is whole. A request
    /// parked for a load counts the tokens being loaded as computed (vLLM's `schedule()`
    /// sets them so when it parks it).
    pub(super) fn connector_block_tables(&mut self, slot: u32) -> Vec<Vec<BlockId>> {
        let request = self.slots[slot as usize].as_ref().expect("live");
        let processed =
            (request.num_computed_tokens).saturating_sub(self.num_in_flight_tokens(slot));
        let mut num_computed = request.num_computed_tokens;
        if request.status == RequestStatus::WaitingForRemoteKvs {
            num_computed = num_computed.max(self.kv.num_computed_tokens(slot).unwrap_or(0));
        }
        if !self.config.is_hybrid() {
            let blocks = self.kv.block_ids(slot).unwrap_or_default();
            let num_valid = num_computed.div_ceil(self.config.group_block_size(0));
            return vec![blocks[..num_valid.min(blocks.len())].to_vec()];
        }
        self.kv.prune_skipped_blocks(slot, processed);
        let mut tables = self.kv.group_block_ids(slot);
        tables.resize_with(self.config.kv_groups.len(), Vec::new);
        for (i, table) in tables.iter_mut().enumerate() {
            let attention = matches!(
                self.config.kv_groups[i],
                KvGroupSpec::FullAttention
                    | KvGroupSpec::SlidingWindow { .. }
                    | KvGroupSpec::SlidingWindowReplay { .. }
                    | KvGroupSpec::ChunkedLocalAttention { .. }
            );
            if attention {
                table.truncate(num_computed.div_ceil(self.config.group_block_size(i)));
            }
        }
        tables
    }
}

impl<R: RequestKey> Scheduler<R> {
    /// The engine's report of KV transfers that ended since the last one (vLLM's
    /// `KVConnectorOutput`): loads that landed (`finished_recving`) or failed
    /// (`failed_recving`: the request recomputes those tokens), and sends that completed
    /// (`finished_sending`: the finished request's blocks are freed). All-or-nothing: an
    /// id with no such transfer fails the call before anything changes.
    pub fn finish_kv_transfers(
        &mut self,
        finished_recving: &[R],
        finished_sending: &[R],
        failed_recving: &[R],
    ) -> Result<()> {
        let loading = |id: &R| {
            self.index
                .get(id)
                .is_some_and(|&s| self.req(s).status == RequestStatus::WaitingForRemoteKvs)
        };
        let loads = finished_recving.iter().chain(failed_recving);
        let sends = finished_sending.iter().map(|id| (id, false));
        for (id, may_load) in loads.clone().map(|id| (id, true)).chain(sends) {
            let in_flight = (may_load && loading(id)) || self.transfer_holds.contains_key(id);
            if !in_flight {
                return Err(Error::input(
                    "request_id",
                    format!("{id:?}"),
                    "has no KV transfer in flight (not loading, and no finished request's \
                     blocks are held for it)",
                ));
            }
        }
        for id in failed_recving {
            if let Some(&slot) = self.index.get(id) {
                self.failed_loads.insert(slot);
            }
        }
        for id in loads {
            match self.index.get(id) {
                Some(&slot) => {
                    self.landed.insert(slot);
                }
                None => self.release_hold(id)?,
            }
        }
        for id in finished_sending {
            self.release_hold(id)?;
        }
        Ok(())
    }

    /// Whether a request whose asynchronous load failed (`failed_recving`) asks the
    /// connector again when it is next admitted, as vLLM 0.33 does under
    /// `kv_load_failure_policy = "recompute"` (the request, freed with no computed tokens,
    /// is looked up anew, `_update_waiting_for_remote_kv`). Off by default: it recomputes
    /// its prompt without the connector.
    pub fn set_ask_again_after_failed_load(&mut self, on: bool) {
        self.ask_again_after_failed_load = on;
    }

    pub fn ask_again_after_failed_load(&self) -> bool {
        self.ask_again_after_failed_load
    }

    /// Frees the blocks a finished request kept for a transfer (or defers them to the
    /// newest step's fence, as vLLM's `_free_blocks` does: `sched::block_free`).
    fn release_hold(&mut self, request_id: &R) -> Result<()> {
        let Some((slot, last_sched_seq)) = self.transfer_holds.remove(request_id) else {
            return Ok(()); // reported twice in one call
        };
        self.free_or_defer(slot, last_sched_seq)
    }

    /// Hands KV transfers to `connector` (vLLM's scheduler-side KV connector). Needs the
    /// block-hash pool.
    pub fn set_connector(&mut self, connector: Box<dyn super::KvConnector<R>>) -> Result<()> {
        if self.kv.is_radix() {
            return Err(Error::config(
                "prefix_cache",
                "radix",
                "KV connectors need the block-hash pool (prefix_cache = \"block_hash\")",
            ));
        }
        if self.config.num_hash_lookahead_tokens > 0 {
            let lookahead = self.config.num_hash_lookahead_tokens;
            return Err(super::prefix_rules::connector_refusal(lookahead));
        }
        if self.encoder.enc_dec.is_some()
            && self
                .slots
                .iter()
                .flatten()
                .any(|r| !r.spec.mm_features.is_empty())
        {
            return Err(Error::config(
                "connector",
                "a KV connector",
                "an encoder-decoder model's multimodal requests are queued (its encoder \
                 inputs beside a KV connector are not modelled)",
            ));
        }
        self.connector = Some(connector);
        Ok(())
    }

    /// Requests whose KV is loading (`WAITING_FOR_REMOTE_KVS`) and finished requests whose
    /// blocks are kept for a transfer.
    pub fn num_kv_transfers(&self) -> (usize, usize) {
        let loading = self
            .index
            .values()
            .filter(|&&s| self.req(s).status == RequestStatus::WaitingForRemoteKvs)
            .count();
        (loading, self.transfer_holds.len())
    }
}
