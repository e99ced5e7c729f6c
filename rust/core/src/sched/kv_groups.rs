//! The calls on the scheduler's KV memory that only vLLM's coordinator over several KV
//! cache groups answers: per-group block lists and tables, first allocations with loaded
//! tokens over the groups, new-block zeroing, pruning skipped blocks and the groups'
//! counts. The other pools ignore them or answer the single-group value.

use super::{Hit, Kv, other_pool};
use crate::kv::{BlockId, ExternalAllocation, KvGroupSpec, TokenId, prefix_cacheable};
use crate::{Error, Result};

impl Kv {
    /// The encoder tokens of the inputs scheduled with the next allocation: they size its
    /// cross-attention groups (vLLM's `num_encoder_tokens`); 0 clears them. Pools without
    /// such groups ignore them.
    pub fn set_encoder_tokens(&mut self, num_encoder_tokens: usize) {
        if let Kv::Hybrid(h) = self {
            h.encoder_tokens = num_encoder_tokens;
        }
    }

    /// The prompt length of the request in `slot` (vLLM's `num_prompt_tokens`), which
    /// places the coordinator's partial tail-block entries beside differing block sizes
    /// (`KvCoordinator::set_num_prompt_tokens`). Other pools ignore it.
    pub fn set_num_prompt_tokens(&mut self, slot: u32, num_prompt_tokens: usize) {
        if let Kv::Hybrid(h) = self {
            h.pool.set_num_prompt_tokens(&slot, num_prompt_tokens);
        }
    }

    /// Each group's blocks allocated to `slot` since the last call (several KV groups
    /// only; empty otherwise, or when ids were not asked for).
    pub fn take_group_blocks(&mut self, slot: u32) -> Vec<Vec<BlockId>> {
        match self {
            Kv::Hybrid(h) => h.new_blocks.remove(&slot).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Each group's block table of `slot` (several KV groups only; empty otherwise).
    pub fn group_block_ids(&self, slot: u32) -> Vec<Vec<BlockId>> {
        match self {
            Kv::Hybrid(h) => (h.pool.block_ids(&slot).unwrap_or_default())
                .into_iter()
                .map(<[BlockId]>::to_vec)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A first allocation with loaded tokens over the coordinator's groups
    /// (`KvCoordinator::allocate_slots_external`); `false` if it does not fit (nothing
    /// changed). Each group's new blocks wait in `take_group_blocks` when `with_ids`.
    pub fn allocate_external_groups(
        &mut self,
        slot: u32,
        token_ids: &[TokenId],
        hit: &Hit,
        extra_key: Option<u64>,
        alloc: ExternalAllocation<'_>,
        with_ids: bool,
    ) -> Result<bool> {
        let (Kv::Hybrid(h), Hit::Hybrid(hit)) = (self, hit) else {
            return Err(other_pool(slot));
        };
        let allocated =
            (h.pool).allocate_slots_external(&slot, token_ids, Some(hit), extra_key, alloc)?;
        let Some(groups) = allocated else {
            return Ok(false);
        };
        if with_ids {
            h.new_blocks.insert(slot, groups);
        }
        Ok(true)
    }

    /// Zeroes new blocks before use (several KV groups only: vLLM 0.33's
    /// `needs_kv_cache_zeroing` comes with Mamba layers or mixed-precision groups).
    pub fn set_zero_new_blocks(&mut self, on: bool) -> Result<()> {
        match self {
            Kv::Hybrid(h) => {
                h.pool.set_zero_new_blocks(on);
                Ok(())
            }
            _ if !on => Ok(()),
            _ => Err(Error::config(
                "kv_cache_zeroing",
                "True",
                "new blocks are zeroed only with several KV cache groups (kv_groups)",
            )),
        }
    }

    /// Blocks to zero before use handed out since the last call (empty without zeroing).
    pub fn take_new_block_ids(&mut self) -> Vec<BlockId> {
        match self {
            Kv::Hybrid(h) => h.pool.take_new_block_ids(),
            _ => Vec::new(),
        }
    }

    /// Frees what each group of `slot` no longer attends to with `num_processed_tokens`
    /// processed (several KV groups only).
    pub fn prune_skipped_blocks(&mut self, slot: u32, num_processed_tokens: usize) {
        if let Kv::Hybrid(h) = self {
            h.pool.prune_skipped_blocks(&slot, num_processed_tokens);
        }
    }

    /// The groups a prefix-cache store holds (all but bounded-replay windows): what a
    /// connector loads unless it says otherwise. `[0]` for a single-group pool.
    pub fn prefix_cacheable_groups(&self) -> Vec<usize> {
        match self {
            Kv::Hybrid(h) => (h.pool.groups().iter().enumerate())
                .filter(|(_, spec)| prefix_cacheable(spec))
                .map(|(g, _)| g)
                .collect(),
            _ => vec![0],
        }
    }

    /// The coordinator's groups, when this is it.
    pub fn hybrid_groups(&self) -> Option<&[KvGroupSpec]> {
        match self {
            Kv::Hybrid(h) => Some(h.pool.groups()),
            _ => None,
        }
    }

    /// What the next allocation of `slot` at `num_computed` computed tokens drops from its
    /// groups, and how many of those surely return to the free queue
    /// (`KvCoordinator::num_skipped_blocks`); `(0, 0)` for a single-group pool.
    pub fn num_skipped_blocks(&self, slot: u32, num_computed: usize) -> (usize, usize) {
        match self {
            Kv::Hybrid(h) => h.pool.num_skipped_blocks(&slot, num_computed),
            _ => (0, 0),
        }
    }

    /// New blocks, over the groups, an allocation of `slot` up to `num_slots` slots adds
    /// (several KV groups only; 0 otherwise).
    pub fn num_new_group_blocks(&self, slot: u32, num_slots: usize) -> usize {
        match self {
            Kv::Hybrid(h) => h.pool.num_new_blocks(&slot, num_slots),
            _ => 0,
        }
    }
}
