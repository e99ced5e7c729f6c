//! `vllm_v1`'s decode windows (`crate::sched::multistep`): a replica's steps while a window
//! runs, the admission steps that let a window live through arrivals
//! (`crate::sched::multistep_admit`), and the window's end. The simulator settles the
//! window's requests lazily (`crate::sim::engine::lazy`).

use super::{SAMPLED_TOKEN, VllmV1, output_token};
use crate::Result;
use crate::kv::TokenId;
use crate::sched::DecodeWindow;
use crate::sim::arena::Requests;
use crate::sim::replica::{BatchPlan, PdRole};
use crate::sim::request::ReqIdx;
use crate::sim::tokens::shared_output_token;

/// A decode window in progress: each of its steps is a batch of `ids`, one token each.
pub(super) struct Window {
    pub(super) plan: DecodeWindow,
    /// The requests still in the window, in running order, and their places in the
    /// window's running order when it opened.
    pub(super) ids: Vec<ReqIdx>,
    pub(super) order: Vec<usize>,
    pub(super) ones: Vec<u32>,
    /// Steps whose batch has ended.
    pub(super) num_ended: usize,
    /// The requests the step in flight admitted that sample at its end (`step_samplers`),
    /// and how many it admitted (its batch lists them after the window's).
    pub(super) admitted: Vec<(ReqIdx, u32)>,
    pub(super) num_admitted: usize,
}

impl Window {
    /// Drops the members that finished at the step that just ended (those that do not run
    /// in the next one).
    fn keep_running(&mut self) {
        let step = self.plan.num_formed() + 1;
        let plan = &self.plan;
        let order = &self.order;
        let mut i = 0;
        self.ids.retain(|_| {
            i += 1;
            plan.runs_in(order[i - 1], step)
        });
        self.order.retain(|&j| plan.runs_in(j, step));
        self.ones.truncate(self.ids.len());
    }
}

impl VllmV1 {
    /// Schedules the next step of the decode window in progress, or opens one (see
    /// `crate::sched::multistep`) when the next step is pure decode and nothing else can
    /// happen. `None`: step the scheduler.
    pub(super) fn coalesced_step(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        if self.window.is_none() {
            let eligible = self.coalesce
                && self.spec.is_none()
                && self.adapters.is_none()
                && self.role == PdRole::Aggregated
                && self.samplers.is_empty();
            let mut plan = std::mem::take(&mut self.spare_plan);
            if !(eligible && self.scheduler.open_decode_window_in(&mut plan)) {
                self.spare_plan = plan;
                return Ok(None);
            }
            let ids = self.scheduler.running_ids();
            let ones = vec![1; ids.len()];
            self.window = Some(Window {
                plan,
                order: (0..ids.len()).collect(),
                ids,
                ones,
                num_ended: 0,
                admitted: Vec::new(),
                num_admitted: 0,
            });
        }
        let window = self.window.as_mut().expect("opened above");
        let block = self.hash_block_size;
        let token = || window_tokens(requests, block);
        window.num_admitted = 0;
        let (formed, admissions) = if self.scheduler.num_waiting() == 0 {
            let formed = self.scheduler.form_decode_step(&mut window.plan, token())?;
            (formed, None)
        } else if self.scheduler.window_admits(&window.plan) {
            // An admission step (`crate::sched::multistep_admit`).
            let out = self
                .scheduler
                .schedule_beside_window(&mut window.plan, token())?;
            (out.is_some(), out)
        } else {
            (false, None)
        };
        if !formed {
            // The step needs more blocks than are free (it preempts), or it admits requests
            // and this window cannot take them: stepped.
            let window = self.window.take().expect("checked above");
            if window.plan.num_formed() > 0 {
                self.end_window_early(window, requests)?;
            } else {
                self.spare_plan = window.plan;
            }
            return Ok(None);
        }
        let (mut ids, mut ones) = self.spare_batches.pop().unwrap_or_default();
        ids.clone_from(&window.ids);
        ones.clone_from(&window.ones);
        if let Some(out) = admissions {
            window.admitted.clear();
            window
                .admitted
                .extend_from_slice(self.scheduler.step_samplers());
            window.num_admitted = out.num_scheduled_tokens.len();
            ids.extend(out.num_scheduled_tokens.iter().map(|&(idx, _)| idx));
            ones.extend(out.num_scheduled_tokens.iter().map(|&(_, n)| n as u32));
            debug_assert!(out.preempted_req_ids.is_empty() && out.kv_loads.is_empty());
            self.note_admissions(&out, requests);
            self.scheduler.recycle_output(out);
        }
        Ok(Some((ids, ones)))
    }

    /// The window's step in flight ended: the requests it finished are released (the
    /// others' tokens stay lazy). Its last step (or one after the window was cut) ends as a
    /// stepped batch does. `None`: no window.
    pub(super) fn end_coalesced_step(
        &mut self,
        requests: &Requests,
    ) -> Result<Option<Vec<ReqIdx>>> {
        let Some(window) = &mut self.window else {
            return Ok(None);
        };
        window.num_ended += 1;
        if window.num_admitted > 0 {
            return self.end_admission_step(requests).map(Some);
        }
        if window.num_ended < window.plan.num_steps() {
            let block = self.hash_block_size;
            let finished = self
                .scheduler
                .end_decode_step(&mut window.plan, window_tokens(requests, block))?;
            if !finished.is_empty() {
                window.keep_running();
                window.plan.compact(&mut window.order);
            }
            return Ok(Some(finished.into_iter().map(|(idx, _)| idx).collect()));
        }
        let window = self.window.take().expect("checked above");
        self.end_window(window, requests).map(Some)
    }

    /// The end of a window step that admitted requests: the window's requests finish as at
    /// any of its steps, the admissions sample as a stepped batch's requests do, after them
    /// (they run last). Those that now decode join the window; if one cannot (a prefill
    /// chunk), the window ends here, as stepping goes on from this state.
    fn end_admission_step(&mut self, requests: &Requests) -> Result<Vec<ReqIdx>> {
        let block = self.hash_block_size;
        let window = self.window.as_mut().expect("a window step ended");
        let num_admitted = std::mem::take(&mut window.num_admitted);
        let mut released: Vec<ReqIdx> = (self.scheduler)
            .end_decode_step(&mut window.plan, window_tokens(requests, block))?
            .into_iter()
            .map(|(idx, _)| idx)
            .collect();
        if !released.is_empty() {
            window.keep_running();
        }
        let admitted = std::mem::take(&mut window.admitted);
        let finished = self
            .scheduler
            .append_one_token_each_at(&admitted, window_tokens(requests, block))?;
        let num_members = released.len();
        released.extend(finished.into_iter().map(|(idx, _)| idx));
        let joining = || {
            let finished = &released[num_members..];
            (admitted.iter()).filter(|(idx, _)| !finished.contains(idx))
        };
        // Every admission of the step samples unless it is a prefill chunk.
        let joins = admitted.len() == num_admitted
            && joining().all(|(idx, _)| self.scheduler.can_join_decode_window(&window.plan, idx));
        if joins {
            for (idx, _) in joining() {
                let i = self.scheduler.join_decode_window(&mut window.plan, idx)?;
                window.ids.push(*idx);
                window.order.push(i);
                window.ones.push(1);
            }
            window.plan.compact(&mut window.order);
        }
        window.admitted = admitted;
        window.admitted.clear();
        if !joins {
            let window = self.window.take().expect("checked above");
            self.end_window_early(window, requests)?;
        } else if window.ids.is_empty() {
            let window = self.window.take().expect("checked above");
            self.spare_plan = window.plan;
        }
        Ok(released)
    }

    /// Ends `window` between two steps, before the one its plan has next: its latest step
    /// already ended (finishing the requests it planned to), so the others are caught up
    /// and take that step's token now, and none of them finishes.
    pub(super) fn end_window_early(&mut self, window: Window, requests: &Requests) -> Result<()> {
        if self.end_window(window, requests)?.is_empty() {
            Ok(())
        } else {
            Err(crate::Error::Internal(
                "vllm_v1: a request of a decode window finished before its planned step".into(),
            ))
        }
    }

    /// Catches every request of `window` up with its last scheduled step, and ends that
    /// step as stepping does.
    fn end_window(&mut self, mut window: Window, requests: &Requests) -> Result<Vec<ReqIdx>> {
        let block = self.hash_block_size;
        self.scheduler
            .catch_up_all(&mut window.plan, window_tokens(requests, block))?;
        // Requests that joined after the latest step (listed last) sampled its token already.
        let plan = &window.plan;
        let joined = window.order.iter().rev();
        let num_owing = window.ids.len() - joined.take_while(|&&i| plan.joined_after(i)).count();
        let owing = &window.ids[..num_owing];
        let finished = self
            .scheduler
            .append_one_token_each(owing, window_tokens(requests, block))?;
        self.spare_plan = window.plan;
        Ok(finished.into_iter().map(|(idx, _)| idx).collect())
    }
}

/// [`output_token`] for a window's catch-ups, which ask for runs of one request's tokens:
/// whether the request's block ids reach past its prompt (most do not, and then every
/// output token is `SAMPLED_TOKEN`) is looked up once per run, not per token.
fn window_tokens(requests: &Requests, block: u32) -> impl FnMut(&ReqIdx, usize) -> TokenId + '_ {
    let mut memo: Option<(ReqIdx, bool)> = None;
    move |&idx, position| {
        let shared = match memo {
            Some((m, shared)) if m == idx => shared,
            _ => {
                let r = requests.get(idx);
                // Position 0 lies in the prompt: an id names it exactly when the ids
                // reach past the prompt (`shared_output_token`'s first test).
                let first = shared_output_token(r.original_prefill_tokens, 0, &r.hash_ids, block);
                memo = Some((idx, first.is_some()));
                first.is_some()
            }
        };
        match shared {
            true => output_token(requests.get(idx), position as u64, block),
            false => SAMPLED_TOKEN,
        }
    }
}
