//! A decode window's steps with its requests settled lazily. A `vllm_v1` replica that
//! coalesces decode steps (`crate::sched::multistep`) runs windows of steps in which every
//! running request decodes one token and nothing else happens. Past a window step that
//! every request left with a new output token, the batch's per-request passes have known
//! answers: its shape is the count of the requests and the sum of their processed tokens,
//! none restarted, and at its end each takes the stage time, one token and the same gap
//! (the step's end less the previous step's, where each got its last token). So the
//! simulator prices and ends such steps from a `Ledger` of the window's members and
//! brings each member's record up to date only when someone reads it.
//!
//! A request a window step admitted joins the ledger at that step's end if it took its
//! token then (its first, or a later one) and its replica took it into the window
//! (`sched::multistep_admit`); it owes the steps logged after it joined.
//!
//! Invariant: a member's `SimRequest` is as stepping left it when it joined (the ledger's
//! first step for those it started with); `settle` applies the steps logged since: their stage times added one by one in step
//! order, as the batch-end pass adds them, then their tokens at once
//! (`SimRequest::on_decode_steps`, the same fields as that many `on_batch_end`), so every
//! field is bit-identical to stepping. It happens when the replica releases the member (it
//! finished), and for every member before the replica forms a batch that is not the
//! window's next step (`ReplicaPolicy::next_batch_continues_window` says, before
//! `next_batch` runs, which may preempt or read a request). The token-gap histogram counts
//! a step's gap once per member, at the step's end, as stepping records it per request.

use super::super::arena::Requests;
use super::super::batch::BatchShape;
use super::super::exec::StageTime;
use super::super::metrics::GapHistogram;
use super::super::request::{ReqIdx, SimRequest};
use crate::{Error, Result};

#[cfg(test)]
thread_local! {
    /// Steps this thread's simulations ended lazily (tests check the path is taken).
    pub(crate) static LAZY_STEPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The members of a window being settled lazily, and the steps they owe.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Members not settled yet, each with its processed tokens when it joined and the
    /// steps logged before (0 for those the ledger started with).
    members: Vec<(ReqIdx, u32, u32)>,
    /// Σ of `members`' processed tokens when they joined less the steps logged before:
    /// with the steps logged so far added per member, their processed tokens now.
    sum_processed: i64,
    /// Steps ended since the first.
    steps: Vec<Step>,
    /// When the last step ended (every member's last token).
    last_end: f64,
    /// Past this many steps logged, those no member owes are dropped (`end_step`).
    compact_at: usize,
}

/// A step ended lazily.
#[derive(Debug, Clone, Copy)]
struct Step {
    end: f64,
    time: StageTime,
    /// Its token gap: its end less the previous step's (each member's previous token).
    gap: f64,
}

/// Steps a ledger logs before it first drops those no member owes.
const COMPACT_STEPS: usize = 256;

impl Ledger {
    /// A ledger from the end of a window step at `now`; `add` gives its members.
    pub fn start(now: f64) -> Self {
        Self {
            last_end: now,
            compact_at: COMPACT_STEPS,
            ..Self::default()
        }
    }

    /// Adds a request of the step that just ended: it must have taken a new output token
    /// at its end (its first, or one with a gap), so every later step gives it one.
    pub fn add(&mut self, idx: ReqIdx, request: &SimRequest) {
        let (processed, logged) = (request.num_processed_tokens, self.steps.len() as u32);
        self.members.push((idx, processed, logged));
        self.sum_processed += processed as i64 - logged as i64;
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// The shape of the window's next step: every member decodes one token over its
    /// processed tokens (one more per step ended).
    pub fn shape(&self) -> BatchShape {
        let n = self.members.len() as u64;
        BatchShape {
            num_requests: n as u32,
            num_decode_tokens: n,
            sum_decode_context: (self.sum_processed + (n * self.steps.len() as u64) as i64) as u64,
            ..BatchShape::default()
        }
    }

    /// The window's step ended at `now`, its stage taking `time`: each member's token gap.
    pub fn end_step(&mut self, now: f64, time: StageTime, gaps: &mut GapHistogram) {
        #[cfg(test)]
        LAZY_STEPS.with(|n| n.set(n.get() + 1));
        let gap = now - self.last_end;
        gaps.record_n(gap, self.members.len() as u64);
        self.last_end = now;
        self.steps.push(Step {
            end: now,
            time,
            gap,
        });
        if self.steps.len() >= self.compact_at {
            self.drop_settled_steps();
        }
    }

    /// Drops the steps every member joined after (a window that admits may outlive many
    /// requests: its ledger would grow for as long as it lives).
    fn drop_settled_steps(&mut self) {
        let owed_from = self.members.iter().map(|&(.., logged)| logged).min();
        let k = owed_from.unwrap_or(self.steps.len() as u32);
        if k > 0 {
            self.steps.drain(..k as usize);
            for (.., logged) in &mut self.members {
                *logged -= k;
            }
            self.sum_processed += self.members.len() as i64 * k as i64;
        }
        self.compact_at = COMPACT_STEPS.max(2 * self.steps.len());
    }

    /// Brings member `idx` up to date and drops it from the ledger (the replica released
    /// it). Returns an error if it is not a member.
    pub fn settle_one(&mut self, idx: ReqIdx, requests: &mut Requests) -> Result<()> {
        let Some(pos) = self.members.iter().position(|&(m, ..)| m == idx) else {
            return Err(Error::Internal(format!(
                "a released request ({idx}) was not in its replica's decode window"
            )));
        };
        let (_, processed, logged) = self.members.swap_remove(pos);
        self.sum_processed -= processed as i64 - logged as i64;
        self.settle(requests.get_mut(idx), logged as usize);
        Ok(())
    }

    /// Brings every member up to date; the ledger is spent.
    pub fn settle_all(self, requests: &mut Requests) {
        for &(idx, _, logged) in &self.members {
            self.settle(requests.get_mut(idx), logged as usize);
        }
    }

    /// The batch-end pass of each step since the member joined (after `logged` steps), as
    /// stepping runs it: the stage times added one by one in step order (the same sums,
    /// bit for bit), then the steps' tokens (`SimRequest::on_decode_steps`).
    fn settle(&self, request: &mut SimRequest, logged: usize) {
        let owed = &self.steps[logged..];
        let (Some(first), Some(last)) = (owed.first(), owed.last()) else {
            return;
        };
        let timing = &mut request.timing;
        let (mut total_s, mut model_s) = (timing.execution_time, timing.model_execution_time);
        let mut max_gap = first.gap;
        for step in owed {
            total_s += step.time.total_s;
            model_s += step.time.model_s;
            max_gap = max_gap.max(step.gap);
        }
        (timing.execution_time, timing.model_execution_time) = (total_s, model_s);
        request.on_decode_steps(owed.len() as u32, first.end, last.end, max_gap);
    }
}
