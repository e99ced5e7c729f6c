//! vLLM 0.33's HiSparse connector, device half with prefix caching off, run on the
//! coordinator's pool: the rules of [`super::DeviceResidency`] (write-backs, their
//! acknowledgements, GPU residency and the free order; docs/integrations.md, "vLLM 0.33's
//! scheduler-side HiSparse rule", items 2, 3, 7 and 8), with the device blocks handed out
//! by a [`KvCoordinator`] whose HiSparse pins are on (`coordinator_hisparse_pins`: `touch`,
//! `unpin_blocks` and reuse watchers) instead of a pool of its own. The host page pool
//! (vLLM's `HiSparseSourceManager` over its host `BlockPool`, caching off) is kept here, with
//! the write-backs' references on it.
//!
//! The caller drives it in vLLM's scheduler order: [`HiSparseConnectorKv::host_fits`]
//! beside the coordinator's own check, the coordinator's `allocate_slots`, then
//! [`HiSparseConnectorKv::charge_host`]; once the step's allocations are done
//! [`HiSparseConnectorKv::advance_scheduled`] per scheduled request
//! (`HiSparseConnectorScheduler.build_connector_meta`); [`HiSparseConnectorKv::acknowledge`]
//! with the workers' counts (`update_spills`); [`HiSparseConnectorKv::free`] in place of the
//! coordinator's `free`.
//!
//! Invariant: every usable host block is free with no reference or referenced by exactly
//! the tables and the pending write-backs naming it; the coordinator's own check covers the
//! device blocks (touches counted).

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use super::hisparse_shared::{
    Completions, PageState, free_queue_without_null, landed, release_unhashed,
};
use super::{BlockId, DeviceTransfer, FreeBlockQueue, KvCapacity, KvCoordinator, KvGroupSpec};
use super::{NULL_BLOCK, RequestKey};
use crate::{Error, Result};

/// Pages at a request's tail never unpinned (vLLM's `ACTIVE_TAIL_PAGES`).
const ACTIVE_TAIL_PAGES: usize = 2;

#[derive(Debug, Clone, Default)]
struct ConnectorRequest {
    generation: u64,
    host: Vec<BlockId>,
    pages: PageState,
    pinned_clean: BTreeSet<usize>,
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

/// The HiSparse connector's device half over a coordinator (see the module docs).
#[derive(Debug, Clone)]
pub struct HiSparseConnectorKv<R: RequestKey> {
    block_size: usize,
    hot_group: usize,
    hot_blocks: usize,
    max_admission_blocks: usize,
    max_spill_pages: usize,
    watermark: usize,
    host_num_blocks: usize,
    host_free: FreeBlockQueue,
    host_ref: Vec<u32>,
    requests: FxHashMap<R, ConnectorRequest>,
    transfers: BTreeMap<u64, Transfer<R>>,
    planned: Vec<DeviceTransfer>,
    next_transfer: u64,
    next_generation: u64,
}

impl<R: RequestKey> HiSparseConnectorKv<R> {
    /// Turns `coord`'s HiSparse pins on and builds the connector's state beside it:
    /// `host_num_blocks` host blocks (block 0 the null block) of the coordinator's block
    /// size; `max_spill_pages` write-backs planned per step at most (vLLM:
    /// `max_model_len // block_size`). The hot region's size and the admission window
    /// are the coordinator's `HiSparseHot` and `HiSparseResident` groups'.
    ///
    /// # Errors
    /// `Error::Config` without exactly one resident and one hot group, with prefix caching
    /// on (hits adopting GPU copies of published pages are not modelled), while requests
    /// hold blocks, or for a host pool under 2 blocks or `max_spill_pages` 0.
    pub fn new(
        coord: &mut KvCoordinator<R>,
        host_num_blocks: usize,
        max_spill_pages: usize,
    ) -> Result<Self> {
        let groups = coord.groups();
        let hot: Vec<(usize, usize)> = (groups.iter().enumerate())
            .filter_map(|(g, s)| s.hot_blocks().map(|n| (g, n)))
            .collect();
        let resident: Vec<(usize, usize)> = (groups.iter().enumerate())
            .filter_map(|(g, s)| match s {
                KvGroupSpec::HiSparseResident {
                    max_admission_blocks,
                } => Some((g, *max_admission_blocks)),
                _ => None,
            })
            .collect();
        let ([(hot_group, hot_blocks)], [(_, max_admission_blocks)]) = (&hot[..], &resident[..])
        else {
            return Err(Error::config(
                "groups",
                format!("{} hot, {} resident", hot.len(), resident.len()),
                "the HiSparse connector is modelled for one HiSparseResident and one \
                 HiSparseHot group",
            ));
        };
        if coord.enable_caching() {
            return Err(Error::config(
                "enable_caching",
                true,
                "the HiSparse connector is modelled with prefix caching off (hits adopting \
                 GPU copies of published host pages are not)",
            ));
        }
        for (field, value) in [
            (
                "hisparse_host_num_blocks",
                host_num_blocks.saturating_sub(1),
            ),
            ("max_spill_pages", max_spill_pages),
        ] {
            if value == 0 {
                return Err(Error::config(
                    field,
                    value,
                    "must be at least 1 (a host pool has the null block and one more)",
                ));
            }
        }
        // vLLM's `num_gpu_blocks // 10`, the null block counted.
        let num_blocks = coord.num_total_blocks() + 1;
        coord.enable_hisparse_pins()?;
        Ok(Self {
            block_size: coord.block_size(),
            hot_group: *hot_group,
            hot_blocks: *hot_blocks,
            max_admission_blocks: *max_admission_blocks,
            max_spill_pages,
            watermark: (*hot_blocks).max(num_blocks / 10),
            host_num_blocks,
            host_free: free_queue_without_null(host_num_blocks)?,
            host_ref: vec![0; host_num_blocks],
            requests: FxHashMap::default(),
            transfers: BTreeMap::new(),
            planned: Vec::new(),
            next_transfer: 0,
            next_generation: 0,
        })
    }

    /// Whether the host pool backs `num_tokens` slots of the request beside its pages.
    pub fn host_fits(&self, request_id: &R, num_tokens: usize) -> bool {
        let held = self.requests.get(request_id).map_or(0, |r| r.host.len());
        num_tokens.div_ceil(self.block_size).saturating_sub(held) <= self.host_free.len()
    }

    /// After the coordinator allocated for the request: its host table grows to its first
    /// group's blocks (one host page per block).
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the coordinator holds no blocks for it;
    /// `Error::Input` when the host pool cannot back them (check [`Self::host_fits`] first).
    pub fn charge_host(&mut self, coord: &KvCoordinator<R>, request_id: &R) -> Result<()> {
        let tables =
            (coord.block_ids(request_id)).ok_or_else(|| Error::unknown_request(request_id))?;
        let pages = tables[0].len();
        let next_generation = &mut self.next_generation;
        let request = self.requests.entry(request_id.clone()).or_insert_with(|| {
            *next_generation += 1;
            ConnectorRequest {
                generation: *next_generation - 1,
                ..ConnectorRequest::default()
            }
        });
        if pages.saturating_sub(request.host.len()) > self.host_free.len() {
            return Err(Error::input(
                "num_tokens",
                pages,
                "host pages past the HiSparse host pool (check host_fits first)",
            ));
        }
        for _ in request.host.len()..pages {
            let block = self.host_free.pop_front().expect("checked above");
            self.host_ref[block as usize] = 1;
            request.host.push(block);
        }
        Ok(())
    }

    /// The index of the coordinator's `HiSparseHot` group.
    pub fn hot_group(&self) -> usize {
        self.hot_group
    }

    /// The request's host table.
    pub fn host_table(&self, request_id: &R) -> Option<&[BlockId]> {
        self.requests.get(request_id).map(|r| &r.host[..])
    }

    /// Free host blocks, the next handed out first.
    pub fn host_free_blocks(&self) -> Vec<BlockId> {
        self.host_free.iter().collect()
    }

    pub fn host_num_free_blocks(&self) -> usize {
        self.host_free.len()
    }

    /// Write-backs planned and not yet acknowledged (vLLM's `pending_spills`).
    pub fn num_pending_transfers(&self) -> usize {
        self.transfers.len()
    }

    /// Whether write-backs are planned or awaited (`has_pending_work`, without copies).
    pub fn has_pending_work(&self) -> bool {
        !self.planned.is_empty() || !self.transfers.is_empty()
    }

    fn can_read_from_host(&self, coord: &KvCoordinator<R>, request_id: &R) -> bool {
        coord
            .block_ids(request_id)
            .is_some_and(|t| t[self.hot_group].len() == self.hot_blocks)
    }

    /// Whether a pending write-back frees a block when it lands (`has_pending_reclamation`,
    /// which the connector's `has_pending_block_frees` answers): its host block has no
    /// other reference, or its request (by id, as vLLM looks it up) can read from host.
    pub fn has_pending_reclamation(&self, coord: &KvCoordinator<R>) -> bool {
        self.transfers.values().any(|t| {
            self.host_ref[t.host_block as usize] == 1 || self.can_read_from_host(coord, &t.request)
        })
    }

    fn unpin_page(
        &self,
        coord: &mut KvCoordinator<R>,
        request_id: &R,
        request: &mut ConnectorRequest,
        page: usize,
    ) -> Result<()> {
        if request.pages.is_pending(page) || !request.pages.is_valid(page) {
            return Ok(());
        }
        let row = coord.hisparse_resident_row(request_id).unwrap_or_default();
        let block = row.get(page).copied().unwrap_or(NULL_BLOCK);
        if page + ACTIVE_TAIL_PAGES >= row.len() || block == NULL_BLOCK {
            return Ok(());
        }
        if coord.hisparse_unpinned_pages(request_id).contains(&page) {
            return Ok(());
        }
        coord.unpin_hisparse_page(request_id, page)?;
        request.pinned_clean.remove(&page);
        Ok(())
    }

    fn update_residency(
        &self,
        coord: &mut KvCoordinator<R>,
        request_id: &R,
        request: &mut ConnectorRequest,
    ) -> Result<()> {
        if !self.can_read_from_host(coord, request_id) {
            let resident = coord
                .hisparse_resident_row(request_id)
                .map_or(0, |r| r.len());
            if coord.num_free_blocks() < self.watermark || resident >= self.max_admission_blocks {
                coord.require_hisparse_hot(request_id)?;
            }
            return Ok(());
        }
        let clean: Vec<usize> = request.pinned_clean.iter().rev().copied().collect();
        for page in clean {
            self.unpin_page(coord, request_id, request, page)?;
        }
        Ok(())
    }

    /// vLLM's `HiSparseCoordinator.advance_scheduled` for one scheduled request with the
    /// tokens computed once the step lands: its write-backs planned (each holding a
    /// reference on its host and its resident block), then its residency updated.
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn advance_scheduled(
        &mut self,
        coord: &mut KvCoordinator<R>,
        request_id: &R,
        num_computed_tokens: usize,
    ) -> Result<()> {
        let mut request =
            (self.requests.remove(request_id)).ok_or_else(|| Error::unknown_request(request_id))?;
        let out = self.advance(coord, request_id, &mut request, num_computed_tokens);
        self.requests.insert(request_id.clone(), request);
        out
    }

    fn advance(
        &mut self,
        coord: &mut KvCoordinator<R>,
        request_id: &R,
        request: &mut ConnectorRequest,
        num_computed_tokens: usize,
    ) -> Result<()> {
        let row = coord.hisparse_resident_row(request_id).unwrap_or_default();
        let mut budget = self.max_spill_pages.saturating_sub(self.planned.len());
        for page in request.pages.ready()..num_computed_tokens / self.block_size {
            if budget == 0 {
                break;
            }
            let block = row.get(page).copied().unwrap_or(NULL_BLOCK);
            if !request.pages.needs_write(page) || block == NULL_BLOCK {
                continue;
            }
            let host_block = request.host[page];
            self.host_ref[host_block as usize] += 1;
            coord.touch_hisparse_block(block)?;
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
        self.update_residency(coord, request_id, request)
    }

    /// The write-backs planned since the last call (vLLM's `build_offload_command`).
    pub fn take_transfers(&mut self) -> Vec<DeviceTransfer> {
        std::mem::take(&mut self.planned)
    }

    /// The workers' `enqueued` and `completed` counts by transfer id (vLLM's
    /// `update_spills`; unknown ids are passed by): the landed write-backs' resident
    /// references go, then each page turns valid and clean (unpinned at once if its
    /// request can read from host) and its host reference goes.
    ///
    /// # Errors
    /// `Error::Internal` if a reference would be released twice (a bug).
    pub fn acknowledge(
        &mut self,
        coord: &mut KvCoordinator<R>,
        enqueued: &[(u64, u32)],
        completed: &[(u64, u32)],
    ) -> Result<()> {
        let landed = landed(&mut self.transfers, enqueued, completed, |t| {
            &mut t.completions
        });
        for id in &landed {
            coord.release_hisparse_block(self.transfers[id].resident_block)?;
        }
        for id in landed {
            let transfer = self.transfers.remove(&id).expect("listed above");
            if let Some(mut request) = self.requests.remove(&transfer.request) {
                if request.generation == transfer.generation {
                    request.pages.land(transfer.page);
                    request.pinned_clean.insert(transfer.page);
                    if self.can_read_from_host(coord, &transfer.request) {
                        self.unpin_page(coord, &transfer.request, &mut request, transfer.page)?;
                    }
                    request.pages.advance_ready();
                }
                self.requests.insert(transfer.request.clone(), request);
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

    /// Frees the request (finished or preempted: the same with caching off): its clean
    /// pinned resident pages unpinned tail first (vLLM's `HiSparseCoordinator.free`, from
    /// the source group, first), its host pages returned, then the coordinator's groups.
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn free(&mut self, coord: &mut KvCoordinator<R>, request_id: &R) -> Result<()> {
        self.release(coord, request_id)?;
        coord.free(request_id)
    }

    /// [`Self::free`] but the coordinator's own free, which the caller runs next (the step
    /// scheduler frees its groups through its KV, deferred frees included).
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn release(&mut self, coord: &mut KvCoordinator<R>, request_id: &R) -> Result<()> {
        let row = coord
            .hisparse_resident_row(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let request = self.requests.remove(request_id);
        if let Some(request) = &request {
            let unpinned = coord.hisparse_unpinned_pages(request_id);
            for page in (0..row.len()).rev() {
                let clean = request.pages.is_valid(page) && !request.pages.is_pending(page);
                if row[page] != NULL_BLOCK && clean && !unpinned.contains(&page) {
                    coord.unpin_hisparse_page(request_id, page)?;
                }
            }
            release_unhashed(
                &mut self.host_free,
                &mut self.host_ref,
                request.host.iter().rev().copied(),
                "host",
            )?;
        }
        Ok(())
    }

    /// Checks the host pool's references (see the module docs).
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub fn check(&self) -> std::result::Result<(), String> {
        let mut refs = vec![0u32; self.host_num_blocks];
        for request in self.requests.values() {
            request.host.iter().for_each(|&b| refs[b as usize] += 1);
        }
        self.transfers
            .values()
            .for_each(|t| refs[t.host_block as usize] += 1);
        if refs[1..] != self.host_ref[1..] {
            return Err(format!(
                "host references {:?} but held {refs:?}",
                self.host_ref
            ));
        }
        if self
            .host_free
            .iter()
            .any(|b| self.host_ref[b as usize] != 0)
        {
            return Err("a free host block is referenced".into());
        }
        let held = self.host_ref.iter().skip(1).filter(|&&r| r > 0).count();
        if held + self.host_free.len() + 1 != self.host_num_blocks {
            return Err("host blocks are neither held nor free".into());
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "hisparse_connector_tests.rs"]
mod tests;

/// A coordinator over vLLM's HiSparse device groups (indexer, one resident and one hot
/// group) with the connector's device half on it, driven as vLLM's scheduler drives its
/// `KVCacheManager` and `HiSparseCoordinator`: the interface of [`super::DeviceResidency`]
/// over the step scheduler's own KV structures, for checks against vLLM.
#[derive(Debug, Clone)]
pub struct HiSparseConnectorPool<R: RequestKey> {
    coord: KvCoordinator<R>,
    connector: HiSparseConnectorKv<R>,
}

impl<R: RequestKey> HiSparseConnectorPool<R> {
    /// `num_blocks` device and `host_num_blocks` host blocks (block 0 of each the null
    /// block) of `block_size` tokens; `hot_blocks` blocks per hot region, required at
    /// `max_admission_blocks` resident blocks; `max_spill_pages` write-backs per step.
    ///
    /// # Errors
    /// `Error::Config` for a value the coordinator or the connector refuses.
    pub fn new(
        num_blocks: usize,
        host_num_blocks: usize,
        block_size: usize,
        hot_blocks: usize,
        max_admission_blocks: usize,
        max_spill_pages: usize,
    ) -> Result<Self> {
        let groups = vec![
            KvGroupSpec::FullAttention,
            KvGroupSpec::HiSparseResident {
                max_admission_blocks,
            },
            KvGroupSpec::HiSparseHot {
                blocks_per_request: hot_blocks,
            },
        ];
        let mut coord = KvCoordinator::new(groups, num_blocks, block_size, false)?;
        let connector = HiSparseConnectorKv::new(&mut coord, host_num_blocks, max_spill_pages)?;
        Ok(Self { coord, connector })
    }

    /// vLLM's `allocate_slots` as its scheduler calls it: the tables grow to back
    /// `num_tokens` slots (host pages, indexer and resident blocks, the hot region once
    /// required); a request holding no blocks is admitted. False when the pools cannot
    /// back them (nothing changes). The coordinator's computed count is kept one token
    /// behind the slots, so a call that adds no page still runs the allocation (a hot
    /// region may be due), as vLLM's does.
    ///
    /// # Errors
    /// `Error::Input` when `num_tokens` is 0, or when pages this allocation reused required
    /// a hot region the pool cannot back (vLLM's `get_new_blocks` raises there).
    pub fn allocate_slots(&mut self, request_id: R, num_tokens: usize) -> Result<bool> {
        if num_tokens == 0 {
            return Err(Error::input("num_tokens", 0, "a request has a token"));
        }
        let computed = self.coord.num_computed_tokens(&request_id).unwrap_or(0);
        let num_new = num_tokens.saturating_sub(computed).max(1);
        if !self.connector.host_fits(&request_id, computed + num_new) {
            return Ok(false);
        }
        let tokens = vec![0; num_new];
        if self
            .coord
            .allocate_slots(&request_id, &tokens, num_new, 0, None, None)?
            .is_none()
        {
            return Ok(false);
        }
        self.coord.rewind_computed_tokens(&request_id, 1)?;
        self.connector.charge_host(&self.coord, &request_id)?;
        Ok(true)
    }

    /// See [`HiSparseConnectorKv::advance_scheduled`].
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn advance_scheduled(&mut self, request_id: &R, num_computed_tokens: usize) -> Result<()> {
        (self.connector).advance_scheduled(&mut self.coord, request_id, num_computed_tokens)
    }

    pub fn take_transfers(&mut self) -> Vec<DeviceTransfer> {
        self.connector.take_transfers()
    }

    /// See [`HiSparseConnectorKv::acknowledge`].
    ///
    /// # Errors
    /// `Error::Internal` if a reference would be released twice (a bug).
    pub fn acknowledge(&mut self, enqueued: &[(u64, u32)], completed: &[(u64, u32)]) -> Result<()> {
        self.connector
            .acknowledge(&mut self.coord, enqueued, completed)
    }

    /// See [`HiSparseConnectorKv::free`].
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn free(&mut self, request_id: &R) -> Result<()> {
        self.connector.free(&mut self.coord, request_id)
    }

    /// The request's blocks per group: host, indexer, resident row, hot.
    pub fn tables(&self, request_id: &R) -> Option<super::DeviceTables> {
        let tables = self.coord.block_ids(request_id)?;
        Some((
            self.connector
                .host_table(request_id)
                .unwrap_or_default()
                .to_vec(),
            tables[0].to_vec(),
            self.coord.hisparse_resident_row(request_id)?,
            tables[2].to_vec(),
        ))
    }

    /// The pages lost since the last call (`(request, page)`, in the order their blocks
    /// were handed out).
    pub fn take_lost_pages(&mut self) -> Vec<(R, usize)> {
        self.coord.take_hisparse_lost_pages()
    }

    pub fn num_free_blocks(&self) -> usize {
        self.coord.num_free_blocks()
    }

    pub fn free_blocks(&self) -> Vec<BlockId> {
        self.coord.free_block_ids()
    }

    pub fn host_free_blocks(&self) -> Vec<BlockId> {
        self.connector.host_free_blocks()
    }

    pub fn has_pending_work(&self) -> bool {
        self.connector.has_pending_work()
    }

    pub fn has_pending_reclamation(&self) -> bool {
        self.connector.has_pending_reclamation(&self.coord)
    }

    /// Checks both pools' invariants.
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub fn check(&self) -> std::result::Result<(), String> {
        self.coord.check_invariants()?;
        self.connector.check()
    }
}
