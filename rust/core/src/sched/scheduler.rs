//! The scheduler state and one step of it. It owns every unfinished request (an arena
//! indexed by slot), the waiting queue, the running list and the KV block pool. A step
//! serves the running requests here (preempting when memory runs out: `preempt`), admits
//! waiting ones (`admission`), becomes a `SchedulerOutput` (`output::finish_step`), and its
//! outputs come back through `update`.
//! Invariants (see `check_invariants`): each unfinished request is in exactly one of
//! waiting / running; a running request holds blocks for all its computed tokens; a
//! waiting one holds none unless its KV load began (those are served first: `Waiting`).

use rustc_hash::{FxHashMap, FxHashSet};

use super::budget::StepBudget;
use super::connector::{KvConnector, KvLoad};
use super::kv::{Hit, Kv};
use super::output::{CachedRequestData, SchedulerOutput, SchedulerStats};
use super::plugin::{PolicyPlugin, RequestView, check_permutation};
use super::queue::{PriorityKey, Waiting};
use super::request::{PromptSource, Request, RequestStatus};
use super::{Policy, PriorityTies, SchedulerConfig};
use crate::Result;
use crate::kv::{BlockId, RequestKey};

pub struct Scheduler<R: RequestKey> {
    pub(super) config: SchedulerConfig,
    pub(super) slots: Vec<Option<Request<R>>>,
    pub(super) free_slots: Vec<u32>,
    pub(super) index: FxHashMap<R, u32>,
    pub(super) waiting: Waiting<R>,
    pub(super) running: Vec<u32>,
    pub(super) kv: Kv,
    pub(super) finished_since_last_step: Vec<R>,
    pub(super) next_arrival_seq: u64,
    pub(super) num_preemptions: u64,
    pub(super) num_steps: u64,
    /// Async scheduling: requests that finished while steps that include them were still in
    /// flight. Their late outputs are dropped when they land (their blocks were freed when
    /// they finished, as vLLM 0.33 frees them).
    pub(super) finished_in_flight: FxHashMap<R, FinishedInFlight>,
    pub(super) async_scheduling: bool,
    /// Leave token and block ids out of `NewRequestData` (callers that only need counts).
    pub(super) lean_output: bool,
    /// Whether waiting requests that hold no KV blocks are admitted (`set_admit_new`).
    pub(super) admit_new: bool,
    pub(super) spare_plan: StepPlan<R>,
    pub(super) plugin: Option<Box<dyn PolicyPlugin<R>>>,
    /// This step's preemption order from the plugin: slot -> rank (0 = first victim).
    victim_rank: FxHashMap<u32, usize>,
    /// The last lookup of a request that could not be admitted, by its `arrival_seq` (unique,
    /// unlike slots): the head of the queue retries every step, and reuses its hashes.
    pub(super) blocked_head: Option<(u64, Hit)>,
    /// The KV connector, if any (`sched::connector`).
    pub(super) connector: Option<Box<dyn KvConnector<R>>>,
    /// The encoder-cache connector, if any (`sched::encoder_connector`).
    pub(super) ec_connector: Option<Box<dyn super::encoder_connector::EncoderConnector<R>>>,
    /// The auxiliary-output connector, if any (`sched::aux_outputs`).
    pub(super) aux_outputs: Option<Box<dyn super::aux_outputs::AuxOutputConnector<R>>>,
    /// Decisions routed through the caller's code, if set (`sched::hooks`).
    pub(super) hooks: Option<Box<dyn super::hooks::StepHooks<R>>>,
    /// HiSparse host pages (`sched::hisparse`), off by default.
    pub(super) host_pages: Option<super::hisparse::HostPages>,
    /// Each cache call's request, when asked for (`sched::kv_events`), off by default.
    pub(super) kv_cache_calls: Option<Box<super::kv_events::CacheCallLog<R>>>,
    /// Makes deferred prompts (`RequestSpec::num_deferred_prompt_tokens`), if set.
    pub(super) prompt_source: Option<Box<dyn PromptSource<R>>>,
    /// Slots of requests whose KV load the engine reported landed / failed; each is taken
    /// when its request next reaches the head of the waiting queue (vLLM's
    /// `finished_recving_kv_req_ids` / `failed_recving_kv_req_ids`).
    pub(super) landed: FxHashSet<u32>,
    pub(super) failed_loads: FxHashSet<u32>,
    /// Whether a request whose load failed asks the connector again when it is next
    /// admitted (vLLM 0.33's `kv_load_failure_policy = "recompute"`); by default it does not.
    pub(super) ask_again_after_failed_load: bool,
    /// Tokens given for a prefill chunk are appended (`set_append_prefill_chunk_outputs`).
    pub(super) append_prefill_chunk_outputs: bool,
    /// vLLM 0.33's `kv_load_failure_policy` (`sched::load_failures`).
    pub(super) kv_load_failure_policy: super::load_failures::KvLoadFailurePolicy,
    /// Requests a failed load finishes with an error at the next update, with their
    /// `arrival_seq` (`sched::load_failures`).
    pub(super) pending_load_errors: Vec<(u32, u64)>,
    /// Finished requests whose blocks wait for a transfer: a send the connector asked to
    /// finish first, or a load still writing into them (the request was aborted meanwhile);
    /// each with its slot and `last_sched_seq` (the free may be deferred after: `block_free`).
    pub(super) transfer_holds: FxHashMap<R, (u32, u64)>,
    /// Requests given blocks outside the scheduler (`kv_outside`), with their pool keys.
    pub(super) outside_kv: FxHashMap<R, u32>,
    /// A step whose admissions a connector error cut short: `schedule()` returned the error,
    /// and returns this step on its next call (its allocations were made, so dropping it
    /// would leave the engine without requests the scheduler counts as running).
    pub(super) interrupted_step: Option<SchedulerOutput<R>>,
    /// This step's `long_prefill_token_threshold` (`long_prefill_threshold`).
    pub(super) step_threshold: usize,
    /// This step holds prefill work back (vLLM 0.33's `defer_prefills`; `prefill_gate`).
    pub(super) defer_prefills: bool,
    /// Steps that scheduled any token (vLLM 0.33's `num_executed_steps`): an empty step
    /// does not advance the prefill cadence.
    pub(super) num_executed_steps: i64,
    /// The executed step that last carried prefill (`last_prefill_step`); starts a full
    /// `prefill_schedule_interval` back, so the first step is never held.
    pub(super) last_prefill_step: i64,
    /// The last step that released prefill left the waiting queue undrained (vLLM 0.33's
    /// `prefill_capacity_bound`): throttling and the cadence stand aside until one drains it.
    pub(super) prefill_capacity_bound: bool,
    /// Waiting requests the admission scan skipped (vLLM 0.33's `deferred_waiting`): a
    /// load not landed, a LoRA slot, a connector that cannot tell yet. A slot stays until
    /// its request is admitted or finishes.
    pub(super) deferred: FxHashSet<u32>,
    /// Multimodal encoder budget and cache (`sched::encoder`).
    pub(super) encoder: super::encoder::Encoder,
    /// Block frees deferred past the steps in flight (`sched::block_free`).
    pub(super) block_frees: super::block_free::BlockFrees,
    /// Steps scheduled and landed, for the requests' tokens in flight (async scheduling
    /// with window groups).
    pub(super) steps_in_flight: super::in_flight::StepsInFlight,
    /// Live requests with multimodal items: while there are none, a step asks the encoder
    /// nothing (its per-request check read a cache line of each running request).
    pub(super) num_mm_requests: usize,
    /// The requests the last step caught up with their known tokens (they sample at its
    /// end), with their slots, in batch order (`step_samplers`).
    pub(super) step_samplers: Vec<(R, u32)>,
    /// Emptied vectors of outputs handed back (`recycle_output`), for the next step's.
    pub(super) spare_running_reqs: Vec<CachedRequestData<R>>,
    pub(super) spare_num_scheduled: Vec<(R, usize)>,
    /// Sessions parked between turns (`sched::session`): in neither queue, holding blocks
    /// and a model-runner slot.
    pub(super) parked: FxHashSet<u32>,
    /// Chunks taken by sessions whose wait was set by hand (`resume_unparked_session`):
    /// vLLM 0.33 takes each off its parked-session counter, which never counted them.
    pub(super) num_unparked_resumes: usize,
    /// `update_from_output` calls (steps landed), and whether a preemption within a step
    /// drops the outputs in flight (`sched::stale`).
    pub(super) num_updates: u64,
    pub(super) drop_stale_on_preempt: bool,
    pub(super) wait_for_stale: bool,
}

/// A finished request with outputs still in flight (async scheduling).
pub(super) struct FinishedInFlight {
    pub(super) outputs_left: usize,
}

/// The decisions of one step before they become a `SchedulerOutput`.
pub(super) struct StepPlan<R> {
    /// (slot, tokens) in batch order.
    pub(super) scheduled: Vec<(u32, usize)>,
    /// By slot: the blocks a scheduled request gets this step (`Some` = scheduled). A dense
    /// vector, not a map: every running request is looked up here every step.
    pub(super) new_blocks: Vec<Option<Vec<BlockId>>>,
    /// Slots admitted from the waiting queue this step, and whether they were preempted.
    pub(super) admitted: FxHashMap<u32, bool>,
    pub(super) preempted: Vec<u32>,
    pub(super) loras: FxHashSet<u64>,
    pub(super) kv_loads: Vec<KvLoad<R>>,
    /// A running request still prefilling was scheduled (vLLM's `prefill_scheduled`): no
    /// admission is padded with placeholder drafts.
    pub(super) prefill_scheduled: bool,
    /// A request was admitted with more than its last token to compute (vLLM's
    /// `prefill_admitted`).
    pub(super) prefill_admitted: bool,
}

impl<R> Default for StepPlan<R> {
    fn default() -> Self {
        Self {
            scheduled: Vec::new(),
            new_blocks: Vec::new(),
            admitted: FxHashMap::default(),
            preempted: Vec::new(),
            loras: FxHashSet::default(),
            kv_loads: Vec::new(),
            prefill_scheduled: false,
            prefill_admitted: false,
        }
    }
}

impl<R> StepPlan<R> {
    pub(super) fn clear(&mut self) {
        for &(slot, _) in &self.scheduled {
            self.new_blocks[slot as usize] = None;
        }
        self.scheduled.clear();
        self.admitted.clear();
        self.preempted.clear();
        self.loras.clear();
        self.kv_loads.clear();
        self.prefill_scheduled = false;
        self.prefill_admitted = false;
    }

    /// Running requests (not admissions) scheduled so far in this step.
    pub(super) fn num_running_scheduled(&self) -> usize {
        self.scheduled.len() - self.admitted.len()
    }

    fn is_scheduled(&self, slot: u32) -> bool {
        self.new_blocks
            .get(slot as usize)
            .is_some_and(|blocks| blocks.is_some())
    }

    #[inline(always)]
    pub(super) fn set_blocks(&mut self, slot: u32, blocks: Vec<BlockId>) {
        let slot = slot as usize;
        if self.new_blocks.len() <= slot {
            self.new_blocks.resize(slot + 1, None);
        }
        self.new_blocks[slot] = Some(blocks);
    }

    fn take_blocks(&mut self, slot: u32) -> Option<Vec<BlockId>> {
        self.new_blocks.get_mut(slot as usize)?.take()
    }
}

enum Allocation {
    Scheduled(Vec<BlockId>),
    PreemptedItself,
    /// No room, and the victim's blocks wait for a step in flight (`sched::block_free`):
    /// this request and the running ones after it are not served this step.
    Blocked,
}

impl<R: RequestKey> Scheduler<R> {
    pub fn new(config: SchedulerConfig, async_scheduling: bool) -> Result<Self> {
        config.validate_scheduler()?;
        let kv = Kv::new(&config, async_scheduling)?;
        let track_in_flight = async_scheduling && config.is_hybrid();
        let interval = config.prefill_schedule_interval as i64;
        let encoder = super::encoder::Encoder::new(&config);
        Ok(Self {
            waiting: Waiting::new(config.policy),
            config,
            slots: Vec::new(),
            free_slots: Vec::new(),
            index: FxHashMap::default(),
            running: Vec::new(),
            kv,
            finished_since_last_step: Vec::new(),
            next_arrival_seq: 0,
            num_preemptions: 0,
            num_steps: 0,
            finished_in_flight: FxHashMap::default(),
            async_scheduling,
            lean_output: false,
            spare_plan: StepPlan::default(),
            plugin: None,
            victim_rank: FxHashMap::default(),
            blocked_head: None,
            connector: None,
            aux_outputs: None,
            ec_connector: None,
            hooks: None,
            host_pages: None,
            kv_cache_calls: None,
            prompt_source: None,
            landed: FxHashSet::default(),
            failed_loads: FxHashSet::default(),
            ask_again_after_failed_load: false,
            append_prefill_chunk_outputs: false,
            kv_load_failure_policy: Default::default(),
            pending_load_errors: Vec::new(),
            transfer_holds: FxHashMap::default(),
            outside_kv: FxHashMap::default(),
            interrupted_step: None,
            step_threshold: 0,
            defer_prefills: false,
            num_executed_steps: 0,
            last_prefill_step: -interval,
            prefill_capacity_bound: false,
            deferred: FxHashSet::default(),
            admit_new: true,
            encoder,
            block_frees: super::block_free::BlockFrees::default(),
            steps_in_flight: super::in_flight::StepsInFlight::new(track_in_flight),
            num_mm_requests: 0,
            step_samplers: Vec::new(),
            spare_running_reqs: Vec::new(),
            spare_num_scheduled: Vec::new(),
            parked: FxHashSet::default(),
            num_unparked_resumes: 0,
            num_updates: 0,
            drop_stale_on_preempt: false,
            wait_for_stale: false,
        })
    }

    /// Makes the prompts of requests added by length only (`RequestSpec::
    /// num_deferred_prompt_tokens`) with `source`, at their first admission attempt.
    pub fn set_prompt_source(&mut self, source: Box<dyn PromptSource<R>>) {
        self.prompt_source = Some(source);
    }

    /// The prompt source, if set (`set_prompt_source`).
    pub fn prompt_source_mut(&mut self) -> Option<&mut (dyn PromptSource<R> + 'static)> {
        self.prompt_source.as_deref_mut()
    }

    /// Hands the waiting order and the choice of preemption victims to `plugin`.
    pub fn set_plugin(&mut self, plugin: Box<dyn PolicyPlugin<R>>) {
        self.plugin = Some(plugin);
        let slots = self.waiting.ordered();
        self.waiting =
            self.waiting
                .reordered(&slots, |s| self.priority_key(s), |s| self.holds_kv(s));
    }

    /// With `lean`, admitted requests are reported without their token and block ids, and
    /// running ones not at all (`scheduled_running_reqs` stays empty; their tokens are in
    /// `num_scheduled_tokens`): the simulator needs only the counts (copying prompts
    /// dominated its step; writing a record per running request, which it never read, was
    /// most of what remained of `schedule`'s own time).
    pub fn set_lean_output(&mut self, lean: bool) {
        self.lean_output = lean;
    }

    /// Starts recording prefix-cache events (block-hash pool only), for KV-aware routing.
    pub fn enable_kv_events(&mut self) {
        self.kv.enable_events();
    }

    /// Prefix-cache events since the last call, oldest first.
    pub fn drain_kv_events(&mut self) -> Vec<crate::kv::KvEvent> {
        self.kv.drain_events()
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn get_request(&self, request_id: &R) -> Option<&Request<R>> {
        self.index.get(request_id).map(|&slot| self.req(slot))
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Whether any request can still make progress: parked sessions wait for input
    /// (vLLM 0.33's `get_num_unfinished_requests` leaves them out).
    pub fn has_unfinished_requests(&self) -> bool {
        self.index.len() > self.parked.len()
    }

    /// Running request ids in order.
    pub fn running_ids(&self) -> Vec<R> {
        self.running
            .iter()
            .map(|&s| self.req(s).request_id.clone())
            .collect()
    }

    /// Waiting request ids in scheduling order.
    pub fn waiting_ids(&self) -> Vec<R> {
        self.waiting
            .ordered()
            .into_iter()
            .map(|s| self.req(s).request_id.clone())
            .collect()
    }

    /// The request's block table (with several KV groups, group 0's), `None` if it holds
    /// no blocks.
    pub fn block_ids(&self, request_id: &R) -> Option<&[BlockId]> {
        self.kv.block_ids(*self.index.get(request_id)?)
    }

    /// With several KV groups, the request's block table of each group (empty if it holds
    /// no blocks, or with a single group: see `block_ids`).
    pub fn group_block_ids(&self, request_id: &R) -> Vec<Vec<BlockId>> {
        self.index.get(request_id).map_or_else(Vec::new, |&slot| {
            super::hisparse::with_host_table(&self.host_pages, slot, self.kv.group_block_ids(slot))
        })
    }

    /// Blocks free for allocation (including cached blocks no request holds).
    pub fn num_free_blocks(&self) -> usize {
        self.kv.num_free_blocks()
    }

    /// Forces the free-block count as vLLM's tests set `FreeKVCacheBlockQueue.num_free_blocks`
    /// (`BlockPool::force_num_free_blocks`): the queue keeps its blocks and order.
    pub fn force_num_free_blocks(&mut self, num_free_blocks: usize) -> Result<()> {
        self.kv.force_num_free_blocks(num_free_blocks)
    }

    /// The KV pool's own counters (host-tier offloads and loads among them).
    pub fn kv_pool_stats(&self) -> crate::kv::BlockPoolStats {
        self.kv.stats()
    }

    /// Waiting requests the admission scan skipped and that have not been admitted since
    /// (vLLM 0.33's `deferred_waiting`), in scheduling order.
    pub fn deferred_waiting_ids(&self) -> Vec<R> {
        self.waiting
            .ordered()
            .into_iter()
            .filter(|s| self.deferred.contains(s))
            .map(|s| self.req(s).request_id.clone())
            .collect()
    }

    /// Steps that scheduled any token (vLLM 0.33's `num_executed_steps`).
    pub fn num_executed_steps(&self) -> i64 {
        self.num_executed_steps
    }

    /// The executed step that last carried prefill (vLLM 0.33's `last_prefill_step`).
    pub fn last_prefill_step(&self) -> i64 {
        self.last_prefill_step
    }

    /// Whether the last step that released prefill left requests waiting that it did not
    /// skip (vLLM 0.33's `prefill_capacity_bound`).
    pub fn prefill_capacity_bound(&self) -> bool {
        self.prefill_capacity_bound
    }

    pub fn stats(&self) -> SchedulerStats {
        let prefix = self.kv.stats();
        SchedulerStats {
            num_waiting: self.waiting.len(),
            num_deferred_waiting: self.deferred.len(),
            num_running: self.running.len(),
            kv_usage: self.kv.usage(),
            prefix_cache_queries: prefix.num_query_tokens,
            prefix_cache_hits: prefix.num_hit_tokens,
            num_preemptions: self.num_preemptions,
            num_steps: self.num_steps,
        }
    }

    pub(super) fn req(&self, slot: u32) -> &Request<R> {
        self.slots[slot as usize]
            .as_ref()
            .expect("slot holds a live request")
    }

    pub(super) fn req_mut(&mut self, slot: u32) -> &mut Request<R> {
        self.slots[slot as usize]
            .as_mut()
            .expect("slot holds a live request")
    }

    pub(super) fn priority_key(&self, slot: u32) -> PriorityKey<R> {
        let r = self.req(slot);
        PriorityKey {
            priority: r.spec.priority,
            arrival_time: r.spec.arrival_time,
            request_id: r.request_id.clone(),
            by_id: self.config.priority_ties == PriorityTies::Vllm,
            arrival_seq: r.arrival_seq,
        }
    }

    /// Forms the next batch. Running requests are served first (preempting when memory runs
    /// out), then waiting ones are admitted unless this step preempted. With
    /// `prioritize_prefill`, running prefills go first, then admissions, then decodes.
    ///
    /// A KV connector error while admitting stops admission at that request; the step formed
    /// until then is completed but kept: this call returns the error, the next returns the
    /// step.
    pub fn schedule(&mut self) -> Result<SchedulerOutput<R>> {
        self.schedule_throttled(false)
    }

    /// [`Self::schedule`], with vLLM 0.33's `throttle_prefills` (DP prefill balancing: the
    /// engine says this step is not cadence-aligned): while a running request decodes and
    /// the last release step drained the waiting queue, no prefill work runs this step.
    pub fn schedule_throttled(&mut self, throttle_prefills: bool) -> Result<SchedulerOutput<R>> {
        if let Some(out) = self.interrupted_step.take() {
            return Ok(out);
        }
        self.consult_plugin()?;
        // vLLM 0.33's `kv_cache_manager.new_step_starts()` (Mamba `align` states).
        self.kv.new_step_starts();
        if !self.async_scheduling {
            // Synchronous engines report a step before the next: a finished request's
            // output that did not come with it never will.
            self.finished_in_flight.clear();
        }
        let mut budget = StepBudget::of(&self.config);
        self.step_threshold = self.long_prefill_threshold();
        self.defer_prefills = self.prefill_gate(throttle_prefills);
        self.encoder_begin_step();
        // The plan's maps keep their capacity from step to step (no rehashing as they grow).
        let mut plan = std::mem::take(&mut self.spare_plan);
        let mut admission_error = None;
        if self.config.prioritize_prefill {
            self.schedule_running(&mut budget, &mut plan, Some(true))?;
            if plan.preempted.is_empty() {
                admission_error = self.schedule_waiting(&mut budget, &mut plan)?;
            }
            self.schedule_running(&mut budget, &mut plan, Some(false))?;
        } else {
            self.schedule_running(&mut budget, &mut plan, None)?;
            if plan.preempted.is_empty() {
                admission_error = self.schedule_waiting(&mut budget, &mut plan)?;
            }
        }
        self.num_steps += 1;
        if !plan.scheduled.is_empty() {
            self.num_executed_steps += 1;
        }
        // Stamped after counting: the step that carried the prefill is the one recorded.
        if self.config.prefill_schedule_interval > 1
            && (plan.prefill_scheduled || plan.prefill_admitted)
        {
            self.last_prefill_step = self.num_executed_steps;
        }
        self.close_step(plan, admission_error)
    }

    /// A step's output from its plan, the plan's maps kept for the next step. An admission
    /// error (or an encoder-cache connector's, returned as one) is returned now and the
    /// output at the next `schedule()`, as vLLM's step raises after its state moved.
    pub(super) fn close_step(
        &mut self,
        mut plan: StepPlan<R>,
        admission_error: Option<crate::Error>,
    ) -> Result<SchedulerOutput<R>> {
        let out = self.finish_step(&mut plan);
        // vLLM's build_connector_meta, once the step's allocations are done. Its error,
        // like an admission error, keeps the output for the next `schedule()`: the
        // step's state has moved.
        let advanced = self.advance_hisparse(&plan.scheduled);
        self.stamp_step(&plan.scheduled);
        plan.clear();
        self.spare_plan = plan;
        let error = admission_error.or(advanced.err());
        match error.or(self.encoder.connector_error.take()) {
            Some(err) => {
                self.interrupted_step = Some(out);
                Err(err)
            }
            None => Ok(out),
        }
    }

    /// Whether this step holds prefill work back (vLLM 0.33's `defer_prefills`). Only while
    /// a running request decodes (a held step is never left empty), and not while the last
    /// release step left requests waiting (the capacity escape: a backed-up engine that
    /// held prefill for most steps would grow its queue without bound). Then either the
    /// engine throttles this step (DP prefill balancing) or, with a
    /// `prefill_schedule_interval` of `k > 1`, fewer than `k` executed steps separate this
    /// one (if it runs anything) from the last that carried prefill.
    pub(super) fn prefill_gate(&self, throttle_prefills: bool) -> bool {
        let interval = self.config.prefill_schedule_interval as i64;
        let held = throttle_prefills
            || (interval > 1 && (self.num_executed_steps + 1) - self.last_prefill_step < interval);
        // The scan of the running requests last: most steps hold nothing (no cadence, no
        // throttling) and skip it.
        held && !self.prefill_capacity_bound
            && self.running.iter().any(|&s| !self.req(s).is_prefill_chunk)
    }

    /// This step's cap on one request's tokens (vLLM 0.33): the configured threshold, only
    /// when more than one request runs or waits, floored at a fair share of the input budget
    /// (`max_num_batched_tokens`) if
    /// `long_prefill_token_threshold_adaptive`; 0 = no cap.
    pub(super) fn long_prefill_threshold(&self) -> usize {
        let configured = self.config.long_prefill_token_threshold;
        let eligible = self.running.len() + self.waiting.len();
        if configured == 0 || eligible <= 1 {
            return 0;
        }
        if self.config.long_prefill_token_threshold_adaptive {
            configured.max(self.config.max_num_batched_tokens / eligible)
        } else {
            configured
        }
    }

    /// Asks the plugin (if any) for this step's waiting order and preemption order, before
    /// anything changes; applies them only if both answers are valid.
    fn consult_plugin(&mut self) -> Result<()> {
        let Some(mut plugin) = self.plugin.take() else {
            return Ok(());
        };
        let waiting = self.waiting.ordered();
        let answers = (|| {
            let views: Vec<_> = waiting
                .iter()
                .map(|&s| RequestView::of(self.req(s)))
                .collect();
            let order = plugin.order_waiting(&views)?;
            check_permutation(&order, views.len(), "order_waiting")?;
            let views: Vec<_> = self
                .running
                .iter()
                .map(|&s| RequestView::of(self.req(s)))
                .collect();
            let victims = plugin.preemption_order(&views)?;
            check_permutation(&victims, views.len(), "preemption_order")?;
            Ok((order, victims))
        })();
        self.plugin = Some(plugin);
        let (order, victims) = answers?;
        let slots: Vec<u32> = order.into_iter().map(|i| waiting[i]).collect();
        self.waiting =
            self.waiting
                .reordered(&slots, |s| self.priority_key(s), |s| self.holds_kv(s));
        self.victim_rank = victims
            .iter()
            .enumerate()
            .map(|(rank, &i)| (self.running[i], rank))
            .collect();
        Ok(())
    }

    /// Tokens a request may take: its pending tokens capped by the long-prefill threshold,
    /// the remaining budget and the room left before `max_model_len`.
    fn clamp(&self, pending: usize, budget: usize, num_computed: usize) -> usize {
        let threshold = self.step_threshold;
        let mut n = pending;
        if threshold > 0 {
            n = n.min(threshold);
        }
        let room = self.config.max_model_len - self.config.num_sampled_tokens_per_step;
        n.min(budget).min(room.saturating_sub(num_computed))
    }

    /// Lookahead slots past `num_tokens` (computed and scheduled): vLLM caps the slots a
    /// request gets at `max_model_len`.
    pub(super) fn lookahead(&self, num_tokens: usize) -> usize {
        (self.config.num_lookahead_tokens).min(self.config.max_model_len.saturating_sub(num_tokens))
    }

    /// Phase 1. `only_prefills`: with `prioritize_prefill`, serve just the running requests
    /// that are (`Some(true)`) or are not (`Some(false)`) still prefilling.
    fn schedule_running(
        &mut self,
        budget: &mut StepBudget,
        plan: &mut StepPlan<R>,
        only_prefills: Option<bool>,
    ) -> Result<()> {
        let mut i = 0;
        // vLLM 0.33's two budgets (sched::budget): each scheduled request also takes its
        // draft slots of the input budget.
        while i < self.running.len() && budget.is_open() {
            let slot = self.running[i];
            let request = self.req(slot);
            let skip = plan.is_scheduled(slot)
                || only_prefills.is_some_and(|want| request.is_prefilling() != want)
                || (self.defer_prefills && request.is_prefill_chunk);
            // vLLM 0.33 asks the encoder-cache connector with the landed frontier (computed
            // less the outputs in flight) and skips a request whose encoder input is in
            // transit; one whose step in flight reaches max_tokens it skipped before asking.
            let at = (request.num_computed_tokens).saturating_sub(request.num_output_placeholders);
            let skip = skip
                || (self.ec_connector.is_some()
                    && request.num_pending_tokens() > 0
                    && self.ec_transfer_pending(slot, at));
            let request = self.req(slot);
            let n = self.clamp(
                request.num_pending_tokens(),
                budget.room(),
                request.num_computed_tokens,
            );
            // vLLM 0.33 applies the Mamba `align` split before the encoder caps.
            let n = self.mamba_aligned(slot, request.num_computed_tokens, n)?;
            if skip || n == 0 {
                i += 1;
                continue;
            }
            let (n, encoder) = if self.num_mm_requests == 0 {
                (n, None)
            } else {
                self.schedule_encoder_inputs(slot, self.req(slot).num_computed_tokens, n)
            };
            let n = self.reserve_prefill_lookahead(slot, self.req(slot).num_computed_tokens, n);
            if n == 0 {
                i += 1;
                continue;
            }
            let num_running = self.running.len();
            let prefill_chunk = self.req(slot).is_prefill_chunk;
            match self.allocate_running(slot, n, budget, plan)? {
                Allocation::Scheduled(blocks) => {
                    plan.prefill_scheduled |= prefill_chunk;
                    plan.scheduled.push((slot, n));
                    plan.set_blocks(slot, blocks);
                    budget.take(n);
                    // Skips the call on the decode path (`bulkspeed`'s measured shortcut).
                    if encoder.is_some() {
                        self.commit_encoder_inputs(slot, encoder);
                    }
                }
                Allocation::PreemptedItself => {}
                Allocation::Blocked => break,
            }
            i = if self.running.len() == num_running {
                i + 1
            } else {
                // Preemption may have removed requests before `slot`; resume right after it
                // (rare, so the scan stays off the common path).
                self.running
                    .iter()
                    .position(|&s| s == slot)
                    .map_or(i, |pos| pos + 1)
            };
        }
        Ok(())
    }

    /// Allocates slots for a running request, preempting victims until it fits or it is the
    /// victim itself.
    fn allocate_running(
        &mut self,
        slot: u32,
        n: usize,
        budget: &mut StepBudget,
        plan: &mut StepPlan<R>,
    ) -> Result<Allocation> {
        loop {
            let request = self.slots[slot as usize]
                .as_ref()
                .expect("running slot is live");
            let in_flight = self.num_in_flight_tokens(slot);
            // The pool takes the tokens past those it knows of the request.
            let token_ids = &request.all_token_ids[..];
            let lookahead = self.lookahead(request.num_computed_tokens + n);
            let with_ids = !self.lean_output;
            // After a bounded replay the pool counts the adopted hit as computed while the
            // request recomputes its tail: only tokens past the pool's count need slots,
            // and a chunk still inside the replayed range needs none (but its lookahead).
            let mut n_slots = n;
            // vLLM 0.33 asks allocate_slots at each attempt (sched::hooks; true without).
            let allowed = self.allocation_allowed(slot, n, lookahead)?
                && self.host_pages_fit_running(slot, request.num_computed_tokens, n + lookahead);
            if allowed && request.replay_start > 0 {
                let held = self.kv.num_computed_tokens(slot).unwrap_or(0);
                n_slots = (request.num_computed_tokens + n).saturating_sub(held);
                if n_slots == 0 && lookahead == 0 {
                    return Ok(Allocation::Scheduled(Vec::new()));
                }
            }
            // Window groups free on the processed-token basis (vLLM 0.33).
            if allowed
                && let Some(blocks) = self.kv.allocate_after_known(
                    slot, token_ids, n_slots, lookahead, with_ids, in_flight,
                )?
            {
                self.charge_host_pages(slot)?;
                return Ok(Allocation::Scheduled(blocks));
            }
            // vLLM 0.33: a connector whose transfers in flight will free blocks (HiSparse's
            // pending reclamation) stalls the request instead of preempting.
            if self.block_frees_pending()? {
                return Ok(Allocation::Blocked);
            }
            self.refresh_running_priorities()?;
            let victim = self.pick_victim();
            // vLLM 0.33: a deferred free will not help with immediate allocation.
            if !self.blocks_can_be_freed(self.req(victim).last_sched_seq) {
                return Ok(Allocation::Blocked);
            }
            let moved = self.preempt(victim, budget, plan)?;
            self.mark_stale(moved, self.drop_stale_on_preempt);
            if victim == slot {
                return Ok(Allocation::PreemptedItself);
            }
        }
    }
}

#[path = "preempt.rs"]
mod preempt;
