//! HiSparse host pages (vLLM 0.33's `KVCacheConfig.hisparse_host_num_blocks`): a host
//! block pool beside the device blocks, as vLLM's `HiSparseSourceManager`
//! (`single_type_kv_cache_manager.py`, over the host `BlockPool` its `bind_host_pool`
//! builds) keeps it for a sparse-attention MLA model. Every page of `block_size` tokens a
//! request holds slots for is backed by a host block, so each device-resident page can be
//! written back and reclaimed; block 0 of the pool is its null block. An allocation whose
//! pages the pool cannot back is refused as one the device pool has no room for (vLLM's
//! `get_num_blocks_to_allocate` answers `num_gpu_blocks + 1`): an admission waits, a
//! running request preempts a victim (or waits for a reclamation,
//! `StepHooks::pending_block_frees`). With `scheduler_reserve_full_isl` the gate at
//! admission asks for the whole prompt's pages (vLLM's `full_sequence_must_fit` through
//! `get_num_blocks_to_allocate`), which is what lets admitted async loads always finish.
//! Pages are released when the request's device blocks are (finish, preemption, a failed
//! or released load; after the fence under deferred frees).
//!
//! The pool hands out real block ids as vLLM's host `BlockPool` does with prefix caching
//! off: from the front of the free queue (`get_new_blocks`), a request's blocks returned
//! tail first to its front (`SingleTypeKVCacheManager.free`, and `BlockPool.free_blocks`
//! reusing blocks without a hash first). With vLLM's HiSparse layout given at
//! construction (the coordinator's HiSparse groups, `kv::coordinator_hisparse`) the source
//! group's table joins the per-group block ids the outputs carry, at its place.
//!
//! Invariant: a request's host table has as many blocks as its first device group (a
//! full-attention group, sized as the source group is) or its single pool's table; the
//! tables and the free queue partition the usable blocks (all but the null block).
//!
//! Not modelled: sharing host pages between requests (vLLM publishes a host page only once
//! the HiSparse connector's worker acknowledges its write-back, and only then can a hit
//! share it). Without that connector nothing is published, so with prefix caching on and
//! the pool on no lookup hits (`host_published_tokens`; beside HiSparse device groups the
//! coordinator caps it too, `kv::coordinator_hisparse`) and the host blocks stay unhashed:
//! the order above holds with caching on too.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::kv::Kv;
use super::scheduler::Scheduler;
use crate::kv::{BlockId, HiSparseConnectorKv, RequestKey};
use crate::{Error, Result};

/// The host page pool's bookkeeping.
#[derive(Debug, Clone)]
pub(super) struct HostPages {
    /// Tokens per host block (the HiSparse source group's `block_size`).
    block_size: usize,
    /// `hisparse_host_num_blocks`, the null block included.
    num_blocks: usize,
    /// Free host blocks, the next taken first (vLLM's `FreeKVCacheBlockQueue`).
    free: VecDeque<BlockId>,
    /// Each device-pool slot's host blocks (slots are dense: a vector, not a map, as the
    /// charge runs for every request a step allocates for).
    tables: Vec<Vec<BlockId>>,
    /// Where the source group sits among vLLM's groups, when the per-group outputs carry
    /// its table (vLLM's layout given at construction).
    source_group: Option<usize>,
    /// Host blocks each slot took since its last output (only with `source_group`).
    new_blocks: FxHashMap<u32, Vec<BlockId>>,
    /// vLLM 0.33's HiSparse connector run on the coordinator (`sched::hisparse_step`): its
    /// host pool takes the place of `free` and `tables` (left empty) while it is on.
    pub(super) connector: Option<Box<HiSparseConnectorKv<u32>>>,
}

impl HostPages {
    /// `hisparse_host_num_blocks`, the null block included.
    pub(super) fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn pages(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    fn held(&self, slot: u32) -> usize {
        self.tables.get(slot as usize).map_or(0, Vec::len)
    }

    /// Whether `num_tokens` of slots for `slot` can be backed beside what it holds.
    fn fits(&self, slot: u32, num_tokens: usize) -> bool {
        if let Some(c) = &self.connector {
            return c.host_fits(&slot, num_tokens);
        }
        self.pages(num_tokens).saturating_sub(self.held(slot)) <= self.free.len()
    }

    /// `slot`'s host table.
    fn table(&self, slot: u32) -> &[BlockId] {
        match &self.connector {
            Some(c) => c.host_table(&slot).unwrap_or_default(),
            None => self.tables.get(slot as usize).map_or(&[], |t| &t[..]),
        }
    }

    fn free_block_ids(&self) -> Vec<BlockId> {
        match &self.connector {
            Some(c) => c.host_free_blocks(),
            None => self.free.iter().copied().collect(),
        }
    }

    fn num_free(&self) -> usize {
        match &self.connector {
            Some(c) => c.host_num_free_blocks(),
            None => self.free.len(),
        }
    }

    /// Grows `slot`'s table to `pages` host blocks (never shrinks it: a device table
    /// only shrinks when it is freed).
    fn grow(&mut self, slot: u32, pages: usize) {
        let held = self.held(slot);
        if pages <= held {
            return;
        }
        let index = slot as usize;
        if index >= self.tables.len() {
            self.tables.resize_with(index + 1, Vec::new);
        }
        debug_assert!(pages - held <= self.free.len(), "host pages over the pool");
        let take = (pages - held).min(self.free.len());
        let added = self.free.drain(..take);
        let table = &mut self.tables[index];
        let start = table.len();
        table.extend(added);
        if self.source_group.is_some() {
            let new = self.new_blocks.entry(slot).or_default();
            new.extend_from_slice(&table[start..]);
        }
    }

    /// Returns `slot`'s host blocks to the front of the queue, tail first (vLLM's
    /// `BlockPool.free_blocks` prepends blocks without a hash: LIFO reuse).
    fn release(&mut self, slot: u32) {
        self.new_blocks.remove(&slot);
        if let Some(table) = self.tables.get_mut(slot as usize) {
            for block in table.drain(..) {
                self.free.push_front(block);
            }
        }
    }
}

/// What [`Scheduler::hisparse_host_pages`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPagesState {
    /// `hisparse_host_num_blocks`, the null block included.
    pub num_blocks: usize,
    /// Tokens per host block.
    pub block_size: usize,
    /// Host blocks free (neither held nor the null block).
    pub num_free_blocks: usize,
}

/// `groups` (a slot's per-group block tables) with the host table put at its place (a
/// free function: the output borrows the request beside it).
pub(super) fn with_host_table(
    pages: &Option<HostPages>,
    slot: u32,
    mut groups: Vec<Vec<BlockId>>,
) -> Vec<Vec<BlockId>> {
    if let Some(h) = pages
        && let Some(index) = h.source_group
        && !groups.is_empty()
    {
        groups.insert(index.min(groups.len()), h.table(slot).to_vec());
    }
    groups
}

impl<R: RequestKey> Scheduler<R> {
    /// Turns vLLM 0.33's HiSparse host page pool on (`Some((num_blocks, block_size))`:
    /// `hisparse_host_num_blocks`, the null block included, and the source group's
    /// `block_size`) or off (`None`), from the next allocation on.
    ///
    /// Errors: a pool of fewer than 2 blocks (or more than the pools take) or a zero
    /// `block_size`; a pool set while requests hold KV blocks (their pages were never
    /// charged), or once the HiSparse connector holds the pool; with
    /// `scheduler_reserve_full_isl` off (HiSparse admits a prompt only if
    /// all its pages fit: vLLM's async loads could otherwise strand each other on host
    /// pages); a block size other than the device pool's, or KV groups whose first is not
    /// full attention (the host table follows it).
    pub fn set_hisparse_host_pages(&mut self, pool: Option<(usize, usize)>) -> Result<()> {
        if self.hisparse_connector() {
            return Err(Error::config(
                "hisparse_host_num_blocks",
                format!("{pool:?}"),
                "the HiSparse connector holds the host pool (set it before the connector)",
            ));
        }
        let Some((num_blocks, block_size)) = pool else {
            self.host_pages = None;
            return Ok(());
        };
        if !(2..=crate::kv::MAX_NUM_BLOCKS).contains(&num_blocks) {
            return Err(Error::config(
                "hisparse_host_num_blocks",
                num_blocks,
                format!(
                    "must be between 2 (block 0 is the null block) and {}",
                    crate::kv::MAX_NUM_BLOCKS
                ),
            ));
        }
        if block_size == 0 {
            return Err(Error::config(
                "hisparse_block_size",
                block_size,
                "must be at least 1",
            ));
        }
        if !self.config.scheduler_reserve_full_isl {
            return Err(Error::config(
                "scheduler_reserve_full_isl",
                false,
                "HiSparse host pages need the full prompt's pages checked at admission",
            ));
        }
        let first_full = match self.kv.hybrid_groups() {
            Some(groups) => groups.first() == Some(&crate::kv::KvGroupSpec::FullAttention),
            None => self.kv.is_block_hash(),
        };
        if !first_full || block_size != self.config.block_size {
            return Err(Error::config(
                "hisparse_block_size",
                block_size,
                format!(
                    "HiSparse host pages are served beside the block-hash pool (or KV groups \
                     led by a full-attention group) with its block size ({}): one host \
                     block per block of that group",
                    self.config.block_size
                ),
            ));
        }
        if self.slots_holding_blocks().next().is_some() {
            return Err(Error::config(
                "hisparse_host_num_blocks",
                num_blocks,
                "set while requests hold KV blocks (set it before the first step)",
            ));
        }
        let source_group = self.host_pages.as_ref().and_then(|h| h.source_group);
        self.host_pages = Some(HostPages {
            block_size,
            num_blocks,
            free: (1..num_blocks as BlockId).collect(),
            tables: Vec::new(),
            source_group,
            new_blocks: FxHashMap::default(),
            connector: None,
        });
        Ok(())
    }

    /// Puts the host pool's tables among the per-group block ids the outputs and
    /// [`Scheduler::group_block_ids`] carry, at `Some(index)` (vLLM's HiSparse source group's
    /// place in its `kv_cache_groups`), or keeps them out (`None`).
    ///
    /// Errors: no host pool; no KV groups; an index past the groups and the host group.
    pub fn set_hisparse_source_group(&mut self, index: Option<usize>) -> Result<()> {
        let num_groups = self.kv.hybrid_groups().map_or(0, <[_]>::len);
        let Some(h) = self.host_pages.as_mut() else {
            return Err(Error::config(
                "hisparse_source_group",
                format!("{index:?}"),
                "needs the HiSparse host pool (set_hisparse_host_pages) first",
            ));
        };
        if let Some(i) = index
            && (num_groups == 0 || i > num_groups)
        {
            return Err(Error::config(
                "hisparse_source_group",
                i,
                format!(
                    "must be at most {num_groups}, with KV groups (the scheduler has {num_groups})"
                ),
            ));
        }
        h.source_group = index;
        h.new_blocks.clear();
        Ok(())
    }

    /// The HiSparse host page pool, if on.
    pub fn hisparse_host_pages(&self) -> Option<HostPagesState> {
        self.host_pages.as_ref().map(|h| HostPagesState {
            num_blocks: h.num_blocks,
            block_size: h.block_size,
            num_free_blocks: h.num_free(),
        })
    }

    /// The HiSparse host pool's free blocks, the next handed out first (empty without
    /// the pool).
    pub fn hisparse_host_free_blocks(&self) -> Vec<BlockId> {
        self.host_pages
            .as_ref()
            .map_or_else(Vec::new, HostPages::free_block_ids)
    }

    /// `groups` (a slot's per-group new block ids this step) with the host group's new
    /// blocks since the last output put at its place. Left as they are without a placed
    /// host group, or when `groups` is empty (no ids asked for).
    pub(super) fn with_new_host_blocks(
        &mut self,
        slot: u32,
        mut groups: Vec<Vec<BlockId>>,
    ) -> Vec<Vec<BlockId>> {
        if let Some(h) = self.host_pages.as_mut()
            && let Some(index) = h.source_group
        {
            // Most steps grow few host tables: skip the lookup when none did.
            let blocks = match h.new_blocks.is_empty() {
                true => Vec::new(),
                false => h.new_blocks.remove(&slot).unwrap_or_default(),
            };
            if !groups.is_empty() {
                groups.insert(index.min(groups.len()), blocks);
            }
        }
        groups
    }

    /// The requests whose prefill is in flight (vLLM 0.33's `Scheduler._inflight_prefills`:
    /// admitted with prompt left to compute, or loading asynchronously), in slot order.
    pub fn inflight_prefill_ids(&self) -> Vec<R> {
        (self.slots.iter().flatten())
            .filter(|r| r.inflight_prefill && self.index.contains_key(&r.request_id))
            .map(|r| r.request_id.clone())
            .collect()
    }

    fn slots_holding_blocks(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.slots.len() as u32).filter(|&slot| self.kv.block_ids(slot).is_some())
    }

    /// The longest prefix hit the host pool lets a lookup take: none with the pool on
    /// (vLLM 0.33 looks the HiSparse source group up first, and it serves only pages its
    /// `HiSparseCoordinator` published on the HiSparse connector's acknowledged
    /// write-backs, which nothing drives here), unbounded without.
    pub(super) fn host_published_tokens(&self) -> usize {
        match self.host_pages {
            Some(_) => 0,
            None => usize::MAX,
        }
    }

    /// Whether slots for `num_tokens` of `slot` (those it holds included) can be backed by
    /// host pages (always without the pool).
    pub(super) fn host_pages_fit(&self, slot: u32, num_tokens: usize) -> bool {
        let num_tokens = num_tokens.min(self.config.max_model_len);
        self.host_pages
            .as_ref()
            .is_none_or(|h| h.fits(slot, num_tokens))
    }

    /// [`Self::host_pages_fit`] for `num_new_slots` past a running request's computed
    /// tokens, counted from the larger of its own and the pool's (the pool allocates from
    /// its count), so the check never asks for fewer pages than the allocation takes.
    pub(super) fn host_pages_fit_running(
        &self,
        slot: u32,
        num_computed_tokens: usize,
        num_new_slots: usize,
    ) -> bool {
        if self.host_pages.is_none() {
            return true;
        }
        let pool = self.kv.num_computed_tokens(slot).unwrap_or(0);
        self.host_pages_fit(slot, pool.max(num_computed_tokens) + num_new_slots)
    }

    /// Grows `slot`'s host table to the blocks the device pool now holds for it (its
    /// first group's), after an allocation (nothing without the pool).
    ///
    /// Errors: with the HiSparse connector, a charge its host pool cannot back (the
    /// callers checked [`Self::host_pages_fit`] first: a bug).
    pub(super) fn charge_host_pages(&mut self, slot: u32) -> Result<()> {
        let Some(h) = self.host_pages.as_mut() else {
            return Ok(());
        };
        let Some(c) = h.connector.as_deref_mut() else {
            h.grow(slot, self.kv.block_ids(slot).map_or(0, <[_]>::len));
            return Ok(());
        };
        let held = c.host_table(&slot).map_or(0, <[_]>::len);
        let Kv::Hybrid(kv) = &self.kv else {
            return Err(Error::Internal(
                "the HiSparse connector without KV groups".into(),
            ));
        };
        c.charge_host(&kv.pool, &slot)?;
        if h.source_group.is_some() {
            let added = &c.host_table(&slot).unwrap_or_default()[held..];
            h.new_blocks
                .entry(slot)
                .or_default()
                .extend_from_slice(added);
        }
        Ok(())
    }

    /// Frees the device blocks of `slot` and returns its host pages (with the HiSparse
    /// connector, its `free` first: clean resident pages unpinned, host pages returned).
    pub(super) fn free_kv(&mut self, slot: u32) -> Result<()> {
        self.free_kv_as(slot, false)
    }

    /// [`Self::free_kv`] for a deferred free reaching its fence (`Kv::free_popped`).
    pub(super) fn free_kv_popped(&mut self, slot: u32) -> Result<()> {
        self.free_kv_as(slot, true)
    }

    fn free_kv_as(&mut self, slot: u32, popped: bool) -> Result<()> {
        self.release_connector_pages(slot)?;
        if popped {
            self.kv.free_popped(slot)?;
        } else {
            self.kv.free(slot)?;
        }
        if let Some(h) = self.host_pages.as_mut() {
            h.release(slot);
        }
        Ok(())
    }

    /// The HiSparse connector's part of freeing `slot` (`HiSparseConnectorKv::release`),
    /// before the coordinator frees its groups; nothing without the connector.
    fn release_connector_pages(&mut self, slot: u32) -> Result<()> {
        let connector = self
            .host_pages
            .as_mut()
            .and_then(|h| h.connector.as_deref_mut());
        match (connector, &mut self.kv) {
            (Some(c), Kv::Hybrid(kv)) => c.release(&mut kv.pool, &slot),
            _ => Ok(()),
        }
    }

    /// Describes a broken invariant of the host pages, if any.
    pub(super) fn check_host_pages(&self) -> std::result::Result<(), String> {
        let Some(h) = &self.host_pages else {
            return Ok(());
        };
        if h.connector.is_some() {
            return self.check_connector_pages(h);
        }
        let mut seen = vec![false; h.num_blocks];
        seen[0] = true;
        let tables = h.tables.iter().enumerate();
        for (slot, block) in tables.flat_map(|(s, t)| t.iter().map(move |&b| (s, b))) {
            let block = block as usize;
            if block >= h.num_blocks || std::mem::replace(&mut seen[block], true) {
                return Err(format!(
                    "host pages: slot {slot} holds block {block} twice or past the pool"
                ));
            }
        }
        for &block in &h.free {
            if std::mem::replace(&mut seen[block as usize], true) {
                return Err(format!(
                    "host pages: free block {block} is also held or free twice"
                ));
            }
        }
        if seen.iter().any(|&s| !s) {
            return Err("host pages: a block is neither held nor free".to_string());
        }
        for (slot, table) in h.tables.iter().enumerate() {
            let blocks = self.kv.block_ids(slot as u32).map_or(0, <[_]>::len);
            if table.len() != blocks {
                return Err(format!(
                    "host pages: slot {slot} holds {} for {blocks} device blocks",
                    table.len()
                ));
            }
        }
        Ok(())
    }
}
