//! What vLLM 0.33's HiSparse connector does to the device `BlockPool` (its device half,
//! `vllm/v1/hisparse/coordinator.py` over `vllm/v1/core/block_pool.py`), on the
//! coordinator's pool, for a layout with one `HiSparseResidentSpec` group:
//!
//! - `touch` ([`KvCoordinator::touch_hisparse_block`]): a write-back's reference on a
//!   resident block, out of the free queue if it was there; returned by
//!   [`KvCoordinator::release_hisparse_block`] (`free_blocks`: to the queue's front when the
//!   block reaches no reference and has no hash);
//! - `unpin_blocks` ([`KvCoordinator::unpin_hisparse_page`]): a clean resident page's
//!   block loses its table's reference and, reaching none, joins the free queue's *tail*
//!   (counted free), while the page still reads it; a watcher stays under the block's id
//!   until an allocation hands it out, when every page still reading it is lost (vLLM's
//!   `_notify_reuse` -> `_on_block_reused` -> `_lose_page`): the page turns null in the
//!   request's residency row and the request requires a hot region (the coordinator's
//!   `reads_host`). The tables keep the blocks they were given (`get_block_ids` shows
//!   them, as vLLM's `req_to_blocks` does); the row ([`KvCoordinator::hisparse_resident_row`])
//!   is what the worker reads and what a free returns.
//!
//! Watchers fire in `allocate_slots` (and `allocate_slots_in_flight`), group by group, as
//! vLLM's fire inside `get_new_blocks`; the blocks a connector load takes
//! (`allocate_slots_external`, `coordinator_loads`) fire none yet, so a caller with the pins
//! on must not run loads (the HiSparse connector's imports are not modelled either).
//!
//! Off unless [`KvCoordinator::enable_hisparse_pins`] is called (the allocation pays one
//! `Option` check per group otherwise). The connector's rules that decide *when* to touch,
//! unpin and release (write-backs, acknowledgements, residency) are the caller's
//! (`kv::hisparse_residency` keeps them over its own pools).
//!
//! Invariant (in `check_invariants`): a block's ref count is the table entries naming it,
//! the resident group's unpinned and lost pages excepted, plus its `touch`es; it is free
//! exactly when that is 0.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::{BlockId, KvCoordinator, KvGroupSpec, NULL_BLOCK, RequestKey};
use crate::{Error, Result};

/// A request's resident pages the row no longer holds.
#[derive(Debug, Clone, Default)]
struct RowOverlay {
    /// Unpinned pages: still read, their blocks free and watched.
    unpinned: BTreeSet<usize>,
    /// Lost pages: null in the row (their blocks were handed out again).
    lost: BTreeSet<usize>,
}

/// The coordinator's HiSparse pinning state (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct HiSparsePins<R: RequestKey> {
    resident_group: usize,
    /// Per block, references held outside the tables (`touch`).
    touched: Vec<u32>,
    /// Per block, whether an unpinned block's watcher is registered.
    watched: Vec<bool>,
    /// Unpinned block -> the (request, page) pairs still reading it.
    owners: FxHashMap<BlockId, Vec<(R, usize)>>,
    rows: FxHashMap<R, RowOverlay>,
    /// Pages lost since the last [`KvCoordinator::take_hisparse_lost_pages`], in the order
    /// their blocks were handed out.
    lost_log: Vec<(R, usize)>,
    /// Requests other than the allocating one that lost a page during an allocation: they
    /// require a hot region once it is done.
    require_hot: Vec<R>,
}

/// The error for a group whose blocks no longer fit in the middle of an allocation: pages
/// lost to it required a hot region the free blocks cannot back (vLLM's `get_new_blocks`
/// raises `ValueError` there).
pub(super) fn no_room_after_lost_pages(group: usize, num_blocks: usize) -> Error {
    Error::input(
        "num_new_tokens",
        num_blocks,
        format!(
            "blocks of group {group} do not fit: pages this allocation reused required a \
             HiSparse hot region the pool cannot back (vLLM's get_new_blocks raises here)"
        ),
    )
}

impl<R: RequestKey> HiSparsePins<R> {
    /// Fires the watchers of `taken` (blocks just handed out, in order) for the allocating
    /// request `current_id` (its `reads_host` borrowed apart from its tables).
    pub(super) fn blocks_reused(
        &mut self,
        taken: &[BlockId],
        current_id: &R,
        current_reads_host: &mut bool,
    ) {
        for &block in taken {
            if !std::mem::take(&mut self.watched[block as usize]) {
                continue;
            }
            for (request_id, page) in self.owners.remove(&block).unwrap_or_default() {
                let row = self.rows.entry(request_id.clone()).or_default();
                row.unpinned.remove(&page);
                row.lost.insert(page);
                if request_id == *current_id {
                    *current_reads_host = true;
                } else {
                    self.require_hot.push(request_id.clone());
                }
                self.lost_log.push((request_id, page));
            }
        }
    }

    /// The requests that lost a page to another's allocation.
    pub(super) fn take_require_hot(&mut self) -> Vec<R> {
        std::mem::take(&mut self.require_hot)
    }

    /// Whether the table entry at `(group, page)` of `request_id` holds no reference.
    pub(super) fn unheld(&self, request_id: &R, group: usize, page: usize) -> bool {
        group == self.resident_group
            && self
                .rows
                .get(request_id)
                .is_some_and(|r| r.unpinned.contains(&page) || r.lost.contains(&page))
    }

    /// Adds the blocks' `touch`es to `holders`.
    pub(super) fn count_touched(&self, holders: &mut [u32]) {
        for (h, &t) in holders.iter_mut().zip(&self.touched) {
            *h += t;
        }
    }
}

impl<R: RequestKey> KvCoordinator<R> {
    /// Turns the HiSparse pins on (see the module docs).
    ///
    /// # Errors
    /// `Error::Config` (`groups`) without exactly one `HiSparseResident` group, or
    /// (`hisparse_pins`) while requests hold blocks.
    pub fn enable_hisparse_pins(&mut self) -> Result<()> {
        let resident: Vec<usize> = (self.groups.iter().enumerate())
            .filter(|(_, s)| matches!(s, KvGroupSpec::HiSparseResident { .. }))
            .map(|(g, _)| g)
            .collect();
        let [resident_group] = resident[..] else {
            return Err(Error::config(
                "groups",
                resident.len(),
                "HiSparse pins need exactly one HiSparseResident group (vLLM's connector \
                 device half is modelled for one resident/hot pair)",
            ));
        };
        if !self.requests.is_empty() {
            return Err(Error::config(
                "hisparse_pins",
                true,
                "set while requests hold blocks (set it before the first allocation)",
            ));
        }
        let num_blocks = self.blocks.len();
        self.hisparse_pins = Some(Box::new(HiSparsePins {
            resident_group,
            touched: vec![0; num_blocks],
            watched: vec![false; num_blocks],
            owners: FxHashMap::default(),
            rows: FxHashMap::default(),
            lost_log: Vec::new(),
            require_hot: Vec::new(),
        }));
        Ok(())
    }

    pub fn hisparse_pins_on(&self) -> bool {
        self.hisparse_pins.is_some()
    }

    fn pins_mut(&mut self, what: &str) -> Result<&mut HiSparsePins<R>> {
        self.hisparse_pins.as_deref_mut().ok_or_else(|| {
            Error::config(
                "hisparse_pins",
                false,
                format!("{what} needs the HiSparse pins (enable_hisparse_pins)"),
            )
        })
    }

    fn check_block(&self, block: BlockId) -> Result<()> {
        if block == NULL_BLOCK || block as usize >= self.blocks.len() {
            return Err(Error::input(
                "block",
                block,
                format!(
                    "must be a block of the pool, 1 to {}",
                    self.blocks.len() - 1
                ),
            ));
        }
        Ok(())
    }

    /// vLLM's `BlockPool.touch` of one block by the connector (a write-back's reference):
    /// out of the free queue if it had no reference. A watcher stays registered.
    ///
    /// # Errors
    /// `Error::Config` with the pins off; `Error::Input` for the null block or one past the pool.
    pub fn touch_hisparse_block(&mut self, block: BlockId) -> Result<()> {
        self.check_block(block)?;
        self.pins_mut("touch_hisparse_block")?.touched[block as usize] += 1;
        let meta = &mut self.blocks[block as usize];
        if meta.ref_cnt == 0 {
            self.free_queue.remove(block);
        }
        meta.ref_cnt += 1;
        Ok(())
    }

    /// Returns a reference [`Self::touch_hisparse_block`] took (vLLM's `free_blocks`: a
    /// block reaching no reference goes to the queue's front, or its tail if hashed).
    ///
    /// # Errors
    /// As `touch_hisparse_block`; `Error::Input` when the block holds no such reference.
    pub fn release_hisparse_block(&mut self, block: BlockId) -> Result<()> {
        self.check_block(block)?;
        let touched = &mut self.pins_mut("release_hisparse_block")?.touched[block as usize];
        if *touched == 0 {
            return Err(Error::input(
                "block",
                block,
                "holds no reference taken by touch_hisparse_block",
            ));
        }
        *touched -= 1;
        self.free_blocks(std::iter::once(block));
        Ok(())
    }

    /// vLLM's `BlockPool.unpin_blocks` on the resident block at `page` of the request's
    /// row: the table's reference goes (at none, the block joins the free queue's tail),
    /// the page still reads the block, and a watcher is registered under it. Returns the
    /// block.
    ///
    /// # Errors
    /// `Error::Config` with the pins off; `Error::UnknownRequest`; `Error::Input` when the
    /// page is past the table, null, or already unpinned or lost.
    pub fn unpin_hisparse_page(&mut self, request_id: &R, page: usize) -> Result<BlockId> {
        let group = self.pins_mut("unpin_hisparse_page")?.resident_group;
        let request =
            (self.requests.get(request_id)).ok_or_else(|| Error::unknown_request(request_id))?;
        let block = request.tables[group]
            .get(page)
            .copied()
            .unwrap_or(NULL_BLOCK);
        let pins = self.hisparse_pins.as_deref_mut().expect("checked above");
        if block == NULL_BLOCK || pins.unheld(request_id, group, page) {
            return Err(Error::input(
                "page",
                page,
                "is not a pinned resident page of the request",
            ));
        }
        pins.watched[block as usize] = true;
        pins.owners
            .entry(block)
            .or_default()
            .push((request_id.clone(), page));
        let row = pins.rows.entry(request_id.clone()).or_default();
        row.unpinned.insert(page);
        let meta = &mut self.blocks[block as usize];
        meta.ref_cnt -= 1;
        if meta.ref_cnt == 0 {
            self.free_queue.push_back(block);
        }
        Ok(block)
    }

    /// The request's resident row as the worker reads it: its resident table with lost
    /// pages null (unpinned pages still name their blocks). `None` with the pins off or for
    /// a request holding no blocks.
    pub fn hisparse_resident_row(&self, request_id: &R) -> Option<Vec<BlockId>> {
        let pins = self.hisparse_pins.as_deref()?;
        let mut row = self.requests.get(request_id)?.tables[pins.resident_group].clone();
        if let Some(overlay) = pins.rows.get(request_id) {
            overlay.lost.iter().for_each(|&p| row[p] = NULL_BLOCK);
        }
        Some(row)
    }

    /// The request's unpinned resident pages (read, not held), ascending.
    pub fn hisparse_unpinned_pages(&self, request_id: &R) -> Vec<usize> {
        let pins = self.hisparse_pins.as_deref();
        pins.and_then(|p| p.rows.get(request_id))
            .map_or_else(Vec::new, |r| r.unpinned.iter().copied().collect())
    }

    /// The pages lost since the last call, in the order their blocks were handed out.
    pub fn take_hisparse_lost_pages(&mut self) -> Vec<(R, usize)> {
        (self.hisparse_pins.as_deref_mut())
            .map_or_else(Vec::new, |p| std::mem::take(&mut p.lost_log))
    }

    /// Whether the request requires (or holds) its hot region (`None` when it holds no
    /// blocks).
    pub fn hisparse_requires_hot(&self, request_id: &R) -> Option<bool> {
        self.requests.get(request_id).map(|r| r.reads_host)
    }

    /// The request requires a hot region, taken at its next allocation (vLLM's
    /// `require_hot` from `update_residency`).
    ///
    /// # Errors
    /// `Error::UnknownRequest` when it holds no blocks.
    pub fn require_hisparse_hot(&mut self, request_id: &R) -> Result<()> {
        let request = (self.requests.get_mut(request_id))
            .ok_or_else(|| Error::unknown_request(request_id))?;
        request.reads_host = true;
        Ok(())
    }

    /// After an allocation: the requests that lost a page to it require a hot region.
    pub(super) fn apply_hisparse_reuse(&mut self) {
        let Some(pins) = self.hisparse_pins.as_deref_mut() else {
            return;
        };
        for request_id in pins.take_require_hot() {
            if let Some(request) = self.requests.get_mut(&request_id) {
                request.reads_host = true;
            }
        }
    }

    /// A freed request's tables as they are returned: the resident group's unpinned and
    /// lost pages null (they hold no reference), and the request's watchers forgotten
    /// (its unpinned blocks stay watched, reading nothing).
    pub(super) fn hisparse_tables_for_free(
        &mut self,
        request_id: &R,
        mut tables: Vec<Vec<BlockId>>,
    ) -> Vec<Vec<BlockId>> {
        let Some(pins) = self.hisparse_pins.as_deref_mut() else {
            return tables;
        };
        let Some(overlay) = pins.rows.remove(request_id) else {
            return tables;
        };
        let table = &mut tables[pins.resident_group];
        for &page in &overlay.unpinned {
            if let Some(owners) = pins.owners.get_mut(&table[page]) {
                owners.retain(|(r, p)| !(r == request_id && *p == page));
            }
        }
        for page in overlay.unpinned.into_iter().chain(overlay.lost) {
            table[page] = NULL_BLOCK;
        }
        tables
    }
}

#[cfg(test)]
#[path = "coordinator_hisparse_pins_tests.rs"]
mod tests;
