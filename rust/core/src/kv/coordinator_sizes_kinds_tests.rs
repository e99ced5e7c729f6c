//! Mamba `align` and chunked local attention groups beside groups of different block sizes
//! (`coordinator_sizes::unserved_beside_sizes`): hand-checked numbers against vLLM 0.33's
//! `MambaManager` and `ChunkedLocalAttentionManager` under `HybridKVCacheCoordinator`.

use crate::kv::layer_groups::find_longest_cache_hit;
use crate::kv::{BlockId, KvCoordinator, KvGroupSpec, NULL_BLOCK, TokenId};

const FULL: KvGroupSpec = KvGroupSpec::FullAttention;
const ALIGN: KvGroupSpec = KvGroupSpec::MAMBA_ALIGN;

fn chunked(tokens: usize) -> KvGroupSpec {
    KvGroupSpec::ChunkedLocalAttention {
        attention_chunk_size: tokens,
    }
}

fn tables(coord: &KvCoordinator<u64>, id: u64) -> Vec<Vec<BlockId>> {
    let tables = coord.block_ids(&id).unwrap();
    tables.iter().map(|t| t.to_vec()).collect()
}

/// Full attention in blocks of 8 beside a Mamba `align` group in blocks of 4, hashed every
/// 4 tokens: the scheduler block size (where hits land) is 8.
fn fa8_align4(caching: bool) -> KvCoordinator<u64> {
    let mut coord = KvCoordinator::new(vec![FULL, ALIGN], 40, 4, caching).unwrap();
    coord.set_group_block_sizes(&[8, 4]).unwrap();
    coord
}

/// vLLM's `MambaManager.find_longest_cache_hit` with `alignment_tokens` above its block
/// size: right to left, a cached state off the alignment is passed over (states after 4, 8
/// and 12 tokens cached in blocks of 4, alignment 8: the one after 8 wins, not 12).
#[test]
fn a_mamba_state_off_the_scheduler_grid_is_passed_over() {
    let cached = |i: usize| (i < 3).then(|| vec![i as BlockId + 1]);
    let hit = find_longest_cache_hit(ALIGN, 1, 4, 8, 4, 16, false, cached);
    assert_eq!((hit.num_tokens, hit.blocks), (8, vec![vec![NULL_BLOCK, 2]]));
    // Only the state after 4 tokens: none on the grid, no hit.
    let hit = find_longest_cache_hit(ALIGN, 1, 4, 8, 4, 16, false, |i| (i == 0).then(|| vec![1]));
    assert_eq!(hit.num_tokens, 0);
}

/// The Mamba group holds a slot per block of its own size (`cdiv(12, 4)` = 3, the state in
/// the last), full attention a block per 8 tokens.
#[test]
fn a_mamba_align_group_takes_slots_of_its_own_size() {
    let mut coord = fa8_align4(true);
    let tokens: Vec<TokenId> = (0..12).collect();
    let new = coord.allocate_slots(&1, &tokens, 12, 0, None, None);
    assert_eq!(
        new.unwrap().unwrap(),
        [vec![1, 2], vec![NULL_BLOCK, NULL_BLOCK, 3]]
    );
    coord.check_invariants().unwrap();
}

/// A prompt prefilled 4, 8 and 4 tokens a step caches the states after 4, 12 and 16 tokens
/// (every non-null Mamba block below the scheduler block boundary) and full attention's
/// two blocks. A second prompt sharing its first 12 tokens hits full attention's first
/// block (8 tokens), but no Mamba state on the grid of 8 within them (the one after 4 is
/// off it): no hit, as vLLM's coordinator answers. Taking the state after 4 would hit 4
/// tokens, off the scheduler block size.
#[test]
fn a_hit_needs_a_mamba_state_on_the_scheduler_grid() {
    let mut coord = fa8_align4(true);
    let prompt: Vec<TokenId> = (0..16).collect();
    for (step, n) in [4, 8, 4].into_iter().enumerate() {
        let given = if step == 0 { &prompt[..] } else { &[][..] };
        coord
            .allocate_slots(&1, given, n, 0, None, None)
            .unwrap()
            .unwrap();
        coord.check_invariants().unwrap();
    }
    assert_eq!(
        tables(&coord, 1)[1][1],
        NULL_BLOCK,
        "no state after 8 tokens"
    );
    coord.free(&1).unwrap();
    coord.new_step_starts();
    let other: Vec<TokenId> = (0..12).chain(100..105).collect();
    let (_, lengths) = coord.find_longest_cache_hit_per_group(&other, None, 16);
    assert_eq!(lengths, [8, 0]);
    assert_eq!(
        coord.get_computed_blocks(&other, None).num_computed_tokens,
        0
    );
    // The whole prompt again: the state after 16 tokens, on the grid.
    let again: Vec<TokenId> = (0..17).collect();
    assert_eq!(
        coord.get_computed_blocks(&again, None).num_computed_tokens,
        16
    );
}

/// Chunked local attention (chunks of 8) in blocks of 4 beside full attention in blocks of
/// 8, without prefix caching: each group takes blocks of its own size, and the blocks before
/// the current chunk are freed (vLLM's `get_num_skipped_tokens`: 12 computed, 8 skipped),
/// uncached, to the front of the free queue, last first: the new block is the freed 4.
#[test]
fn a_chunked_group_frees_blocks_of_its_own_size_before_the_chunk() {
    let mut coord = KvCoordinator::new(vec![FULL, chunked(8)], 40, 4, false).unwrap();
    coord.set_group_block_sizes(&[8, 4]).unwrap();
    let tokens: Vec<TokenId> = (0..12).collect();
    let new = coord.allocate_slots(&1, &tokens, 12, 0, None, None);
    assert_eq!(new.unwrap().unwrap(), [vec![1, 2], vec![3, 4, 5]]);
    coord
        .allocate_slots(&1, &[12], 1, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(
        tables(&coord, 1),
        [vec![1, 2], vec![NULL_BLOCK, NULL_BLOCK, 5, 4]]
    );
    coord.check_invariants().unwrap();
}

/// What vLLM 0.33 cannot serve beside differing sizes, or the core does not model, is
/// refused by name: chunked local attention off the scheduler block size under prefix
/// caching (vLLM asserts at its first lookup), a Mamba state larger than the hash block
/// under prefix caching (partial hash hits, copy-on-write), a Mamba prefill checkpoint
/// block. Served: the same chunked group on the scheduler block size or uncached, the
/// larger Mamba state uncached or beside a window that keeps partial hits off.
#[test]
fn unserved_kinds_beside_differing_sizes_are_refused_by_name() {
    let refused = |groups: Vec<KvGroupSpec>, sizes: &[usize], caching: bool| {
        let mut coord = KvCoordinator::<u64>::new(groups, 40, 4, caching).unwrap();
        let err = coord.set_group_block_sizes(sizes).unwrap_err().to_string();
        assert!(err.contains("groups[1]"), "{err}");
        err
    };
    let err = refused(vec![FULL, chunked(16)], &[8, 4], true);
    assert!(err.contains("scheduler block size"), "{err}");
    let err = refused(vec![FULL, ALIGN], &[4, 8], true);
    assert!(err.contains("partial hash hit"), "{err}");
    let checkpoint = KvGroupSpec::mamba(true, 0, 1, Some(1)).unwrap();
    let err = refused(vec![FULL, checkpoint], &[8, 4], false);
    assert!(err.contains("checkpoint"), "{err}");
    let served = |groups: Vec<KvGroupSpec>, sizes: &[usize], caching: bool| {
        let mut coord = KvCoordinator::<u64>::new(groups, 40, 4, caching).unwrap();
        coord.set_group_block_sizes(sizes).unwrap();
    };
    served(vec![FULL, chunked(16)], &[4, 8], true);
    served(vec![FULL, chunked(16)], &[8, 4], false);
    served(vec![FULL, ALIGN], &[4, 8], false);
    let window = KvGroupSpec::SlidingWindow { sliding_window: 16 };
    served(vec![FULL, window, ALIGN], &[4, 8, 8], true);
}
