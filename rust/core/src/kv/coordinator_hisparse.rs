//! HiSparse's device groups in the coordinator where their rules differ from full
//! attention's (vLLM 0.33's `HiSparseResidentManager` and `HiSparseHotManager`,
//! `single_type_kv_cache_manager.py`), for a request admitted with a connector load:
//!
//! - the resident group keeps the loaded prefix on host but its last page: nulls up to the
//!   page of the last loaded token, which gets a block (`allocate_external_computed_blocks`),
//!   and counts `1 + pages past the loaded ones` whatever the admission cap
//!   (`get_num_blocks_to_allocate`'s import branch);
//! - the hot group's request must read host-backed history (`require_hot`): its
//!   `blocks_per_request` blocks are taken by the admitting allocation, after the other
//!   groups' (its `allocate_new_blocks`, which runs even when nothing is computed), and the
//!   request holds them to its end.
//!
//! Without a load neither differs (no host prefix hit exists with prefix caching off), and
//! a hot group takes nothing.

use super::{BlockId, Eviction, KvCoordinator, RequestKey, take_free_block};
use super::{KvGroupSpec, NULL_BLOCK};

/// A HiSparse group's need where its rule is not the generic one: `held` is the request's
/// table length and whether it reads host (`None` for a request not admitted yet);
/// `loaded`: the first allocation loads tokens past the local hit (`num_computed` the hit
/// and the loaded ones). `None`: the generic rule applies.
pub(super) fn hisparse_need(
    spec: &KvGroupSpec,
    held: Option<(usize, bool)>,
    num_slots: usize,
    num_computed: usize,
    loaded: bool,
    block_size: usize,
) -> Option<usize> {
    match (spec, held) {
        (KvGroupSpec::HiSparseHot { blocks_per_request }, Some((len, reads_host))) => {
            Some(if reads_host {
                blocks_per_request.saturating_sub(len)
            } else {
                0
            })
        }
        (KvGroupSpec::HiSparseHot { blocks_per_request }, None) => {
            Some(if loaded { *blocks_per_request } else { 0 })
        }
        (KvGroupSpec::HiSparseResident { .. }, None) if loaded => {
            let imported = num_computed.div_ceil(block_size);
            Some(1 + num_slots.div_ceil(block_size).saturating_sub(imported))
        }
        _ => None,
    }
}

/// The blocks a group's table should reach for `num_slots` slots: a hot group's region
/// when its request reads host, nothing otherwise; the spec's own count for the rest.
pub(super) fn required_blocks(
    spec: &KvGroupSpec,
    reads_host: bool,
    num_slots: usize,
    block_size: usize,
) -> usize {
    match spec.hot_blocks() {
        Some(n) if reads_host => n,
        _ => spec.num_required_blocks(num_slots, block_size),
    }
}

impl<R: RequestKey> KvCoordinator<R> {
    /// Whether any group is a HiSparse device group.
    pub(super) fn has_hisparse(&self) -> bool {
        self.groups.iter().any(KvGroupSpec::is_hisparse)
    }

    /// The resident groups' loaded pages of a request just admitted with `total` computed
    /// tokens, `num_external_tokens` of them loaded: nulls, and a block for the last one
    /// (added to `new_blocks[g]`). Marks the request as reading host.
    pub(super) fn load_hisparse_pages(
        &mut self,
        request_id: &R,
        total: usize,
        new_blocks: &mut [Vec<BlockId>],
    ) {
        let Self {
            groups,
            requests,
            blocks,
            free_queue,
            cached,
            stats,
            block_size,
            ..
        } = self;
        let request = requests.get_mut(request_id).expect("admitted");
        request.reads_host = true;
        let mut eviction = Eviction {
            cached,
            events: &mut None,
            host: &mut None,
            stats,
        };
        let tail = (total.max(1) - 1) / *block_size;
        for (g, (spec, table)) in groups.iter().zip(&mut request.tables).enumerate() {
            if !matches!(spec, KvGroupSpec::HiSparseResident { .. }) || table.len() > tail {
                continue;
            }
            table.resize(tail, NULL_BLOCK);
            let block = take_free_block(free_queue, blocks, &mut eviction);
            table.push(block);
            new_blocks[g].push(block);
        }
    }

    /// The hot groups' regions of a request reading host (added to `new_blocks[g]`): what
    /// vLLM's `allocate_new_blocks` takes for them when the admitting allocation computes
    /// nothing.
    pub(super) fn take_hot_regions(&mut self, request_id: &R, new_blocks: &mut [Vec<BlockId>]) {
        let Self {
            groups,
            requests,
            blocks,
            free_queue,
            cached,
            stats,
            ..
        } = self;
        let request = requests.get_mut(request_id).expect("admitted");
        let mut eviction = Eviction {
            cached,
            events: &mut None,
            host: &mut None,
            stats,
        };
        for (g, (spec, table)) in groups.iter().zip(&mut request.tables).enumerate() {
            let Some(n) = spec.hot_blocks().filter(|_| request.reads_host) else {
                continue;
            };
            let added: Vec<BlockId> = (table.len()..n)
                .map(|_| take_free_block(free_queue, blocks, &mut eviction))
                .collect();
            table.extend_from_slice(&added);
            new_blocks[g].extend(added);
        }
    }
}
