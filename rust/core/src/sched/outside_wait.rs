//! Waits its caller decides: vLLM 0.33's blocked waiting statuses that the core does not
//! model itself (a structured-output grammar still compiling, streaming input its caller
//! awaits, a `WAITING_FOR_REMOTE_KVS` wait whose load the core did not start, as vLLM's own
//! tests and a P/D harness set by hand). vLLM's `_enqueue_waiting_request` queues such a
//! request where it arrives (in `kv_holding_waiting` when `_holds_kv_blocks` says so, which
//! a remote-KV wait does by its status alone) and `schedule()` asks
//! `_handle_blocked_waiting_request` each time its admission loop reaches it: not ready, it
//! is skipped and keeps its place; ready, it is admitted like any waiting request (no blocks
//! held, nothing computed: a prefix lookup and the connector, as a new request). Here the
//! step hooks' `waiting_ready` is that question, asked at the same point.
//!
//! Invariant: a request waiting outside is in the waiting queue, holds no blocks and is
//! counted among the skipped (`deferred`) from the moment its wait begins; a request with
//! no such wait costs the admission loop one field read.

use super::Scheduler;
use crate::kv::RequestKey;
use crate::{Error, Result};

/// Whether a waiting request's wait is its caller's, and which queue part it belongs to
/// while it waits (`Request::outside_wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutsideWait {
    /// No such wait: the core decides alone.
    #[default]
    None,
    /// Skipped among the requests holding no blocks (a grammar compiling, streaming input).
    Queued,
    /// Served with the block holders, as vLLM 0.33's `_holds_kv_blocks` places a request
    /// whose status is `WAITING_FOR_REMOTE_KVS` whether or not it holds blocks: a
    /// remote-KV wait whose load the core did not start.
    HoldingKv,
}

impl<R: RequestKey> Scheduler<R> {
    /// Makes the wait of waiting request `request_id` its caller's (`holds_kv`: served with
    /// the block holders, a remote-KV wait) until the step hooks' `waiting_ready` answers
    /// `true` when admission reaches it, or [`Self::end_outside_wait`]. It keeps its place;
    /// [`Self::requeue_waiting`] moves it. With `defer` it counts as skipped from now on
    /// (vLLM 0.33's `deferred_waiting`, which `_enqueue_waiting_request` adds a blocked
    /// request to on arrival; a queue's `add_request` or `remove_requests` adds none).
    ///
    /// Errors: `UnknownRequest`; `InputError` for a request that is not waiting (running,
    /// a KV load in flight or landed, a parked session) or holds blocks.
    pub fn wait_outside(&mut self, request_id: &R, holds_kv: bool, defer: bool) -> Result<()> {
        let slot = self.waiting_slot(request_id)?;
        self.req_mut(slot).outside_wait = if holds_kv {
            OutsideWait::HoldingKv
        } else {
            OutsideWait::Queued
        };
        if defer {
            self.deferred.insert(slot);
        }
        Ok(())
    }

    /// Ends the outside wait of `request_id`, if it has one; returns whether it had.
    ///
    /// Errors: `UnknownRequest`.
    pub fn end_outside_wait(&mut self, request_id: &R) -> Result<bool> {
        let slot = *self
            .index
            .get(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let request = self.req_mut(slot);
        let waited = request.outside_wait != OutsideWait::None;
        request.outside_wait = OutsideWait::None;
        Ok(waited)
    }

    /// Whether `request_id` is live and waits outside.
    pub fn waits_outside(&self, request_id: &R) -> bool {
        (self.index.get(request_id))
            .is_some_and(|&slot| self.req(slot).outside_wait != OutsideWait::None)
    }

    /// Moves waiting request `request_id` to the back of the block holders (`holding`) or
    /// of the rest: vLLM 0.33's `kv_holding_waiting.add_request` (or `waiting`'s) of a
    /// request its caller took out of a queue with `remove_requests`.
    ///
    /// Errors: `UnknownRequest`; `InputError` for a request that is not waiting without
    /// blocks, as [`Self::wait_outside`].
    pub fn requeue_waiting(&mut self, request_id: &R, holding: bool) -> Result<()> {
        let slot = self.waiting_slot(request_id)?;
        self.waiting.remove(slot);
        let key = self.priority_key(slot);
        self.waiting.push_back_in_part(slot, key, holding);
        Ok(())
    }

    /// The waiting requests served first (vLLM 0.33's `kv_holding_waiting`), in order:
    /// those holding blocks and remote-KV waits outside, as queued.
    pub fn holding_waiting_ids(&self) -> Vec<R> {
        (self.waiting.holding_ordered().into_iter())
            .map(|s| self.req(s).request_id.clone())
            .collect()
    }

    /// The slot of a request waiting in the queue without blocks (a new, preempted or
    /// failed-load request, or one already waiting outside).
    fn waiting_slot(&self, request_id: &R) -> Result<u32> {
        use super::request::RequestStatus;
        let slot = *self
            .index
            .get(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let status = self.req(slot).status;
        let waiting = matches!(status, RequestStatus::Waiting | RequestStatus::Preempted);
        if !waiting || self.kv.block_ids(slot).is_some() {
            return Err(Error::input(
                "request_id",
                format!("{request_id:?}"),
                format!(
                    "is {status:?}{}: only a waiting request holding no blocks waits outside \
                     or is requeued",
                    if waiting { " and holds blocks" } else { "" }
                ),
            ));
        }
        Ok(slot)
    }

    /// Admission reached `slot`, which waits outside: the hooks' `waiting_ready` says
    /// whether the wait is over (the wait goes on without hooks). Returns whether it is.
    pub(super) fn outside_wait_over(&mut self, slot: u32) -> Result<bool> {
        let Some(hooks) = &self.hooks else {
            return Ok(false);
        };
        if !hooks.waiting_ready(self.req(slot))? {
            return Ok(false);
        }
        self.req_mut(slot).outside_wait = OutsideWait::None;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::sched::tests::{config, prompt, scheduled};
    use crate::sched::{Policy, Request, SchedulerConfig, StepHooks};

    /// The caller's side: the ids whose waits are over, and each id asked, in order.
    #[derive(Default, Clone)]
    struct Caller {
        ready: Arc<Mutex<HashSet<u32>>>,
        asked: Arc<Mutex<Vec<u32>>>,
    }

    impl StepHooks<u32> for Caller {
        fn waiting_ready(&self, request: &Request<u32>) -> Result<bool> {
            self.asked.lock().unwrap().push(request.request_id);
            Ok(self.ready.lock().unwrap().contains(&request.request_id))
        }
    }

    impl Caller {
        fn ready(&self, id: u32) {
            self.ready.lock().unwrap().insert(id);
        }

        fn asked(&self) -> Vec<u32> {
            std::mem::take(&mut self.asked.lock().unwrap())
        }
    }

    fn with_caller(cfg: SchedulerConfig) -> (Scheduler<u32>, Caller) {
        let mut s = Scheduler::new(cfg, false).unwrap();
        let caller = Caller::default();
        s.set_step_hooks(Some(Box::new(caller.clone())));
        (s, caller)
    }

    fn ids(out: &crate::sched::SchedulerOutput<u32>) -> Vec<u32> {
        scheduled(out).into_iter().map(|(id, _)| id).collect()
    }

    #[test]
    fn a_remote_kv_wait_given_at_arrival_is_served_first_once_received() {
        // vLLM 0.33: _enqueue_waiting_request files a WAITING_FOR_REMOTE_KVS request in
        // kv_holding_waiting by its status; received, it is admitted before the queue.
        let (mut s, caller) = with_caller(SchedulerConfig {
            max_num_seqs: 1,
            ..config()
        });
        for id in 0..3 {
            s.add_request(id, prompt(id, 2)).unwrap();
        }
        s.wait_outside(&1, true, true).unwrap();
        s.requeue_waiting(&1, true).unwrap();
        assert_eq!(s.holding_waiting_ids(), [1]);
        assert_eq!(s.waiting_ids(), [1, 0, 2]);
        assert_eq!(s.deferred_waiting_ids(), [1]);
        caller.ready(1);
        let out = s.schedule().unwrap();
        assert_eq!(ids(&out), [1]);
        // Admitted as a new request: nothing loaded, its whole prompt computed now.
        assert_eq!(scheduled(&out), [(1, 2)]);
        assert_eq!(s.waiting_ids(), [0, 2]);
        assert!(!s.waits_outside(&1));
        s.check_invariants().unwrap();
    }

    #[test]
    fn a_wait_not_over_is_skipped_and_keeps_its_place_in_its_part() {
        let (mut s, caller) = with_caller(config());
        for id in 0..4 {
            s.add_request(id, prompt(id, 2)).unwrap();
        }
        s.wait_outside(&0, false, true).unwrap();
        s.wait_outside(&2, true, true).unwrap();
        s.requeue_waiting(&2, true).unwrap();
        // Budget 10 fits every 2-token prompt: only the waits stay.
        let out = s.schedule().unwrap();
        assert_eq!(ids(&out), [1, 3]);
        assert_eq!(caller.asked(), [2, 0]);
        assert_eq!(s.holding_waiting_ids(), [2]);
        assert_eq!(s.waiting_ids(), [2, 0]);
        assert_eq!(s.deferred_waiting_ids(), [2, 0]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn a_remote_kv_wait_skipped_from_the_rest_moves_to_the_holders() {
        // vLLM 0.33's skip_request requeues by _holds_kv_blocks, which the status says.
        let (mut s, _caller) = with_caller(SchedulerConfig {
            max_num_seqs: 2,
            ..config()
        });
        for id in 0..3 {
            s.add_request(id, prompt(id, 2)).unwrap();
        }
        s.wait_outside(&0, true, true).unwrap();
        s.schedule().unwrap();
        assert_eq!(s.holding_waiting_ids(), [0]);
        assert_eq!(s.running_ids(), [1, 2]);
    }

    #[test]
    fn received_remote_kv_drains_before_grammar_waits_ready_in_the_same_step() {
        // vLLM 0.33's test_fcfs_mixed_blocked_types_remote_load_drains_first, by the
        // rules: holders first, then the rest in arrival order, each wait asked in turn.
        let (mut s, caller) = with_caller(SchedulerConfig {
            max_num_batched_tokens: 20,
            ..config()
        });
        // 0 grammar, 1 remote KV, 2 streaming input, 3 a 20-token prompt, 4 the tail.
        for (id, len) in [(0, 1), (1, 1), (2, 1), (3, 20), (4, 1)] {
            s.add_request(id, prompt(id, len)).unwrap();
        }
        s.wait_outside(&0, false, true).unwrap();
        s.wait_outside(&1, true, true).unwrap();
        s.requeue_waiting(&1, true).unwrap();
        s.wait_outside(&2, false, true).unwrap();
        let out = s.schedule().unwrap();
        assert_eq!(scheduled(&out), [(3, 20)]);
        assert_eq!(caller.asked(), [1, 0, 2]);
        assert_eq!(s.holding_waiting_ids(), [1]);
        assert_eq!(s.waiting_ids(), [1, 0, 2, 4]);
        s.abort(&[3]).unwrap();
        for id in 0..3 {
            caller.ready(id);
        }
        let out = s.schedule().unwrap();
        assert_eq!(ids(&out), [1, 0, 2, 4]);
        assert_eq!(s.running_ids(), [1, 0, 2, 4]);
        // Each wait was asked once more, then never again.
        assert_eq!(caller.asked(), [1, 0, 2]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn without_hooks_a_wait_lasts_until_ended() {
        let mut s = Scheduler::new(config(), false).unwrap();
        s.add_request(0, prompt(0, 2)).unwrap();
        s.wait_outside(&0, false, true).unwrap();
        assert!(scheduled(&s.schedule().unwrap()).is_empty());
        assert!(s.end_outside_wait(&0).unwrap());
        assert!(!s.end_outside_wait(&0).unwrap());
        assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 2)]);
    }

    #[test]
    fn a_wait_is_asked_only_when_admission_reaches_it() {
        // max_num_seqs full: vLLM's loop breaks before _handle_blocked_waiting_request.
        let (mut s, caller) = with_caller(SchedulerConfig {
            max_num_seqs: 1,
            ..config()
        });
        s.add_request(0, prompt(0, 2)).unwrap();
        s.add_request(1, prompt(1, 2)).unwrap();
        s.wait_outside(&1, true, true).unwrap();
        assert_eq!(ids(&s.schedule().unwrap()), [0]);
        assert!(caller.asked().is_empty());
        s.abort(&[0]).unwrap();
        assert!(scheduled(&s.schedule().unwrap()).is_empty());
        assert_eq!(caller.asked(), [1]);
        assert!(s.waits_outside(&1));
    }

    #[test]
    fn under_priority_a_requeued_wait_keeps_its_key_order() {
        let (mut s, caller) = with_caller(SchedulerConfig {
            policy: Policy::Priority,
            max_num_seqs: 1,
            ..config()
        });
        for id in 0..3 {
            s.add_request(id, prompt(id, 2)).unwrap();
        }
        s.wait_outside(&2, true, true).unwrap();
        s.requeue_waiting(&2, true).unwrap();
        caller.ready(2);
        assert_eq!(ids(&s.schedule().unwrap()), [2]);
    }

    #[test]
    fn only_waiting_requests_without_blocks_wait_outside() {
        let mut s = Scheduler::new(config(), false).unwrap();
        s.add_request(0, prompt(0, 2)).unwrap();
        assert!(s.wait_outside(&9, false, true).is_err());
        s.schedule().unwrap();
        assert!(s.wait_outside(&0, false, true).is_err());
        assert!(s.requeue_waiting(&0, true).is_err());
        assert!(!s.waits_outside(&0));
    }
}
