//! KV loads that failed, as vLLM 0.33's scheduler handles them (`Scheduler.update_from_output`
//! with `_handle_failed_recving`, `_handle_invalid_blocks` and
//! `_update_requests_with_invalid_blocks`, in vllm/v1/core/sched/scheduler.py): a load the
//! engine reports failed whole (`failed_recving`), and blocks a load left invalid
//! (`invalid_block_ids`), whether the load was asynchronous (the request still waits for
//! it) or synchronous (the request runs on the loaded tokens). Under
//! `kv_load_failure_policy = "recompute"` each affected request keeps the computed prefix
//! before its first invalid block and recomputes the rest; under `"fail"` it finishes with
//! `FinishReason::Error` at the next `update_from_output`, after its outputs.
//! Invariant: the whole report is checked before anything changes, and blocks are
//! conserved: a truncated request keeps every block it holds, a failed one frees them as any
//! finish does (a load still writing holds them until it reports). Under "recompute" a
//! truncated request's cached blocks stay cached (vLLM 0.33 evicts only under "fail"): its
//! pool entry may count cached blocks past its computed tokens until it recomputes them.

use rustc_hash::FxHashSet;

use super::kv::Kv;
use super::request::RequestStatus;
use super::scheduler::Scheduler;
use crate::kv::{BlockId, RequestKey};
use crate::{Error, Result};

/// vLLM 0.33's `KVTransferConfig.kv_load_failure_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvLoadFailurePolicy {
    /// The request recomputes what failed to load (vLLM's default).
    #[default]
    Recompute,
    /// The request finishes with `FinishReason::Error`.
    Fail,
}

impl KvLoadFailurePolicy {
    /// The policy named `name` (`"recompute"` or `"fail"`, vLLM's values).
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "recompute" => Ok(Self::Recompute),
            "fail" => Ok(Self::Fail),
            other => Err(Error::config(
                "kv_load_failure_policy",
                other,
                "must be \"recompute\" or \"fail\"",
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Recompute => "recompute",
            Self::Fail => "fail",
        }
    }
}

/// What [`Scheduler::handle_kv_load_failures`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLoadFailures<R> {
    /// Every request affected (loading or running, whole failures under `Recompute`
    /// included), with its computed tokens as cut back (vLLM's `num_computed_tokens` after
    /// `_update_requests_with_invalid_blocks`), before any finishes.
    pub truncated: Vec<(R, usize)>,
    /// Running requests whose computed tokens were cut back to their valid prefix: the
    /// output of the step being updated is dropped for them (vLLM skips them in
    /// `update_from_output`'s loop), and they recompute from there.
    pub rescheduled: Vec<R>,
    /// Requests that finish with `FinishReason::Error` (policy `"fail"`) at the next
    /// `update_from_output`, after its outputs (vLLM's `error_req_ids`; reported among its
    /// finished requests), in order: whole failures, then invalid blocks' (loading
    /// requests first, then running ones). Their outputs of this step are not to be given.
    pub failed: Vec<R>,
    /// Tokens the affected requests recompute (or lost, under `"fail"`): vLLM's
    /// `total_affected_tokens` of its log line.
    pub num_affected_tokens: usize,
}

impl<R> Default for KvLoadFailures<R> {
    fn default() -> Self {
        Self {
            truncated: Vec::new(),
            rescheduled: Vec::new(),
            failed: Vec::new(),
            num_affected_tokens: 0,
        }
    }
}

/// One request a report of invalid blocks affects: its new count of computed tokens and
/// whether it was the first to mark one of its invalid blocks (vLLM's
/// `marked_invalid_block`; it alone recomputes a shared invalid block).
struct Affected {
    slot: u32,
    /// It marked one of its invalid blocks first (vLLM's `marked_invalid_block`).
    marked: bool,
    num_computed_tokens: usize,
    num_affected_tokens: usize,
}

impl<R: RequestKey> Scheduler<R> {
    /// vLLM 0.33's `kv_load_failure_policy` (`Recompute` by default).
    pub fn set_kv_load_failure_policy(&mut self, policy: KvLoadFailurePolicy) {
        self.kv_load_failure_policy = policy;
    }

    pub fn kv_load_failure_policy(&self) -> KvLoadFailurePolicy {
        self.kv_load_failure_policy
    }

    /// Loading requests whose load failed (whole or in part) and was not taken yet (vLLM
    /// 0.33's `failed_recving_kv_req_ids`), in no particular order.
    pub fn failed_load_ids(&self) -> Vec<R> {
        (self.failed_loads.iter())
            .map(|&slot| self.req(slot).request_id.clone())
            .collect()
    }

    /// The engine's report of failed KV loads for the step being updated, applied before
    /// that step's outputs (vLLM 0.33's `update_from_output` does so):
    ///
    /// - `failed_recving`: loading requests whose load failed whole. Under `Recompute` each
    ///   counts no computed token, and once the load reports done (`finish_kv_transfers`)
    ///   it drops its blocks and is looked up anew (`_handle_failed_recving`,
    ///   `_update_waiting_for_remote_kv`). Ids of requests not loading are ignored, as
    ///   vLLM ignores them.
    /// - `invalid_block_ids`: blocks a load left invalid. Every loading request, then every
    ///   running one (in queue order), whose computed blocks (those before the step's
    ///   `num_scheduled_tokens`) hold one is affected: its computed tokens are cut back to
    ///   the start of its first invalid block that no request before it marked (a shared
    ///   block is recomputed by the first request only; one whose invalid blocks were all
    ///   marked keeps its blocks computed before the step). As in vLLM, the loading and
    ///   the running requests mark blocks separately. A loading request then waits for its
    ///   load as before, and caches only the valid prefix when it lands; a running one
    ///   keeps its blocks (those cached stay cached, as in vLLM, until it recomputes into
    ///   them), and the output of the step being updated is dropped for it
    ///   (`rescheduled`).
    ///
    /// Under `Fail` every affected request finishes with `FinishReason::Error` at the next
    /// `update_from_output`, after its outputs, as vLLM finishes its `error_req_ids` (a
    /// running one's blocks from its first invalid one on leave the prefix cache now,
    /// vLLM's `evict_blocks`; a loading one's blocks are freed once its load reports).
    ///
    /// With several steps in flight (async scheduling) a running request's scan counts the
    /// later steps' tokens as computed, as vLLM's does (only the step being updated is
    /// taken off), and the cut keeps its output placeholders (`truncate_running`).
    ///
    /// Errors, before anything changes: `invalid_block_ids` with several KV cache groups
    /// (block ids name a block within a group: vLLM 0.33 raises too); a running affected
    /// request with several steps in flight verifying drafts (not modelled), or on a pool
    /// other than the block-hash one.
    pub fn handle_kv_load_failures(
        &mut self,
        failed_recving: &[R],
        invalid_block_ids: &[BlockId],
        num_scheduled_tokens: &[(R, usize)],
    ) -> Result<KvLoadFailures<R>> {
        let fail = self.kv_load_failure_policy == KvLoadFailurePolicy::Fail;
        let whole: Vec<u32> = (failed_recving.iter())
            .filter_map(|id| self.index.get(id).copied())
            .filter(|&slot| self.req(slot).status == RequestStatus::WaitingForRemoteKvs)
            .collect();
        let (loading, running) = if invalid_block_ids.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            self.check_block_level_failures()?;
            // vLLM 0.33 handles `failed_recving` first: under "recompute" a request failed
            // whole counts no computed tokens, so the invalid-block scan neither finds nor
            // marks any of its blocks (a shared one is then cut in the next request).
            let skipped: &[u32] = if fail { &[] } else { &whole };
            self.invalid_block_scan(invalid_block_ids, num_scheduled_tokens, skipped)
        };
        for a in &running {
            self.check_truncatable(a.slot)?;
        }
        let mut report = KvLoadFailures::default();
        let mut failed: Vec<u32> = Vec::new();
        for &slot in &whole {
            if fail {
                failed.push(slot);
            } else {
                self.req_mut(slot).num_computed_tokens = 0;
                self.failed_loads.insert(slot);
                report
                    .truncated
                    .push((self.req(slot).request_id.clone(), 0));
            }
        }
        for a in &loading {
            report.num_affected_tokens += a.num_affected_tokens;
            // The count the load lands with (`take_landed_load`).
            self.req_mut(a.slot).num_computed_tokens = a.num_computed_tokens;
            if !fail {
                self.failed_loads.insert(a.slot);
            }
            let id = self.req(a.slot).request_id.clone();
            report.truncated.push((id, a.num_computed_tokens));
            if fail && !failed.contains(&a.slot) {
                failed.push(a.slot);
            }
        }
        for a in &running {
            report.num_affected_tokens += a.num_affected_tokens;
            // vLLM evicts the marking request's blocks from the cut on under "fail" only.
            self.truncate_running(a.slot, a.num_computed_tokens, fail && a.marked)?;
            let id = self.req(a.slot).request_id.clone();
            report.truncated.push((id, a.num_computed_tokens));
            if fail {
                failed.push(a.slot);
            } else {
                report.rescheduled.push(self.req(a.slot).request_id.clone());
            }
        }
        for slot in failed {
            let request = self.req(slot);
            report.failed.push(request.request_id.clone());
            let seq = request.arrival_seq;
            if !self.pending_load_errors.contains(&(slot, seq)) {
                self.pending_load_errors.push((slot, seq));
            }
        }
        Ok(report)
    }

    /// The requests failed loads finish with an error (`handle_kv_load_failures` under
    /// `Fail`), still live, in the order they failed.
    pub(super) fn take_load_errors(&mut self) -> Vec<u32> {
        let pending = std::mem::take(&mut self.pending_load_errors);
        (pending.into_iter())
            .filter(|&(slot, seq)| {
                (self.slots.get(slot as usize))
                    .and_then(Option::as_ref)
                    .is_some_and(|r| r.arrival_seq == seq)
            })
            .map(|(slot, _)| slot)
            .collect()
    }

    /// vLLM 0.33's `_handle_invalid_blocks` guard: block ids are unique within a KV cache
    /// group only, so a flat set of them names no request with several groups.
    fn check_block_level_failures(&self) -> Result<()> {
        let num_groups = self.kv.hybrid_groups().map_or(1, <[_]>::len);
        if num_groups > 1 {
            return Err(Error::config(
                "invalid_block_ids",
                format!("{num_groups} KV cache groups"),
                "a KV connector reported block-level load failures (invalid_block_ids), \
                 which is not supported for models with multiple KV cache groups; connectors \
                 must report failed requests via failed_recving instead",
            ));
        }
        Ok(())
    }

    /// vLLM 0.33's `_update_requests_with_invalid_blocks` over the loading requests (in
    /// waiting order, less `skipped`: those failed whole, left with no computed tokens),
    /// then the running ones, sharing the marked blocks; changes nothing.
    fn invalid_block_scan(
        &self,
        invalid_block_ids: &[BlockId],
        num_scheduled_tokens: &[(R, usize)],
        skipped: &[u32],
    ) -> (Vec<Affected>, Vec<Affected>) {
        let invalid: FxHashSet<BlockId> = invalid_block_ids.iter().copied().collect();
        let scheduled: rustc_hash::FxHashMap<&R, usize> = num_scheduled_tokens
            .iter()
            .map(|(id, n)| (id, *n))
            .collect();
        let loading: Vec<u32> = (self.waiting.ordered().into_iter())
            .filter(|&slot| self.req(slot).status == RequestStatus::WaitingForRemoteKvs)
            .filter(|slot| !skipped.contains(slot))
            .collect();
        // vLLM scans the loading and the running requests in two calls, each marking
        // blocks afresh: a block marked by a loading request is marked again by a running one.
        let scan = |marked: &mut FxHashSet<BlockId>, slot: u32, num_computed: usize| {
            let request = self.req(slot);
            let num_computed = num_computed
                .saturating_sub(scheduled.get(&request.request_id).copied().unwrap_or(0));
            let blocks = self.kv.block_ids(slot)?;
            let num_blocks = num_computed.div_ceil(self.config.block_size);
            let mut affected = false;
            let mut cut = None;
            for (idx, block) in blocks.iter().take(num_blocks).enumerate() {
                if !invalid.contains(block) {
                    continue;
                }
                affected = true;
                // A shared invalid block is recomputed by the first request marking it.
                if marked.insert(*block) && cut.is_none() {
                    cut = Some(idx * self.config.block_size);
                }
            }
            affected.then(|| match cut {
                Some(new) => Affected {
                    slot,
                    marked: true,
                    num_computed_tokens: new,
                    num_affected_tokens: num_computed - new,
                },
                // vLLM counts the step's tokens, recomputed once the sharer has.
                None => Affected {
                    slot,
                    marked: false,
                    num_computed_tokens: num_computed,
                    num_affected_tokens: request.num_computed_tokens.saturating_sub(num_computed),
                },
            })
        };
        let mut marked = FxHashSet::default();
        let loading: Vec<Affected> = (loading.into_iter())
            .filter_map(|slot| {
                // A load that failed before counts its valid prefix already.
                let computed = if self.failed_loads.contains(&slot) {
                    self.req(slot).num_computed_tokens
                } else {
                    self.kv.num_computed_tokens(slot).unwrap_or(0)
                };
                scan(&mut marked, slot, computed)
            })
            .collect();
        let mut marked = FxHashSet::default();
        let running: Vec<Affected> = (self.running.iter())
            .filter_map(|&slot| scan(&mut marked, slot, self.req(slot).num_computed_tokens))
            .collect();
        (loading, running)
    }

    /// Whether a running request's computed tokens can be cut back now: any number of its
    /// steps may be in flight (see `truncate_running`), but not a later one verifying
    /// drafts, whose rejections vLLM would roll back from the cut.
    fn check_truncatable(&self, slot: u32) -> Result<()> {
        let request = self.req(slot);
        if request.num_sampling_steps() > 1 && request.max_spec_in_flight > 0 {
            return Err(Error::input(
                "invalid_block_ids",
                format!("{:?}", request.request_id),
                "names blocks of a running request with several steps in flight verifying \
                 draft tokens (async scheduling with speculative decoding): their rejections \
                 would roll back from the cut (not modelled)",
            ));
        }
        if !matches!(self.kv, Kv::BlockHash(_)) {
            return Err(Error::config(
                "prefix_cache",
                "not block_hash",
                "invalid_block_ids of a running request need the single block-hash pool",
            ));
        }
        Ok(())
    }

    /// Cuts a running request back to `num_computed_tokens` (see `handle_kv_load_failures`):
    /// the step being updated lands with its output dropped. As in vLLM 0.33, whose
    /// `update_from_output` skips the request before `_update_request_with_output`, the
    /// step's output placeholders (async scheduling) are not resolved: they stay counted in
    /// `num_output_placeholders` for good (until a preemption or a session turn resets it),
    /// so the request computes that many positions past its tokens from then on. Its later
    /// steps in flight land as usual and append their tokens.
    fn truncate_running(
        &mut self,
        slot: u32,
        num_computed_tokens: usize,
        evict: bool,
    ) -> Result<()> {
        if let Kv::BlockHash(pool) = &mut self.kv {
            pool.truncate_computed_tokens(&slot, num_computed_tokens, evict)?;
        }
        // The step being updated is the oldest in flight: under async scheduling the engine
        // updates every step in order, so it is the one after the updates so far.
        let landing = self.num_updates + 1;
        let sync = !self.async_scheduling;
        let request = self.req_mut(slot);
        request.num_computed_tokens = num_computed_tokens;
        // Its sampling entry, if that step sampled for it (a later step's stays).
        if (request.in_flight_tokens.front()).is_some_and(|&(step, _)| sync || step <= landing) {
            request.in_flight_tokens.pop_front();
        }
        if request.in_flight_tokens.is_empty() {
            request.max_spec_in_flight = 0;
        }
        request.spec_token_ids.clear();
        Ok(())
    }
}
