//! EAGLE's drop in some KV groups only (`coordinator_eagle`): hand-checked numbers.

use super::*;

const FULL: KvGroupSpec = KvGroupSpec::FullAttention;
const WINDOW: KvGroupSpec = KvGroupSpec::SlidingWindow { sliding_window: 8 };
const CHUNKED: KvGroupSpec = KvGroupSpec::ChunkedLocalAttention {
    attention_chunk_size: 8,
};

/// Full attention beside a window of 8, blocks of 4, the drop on in the flagged groups,
/// with a 22-token prompt computed and cached (5 full blocks).
fn cached_prompt(flags: &[bool]) -> (KvCoordinator<u64>, Vec<TokenId>) {
    let mut coord = KvCoordinator::new(vec![FULL, WINDOW], 40, 4, true).unwrap();
    coord.set_eagle_groups(flags).unwrap();
    coord.set_eagle_block_drop(true).unwrap();
    let prompt: Vec<TokenId> = (0..22).collect();
    coord
        .allocate_slots(&1, &prompt, 22, 0, None, None)
        .unwrap()
        .unwrap();
    coord.free(&1).unwrap();
    (coord, prompt)
}

/// Per group over 22 tokens (5 cached blocks of 4): a group that drops reads at most the
/// request's 5 full blocks and drops one (16); one that does not keeps all 5 (20). vLLM's
/// `find_longest_cache_hit_per_group` with `SpecGroup.use_eagle` per group.
#[test]
fn only_flagged_groups_drop_a_block() {
    for (flags, lengths) in [
        (vec![true, true], vec![16, 16]),
        (vec![false, false], vec![16, 16]),
        (vec![true, false], vec![16, 20]),
        (vec![false, true], vec![20, 16]),
    ] {
        let (coord, prompt) = cached_prompt(&flags);
        let (_, found) = coord.find_longest_cache_hit_per_group(&prompt, None, 22);
        assert_eq!(found, lengths, "flags {flags:?}");
    }
}

/// No flag set is vLLM's fallback, every group; the flags need one per group and change
/// only while no request holds blocks.
#[test]
fn flags_fall_back_to_every_group_and_are_checked() {
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, WINDOW], 20, 4, true).unwrap();
    coord.set_eagle_groups(&[false, false]).unwrap();
    assert_eq!(coord.eagle_groups(), [true, true]);
    let err = coord.set_eagle_groups(&[true]).unwrap_err();
    assert!(err.to_string().contains("is_eagle_group"), "{err}");
    coord.set_eagle_groups(&[]).unwrap();
    assert_eq!(coord.eagle_groups(), [true, true]);
    let prompt: Vec<TokenId> = (0..6).collect();
    coord.allocate_slots(&1, &prompt, 6, 0, None, None).unwrap();
    assert!(coord.set_eagle_groups(&[true, false]).is_err());
    coord.set_eagle_groups(&[true, true]).unwrap();
}

/// A chunked local attention group beside the drop only unflagged (vLLM's manager
/// asserts it never drops), either way round; unflagged, its hit is its own.
#[test]
fn chunked_local_attention_stands_beside_the_drop_unflagged() {
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, CHUNKED], 40, 4, true).unwrap();
    assert!(
        coord.set_eagle_block_drop(true).is_err(),
        "every group flagged"
    );
    coord.set_eagle_groups(&[true, false]).unwrap();
    coord.set_eagle_block_drop(true).unwrap();
    let err = coord.set_eagle_groups(&[true, true]).unwrap_err();
    assert!(err.to_string().contains("chunked local"), "{err}");
    let prompt: Vec<TokenId> = (0..22).collect();
    coord
        .allocate_slots(&1, &prompt, 22, 0, None, None)
        .unwrap();
    coord.free(&1).unwrap();
    // Full attention drops to 16; the chunked group's finder takes what it is given.
    let hit = coord.get_computed_blocks(&prompt, None);
    assert_eq!(hit.num_computed_tokens, 16);
    coord.check_invariants().unwrap();
}

/// vLLM's `get_num_cacheable_tokens` with 2 re-prefillable tokens under the drop: with 22
/// tokens computed a flagged group caches its 20 finalized ones (5 blocks), an unflagged
/// one its aligned 20 (5); with 21, 19 finalized (4 blocks) against 20 (5). Beside a
/// Mamba align group with a prefill checkpoint block the lag is refused.
#[test]
fn flagged_groups_hold_back_reprefillable_tokens() {
    let cached = |flags: &[bool], num_tokens: usize| {
        let mut coord = KvCoordinator::<u64>::new(vec![FULL, WINDOW], 40, 4, true).unwrap();
        coord.set_eagle_groups(flags).unwrap();
        coord.set_eagle_block_drop(true).unwrap();
        coord.set_num_reprefillable_tokens(2).unwrap();
        let prompt: Vec<TokenId> = (0..num_tokens as TokenId).collect();
        coord
            .allocate_slots(&1, &prompt, num_tokens, 0, None, None)
            .unwrap()
            .unwrap();
        coord.free(&1).unwrap();
        let (_, found) = coord.find_longest_cache_hit_per_group(&prompt, None, num_tokens);
        found
    };
    // 22 computed: 20 finalized, 5 blocks either way; per group each drops one (16) or
    // not (20).
    assert_eq!(cached(&[true, false], 22), [16, 20]);
    // 21 computed: 19 finalized in the flagged group (4 blocks, a hit of 12 after its
    // drop), 20 aligned in the other (5 blocks: 20).
    assert_eq!(cached(&[true, false], 21), [12, 20]);
    assert_eq!(cached(&[false, true], 21), [20, 12]);
    // Beside a Mamba align group the lag is served; beside one with a prefill checkpoint
    // block it is refused.
    let mamba = KvGroupSpec::MAMBA_ALIGN;
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, mamba], 40, 4, true).unwrap();
    assert!(coord.set_num_reprefillable_tokens(2).is_ok());
    let checkpoint = KvGroupSpec::mamba(true, 0, 1, Some(1)).unwrap();
    let mut coord = KvCoordinator::<u64>::new(vec![FULL, checkpoint], 40, 4, true).unwrap();
    let err = coord
        .set_num_reprefillable_tokens(2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("num_reprefillable_tokens"), "{err}");
}

/// Groups sharing a spec drop together when one is flagged, in what they cache as in their
/// lookups (vLLM's `verify_and_split_kv_cache_groups` sets `use_eagle` on every member
/// manager): two windows of blocks of 4 beside full attention of 8 cache the same with one
/// window flagged as with both.
#[test]
fn groups_sharing_a_spec_cache_as_one_under_the_drop() {
    let run = |flags: &[bool]| {
        let groups = vec![WINDOW, WINDOW, FULL];
        let mut coord = KvCoordinator::<u64>::new(groups, 60, 4, true).unwrap();
        coord.set_group_block_sizes(&[4, 4, 8]).unwrap();
        coord.set_eagle_groups(flags).unwrap();
        coord.set_eagle_block_drop(true).unwrap();
        let prompt: Vec<TokenId> = (0..29).collect();
        coord
            .allocate_slots(&1, &prompt, 29, 0, None, None)
            .unwrap();
        let cached = coord.num_cached_blocks_of(&1).unwrap().to_vec();
        coord.free(&1).unwrap();
        let (_, found) = coord.find_longest_cache_hit_per_group(&prompt, None, 29);
        (cached, found)
    };
    let one = run(&[true, false, true]);
    assert_eq!(one, run(&[true, true, true]));
    assert_eq!(one.0[0], one.0[1]);
}
