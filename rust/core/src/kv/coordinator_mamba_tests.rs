//! Mamba `align` groups (vLLM 0.33's `MambaManager`, `mamba_cache_mode="align"`) beside full
//! attention: one state block per allocation at the chunk's last block, null gaps between,
//! the state a step copied from freed at the next allocation, every boundary's state cached;
//! per-group hits, and the local hit beside a connector that restores lagging states.

use super::*;

const FULL: KvGroupSpec = KvGroupSpec::FullAttention;
const ALIGN: KvGroupSpec = KvGroupSpec::MAMBA_ALIGN;

fn tables(coord: &KvCoordinator<u64>, id: u64) -> Vec<Vec<BlockId>> {
    let tables = coord.block_ids(&id).unwrap();
    tables.iter().map(|t| t.to_vec()).collect()
}

/// vLLM's `_seed_hybrid_prefix`: a 64-token prompt prefilled 16 tokens a step over blocks
/// of 16, then freed. Returns each step's full-attention table and Mamba state block.
fn seed(coord: &mut KvCoordinator<u64>) -> (Vec<BlockId>, Vec<BlockId>) {
    let prompt: Vec<TokenId> = (0..64).collect();
    let mut mamba = Vec::new();
    for step in 0..4 {
        let given = if step == 0 { &prompt[..] } else { &[][..] };
        let new = coord.allocate_slots(&1, given, 16, 0, None, None).unwrap();
        let new = new.expect("fits");
        // One block per group and step; the Mamba table's last slot is the new state.
        assert_eq!((new[0].len(), new[1].len()), (1, 1));
        let t = tables(coord, 1);
        assert_eq!(t[1].len(), step + 1);
        assert_eq!(*t[1].last().unwrap(), new[1][0]);
        // Held: the new state and the one it is copied from (freed at the next step).
        let held = t[1].iter().filter(|&&b| b != NULL_BLOCK).count();
        assert_eq!(held, step.min(1) + 1, "step {step}: {:?}", t[1]);
        mamba.push(new[1][0]);
        coord.check_invariants().unwrap();
    }
    let fa = tables(coord, 1)[0].clone();
    coord.free(&1).unwrap();
    // The states computed, a later step may hit them (vLLM's `new_step_starts`).
    coord.new_step_starts();
    (fa, mamba)
}

fn replay(num_blocks: u32) -> Vec<TokenId> {
    (0..16 * num_blocks).collect()
}

#[test]
fn an_align_group_caches_the_state_at_every_block_boundary() {
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, ALIGN], 100, 16, true).unwrap();
    let (fa, mamba) = seed(&mut coord);
    assert_eq!(fa.len(), 4);
    let (blocks, lengths) = coord.find_longest_cache_hit_per_group(&replay(5), None, 79);
    assert_eq!(lengths, [64, 64]);
    // A state hit needs its last block only: nulls before it.
    assert_eq!(blocks[1], [NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, mamba[3]]);
    let hit = coord.get_computed_blocks(&replay(5), None);
    assert_eq!(hit.num_computed_tokens, 64);
}

#[test]
fn a_mamba_hit_deeper_than_full_attention_is_reconciled_to_the_common_boundary() {
    // vLLM's test_hybrid_per_group_hit_divergence_with_connector: the FA tail and the middle
    // states evicted; FA hits 2 blocks, Mamba 4 (block 3's state survives).
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, ALIGN], 100, 16, true).unwrap();
    let (fa, mamba) = seed(&mut coord);
    coord
        .evict_blocks(&[fa[2], fa[3], mamba[1], mamba[2]])
        .unwrap();
    let (_, lengths) = coord.find_longest_cache_hit_per_group(&replay(5), None, 79);
    assert_eq!(lengths, [32, 64]);
    // Mamba within FA's 32 tokens: block 1's state is gone, block 0's holds -> 16.
    let hit = coord.get_computed_blocks(&replay(5), None);
    assert_eq!(hit.num_computed_tokens, 16);
    assert_eq!(hit.block_ids, [vec![fa[0]], vec![mamba[0]]]);
    // Beside a capable connector: a group deeper than FA means FA's blocks were evicted,
    // so the reconciled hit, not diverged.
    let (hit, diverged) =
        coord.get_computed_blocks_for_connector(&replay(5), None, Vec::new(), usize::MAX);
    assert_eq!((hit.num_computed_tokens, diverged), (16, false));
    coord.check_invariants().unwrap();
}

#[test]
fn a_full_attention_hit_deeper_than_mamba_is_kept_beside_a_capable_connector() {
    // vLLM's test_hybrid_fa_deeper_hit_respects_connector_lookup_policy: every state but
    // block 0's evicted; FA hits 4 blocks, Mamba 1.
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, ALIGN], 100, 16, true).unwrap();
    let (fa, mamba) = seed(&mut coord);
    coord.evict_blocks(&mamba[1..]).unwrap();
    let (_, lengths) = coord.find_longest_cache_hit_per_group(&replay(6), None, 95);
    assert_eq!(lengths, [64, 16]);
    let (hit, diverged) =
        coord.get_computed_blocks_for_connector(&replay(6), None, Vec::new(), usize::MAX);
    assert_eq!((hit.num_computed_tokens, diverged), (64, true));
    assert_eq!(hit.block_ids, [fa.clone(), vec![mamba[0]]]);
    assert_eq!(
        coord
            .get_computed_blocks(&replay(6), None)
            .num_computed_tokens,
        16
    );
    // Adopted with 16 loaded tokens: 80 computed, so the Mamba group skips every earlier
    // state (79 / 16 = 4 nulls), takes one for the loaded boundary and one for the chunk.
    let alloc = ExternalAllocation {
        num_external_tokens: 16,
        num_new_tokens: 15,
        cache: true,
        ..ExternalAllocation::default()
    };
    let new = coord.allocate_slots_external(&2, &replay(6), Some(&hit), None, alloc);
    assert!(new.unwrap().is_some());
    let t = tables(&coord, 2);
    assert_eq!(t[0][..4], fa[..]);
    assert_eq!(t[1][..4], [NULL_BLOCK; 4]);
    assert_eq!(t[1].len(), 6);
    assert_eq!(coord.num_computed_tokens(&2), Some(95));
    coord.check_invariants().unwrap();
}

#[test]
fn a_state_hit_is_adopted_alone_and_freed_once_the_chunk_moves_past_it() {
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, ALIGN], 100, 16, true).unwrap();
    let (_, mamba) = seed(&mut coord);
    coord.evict_blocks(&mamba[1..]).unwrap();
    let tokens = replay(5);
    let hit = coord.get_computed_blocks(&tokens, None);
    assert_eq!(hit.num_computed_tokens, 16);
    // FA: 4 new blocks and its free hit block; Mamba: one new state block (vLLM's
    // `physical_block_cap`), not 4, and its free hit block.
    assert_eq!(
        coord.blocks_to_allocate(&2, 80, Some(&hit), 0, None),
        4 + 1 + 1 + 1
    );
    coord
        .allocate_slots(&2, &tokens, 64, 0, Some(&hit), None)
        .unwrap()
        .unwrap();
    let t = tables(&coord, 2);
    assert_eq!(t[1][0], mamba[0]);
    assert_eq!(t[1][1..4], [NULL_BLOCK; 3]);
    assert_ne!(t[1][4], NULL_BLOCK);
    // The next allocation (80 computed) frees the hit's state, which it held alone: only
    // block 4's is needed.
    assert_eq!(coord.num_skipped_blocks(&2, 80), (1, 1));
    coord.allocate_slots(&2, &[7], 1, 0, None, None).unwrap();
    let t = tables(&coord, 2);
    assert_eq!(t[1][..4], [NULL_BLOCK; 4]);
    assert_eq!(t[1].len(), 6);
    coord.check_invariants().unwrap();
}

#[test]
fn a_state_cached_in_this_step_is_not_hit_until_the_next() {
    // vLLM's `cached_blocks_this_step`: request 1 caches its state at 32 in this step; an
    // admission hitting it does not fit until `new_step_starts`.
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, ALIGN], 100, 16, true).unwrap();
    let tokens: Vec<TokenId> = (0..48).collect();
    coord
        .allocate_slots(&1, &tokens[..33], 32, 0, None, None)
        .unwrap();
    let hit = coord.get_computed_blocks(&tokens, None);
    assert_eq!(hit.num_computed_tokens, 32);
    assert!(!coord.full_sequence_fits(&2, 48, Some(&hit), 0, 0));
    let new = coord
        .allocate_slots(&2, &tokens, 16, 0, Some(&hit), None)
        .unwrap();
    assert!(new.is_none());
    coord.new_step_starts();
    let new = coord
        .allocate_slots(&2, &tokens, 16, 0, Some(&hit), None)
        .unwrap();
    assert!(new.is_some());
    coord.check_invariants().unwrap();
}

#[test]
fn lookahead_slots_take_no_state_block() {
    // vLLM sizes an align group by the main model's tokens (`num_tokens_main_model`).
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, ALIGN], 100, 16, true).unwrap();
    let tokens: Vec<TokenId> = (0..16).collect();
    let new = coord
        .allocate_slots(&1, &tokens, 16, 3, None, None)
        .unwrap();
    let new = new.unwrap();
    assert_eq!((new[0].len(), new[1].len()), (2, 1));
}

#[test]
fn evicting_a_block_past_the_pool_is_refused() {
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, ALIGN], 10, 16, true).unwrap();
    let err = coord.evict_blocks(&[3, 10]).unwrap_err();
    assert!(err.to_string().contains("block_ids"), "{err}");
    coord.evict_blocks(&[NULL_BLOCK]).unwrap();
}
