//! vLLM 0.33's HiSparse connector, device half, with prefix caching off: the device
//! `BlockPool` shared by the indexer, resident and hot groups (one pair), the host pool
//! beside it, and `HiSparseCoordinator`'s write-backs and GPU residency
//! (`vllm/v1/hisparse/coordinator.py`) as the connector's scheduler side drives them. The
//! rules (docs/integrations.md, "vLLM 0.33's scheduler-side HiSparse rule", items 2, 3, 7
//! and 8; with caching off nothing is published, so there are no hits, copies or
//! adoptions):
//!
//! - allocation (`KVCacheManager.allocate_slots`): refused when the host pool cannot back
//!   the pages or the device pool has fewer free blocks than the indexer, resident and
//!   (once required) hot groups need; then each group takes its blocks in group order from
//!   the free queue's front. A block handed out that was unpinned fires its watcher
//!   (`BlockPool._notify_reuse`, `_on_block_reused`): the pages reading it lose it (the
//!   resident page turns null) and their requests require a hot region;
//! - write-backs (`plan_prefix_materialization`): each sealed page past the ready prefix,
//!   neither valid nor pending and resident, gets a transfer holding a reference on its host
//!   block and its resident block, at most `max_spill_pages` between two
//!   [`DeviceResidency::take_transfers`];
//! - residency (`update_residency`): a request without its hot region requires one once the
//!   device pool's free blocks fall below `max(hot blocks, num_blocks / 10)` or it holds
//!   `max_admission_blocks` resident blocks; one with it unpins every clean pinned page but
//!   the last two, tail first (`BlockPool.unpin_blocks`: the reference goes, the block joins
//!   the free queue's tail, and a watcher stays until the block is handed out);
//! - acknowledgement (`update_spills`): transfers whose completions reach their first
//!   enqueued count land in id order: their resident references go (`free_blocks`, to the
//!   front when none is left), then each page turns valid and clean, unpinned at once if
//!   its request can read from host, and the host reference goes;
//! - free (`HiSparseCoordinator.free` from the source manager, then each group's own free,
//!   tail first, to the queue's front): clean resident pages are unpinned and nulled,
//!   pending ones stay with their transfer, unpinned ones leave their owners.
//!
//! A port of the reference model `tests/hisparse_residency_model.py`, which agrees with
//! vLLM's own `KVCacheManager` + `HiSparseCoordinator`; `tests/test_hisparse_residency_model.py`
//! runs all three side by side. Standalone: the step scheduler's pools do not run it yet.
//!
//! Invariant ([`DeviceResidency::check`]): every usable block of either pool is free with
//! no reference or referenced as often as the tables (unpinned pages excepted) and the
//! transfers name it.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use super::hisparse_shared::{
    Completions, PageState, free_queue_without_null, landed, release_unhashed,
};
use super::{BlockId, FreeBlockQueue, NULL_BLOCK, RequestKey};
use crate::{Error, Result};

/// Pages at a request's tail never unpinned (vLLM's `ACTIVE_TAIL_PAGES`).
const ACTIVE_TAIL_PAGES: usize = 2;

#[derive(Debug, Clone, Default)]
struct DeviceRequest {
    generation: u64,
    num_tokens: usize,
    computed: usize,
    host: Vec<BlockId>,
    indexer: Vec<BlockId>,
    /// The resident table with residency changes applied.
    resident: Vec<BlockId>,
    hot: Vec<BlockId>,
    hot_required: bool,
    pages: PageState,
    pinned_clean: BTreeSet<usize>,
    unpinned: BTreeSet<usize>,
}

#[derive(Debug, Clone)]
struct Transfer<R> {
    request: R,
    generation: u64,
    page: usize,
    host_block: BlockId,
    resident_block: BlockId,
    completions: Completions,
}

/// A write-back as the step's offload command carries it (vLLM's `SparseKVPageTransfer`,
/// one resident group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTransfer {
    pub transfer_id: u64,
    pub host_block_id: BlockId,
    pub resident_block_id: BlockId,
}

/// One request's blocks per group: host, indexer, resident (residency applied), hot.
pub type DeviceTables = (Vec<BlockId>, Vec<BlockId>, Vec<BlockId>, Vec<BlockId>);

/// The HiSparse connector's device half with prefix caching off (see the module docs).
#[derive(Debug, Clone)]
pub struct DeviceResidency<R: RequestKey> {
    block_size: usize,
    num_blocks: usize,
    host_num_blocks: usize,
    hot_blocks: usize,
    max_admission_blocks: usize,
    max_spill_pages: usize,
    watermark: usize,
    free: FreeBlockQueue,
    ref_cnt: Vec<u32>,
    host_free: FreeBlockQueue,
    host_ref: Vec<u32>,
    /// Unpinned blocks whose watcher has not fired.
    watched: Vec<bool>,
    /// Unpinned block -> the (request, page) pairs still reading it.
    owners: FxHashMap<BlockId, Vec<(R, usize)>>,
    requests: FxHashMap<R, DeviceRequest>,
    transfers: BTreeMap<u64, Transfer<R>>,
    planned: Vec<DeviceTransfer>,
    next_transfer: u64,
    next_generation: u64,
}

impl<R: RequestKey> DeviceResidency<R> {
    /// `num_blocks` device and `host_num_blocks` host blocks (block 0 of each the null
    /// block) of `block_size` tokens; `hot_blocks` blocks per hot region; a request without
    /// one requires it at `max_admission_blocks` resident blocks; `max_spill_pages`
    /// write-backs planned per step at most (vLLM: `max_model_len // block_size`).
    ///
    /// # Errors
    /// `Error::Config` when a pool has fewer than 2 blocks or another value is 0.
    pub fn new(
        num_blocks: usize,
        host_num_blocks: usize,
        block_size: usize,
        hot_blocks: usize,
        max_admission_blocks: usize,
        max_spill_pages: usize,
    ) -> Result<Self> {
        for (field, value, min) in [
            ("num_blocks", num_blocks, 2),
            ("hisparse_host_num_blocks", host_num_blocks, 2),
            ("block_size", block_size, 1),
            ("blocks_per_request", hot_blocks, 1),
            ("max_admission_blocks_per_request", max_admission_blocks, 1),
            ("max_spill_pages", max_spill_pages, 1),
        ] {
            if value < min {
                return Err(Error::config(
                    field,
                    value,
                    format!("must be at least {min}"),
                ));
            }
        }
        Ok(Self {
            block_size,
            num_blocks,
            host_num_blocks,
            hot_blocks,
            max_admission_blocks,
            max_spill_pages,
            watermark: hot_blocks.max(num_blocks / 10),
            free: free_queue_without_null(num_blocks)?,
            ref_cnt: vec![0; num_blocks],
            host_free: free_queue_without_null(host_num_blocks)?,
            host_ref: vec![0; host_num_blocks],
            watched: vec![false; num_blocks],
            owners: FxHashMap::default(),
            requests: FxHashMap::default(),
            transfers: BTreeMap::new(),
            planned: Vec::new(),
            next_transfer: 0,
            next_generation: 0,
        })
    }

    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Free device blocks, the next handed out first.
    pub fn free_blocks(&self) -> Vec<BlockId> {
        self.free.iter().collect()
    }

    /// Free host blocks, the next handed out first.
    pub fn host_free_blocks(&self) -> Vec<BlockId> {
        self.host_free.iter().collect()
    }

    /// The request's blocks per group, or None when it holds none.
    pub fn tables(&self, request_id: &R) -> Option<DeviceTables> {
        self.requests.get(request_id).map(|r| {
            (
                r.host.clone(),
                r.indexer.clone(),
                r.resident.clone(),
                r.hot.clone(),
            )
        })
    }

    pub fn num_computed_tokens(&self, request_id: &R) -> Option<usize> {
        self.requests.get(request_id).map(|r| r.computed)
    }

    /// Whether write-backs are planned or awaited (`has_pending_work`, without copies).
    pub fn has_pending_work(&self) -> bool {
        !self.planned.is_empty() || !self.transfers.is_empty()
    }

    /// Whether a pending write-back will free a block when it lands: its host block has no
    /// other reference, or its request (by id, as vLLM looks it up) can read from host
    /// (`has_pending_reclamation`, which the connector's `has_pending_block_frees` answers).
    pub fn has_pending_reclamation(&self) -> bool {
        self.transfers.values().any(|t| {
            self.host_ref[t.host_block as usize] == 1
                || self
                    .requests
                    .get(&t.request)
                    .is_some_and(|r| self.can_read_from_host(r))
        })
    }

    /// Takes `n` device blocks from the front; a watched block fires its watcher, the lost
    /// pages of `current` (the request allocating, out of the map) applied to it.
    fn take(&mut self, n: usize, mut current: Option<(&R, &mut DeviceRequest)>) -> Vec<BlockId> {
        let mut taken = Vec::with_capacity(n);
        for _ in 0..n {
            let block = self
                .free
                .pop_front()
                .expect("allocation was checked against the free count");
            if std::mem::take(&mut self.watched[block as usize]) {
                for (request_id, page) in self.owners.remove(&block).unwrap_or_default() {
                    let request = match current.as_mut() {
                        Some((id, request)) if **id == request_id => Some(&mut **request),
                        _ => self.requests.get_mut(&request_id),
                    };
                    if let Some(request) = request {
                        lose_page(&mut self.owners, request, &request_id, page);
                    }
                }
            }
            self.ref_cnt[block as usize] = 1;
            taken.push(block);
        }
        taken
    }

    fn unpin(&mut self, block: BlockId) {
        self.ref_cnt[block as usize] -= 1;
        self.watched[block as usize] = true;
        if self.ref_cnt[block as usize] == 0 {
            self.free.push_back(block);
        }
    }

    fn can_read_from_host(&self, request: &DeviceRequest) -> bool {
        request.hot.len() == self.hot_blocks
    }

    fn unpin_page(&mut self, request_id: &R, request: &mut DeviceRequest, page: usize) {
        if request.pages.is_pending(page) || !request.pages.is_valid(page) {
            return;
        }
        let block = request.resident[page];
        if page + ACTIVE_TAIL_PAGES >= request.resident.len() || block == NULL_BLOCK {
            return;
        }
        self.owners
            .entry(block)
            .or_default()
            .push((request_id.clone(), page));
        self.unpin(block);
        request.pinned_clean.remove(&page);
        request.unpinned.insert(page);
    }

    fn update_residency(&mut self, request_id: &R, request: &mut DeviceRequest) {
        if !self.can_read_from_host(request) {
            if self.free.len() < self.watermark
                || request.resident.len() >= self.max_admission_blocks
            {
                request.hot_required = true;
            }
            return;
        }
        let clean: Vec<usize> = request.pinned_clean.iter().rev().copied().collect();
        for page in clean {
            self.unpin_page(request_id, request, page);
        }
    }

    fn advance(&mut self, request_id: &R, request: &mut DeviceRequest) {
        let mut budget = self.max_spill_pages.saturating_sub(self.planned.len());
        for page in request.pages.ready()..request.computed / self.block_size {
            if budget == 0 {
                break;
            }
            if !request.pages.needs_write(page) {
                continue;
            }
            let block = request.resident[page];
            if block == NULL_BLOCK {
                continue;
            }
            let host_block = request.host[page];
            self.host_ref[host_block as usize] += 1;
            self.ref_cnt[block as usize] += 1;
            let transfer_id = self.next_transfer;
            self.next_transfer += 1;
            self.transfers.insert(
                transfer_id,
                Transfer {
                    request: request_id.clone(),
                    generation: request.generation,
                    page,
                    host_block,
                    resident_block: block,
                    completions: Completions::default(),
                },
            );
            request.pages.plan(page, transfer_id);
            self.planned.push(DeviceTransfer {
                transfer_id,
                host_block_id: host_block,
                resident_block_id: block,
            });
            budget -= 1;
        }
        self.update_residency(request_id, request);
    }

    fn allocate(&mut self, request_id: &R, request: &mut DeviceRequest, num_tokens: usize) -> bool {
        let pages = num_tokens.div_ceil(self.block_size);
        if pages.saturating_sub(request.host.len()) > self.host_free.len() {
            return false;
        }
        let mut need = pages.saturating_sub(request.indexer.len())
            + pages.saturating_sub(request.resident.len());
        if request.hot_required {
            need += self.hot_blocks.saturating_sub(request.hot.len());
        }
        if need > self.free.len() {
            return false;
        }
        for _ in request.host.len()..pages {
            let block = self.host_free.pop_front().expect("checked above");
            self.host_ref[block as usize] = 1;
            request.host.push(block);
        }
        let blocks = self.take(
            pages.saturating_sub(request.indexer.len()),
            Some((request_id, &mut *request)),
        );
        request.indexer.extend(blocks);
        let blocks = self.take(
            pages.saturating_sub(request.resident.len()),
            Some((request_id, &mut *request)),
        );
        request.resident.extend(blocks);
        if request.hot_required && request.hot.len() < self.hot_blocks {
            let blocks = self.take(
                self.hot_blocks - request.hot.len(),
                Some((request_id, &mut *request)),
            );
            request.hot.extend(blocks);
        }
        true
    }

    /// Runs `op` on the request taken out of the map (so that a watcher firing during its
    /// own allocation reaches it), then puts it back.
    fn with_request<T>(
        &mut self,
        request_id: &R,
        op: impl FnOnce(&mut Self, &mut DeviceRequest) -> T,
    ) -> Result<T> {
        let mut request = self
            .requests
            .remove(request_id)
            .ok_or_else(|| Error::UnknownRequest(format!("{request_id:?}")))?;
        let out = op(self, &mut request);
        self.requests.insert(request_id.clone(), request);
        Ok(out)
    }

    /// Admits a prompt of `num_tokens` (at most `max_new_tokens` of them: a first prefill
    /// chunk). Returns false when the pools cannot back it (nothing changes).
    ///
    /// # Errors
    /// `Error::Input` when `num_tokens` is 0 or the request holds blocks already.
    pub fn admit(
        &mut self,
        request_id: R,
        num_tokens: usize,
        max_new_tokens: Option<usize>,
    ) -> Result<bool> {
        if num_tokens == 0 {
            return Err(Error::input("num_tokens", 0, "a request has a token"));
        }
        if self.requests.contains_key(&request_id) {
            return Err(Error::input(
                "request_id",
                format!("{request_id:?}"),
                "the request holds blocks already",
            ));
        }
        let new = max_new_tokens.map_or(num_tokens, |m| m.min(num_tokens));
        let mut request = DeviceRequest {
            generation: self.next_generation,
            num_tokens,
            ..DeviceRequest::default()
        };
        if !self.allocate(&request_id, &mut request, new) {
            return Ok(false);
        }
        self.next_generation += 1;
        request.computed = new;
        self.advance(&request_id, &mut request);
        self.requests.insert(request_id, request);
        Ok(true)
    }

    /// The next prefill chunk, at most `num_new_tokens`; false when the pools cannot back
    /// it (nothing changes).
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn step(&mut self, request_id: &R, num_new_tokens: usize) -> Result<bool> {
        self.with_request(request_id, |this, request| {
            let total = (request.computed + num_new_tokens).min(request.num_tokens);
            if !this.allocate(request_id, request, total) {
                return false;
            }
            request.computed = total;
            this.advance(request_id, request);
            true
        })
    }

    /// A decode step: one sampled token joins the request and is computed; false when the
    /// pools cannot back its page (the token stays, as vLLM's request keeps it).
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn decode(&mut self, request_id: &R) -> Result<bool> {
        self.with_request(request_id, |_, request| request.num_tokens += 1)?;
        self.step(request_id, 1)
    }

    /// vLLM's `KVCacheManager.allocate_slots` as its scheduler calls it: the request's
    /// tables grow to back `num_tokens` slots (host pages, indexer and resident blocks, and
    /// the hot region once required); a request holding no blocks is admitted with them.
    /// Nothing is planned: the scheduler runs [`Self::advance_scheduled`] once the step's
    /// allocations are done. False when the pools cannot back the slots (nothing changes).
    ///
    /// # Errors
    /// `Error::Input` when `num_tokens` is 0.
    pub fn allocate_slots(&mut self, request_id: R, num_tokens: usize) -> Result<bool> {
        if num_tokens == 0 {
            return Err(Error::input("num_tokens", 0, "a request has a token"));
        }
        if self.requests.contains_key(&request_id) {
            return self.with_request(&request_id, |this, request| {
                request.num_tokens = request.num_tokens.max(num_tokens);
                this.allocate(&request_id, request, num_tokens)
            });
        }
        let mut request = DeviceRequest {
            generation: self.next_generation,
            num_tokens,
            ..DeviceRequest::default()
        };
        if !self.allocate(&request_id, &mut request, num_tokens) {
            return Ok(false);
        }
        self.next_generation += 1;
        self.requests.insert(request_id, request);
        Ok(true)
    }

    /// vLLM's `HiSparseCoordinator.advance_scheduled` for one scheduled request, with the
    /// tokens computed once the step lands (less the re-prefillable ones): its write-backs
    /// planned, then its residency updated.
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn advance_scheduled(&mut self, request_id: &R, num_computed_tokens: usize) -> Result<()> {
        self.with_request(request_id, |this, request| {
            request.computed = num_computed_tokens;
            this.advance(request_id, request);
        })
    }

    /// The write-backs planned since the last call (vLLM's `build_offload_command`).
    pub fn take_transfers(&mut self) -> Vec<DeviceTransfer> {
        std::mem::take(&mut self.planned)
    }

    /// The workers' `enqueued` and `completed` counts by transfer id (vLLM's
    /// `update_spills`; unknown ids are passed by).
    ///
    /// # Errors
    /// `Error::Internal` if a reference would be released twice (a bug).
    pub fn acknowledge(&mut self, enqueued: &[(u64, u32)], completed: &[(u64, u32)]) -> Result<()> {
        let landed = landed(&mut self.transfers, enqueued, completed, |t| {
            &mut t.completions
        });
        for id in &landed {
            let block = self.transfers[id].resident_block;
            release_unhashed(&mut self.free, &mut self.ref_cnt, [block], "device")?;
        }
        for id in landed {
            let transfer = self.transfers.remove(&id).expect("listed above");
            let live = self
                .requests
                .get(&transfer.request)
                .is_some_and(|r| r.generation == transfer.generation);
            if live {
                let page = transfer.page;
                self.with_request(&transfer.request, |this, request| {
                    request.pages.land(page);
                    request.pinned_clean.insert(page);
                    if this.can_read_from_host(request) {
                        this.unpin_page(&transfer.request, request, page);
                    }
                    request.pages.advance_ready();
                })?;
            }
            release_unhashed(
                &mut self.host_free,
                &mut self.host_ref,
                [transfer.host_block],
                "host",
            )?;
        }
        Ok(())
    }

    /// Frees the request (finished or preempted: the same with caching off).
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn free(&mut self, request_id: &R) -> Result<()> {
        let mut request = self
            .requests
            .remove(request_id)
            .ok_or_else(|| Error::UnknownRequest(format!("{request_id:?}")))?;
        for page in (0..request.resident.len()).rev() {
            let block = request.resident[page];
            if block == NULL_BLOCK {
                continue;
            }
            if request.unpinned.contains(&page) {
                if let Some(owners) = self.owners.get_mut(&block) {
                    owners.retain(|(r, p)| !(r == request_id && *p == page));
                }
            } else if request.pages.is_valid(page) && !request.pages.is_pending(page) {
                self.unpin(block);
            } else {
                continue;
            }
            request.resident[page] = NULL_BLOCK;
        }
        release_unhashed(
            &mut self.host_free,
            &mut self.host_ref,
            request.host.iter().rev().copied(),
            "host",
        )?;
        for table in [&request.indexer, &request.resident, &request.hot] {
            release_unhashed(
                &mut self.free,
                &mut self.ref_cnt,
                table.iter().rev().copied(),
                "device",
            )?;
        }
        Ok(())
    }

    /// Checks that blocks are conserved (see the module docs).
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub fn check(&self) -> std::result::Result<(), String> {
        let mut refs = vec![0u32; self.num_blocks];
        let mut host_refs = vec![0u32; self.host_num_blocks];
        for request in self.requests.values() {
            for &b in request.indexer.iter().chain(&request.hot) {
                refs[b as usize] += 1;
            }
            for (page, &b) in request.resident.iter().enumerate() {
                if b != NULL_BLOCK && !request.unpinned.contains(&page) {
                    refs[b as usize] += 1;
                }
            }
            request
                .host
                .iter()
                .for_each(|&b| host_refs[b as usize] += 1);
        }
        for t in self.transfers.values() {
            refs[t.resident_block as usize] += 1;
            host_refs[t.host_block as usize] += 1;
        }
        if refs[1..] != self.ref_cnt[1..] || host_refs[1..] != self.host_ref[1..] {
            return Err(format!("references {:?} but held {refs:?}", self.ref_cnt));
        }
        if self.free.iter().any(|b| self.ref_cnt[b as usize] != 0) {
            return Err("a free device block is referenced".into());
        }
        if self
            .host_free
            .iter()
            .any(|b| self.host_ref[b as usize] != 0)
        {
            return Err("a free host block is referenced".into());
        }
        Ok(())
    }
}

/// vLLM's `_lose_page`: the page stops reading its block and the request requires a hot
/// region.
fn lose_page<R: RequestKey>(
    owners: &mut FxHashMap<BlockId, Vec<(R, usize)>>,
    request: &mut DeviceRequest,
    request_id: &R,
    page: usize,
) {
    let block = request.resident[page];
    if block != NULL_BLOCK {
        request.resident[page] = NULL_BLOCK;
        if let Some(list) = owners.get_mut(&block) {
            list.retain(|(r, p)| !(r == request_id && *p == page));
        }
    }
    request.unpinned.remove(&page);
    request.hot_required = true;
}

#[cfg(test)]
#[path = "hisparse_residency_tests.rs"]
mod tests;
