//! The tokens of each request in steps the engine has not yet updated (vLLM 0.33's
//! `Request.num_in_flight_tokens`, which `_update_after_schedule` raises by every step's
//! scheduled tokens, sampling or not, and `update_from_output` lowers as the step lands).
//! Under async scheduling a window group frees the blocks before its window on the
//! processed-token basis, `num_computed_tokens - num_in_flight_tokens` (vLLM 0.33's
//! `KVCacheManager.allocate_slots`), since a step in flight still reads the blocks just
//! below the optimistic boundary.
//!
//! Steps are numbered as they are scheduled (`ended`) and as they land (`landed`: each
//! `update_from_output` lands the oldest step, as the engine calls it once per step in
//! order). Each request keeps (step, tokens) per step that served it; entries of landed
//! steps are dropped lazily. Tracked only under async scheduling with several KV groups
//! or a window group (a synchronous engine lands each step before the next, so the count
//! is 0 at every allocation), and at most `MAX_STEPS_IN_FLIGHT` steps are held unlanded.
//!
//! Invariant: `landed <= ended`, and a request's entries are in increasing step order.

use super::Scheduler;
use crate::kv::RequestKey;

/// Steps held unlanded at most: an engine that never updates some steps must not grow the
/// requests' entries (the encoder's step queue has the same bound).
const MAX_STEPS_IN_FLIGHT: u64 = 64;

/// The step counters.
#[derive(Debug, Default)]
pub(super) struct StepsInFlight {
    enabled: bool,
    /// Steps scheduled while tracking.
    ended: u64,
    /// Of those, steps the engine updated.
    landed: u64,
}

impl StepsInFlight {
    pub(super) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Self::default()
        }
    }
}

impl<R: RequestKey> Scheduler<R> {
    /// Numbers the step being built; returns its number, or `None` when not tracking.
    pub(super) fn in_flight_begin_step(&mut self) -> Option<u64> {
        let steps = &mut self.steps_in_flight;
        if !steps.enabled {
            return None;
        }
        steps.ended += 1;
        steps.landed = steps
            .landed
            .max(steps.ended.saturating_sub(MAX_STEPS_IN_FLIGHT));
        Some(steps.ended)
    }

    /// Records `n` tokens of step `step` for `slot`.
    pub(super) fn in_flight_record(&mut self, slot: u32, step: u64, n: usize) {
        let landed = self.steps_in_flight.landed;
        let unlanded = &mut self.req_mut(slot).unlanded_steps;
        while unlanded.front().is_some_and(|&(s, _)| s <= landed) {
            unlanded.pop_front();
        }
        unlanded.push_back((step, n));
    }

    /// The oldest step not yet updated lands (`update_from_output`).
    pub(super) fn in_flight_land_step(&mut self) {
        let steps = &mut self.steps_in_flight;
        if steps.landed < steps.ended {
            steps.landed += 1;
        }
    }

    /// vLLM 0.33's `num_in_flight_tokens` of `slot`: its tokens in steps not yet updated
    /// (0 when not tracking). A preempted request keeps the tokens of its steps in flight,
    /// as vLLM's does, until they land.
    #[inline]
    pub(super) fn num_in_flight_tokens(&self, slot: u32) -> usize {
        let landed = self.steps_in_flight.landed;
        (self.req(slot).unlanded_steps.iter())
            .filter(|&&(s, _)| s > landed)
            .map(|&(_, n)| n)
            .sum()
    }
}
