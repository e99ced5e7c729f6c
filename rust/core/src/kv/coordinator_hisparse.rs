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
//! Without a load neither differs, and a hot group takes nothing.
//!
//! With prefix caching on, vLLM's host source group is looked up first (a full-attention
//! group, `HybridKVCacheCoordinator.verify_and_split_kv_cache_groups` keeps it ahead of the
//! indexer) and serves only host pages published by its `HiSparseCoordinator`: a page is
//! published once the HiSparse connector's worker acknowledges its write-back
//! (`update_spills` -> `_complete_host_writes` -> `_publish_host_blocks_if_ready`) or a host
//! import that connector finished completes (`complete_host_import`). Both need that
//! connector's scheduler side, which plans the write-backs (`advance_scheduled`); without
//! it nothing is ever published, so no lookup hits (the bound here:
//! [`KvCoordinator::hisparse_published_tokens`]), while the other full-attention groups
//! still cache their blocks (a freed cached block goes to the free queue's tail).

use super::{BlockId, KvCoordinator, RequestKey, Taking};
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

    /// The longest prefix hit the host source group can serve: 0 beside HiSparse device
    /// groups (no host page is published without the HiSparse connector's acknowledged
    /// write-backs, which nothing drives here), unbounded otherwise.
    pub(super) fn hisparse_published_tokens(&self) -> usize {
        if self.has_hisparse() { 0 } else { usize::MAX }
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
        let block_size = self.block_size;
        let Taking {
            groups,
            request,
            mut taker,
            ..
        } = self.taking(request_id);
        request.reads_host = true;
        let tail = (total.max(1) - 1) / block_size;
        for (g, (spec, table)) in groups.iter().zip(&mut request.tables).enumerate() {
            if !matches!(spec, KvGroupSpec::HiSparseResident { .. }) || table.len() > tail {
                continue;
            }
            table.resize(tail, NULL_BLOCK);
            let block = taker.take(1);
            table.extend_from_slice(&block);
            new_blocks[g].extend(block);
        }
    }

    /// The hot groups' regions of a request reading host (added to `new_blocks[g]`): what
    /// vLLM's `allocate_new_blocks` takes for them when the admitting allocation computes
    /// nothing.
    pub(super) fn take_hot_regions(&mut self, request_id: &R, new_blocks: &mut [Vec<BlockId>]) {
        let Taking {
            groups,
            request,
            mut taker,
            ..
        } = self.taking(request_id);
        for (g, (spec, table)) in groups.iter().zip(&mut request.tables).enumerate() {
            let Some(n) = spec.hot_blocks().filter(|_| request.reads_host) else {
                continue;
            };
            let added = taker.take(n.saturating_sub(table.len()));
            table.extend_from_slice(&added);
            new_blocks[g].extend(added);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ExternalAllocation, TokenId};
    use super::*;
    use crate::kv::KvCapacity;

    const FULL: KvGroupSpec = KvGroupSpec::FullAttention;
    const RESIDENT: KvGroupSpec = KvGroupSpec::HiSparseResident {
        max_admission_blocks: 2,
    };
    const HOT: KvGroupSpec = KvGroupSpec::HiSparseHot {
        blocks_per_request: 2,
    };

    fn layout(num_blocks: usize) -> KvCoordinator<u64> {
        KvCoordinator::new(vec![FULL, RESIDENT, HOT], num_blocks, 4, false).unwrap()
    }

    fn tables(coord: &KvCoordinator<u64>, id: u64) -> Vec<Vec<BlockId>> {
        (coord.block_ids(&id).unwrap().iter())
            .map(|t| t.to_vec())
            .collect()
    }

    /// 32 tokens of 4: 8 full-attention blocks and 8 resident ones, the latter capped at 2
    /// by the full-sequence gate only (vLLM's `apply_admission_cap`): 10 fit in 10 free.
    #[test]
    fn the_resident_group_is_capped_at_the_gate_only() {
        let coord = layout(11);
        assert!(coord.full_sequence_fits(&1, 32, None, 64, 0));
        assert!(!layout(10).full_sequence_fits(&1, 32, None, 64, 0));
        let mut coord = coord;
        let tokens: Vec<TokenId> = (0..32).collect();
        let new = coord.allocate_slots(&1, &tokens[..8], 8, 0, None, None);
        assert_eq!(new.unwrap().unwrap(), [vec![1, 2], vec![3, 4], vec![]]);
        coord.check_invariants().unwrap();
    }

    /// 10 loaded tokens and 6 to compute over blocks of 4: full attention takes 4 blocks;
    /// the resident group nulls for the first 2 loaded pages, a block for the third (the
    /// last loaded token's) and one more to compute; the hot group its 2 blocks last.
    #[test]
    fn a_load_keeps_the_resident_prefix_on_host_and_takes_the_hot_region() {
        let mut coord = layout(40);
        let tokens: Vec<TokenId> = (0..16).collect();
        let alloc = ExternalAllocation {
            num_external_tokens: 10,
            num_new_tokens: 6,
            cache: true,
            ..ExternalAllocation::default()
        };
        let new = coord.allocate_slots_external(&1, &tokens, None, None, alloc);
        assert_eq!(
            new.unwrap().unwrap(),
            [vec![1, 2, 3, 5], vec![4, 6], vec![7, 8]]
        );
        assert_eq!(
            tables(&coord, 1),
            [
                vec![1, 2, 3, 5],
                vec![NULL_BLOCK, NULL_BLOCK, 4, 6],
                vec![7, 8]
            ]
        );
        // The hot region is held: a decode takes no more of it.
        let new = coord.allocate_slots(&1, &[16], 1, 0, None, None);
        assert_eq!(new.unwrap().unwrap(), [vec![9], vec![10], vec![]]);
        coord.check_invariants().unwrap();
        coord.free(&1).unwrap();
        assert_eq!(coord.num_free_blocks(), 39);
    }

    /// An asynchronous load computes nothing: the hot region still comes with it (vLLM's
    /// `allocate_new_blocks` runs after the loaded blocks).
    #[test]
    fn an_async_load_takes_the_hot_region_too() {
        let mut coord = layout(40);
        let tokens: Vec<TokenId> = (0..9).collect();
        let alloc = ExternalAllocation {
            num_external_tokens: 8,
            ..ExternalAllocation::default()
        };
        let new = coord.allocate_slots_external(&1, &tokens, None, None, alloc);
        assert_eq!(new.unwrap().unwrap(), [vec![1, 2], vec![3], vec![4, 5]]);
        assert_eq!(tables(&coord, 1)[1], [NULL_BLOCK, 3]);
        coord.check_invariants().unwrap();
    }

    /// Prefix caching on: the full-attention group caches a finished request's blocks (they
    /// go to the free queue's tail, so the next request takes never-used blocks first), yet
    /// the same prompt hits nothing: no host page was published.
    #[test]
    fn with_caching_on_blocks_are_cached_but_nothing_hits() {
        let mut coord = KvCoordinator::<u64>::new(vec![FULL, RESIDENT, HOT], 20, 4, true).unwrap();
        let tokens: Vec<TokenId> = (0..9).collect();
        let new = coord.allocate_slots(&1, &tokens, 9, 0, None, None);
        assert_eq!(
            new.unwrap().unwrap(),
            [vec![1, 2, 3], vec![4, 5, 6], vec![]]
        );
        coord.free(&1).unwrap();
        let hit = coord.get_computed_blocks(&tokens, None);
        assert_eq!(hit.num_computed_tokens, 0);
        assert_eq!(hit.num_uncached_prefix_tokens, 0);
        assert!(hit.block_ids.iter().all(Vec::is_empty));
        // Blocks without a hash come back to the queue's front (the resident group's 4-6
        // tail first), the cached full blocks 1 and 2 to its tail.
        let new = coord.allocate_slots(&2, &tokens, 9, 0, Some(&hit), None);
        assert_eq!(new.unwrap().unwrap()[0], [6, 5, 4]);
        coord.check_invariants().unwrap();
    }
}
