//! A decode window's admission steps (`multistep`): a step of the window that also admits
//! waiting requests, and requests joining the window once their prefill sampled, so a new
//! request no longer ends the window of the requests already decoding.
//!
//! Why it is the stepped step. `schedule()` (vLLM 0.33's `Scheduler.schedule`, without
//! `prioritize_prefill`) serves the running requests first, then admits waiting ones if
//! none was preempted. In a window step the running requests are exactly the window's,
//! each takes one token (`schedule_running`: `clamp` of one pending token under a
//! threshold of at least one and a budget of at least the running count), their pool moves
//! are the window's (`form_decode_step`, which declines a step whose new blocks do not fit:
//! the only way the running phase could preempt), so it leaves `max_num_batched_tokens -
//! running` tokens of budget, no preemption and no running prefill (`prefill_scheduled`
//! false). The waiting phase (`schedule_waiting`) then reads of the running requests only
//! their count (`max_num_seqs`, the long-prefill threshold), their LoRA ids (fixed at
//! arrival) and, through the plan, the count of running requests scheduled (read only to
//! pad an admission with drafts: speculative configs are refused here), and of the pool
//! only what the window's catch-ups already made exact (free blocks, cached blocks, the
//! free queue's order). So it runs as it is, after the window's step, on a plan holding
//! only the admissions; the step's output lists only them, and the members stay lazy.
//! Configurations where the running phase reads more (multimodal encoder budgets, hooks,
//! deferred block frees, Mamba alignment, `prioritize_prefill`, KV groups) keep the old
//! rule: a new request ends the window (`window_admits`).
//!
//! Joining. An admitted request whose prefill sampled at the step's end decodes from the
//! next step on: it joins the window (`join_decode_window`), placed last in running order
//! as `start_running` placed it, with its base at its computed tokens and its first step
//! the next one. An admission still prefilling (a chunk) ends the window after the step.

use super::Scheduler;
use super::budget::StepBudget;
use super::multistep::DecodeWindow;
use super::output::SchedulerOutput;
use crate::kv::{RequestKey, TokenId};
use crate::{Error, Result};

#[cfg(test)]
thread_local! {
    /// Window steps this thread's schedulers formed with an admission phase (tests check
    /// the path is taken).
    pub(crate) static ADMISSION_STEPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl<R: RequestKey> Scheduler<R> {
    /// Whether `window`'s steps may admit waiting requests and take them in (see the
    /// module doc); `false`: a new request ends the window, as stepping would.
    pub fn window_admits(&self, window: &DecodeWindow) -> bool {
        !window.hybrid
            && !window.cut
            && !self.config.prioritize_prefill
            && self.config.num_speculative_tokens == 0
            && self.config.mamba_align.is_none()
            && self.num_mm_requests == 0
            && self.hooks.is_none()
            && self.ec_connector.is_none()
            && self.aux_outputs.is_none()
            && self.interrupted_step.is_none()
            && !self.block_frees.enabled
            && self.finished_in_flight.is_empty()
    }

    /// The window's next step followed by `schedule()`'s waiting phase: the window's pool
    /// moves (`form_decode_step`), then admissions in the budget its requests leave. The
    /// output lists the admissions only (the window's requests stay lazy). `None`,
    /// changing nothing: the step's new blocks do not fit (stepping would preempt).
    pub fn schedule_beside_window(
        &mut self,
        window: &mut DecodeWindow,
        token: impl FnMut(&R, usize) -> TokenId,
    ) -> Result<Option<SchedulerOutput<R>>> {
        if !self.window_admits(window) {
            return Err(Error::Internal(
                "a decode window admitted where its configuration does not let it".into(),
            ));
        }
        // Read before the step, as `schedule()` reads them (the step changes neither the
        // running nor the waiting count).
        let threshold = self.long_prefill_threshold();
        if !self.form_decode_step(window, token)? {
            return Ok(None);
        }
        #[cfg(test)]
        ADMISSION_STEPS.with(|n| n.set(n.get() + 1));
        self.step_threshold = threshold;
        self.defer_prefills = self.prefill_gate(false);
        self.encoder_begin_step();
        // Each running request (the window's) took one token.
        // (A window takes no draft slots: one charge covers them all.)
        let mut budget = StepBudget::of(&self.config);
        budget.take(self.running.len());
        let mut plan = std::mem::take(&mut self.spare_plan);
        let admission_error = self.schedule_waiting(&mut budget, &mut plan)?;
        self.close_step(plan, admission_error).map(Some)
    }

    /// Whether the running request `request_id` may join `window` after its latest step
    /// ended: it decodes one token a step from the next on (as the window's requests do),
    /// and the running requests' tokens still fit one step's budget.
    pub fn can_join_decode_window(&self, window: &DecodeWindow, request_id: &R) -> bool {
        let Some(&slot) = self.index.get(request_id) else {
            return false;
        };
        self.window_admits(window)
            && self.running.len() <= self.config.step_token_cap()
            && self.window_steps_left(slot).is_some()
    }

    /// Adds the running request `request_id` to `window` from its next step on (check
    /// [`Self::can_join_decode_window`] first); returns its number in the window.
    pub fn join_decode_window(
        &mut self,
        window: &mut DecodeWindow,
        request_id: &R,
    ) -> Result<usize> {
        let slot = *self
            .index
            .get(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let Some(left) = self.window_steps_left(slot) else {
            return Err(Error::Internal(
                "a request joined a decode window it cannot decode in".into(),
            ));
        };
        let bs = self.config.block_size;
        let t0 = window.formed;
        let base = self.req(slot).num_computed_tokens;
        let held = self.kv.block_ids(slot).map_or(0, <[_]>::len);
        // Step s > t0 computes token base + s - t0 - 1, so it needs slots for base + s - t0
        // tokens: a new block at the first s past the held ones, a full block when that
        // count is a multiple of the block size (as `open_decode_window_in` with t0 = 0).
        let first_alloc = (held * bs + 1).saturating_sub(base).max(1) + t0;
        let fills = (t0 % bs + bs - base % bs) % bs;
        let i = window.slots.len();
        // Its number is the largest: each bucket stays in running order.
        window.buckets[first_alloc % bs].push(i as u32);
        if self.config.enable_prefix_caching && fills != first_alloc % bs {
            window.buckets[fills].push(i as u32);
        }
        let last = t0 + left;
        window.slots.push(slot);
        window.base.push(base);
        window.start.push(t0);
        window.last.push(last);
        window.first_alloc.push(first_alloc);
        window.done.push(false);
        window.num_steps = window.num_steps.max(last);
        let entry = (last as u32, i as u32);
        let pending = &window.finishes[window.next_finish..];
        let at = window.next_finish + pending.partition_point(|&f| f < entry);
        window.finishes.insert(at, entry);
        Ok(i)
    }
}

/// Window steps this thread's schedulers formed with an admission phase.
#[cfg(test)]
pub(crate) fn admission_steps() -> u64 {
    ADMISSION_STEPS.with(std::cell::Cell::get)
}

impl DecodeWindow {
    /// Drops the finished requests from the window's lists once they outnumber the live
    /// ones (a window that admits may outlive many requests, and its step checks walk its
    /// buckets), renumbering the live ones in the same order; `order` (the caller's window
    /// numbers, in running order) is renumbered with them. Between steps only.
    pub fn compact(&mut self, order: &mut [usize]) {
        let num_done = self.next_finish;
        if num_done < 32 || num_done <= self.slots.len() - num_done {
            return;
        }
        let mut renumbered = vec![u32::MAX; self.slots.len()];
        let mut next = 0;
        for (i, new) in renumbered.iter_mut().enumerate() {
            if !self.done[i] {
                *new = next;
                next += 1;
            }
        }
        keep_live(&mut self.base, &renumbered);
        keep_live(&mut self.start, &renumbered);
        keep_live(&mut self.last, &renumbered);
        keep_live(&mut self.first_alloc, &renumbered);
        keep_live(&mut self.slots, &renumbered);
        // The map keeps the order: each bucket stays in running order.
        for bucket in &mut self.buckets {
            bucket.retain_mut(|i| {
                *i = renumbered[*i as usize];
                *i != u32::MAX
            });
        }
        self.finishes.drain(..self.next_finish);
        for (_, i) in &mut self.finishes {
            *i = renumbered[*i as usize];
        }
        self.next_finish = 0;
        self.done.clear();
        self.done.resize(self.slots.len(), false);
        for i in order {
            *i = renumbered[*i] as usize;
        }
    }
}

/// Keeps the entries of `v` whose number `renumbered` keeps (not `u32::MAX`), in order.
fn keep_live<T>(v: &mut Vec<T>, renumbered: &[u32]) {
    let mut i = 0;
    v.retain(|_| {
        i += 1;
        renumbered[i - 1] != u32::MAX
    });
}
