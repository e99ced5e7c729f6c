//! A `none`-mode Mamba group whose block is shorter than `max_model_len`
//! (`KvGroupSpec::MambaPerBlock`; vLLM 0.33's `MambaManager` outside align mode): a slot
//! per block of the request's slots plus its speculative blocks, as full attention
//! allocates, and every block before the last computed token's state freed to a null block
//! at the next allocation (`get_num_skipped_tokens`: `n - 1`). The numbers are vLLM's on
//! the same calls (`tests/test_integrations_vllm_block_sizes.py` compares them step by step).

use super::*;
use crate::kv::KvCapacity;

const FULL: KvGroupSpec = KvGroupSpec::FullAttention;

fn per_block(k: usize) -> KvGroupSpec {
    KvGroupSpec::mamba_blocks(false, false, k, 0, None).unwrap()
}

fn tables(coord: &KvCoordinator<u64>, id: u64) -> Vec<Vec<BlockId>> {
    let tables = coord.block_ids(&id).unwrap();
    tables.iter().map(|t| t.to_vec()).collect()
}

fn live(table: &[BlockId]) -> usize {
    table.iter().filter(|&&b| b != NULL_BLOCK).count()
}

#[test]
fn a_prompt_takes_a_slot_per_block_then_keeps_only_the_last_state() {
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, per_block(0)], 64, 16, false).unwrap();
    let prompt: Vec<TokenId> = (0..40).collect();
    let new = coord
        .allocate_slots(&1, &prompt, 40, 0, None, None)
        .unwrap();
    // vLLM: cdiv(40, 16) = 3 slots in both groups (test_integrations_vllm_block_sizes).
    assert_eq!(
        new.unwrap().iter().map(Vec::len).collect::<Vec<_>>(),
        [3, 3]
    );
    let before = tables(&coord, 1)[1].clone();
    // The next step frees the blocks below token 39's state: (40 - 1) / 16 = 2 of them.
    let new = coord.allocate_slots(&1, &[], 1, 0, None, None).unwrap();
    assert_eq!(new.unwrap()[1], Vec::<BlockId>::new());
    let after = tables(&coord, 1)[1].clone();
    assert_eq!(after, [NULL_BLOCK, NULL_BLOCK, before[2]]);
    assert_eq!(coord.num_free_blocks(), 63 - 3 - 1);
    // At 48 computed the state is token 47's, still in block 2; slot 49 opens block 3.
    for _ in 0..8 {
        coord.allocate_slots(&1, &[], 1, 0, None, None).unwrap();
    }
    let t = tables(&coord, 1)[1].clone();
    assert_eq!((t.len(), live(&t), t[1]), (4, 2, NULL_BLOCK));
    // One more token: token 48's state is in block 3, so block 2 goes.
    coord.allocate_slots(&1, &[], 1, 0, None, None).unwrap();
    let t = tables(&coord, 1)[1].clone();
    assert_eq!((t.len(), live(&t), t[2]), (4, 1, NULL_BLOCK));
    coord.check_invariants().unwrap();
}

#[test]
fn speculative_blocks_follow_the_slots_and_become_states() {
    // k = 2: cdiv(num_tokens + 2 * 16, 16) slots (vLLM adds block_size * k to num_tokens).
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, per_block(2)], 64, 16, false).unwrap();
    let prompt: Vec<TokenId> = (0..20).collect();
    let new = coord
        .allocate_slots(&1, &prompt, 20, 0, None, None)
        .unwrap();
    assert_eq!(new.unwrap()[1].len(), 2 + 2);
    // 20 computed, 1 + 2 drafts and 2 lookahead slots: cdiv(25, 16) + 2 = 4, nothing new;
    // the state of token 19 is in block 1, so block 0 is freed.
    let new = coord.allocate_slots(&1, &[], 3, 2, None, None).unwrap();
    assert_eq!(new.unwrap()[1].len(), 0);
    let t = tables(&coord, 1)[1].clone();
    assert_eq!((t.len(), t[0], live(&t)), (4, NULL_BLOCK, 3));
    // 23 computed + 1 + 2 + 10 lookahead = 36 slots: cdiv(36, 16) + 2 = 5.
    let new = coord.allocate_slots(&1, &[], 1, 12, None, None).unwrap();
    assert_eq!(new.unwrap()[1].len(), 1);
    assert_eq!(
        KvGroupSpec::mamba_blocks(false, false, 2, 0, None)
            .unwrap()
            .max_live_blocks(13, 16),
        Some(1 + 1 + 2)
    );
    coord.check_invariants().unwrap();
}

#[test]
fn in_flight_tokens_keep_the_state_a_step_in_flight_reads() {
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, per_block(0)], 64, 16, false).unwrap();
    let prompt: Vec<TokenId> = (0..40).collect();
    coord
        .allocate_slots(&1, &prompt, 40, 0, None, None)
        .unwrap();
    // 40 computed, the last 10 in flight: only blocks below token 29's state go.
    let new = coord
        .allocate_slots_in_flight(&1, &[], 1, 0, None, None, 10, 0)
        .unwrap();
    assert!(new.is_some());
    let t = tables(&coord, 1)[1].clone();
    assert_eq!(
        (t[0], t[1] != NULL_BLOCK, t[2] != NULL_BLOCK),
        (NULL_BLOCK, true, true)
    );
}

#[test]
fn a_larger_block_beside_full_attention_takes_its_own_size() {
    // Full attention in blocks of 16, the Mamba group in blocks of 64 (hash block 16).
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, per_block(1)], 64, 16, false).unwrap();
    coord.set_group_block_sizes(&[16, 64]).unwrap();
    let prompt: Vec<TokenId> = (0..100).collect();
    let new = coord
        .allocate_slots(&1, &prompt, 64, 0, None, None)
        .unwrap();
    // cdiv(64, 16) = 4 and cdiv(64, 64) + 1 = 2.
    assert_eq!(
        new.unwrap().iter().map(Vec::len).collect::<Vec<_>>(),
        [4, 2]
    );
    let new = coord.allocate_slots(&1, &[], 36, 0, None, None).unwrap();
    // 100 slots: 7 and cdiv(100, 64) + 1 = 3; token 63's state is block 0, kept.
    assert_eq!(
        new.unwrap().iter().map(Vec::len).collect::<Vec<_>>(),
        [3, 1]
    );
    coord.allocate_slots(&1, &[], 1, 0, None, None).unwrap();
    let t = tables(&coord, 1)[1].clone();
    assert_eq!((t.len(), t[0], live(&t)), (3, NULL_BLOCK, 2));
    coord.check_invariants().unwrap();
}

#[test]
fn a_load_holds_nulls_below_its_state_then_the_speculative_blocks() {
    // vLLM's allocate_external_computed_blocks: 64 loaded tokens over blocks of 16 skip
    // (64 - 1) / 16 = 3 blocks, take the state's block, then allocate_new_blocks adds k.
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, per_block(3)], 64, 16, false).unwrap();
    let prompt: Vec<TokenId> = (0..64).collect();
    let alloc = ExternalAllocation {
        num_external_tokens: 64,
        ..ExternalAllocation::default()
    };
    let new = coord.allocate_slots_external(&1, &prompt, None, None, alloc);
    let new = new.unwrap().unwrap();
    assert_eq!((new[0].len(), new[1].len()), (4, 1 + 3));
    let t = tables(&coord, 1)[1].clone();
    assert_eq!(&t[..3], [NULL_BLOCK; 3]);
    assert_eq!(t.len(), 7);
    coord.check_invariants().unwrap();
}

#[test]
fn the_full_sequence_gate_counts_every_slot_without_a_cap() {
    // vLLM gives MambaManager no admission cap: 200 tokens count cdiv(200, 16) = 13 slots
    // in each group, though the Mamba group would hold few of them at once.
    let coord = KvCoordinator::<u64>::new(vec![FULL, per_block(0)], 27, 16, false).unwrap();
    assert!(coord.full_sequence_fits(&1, 200, None, 16, 0));
    let coord = KvCoordinator::<u64>::new(vec![FULL, per_block(0)], 26, 16, false).unwrap();
    assert!(!coord.full_sequence_fits(&1, 200, None, 16, 0));
}

#[test]
fn align_mode_has_no_block_covering_the_request() {
    let err = KvGroupSpec::mamba_blocks(true, false, 0, 0, None).unwrap_err();
    assert!(err.to_string().contains("block_covers_request"), "{err}");
    let err = KvCoordinator::<u64>::new(vec![FULL, per_block(0)], 8, 16, true).unwrap_err();
    assert!(err.to_string().contains("enable_caching"), "{err}");
}
