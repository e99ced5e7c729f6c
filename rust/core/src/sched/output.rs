//! What one `schedule()` call decides, in vLLM V1's vocabulary (`SchedulerOutput`), how a
//! step's plan becomes one (`finish_step`), and what the engine reports back after running
//! it.

use super::scheduler::{Scheduler, StepPlan};
use crate::kv::{BlockId, RequestKey, TokenId};

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
    /// Where the replay of the request's prefix hit starts (vLLM 0.33's
    /// `NewRequestData.replay_start`): the worker rebuilds the bounded-replay sliding
    /// window from the tokens `replay_start..` of this step and leaves the cached KV of
    /// the other groups alone. Equals `num_computed_tokens` when it replays, else 0.
    pub replay_start: usize,
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
    /// Empty under `Scheduler::set_lean_output`.
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
    /// Block copies the worker runs before this step's forward, (source, destination),
    /// in the order queued (vLLM 0.33's `kv_cache_block_copies`;
    /// `Scheduler::queue_block_copies`). Their endpoints stay out of the free pool until
    /// this step is processed (`sched::block_free`).
    pub kv_cache_block_copies: Vec<(BlockId, BlockId)>,
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

impl<R: RequestKey> Scheduler<R> {
    /// The requests the step `schedule()` last formed caught up with their known tokens
    /// (and outputs in flight): those that sample at its end, in batch order, each with a
    /// slot hint for `append_one_token_each_at`.
    pub fn step_samplers(&self) -> &[(R, u32)] {
        &self.step_samplers
    }

    /// Hands back a step's output once read: the next step's fills its vectors of running
    /// requests and scheduled tokens instead of new ones (fresh memory every step).
    pub fn recycle_output(&mut self, out: SchedulerOutput<R>) {
        let SchedulerOutput {
            mut scheduled_running_reqs,
            mut num_scheduled_tokens,
            ..
        } = out;
        scheduled_running_reqs.clear();
        num_scheduled_tokens.clear();
        self.spare_running_reqs = scheduled_running_reqs;
        self.spare_num_scheduled = num_scheduled_tokens;
    }

    /// Turns the plan into the output and advances each scheduled request's computed tokens
    /// (as if the step will run; spec rejections are rolled back on update).
    pub(super) fn finish_step(&mut self, plan: &mut StepPlan<R>) -> SchedulerOutput<R> {
        // Sized once: most scheduled requests are running ones (one per step otherwise
        // regrown from empty); a recycled output's vectors are reused.
        let mut scheduled_running_reqs = std::mem::take(&mut self.spare_running_reqs);
        scheduled_running_reqs.reserve(plan.scheduled.len());
        let mut num_scheduled_tokens = std::mem::take(&mut self.spare_num_scheduled);
        num_scheduled_tokens.reserve(plan.scheduled.len());
        self.step_samplers.clear();
        let mut out = SchedulerOutput {
            scheduled_new_reqs: Vec::new(),
            scheduled_resumed_reqs: Vec::new(),
            scheduled_running_reqs,
            num_scheduled_tokens,
            total_num_scheduled_tokens: 0,
            scheduled_spec_decode_tokens: Vec::new(),
            preempted_req_ids: plan
                .preempted
                .iter()
                .map(|&s| self.req(s).request_id.clone())
                .collect(),
            finished_req_ids: std::mem::take(&mut self.finished_since_last_step),
            kv_loads: std::mem::take(&mut plan.kv_loads),
            scheduled_encoder_inputs: Vec::new(),
            free_encoder_mm_hashes: Vec::new(),
            kv_cache_block_copies: self.take_pending_block_copies(),
        };
        self.encoder_end_step(&plan.scheduled, &mut out);
        let in_flight_step = self.in_flight_begin_step();
        let hybrid = self.config.is_hybrid();
        for &(slot, n) in &plan.scheduled {
            if let Some(step) = in_flight_step {
                self.in_flight_record(slot, step, n);
            }
            let blocks = plan.new_blocks[slot as usize].take().unwrap_or_default();
            let group_blocks = if hybrid {
                let groups = self.kv.take_group_blocks(slot);
                self.with_new_host_blocks(slot, groups)
            } else {
                Vec::new()
            };
            let async_scheduling = self.async_scheduling;
            let lean = self.lean_output;
            let request = self.slots[slot as usize]
                .as_mut()
                .expect("scheduled slot is live");
            let id = request.request_id.clone();
            match plan.admitted.get(&slot) {
                Some(&resumed) => {
                    let data = NewRequestData {
                        request_id: id.clone(),
                        token_ids: match (lean, resumed) {
                            (true, _) => Vec::new(),
                            (false, true) => request.all_token_ids.clone(),
                            (false, false) => request.prompt_token_ids().to_vec(),
                        },
                        block_ids: if lean || hybrid {
                            Vec::new()
                        } else {
                            self.kv.block_ids(slot).unwrap_or_default().to_vec()
                        },
                        group_block_ids: if lean || !hybrid {
                            Vec::new()
                        } else {
                            super::hisparse::with_host_table(
                                &self.host_pages,
                                slot,
                                self.kv.group_block_ids(slot),
                            )
                        },
                        num_computed_tokens: request.num_computed_tokens,
                        lora_id: request.spec.lora_id,
                        replay_start: request.replay_start,
                    };
                    if resumed {
                        out.scheduled_resumed_reqs.push(data);
                    } else {
                        out.scheduled_new_reqs.push(data);
                    }
                }
                // Lean: the caller reads the counts (`num_scheduled_tokens`) only.
                None if lean => {}
                None => out.scheduled_running_reqs.push(CachedRequestData {
                    request_id: id.clone(),
                    new_block_ids: blocks,
                    new_group_block_ids: group_blocks,
                    num_computed_tokens: request.num_computed_tokens,
                }),
            }
            // Drafts beyond the known tokens and the outputs in flight are verified this step.
            let known_pending = (request.num_tokens() + request.num_output_placeholders)
                .saturating_sub(request.num_computed_tokens);
            let num_spec = n
                .saturating_sub(known_pending)
                .min(request.spec_token_ids.len());
            if num_spec > 0 {
                out.scheduled_spec_decode_tokens
                    .push((id.clone(), request.spec_token_ids[..num_spec].to_vec()));
            }
            request.spec_token_ids.clear();
            request.last_step = self.num_steps;
            request.num_computed_tokens += n;
            // Caught up with every known token (and output in flight): this step samples.
            let samples = request.num_computed_tokens
                >= request.num_tokens() + request.num_output_placeholders;
            request.is_prefill_chunk = !samples;
            if samples {
                request.inflight_prefill = false;
                self.step_samplers.push((id.clone(), slot));
                request.in_flight_tokens.push_back((self.num_steps, n));
                request.max_spec_in_flight = request.max_spec_in_flight.max(num_spec);
                if async_scheduling {
                    // vLLM 0.33 counts tokens: the sampled one and the drafts verified.
                    request.num_output_placeholders += 1 + num_spec;
                }
            }
            request.last_num_spec_tokens = num_spec;
            out.num_scheduled_tokens.push((id, n));
            out.total_num_scheduled_tokens += n;
        }
        out
    }
}
