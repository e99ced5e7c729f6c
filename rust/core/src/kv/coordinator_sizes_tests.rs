//! Groups with different block sizes (`coordinator_sizes`): hand-checked numbers, and a
//! property test over random streams.

use super::*;
use proptest::prelude::*;

const FULL: KvGroupSpec = KvGroupSpec::FullAttention;

fn window(tokens: usize) -> KvGroupSpec {
    KvGroupSpec::SlidingWindow {
        sliding_window: tokens,
    }
}

fn tokens(range: std::ops::Range<u32>) -> Vec<TokenId> {
    range.collect()
}

/// Full attention in blocks of 8, a window of 8 in blocks of 4, hashed every 4 tokens
/// (Gemma 4's shape, scaled down): the scheduler block size is 8.
fn gemma_like(num_blocks: usize) -> KvCoordinator<u64> {
    let mut coord = KvCoordinator::new(vec![FULL, window(8)], num_blocks, 4, true).unwrap();
    coord.set_group_block_sizes(&[8, 4]).unwrap();
    coord
}

fn tables(coord: &KvCoordinator<u64>, id: u64) -> Vec<Vec<BlockId>> {
    let tables = coord.block_ids(&id).unwrap();
    tables.iter().map(|t| t.to_vec()).collect()
}

#[test]
fn each_group_allocates_blocks_of_its_own_size() {
    let mut coord = gemma_like(20);
    assert_eq!(coord.scheduler_block_size(), 8);
    let new = coord.allocate_slots(&1, &tokens(0..12), 12, 0, None, None);
    // ceil(12 / 8) = 2 full-attention blocks, ceil(12 / 4) = 3 window blocks.
    assert_eq!(new.unwrap().unwrap(), [vec![1, 2], vec![3, 4, 5]]);
    coord.check_invariants().unwrap();
}

/// 13 computed tokens: only the 8 below the scheduler block size's boundary are cached
/// (vLLM's `_align_cacheable`): one full-attention block, two window blocks.
#[test]
fn only_tokens_below_the_scheduler_block_boundary_are_cached() {
    let mut coord = gemma_like(20);
    let prompt = tokens(0..13);
    coord
        .allocate_slots(&1, &prompt, 13, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(coord.num_cached_blocks(), 3);
    // The same prompt again: the hit is those 8 tokens in both groups (the full-attention
    // block keyed by the hash of its second hash block, which chains over all 8).
    let hit = coord.get_computed_blocks(&prompt, None);
    assert_eq!(hit.num_computed_tokens, 8);
    assert_eq!(hit.block_ids, [vec![1], vec![3, 4]]);
    let new = coord.allocate_slots(&2, &prompt, 5, 0, Some(&hit), None);
    // 13 tokens: one more block of 8, two more of 4 (request 1 holds blocks 1-6).
    assert_eq!(new.unwrap().unwrap(), [vec![7], vec![8, 9]]);
    assert_eq!(tables(&coord, 2), [vec![1, 7], vec![3, 4, 8, 9]]);
    coord.check_invariants().unwrap();
}

/// A hit every group can serve lands on the scheduler block size: 12 tokens cached in
/// blocks of 4 give a hit of 8 when another group's blocks are 8 long.
#[test]
fn a_full_attention_hit_is_rounded_down_to_the_alignment() {
    let mut lookups = 0;
    let hit = find_longest_cache_hit(FULL, 1, 4, 8, 4, 16, false, |i| {
        lookups += 1;
        (i < 3).then(|| vec![i as BlockId + 1])
    });
    assert_eq!((hit.num_tokens, hit.blocks), (8, vec![vec![1, 2]]));
    assert_eq!(lookups, 4);
}

/// vLLM's `SlidingWindowManager.find_longest_cache_hit` with `alignment_tokens`: a run may
/// only end where the hit is aligned (blocks 0-2 cached, window 8 in blocks of 4: 12 tokens
/// unaligned, 8 with alignment 8); a run from block 0 too short is cut to the alignment.
#[test]
fn a_window_run_ends_only_on_the_alignment() {
    let cached = |i: usize| (i < 3).then(|| vec![i as BlockId + 1]);
    let hit = find_longest_cache_hit(window(8), 1, 4, 4, 4, 16, false, cached);
    assert_eq!((hit.num_tokens, hit.blocks), (12, vec![vec![0, 2, 3]]));
    let hit = find_longest_cache_hit(window(8), 1, 4, 8, 4, 16, false, cached);
    assert_eq!((hit.num_tokens, hit.blocks), (8, vec![vec![1, 2]]));
    // Window 20 needs 5 blocks: none found, the run from block 0 (3 blocks) is cut to 2.
    let hit = find_longest_cache_hit(window(20), 1, 4, 8, 4, 16, false, cached);
    assert_eq!((hit.num_tokens, hit.blocks), (8, vec![vec![1, 2]]));
}

/// vLLM's `SlidingWindowManager.reachable_block_mask`: a window of 12 in blocks of 4 beside
/// blocks of 16 needs 3 blocks before a hit's end, which lands on a multiple of 16; the first
/// block of each 16 is never read by a hit, so it is not cached.
#[test]
fn a_window_caches_only_the_blocks_a_hit_can_reach() {
    let mut coord = KvCoordinator::new(vec![FULL, window(12)], 40, 4, true).unwrap();
    coord.set_group_block_sizes(&[16, 4]).unwrap();
    coord
        .allocate_slots(&1, &tokens(0..33), 33, 0, None, None)
        .unwrap()
        .unwrap();
    // 32 cacheable tokens: 2 full-attention blocks, window blocks 1-3 and 5-7 (not 0, 4).
    assert_eq!(coord.num_cached_blocks(), 2 + 6);
    let window_table = tables(&coord, 1)[1].clone();
    let cached: Vec<bool> = (window_table.iter())
        .map(|&b| coord.blocks[b as usize].hash().is_some())
        .collect();
    assert_eq!(
        cached,
        [false, true, true, true, false, true, true, true, false]
    );
    let hit = coord.get_computed_blocks(&tokens(0..40), None);
    assert_eq!(hit.num_computed_tokens, 32);
    coord.check_invariants().unwrap();
}

#[test]
fn block_sizes_that_do_not_fit_the_hash_block_or_the_groups_are_refused() {
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, window(8)], 20, 4, true).unwrap();
    assert!(coord.set_group_block_sizes(&[8]).is_err(), "one per group");
    assert!(
        coord.set_group_block_sizes(&[8, 6]).is_err(),
        "not a multiple of 4"
    );
    // A `none`-mode Mamba group holds one state block whatever its size: served beside
    // differing sizes without prefix caching (with it, vLLM's MambaManager asserts align
    // mode; `set_group_block_sizes` refuses it then).
    let mamba = vec![FULL, KvGroupSpec::MAMBA];
    let mut coord = KvCoordinator::<u64>::new(mamba, 20, 4, false).unwrap();
    coord.set_group_block_sizes(&[4, 8]).unwrap();
    let blocks = coord
        .allocate_slots(&1, &tokens(0..6), 6, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(blocks.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1]);
    coord.free(&1).unwrap();
    // Cross-attention is not served beside differing sizes (`coordinator_sizes_kinds_tests`
    // has the Mamba `align` and chunked local rules).
    let cross = vec![FULL, KvGroupSpec::CrossAttention];
    let mut coord = KvCoordinator::<u64>::new(cross, 20, 4, false).unwrap();
    let err = coord.set_group_block_sizes(&[8, 4]).unwrap_err();
    assert!(err.to_string().contains("groups[1]"), "{err}");
    let align = vec![FULL, KvGroupSpec::MAMBA_ALIGN];
    let mut coord = KvCoordinator::<u64>::new(align, 20, 4, false).unwrap();
    // Equal sizes change nothing, beside any group.
    coord.set_group_block_sizes(&[4, 4]).unwrap();
    assert_eq!(coord.scheduler_block_size(), 4);
    let mut coord = gemma_like(20);
    coord
        .allocate_slots(&1, &tokens(0..4), 4, 0, None, None)
        .unwrap();
    assert!(
        coord.set_group_block_sizes(&[4, 4]).is_err(),
        "a request holds blocks"
    );
    assert!(coord.set_hash_lookahead(1).is_err());
}

/// A chunked local attention group is served without EAGLE's drop (vLLM asserts none);
/// beside differing sizes the drop is served (`coordinator_sizes_tail_tests`).
#[test]
fn eagles_drop_beside_a_chunked_group_is_refused() {
    let chunked = KvGroupSpec::ChunkedLocalAttention {
        attention_chunk_size: 8,
    };
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, chunked], 20, 4, true).unwrap();
    assert!(
        coord.set_eagle_block_drop(true).is_err(),
        "vLLM asserts no drop"
    );
}

/// vLLM's managers with `drop_eagle_block`: full attention drops a block and then rounds
/// down to the alignment (3 cached blocks of 4, alignment 8: 12 - 4 = 8, where rounding
/// first would give 4); a window needs a block more (window 8 in blocks of 4: 3) and drops
/// the run's last (12 tokens found, 8 kept).
#[test]
fn eagles_drop_takes_one_block_from_each_finder() {
    let cached = |i: usize| (i < 3).then(|| vec![i as BlockId + 1]);
    let hit = find_longest_cache_hit(FULL, 1, 4, 8, 4, 16, true, cached);
    assert_eq!((hit.num_tokens, hit.blocks), (8, vec![vec![1, 2]]));
    let hit = find_longest_cache_hit(FULL, 1, 4, 4, 4, 16, true, cached);
    assert_eq!((hit.num_tokens, hit.blocks), (8, vec![vec![1, 2]]));
    let hit = find_longest_cache_hit(window(8), 1, 4, 4, 4, 16, false, cached);
    assert_eq!((hit.num_tokens, hit.blocks), (12, vec![vec![0, 2, 3]]));
    let hit = find_longest_cache_hit(window(8), 1, 4, 4, 4, 16, true, cached);
    assert_eq!((hit.num_tokens, hit.blocks), (8, vec![vec![1, 2]]));
    // Nothing cached: nothing to drop.
    let hit = find_longest_cache_hit(window(8), 1, 4, 4, 4, 16, true, |_| None);
    assert_eq!(hit.num_tokens, 0);
}

#[test]
fn rewinding_stops_at_the_tokens_a_group_cached() {
    let mut coord = gemma_like(20);
    coord
        .allocate_slots(&1, &tokens(0..13), 13, 0, None, None)
        .unwrap();
    // 8 tokens cached (one block of 8, two of 4): 5 may be rewound.
    assert!(coord.rewind_computed_tokens(&1, 6).is_err());
    coord.rewind_computed_tokens(&1, 5).unwrap();
    coord.check_invariants().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Admit {
        id: u64,
        prefix: u8,
        len: u8,
        chunk: u8,
    },
    Step {
        id: u64,
        len: u8,
    },
    Free {
        id: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6u64, 0..3u8, 1..60u8, 1..40u8).prop_map(|(id, prefix, len, chunk)| Op::Admit {
            id,
            prefix,
            len,
            chunk
        }),
        (0..6u64, 1..12u8).prop_map(|(id, len)| Op::Step { id, len }),
        (0..6u64).prop_map(|id| Op::Free { id }),
    ]
}

proptest! {
    /// Random streams over full attention and windows whose blocks hold 1, 2 or 4 hash
    /// blocks: memory is conserved, each table holds `ceil(slots / its block size)`
    /// entries, and every hit lands on the scheduler block size.
    #[test]
    fn random_streams_over_mixed_block_sizes_keep_invariants(
        ops in prop::collection::vec(op(), 1..60),
        w in 1..20usize,
        hash in 1..4usize,
        scales in prop::collection::vec(prop::sample::select(vec![1usize, 2, 4]), 3),
    ) {
        let groups = vec![FULL, window(w), FULL];
        let sizes: Vec<usize> = scales.iter().map(|s| s * hash).collect();
        let mut coord = KvCoordinator::new(groups, 60, hash, true).unwrap();
        coord.set_group_block_sizes(&sizes).unwrap();
        let align = coord.scheduler_block_size();
        let mut next_token = 1000u32;
        for op in ops {
            match op {
                Op::Admit { id, prefix, len, chunk } => {
                    if coord.block_ids(&id).is_some() { continue; }
                    let prompt: Vec<TokenId> =
                        (0..len as u32).map(|t| t + 100 * prefix as u32).collect();
                    let hit = coord.get_computed_blocks(&prompt, None);
                    prop_assert_eq!(hit.num_computed_tokens % align, 0);
                    for (g, table) in hit.block_ids.iter().enumerate() {
                        prop_assert!(table.len() <= hit.num_computed_tokens.div_ceil(sizes[g]));
                    }
                    let n = (prompt.len() - hit.num_computed_tokens).min(chunk as usize);
                    let _ = coord.allocate_slots(&id, &prompt, n, 0, Some(&hit), None).unwrap();
                }
                Op::Step { id, len } => {
                    if coord.block_ids(&id).is_none() { continue; }
                    let new: Vec<TokenId> = (0..len as u32).map(|t| next_token + t).collect();
                    next_token += len as u32;
                    let _ = coord.allocate_slots(&id, &new, len as usize, 0, None, None).unwrap();
                }
                Op::Free { id } => {
                    let _ = coord.free(&id);
                }
            }
            prop_assert_eq!(coord.check_invariants(), Ok(()));
            for id in 0..6u64 {
                let Some(computed) = coord.num_computed_tokens(&id) else { continue };
                let tables = coord.block_ids(&id).unwrap();
                for (g, table) in tables.iter().enumerate() {
                    prop_assert_eq!(table.len(), computed.div_ceil(sizes[g]));
                }
            }
        }
    }
}

/// Blocks cached at the old sizes would be keyed as blocks of the new ones (a block's key
/// is its last hash block's hash at any size), so changing the sizes empties the cache.
#[test]
fn new_block_sizes_forget_what_the_old_ones_cached() {
    let mut coord = KvCoordinator::new(vec![FULL, window(8)], 20, 4, true).unwrap();
    let prompt = tokens(0..16);
    coord
        .allocate_slots(&1, &prompt, 16, 0, None, None)
        .unwrap();
    coord.free(&1).unwrap();
    assert_eq!(
        coord.get_computed_blocks(&prompt, None).num_computed_tokens,
        12
    );
    coord.set_group_block_sizes(&[8, 4]).unwrap();
    assert_eq!(coord.num_cached_blocks(), 0);
    assert_eq!(
        coord.get_computed_blocks(&prompt, None).num_computed_tokens,
        0
    );
    coord.check_invariants().unwrap();
}
