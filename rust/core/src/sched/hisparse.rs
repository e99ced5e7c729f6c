//! HiSparse host pages (vLLM 0.33's `KVCacheConfig.hisparse_host_num_blocks`): a host
//! block pool beside the device blocks, as vLLM's `HiSparseSourceManager`
//! (`single_type_kv_cache_manager.py`) keeps it for a sparse-attention MLA model. Every
//! page of `block_size` tokens a request holds slots for is backed by a host block, so each
//! device-resident page can be written back and reclaimed; block 0 of the pool is its null
//! block. An allocation whose pages the pool cannot back is refused as one the device pool
//! has no room for: an admission waits, a running request preempts a victim (or waits for
//! a reclamation, `StepHooks::pending_block_frees`). With `scheduler_reserve_full_isl` the
//! gate at admission asks for the whole prompt's pages (vLLM's `full_sequence_must_fit`
//! through `get_num_blocks_to_allocate`), which is what lets admitted async loads always
//! finish. Pages are released when the request's device blocks are (finish, preemption,
//! a failed or released load; after the fence under deferred frees).
//!
//! Invariant: `used` is the sum of `held` and never exceeds the pool's usable blocks (all
//! but the null block); a slot's `held` is the pages of the tokens the device pool holds
//! slots for: with one block size on both sides, its device blocks.
//!
//! Not modelled: vLLM's host pool also caches prefixes (a hit shares host blocks, and a
//! freed cached block stays evictable); here each request is charged its own pages. The
//! device-side HiSparse groups (resident and hot pages) are not modelled either.

use super::scheduler::Scheduler;
use crate::kv::RequestKey;
use crate::{Error, Result};

/// The host page pool's bookkeeping.
#[derive(Debug, Clone)]
pub(super) struct HostPages {
    /// Tokens per host block (the HiSparse source group's `block_size`).
    block_size: usize,
    /// `hisparse_host_num_blocks`, the null block included.
    num_blocks: usize,
    /// Host blocks held, over all requests.
    used: usize,
    /// Host blocks held, by device-pool slot (slots are dense: a vector, not a map, as
    /// the charge runs for every request a step allocates for).
    held: Vec<usize>,
}

impl HostPages {
    fn pages(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    fn num_free(&self) -> usize {
        // Saturating: a charge past the pool (a bug, caught by the invariant check) must
        // not wrap into a huge free count.
        self.num_blocks.saturating_sub(1 + self.used)
    }

    /// Whether `num_tokens` of slots for `slot` can be backed beside what it holds.
    fn fits(&self, slot: u32, num_tokens: usize) -> bool {
        let held = self.held.get(slot as usize).copied().unwrap_or(0);
        self.pages(num_tokens).saturating_sub(held) <= self.num_free()
    }

    /// Charges `slot` for `pages` host blocks (the device blocks it holds).
    fn set_pages(&mut self, slot: u32, pages: usize) {
        let slot = slot as usize;
        if slot >= self.held.len() {
            if pages == 0 {
                return;
            }
            self.held.resize(slot + 1, 0);
        }
        self.used = self.used - self.held[slot] + pages;
        self.held[slot] = pages;
        debug_assert!(self.used < self.num_blocks, "host pages over the pool");
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

impl<R: RequestKey> Scheduler<R> {
    /// Turns vLLM 0.33's HiSparse host page pool on (`Some((num_blocks, block_size))`:
    /// `hisparse_host_num_blocks`, the null block included, and the source group's
    /// `block_size`) or off (`None`), from the next allocation on.
    ///
    /// Errors: a pool of fewer than 2 blocks or a zero `block_size`; a pool set while
    /// requests hold KV blocks (their pages were never charged); with
    /// `scheduler_reserve_full_isl` off (HiSparse admits a prompt only if all its pages
    /// fit: vLLM's async loads could otherwise strand each other on host pages).
    pub fn set_hisparse_host_pages(&mut self, pool: Option<(usize, usize)>) -> Result<()> {
        let Some((num_blocks, block_size)) = pool else {
            self.host_pages = None;
            return Ok(());
        };
        if num_blocks < 2 {
            return Err(Error::config(
                "hisparse_host_num_blocks",
                num_blocks,
                "must be at least 2 (block 0 is the null block)",
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
        if !self.kv.is_block_hash() || block_size != self.config.block_size {
            return Err(Error::config(
                "hisparse_block_size",
                block_size,
                format!(
                    "HiSparse host pages are served beside the single block-hash pool with \
                     its block size ({}): one host block per device block",
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
        self.host_pages = Some(HostPages {
            block_size,
            num_blocks,
            used: 0,
            held: Vec::new(),
        });
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

    /// Charges `slot` the pages of the slots the device pool now holds for it, after an
    /// allocation (nothing without the pool).
    pub(super) fn charge_host_pages(&mut self, slot: u32) {
        if let Some(h) = self.host_pages.as_mut() {
            h.set_pages(slot, self.kv.block_ids(slot).map_or(0, <[_]>::len));
        }
    }

    /// Frees the device blocks of `slot` and releases its host pages.
    pub(super) fn free_kv(&mut self, slot: u32) -> Result<()> {
        self.kv.free(slot)?;
        if let Some(h) = self.host_pages.as_mut() {
            h.set_pages(slot, 0);
        }
        Ok(())
    }

    /// Describes a broken invariant of the host pages, if any.
    pub(super) fn check_host_pages(&self) -> std::result::Result<(), String> {
        let Some(h) = &self.host_pages else {
            return Ok(());
        };
        let mut by_holders = 0;
        for slot in self.slots_holding_blocks() {
            let blocks = self.kv.block_ids(slot).map_or(0, <[_]>::len);
            let pages = h.held.get(slot as usize).copied().unwrap_or(0);
            if pages != blocks {
                return Err(format!(
                    "host pages: slot {slot} holds {pages} for {blocks} device blocks"
                ));
            }
            by_holders += pages;
        }
        let sum: usize = h.held.iter().sum();
        if sum != h.used || by_holders != h.used || h.used >= h.num_blocks {
            return Err(format!(
                "host pages: {} used, {sum} held ({by_holders} by requests holding blocks), \
                 {} in the pool",
                h.used, h.num_blocks
            ));
        }
        Ok(())
    }
}
