//! The fine-grained partial-hit rules against vLLM 0.33's own cases
//! (tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py), each cache stated as
//! "hash block i is cached in block b".

use rustc_hash::FxHashMap;

use super::*;

/// A lookup over `cached`: (hash block index, block).
fn cache(cached: &[(usize, BlockId)]) -> impl FnMut(usize) -> Option<BlockId> + '_ {
    let map: FxHashMap<usize, BlockId> = cached.iter().copied().collect();
    move |i| map.get(&i).copied()
}

const FULL: KvGroupSpec = KvGroupSpec::FullAttention;
const MAMBA: KvGroupSpec = KvGroupSpec::MAMBA_ALIGN;

#[test]
fn the_rule_is_on_only_with_a_mamba_block_above_the_hash_block() {
    assert!(partial_hash_hits_enabled(&[FULL, MAMBA], &[16, 16], 4));
    assert!(partial_hash_hits_enabled(&[FULL, MAMBA], &[4, 16], 4));
    // A Mamba block equal to the hash block: vLLM hashes as before.
    assert!(!partial_hash_hits_enabled(&[FULL, MAMBA], &[16, 16], 16));
    assert!(!partial_hash_hits_enabled(&[FULL, FULL], &[16, 16], 4));
    // test_hybrid_sliding_window_group_disables_partial_hash_hits: a window group whose
    // block is not the hash block has no fine-grained lookup.
    let window = KvGroupSpec::SlidingWindow { sliding_window: 64 };
    assert!(!partial_hash_hits_enabled(
        &[FULL, window, MAMBA],
        &[16, 16, 16],
        4
    ));
    assert!(partial_hash_hits_enabled(
        &[FULL, window, MAMBA],
        &[16, 4, 16],
        4
    ));
    // A group that caches nothing does not count (test_opted_out_scratch_group_...).
    assert!(partial_hash_hits_enabled(
        &[FULL, KvGroupSpec::MAMBA, MAMBA],
        &[16, 16, 16],
        4
    ));
}

#[test]
fn mamba_hits_the_highest_cached_hash_boundary_with_nulls_before() {
    // test_hybrid_mamba_align_partial_hash_hit: hash 2, Mamba block 4, a state cached at
    // 6 tokens (hash block 2) in block 9: the hit is 6 tokens, [null, 9].
    let hit = find_fine_grained_hit(true, 4, 2, 4, 7, false, cache(&[(2, 9)]));
    assert_eq!(
        hit,
        FineHit {
            blocks: vec![NULL_BLOCK, 9],
            num_tokens: 6
        }
    );
    // Right to left: a later boundary wins over an earlier one; `max_length` caps it.
    let cached = [(1, 3), (2, 9), (5, 11)];
    let hit = find_fine_grained_hit(true, 4, 2, 8, 16, false, cache(&cached));
    assert_eq!(
        (hit.blocks, hit.num_tokens),
        (vec![NULL_BLOCK, NULL_BLOCK, 11], 12)
    );
    let hit = find_fine_grained_hit(true, 4, 2, 8, 11, false, cache(&cached));
    assert_eq!((hit.blocks, hit.num_tokens), (vec![NULL_BLOCK, 9], 6));
    // Nothing cached: no hit, no blocks.
    let hit = find_fine_grained_hit(true, 4, 2, 8, 16, false, cache(&[]));
    assert_eq!((hit.blocks.len(), hit.num_tokens), (0, 0));
}

#[test]
fn full_attention_extends_its_run_into_one_partial_block() {
    // test_hybrid_partial_hash_truncates_full_attention_hit_length: hash 2, block 4, two
    // full blocks (keyed by hash blocks 1 and 3) and a partial entry at 10 tokens (hash
    // block 4): the group's own hit is 10 tokens over 3 blocks.
    let cached = [(1, 5), (3, 6), (4, 7)];
    let hit = find_fine_grained_hit(false, 4, 2, 6, 12, false, cache(&cached));
    assert_eq!((hit.blocks.clone(), hit.num_tokens), (vec![5, 6, 7], 10));
    // With the Mamba state cached at 6 tokens, the simple hybrid's one pass: Mamba capped
    // by the full-attention hit, full attention trimmed to the agreed hit (vLLM: [2, 2]).
    let mamba = find_fine_grained_hit(true, 4, 2, 6, hit.num_tokens, false, cache(&[(2, 8)]));
    assert_eq!(mamba.num_tokens, 6);
    let full_blocks = &hit.blocks[..mamba.num_tokens.div_ceil(4)];
    assert_eq!((full_blocks.len(), mamba.blocks.len()), (2, 2));
    // A hole ends the run: the partial probe looks only inside the next block.
    let hit = find_fine_grained_hit(false, 4, 2, 6, 12, false, cache(&[(1, 5), (4, 7)]));
    assert_eq!((hit.blocks, hit.num_tokens), (vec![5], 4));
}

#[test]
fn eagle_drops_one_hash_block_from_a_full_attention_hit() {
    // test_full_attention_eagle_drops_one_hash_unit: hash 2, block 4, 8 tokens.
    let two_full = [(1, 1), (3, 2)];
    let hit = find_fine_grained_hit(false, 4, 2, 4, 8, false, cache(&two_full));
    assert_eq!((hit.num_tokens, hit.blocks.len()), (8, 2));
    let hit = find_fine_grained_hit(false, 4, 2, 4, 8, true, cache(&two_full));
    assert_eq!((hit.num_tokens, hit.blocks.len()), (6, 2));
    // A full block and a partial tail at 6: the drop lands on the block boundary.
    let tail = [(1, 1), (2, 2)];
    let hit = find_fine_grained_hit(false, 4, 2, 4, 8, false, cache(&tail));
    assert_eq!((hit.num_tokens, hit.blocks.len()), (6, 2));
    let hit = find_fine_grained_hit(false, 4, 2, 4, 8, true, cache(&tail));
    assert_eq!((hit.num_tokens, hit.blocks.len()), (4, 1));
}

#[test]
fn a_hit_inside_a_block_names_the_block_to_copy() {
    assert_eq!(partial_local_hit(&[NULL_BLOCK, 9], 6, 4), Some((1, 9)));
    assert_eq!(partial_local_hit(&[5, 6], 8, 4), None);
    assert_eq!(partial_local_hit(&[], 6, 4), None);
}

#[test]
fn the_internal_checkpoint_reads_both_sizes() {
    // Hash 4, Mamba block 16: a chunk [16, 60) with the checkpoint at 52, alignment 4.
    assert!(mamba_checkpoint_valid_on(16, 60, 52, 4, 16, 4));
    // A start off the hash grid, or the checkpoint less than a hash block in.
    assert!(!mamba_checkpoint_valid_on(18, 60, 52, 4, 16, 2));
    assert!(!mamba_checkpoint_valid_on(16, 60, 18, 4, 16, 2));
    // The checkpoint's column must lie past the chunk's initial state.
    assert!(!mamba_checkpoint_valid_on(16, 30, 24, 4, 16, 4));
    // With equal sizes it is the block-grid rule the core already has.
    for (s, e, c, a) in [(16, 60, 48, 16), (0, 50, 32, 8), (32, 40, 36, 4)] {
        let plain = crate::kv::mamba_checkpoint_valid(s, e, c, 16, a);
        assert_eq!(mamba_checkpoint_valid_on(s, e, c, 16, 16, a), plain);
    }
}
