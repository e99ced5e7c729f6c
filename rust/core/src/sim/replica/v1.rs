//! `vllm_v1`: the step scheduler of `crate::sched` (vLLM V1 semantics: token budget,
//! chunked prefill, running-first with preemption, prefix caching) driving a replica. A
//! batch is one `schedule()`; its end reports one sampled token per request that caught
//! up with its known tokens. With pipeline stages the scheduler runs ahead (each request in
//! one batch at a time, as vLLM does without async scheduling). With speculative decoding
//! (`crate::sim::spec`) a batch's end emits each sampler's accepted drafts too.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use super::{BatchPlan, PdRole, ReplicaPolicy};
use crate::Result;
use crate::kv::{BlockId, KvEvent, TokenId};
use crate::sched::{
    DecodeWindow, DeferredPrompt, ExternalTokens, KvConnector, KvLoad, PolicyPlugin, PrefixCache,
    PromptSource, Request, RequestSpec, Scheduler, SchedulerConfig, SchedulerOutput,
};
use crate::sim::arena::Requests;
use crate::sim::batch::Batch;
use crate::sim::lora::{AdapterCache, LoraConfig, LoraShape};
use crate::sim::request::{ReqIdx, RestartMode, SimRequest};
use crate::sim::spec::{SpecConfig, SpecDecoder};

#[path = "v1_window.rs"]
mod window;
use crate::sim::tokens::{
    BlockTokens, IdBlockHashes, MEMO_HASHES, MEMO_TOKENS, PromptMemos, Shared, TraceBlockHashes,
    lock, num_id_tokens, shared_output_token,
};
use window::Window;

/// The token a simulated step samples unless the request's block ids cover its output (a
/// conversation turn; see `shared_output_token`). Its value is never looked at: EOS is
/// ignored.
const SAMPLED_TOKEN: u32 = 1;

pub struct VllmV1 {
    scheduler: Scheduler<ReqIdx>,
    hash_block_size: u32,
    /// Per batch in flight, oldest first: the requests that sample at its end (the step
    /// caught them up with their known tokens). With pipeline stages a request may be in
    /// two batches (two chunks of one prompt); only the batch that caught it up samples.
    /// A request preempted before its batch ends is struck off (its step's work is
    /// discarded and recomputed). Each with its scheduler slot, a hint for
    /// `append_one_token_each_at`.
    samplers: VecDeque<Vec<(ReqIdx, u32)>>,
    /// Emptied lists, reused so a step allocates nothing.
    spare: Vec<Vec<(ReqIdx, u32)>>,
    /// GPU slots and host cache of LoRA adapters (`[replica.lora]`; `sim::lora`).
    adapters: Option<AdapterCache>,
    /// Speculative decoding, when configured.
    spec: Option<SpecDecoder>,
    role: PdRole,
    /// Requests whose KV load began and that have not been admitted since, with the tokens
    /// the load takes from the host tier.
    loading: FxHashMap<ReqIdx, u32>,
    kv_loads: Vec<KvLoad<ReqIdx>>,
    /// Coalesced decode steps (`crate::sched::multistep`), when enabled: the window in
    /// progress, if any.
    coalesce: bool,
    window: Option<Window>,
    /// The last window's plan, whose buffers the next one reuses.
    spare_plan: DecodeWindow,
    /// Vectors of ended batches, for the next window steps' plans.
    spare_batches: Vec<BatchPlan>,
    /// Whether the batch formed last is a window step (`batch_is_window_step`).
    window_batch: bool,
}

/// The replica's prompts, made at admission rather than arrival (`sched::PromptSource`): a
/// queued request holds its block ids, not its tokens, so an overloaded replica's memory
/// does not grow with its queue.
struct Prompts {
    /// Synthesizes prompts, generating a popular block's tokens once (the memo is shared
    /// with the other replicas, `PromptMemos`).
    tokens: Shared<BlockTokens>,
    /// How the prompts' first KV blocks are hashed for the pool; `None` when the
    /// scheduler's pool takes no hashes or its blocks do not tile trace blocks.
    hashes: Option<PromptHashes>,
    /// The requests added and not admitted yet.
    pending: FxHashMap<ReqIdx, PendingPrompt>,
}

/// How a replica's prompt source hashes the KV blocks inside trace blocks.
enum PromptHashes {
    /// Named by trace block id (the block-hash pool): every block inside the request's id
    /// tokens, the prompt's and the shared outputs' (`tokens::num_id_tokens`), as the
    /// router's prefix index names them (`tokens::prompt_block_hashes`).
    Ids(IdBlockHashes),
    /// Hashed from the tokens, a popular trace block once (shared with the other
    /// replicas): the KV groups' coordinator, which hashes each group's blocks itself.
    Tokens(Shared<TraceBlockHashes>),
}

/// What a queued request's prompt is made from.
struct PendingPrompt {
    id: u64,
    num_prefill_tokens: u32,
    /// Its tokens from the first that its block ids give (`tokens::num_id_tokens`).
    num_id_tokens: usize,
    hash_ids: Vec<u64>,
    /// The block hashes' extra key (the scheduler's: the LoRA adapter).
    lora_id: Option<u64>,
    /// Room for the outputs: the scheduler appends them to the prompt's vector.
    room: usize,
    /// A decode replica's prompt ends with the first token, sampled on the prefill replica.
    first_token: Option<TokenId>,
}

impl PromptSource<ReqIdx> for Prompts {
    fn prompt(&mut self, idx: &ReqIdx, _num_tokens: usize) -> DeferredPrompt {
        let Some(p) = self.pending.remove(idx) else {
            return DeferredPrompt::default();
        };
        // Tokens of the blocks named by id are read by no one (the pool skips the tokens
        // its hashes cover; a lean scheduler hands out no token ids): left 0.
        let num_unread = match &self.hashes {
            Some(PromptHashes::Ids(ids)) => ids.num_named_tokens(p.num_id_tokens),
            _ => 0,
        };
        let (id, num_tokens, room) = (p.id, p.num_prefill_tokens, p.room);
        let mut token_ids =
            lock(&self.tokens).prompt_after(id, num_tokens, &p.hash_ids, room, num_unread);
        let mut block_hashes = Vec::new();
        match &self.hashes {
            Some(PromptHashes::Ids(ids)) => {
                ids.extend(&mut block_hashes, &p.hash_ids, p.num_id_tokens, p.lora_id);
            }
            Some(PromptHashes::Tokens(memo)) => {
                lock(memo).extend(&mut block_hashes, &token_ids, &p.hash_ids, p.lora_id);
            }
            None => {}
        }
        token_ids.extend(p.first_token);
        DeferredPrompt {
            token_ids,
            block_hashes,
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// A prefill replica's connector: nothing to load; every finished request keeps its
/// blocks until its KV has been sent to a decode replica (`finish_kv_transfer`).
struct SendsToDecode;

impl KvConnector<ReqIdx> for SendsToDecode {
    fn get_num_new_matched_tokens(
        &mut self,
        _request: &Request<ReqIdx>,
        _num_computed_tokens: usize,
    ) -> Result<Option<ExternalTokens>> {
        Ok(Some(ExternalTokens::default()))
    }

    fn request_finished(
        &mut self,
        _request: &Request<ReqIdx>,
        _blocks: &[BlockId],
    ) -> Result<bool> {
        Ok(true)
    }
}

/// A decode replica's connector: a request arrives as its prompt plus the first token the
/// prefill replica sampled; the prompt's KV (what the local prefix cache lacks of it) is
/// loaded asynchronously, and the first token is computed here. A request preempted on
/// this replica recomputes everything: the prefill replica's copy is gone.
struct ReceivesFromPrefill;

impl KvConnector<ReqIdx> for ReceivesFromPrefill {
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<ReqIdx>,
        num_computed_tokens: usize,
    ) -> Result<Option<ExternalTokens>> {
        let prompt = request.num_prompt_tokens() - 1;
        let num_tokens = if request.num_preemptions > 0 {
            0
        } else {
            prompt.saturating_sub(num_computed_tokens)
        };
        Ok(Some(ExternalTokens {
            num_tokens,
            load_async: true,
        }))
    }

    fn request_finished(
        &mut self,
        _request: &Request<ReqIdx>,
        _blocks: &[BlockId],
    ) -> Result<bool> {
        Ok(false)
    }
}

impl VllmV1 {
    pub fn new(config: SchedulerConfig, hash_block_size: u32, kv_events: bool) -> Result<Self> {
        // Only the block-hash pool takes hashes, and only with caching on; under a hash
        // look-ahead (EAGLE/MTP drafters) it hashes each block with the tokens past it
        // itself, so the prompts carry every token (none left unread for named hashes).
        let takes_hashes = config.enable_prefix_caching
            && config.prefix_cache == PrefixCache::BlockHash
            && config.num_hash_lookahead_tokens == 0;
        let hashes = match takes_hashes {
            false => None,
            true if config.is_hybrid() => {
                TraceBlockHashes::new(hash_block_size, config.block_size, MEMO_HASHES)
                    .map(|memo| PromptHashes::Tokens(Arc::new(Mutex::new(memo))))
            }
            true => IdBlockHashes::new(hash_block_size, config.block_size).map(PromptHashes::Ids),
        };
        if kv_events && config.is_hybrid() {
            return Err(crate::Error::config(
                "hybrid_kv_cache_manager",
                "true",
                "prefix_affinity routing reads the replicas' KV cache events, which the KV \
                 groups' coordinator does not record: set replica.hybrid_kv_cache_manager = \
                 false, or another global scheduler",
            ));
        }
        let mut scheduler = Scheduler::new(config, false)?;
        scheduler.set_lean_output(true);
        if kv_events {
            scheduler.enable_kv_events();
        }
        scheduler.set_prompt_source(Box::new(Prompts {
            tokens: Arc::new(Mutex::new(BlockTokens::new(hash_block_size, MEMO_TOKENS))),
            hashes,
            pending: FxHashMap::default(),
        }));
        Ok(Self {
            scheduler,
            hash_block_size,
            samplers: VecDeque::new(),
            spare: Vec::new(),
            adapters: None,
            spec: None,
            role: PdRole::Aggregated,
            loading: FxHashMap::default(),
            kv_loads: Vec::new(),
            coalesce: false,
            window: None,
            spare_plan: DecodeWindow::default(),
            spare_batches: Vec::new(),
            window_batch: false,
        })
    }

    /// Turns on speculative decoding (replica `replica`'s draws of `seed`). The scheduler's
    /// config must reserve the drafts' lookahead slots (`sim::spec::scheduler_config`).
    pub fn with_speculative(mut self, spec: &SpecConfig, seed: u64, replica: u32) -> Self {
        let k = spec.num_speculative_tokens;
        debug_assert_eq!(self.scheduler.config().num_speculative_tokens, k as usize);
        debug_assert_eq!(
            self.scheduler.config().num_lookahead_tokens,
            spec.method.num_lookahead_tokens(k) as usize
        );
        self.spec = Some(SpecDecoder::new(spec, seed, replica));
        self
    }
}

impl VllmV1 {
    /// The prompt source this replica gave its scheduler.
    fn prompts_mut(&mut self) -> &mut Prompts {
        let source = self.scheduler.prompt_source_mut();
        let source = source.expect("set by VllmV1::new").as_any_mut();
        source.downcast_mut().expect("the replica's own")
    }

    /// The adapter cache of `config`, whose GPU slots must be the step scheduler's
    /// `max_loras` gate (a batch never needs more adapters than there are slots).
    fn lora_cache(&self, config: &LoraConfig) -> Result<AdapterCache> {
        let gate = self.scheduler.config().max_loras;
        if gate != config.max_loras as usize {
            return Err(crate::Error::config(
                "replica.scheduler.vllm_v1.max_loras",
                gate,
                format!(
                    "must equal replica.lora.max_loras = {} (the GPU slots)",
                    config.max_loras
                ),
            ));
        }
        AdapterCache::new(config.clone())
    }
}

impl VllmV1 {
    /// The requests a step admitted: their prefix-cache hits count as processed (they are
    /// computed without running), and a decode replica's hand-over is noted.
    fn note_admissions(&mut self, out: &SchedulerOutput<ReqIdx>, requests: &mut Requests) {
        for admitted in out
            .scheduled_new_reqs
            .iter()
            .chain(&out.scheduled_resumed_reqs)
        {
            let request = requests.get_mut(admitted.request_id);
            let host_tokens = self.loading.remove(&admitted.request_id);
            let restarted_here = request.num_restarts > request.kv.restarts_at_handover;
            if self.role == PdRole::Decode && !restarted_here {
                // Handed over with its prompt and first token processed; what it loaded or
                // hit here is that same work. With nothing loaded, the prefill replica may
                // let the request's blocks go now.
                if host_tokens.is_none() {
                    self.kv_loads.push(KvLoad {
                        request_id: admitted.request_id,
                        num_external_tokens: 0,
                        num_host_tokens: 0,
                    });
                }
                continue;
            }
            let hit = admitted.num_computed_tokens as u32;
            if request.num_restarts == 0 {
                request.prefix_hit_tokens = hit;
                // A load covering the whole prompt leaves its last token to compute.
                request.kv.host_hit_tokens = host_tokens.unwrap_or(0).min(hit);
            }
            request.num_processed_tokens += hit;
        }
    }
}

/// The token `request` samples at `position`.
fn output_token(request: &SimRequest, position: u64, hash_block_size: u32) -> TokenId {
    shared_output_token(
        request.original_prefill_tokens,
        position,
        &request.hash_ids,
        hash_block_size,
    )
    .unwrap_or(SAMPLED_TOKEN)
}

impl ReplicaPolicy for VllmV1 {
    fn add_request(&mut self, requests: &mut Requests, idx: ReqIdx) -> Result<()> {
        let request = requests.get(idx);
        let (max_tokens, first_token) = match self.role {
            PdRole::Aggregated => (request.num_decode_tokens, None),
            PdRole::Prefill => (1, None),
            PdRole::Decode => {
                // The prompt and the first token, sampled on the prefill replica.
                let first = request.num_prefill_tokens as u64;
                let token = output_token(request, first, self.hash_block_size);
                (request.num_decode_tokens - 1, Some(token))
            }
        };
        let pending = PendingPrompt {
            id: request.id,
            num_prefill_tokens: request.num_prefill_tokens,
            num_id_tokens: num_id_tokens(
                request.num_prefill_tokens,
                request.original_prefill_tokens,
                &request.hash_ids,
                self.hash_block_size,
            ),
            hash_ids: request.hash_ids.clone(),
            lora_id: request.lora_id,
            room: request.num_decode_tokens as usize,
            first_token,
        };
        let num_prompt_tokens =
            request.num_prefill_tokens as usize + usize::from(first_token.is_some());
        let spec = RequestSpec {
            num_deferred_prompt_tokens: num_prompt_tokens,
            max_tokens: max_tokens as usize,
            arrival_time: request.arrived_at,
            ignore_eos: true,
            external_id: Some(request.id),
            lora_id: request.lora_id,
            ..RequestSpec::default()
        };
        // Kept only once the scheduler took the request: a refused one leaves nothing.
        self.scheduler.add_request(idx, spec)?;
        self.prompts_mut().pending.insert(idx, pending);
        if let Some(window) = &mut self.window
            && !self.scheduler.window_admits(&window.plan)
        {
            // A new request changes the next step, which this window cannot admit it in
            // (`crate::sched::multistep_admit`): the window ends with the step in flight,
            // or now if none is (its last step ended, its state is caught up first).
            if window.num_ended < window.plan.num_formed() {
                window.plan.cut();
            } else {
                let window = self.window.take().expect("checked above");
                self.end_window_early(window, requests)?;
            }
        }
        Ok(())
    }

    fn next_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        if let Some(plan) = self.coalesced_step(requests)? {
            self.window_batch = true;
            return Ok(Some(plan));
        }
        self.window_batch = false;
        let out = self.scheduler.schedule()?;
        for &idx in &out.preempted_req_ids {
            requests.get_mut(idx).restart(RestartMode::Recompute);
            // A preempted request may have been waiting with a landed load (see
            // `Scheduler::release_landed_loads`): that load is not a hit any more.
            self.loading.remove(&idx);
            for list in &mut self.samplers {
                list.retain(|&(i, _)| i != idx);
            }
            if let Some(spec) = &mut self.spec {
                spec.strike(idx);
            }
        }
        self.kv_loads.extend(out.kv_loads.iter().cloned());
        self.loading.extend(
            (out.kv_loads.iter()).map(|load| (load.request_id, load.num_host_tokens as u32)),
        );
        self.note_admissions(&out, requests);
        if out.num_scheduled_tokens.is_empty() {
            self.scheduler.recycle_output(out);
            return Ok(None);
        }
        // The vectors of an ended batch (`recycle`), refilled.
        let (mut ids, mut tokens) = self.spare_batches.pop().unwrap_or_default();
        ids.clear();
        tokens.clear();
        ids.extend(out.num_scheduled_tokens.iter().map(|&(idx, _)| idx));
        tokens.extend(out.num_scheduled_tokens.iter().map(|&(_, n)| n as u32));
        // The requests caught up with their known tokens sample at the batch's end (no
        // outputs are in flight here: the scheduler is synchronous).
        let mut caught_up = self.spare.pop().unwrap_or_default();
        caught_up.extend_from_slice(self.scheduler.step_samplers());
        if let Some(spec) = &mut self.spec {
            let ids: Vec<ReqIdx> = caught_up.iter().map(|&(idx, _)| idx).collect();
            spec.on_schedule(requests, &ids, &out.scheduled_spec_decode_tokens);
        }
        self.samplers.push_back(caught_up);
        self.scheduler.recycle_output(out);
        Ok(Some((ids, tokens)))
    }

    fn on_batch_end(&mut self, requests: &mut Requests, _batch: &Batch) -> Result<Vec<ReqIdx>> {
        if let Some(released) = self.end_coalesced_step(requests)? {
            return Ok(released);
        }
        if let Some(spec) = &mut self.spec {
            if let Some(mut list) = self.samplers.pop_front() {
                list.clear();
                self.spare.push(list);
            }
            let block = self.hash_block_size;
            return spec.on_batch_end(&mut self.scheduler, requests, |r, position| {
                output_token(r, position, block)
            });
        }
        // Batches of one replica end in the order they were formed (stages are FIFO).
        let Some(mut caught_up) = self.samplers.pop_front() else {
            return Err(crate::Error::Internal(
                "vllm_v1: a batch ended that this replica never formed".into(),
            ));
        };
        let block = self.hash_block_size;
        let finished = self
            .scheduler
            .append_one_token_each_at(&caught_up, |&idx, position| {
                output_token(requests.get(idx), position as u64, block)
            })?;
        caught_up.clear();
        self.spare.push(caught_up);
        let released: Vec<ReqIdx> = finished.into_iter().map(|(idx, _)| idx).collect();
        if self.role == PdRole::Prefill {
            // A one-token request is done here: no decode replica needs its KV.
            for &idx in &released {
                if requests.get(idx).completed {
                    self.scheduler.finish_kv_transfers(&[], &[idx], &[])?;
                }
            }
        }
        Ok(released)
    }

    fn num_pending(&self) -> usize {
        self.scheduler.num_waiting()
    }

    fn num_outstanding(&self) -> usize {
        self.scheduler.num_waiting() + self.scheduler.num_running()
    }

    fn pending_prefill_tokens(&self, requests: &Requests) -> u64 {
        self.scheduler
            .waiting_ids()
            .iter()
            .map(|&idx| requests.get(idx).num_prefill_tokens as u64)
            .sum()
    }

    fn kv_usage(&self) -> f64 {
        self.scheduler.stats().kv_usage
    }

    fn set_policy_plugin(&mut self, plugin: Box<dyn PolicyPlugin<ReqIdx>>) -> Result<()> {
        self.scheduler.set_plugin(plugin);
        Ok(())
    }

    fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        self.scheduler.drain_kv_events()
    }

    fn recycle(&mut self, plan: BatchPlan) {
        // A batch or two is in flight at a time: a few spares serve every step.
        if self.spare_batches.len() < 4 {
            self.spare_batches.push(plan);
        }
    }

    fn set_pd_role(&mut self, role: PdRole) -> Result<()> {
        if self.spec.is_some() && role != PdRole::Aggregated {
            return Err(crate::Error::config(
                "replica.speculative.method",
                "set",
                "speculative decoding is not simulated in disaggregated pools yet",
            ));
        }
        match role {
            PdRole::Aggregated => {}
            PdRole::Prefill => self.scheduler.set_connector(Box::new(SendsToDecode))?,
            PdRole::Decode => self
                .scheduler
                .set_connector(Box::new(ReceivesFromPrefill))?,
        }
        self.role = role;
        Ok(())
    }

    fn drain_kv_loads(&mut self) -> Vec<KvLoad<ReqIdx>> {
        std::mem::take(&mut self.kv_loads)
    }

    fn finish_kv_transfer(&mut self, idx: ReqIdx, sent: bool) -> Result<()> {
        if sent {
            self.scheduler.finish_kv_transfers(&[], &[idx], &[])
        } else {
            self.scheduler.finish_kv_transfers(&[idx], &[], &[])
        }
    }

    fn num_allocated_blocks(&self) -> usize {
        self.scheduler.config().num_kv_blocks() - self.scheduler.num_free_blocks()
    }

    fn host_tier_blocks(&self) -> (u64, u64) {
        let stats = self.scheduler.kv_pool_stats();
        (stats.num_offloaded_blocks, stats.num_loaded_blocks)
    }

    fn enable_decode_coalescing(&mut self) {
        self.coalesce = true;
    }

    fn batch_is_window_step(&self) -> bool {
        self.window_batch
    }

    fn window_step_admissions(&self) -> usize {
        self.window.as_ref().map_or(0, |w| w.num_admitted)
    }

    /// A window in progress whose step in flight has ended and whose next step fits the
    /// free blocks (and may admit the requests waiting): `coalesced_step` forms it,
    /// touching no request of the arena but to read the tokens it sampled and to note
    /// the admissions' prefix hits.
    fn next_batch_continues_window(&self) -> bool {
        self.window.as_ref().is_some_and(|w| {
            w.num_ended == w.plan.num_formed()
                && self.scheduler.next_decode_step_fits(&w.plan)
                && (self.scheduler.num_waiting() == 0 || self.scheduler.window_admits(&w.plan))
        })
    }

    fn share_prompt_memos(&mut self, memos: &mut PromptMemos) {
        let prompts = self.prompts_mut();
        memos.share_tokens(&mut prompts.tokens);
        if let Some(PromptHashes::Tokens(hashes)) = &mut prompts.hashes {
            memos.share_hashes(hashes);
        }
    }

    fn enable_lora(&mut self, config: &LoraConfig) -> Result<()> {
        self.adapters = Some(self.lora_cache(config)?);
        Ok(())
    }

    fn lora_shape(
        &mut self,
        ids: &[ReqIdx],
        num_tokens: &[u32],
        requests: &Requests,
    ) -> Result<LoraShape> {
        match &mut self.adapters {
            Some(cache) => cache.load(ids, num_tokens, requests),
            None => Ok(LoraShape::default()),
        }
    }
}
