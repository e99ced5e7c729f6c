//! The outputs in flight of a request preempted under async scheduling (vLLM 0.33's
//! `num_stale_output_tokens` and `drop_stale_output`, `Scheduler._preempt_request`). Its
//! steps scheduled before the preemption still return: either their tokens are delivered
//! (the default: dropping them would perturb speculative acceptance), and then the request
//! is not admitted again until the last of them is updated, since resuming earlier could
//! resample a position that output later delivers (vLLM's admission skip, "it drains within
//! the pipeline depth"); or they are dropped (a reset-prefix-cache preemption, a KV
//! producer's, a parked session's), and it may resume at once, its outputs in flight no
//! longer expected. Steps are counted as `schedule()` forms them and `update_from_output`
//! lands them: the wait is opt-in (`set_wait_for_stale_outputs`, which vLLM's adapter
//! sets), for engines that update every step in order, empty steps included, as vLLM's
//! does (one that skips empty steps' updates would leave the count behind for good).
//! Invariant: `num_updates <= num_steps` while the engine updates only steps it was given.

use super::scheduler::Scheduler;
use crate::kv::RequestKey;

impl<R: RequestKey> Scheduler<R> {
    /// With `true`, a request preempted within a step drops its outputs in flight (vLLM
    /// 0.33 with a KV connector that `requires_kv_delivery`: the producer's hand-off would
    /// find its blocks freed).
    pub fn set_drop_stale_output(&mut self, drop: bool) {
        self.drop_stale_on_preempt = drop;
    }

    /// Whether preemptions within a step drop the outputs in flight
    /// (`set_drop_stale_output`).
    pub fn drop_stale_output(&self) -> bool {
        self.drop_stale_on_preempt
    }

    /// With `true`, a request preempted under async scheduling whose outputs in flight are
    /// delivered is not admitted again until they are (vLLM 0.33's rule). Needs an engine
    /// that calls `update_from_output` once per step scheduled, empty steps included.
    pub fn set_wait_for_stale_outputs(&mut self, wait: bool) {
        self.wait_for_stale = wait;
    }

    /// Whether preempted requests wait for their outputs in flight
    /// (`set_wait_for_stale_outputs`).
    pub fn wait_for_stale_outputs(&self) -> bool {
        self.wait_for_stale
    }

    /// Whether the request's stale share (its outputs in flight at its latest preemption)
    /// is still in flight: under async scheduling (a synchronous engine updates each step
    /// before the next).
    fn stale_in_flight(&self, slot: u32) -> bool {
        self.async_scheduling && self.req(slot).stale_until_step > self.num_updates
    }

    /// vLLM 0.33's admission skip: a preempted request whose stale output is still in
    /// flight and will be delivered waits for it.
    pub(super) fn awaits_stale_output(&self, slot: u32) -> bool {
        self.wait_for_stale && !self.req(slot).drop_stale_output && self.stale_in_flight(slot)
    }

    /// At a preemption (or a session's park): its outputs in flight become stale, dropped
    /// (no longer expected) with `drop`; an earlier drop share still draining keeps them
    /// dropped (vLLM: "an undrained drop-mode share stays dropped: its positions have
    /// already been resampled").
    pub(super) fn mark_stale(&mut self, slot: u32, drop: bool) {
        let draining = self.stale_in_flight(slot);
        let request = self.req_mut(slot);
        request.stale_until_step = request.last_step;
        request.drop_stale_output = drop || (request.drop_stale_output && draining);
        if request.drop_stale_output {
            request.in_flight_tokens.clear();
            request.max_spec_in_flight = 0;
        }
    }
}
