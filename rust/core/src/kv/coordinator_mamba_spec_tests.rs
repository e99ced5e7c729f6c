//! Mamba groups with speculative state blocks and the prefill checkpoint block (vLLM 0.33's
//! `MambaManager` with `num_speculative_blocks`, and in align mode with
//! `num_prefill_checkpoint_blocks`): tables checked by hand against its
//! `allocate_new_blocks`, `get_num_blocks_to_allocate` and `remove_skipped_blocks`.

use super::*;

const FULL: KvGroupSpec = KvGroupSpec::FullAttention;

fn align(num_speculative_blocks: usize, checkpoint: Option<usize>) -> KvGroupSpec {
    KvGroupSpec::mamba(
        true,
        num_speculative_blocks,
        usize::from(checkpoint.is_some()),
        checkpoint,
    )
    .unwrap()
}

fn mamba_table(coord: &KvCoordinator<u64>, id: u64) -> Vec<BlockId> {
    coord.group_block_ids(&id, 1).unwrap().to_vec()
}

fn held(table: &[BlockId]) -> usize {
    table.iter().filter(|&&b| b != NULL_BLOCK).count()
}

fn prompt(n: u32) -> Vec<TokenId> {
    (100..100 + n).collect()
}

#[test]
fn align_k2_a_prefill_takes_the_state_and_two_speculative_blocks() {
    // Blocks of 4, a 10-token prompt in one chunk: cdiv(10, 4) + 2 = 5 slots, nulls up to
    // the running state's block (2), then the state and the 2 draft-token blocks.
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, align(2, None)], 40, 4, true).unwrap();
    let n = coord.blocks_to_allocate(&1, 10, None, 0, None);
    assert_eq!(n, 3 + 3);
    let new = coord
        .allocate_slots(&1, &prompt(10), 10, 0, None, None)
        .unwrap()
        .unwrap();
    let t = mamba_table(&coord, 1);
    assert_eq!(t.len(), 5);
    assert_eq!(&t[..2], [NULL_BLOCK, NULL_BLOCK]);
    assert_eq!(held(&t), 3);
    // vLLM returns the table's new slots, nulls included.
    assert_eq!(new[1], t);
    coord.check_invariants().unwrap();
}

#[test]
fn align_k2_a_decode_step_holds_1_plus_2_state_blocks_and_frees_the_previous_next_time() {
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, align(2, None)], 40, 4, true).unwrap();
    coord
        .allocate_slots(&1, &prompt(10), 10, 0, None, None)
        .unwrap()
        .unwrap();
    let before = mamba_table(&coord, 1);
    // A decode step: the sampled token and 2 drafts (13 tokens -> cdiv 4 + 2 = 6 slots).
    // The state moves to slot 3 (the first speculative block); one new block at the end.
    assert_eq!(coord.blocks_to_allocate(&1, 13, None, 0, None), 1 + 1);
    let new = coord
        .allocate_slots(&1, &[7], 3, 0, None, None)
        .unwrap()
        .unwrap();
    let t = mamba_table(&coord, 1);
    assert_eq!(new[1].len(), 1);
    assert_eq!(t, [before.clone(), new[1].clone()].concat());
    // Held: the state copied from (slot 2) and 1 + 2 at slots 3..6.
    assert_eq!(held(&t), 4);
    // All drafts accepted: 13 computed, the next step needs 16 -> 6 slots, none new; the
    // state at slot 2 is freed, 1 + 2 state blocks stay.
    let free_before = coord.num_free_blocks();
    let new = coord
        .allocate_slots(&1, &[7, 7, 7], 3, 0, None, None)
        .unwrap()
        .unwrap();
    assert!(new[1].is_empty());
    let t = mamba_table(&coord, 1);
    assert_eq!(t[2], NULL_BLOCK);
    assert_eq!(held(&t), 3);
    // The full-attention group's 4 blocks hold the 16 slots; the Mamba group freed one.
    assert_eq!(coord.num_free_blocks(), free_before + 1);
    coord.check_invariants().unwrap();
}

#[test]
fn align_speculative_blocks_move_past_the_nulls_of_a_long_chunk() {
    // A 20-token prompt in chunks of 8 and 12: the second chunk's state lands at slot 4,
    // so the 2 speculative blocks at slots 2 and 3 move to the end (vLLM's
    // `_relocate_speculative_block`) and one block is taken.
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, align(2, None)], 40, 4, true).unwrap();
    coord
        .allocate_slots(&1, &prompt(20), 8, 0, None, None)
        .unwrap()
        .unwrap();
    let first = mamba_table(&coord, 1);
    assert_eq!(first.len(), 4);
    assert_eq!(coord.blocks_to_allocate(&1, 20, None, 0, None), 3 + 1);
    let new = coord
        .allocate_slots(&1, &[], 12, 0, None, None)
        .unwrap()
        .unwrap();
    let t = mamba_table(&coord, 1);
    assert_eq!(t.len(), 7);
    assert_eq!(&t[..4], [NULL_BLOCK, first[1], NULL_BLOCK, NULL_BLOCK]);
    assert_eq!(&t[4..6], &first[2..4]);
    assert_eq!(new[1], t[4..].to_vec());
    coord.check_invariants().unwrap();
}

#[test]
fn rejected_drafts_leave_the_speculative_blocks_in_place() {
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, align(2, None)], 40, 4, true).unwrap();
    coord
        .allocate_slots(&1, &prompt(10), 10, 0, None, None)
        .unwrap()
        .unwrap();
    coord
        .allocate_slots(&1, &[7], 3, 0, None, None)
        .unwrap()
        .unwrap();
    let t = mamba_table(&coord, 1);
    // Both drafts rejected: 11 computed; the next step's 14 tokens fit in the 6 slots.
    coord.rewind_computed_tokens(&1, 2).unwrap();
    let new = coord
        .allocate_slots(&1, &[7], 3, 0, None, None)
        .unwrap()
        .unwrap();
    assert!(new[1].is_empty());
    assert_eq!(mamba_table(&coord, 1), t);
    coord.check_invariants().unwrap();
}

#[test]
fn none_mode_holds_one_plus_k_blocks_for_the_request() {
    let spec = KvGroupSpec::mamba(false, 3, 0, None).unwrap();
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, spec], 40, 4, false).unwrap();
    assert_eq!(coord.blocks_to_allocate(&1, 10, None, 0, None), 3 + 4);
    coord
        .allocate_slots(&1, &prompt(10), 10, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(held(&mamba_table(&coord, 1)), 4);
    coord
        .allocate_slots(&1, &[7], 4, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(mamba_table(&coord, 1).len(), 4);
    assert_eq!(spec.max_live_blocks(1, 4), Some(4));
    coord.check_invariants().unwrap();
}

#[test]
fn the_checkpoint_block_keeps_the_last_boundary_state_of_a_final_chunk() {
    // A 10-token prompt in one chunk over blocks of 4: the last reusable boundary is 8
    // (`get_mamba_prefill_checkpoint_position`), inside the chunk. With a checkpoint block
    // the backend writes that state into slot 1, which is cached: a second request with
    // the same prompt hits 8 tokens. Without one, slot 1 is null and nothing is hit.
    for (checkpoint, expect_hit) in [(Some(1), 8), (None, 0)] {
        let spec = align(0, checkpoint);
        let mut coord = KvCoordinator::<u64>::new(vec![FULL, spec], 40, 4, true).unwrap();
        let state = usize::from(checkpoint.is_some());
        assert_eq!(
            coord.blocks_to_allocate(&1, 10, None, 0, None),
            3 + 1 + state
        );
        coord
            .allocate_slots(&1, &prompt(10), 10, 0, None, None)
            .unwrap()
            .unwrap();
        let t = mamba_table(&coord, 1);
        assert_eq!((t.len(), held(&t)), (3, 1 + state));
        assert_eq!(t[1] != NULL_BLOCK, checkpoint.is_some());
        coord.new_step_starts();
        let hit = coord.get_computed_blocks(&prompt(10), None);
        assert_eq!(hit.num_computed_tokens, expect_hit, "{checkpoint:?}");
        // The next allocation frees the checkpoint with the states before the running one.
        coord
            .allocate_slots(&1, &[7], 1, 0, None, None)
            .unwrap()
            .unwrap();
        assert_eq!(held(&mamba_table(&coord, 1)), 1);
        coord.check_invariants().unwrap();
    }
}

#[test]
fn a_checkpoint_needs_a_block_aligned_chunk_start_and_the_alignment() {
    // vLLM's is_mamba_prefill_checkpoint_valid: the chunk [0, 6) exports the state at 4
    // into slot 0; the chunk [6, 10) starts mid-block, so it takes the state block alone
    // (one more full-attention block beside it). The chunk [0, 10) with a 16-token
    // alignment cannot export the state at 8.
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, align(0, Some(1))], 40, 4, true).unwrap();
    coord
        .allocate_slots(&1, &prompt(10), 6, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(held(&mamba_table(&coord, 1)), 2);
    assert_eq!(coord.blocks_to_allocate(&1, 10, None, 0, None), 1 + 1);
    coord
        .allocate_slots(&1, &[], 4, 0, None, None)
        .unwrap()
        .unwrap();
    let t = mamba_table(&coord, 1);
    assert_eq!((t[0], held(&t)), (NULL_BLOCK, 2));
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, align(0, Some(16))], 40, 4, true).unwrap();
    coord
        .allocate_slots(&1, &prompt(10), 10, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(held(&mamba_table(&coord, 1)), 1);
}

#[test]
fn mamba_specs_refuse_settings_that_change_nothing() {
    let field = |r: Result<KvGroupSpec>| match r {
        Err(Error::Config { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field(KvGroupSpec::mamba(true, 0, 2, Some(1))),
        "num_prefill_checkpoint_blocks"
    );
    assert_eq!(
        field(KvGroupSpec::mamba(false, 0, 1, Some(1))),
        "num_prefill_checkpoint_blocks"
    );
    assert_eq!(
        field(KvGroupSpec::mamba(true, 0, 1, None)),
        "prefill_checkpoint_alignment"
    );
    assert_eq!(
        field(KvGroupSpec::mamba(true, 0, 0, Some(4))),
        "prefill_checkpoint_alignment"
    );
    assert_eq!(
        field(KvGroupSpec::mamba(true, 0, 1, Some(0))),
        "prefill_checkpoint_alignment"
    );
    assert_eq!(align(2, Some(1)).max_live_blocks(1, 4), Some(2 + 2 + 1));
}

#[test]
fn an_async_load_takes_the_loaded_state_then_the_speculative_blocks() {
    // 10 loaded tokens over blocks of 4, nothing to compute: the loaded state at slot 2
    // (vLLM's `allocate_external_computed_blocks`), then the 2 speculative blocks
    // (`allocate_new_blocks`, run for the loaded tokens too).
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, align(2, None)], 40, 4, true).unwrap();
    let alloc = ExternalAllocation {
        num_external_tokens: 10,
        ..ExternalAllocation::default()
    };
    let new = coord.allocate_slots_external(&1, &prompt(20), None, None, alloc);
    let new = new.unwrap().unwrap();
    let t = mamba_table(&coord, 1);
    assert_eq!(t.len(), 5);
    assert_eq!(&t[..2], [NULL_BLOCK, NULL_BLOCK]);
    assert_eq!(new[1], t[2..].to_vec());
    // The request counts as allocated: its next step's cap leaves the speculative blocks
    // out, so 10 more tokens (7 slots) take one block and move a speculative one.
    coord
        .allocate_slots(&1, &[], 10, 0, None, None)
        .unwrap()
        .unwrap();
    let after = mamba_table(&coord, 1);
    assert_eq!(after.len(), 7);
    assert_eq!((after[3], after[5]), (NULL_BLOCK, t[3]));
    coord.check_invariants().unwrap();
}

#[test]
fn a_load_vllm_would_come_a_block_short_of_does_not_fit() {
    // 10 loaded and 10 new tokens: vLLM counts 5 full-attention blocks and the Mamba group's
    // cap of 1 + 2, but takes the loaded state besides (9 blocks). With 8 free it would
    // raise in `get_new_blocks`; here the load does not fit. With 9 it fits exactly.
    for (num_blocks, fits) in [(9, false), (10, true)] {
        let mut coord =
            KvCoordinator::<u64>::new(vec![FULL, align(2, None)], num_blocks, 4, true).unwrap();
        let alloc = ExternalAllocation {
            num_external_tokens: 10,
            num_new_tokens: 10,
            cache: true,
            ..ExternalAllocation::default()
        };
        let new = coord.allocate_slots_external(&1, &prompt(20), None, None, alloc);
        assert_eq!(new.unwrap().is_some(), fits, "{num_blocks} blocks");
        if fits {
            assert_eq!(coord.num_free_blocks(), 0);
        }
        coord.check_invariants().unwrap();
    }
}

#[test]
fn the_remaining_blocks_of_a_request_leave_the_speculative_step_out_of_an_align_group() {
    // vLLM's `_request_remaining_blocks`: a 20-token request computed whole (7 state slots)
    // and one speculative step of 3 slots: full attention needs cdiv(23, 4) - 5 = 1 more,
    // the align group none (its tokens are the main model's 20, not 23).
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, align(2, None)], 40, 4, true).unwrap();
    coord
        .allocate_slots(&1, &prompt(20), 20, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(mamba_table(&coord, 1).len(), 7);
    assert_eq!(coord.remaining_blocks(&1, 20, 3, 64), 1);
    assert_eq!(coord.blocks_to_allocate(&1, 23, None, 0, Some(64)), 1 + 1);
}
