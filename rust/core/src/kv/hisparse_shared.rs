//! Pieces the two HiSparse ports share: the host half ([`super::host_publication`]) and
//! the device half ([`super::hisparse_residency`]) of vLLM 0.33's HiSparse connector
//! (`vllm/v1/hisparse/coordinator.py`).
//!
//! - [`free_queue_without_null`]: a `BlockPool`'s free queue, block 0 (the null block) off;
//! - [`Completions`] and [`landed`]: the first half of `update_spills`, which applies the
//!   workers' counts and picks the write-backs that landed;
//! - [`PageState`]: a request's valid, ready and pending pages (`valid_pages`,
//!   `ready_prefix_pages` and `pending_pages` of `_HiSparseRequestState`);
//! - [`release_unhashed`]: `BlockPool.free_blocks` on a pool without hashes (the device
//!   half's pools and the connector's host pool, caching off).

use std::collections::BTreeMap;

use super::{BlockId, FreeBlockQueue, NULL_BLOCK};
use crate::{Error, Result};

/// A free queue of blocks `1..num_blocks`, lowest first: vLLM's `BlockPool` takes its null
/// block off the free queue first.
pub(super) fn free_queue_without_null(num_blocks: usize) -> Result<FreeBlockQueue> {
    let mut queue = FreeBlockQueue::with_all_blocks(num_blocks)?;
    queue.pop_front();
    Ok(queue)
}

/// `BlockPool.free_blocks` without hashes: each block's reference goes (`refs`, by block
/// id); blocks reaching none go to `free`'s front, the first given first; null blocks are
/// skipped. `pool` names the pool in the error.
///
/// # Errors
/// `Error::Internal` when a block has no reference left to release (a bug).
pub(super) fn release_unhashed(
    free: &mut FreeBlockQueue,
    refs: &mut [u32],
    blocks: impl IntoIterator<Item = BlockId>,
    pool: &str,
) -> Result<()> {
    let mut front = Vec::new();
    for block in blocks.into_iter().filter(|&b| b != NULL_BLOCK) {
        let count = &mut refs[block as usize];
        if *count == 0 {
            return Err(Error::Internal(format!("{pool} block {block} freed twice")));
        }
        *count -= 1;
        if *count == 0 {
            front.push(block);
        }
    }
    front.iter().rev().for_each(|&b| free.push_front(b));
    Ok(())
}

/// The completions a write-back waits for (vLLM's `_PendingSpill` counts).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Completions {
    /// The first enqueued count reported (0: none reported yet).
    expected: u32,
    completed: u32,
}

impl Completions {
    fn has_landed(self) -> bool {
        self.expected > 0 && self.completed >= self.expected
    }
}

/// vLLM's `update_spills`, first half: each transfer takes the first enqueued count
/// reported for it as the completions it waits for, and adds the completions reported
/// (counts summed over workers; unknown ids are passed by). Returns the ids of the
/// transfers whose completions are all in, ascending (the order they land in); they stay
/// in `transfers`.
pub(super) fn landed<T>(
    transfers: &mut BTreeMap<u64, T>,
    enqueued: &[(u64, u32)],
    completed: &[(u64, u32)],
    counts: impl Fn(&mut T) -> &mut Completions,
) -> Vec<u64> {
    for &(id, count) in enqueued {
        if let Some(transfer) = transfers.get_mut(&id) {
            let counts = counts(transfer);
            if counts.expected == 0 {
                counts.expected = count;
            }
        }
    }
    for &(id, count) in completed {
        if let Some(transfer) = transfers.get_mut(&id) {
            counts(transfer).completed += count;
        }
    }
    transfers
        .iter_mut()
        .filter_map(|(&id, t)| counts(t).has_landed().then_some(id))
        .collect()
}
/// A request's pages as its write-backs go: valid (host copy complete), pending (a
/// write-back in flight, by transfer id) and the ready prefix (pages `0..ready` all valid).
#[derive(Debug, Clone, Default)]
pub(super) struct PageState {
    valid: Vec<bool>,
    ready: usize,
    pending: BTreeMap<usize, u64>,
}

impl PageState {
    /// Pages `0..num_valid` valid and ready (a prefix hit), none pending.
    pub(super) fn with_valid_prefix(num_valid: usize) -> Self {
        Self {
            valid: vec![true; num_valid],
            ready: num_valid,
            pending: BTreeMap::new(),
        }
    }

    pub(super) fn ready(&self) -> usize {
        self.ready
    }

    pub(super) fn is_valid(&self, page: usize) -> bool {
        self.valid.get(page).copied().unwrap_or(false)
    }

    pub(super) fn is_pending(&self, page: usize) -> bool {
        self.pending.contains_key(&page)
    }

    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether the page needs a write-back: neither valid nor pending.
    pub(super) fn needs_write(&self, page: usize) -> bool {
        !self.is_valid(page) && !self.is_pending(page)
    }

    /// The page's write-back `transfer_id` is planned.
    pub(super) fn plan(&mut self, page: usize, transfer_id: u64) {
        self.pending.insert(page, transfer_id);
    }

    /// The page's write-back landed: it is valid, no longer pending.
    pub(super) fn land(&mut self, page: usize) {
        self.pending.remove(&page);
        if self.valid.len() <= page {
            self.valid.resize(page + 1, false);
        }
        self.valid[page] = true;
    }

    /// The ready prefix grows over the valid pages past it.
    pub(super) fn advance_ready(&mut self) {
        while self.is_valid(self.ready) {
            self.ready += 1;
        }
    }
}
