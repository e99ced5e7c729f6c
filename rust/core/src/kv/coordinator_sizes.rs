//! KV cache groups with different block sizes (vLLM 0.33's hybrid layouts whose layer kinds
//! have different page sizes, e.g. Gemma 4: `unify_kv_cache_spec_page_size` grows the block
//! of the layers with smaller pages).
//!
//! The coordinator's `block_size` is then vLLM's `hash_block_size`: requests are hashed at
//! it. Each group keeps its own block size, a multiple of it: it allocates
//! `ceil(tokens / its block size)` blocks and caches a full block under the hash of the
//! block's last hash block (vLLM's `BlockHashListWithBlockSize`: that hash already chains
//! over the whole prefix). Hits land on the scheduler block size, the least common multiple
//! of the groups' (`resolve_kv_cache_block_sizes`), and only tokens below it are cached
//! (`HybridKVCacheCoordinator._align_cacheable`).
//!
//! Invariant: every group's block size is a multiple of the hash block size and divides the
//! scheduler block size; with one block size for all, everything is as before.

use super::{KvCoordinator, KvGroupSpec, RequestKey, check_block_size, spec_groups};
use crate::{Error, Result};

/// Each group's block size and the scheduler block size (their least common multiple),
/// whether the groups take EAGLE's trailing-block drop, and whether full-attention groups
/// keep partial tail-block entries (`coordinator_sizes_tail`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GroupSizes {
    pub(super) groups: Vec<usize>,
    pub(super) scheduler: usize,
    /// EAGLE's drop is on: the flagged groups' hits drop a block (vLLM's managers'
    /// `use_eagle`, `coordinator_eagle`); beside differing block sizes each such group
    /// caches a block past the scheduler block boundary (`EagleGroups::cacheable`) and a
    /// window keeps a block more (`reachable_blocks`).
    pub(super) drop_eagle: bool,
    /// Beside differing block sizes with the drop or a hash look-ahead: full-attention
    /// groups register vLLM's partial tail-block entries (`coordinator_sizes_tail`).
    pub(super) partial_tails: bool,
}

impl GroupSizes {
    pub(super) fn uniform(block_size: usize, num_groups: usize) -> Self {
        Self {
            groups: vec![block_size; num_groups],
            scheduler: block_size,
            drop_eagle: false,
            partial_tails: false,
        }
    }

    /// The prefix of `num_tokens` the groups cache (vLLM's
    /// `HybridKVCacheCoordinator.get_num_cacheable_tokens` without partial hash hits or
    /// re-prefillable tokens): up to the last scheduler block boundary, where hits land.
    pub(super) fn cacheable(&self, num_tokens: usize) -> usize {
        num_tokens / self.scheduler * self.scheduler
    }
}

impl GroupSizes {
    /// vLLM 0.33's `SlidingWindowManager.reachable_block_mask` (dense retention): a window
    /// group whose blocks are finer than the scheduler block size caches only the `need`
    /// blocks before each scheduler block boundary, the only ones a hit (which ends on such
    /// a boundary) can read; where EAGLE's drop acts in the group (`drops`, vLLM's
    /// manager's `use_eagle`) one block more, the run ending a block past the boundary (the
    /// block its hit reads and drops). `None`: every block is cached.
    pub(super) fn reachable_blocks(
        &self,
        spec: &KvGroupSpec,
        g: usize,
        drops: bool,
    ) -> Option<Reachable> {
        let KvGroupSpec::SlidingWindow { sliding_window } = *spec else {
            return None;
        };
        let block_size = self.groups[g];
        let per_segment = self.scheduler / block_size;
        let shift = usize::from(drops);
        let need = (sliding_window - 1).div_ceil(block_size) + shift;
        (need < per_segment).then_some(Reachable {
            per_segment,
            need,
            shift,
        })
    }
}

/// The blocks of a window group a hit can reach (`GroupSizes::reachable_blocks`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Reachable {
    per_segment: usize,
    need: usize,
    /// 1 with EAGLE's drop: the run ends a block past each boundary.
    shift: usize,
}

impl Reachable {
    pub(super) fn reaches(self, block: usize) -> bool {
        block >= self.shift
            && (block - self.shift) % self.per_segment >= self.per_segment - self.need
    }
}

/// How many hash blocks make one block of `group_block_size` tokens.
pub(super) fn scale(group_block_size: usize, hash_block_size: usize) -> usize {
    group_block_size / hash_block_size
}

/// The hash of a group's block `i` when a block holds `scale` hash blocks (vLLM's
/// `BlockHashListWithBlockSize._get_value_at`).
#[inline]
pub(super) fn group_hash_index(i: usize, scale: usize) -> usize {
    (i + 1) * scale - 1
}

/// The first group vLLM 0.33's coordinator cannot serve (or the core does not model)
/// beside groups of different block sizes, and why: full attention and sliding windows
/// are served; a `none`-mode Mamba group without prefix caching (no hit reads its size);
/// a Mamba `align` group without a prefill checkpoint block, unless prefix caching turns
/// on vLLM's fine-grained partial hash hits (a state larger than the hash block: hits
/// inside it copy the shared block, `_apply_cow`, not modelled); chunked local attention
/// without prefix caching, or on the scheduler block size (vLLM's
/// `ChunkedLocalAttentionManager.find_longest_cache_hit` asserts its block is the hit
/// alignment, so any other size fails at vLLM's first lookup).
fn unserved_beside_sizes(
    groups: &[KvGroupSpec],
    sizes: &[usize],
    hash: usize,
    scheduler: usize,
    caching: bool,
) -> Option<(usize, &'static str)> {
    let partial_hits = caching && crate::kv::partial_hash_hits_enabled(groups, sizes, hash);
    let why = |spec: &KvGroupSpec, size: usize| -> Option<&'static str> {
        match spec {
            KvGroupSpec::FullAttention | KvGroupSpec::SlidingWindow { .. } => None,
            KvGroupSpec::Mamba { .. } | KvGroupSpec::MambaPerBlock { .. } if !caching => None,
            KvGroupSpec::MambaAlign { .. } if spec.prefill_checkpoint_alignment().is_some() => {
                Some("a Mamba `align` prefill checkpoint block is not modelled beside them")
            }
            KvGroupSpec::MambaAlign { .. } if partial_hits => Some(
                "a Mamba `align` state larger than the hash block under prefix caching is \
                 vLLM's fine-grained partial hash hit with copy-on-write, not modelled",
            ),
            KvGroupSpec::MambaAlign { .. } => None,
            KvGroupSpec::ChunkedLocalAttention { .. } if !caching || size == scheduler => None,
            KvGroupSpec::ChunkedLocalAttention { .. } => Some(
                "chunked local attention under prefix caching takes the scheduler block size \
                 (vLLM's ChunkedLocalAttentionManager asserts it at its first lookup)",
            ),
            _ => Some(
                "only full attention, sliding windows, Mamba (`none` mode without prefix \
                 caching, `align` mode) and chunked local attention take their own block size",
            ),
        }
    };
    (groups.iter().zip(sizes).enumerate())
        .find_map(|(g, (spec, &size))| Some((g, why(spec, size)?)))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl<R: RequestKey> KvCoordinator<R> {
    /// Gives each group its own block size (vLLM 0.33 layouts whose groups differ in
    /// `block_size`); the coordinator's `block_size` is the hash block size. Every size
    /// must be a multiple of it; the scheduler block size is their least common multiple.
    /// Only while no request holds blocks. Beside differing sizes full attention and
    /// sliding windows are served; a `none`-mode Mamba group without prefix caching (one
    /// state block whatever its size, vLLM's `mamba_block_size` of `max_model_len` in that
    /// mode, or a slot per block of its own size, `MambaPerBlock`); a Mamba `align` group
    /// without a prefill checkpoint block where vLLM's partial hash hits stay off (its hits
    /// then land on the scheduler block size); chunked local attention without prefix
    /// caching or on the scheduler block size; the others are refused by name
    /// (`unserved_beside_sizes`). A hash look-ahead
    /// or EAGLE's block drop then adds vLLM's rules for them (`coordinator_sizes_tail`).
    pub fn set_group_block_sizes(&mut self, block_sizes: &[usize]) -> Result<()> {
        let field = "group_block_sizes";
        if block_sizes.len() != self.groups.len() {
            return Err(Error::config(
                field,
                format!("{block_sizes:?}"),
                format!("must name one block size per group ({})", self.groups.len()),
            ));
        }
        if self.num_requests() > 0 {
            return Err(Error::config(
                field,
                format!("{block_sizes:?}"),
                "the block sizes change only while no request holds blocks",
            ));
        }
        let hash = self.block_size;
        let mut scheduler = 1usize;
        for (g, &size) in block_sizes.iter().enumerate() {
            check_block_size(size)?;
            if !size.is_multiple_of(hash) {
                return Err(Error::config(
                    field,
                    format!("{field}[{g}]={size}"),
                    format!("must be a multiple of the hash block size (block_size={hash})"),
                ));
            }
            scheduler = scheduler / gcd(scheduler, size) * size;
            check_block_size(scheduler).map_err(|_| {
                Error::config(
                    field,
                    format!("{block_sizes:?}"),
                    "their least common multiple is too large a scheduler block size",
                )
            })?;
        }
        let mixed = block_sizes.iter().any(|&s| s != hash);
        let caching = self.enable_caching();
        let unserved = unserved_beside_sizes(&self.groups, block_sizes, hash, scheduler, caching);
        if let Some((g, why)) = unserved.filter(|_| mixed) {
            return Err(Error::config(
                field,
                format!("{block_sizes:?}"),
                format!("groups[{g}]={:?}: {why}", self.groups[g]),
            ));
        }
        if block_sizes != self.sizes.groups.as_slice() {
            // A group block's key is the hash of its last hash block at any size, so blocks
            // cached at the old sizes would be hit as blocks of the new ones.
            self.reset_prefix_cache();
        }
        self.sizes = GroupSizes {
            groups: block_sizes.to_vec(),
            scheduler,
            drop_eagle: self.sizes.drop_eagle,
            partial_tails: false,
        };
        self.refresh_partial_tails();
        self.lookup_order = spec_groups(&self.groups, &self.sizes.groups);
        self.eagle.widen(&self.lookup_order);
        Ok(())
    }

    /// Each group's block size (all the hash block size unless set apart).
    pub fn group_block_sizes(&self) -> &[usize] {
        &self.sizes.groups
    }

    /// vLLM's `scheduler_block_size`: the least common multiple of the groups' block
    /// sizes, where prefix hits land.
    pub fn scheduler_block_size(&self) -> usize {
        self.sizes.scheduler
    }

    /// EAGLE's trailing-block drop in every group (vLLM 0.33's `KVCacheCoordinator` with
    /// `use_eagle` and no group flagged `is_eagle_group`, which flags them all): each spec
    /// group's hit reads one of its blocks past the candidate length and drops it, a window
    /// group needing one contiguous block more (`HybridKVCacheCoordinator
    /// .find_longest_cache_hit`, `eagle_verified`); each group caches one of its blocks past
    /// the last scheduler block boundary (`get_num_cacheable_tokens`), and beside differing
    /// block sizes full-attention groups keep partial tail-block entries
    /// (`coordinator_sizes_tail`). Only while no request holds blocks.
    ///
    /// Errors: `ConfigError` without prefix caching, beside a chunked local attention group
    /// flagged as an EAGLE group (vLLM's `ChunkedLocalAttentionManager` asserts no drop;
    /// `coordinator_eagle`), or while a request holds blocks.
    pub fn set_eagle_block_drop(&mut self, on: bool) -> Result<()> {
        let field = "eagle_block_drop";
        if on && !self.enable_caching() {
            return Err(Error::config(
                field,
                on,
                "the drop acts on prefix hits: it needs prefix caching",
            ));
        }
        // Only where the group is an EAGLE group (`coordinator_eagle`).
        if let Some(g) = self.flagged_chunked_local().filter(|_| on) {
            return Err(Error::config(
                field,
                on,
                format!(
                    "groups[{g}] is chunked local attention, which vLLM 0.33's hybrid \
                     coordinator serves without the EAGLE drop"
                ),
            ));
        }
        if on != self.eagle_block_drop() && self.num_requests() > 0 {
            return Err(Error::config(
                field,
                on,
                "the drop changes only while no request holds blocks",
            ));
        }
        self.sizes.drop_eagle = on;
        self.refresh_partial_tails();
        Ok(())
    }

    /// Whether the groups' hits drop EAGLE's block ([`Self::set_eagle_block_drop`]).
    pub fn eagle_block_drop(&self) -> bool {
        self.sizes.drop_eagle
    }

    /// Whether some group's block size is not the hash block size (the groups then
    /// differ in block size, or all are a multiple of it: either way hits land on the
    /// scheduler block size, not on every hash block).
    pub fn has_mixed_block_sizes(&self) -> bool {
        self.sizes.scheduler != self.block_size
    }
}

#[path = "coordinator_sizes_tail.rs"]
mod tail;
pub(super) use tail::{cache_partial_tail, forget_partial, registers_partial_tail};

#[cfg(test)]
#[path = "coordinator_sizes_kinds_tests.rs"]
mod kinds_tests;
