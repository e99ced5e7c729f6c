//! The copy-on-write pieces on the stream vLLM 0.33's `KVCacheManager` runs (full
//! attention + Mamba `align`, blocks of 16 hashed at 4, 40 blocks; tests/kv_cow_reference.py
//! has the model checked against vLLM call by call): a 55-token prompt computed to 48,
//! 52 (its last hash boundary: partial entries in both groups) and 55 (the Mamba entry
//! moves, block 6 copied into 7), then a 75-token prompt sharing it hits 52 tokens inside
//! the fourth block and copies both shared blocks (5 into 8, 7 into 10). The block ids are
//! vLLM's on that stream.

use super::*;

const FA: usize = 0;
const MAMBA: usize = 1;
const BLOCK: usize = 16;
const HASH: usize = 4;

/// A free queue handing out 1, 2, 3, ... (the stream frees nothing before it is used).
fn pool() -> impl FnMut(usize) -> Vec<BlockId> {
    let mut next: BlockId = 1;
    move |n| {
        let taken = (next..next + n as BlockId).collect();
        next += n as BlockId;
        taken
    }
}

/// Keys: (group, prefix length) of the one conversation.
type Entries = PartialEntries<(usize, usize)>;

#[test]
fn vllms_stream_registers_moves_and_copies_the_shared_states() {
    let mut take = pool();
    let mut entries = Entries::default();
    let mut copies = CopyQueue::new(2);
    let (mut fa, mut mamba) = (Vec::new(), Vec::new());
    let mut state = AlignPartialState::default();

    // Request a, chunk to 48: full blocks cached in both groups (Mamba's state only).
    assert_eq!(
        allocate_full_partial(&mut fa, None, 3, &mut take)
            .unwrap()
            .0,
        [1, 2, 3]
    );
    let (new, _) = allocate_align_partial(&mut mamba, &mut state, None, 3, &mut take).unwrap();
    assert_eq!(new, [0, 0, 4]);
    for (i, &b) in fa.iter().enumerate() {
        entries
            .cache_full((FA, (i + 1) * BLOCK), b, (i + 1) * BLOCK)
            .unwrap();
    }
    entries.cache_full((MAMBA, 48), 4, 48).unwrap();
    assert_eq!(full_partial_tail(55, 12, HASH, BLOCK, 48), None);
    assert_eq!(align_partial_tail(48, 55, HASH, BLOCK), None);

    // Chunk to 52, the prompt's last hash boundary: both groups key it inside block 3.
    assert_eq!(
        allocate_full_partial(&mut fa, None, 4, &mut take)
            .unwrap()
            .0,
        [5]
    );
    let (new, _) = allocate_align_partial(&mut mamba, &mut state, None, 4, &mut take).unwrap();
    assert_eq!((new, state.last_state), (vec![6], Some(2)));
    assert_eq!(full_partial_tail(55, 13, HASH, BLOCK, 52), Some((3, 52)));
    entries.cache_partial((FA, 52), fa[3], 52).unwrap();
    let (slot, boundary) = align_partial_tail(52, 55, HASH, BLOCK).unwrap();
    entries
        .cache_partial((MAMBA, boundary), mamba[slot], boundary)
        .unwrap();
    let moving = PartialSlot {
        slot,
        source: mamba[slot],
    };

    // Chunk to 55: the state block 4 is retired (remove_skipped_blocks at 52), and the
    // running state stays on 6 while its entry moves to 7, which the step copies into.
    mamba[2] = NULL_BLOCK;
    let (new, copy) =
        allocate_align_partial(&mut mamba, &mut state, Some(moving), 4, &mut take).unwrap();
    assert_eq!((new, mamba.clone()), (vec![], vec![0, 0, 0, 6]));
    let copy = copy.unwrap();
    assert_eq!(
        (copy.source, copy.destination, copy.kind),
        (6, 7, CopyKind::MovedEntry)
    );
    entries.move_entries(6, 7).unwrap();
    copies.push(MAMBA, &copy).unwrap();
    assert_eq!(copies.take(), (vec![(6, 7)], vec![6, 7]));
    assert_eq!(entries.get(&(MAMBA, 52)), Some(7));

    // Request b (75 tokens) hits 52: full attention's blocks 1 2 3 and the tail 5, Mamba's
    // state 7 after three nulls. Both hits end inside the fourth block: copy-on-write.
    let hit_fa = [
        entries.get(&(FA, 16)),
        entries.get(&(FA, 32)),
        entries.get(&(FA, 48)),
    ];
    assert_eq!(hit_fa, [Some(1), Some(2), Some(3)]);
    assert_eq!(entries.get(&(FA, 52)), Some(5));
    let mut fa_b = vec![1, 2, 3, 5];
    let mut mamba_b = vec![7]; // the hit's blocks after the three skipped nulls
    assert_eq!(full_blocks_needed(5, 0, 4, true, 0), 2);
    assert_eq!(align_blocks_needed(5, 0, 4, true, 0), 2);
    let p = partial_slot(&fa_b, 52, BLOCK).unwrap();
    let (new, copy) = allocate_full_partial(&mut fa_b, Some(p), 5, &mut take).unwrap();
    assert_eq!((new, fa_b.clone()), (vec![8, 9], vec![1, 2, 3, 8, 9]));
    copies.push(FA, &copy.unwrap()).unwrap();
    mamba_b.splice(0..0, [NULL_BLOCK; 3]);
    let p = PartialSlot {
        slot: 52 / BLOCK,
        source: 7,
    };
    let mut state_b = AlignPartialState::default();
    let (new, copy) =
        allocate_align_partial(&mut mamba_b, &mut state_b, Some(p), 5, &mut take).unwrap();
    assert_eq!(
        (new, mamba_b.clone()),
        (vec![10, 11], vec![0, 0, 0, 10, 11])
    );
    assert_eq!(copy.unwrap().kind, CopyKind::Private);
    copies.push(MAMBA, &copy.unwrap()).unwrap();
    assert_eq!(copies.take(), (vec![(5, 8), (7, 10)], vec![5, 8, 7, 10]));
}

#[test]
fn a_full_block_keeps_the_partial_key_registered_after_it() {
    let mut entries = Entries::default();
    entries.cache_partial((FA, 52), 5, 52).unwrap();
    // The block fills: its partial entry goes, the full key is its primary.
    entries.cache_full((FA, 64), 5, 64).unwrap();
    assert_eq!(
        (entries.get(&(FA, 52)), entries.keys_of(5)),
        (None, &[(FA, 64)][..])
    );
    // The tail registered again sits beside it (a shorter key keeps the primary).
    entries.cache_partial((FA, 52), 5, 52).unwrap();
    assert_eq!(entries.keys_of(5), [(FA, 64), (FA, 52)]);
    assert_eq!(entries.primary_tokens(5), Some(64));
    // A longer partial entry replaces a shorter primary and its company.
    entries.cache_partial((FA, 40), 9, 40).unwrap();
    entries.cache_partial((FA, 44), 9, 44).unwrap();
    assert_eq!(
        (entries.get(&(FA, 40)), entries.keys_of(9)),
        (None, &[(FA, 44)][..])
    );
    // Cached in full twice is refused, nothing changed.
    assert!(entries.cache_full((FA, 48), 5, 48).is_err());
    assert_eq!(entries.keys_of(5), [(FA, 64), (FA, 52)]);
}

#[test]
fn a_key_on_several_blocks_answers_with_the_first_until_it_goes() {
    let mut entries = Entries::default();
    entries.cache_partial((MAMBA, 12), 3, 12).unwrap();
    entries.cache_partial((MAMBA, 12), 8, 12).unwrap();
    assert_eq!(entries.get(&(MAMBA, 12)), Some(3));
    assert_eq!(entries.remove_block(3), [(MAMBA, 12)]);
    assert_eq!(entries.get(&(MAMBA, 12)), Some(8));
    assert!(entries.cache_partial((MAMBA, 12), NULL_BLOCK, 12).is_err());
}

#[test]
fn an_entry_moves_only_to_a_fresh_block() {
    let mut entries = Entries::default();
    entries.cache_partial((MAMBA, 52), 6, 52).unwrap();
    entries.cache_partial((MAMBA, 20), 2, 20).unwrap();
    let err = entries.move_entries(6, 2).unwrap_err();
    assert!(err.to_string().contains("destination"), "{err}");
    assert_eq!(entries.get(&(MAMBA, 52)), Some(6));
    entries.move_entries(6, 7).unwrap();
    assert_eq!(
        (entries.get(&(MAMBA, 52)), entries.primary_tokens(7)),
        (Some(7), Some(52))
    );
    assert!(entries.keys_of(6).is_empty());
}

#[test]
fn the_tail_entries_follow_vllms_boundaries() {
    // Full attention: the boundary below len - 1, on the hash grid, inside a block.
    assert_eq!(full_partial_tail(55, 13, HASH, BLOCK, 60), Some((3, 52)));
    assert_eq!(full_partial_tail(55, 10, HASH, BLOCK, 60), Some((2, 40))); // hashed to 40
    assert_eq!(full_partial_tail(65, 16, HASH, BLOCK, 64), None); // 64: a full block
    assert_eq!(full_partial_tail(55, 13, HASH, BLOCK, 51), None); // not cached yet
    assert_eq!(full_partial_tail(4, 1, HASH, BLOCK, 4), None); // nothing below len - 1
    // Mamba: a chunk ending on the boundary exactly.
    assert_eq!(align_partial_tail(52, 55, HASH, BLOCK), Some((3, 52)));
    assert_eq!(align_partial_tail(48, 49, HASH, BLOCK), Some((2, 48)));
    assert_eq!(align_partial_tail(55, 55, HASH, BLOCK), None);
}

#[test]
fn the_fit_counts_take_one_block_more_for_a_copy() {
    // A running Mamba request with an entry to move needs one block though its table is full.
    assert_eq!(align_blocks_needed(4, 4, 0, true, 0), 1);
    assert_eq!(align_blocks_needed(4, 4, 0, false, 0), 0);
    // One state block per allocation, and the copy's.
    assert_eq!(align_blocks_needed(9, 2, 0, false, 0), 1);
    assert_eq!(align_blocks_needed(9, 0, 3, true, 2), 4);
    // A table past `required` counts negative, as vLLM's does.
    assert_eq!(align_blocks_needed(3, 5, 0, false, 0), -2);
    assert_eq!(full_blocks_needed(5, 0, 4, false, 3), 4);
}

#[test]
fn a_slot_not_holding_its_source_is_refused_and_nothing_is_taken() {
    let mut take = pool();
    let mut table = vec![1, 2, 3, 5];
    let wrong = PartialSlot { slot: 3, source: 9 };
    let err = allocate_full_partial(&mut table, Some(wrong), 5, &mut take).unwrap_err();
    assert!(err.to_string().contains("partial_slot"), "{err}");
    let mut state = AlignPartialState::default();
    assert!(allocate_align_partial(&mut table, &mut state, Some(wrong), 5, &mut take).is_err());
    assert_eq!(
        (table, state),
        (vec![1, 2, 3, 5], AlignPartialState::default())
    );
    assert_eq!(take(1), [1]);
    assert!(
        CopyQueue::new(2)
            .push(
                2,
                &CowCopy {
                    slot: 0,
                    source: 1,
                    destination: 2,
                    kind: CopyKind::Private,
                }
            )
            .is_err()
    );
}

#[test]
fn a_short_take_is_refused_before_the_table_changes() {
    let mut short = |_: usize| Vec::new();
    let mut table = vec![1, 2, 3, 5];
    let p = PartialSlot { slot: 3, source: 5 };
    let err = allocate_full_partial(&mut table, Some(p), 5, &mut short).unwrap_err();
    assert!(err.to_string().contains("take"), "{err}");
    assert_eq!(table, [1, 2, 3, 5]);
    let mut mamba = vec![0, 0, 0, 7];
    let mut state = AlignPartialState::default();
    let p = PartialSlot { slot: 3, source: 7 };
    assert!(allocate_align_partial(&mut mamba, &mut state, Some(p), 5, &mut short).is_err());
    assert_eq!(
        (mamba, state),
        (vec![0, 0, 0, 7], AlignPartialState::default())
    );
}
