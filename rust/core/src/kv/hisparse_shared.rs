//! Pieces the two HiSparse ports share: the host half ([`super::host_publication`]) and
//! the device half ([`super::hisparse_residency`]) of vLLM 0.33's HiSparse connector
//! (`vllm/v1/hisparse/coordinator.py`).
//!
//! - [`free_queue_without_null`]: a `BlockPool`'s free queue, block 0 (the null block) off;
//! - [`Completions`] and [`landed`]: the first half of `update_spills`, which applies the
//!   workers' counts and picks the write-backs that landed.

use std::collections::BTreeMap;

use super::FreeBlockQueue;
use crate::Result;

/// A free queue of blocks `1..num_blocks`, lowest first: vLLM's `BlockPool` takes its null
/// block off the free queue first.
pub(super) fn free_queue_without_null(num_blocks: usize) -> Result<FreeBlockQueue> {
    let mut queue = FreeBlockQueue::with_all_blocks(num_blocks)?;
    queue.pop_front();
    Ok(queue)
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
