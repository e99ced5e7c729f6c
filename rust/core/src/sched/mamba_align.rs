//! vLLM 0.33's block-aligned prefill split for Mamba prefix caching in `align` mode
//! (`cache_config.mamba_cache_mode = "align"`; `Scheduler._mamba_block_aligned_split`,
//! vllm/v1/core/sched/scheduler.py): a Mamba layer's state can be cached only where a chunk
//! ends, so a prefill chunk is clipped to end on a block boundary, and never runs past the
//! last block boundary whose state can be reused (`get_mamba_prefill_checkpoint_position`,
//! vllm/v1/kv_cache_interface.py).
//!
//! Modelled: the block-aligned chunk end, the next-boundary stop of a chunk that starts
//! mid-block, the last-checkpoint stop (with EAGLE's block drop and the hash look-ahead),
//! the waiting path's rule that a clipped padded decode drops its padding, and "no aligned
//! chunk fits" (0 tokens), and the backend's internal prefill checkpoint: when every Mamba
//! group has a prefill checkpoint block (`MambaSpec.num_prefill_checkpoint_blocks`,
//! `Scheduler.mamba_has_prefill_checkpoint_blocks`), a prompt's final chunk that can export
//! the last reusable state from inside itself (`is_mamba_prefill_checkpoint_valid`) is not
//! stopped there; the KV groups reserve the block it goes to (`kv::layer_groups`). Not
//! modelled, as they need state the core's KV groups do not hold: fine-grained partial
//! hash hits (a hash block smaller than the Mamba block) and the exact (not block-floored)
//! junction stop of `enable_mamba_shared_prefix_checkpoint` (`mamba_shared_prefix_checkpoint`
//! is false here). The split's side of fine-grained partial hash hits
//! (`Scheduler.mamba_partial_cache_hit`: a hash block below the Mamba block) is modelled
//! ([`MambaSplitRule::with_partial_hits`]): the prompt's last hash boundary is a stop, and
//! the internal checkpoint is placed on the hash grid; the KV groups' side is not served
//! yet (`kv::coordinator_partial` has its lookups), so no scheduler turns it on. The block-floored shared-prefix
//! junction stop is modelled (`split_at_junction`, the request's `shared_prefix_boundary`
//! from its KV groups' lookup).

use super::scheduler::Scheduler;
use crate::kv::RequestKey;
use crate::kv::{mamba_checkpoint_position, mamba_checkpoint_valid, mamba_checkpoint_valid_on};
use crate::{Error, Result};

/// The split's settings (vLLM 0.33's `Scheduler.need_mamba_block_aligned_split` on, and
/// what `_mamba_block_aligned_split` reads besides the hash look-ahead, which is the
/// scheduler's one `SchedulerConfig::num_hash_lookahead_tokens`: [`Self::rule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MambaAlignSplit {
    /// Tokens per Mamba state block (`cache_config.block_size`); > 0.
    pub block_size: usize,
    /// EAGLE prunes the last matching block of a prefix hit, so the last reusable state
    /// moves one block back (`Scheduler.use_eagle_block_drop`, which vLLM's split reads and
    /// a built scheduler may be assigned apart from its KV manager's `use_eagle`).
    pub drop_eagle_block: bool,
}

impl MambaAlignSplit {
    /// A split over blocks of `block_size` tokens, without EAGLE's drop.
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size,
            drop_eagle_block: false,
        }
    }

    /// Refuses a block size of 0.
    pub fn validate(&self) -> Result<()> {
        if self.block_size == 0 {
            return Err(Error::config(
                "mamba_align.block_size",
                0,
                "must be at least 1 (tokens per Mamba state block)",
            ));
        }
        Ok(())
    }

    /// The split under `num_hash_lookahead_tokens` (the scheduler's hash look-ahead).
    pub fn rule(self, num_hash_lookahead_tokens: usize) -> MambaSplitRule {
        MambaSplitRule {
            split: self,
            num_hash_lookahead_tokens,
            partial_hash_block: 0,
        }
    }
}

/// [`MambaAlignSplit`] under a hash look-ahead: what vLLM 0.33's
/// `_mamba_block_aligned_split` computes with (built per use, never stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MambaSplitRule {
    split: MambaAlignSplit,
    /// Tokens past a block that its hash needs (`vllm_config.num_hash_lookahead_tokens`).
    num_hash_lookahead_tokens: usize,
    /// The hash block size when fine-grained partial hash hits are on (vLLM 0.33's
    /// `Scheduler.mamba_partial_cache_hit`, its `hash_block_size`); 0: off.
    partial_hash_block: usize,
}

impl MambaSplitRule {
    /// The split with vLLM 0.33's fine-grained partial hash hits on
    /// (`Scheduler.mamba_partial_cache_hit`: Mamba `align`, a hash block below the Mamba
    /// block, `HybridKVCacheCoordinator.enable_partial_hash_hits`): a prefill also stops at
    /// the prompt's last boundary of `hash_block_size` tokens whose state can be reused,
    /// where a later request's hit may end inside a Mamba block, and the backend's internal
    /// checkpoint is placed on that grid. `hash_block_size` must divide the Mamba block and
    /// be smaller; anything else leaves the rule as it was (vLLM's flag is then off).
    pub fn with_partial_hits(mut self, hash_block_size: usize) -> Self {
        let block = self.split.block_size;
        let fine = hash_block_size > 0 && hash_block_size < block;
        self.partial_hash_block = match fine && block.is_multiple_of(hash_block_size) {
            true => hash_block_size,
            false => 0,
        };
        self
    }

    /// The hash block size the split stops on inside Mamba blocks (`None`: partial hash
    /// hits off).
    pub fn partial_hash_block(&self) -> Option<usize> {
        (self.partial_hash_block > 0).then_some(self.partial_hash_block)
    }

    /// vLLM 0.33's `get_mamba_prefill_checkpoint_position(num_tokens, block_size, ...)`:
    /// the last block boundary whose state can be reused, leaving a token for the logits
    /// (or the hash look-ahead) and, with EAGLE's block drop, one block less.
    pub fn checkpoint_position(&self, num_tokens: usize) -> usize {
        mamba_checkpoint_position(
            num_tokens,
            self.split.block_size,
            self.split.drop_eagle_block,
            self.num_hash_lookahead_tokens,
        )
    }

    /// `get_mamba_prefill_checkpoint_position` on a grid of `grid` tokens.
    fn position_on(&self, num_tokens: usize, grid: usize) -> usize {
        let (drop, lookahead) = (self.split.drop_eagle_block, self.num_hash_lookahead_tokens);
        mamba_checkpoint_position(num_tokens, grid, drop, lookahead)
    }

    /// Tokens of a chunk of `num_new_tokens` starting at `start` that vLLM 0.33's
    /// `_mamba_block_aligned_split` keeps, for a request of `num_prompt_tokens` prompt and
    /// `num_tokens` known tokens; `max_prefill_tokens` is the step's token cap
    /// (`max_num_scheduled_tokens`, lowered by a long-prefill threshold).
    pub fn split(
        &self,
        start: usize,
        num_new_tokens: usize,
        num_prompt_tokens: usize,
        num_tokens: usize,
        max_prefill_tokens: usize,
    ) -> usize {
        let (n, prompt) = (num_new_tokens, num_prompt_tokens);
        self.split_at_junction(start, n, prompt, num_tokens, max_prefill_tokens, 0)
    }

    /// [`Self::split`] for a request whose lookup found a shared prefix some KV group
    /// caches past the agreed hit (vLLM 0.33's `Request.shared_prefix_boundary`, 0 for
    /// none): a chunk across it also stops at its block-floored position (vLLM's junction
    /// stop without `enable_mamba_shared_prefix_checkpoint`), so the Mamba state there is
    /// cached for the requests that share the prefix.
    pub fn split_at_junction(
        &self,
        start: usize,
        num_new_tokens: usize,
        num_prompt_tokens: usize,
        num_tokens: usize,
        max_prefill_tokens: usize,
        shared_prefix_boundary: usize,
    ) -> usize {
        let (n, prompt, junction) = (num_new_tokens, num_prompt_tokens, shared_prefix_boundary);
        self.split_with_checkpoint(
            start,
            n,
            prompt,
            num_tokens,
            max_prefill_tokens,
            junction,
            None,
        )
    }

    /// [`Self::split_at_junction`] where every Mamba group writes prefill checkpoints at
    /// multiples of `checkpoint_alignment` tokens (vLLM 0.33's
    /// `mamba_has_prefill_checkpoint_blocks` with `mamba_prefill_checkpoint_alignment`;
    /// `None`: they write none): a final chunk that can export the last reusable state from
    /// inside itself stops neither there nor at the next block boundary
    /// (`use_internal_checkpoint`).
    #[allow(clippy::too_many_arguments)]
    pub fn split_with_checkpoint(
        &self,
        start: usize,
        num_new_tokens: usize,
        num_prompt_tokens: usize,
        num_tokens: usize,
        max_prefill_tokens: usize,
        shared_prefix_boundary: usize,
        checkpoint_alignment: Option<usize>,
    ) -> usize {
        // Only during prefill; `num_tokens - 1` covers a resumed request's outputs.
        let prefill_end = num_prompt_tokens.max(num_tokens.saturating_sub(1));
        if start >= prefill_end {
            return num_new_tokens;
        }
        let block = self.split.block_size;
        let mut end = start + num_new_tokens;
        // With partial hash hits the checkpoint sits on the hash grid
        // (`ckpt_block_size`); the hash block is the Mamba block otherwise.
        let hash_block = self.partial_hash_block().unwrap_or(block);
        let internal_checkpoint = checkpoint_alignment.is_some_and(|alignment| {
            let checkpoint = self.position_on(prefill_end, hash_block);
            end >= prefill_end
                && match self.partial_hash_block {
                    0 => mamba_checkpoint_valid(start, end, checkpoint, block, alignment),
                    hash => {
                        mamba_checkpoint_valid_on(start, end, checkpoint, hash, block, alignment)
                    }
                }
        });
        let last_cache_position = match internal_checkpoint {
            true => 0,
            false => self.checkpoint_position(num_tokens),
        };
        // A chunk that stops before the prompt's end stops on a block boundary; a block
        // too wide for one chunk advances sub-block and re-aligns at the next boundary.
        if end < prefill_end {
            let aligned_end = end / block * block;
            if aligned_end > start || block <= max_prefill_tokens {
                end = aligned_end;
            }
        }
        let next_block_boundary = if !start.is_multiple_of(block) && !internal_checkpoint {
            (start / block + 1) * block
        } else {
            0
        };
        // The shared-prefix junction (a prefix some group caches past the hit, the Mamba
        // state not): its block-floored position, so the state there gets cached.
        let junction = shared_prefix_boundary;
        let junction_stop = if start < junction && junction < end {
            start + (junction - start) / block * block
        } else {
            0
        };
        // Partial hash hits: the prompt's last reusable hash boundary, unless the backend
        // saves it from inside the final chunk.
        let tail_boundary = match self.partial_hash_block {
            0 => 0,
            _ if internal_checkpoint => 0,
            hash => self.position_on(num_prompt_tokens, hash),
        };
        let tail_stop = if last_cache_position < tail_boundary && tail_boundary < num_prompt_tokens
        {
            tail_boundary
        } else {
            0
        };
        // The earliest mandatory stop strictly inside the chunk.
        end = [
            next_block_boundary,
            last_cache_position,
            tail_stop,
            junction_stop,
        ]
        .into_iter()
        .filter(|&stop| start < stop && stop < end)
        .min()
        .unwrap_or(end);
        end.saturating_sub(start)
    }
}

impl<R: RequestKey> Scheduler<R> {
    /// Turns vLLM 0.33's Mamba `align` split on (`Some`) or off from the next step, as
    /// assigning `Scheduler.need_mamba_block_aligned_split` (and `use_eagle_block_drop`) on
    /// a built vLLM scheduler does.
    pub fn set_mamba_align(&mut self, split: Option<MambaAlignSplit>) -> Result<()> {
        if let Some(split) = &split {
            split.validate()?;
            // The KV groups place prefill checkpoints by the same drop (vLLM 0.33's
            // `MambaManager.drop_eagle_checkpoint_block` follows EAGLE as the split does);
            // the look-ahead both read is the scheduler's one (`KvCoordinator`'s).
            if let Ok(pool) = self.kv.hybrid_pool_mut("set_mamba_align") {
                pool.set_mamba_checkpoint_rule(split.drop_eagle_block);
            }
        }
        self.config.mamba_align = split;
        Ok(())
    }

    /// vLLM 0.33's `Scheduler.mamba_prefill_checkpoint_alignment` when
    /// `mamba_has_prefill_checkpoint_blocks` (every Mamba group has a prefill checkpoint
    /// block): the first Mamba group's alignment; `None` otherwise.
    fn mamba_checkpoint_alignment(&self) -> Option<usize> {
        let mut mamba = self.config.kv_groups.iter().filter(|g| g.is_mamba());
        let first = mamba.next()?.prefill_checkpoint_alignment()?;
        mamba
            .all(|g| g.prefill_checkpoint_alignment().is_some())
            .then_some(first)
    }

    /// The Mamba `align` split in force (`None`: off).
    pub fn mamba_align(&self) -> Option<MambaAlignSplit> {
        self.config.mamba_align
    }

    /// [`Self::mamba_align`] under the scheduler's hash look-ahead (what its chunks follow).
    pub fn mamba_split_rule(&self) -> Option<MambaSplitRule> {
        let lookahead = self.config.num_hash_lookahead_tokens;
        self.config.mamba_align.map(|split| split.rule(lookahead))
    }

    /// Sets the drafter's prefill look-ahead (`SchedulerConfig::num_prefill_lookahead`) from
    /// the next step, as assigning vLLM 0.33's `Scheduler.num_prefill_lookahead` does.
    pub fn set_num_prefill_lookahead(&mut self, num_prefill_lookahead: usize) {
        self.config.num_prefill_lookahead = num_prefill_lookahead;
    }

    /// The drafter's prefill look-ahead in force.
    pub fn num_prefill_lookahead(&self) -> usize {
        self.config.num_prefill_lookahead
    }

    /// vLLM 0.33's `_reserve_prefill_lookahead`: a chunk of `n` tokens from `num_computed`
    /// never ends within `num_prefill_lookahead` tokens of the request's known tokens' end
    /// (the drafter would read past them): it finishes them or leaves that many.
    pub(super) fn reserve_prefill_lookahead(
        &self,
        slot: u32,
        num_computed: usize,
        n: usize,
    ) -> usize {
        let lookahead = self.config.num_prefill_lookahead;
        let remaining = self.req(slot).num_tokens().saturating_sub(num_computed + n);
        if 0 < remaining && remaining < lookahead {
            n.saturating_sub(lookahead - remaining)
        } else {
            n
        }
    }

    /// `n` tokens of `slot` from `start` after the Mamba `align` split (unchanged when off;
    /// routed through the step hooks when set: `sched::hooks`).
    #[inline]
    pub(super) fn mamba_aligned(&self, slot: u32, start: usize, n: usize) -> Result<usize> {
        let Some(rule) = self.mamba_split_rule() else {
            return Ok(n);
        };
        let request = self.req(slot);
        let threshold = self.config.long_prefill_token_threshold;
        // vLLM 0.33's `max_num_scheduled_tokens`.
        let mut max_prefill_tokens = self.config.token_budget();
        if threshold > 0 {
            max_prefill_tokens = max_prefill_tokens.min(threshold);
        }
        let core_split = rule.split_with_checkpoint(
            start,
            n,
            request.num_prompt_tokens(),
            request.num_tokens(),
            max_prefill_tokens,
            request.shared_prefix_boundary,
            self.mamba_checkpoint_alignment(),
        );
        self.hooked_split(slot, start, n, core_split)
    }
}

#[cfg(test)]
#[path = "mamba_partial_tests.rs"]
mod partial_tests;
