//! Preemption: the victim a step picks when memory runs out (FCFS: the last running
//! request; priority: the largest `(priority, arrival)`; a plugin's order), sending it back
//! to the front of the waiting queue to be recomputed, and vLLM 0.33's `_preempt_request`
//! called from outside a step.

use super::{Policy, PriorityTies, RequestKey, RequestStatus, Result, Scheduler, StepPlan};
use crate::sched::budget::StepBudget;

impl<R: RequestKey> Scheduler<R> {
    /// Preempts a running request from outside a step (vLLM 0.33's `_preempt_request`
    /// called directly): its blocks are freed, it goes back to the head of the waiting
    /// queue and recomputes, and the outputs of its steps in flight are still accepted, as
    /// after a preemption within a step. Errors if the request is not running.
    pub fn preempt_request(&mut self, request_id: &R) -> Result<()> {
        let slot = *(self.index.get(request_id))
            .ok_or_else(|| crate::Error::unknown_request(request_id))?;
        if !self.running.contains(&slot) {
            return Err(crate::Error::input(
                "request_id",
                format!("{request_id:?}"),
                "is not running: only a running request can be preempted",
            ));
        }
        let slot = self.preempt(slot, &mut StepBudget::default(), &mut StepPlan::default())?;
        self.mark_stale(slot, false);
        Ok(())
    }

    /// FCFS: the last running request. Priority: the largest `(priority, arrival)`.
    /// Plugin: the first in its preemption order; requests admitted after it was asked
    /// (so unranked) go first, latest first.
    pub(super) fn pick_victim(&self) -> u32 {
        if self.plugin.is_some() {
            let unranked = self
                .running
                .iter()
                .rev()
                .find(|s| !self.victim_rank.contains_key(s));
            let ranked = self.running.iter().min_by_key(|s| self.victim_rank.get(s));
            return *unranked
                .or(ranked)
                .expect("a running request is allocating");
        }
        match self.config.policy {
            Policy::Fcfs => *self
                .running
                .last()
                .expect("a running request is allocating"),
            Policy::Priority => self.priority_victim(),
        }
    }

    /// The running request with the largest `(priority, arrival_time)`; among ties, vLLM
    /// 0.33's `max(running, ...)` keeps the first in running order (Rust's `max_by` keeps
    /// the last, so scan backwards), the arrival-order rule the latest arrival.
    fn priority_victim(&self) -> u32 {
        let running = self.running.iter().copied();
        // Compared in place: a priority key would clone each request id.
        let by_priority = |a: u32, b: u32| {
            let (a, b) = (&self.req(a).spec, &self.req(b).spec);
            (a.priority.cmp(&b.priority)).then(a.arrival_time.total_cmp(&b.arrival_time))
        };
        let victim = match self.config.priority_ties {
            PriorityTies::Vllm => running.rev().max_by(|&a, &b| by_priority(a, b)),
            PriorityTies::ArrivalOrder => running.max_by(|&a, &b| {
                by_priority(a, b).then(self.req(a).arrival_seq.cmp(&self.req(b).arrival_seq))
            }),
        };
        victim.expect("a running request is allocating")
    }

    /// Frees the victim's blocks and sends it back to the front of the waiting queue to be
    /// recomputed; refunds its tokens if it was already scheduled in this step. Returns the
    /// slot it waits at: a new one if its blocks wait for a step in flight
    /// (`sched::block_free`).
    pub(in crate::sched) fn preempt(
        &mut self,
        victim: u32,
        budget: &mut StepBudget,
        plan: &mut StepPlan<R>,
    ) -> Result<u32> {
        self.encoder_preempted(victim);
        self.running.retain(|&s| s != victim);
        if plan.take_blocks(victim).is_some() {
            let pos = plan
                .scheduled
                .iter()
                .position(|&(s, _)| s == victim)
                .expect("scheduled");
            budget.refund(plan.scheduled.remove(pos).1);
        }
        plan.admitted.remove(&victim);
        // A step in flight keeps its token (computed before the blocks were freed), async
        // or not: a synchronous engine with several batches in flight (vLLM's batch queue
        // under pipeline parallelism) reports it after this step too.
        let request = self.req_mut(victim);
        request.status = RequestStatus::Preempted;
        request.num_computed_tokens = 0;
        request.num_external_computed_tokens = 0;
        request.num_output_placeholders = 0;
        request.spec_token_ids.clear();
        request.num_preemptions += 1;
        request.inflight_prefill = false;
        let victim = self.free_preempted(victim)?;
        let key = self.priority_key(victim);
        self.waiting.push_front(victim, key, false);
        plan.preempted.push(victim);
        self.num_preemptions += 1;
        Ok(victim)
    }
}
