use super::*;
use crate::kv::KvCapacity;
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

/// `num_new_tokens` more tokens for request `id` (no hit, no lookahead), which must fit:
/// each group's new blocks.
fn allocate(
    coord: &mut KvCoordinator<u64>,
    id: u64,
    token_ids: &[TokenId],
    num_new_tokens: usize,
) -> Vec<Vec<BlockId>> {
    let new = coord.allocate_slots(&id, token_ids, num_new_tokens, 0, None, None);
    new.unwrap().expect("the blocks fit")
}

/// Full attention + window 8 over 9 blocks of 4 tokens, request 1 after a 12-token prompt
/// and one decode step: tables [1, 2, 3, 7] and [0, 5, 6, 8].
fn window_8_after_one_decode() -> KvCoordinator<u64> {
    let mut coord = KvCoordinator::new(vec![FULL, window(8)], 9, 4, true).unwrap();
    allocate(&mut coord, 1, &tokens(0..12), 12);
    allocate(&mut coord, 1, &[100], 1);
    coord
}

fn tables(coord: &KvCoordinator<u64>, id: u64) -> Vec<Vec<BlockId>> {
    let tables = coord.block_ids(&id).unwrap();
    tables.iter().map(|t| t.to_vec()).collect()
}

/// vLLM 0.33's processed-token basis: with the 80-token prefill still in flight the
/// decode's allocation frees nothing (80 - 80 = 0 processed); once it landed, the next
/// allocation (81 computed, 1 in flight) frees blocks 0-2 as a synchronous one would.
#[test]
fn window_group_keeps_blocks_a_step_in_flight_still_reads() {
    let mut coord = KvCoordinator::new(vec![FULL, window(32)], 16, 16, true).unwrap();
    allocate(&mut coord, 1, &tokens(0..80), 80);
    let free = coord.num_free_blocks();
    let new = coord.allocate_slots_in_flight(&1, &[], 1, 0, None, None, 80, 0);
    assert_eq!(new.unwrap().unwrap(), [vec![11], vec![12]]);
    assert_eq!(tables(&coord, 1)[1], [6, 7, 8, 9, 10, 12]);
    assert_eq!(coord.num_free_blocks(), free - 2);
    let new = coord.allocate_slots_in_flight(&1, &[80], 1, 0, None, None, 1, 0);
    assert_eq!(new.unwrap().unwrap(), [vec![], vec![]]);
    assert_eq!(tables(&coord, 1)[1], [0, 0, 0, 9, 10, 12]);
    assert_eq!(coord.num_free_blocks(), free - 2 + 3);
    coord.check_invariants().unwrap();
}

/// Window 32, block 16: once 80 tokens are computed, the next step holds window blocks for
/// tokens 48.. only; the first three are the null block, and they went back to the pool.
#[test]
fn window_group_frees_blocks_that_left_the_window() {
    let mut coord = KvCoordinator::new(vec![FULL, window(32)], 16, 16, true).unwrap();
    let prompt = tokens(0..80);
    let new = allocate(&mut coord, 1, &prompt, 80);
    assert_eq!(new, [vec![1, 2, 3, 4, 5], vec![6, 7, 8, 9, 10]]);
    // Decode: 80 computed, so the next token attends to tokens 49..80; blocks 0-2 (tokens
    // 0..48) are skipped. Freed last first; cached blocks go to the back of the queue.
    allocate(&mut coord, 1, &[80], 1);
    assert_eq!(
        tables(&coord, 1),
        [vec![1, 2, 3, 4, 5, 11], vec![0, 0, 0, 9, 10, 12]]
    );
    assert_eq!(coord.free_block_ids(), [13, 14, 15, 8, 7, 6]);
    assert_eq!(coord.num_free_blocks(), 6);
    coord.check_invariants().unwrap();
}

/// vLLM 0.33's `extra_retained_tokens`: with 17 more tokens kept below the window, the
/// decode after an 80-token prompt skips max(0, 80 - 32 + 1 - 17) = 32 tokens, two blocks
/// (three without); the admission cap counts them too.
#[test]
fn a_window_retaining_extra_tokens_frees_its_blocks_later() {
    let mut coord = KvCoordinator::new(vec![FULL, window(32)], 16, 16, true).unwrap();
    coord.set_window_extra_retained_tokens(17).unwrap();
    allocate(&mut coord, 1, &tokens(0..80), 80);
    allocate(&mut coord, 1, &[80], 1);
    assert_eq!(tables(&coord, 1)[1], [0, 0, 8, 9, 10, 12]);
    assert_eq!(coord.free_block_ids(), [13, 14, 15, 7, 6]);
    assert_eq!(
        window(32).max_admission_blocks_retaining(64, 16, 17),
        Some(8)
    ); // 7 without
    assert_eq!(FULL.max_admission_blocks_retaining(64, 16, 17), None);
    // Changed only while no request holds blocks, and only beside a window group.
    let err = coord.set_window_extra_retained_tokens(3).unwrap_err();
    assert!(err.to_string().contains("extra_retained_tokens"), "{err}");
    let mut full = KvCoordinator::<u64>::new(vec![FULL, FULL], 16, 16, true).unwrap();
    assert!(full.set_window_extra_retained_tokens(3).is_err());
    coord.check_invariants().unwrap();
}

/// vLLM frees group by group: each group's uncached blocks go to the front in turn, so
/// the later group's are reused first; cached blocks go to the back, tail first.
#[test]
fn free_goes_group_by_group_tail_first() {
    let mut coord = window_8_after_one_decode();
    assert_eq!(tables(&coord, 1), [vec![1, 2, 3, 7], vec![0, 5, 6, 8]]);
    assert_eq!(coord.free_block_ids(), [4]);
    coord.free(&1).unwrap();
    assert_eq!(coord.free_block_ids(), [8, 7, 4, 3, 2, 1, 6, 5]);
    coord.check_invariants().unwrap();
}

/// The window group needs only the blocks of its window before the hit's end: the hit
/// is the full-attention one, with nulls where the window does not reach.
#[test]
fn hit_is_agreed_across_groups() {
    let mut coord = window_8_after_one_decode();
    coord.free(&1).unwrap();
    let prompt: Vec<TokenId> = (0..12).chain(200..204).collect();
    let hit = coord.get_computed_blocks(&prompt, None);
    assert_eq!(hit.num_computed_tokens, 12);
    assert_eq!(hit.block_ids, [vec![1, 2, 3], vec![0, 5, 6]]);
    let new = coord
        .allocate_slots(&2u64, &prompt, 4, 0, Some(&hit), None)
        .unwrap()
        .unwrap();
    // 16 slots: one more block each; the window's first block is skipped at 12 tokens.
    assert_eq!(new, [vec![8], vec![7]]);
    assert_eq!(tables(&coord, 2), [vec![1, 2, 3, 8], vec![0, 5, 6, 7]]);
    coord.check_invariants().unwrap();

    // Evict the window group's block of tokens 0..4 and the full group's of 8..12: full
    // attention now serves 8 tokens, but the window cannot (position 8 needs tokens 1..8).
    coord.free(&2).unwrap();
    allocate(&mut coord, 3, &tokens(300..309), 9);
    let hit = coord.get_computed_blocks(&prompt, None);
    assert_eq!(hit.num_computed_tokens, 0);
    coord.check_invariants().unwrap();
}

#[test]
fn window_hit_needs_only_the_window_before_its_end() {
    // Window 5, block 4: a hit needs one block before its end, so 12 tokens hit with the
    // block of tokens 8..12 alone, nulls before it.
    let mut coord = KvCoordinator::new(vec![window(5)], 5, 4, true).unwrap();
    for chunk in [0..4, 4..8, 8..12] {
        allocate(&mut coord, 1, &tokens(chunk), 4);
    }
    // Before the third chunk (8 computed) the block of tokens 0..4 left the window.
    assert_eq!(tables(&coord, 1), [vec![0, 2, 3]]);
    coord.free(&1).unwrap();
    let hit = coord.get_computed_blocks(&tokens(0..13), None);
    assert_eq!(
        (hit.block_ids[0].as_slice(), hit.num_computed_tokens),
        ([0, 0, 3].as_slice(), 12)
    );
    coord.check_invariants().unwrap();
}

#[test]
fn chunked_local_frees_previous_chunks_and_mamba_holds_one_block() {
    let local = KvGroupSpec::ChunkedLocalAttention {
        attention_chunk_size: 8,
    };
    let mut coord =
        KvCoordinator::new(vec![FULL, local, KvGroupSpec::MAMBA], 20, 4, false).unwrap();
    allocate(&mut coord, 1, &tokens(0..13), 13);
    assert_eq!(
        tables(&coord, 1),
        [vec![1, 2, 3, 4], vec![5, 6, 7, 8], vec![9]]
    );
    allocate(&mut coord, 1, &[13, 14, 15, 16], 4);
    // 13 computed: the chunk of token 13 starts at 8, so blocks 0 and 1 are skipped.
    // Uncached (caching is off), they go to the front of the queue and are reused first.
    assert_eq!(
        tables(&coord, 1),
        [vec![1, 2, 3, 4, 6], vec![0, 0, 7, 8, 5], vec![9]]
    );
    coord.check_invariants().unwrap();
}

#[test]
fn a_failed_allocation_keeps_only_the_skipped_blocks_freed() {
    let mut coord = KvCoordinator::new(vec![FULL, window(4)], 7, 4, false).unwrap();
    allocate(&mut coord, 1, &tokens(0..12), 12);
    assert_eq!(coord.num_free_blocks(), 0);
    // 12 computed + 8 new = 5 blocks a group: 2 + 2 new, but only the 2 skipped window
    // blocks are free.
    assert_eq!(
        coord.allocate_slots(&1u64, &tokens(12..20), 8, 0, None, None),
        Ok(None)
    );
    assert_eq!(tables(&coord, 1), [vec![1, 2, 3], vec![0, 0, 6]]);
    assert_eq!(coord.num_computed_tokens(&1), Some(12));
    assert_eq!(coord.num_free_blocks(), 2);
    coord.check_invariants().unwrap();
}

#[test]
fn errors_change_nothing() {
    let mut coord = KvCoordinator::new(vec![FULL, window(8)], 9, 4, true).unwrap();
    allocate(&mut coord, 1, &tokens(0..9), 9);
    let before = (tables(&coord, 1), coord.free_block_ids());
    let hit = coord.get_computed_blocks(&tokens(0..9), None);
    assert!(coord.allocate_slots(&1u64, &[], 0, 0, None, None).is_err());
    assert!(
        coord
            .allocate_slots(&1u64, &[], 1, 0, Some(&hit), None)
            .is_err()
    );
    assert!(
        coord
            .allocate_slots(&2u64, &tokens(0..5), 1, 0, Some(&hit), None)
            .is_err()
    );
    assert!(coord.free(&7).is_err());
    assert_eq!((tables(&coord, 1), coord.free_block_ids()), before);
    assert!(KvCoordinator::<u64>::new(vec![KvGroupSpec::MAMBA], 9, 4, true).is_err());
    assert!(KvCoordinator::<u64>::new(vec![window(0)], 9, 4, false).is_err());
    assert!(KvCoordinator::<u64>::new(vec![], 9, 4, false).is_err());
    assert!(KvCoordinator::<u64>::new(vec![FULL], 1, 4, false).is_err());
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
        lookahead: u8,
    },
    Free {
        id: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6u64, 0..3u8, 1..40u8, 1..40u8).prop_map(|(id, prefix, len, chunk)| Op::Admit {
            id,
            prefix,
            len,
            chunk
        }),
        (0..6u64, 1..12u8, 0..3u8).prop_map(|(id, len, lookahead)| Op::Step { id, len, lookahead }),
        (0..6u64).prop_map(|id| Op::Free { id }),
    ]
}

proptest! {
    #[test]
    fn random_streams_keep_invariants_and_window_bounds(
        ops in prop::collection::vec(op(), 1..60),
        w in 1..20usize,
        bs in 1..6usize,
        chunk_size in 1..20usize,
    ) {
        let groups = vec![
            FULL,
            window(w),
            KvGroupSpec::ChunkedLocalAttention { attention_chunk_size: chunk_size },
            window(w),
        ];
        let mut coord = KvCoordinator::new(groups.clone(), 40, bs, true).unwrap();
        let mut next_token = 1000u32;
        // Per request, the end of its slots (computed + new + lookahead, at most).
        let mut slots_end = std::collections::HashMap::new();
        for op in ops {
            let added = match op {
                Op::Admit { id, prefix, len, chunk } => {
                    if coord.block_ids(&id).is_some() { continue; }
                    let prompt: Vec<TokenId> =
                        (0..len as u32).map(|t| t + 100 * prefix as u32).collect();
                    let hit = coord.get_computed_blocks(&prompt, None);
                    let n = (prompt.len() - hit.num_computed_tokens).min(chunk as usize);
                    let got = coord.allocate_slots(&id, &prompt, n, 0, Some(&hit), None).unwrap();
                    if got.is_some() {
                        slots_end.insert(id, hit.num_computed_tokens + n);
                    }
                    got.map(|_| (id, n))
                }
                Op::Step { id, len, lookahead } => {
                    if coord.block_ids(&id).is_none() { continue; }
                    let new: Vec<TokenId> = (0..len as u32).map(|t| next_token + t).collect();
                    next_token += len as u32;
                    let computed = coord.num_computed_tokens(&id).unwrap();
                    let got = coord
                        .allocate_slots(&id, &new, len as usize, lookahead as usize, None, None)
                        .unwrap();
                    got.map(|_| {
                        // Slots reserved by an earlier lookahead stay held.
                        let end = slots_end.get(&id).copied().unwrap_or(0);
                        let end = end.max(computed + len as usize + lookahead as usize);
                        slots_end.insert(id, end);
                        (id, end - computed)
                    })
                }
                Op::Free { id } => {
                    let _ = coord.free(&id);
                    slots_end.remove(&id);
                    None
                }
            };
            prop_assert_eq!(coord.check_invariants(), Ok(()));
            if let Some((id, num_added)) = added {
                for (spec, table) in groups.iter().zip(coord.block_ids(&id).unwrap()) {
                    let live = table.iter().filter(|&&b| b != NULL_BLOCK).count();
                    if let Some(bound) = spec.max_live_blocks(num_added, bs) {
                        prop_assert!(live <= bound, "{:?}: {} live > {}", spec, live, bound);
                    }
                }
            }
        }
    }
}

#[test]
fn the_full_sequence_gate_caps_a_window_group_at_its_admission_blocks() {
    // 17 blocks of 4 (16 usable). A 40-token request needs 10 full-attention blocks; its
    // window-8 group, with 4 tokens in flight, is capped at ceil((8 - 1 + 4) / 4) + 1 = 4:
    // 14 blocks fit, where uncapped it would need 20.
    let coord = KvCoordinator::<u64>::new(vec![FULL, window(8)], 17, 4, false).unwrap();
    assert!(coord.full_sequence_fits(&1, 40, None, 4, 0));
    assert_eq!(window(8).max_admission_blocks(4, 4), Some(4));
    // 56 tokens: 14 + 4 = 18 > 16.
    assert!(!coord.full_sequence_fits(&1, 56, None, 4, 0));
}

#[test]
fn rewinding_stops_at_cached_blocks_and_a_reset_needs_no_holders() {
    let mut coord = window_8_after_one_decode();
    // 13 computed tokens, 3 full blocks cached (12 tokens): one token may be rewound.
    assert!(coord.rewind_computed_tokens(&1, 2).is_err());
    coord.rewind_computed_tokens(&1, 1).unwrap();
    assert_eq!(coord.num_computed_tokens(&1), Some(12));
    assert_eq!(coord.num_tokens(&1), Some(13));
    assert!(!coord.reset_prefix_cache(), "a request holds blocks");
    coord.free(&1).unwrap();
    assert!(coord.num_cached_blocks() > 0);
    assert!(coord.reset_prefix_cache());
    assert_eq!(coord.num_cached_blocks(), 0);
    coord.check_invariants().unwrap();
}

#[test]
fn a_cross_attention_group_holds_blocks_for_its_encoder_tokens_only() {
    // vLLM's CrossAttentionManager: ceil(encoder tokens / block) blocks, allocated when
    // the encoder inputs are scheduled; later allocations (0 encoder tokens) keep them.
    let cross = KvGroupSpec::CrossAttention;
    assert!(KvCoordinator::<u64>::new(vec![FULL, cross], 40, 4, true).is_err());
    let mut coord = KvCoordinator::new(vec![FULL, cross], 40, 4, false).unwrap();
    let new = coord.allocate_slots_in_flight(&1, &tokens(0..6), 6, 0, None, None, 0, 17);
    let new = new.unwrap().unwrap();
    assert_eq!((new[0].len(), new[1].len()), (2, 5));
    assert_eq!(
        allocate(&mut coord, 1, &tokens(6..12), 6)[1],
        Vec::<BlockId>::new()
    );
    assert_eq!(
        tables(&coord, 1).iter().map(Vec::len).collect::<Vec<_>>(),
        [3, 5]
    );
    // A request without encoder input holds none; the gate counts encoder blocks.
    allocate(&mut coord, 2, &tokens(0..4), 4);
    assert!(tables(&coord, 2)[1].is_empty());
    let free = coord.num_free_blocks();
    assert!(coord.full_sequence_fits(&3, 4, None, 0, (free - 1) * 4));
    assert!(!coord.full_sequence_fits(&3, 4, None, 0, free * 4));
    coord.check_invariants().unwrap();
    coord.free(&1).unwrap();
    coord.free(&2).unwrap();
    assert_eq!(coord.num_free_blocks(), 39);
}

#[test]
fn blocks_to_allocate_counts_every_group_and_caps_windows_when_asked() {
    // 40 tokens in blocks of 4: 10 per group; a window of 8 with 4 tokens in flight is
    // capped at ceil((8 - 1 + 4) / 4) + 1 = 4 (vLLM's max_admission_blocks_per_request).
    let coord: KvCoordinator<u64> = KvCoordinator::new(vec![FULL, window(8)], 40, 4, true).unwrap();
    assert_eq!(coord.blocks_to_allocate(&1, 40, None, 0, None), 20);
    assert_eq!(coord.blocks_to_allocate(&1, 40, None, 0, Some(4)), 14);
    // 36 of them loaded: the window skips (36 + 1 - 8) / 4 = 7 blocks (vLLM's gate counts
    // loaded tokens as computed).
    assert_eq!(coord.blocks_to_allocate(&1, 36, None, 36, None), 9 + 2);
}

/// A block's `block_hash` is its group's key of the chained hash (`group_block_hash`), and
/// `cached_block` finds it by that hash and group: the key differs per group.
#[test]
fn a_cached_block_reports_its_hash_keyed_by_its_group() {
    let coord = window_8_after_one_decode();
    let mut hashes = Vec::new();
    crate::kv::hash_full_blocks(&mut hashes, &tokens(0..12), 4, None);
    for (group, table) in tables(&coord, 1).iter().enumerate() {
        for (i, &block) in table.iter().take(3).enumerate() {
            if block == NULL_BLOCK {
                continue;
            }
            let key = group_block_hash(hashes[i], group);
            assert_eq!(coord.block_hash(block), Some(key));
            assert_eq!(coord.cached_block(hashes[i], group), Some(block));
        }
    }
    assert_ne!(
        group_block_hash(hashes[0], 0),
        group_block_hash(hashes[0], 1)
    );
}
