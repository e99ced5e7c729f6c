//! Which KV cache groups EAGLE's trailing-block drop acts in (vLLM 0.33's
//! `KVCacheGroupSpec.is_eagle_group`, read by `KVCacheCoordinator.__init__` into
//! `drop_eagle_group_ids`), and what those groups cache.
//!
//! vLLM drops in the groups flagged as the drafter's (EAGLE/MTP) groups, all of them when
//! none is flagged; the groups sharing one spec are looked up together, so a spec group
//! drops when any member is flagged (`HybridKVCacheCoordinator
//! .verify_and_split_kv_cache_groups`, `SpecGroup.use_eagle`). A group that does not drop
//! takes no proof margin and no `eagle_verified` mark, and a chunked local attention group
//! may stand beside the drop only unflagged (vLLM's `ChunkedLocalAttentionManager` asserts
//! `drop_eagle_block is False`). A group that drops caches up to its block past the aligned
//! computed tokens less the re-prefillable ones of a multi-module MTP drafter; the others
//! up to the aligned computed tokens (`HybridKVCacheCoordinator.get_num_cacheable_tokens`).
//!
//! Invariant: `flags` has one entry per group and at least one is set; `drops` is `flags`
//! widened over the spec groups of the lookup order (a group drops when a group sharing
//! its spec is flagged), recomputed whenever either changes.

use super::{GroupSizes, KvCoordinator, KvGroupSpec, RequestKey, SpecGroup};
use crate::{Error, Result};

/// vLLM's `is_eagle_group` per group and its `num_reprefillable_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EagleGroups {
    flags: Vec<bool>,
    /// Per group, whether the drop acts in it when on (vLLM's manager's `use_eagle`).
    drops: Vec<bool>,
    num_reprefillable_tokens: usize,
}

impl EagleGroups {
    /// Every one of `num_groups` groups flagged (vLLM's fallback), nothing re-prefilled.
    pub(super) fn every(num_groups: usize) -> Self {
        Self {
            flags: vec![true; num_groups],
            drops: vec![true; num_groups],
            num_reprefillable_tokens: 0,
        }
    }

    /// Recomputes `drops` over `lookup_order` (vLLM's `verify_and_split_kv_cache_groups`
    /// turning the drop on in every member of a spec group with a flagged one).
    pub(super) fn widen(&mut self, lookup_order: &[SpecGroup]) {
        self.drops.clone_from(&self.flags);
        for group in lookup_order {
            if group.group_ids.iter().any(|&g| self.flags[g]) {
                group.group_ids.iter().for_each(|&g| self.drops[g] = true);
            }
        }
    }

    /// vLLM 0.33's `HybridKVCacheCoordinator.get_num_cacheable_tokens` of group `g` with
    /// `num_computed` tokens: the aligned computed tokens (`_align_cacheable`), or for a
    /// group that drops (`sizes.drop_eagle`, flagged) with any, its finalized tokens (less
    /// the re-prefillable ones) up to one of its blocks past their aligned part.
    pub(super) fn cacheable(&self, sizes: &GroupSizes, g: usize, num_computed: usize) -> usize {
        let aligned = sizes.cacheable(num_computed);
        if !self.drops_in_group(sizes, g) || aligned == 0 {
            return aligned;
        }
        let finalized = num_computed.saturating_sub(self.num_reprefillable_tokens);
        finalized.min(sizes.cacheable(finalized) + sizes.groups[g])
    }
}

impl EagleGroups {
    /// Whether EAGLE's drop acts in group `g` (vLLM's manager's `use_eagle`): the drop is
    /// on and the group, or one sharing its spec, flagged.
    #[inline]
    pub(super) fn drops_in_group(&self, sizes: &GroupSizes, g: usize) -> bool {
        sizes.drop_eagle && self.drops[g]
    }
}

impl<R: RequestKey> KvCoordinator<R> {
    /// Sets vLLM's `is_eagle_group` of each group: the groups EAGLE's block drop
    /// ([`Self::set_eagle_block_drop`]) acts in. Empty or all `false`: every group, as
    /// vLLM falls back to when none is flagged. Only while no request holds blocks.
    ///
    /// Errors: `ConfigError` naming `is_eagle_group` for a length other than the groups',
    /// for a flagged chunked local attention group while the drop is on (vLLM's manager
    /// asserts it never drops), or while a request holds blocks.
    pub fn set_eagle_groups(&mut self, flags: &[bool]) -> Result<()> {
        let field = "is_eagle_group";
        if !flags.is_empty() && flags.len() != self.groups.len() {
            return Err(Error::config(
                field,
                format!("{flags:?}"),
                format!("must have one flag per KV group ({})", self.groups.len()),
            ));
        }
        let flags = match flags.iter().any(|&f| f) {
            true => flags.to_vec(),
            false => vec![true; self.groups.len()],
        };
        let chunked = chunked_local_flagged(&self.groups, &flags);
        if let Some(g) = chunked.filter(|_| self.sizes.drop_eagle) {
            return Err(Error::config(
                field,
                format!("{flags:?}"),
                format!(
                    "groups[{g}] is chunked local attention, which vLLM 0.33's hybrid \
                     coordinator serves only outside EAGLE's block drop"
                ),
            ));
        }
        if flags != self.eagle.flags && self.num_requests() > 0 {
            return Err(Error::config(
                field,
                format!("{flags:?}"),
                "the EAGLE groups change only while no request holds blocks",
            ));
        }
        self.eagle.flags = flags;
        self.eagle.widen(&self.lookup_order);
        Ok(())
    }

    /// Each group's `is_eagle_group` ([`Self::set_eagle_groups`]; all `true` unless set).
    pub fn eagle_groups(&self) -> &[bool] {
        &self.eagle.flags
    }

    /// vLLM 0.33's `KVCacheCoordinator.num_reprefillable_tokens` (`max(0,
    /// num_prefill_lookahead - 1)`, a multi-module MTP drafter's): under EAGLE's drop the
    /// groups that drop never cache the last this many computed tokens; read once, as vLLM
    /// builds its coordinator once. Only while no request holds blocks.
    ///
    /// Beside a Mamba `align` group the lag acts as in any group that drops (vLLM's flags
    /// cover it when the KV cache config flags none): the state at a chunk's end is cached
    /// only once finalized, so a state the next chunk moves past is never cached.
    ///
    /// Errors: `ConfigError` naming `num_reprefillable_tokens` while a request holds
    /// blocks, or beside a Mamba `align` group with a prefill checkpoint block (vLLM keys
    /// the checkpoint block at its position whatever the lag,
    /// `MambaManager._cache_partial_tail_block`; the core caches it with the lag, so it is
    /// not modelled; the step scheduler refuses that first, naming `num_prefill_lookahead`).
    pub fn set_num_reprefillable_tokens(&mut self, num_tokens: usize) -> Result<()> {
        let field = "num_reprefillable_tokens";
        let checkpoints =
            |g: &KvGroupSpec| g.is_mamba_align() && g.prefill_checkpoint_alignment().is_some();
        if num_tokens > 0 && self.groups.iter().any(checkpoints) {
            return Err(Error::config(
                field,
                num_tokens,
                "beside a Mamba align group with a prefill checkpoint block a multi-module MTP                  drafter's re-prefilled tokens are not modelled",
            ));
        }
        if num_tokens != self.eagle.num_reprefillable_tokens && self.num_requests() > 0 {
            return Err(Error::config(
                field,
                num_tokens,
                "the re-prefillable tokens change only while no request holds blocks",
            ));
        }
        self.eagle.num_reprefillable_tokens = num_tokens;
        Ok(())
    }

    /// Whether `group`'s hits drop EAGLE's block: the drop is on and a member group is
    /// flagged (vLLM's `SpecGroup.use_eagle`).
    pub(super) fn drops_in(&self, group: &SpecGroup) -> bool {
        self.eagle.drops_in_group(&self.sizes, group.group_ids[0])
    }

    /// The first chunked local attention group flagged as an EAGLE group, which the drop
    /// may not act in.
    pub(super) fn flagged_chunked_local(&self) -> Option<usize> {
        chunked_local_flagged(&self.groups, &self.eagle.flags)
    }
}

fn chunked_local_flagged(groups: &[KvGroupSpec], flags: &[bool]) -> Option<usize> {
    let chunked = |s: &KvGroupSpec| matches!(s, KvGroupSpec::ChunkedLocalAttention { .. });
    (groups.iter().zip(flags)).position(|(s, &flag)| flag && chunked(s))
}
