//! EAGLE's drop and hash look-ahead beside groups of different block sizes
//! (`coordinator_sizes_tail`): hand-checked numbers, and a property test over random
//! streams.

use crate::kv::{BlockId, KvCoordinator, KvGroupSpec, TokenId};
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

/// Full attention in blocks of 8, a window of 8 in blocks of 4, hashed every 4 tokens:
/// the scheduler block size is 8.
fn gemma_like() -> KvCoordinator<u64> {
    let mut coord = KvCoordinator::new(vec![FULL, window(8)], 20, 4, true).unwrap();
    coord.set_group_block_sizes(&[8, 4]).unwrap();
    coord
}

/// Blocks 7..=19, untouched by one request of 13 tokens (blocks 1-6).
fn untouched() -> Vec<BlockId> {
    (7..20).collect()
}

/// A 13-token prompt under the drop. Full attention (blocks 1, 2) caches min(13, 8 + 8) =
/// 13 tokens: block 1; the window (blocks 3-6) min(13, 8 + 4) = 12: blocks 3, 4, 5 (a
/// window of 8 needs 2 + 1 blocks, which covers every block of a segment of 2). The
/// prompt's last hash boundary, 12, ends inside block 2: its partial entry is the 5th
/// cached block, and it is freed as cached, to the back (vLLM's `_cache_partial_tail_block`
/// then `free_blocks`).
#[test]
fn the_drop_caches_a_block_past_the_boundary_and_the_prompts_tail_block() {
    let mut coord = gemma_like();
    coord.set_eagle_block_drop(true).unwrap();
    let new = coord.allocate_slots(&1, &tokens(0..13), 13, 0, None, None);
    assert_eq!(new.unwrap().unwrap(), [vec![1, 2], vec![3, 4, 5, 6]]);
    assert_eq!(coord.num_cached_blocks_of(&1).unwrap(), [1, 3]);
    assert_eq!(coord.num_cached_blocks(), 5);
    assert!(coord.block_hash(2).is_some() && coord.block_hash(6).is_none());
    coord.check_invariants().unwrap();
    coord.free(&1).unwrap();
    let mut expected = vec![6];
    expected.extend(untouched());
    expected.extend([2, 1, 5, 4, 3]);
    assert_eq!(coord.free_block_ids(), expected);
    coord.check_invariants().unwrap();
}

/// Without the drop or a look-ahead, no partial entry is kept (the same prompt caches
/// blocks 1, 3, 4) and block 2 is freed uncached, to the front.
#[test]
fn without_eagles_rules_the_tail_block_is_freed_uncached() {
    let mut coord = gemma_like();
    coord
        .allocate_slots(&1, &tokens(0..13), 13, 0, None, None)
        .unwrap();
    assert_eq!(coord.num_cached_blocks(), 3);
    coord.free(&1).unwrap();
    let mut expected = vec![6, 5, 2];
    expected.extend(untouched());
    expected.extend([1, 4, 3]);
    assert_eq!(coord.free_block_ids(), expected);
}

/// The partial entry leaves when its block is cached in full: 3 more tokens fill block 2,
/// which then caches its own key (one entry, not two).
#[test]
fn a_full_block_replaces_its_partial_entry() {
    let mut coord = gemma_like();
    coord.set_eagle_block_drop(true).unwrap();
    coord
        .allocate_slots(&1, &tokens(0..13), 13, 0, None, None)
        .unwrap();
    let partial = coord.block_hash(2).unwrap();
    coord
        .allocate_slots(&1, &tokens(13..16), 3, 0, None, None)
        .unwrap();
    assert_ne!(coord.block_hash(2), Some(partial));
    // Full attention: blocks 1, 2; the window: blocks 3-6.
    assert_eq!(coord.num_cached_blocks(), 6);
    coord.check_invariants().unwrap();
    // A longer prompt over those 16 tokens hits them both and drops one (16 - 8 = 8).
    coord.free(&1).unwrap();
    let hit = coord.get_computed_blocks(&tokens(0..21), None);
    assert_eq!(hit.num_computed_tokens, 8);
}

/// With a look-ahead of 1 a block's hash waits for the token after it. 16 tokens known
/// hash 3 blocks of 4 ((16 - 1) / 4): full attention caches block 1 only, and the prompt's
/// boundary 12 (of 13 tokens, less one: 12) is kept on block 2, which its hash has not yet
/// reached.
#[test]
fn a_lookahead_keeps_the_tail_block_its_hashes_have_not_reached() {
    let mut coord = gemma_like();
    coord.set_hash_lookahead(1).unwrap();
    coord.set_num_prompt_tokens(&1, 13);
    coord
        .allocate_slots(&1, &tokens(0..13), 13, 0, None, None)
        .unwrap();
    // 12 hashed tokens, 8 cacheable: the boundary lies past them, nothing partial yet.
    assert!(coord.block_hash(2).is_none());
    coord
        .allocate_slots(&1, &tokens(13..16), 3, 0, None, None)
        .unwrap();
    assert_eq!(coord.num_cached_blocks_of(&1).unwrap()[0], 1);
    assert!(coord.block_hash(2).is_some(), "partial entry at 12");
    coord.check_invariants().unwrap();
}

/// The boundary is the prompt's, not the tokens known when the request is first cached
/// (a preempted request resumes with its outputs): a 9-token prompt's boundary under the
/// drop is 8, a block boundary, so nothing is kept and block 2 is freed to the front.
#[test]
fn the_prompt_length_places_the_boundary() {
    let mut coord = gemma_like();
    coord.set_eagle_block_drop(true).unwrap();
    coord.set_num_prompt_tokens(&1, 9);
    coord
        .allocate_slots(&1, &tokens(0..13), 13, 0, None, None)
        .unwrap();
    assert!(coord.block_hash(2).is_none());
    assert_eq!(coord.num_cached_blocks(), 4);
}

/// vLLM's `reachable_block_mask` with `use_eagle`: a window of 4 in blocks of 4 beside
/// full attention in blocks of 16 caches, per segment of 4 blocks, the 1 + 1 blocks
/// before the boundary shifted one block on (blocks 3, 4 and 7 of 8 full ones), where
/// without the drop it caches block 3 and 7 only.
#[test]
fn the_drop_keeps_a_window_block_more_a_block_later() {
    for (drop, reached) in [(false, vec![3, 7]), (true, vec![3, 4, 7])] {
        let mut coord = KvCoordinator::<u64>::new(vec![FULL, window(4)], 40, 4, true).unwrap();
        coord.set_group_block_sizes(&[16, 4]).unwrap();
        coord.set_eagle_block_drop(drop).unwrap();
        coord
            .allocate_slots(&1, &tokens(0..33), 33, 0, None, None)
            .unwrap();
        let table = coord.group_block_ids(&1, 1).unwrap().to_vec();
        let cached: Vec<usize> = (0..table.len())
            .filter(|&i| coord.block_hash(table[i]).is_some())
            .collect();
        assert_eq!(cached, reached, "drop {drop}");
    }
}

/// The drop acts only in the groups flagged as EAGLE's (vLLM's manager's `use_eagle`, from
/// `drop_eagle_group_ids`): the window of the test above keeps no extra block when only
/// full attention is flagged, and the extra one when it is flagged itself.
#[test]
fn a_window_not_flagged_keeps_no_extra_block() {
    for (flags, reached) in [([true, false], vec![3, 7]), ([false, true], vec![3, 4, 7])] {
        let mut coord = KvCoordinator::<u64>::new(vec![FULL, window(4)], 40, 4, true).unwrap();
        coord.set_group_block_sizes(&[16, 4]).unwrap();
        coord.set_eagle_block_drop(true).unwrap();
        coord.set_eagle_groups(&flags).unwrap();
        coord
            .allocate_slots(&1, &tokens(0..33), 33, 0, None, None)
            .unwrap();
        let table = coord.group_block_ids(&1, 1).unwrap().to_vec();
        let cached: Vec<usize> = (0..table.len())
            .filter(|&i| coord.block_hash(table[i]).is_some())
            .collect();
        assert_eq!(cached, reached, "is_eagle_group {flags:?}");
        coord.check_invariants().unwrap();
    }
}

/// The 13-token prompt of the first test with only the window flagged: full attention does
/// not drop, so it caches its aligned 8 tokens (block 1) and keeps no partial entry (the
/// boundary, 13 less one rounded to 12, lies past them), while the window caches 12 tokens
/// (blocks 3, 4, 5). Block 2 is freed uncached, to the front.
#[test]
fn full_attention_not_flagged_keeps_no_tail_block() {
    let mut coord = gemma_like();
    coord.set_eagle_block_drop(true).unwrap();
    coord.set_eagle_groups(&[false, true]).unwrap();
    coord
        .allocate_slots(&1, &tokens(0..13), 13, 0, None, None)
        .unwrap();
    assert_eq!(coord.num_cached_blocks_of(&1).unwrap(), [1, 3]);
    assert_eq!(coord.num_cached_blocks(), 4);
    assert!(coord.block_hash(2).is_none());
    coord.free(&1).unwrap();
    let mut expected = vec![6, 2];
    expected.extend(untouched());
    expected.extend([1, 5, 4, 3]);
    assert_eq!(coord.free_block_ids(), expected);
    coord.check_invariants().unwrap();
}

#[test]
fn the_rules_are_served_beside_differing_sizes_in_either_order() {
    let mut coord = gemma_like();
    coord.set_eagle_block_drop(true).unwrap();
    coord.set_eagle_block_drop(false).unwrap();
    coord.set_hash_lookahead(2).unwrap();
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, window(8)], 20, 4, true).unwrap();
    coord.set_eagle_block_drop(true).unwrap();
    coord.set_group_block_sizes(&[8, 4]).unwrap();
    assert!(coord.eagle_block_drop());
}

#[derive(Debug, Clone)]
enum Op {
    Admit { id: u64, prefix: u8, len: u8 },
    Step { id: u64, len: u8 },
    Free { id: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..5u64, 0..3u8, 1..50u8).prop_map(|(id, prefix, len)| Op::Admit { id, prefix, len }),
        (0..5u64, 1..10u8).prop_map(|(id, len)| Op::Step { id, len }),
        (0..5u64).prop_map(|id| Op::Free { id }),
    ]
}

proptest! {
    /// Random streams under the drop (in random `is_eagle_group` flags) or a look-ahead
    /// over full attention and windows of 1, 2 or 4 hash blocks a block: memory and the
    /// cache map's count are conserved, and every hit lands on the scheduler block size.
    #[test]
    fn random_streams_under_eagles_rules_keep_invariants(
        ops in prop::collection::vec(op(), 1..50),
        w in 1..20usize,
        scales in prop::collection::vec(prop::sample::select(vec![1usize, 2, 4]), 3),
        lookahead in 0..3usize,
        flags in prop::collection::vec(any::<bool>(), 3),
    ) {
        let mut coord = KvCoordinator::new(vec![FULL, window(w), FULL], 60, 2, true).unwrap();
        let sizes: Vec<usize> = scales.iter().map(|s| s * 2).collect();
        coord.set_group_block_sizes(&sizes).unwrap();
        match lookahead {
            0 => {
                coord.set_eagle_block_drop(true).unwrap();
                coord.set_eagle_groups(&flags).unwrap();
            }
            n => coord.set_hash_lookahead(n).unwrap(),
        }
        let align = coord.scheduler_block_size();
        let mut next_token = 1000u32;
        for op in ops {
            match op {
                Op::Admit { id, prefix, len } => {
                    if coord.block_ids(&id).is_some() { continue; }
                    let prompt: Vec<TokenId> =
                        (0..len as u32).map(|t| t + 100 * prefix as u32).collect();
                    coord.set_num_prompt_tokens(&id, prompt.len());
                    let hit = coord.get_computed_blocks(&prompt, None);
                    prop_assert_eq!(hit.num_computed_tokens % align, 0);
                    let n = prompt.len() - hit.num_computed_tokens;
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
        }
    }
}
