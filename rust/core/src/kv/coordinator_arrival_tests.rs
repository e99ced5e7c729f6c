//! Hand-checked first allocations of requests that arrive computed (`coordinator_arrival`).

use super::*;

fn coordinator(groups: Vec<KvGroupSpec>, num_blocks: usize) -> KvCoordinator<u32> {
    KvCoordinator::new(groups, num_blocks, 16, true).unwrap()
}

#[test]
fn a_window_counts_without_the_blocks_it_has_left_but_takes_them() {
    // Full attention beside a 32-token window, 100 tokens with 80 computed, 20 new:
    // 7 blocks per group; the window skips 81 - 32 = 49 tokens, 3 blocks, so vLLM counts
    // 7 + 4 = 11 and allocates 14.
    let groups = vec![
        KvGroupSpec::FullAttention,
        KvGroupSpec::SlidingWindow { sliding_window: 32 },
    ];
    let kv = coordinator(groups.clone(), 40);
    let slots = GroupSlots::decoder(100);
    assert_eq!(kv.arrival_needs(&1, slots, 80, None), (11, 14));
    let mut kv = coordinator(groups.clone(), 40);
    let tokens: Vec<TokenId> = (100..200).collect();
    let blocks = kv
        .allocate_slots_arrived(&1, &tokens, 80, 20, 0, None, 0)
        .unwrap()
        .unwrap();
    assert_eq!(blocks.iter().map(Vec::len).collect::<Vec<_>>(), [7, 7]);
    assert!(blocks.iter().flatten().all(|&b| b != NULL_BLOCK));
    assert_eq!(kv.num_free_blocks(), 39 - 14);
    kv.check_invariants().unwrap();
    // 13 free: the count (11) fits, the allocation (14) does not: vLLM raises there.
    let mut tight = coordinator(groups.clone(), 14);
    let err = tight
        .allocate_slots_arrived(&1, &tokens, 80, 20, 0, None, 0)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Capacity {
                requested: 14,
                available: 13,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(tight.num_free_blocks(), 13);
    // 10 free: the count does not fit either.
    let mut short = coordinator(groups, 11);
    assert_eq!(
        short
            .allocate_slots_arrived(&1, &tokens, 80, 20, 0, None, 0)
            .unwrap(),
        None
    );
}

#[test]
fn a_mamba_align_table_counts_from_zero_and_nulls_before_its_state() {
    let groups = vec![
        KvGroupSpec::FullAttention,
        KvGroupSpec::MambaAlign {
            num_speculative_blocks: 0,
            prefill_checkpoint_alignment: None,
        },
    ];
    let mut kv = coordinator(groups, 40);
    let tokens: Vec<TokenId> = (100..200).collect();
    assert_eq!(
        kv.arrival_needs(&1, GroupSlots::decoder(100), 80, None),
        (8, 8)
    );
    let blocks = kv
        .allocate_slots_arrived(&1, &tokens, 80, 20, 0, None, 0)
        .unwrap()
        .unwrap();
    assert_eq!(blocks[0].len(), 7);
    assert_eq!(blocks[1][..6], [NULL_BLOCK; 6]);
    assert_ne!(blocks[1][6], NULL_BLOCK);
    assert!(
        kv.allocate_slots_arrived(&1, &tokens, 80, 20, 0, None, 0)
            .is_err()
    );
    kv.check_invariants().unwrap();
}
