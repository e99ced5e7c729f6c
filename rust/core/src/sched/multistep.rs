//! Coalesced decode steps: a run of steps in which every running request decodes one token
//! and nothing else can happen, planned at once and applied lazily. The simulator uses it
//! (`sim::replica::v1`); what it skips is the per-step work of `schedule()` and
//! `append_one_token_each` for every request, not any decision.
//!
//! A window opens only when a step would schedule exactly the running requests, one decode
//! token each, in running order: nothing waits, no request has work in flight, drafts,
//! stop tokens or a connector, the token budget covers them all, and the pool is the
//! block-hash one without a host tier. It lasts until the first step at which a request
//! would finish (that step is its last), or the step before the first allocation the free
//! blocks could not satisfy (which would preempt). Within it each request's tokens and
//! computed count lag behind, and are caught up only at the steps where the pool does
//! something for it: a new block (which may evict a cached one) and, with prefix caching,
//! a block becoming full (hashed and cached). Those catch-ups run in step order and, within
//! a step, in running order, so the pool makes the same moves, in the same order, with the
//! same cache events, as stepping one by one. Invariant: after `form_step` for step `j`, the
//! pool's block counts (free blocks, usage, events) are those of the stepped run after step
//! `j` was scheduled; after `catch_up_all` every request is too.

use super::Scheduler;
use super::request::RequestStatus;
use crate::kv::{RequestKey, TokenId};
use crate::{Error, Result};

/// A planned run of decode steps over the running requests (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct DecodeWindow {
    /// The running requests' slots, in running order.
    slots: Vec<u32>,
    /// Each one's computed tokens when the window opened; step `j` (from 1) computes token
    /// `base + j - 1`.
    base: Vec<usize>,
    /// Steps in the window; the last one may see requests finish.
    num_steps: usize,
    /// Steps scheduled so far.
    formed: usize,
    /// (step, index into `slots`) where the pool acts for a request, in step then running
    /// order; `next` is the first not yet caught up.
    catch_ups: Vec<(u32, u32)>,
    next: usize,
}

impl DecodeWindow {
    pub fn num_steps(&self) -> usize {
        self.num_steps
    }

    /// Steps scheduled so far.
    pub fn num_formed(&self) -> usize {
        self.formed
    }

    /// Ends the window after the steps already scheduled.
    pub fn cut(&mut self) {
        self.num_steps = self.formed;
    }
}

impl<R: RequestKey> Scheduler<R> {
    /// Plans a window of at most `max_steps` coalesced decode steps from the current state,
    /// or `None` if the next step is not one (see the module doc) or fewer than 2 would be.
    /// Changes nothing.
    pub fn open_decode_window(&self, max_steps: usize) -> Option<DecodeWindow> {
        let coalescible = self.plugin.is_none()
            && self.connector.is_none()
            && !self.async_scheduling
            && self.waiting.len() == 0
            && !self.running.is_empty()
            && self.running.len() <= self.config.max_num_batched_tokens
            && self.config.num_lookahead_tokens == 0
            && self.config.host_num_blocks == 0
            && !self.kv.is_radix()
            && self.finished_in_flight.is_empty()
            && self.landed.is_empty()
            && self.failed_loads.is_empty();
        if !coalescible {
            return None;
        }
        let bs = self.config.block_size;
        let caching = self.config.enable_prefix_caching;
        let max_model_len = self.config.max_model_len;
        let mut num_steps = max_steps;
        for &slot in &self.running {
            let r = self.req(slot);
            let decoding = r.status == RequestStatus::Running
                && r.num_computed_tokens + 1 == r.num_tokens()
                && r.num_output_placeholders == 0
                && r.num_sampling_steps == 0
                && r.spec_token_ids.is_empty()
                && r.spec.stop_token_ids.is_empty()
                && (r.spec.ignore_eos || r.spec.eos_token_id.is_none());
            if !decoding {
                return None;
            }
            // Step s appends the request's (num_output + s)-th output: it finishes at the
            // first s reaching max_tokens or max_model_len (`stop_reason`).
            let until_finish = (r.spec.max_tokens - r.num_output_tokens())
                .min(max_model_len.saturating_sub(r.num_tokens()));
            num_steps = num_steps.min(until_finish);
        }
        if num_steps < 2 {
            return None;
        }
        let mut catch_ups = Vec::new();
        let mut allocations = Vec::new();
        for (i, &slot) in self.running.iter().enumerate() {
            let base = self.req(slot).num_computed_tokens;
            let held = self.kv.block_ids(slot).map_or(0, <[_]>::len);
            // Step s needs slots for base + s tokens: a new block at the step whose token
            // opens one. With caching, the step whose token fills a block caches it.
            let first_alloc = (held * bs + 1).saturating_sub(base).max(1);
            let mut s = first_alloc;
            while s <= num_steps {
                catch_ups.push((s as u32, i as u32));
                allocations.push(s);
                s += bs;
            }
            if caching {
                let mut s = bs - base % bs;
                while s <= num_steps {
                    catch_ups.push((s as u32, i as u32));
                    s += bs;
                }
            }
        }
        // Allocations fail (and would preempt) from the first one past the free blocks.
        let free = self.kv.num_free_blocks();
        if allocations.len() > free {
            allocations.sort_unstable();
            num_steps = num_steps.min(allocations[free] - 1);
            if num_steps < 2 {
                return None;
            }
        }
        catch_ups.retain(|&(s, _)| s as usize <= num_steps);
        catch_ups.sort_unstable();
        catch_ups.dedup();
        Some(DecodeWindow {
            slots: self.running.clone(),
            base: (self.running.iter())
                .map(|&s| self.req(s).num_computed_tokens)
                .collect(),
            num_steps,
            formed: 0,
            catch_ups,
            next: 0,
        })
    }

    /// Schedules the window's next step: the pool's moves of that step happen now (see the
    /// module doc). `token(id, position)` is the token a request sampled at `position`.
    pub fn form_decode_step(
        &mut self,
        window: &mut DecodeWindow,
        mut token: impl FnMut(&R, usize) -> TokenId,
    ) -> Result<()> {
        if window.formed >= window.num_steps {
            return Err(Error::Plugin(
                "a decode window ran past its last step".into(),
            ));
        }
        window.formed += 1;
        self.num_steps += 1;
        // A stepped schedule() reports these with its output; nobody reads them here.
        self.finished_since_last_step.clear();
        let step = window.formed as u32;
        while let Some(&(s, i)) = window.catch_ups.get(window.next) {
            if s > step {
                break;
            }
            window.next += 1;
            self.catch_up(window, i as usize, &mut token)?;
        }
        Ok(())
    }

    /// Brings every request of the window to where stepping would have it with the latest
    /// step scheduled and in flight. The window's steps after it must not run.
    pub fn catch_up_all(
        &mut self,
        window: &mut DecodeWindow,
        mut token: impl FnMut(&R, usize) -> TokenId,
    ) -> Result<()> {
        for i in 0..window.slots.len() {
            self.catch_up(window, i, &mut token)?;
        }
        window.num_steps = window.formed;
        Ok(())
    }

    /// Request `i` of the window as stepping has it once step `formed` is scheduled: the
    /// outputs of the steps before it appended, the step's token computed, slots for it.
    fn catch_up(
        &mut self,
        window: &DecodeWindow,
        i: usize,
        token: &mut impl FnMut(&R, usize) -> TokenId,
    ) -> Result<()> {
        let slot = window.slots[i];
        let computed = window.base[i] + window.formed;
        let request = self.slots[slot as usize]
            .as_mut()
            .expect("a window's request is live");
        if request.num_computed_tokens == computed {
            return Ok(());
        }
        while request.num_tokens() < computed {
            let t = token(&request.request_id, request.num_tokens());
            request.all_token_ids.push(t);
        }
        let known = self.kv.num_tokens(slot).unwrap_or(0);
        let new_tokens = &request.all_token_ids[known..computed];
        let n = computed - request.num_computed_tokens;
        let allocated = self
            .kv
            .allocate(slot, new_tokens, n, 0, None, None, false)?;
        if allocated.is_none() {
            return Err(Error::Plugin(
                "a coalesced decode step found no free block (the window was planned wrong)".into(),
            ));
        }
        let request = self.req_mut(slot);
        request.num_computed_tokens = computed;
        request.num_sampling_steps = 1;
        request.last_num_spec_tokens = 0;
        Ok(())
    }
}
