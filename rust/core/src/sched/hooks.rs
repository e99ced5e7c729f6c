//! Step hooks: the step's decisions that a caller may route through its own code, as vLLM
//! 0.33's `Scheduler` routes them through methods a caller can replace on a built
//! scheduler: whether an allocation goes ahead (`KVCacheManager.allocate_slots`; `None`
//! refuses it), where a Mamba `align` split ends a chunk (`_mamba_block_aligned_split`) and
//! whether an encoder input fits (`EncoderCacheManager.can_allocate`);
//! and the running requests' priorities when a victim is picked (vLLM reads
//! `Request.priority` then, which a caller may have changed).
//! Without hooks (the default) nothing is called and the core decides alone.
//!
//! Invariant: a hook only narrows what the core would do — a refused allocation takes the
//! path of an allocation the pool has no room for, and a split never grows a chunk.

use super::config::Policy;
use super::request::Request;
use super::scheduler::Scheduler;
use crate::kv::RequestKey;
use crate::{Error, Result};

/// The replaceable decisions (both default to the core's own answer).
pub trait StepHooks<R>: Send + Sync {
    /// Asked before the core allocates slots for `num_new_tokens` new tokens of `request`
    /// (and `num_lookahead_tokens` past them), at each attempt vLLM 0.33 calls
    /// `allocate_slots`: a running request's (again after each preemption) and an
    /// admission's. `false` refuses: a running request preempts a victim or waits, a
    /// waiting one stays at the head of the queue, as when the pool has no room.
    fn allow_allocation(
        &self,
        request: &Request<R>,
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
    ) -> Result<bool> {
        let _ = (request, num_new_tokens, num_lookahead_tokens);
        Ok(true)
    }

    /// Asked (only while the Mamba `align` split is on) for the tokens a chunk of
    /// `num_new_tokens` from `start` keeps; `core_split` is the core's own split.
    fn mamba_split(
        &self,
        request: &Request<R>,
        start: usize,
        num_new_tokens: usize,
        core_split: usize,
    ) -> Result<usize> {
        let _ = (request, start, num_new_tokens);
        Ok(core_split)
    }

    /// Asked (under the priority policy) for each running request's priority before a
    /// victim is picked, as vLLM 0.33 reads `Request.priority` then (a caller may have
    /// changed it since the request arrived); `None` keeps the one the core holds.
    fn priority(&self, request: &Request<R>) -> Result<Option<i64>> {
        let _ = request;
        Ok(None)
    }

    /// Asked before the encoder cache is asked whether input `input_index` of `request` (its
    /// `mm_features` position) fits, with the step's encoder budget left and the
    /// embeddings already picked for the request this step (vLLM 0.33's
    /// `encoder_cache_manager.can_allocate(request, i, budget, num_embeds_to_schedule)`).
    /// `false` refuses: the request is scheduled up to the item and no further, as when the
    /// cache or budget has no room.
    fn allow_encoder_input(
        &self,
        request: &Request<R>,
        input_index: usize,
        budget_left: usize,
        num_embeds_to_schedule: usize,
    ) -> Result<bool> {
        let _ = (request, input_index, budget_left, num_embeds_to_schedule);
        Ok(true)
    }

    /// Asked when a running request's allocation finds no room, before a victim is picked:
    /// `true` if transfers in flight will free blocks (vLLM 0.33's
    /// `KVConnectorBase_V1.has_pending_block_frees`, HiSparse's pending reclamation), and
    /// the request then waits (no preemption, nothing more of the running queue this step).
    fn pending_block_frees(&self) -> Result<bool> {
        Ok(false)
    }

    /// Asked each time admission reaches a request whose wait is its caller's
    /// (`Scheduler::wait_outside`; vLLM 0.33's `_handle_blocked_waiting_request`): `true`
    /// ends the wait and admission goes on with it as with any waiting request; `false`
    /// skips it, keeping its place. By default the wait goes on.
    fn waiting_ready(&self, request: &Request<R>) -> Result<bool> {
        let _ = request;
        Ok(false)
    }
}

impl<R: RequestKey> Scheduler<R> {
    /// Routes the step's allocation and split decisions through `hooks` from the next step
    /// on (`None`: the core's alone).
    pub fn set_step_hooks(&mut self, hooks: Option<Box<dyn StepHooks<R>>>) {
        self.hooks = hooks;
    }

    /// Whether step hooks are set.
    pub fn has_step_hooks(&self) -> bool {
        self.hooks.is_some()
    }

    /// Whether the allocation about to be made for `slot` goes ahead (always without hooks).
    pub(super) fn allocation_allowed(
        &self,
        slot: u32,
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
    ) -> Result<bool> {
        match &self.hooks {
            None => Ok(true),
            Some(hooks) => {
                hooks.allow_allocation(self.req(slot), num_new_tokens, num_lookahead_tokens)
            }
        }
    }

    /// Whether the hooks report block frees pending (never without hooks), or, with the
    /// HiSparse connector on, its pending reclamation.
    pub(super) fn block_frees_pending(&self) -> Result<bool> {
        // The HiSparse connector's answer is the core's (`sched::hisparse_step`).
        if self.hisparse_connector() {
            return Ok(self.hisparse_pending_reclamation());
        }
        match &self.hooks {
            None => Ok(false),
            Some(hooks) => hooks.pending_block_frees(),
        }
    }

    /// Takes the running requests' priorities from the hooks (under the priority policy
    /// without a plugin; nothing without hooks), before a victim is picked.
    pub(super) fn refresh_running_priorities(&mut self) -> Result<()> {
        if self.hooks.is_none() || self.config.policy != Policy::Priority || self.plugin.is_some() {
            return Ok(());
        }
        let hooks = self.hooks.take().expect("checked above");
        let mut answer = Ok(());
        for i in 0..self.running.len() {
            let slot = self.running[i];
            match hooks.priority(self.req(slot)) {
                Ok(Some(priority)) => self.req_mut(slot).spec.priority = priority,
                Ok(None) => {}
                Err(err) => {
                    answer = Err(err);
                    break;
                }
            }
        }
        self.hooks = Some(hooks);
        answer
    }

    /// The hooks' split of a chunk the core split to `core_split` tokens (the core's
    /// without hooks). A split longer than the chunk is refused (a `Plugin` error).
    pub(super) fn hooked_split(
        &self,
        slot: u32,
        start: usize,
        num_new_tokens: usize,
        core_split: usize,
    ) -> Result<usize> {
        let Some(hooks) = &self.hooks else {
            return Ok(core_split);
        };
        let split = hooks.mamba_split(self.req(slot), start, num_new_tokens, core_split)?;
        if split > num_new_tokens {
            return Err(Error::Plugin(format!(
                "mamba_split: returned {split} tokens for a chunk of {num_new_tokens} \
                 (a split never grows a chunk)"
            )));
        }
        Ok(split)
    }
}
