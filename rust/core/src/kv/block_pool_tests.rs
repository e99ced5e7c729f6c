use super::*;
use crate::kv::KvCapacity;
use proptest::prelude::*;

pub(super) fn tokens(range: std::ops::Range<u32>) -> Vec<TokenId> {
    range.collect()
}

#[test]
fn new_request_gets_ceil_blocks_and_full_blocks_are_cached() {
    let mut pool = BlockPool::new(8, 4, true).unwrap();
    let prompt = tokens(0..10);
    let hit = pool.get_computed_blocks(&prompt, None);
    assert_eq!(hit.num_computed_tokens, 0);
    let blocks = pool
        .allocate_slots(&1u64, &prompt, 10, 0, Some(&hit), None)
        .unwrap()
        .unwrap();
    assert_eq!(blocks, [0, 1, 2]);
    assert_eq!(
        pool.num_cached_blocks(),
        2,
        "two full blocks of the 10 tokens"
    );
    assert_eq!(pool.num_free_blocks(), 5);
    pool.check_invariants().unwrap();
}

#[test]
fn prefix_hit_shares_blocks_and_never_covers_the_last_token() {
    let mut pool = BlockPool::new(8, 4, true).unwrap();
    let prompt = tokens(0..8);
    pool.allocate_slots(&1u64, &prompt, 8, 0, None, None)
        .unwrap()
        .unwrap();
    // Same 8 tokens: only the first block may hit, the last token must be recomputed.
    let hit = pool.get_computed_blocks(&prompt, None);
    assert_eq!(
        (hit.block_ids.as_slice(), hit.num_computed_tokens),
        ([0u32].as_slice(), 4)
    );
    let new = pool
        .allocate_slots(&2u64, &prompt, 4, 0, Some(&hit), None)
        .unwrap()
        .unwrap();
    assert_eq!(new, [2]);
    assert_eq!(pool.block_ids(&2).unwrap(), [0, 2]);
    assert_eq!(pool.ref_count(0), Some(2));
    let stats = pool.stats();
    assert_eq!((stats.num_query_tokens, stats.num_hit_tokens), (8, 4));
    pool.check_invariants().unwrap();
}

/// vLLM 0.33 caches every copy of a full block (`BlockHashToBlockMap`): two requests that
/// computed the same prefix side by side both register their blocks, a lookup answers the
/// oldest copy, and once that one is evicted the other still serves the prefix.
#[test]
fn every_copy_of_a_block_is_cached_and_serves_hits_after_the_first_is_evicted() {
    let mut pool = BlockPool::new(6, 4, true).unwrap();
    pool.enable_events();
    let prompt = tokens(0..8);
    // Both admitted without a hit, as when both were looked up before either computed.
    for id in [1u64, 2] {
        pool.allocate_slots(&id, &prompt, 8, 0, None, None)
            .unwrap()
            .unwrap();
    }
    assert_eq!(pool.block_ids(&2).unwrap(), [2, 3]);
    assert_eq!(
        pool.num_cached_blocks(),
        4,
        "two copies of each of two blocks"
    );
    let stored = pool
        .drain_events()
        .iter()
        .filter(|e| matches!(e, KvEvent::Stored(_)))
        .count();
    assert_eq!(stored, 4, "one event per block, as vLLM reports them");
    pool.check_invariants().unwrap();

    pool.free(&1).unwrap();
    pool.free(&2).unwrap();
    assert_eq!(pool.free_block_ids(), [4, 5, 1, 0, 3, 2]);
    let hit = pool.get_computed_blocks(&tokens(0..12), None);
    assert_eq!(hit.block_ids, [0, 1], "the oldest copies answer");

    // Four new blocks evict the first copies (1 then 0); the second copies remain.
    pool.allocate_slots(&3u64, &tokens(100..116), 16, 0, None, None)
        .unwrap()
        .unwrap();
    let removed = pool
        .drain_events()
        .iter()
        .filter(|e| matches!(e, KvEvent::Removed(_)))
        .count();
    assert_eq!(removed, 2);
    let hit = pool.get_computed_blocks(&tokens(0..12), None);
    assert_eq!(
        hit.block_ids,
        [2, 3],
        "the later copies still serve the prefix"
    );
    assert_eq!(pool.num_cached_blocks(), 6);
    pool.check_invariants().unwrap();
}

#[test]
fn freed_blocks_stay_cached_and_tails_are_evicted_first() {
    let mut pool = BlockPool::new(4, 2, true).unwrap();
    pool.allocate_slots(&1u64, &tokens(0..6), 6, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&1).unwrap();
    // Freed tail-first: block 2 (tokens 4..6) then 1 then 0, after the never-used block 3.
    assert_eq!(pool.free_block_ids(), [3, 2, 1, 0]);
    assert_eq!(pool.num_cached_free_blocks(), 3);
    // Two fresh blocks evict block 3 (uncached) then block 2 (the old tail).
    pool.allocate_slots(&2u64, &tokens(100..104), 4, 0, None, None)
        .unwrap()
        .unwrap();
    let hit = pool.get_computed_blocks(&tokens(0..7), None);
    assert_eq!(
        hit.block_ids,
        [0, 1],
        "the head of the freed prompt is still cached"
    );
    pool.check_invariants().unwrap();
}

#[test]
fn uncached_blocks_are_reused_first_cached_ones_last() {
    let mut pool = BlockPool::new(6, 2, true).unwrap();
    // 5 tokens: blocks 0, 1 full and cached, block 2 partial (no hash).
    pool.allocate_slots(&1u64, &tokens(0..5), 5, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&1).unwrap();
    assert_eq!(pool.free_block_ids(), [2, 3, 4, 5, 1, 0]);
    let mut uncached = BlockPool::new(4, 2, false).unwrap();
    uncached
        .allocate_slots(&1u64, &tokens(0..4), 4, 0, None, None)
        .unwrap()
        .unwrap();
    uncached.free(&1).unwrap();
    assert_eq!(
        uncached.free_block_ids(),
        [1, 0, 2, 3],
        "LIFO reuse with caching off"
    );
    pool.check_invariants().unwrap();
}

#[test]
fn a_hit_on_a_free_block_takes_it_out_of_the_free_queue() {
    let mut pool = BlockPool::new(3, 2, true).unwrap();
    pool.allocate_slots(&1u64, &tokens(0..4), 4, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&1).unwrap();
    let hit = pool.get_computed_blocks(&tokens(0..5), None);
    assert_eq!(hit.block_ids, [0, 1]);
    // Needs 3 blocks: 2 hits (both free, so they count against the free queue) + 1 new.
    let new = pool
        .allocate_slots(&2u64, &tokens(0..5), 1, 0, Some(&hit), None)
        .unwrap()
        .unwrap();
    assert_eq!(new, [2]);
    assert_eq!(pool.num_free_blocks(), 0);
    pool.check_invariants().unwrap();
}

#[test]
fn allocation_failure_returns_none_and_changes_nothing() {
    let mut pool = BlockPool::<u64>::new(2, 4, true).unwrap();
    assert_eq!(
        pool.allocate_slots(&1, &tokens(0..9), 9, 0, None, None)
            .unwrap(),
        None
    );
    assert_eq!(pool.num_requests(), 0);
    pool.allocate_slots(&1, &tokens(0..4), 4, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(
        pool.allocate_slots(&1, &tokens(4..9), 5, 0, None, None)
            .unwrap(),
        None
    );
    assert_eq!(pool.num_computed_tokens(&1), Some(4));
    // Retry with fewer tokens: the ids passed with the failed call were not recorded.
    pool.allocate_slots(&1, &tokens(4..8), 4, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(pool.num_cached_blocks(), 2);
    pool.check_invariants().unwrap();
}

#[test]
fn decode_steps_allocate_a_block_only_at_boundaries_and_lookahead_reserves_slots() {
    let mut pool = BlockPool::<u64>::new(8, 4, true).unwrap();
    pool.allocate_slots(&1, &tokens(0..3), 3, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(
        pool.allocate_slots(&1, &[3], 1, 0, None, None)
            .unwrap()
            .unwrap(),
        Vec::<u32>::new()
    );
    assert_eq!(
        pool.allocate_slots(&1, &[4], 1, 0, None, None)
            .unwrap()
            .unwrap(),
        [1]
    );
    // 5 computed + 1 new + 3 lookahead = 9 slots = 3 blocks.
    assert_eq!(
        pool.allocate_slots(&1, &[5], 1, 3, None, None)
            .unwrap()
            .unwrap(),
        [2]
    );
    pool.check_invariants().unwrap();
}

#[test]
fn extra_key_separates_prefixes() {
    let mut pool = BlockPool::<u64>::new(8, 2, true).unwrap();
    pool.allocate_slots(&1, &tokens(0..5), 5, 0, None, Some(7))
        .unwrap()
        .unwrap();
    assert_eq!(
        pool.get_computed_blocks(&tokens(0..5), Some(7))
            .num_computed_tokens,
        4
    );
    assert_eq!(
        pool.get_computed_blocks(&tokens(0..5), None)
            .num_computed_tokens,
        0
    );
    assert_eq!(
        pool.get_computed_blocks(&tokens(0..5), Some(8))
            .num_computed_tokens,
        0
    );
}

#[test]
fn bad_calls_are_errors_and_change_nothing() {
    let mut pool = BlockPool::<u64>::new(8, 2, true).unwrap();
    assert!(matches!(pool.free(&3), Err(Error::UnknownRequest(_))));
    assert!(
        pool.allocate_slots(&1, &tokens(0..2), 0, 0, None, None)
            .is_err()
    );
    let hit = pool.get_computed_blocks(&tokens(0..4), None);
    assert!(
        pool.allocate_slots(&1, &tokens(0..3), 3, 0, Some(&hit), None)
            .is_err()
    );
    pool.allocate_slots(&1, &tokens(0..4), 4, 0, Some(&hit), None)
        .unwrap()
        .unwrap();
    assert!(
        pool.allocate_slots(&1, &[4], 1, 0, Some(&hit), None)
            .is_err()
    );
    assert_eq!(pool.num_computed_tokens(&1), Some(4));
    assert!(BlockPool::<u64>::new(0, 16, true).is_err());
    assert!(BlockPool::<u64>::new(16, 0, true).is_err());
    pool.check_invariants().unwrap();
}

#[test]
fn a_stale_hit_is_rejected() {
    let mut pool = BlockPool::<u64>::new(2, 2, true).unwrap();
    pool.allocate_slots(&1, &tokens(0..2), 2, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&1).unwrap();
    let hit = pool.get_computed_blocks(&tokens(0..3), None);
    assert_eq!(hit.block_ids, [0]);
    // Two fresh blocks evict block 0.
    pool.allocate_slots(&2, &tokens(50..54), 4, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&2).unwrap();
    assert!(matches!(
        pool.allocate_slots(&3, &tokens(0..3), 1, 0, Some(&hit), None),
        Err(Error::Input {
            arg: "new_computed_blocks",
            ..
        })
    ));
}

#[test]
fn tokens_may_run_ahead_of_known_ids_and_are_cached_when_they_arrive() {
    let mut pool = BlockPool::<u64>::new(8, 2, true).unwrap();
    // Three tokens computed, only two ids known (the third is still being sampled).
    pool.allocate_slots(&1, &[1, 2], 3, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(pool.num_cached_blocks(), 1);
    pool.allocate_slots(&1, &[3, 4], 1, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(
        pool.num_cached_blocks(),
        2,
        "block [3, 4] cached once both ids arrived"
    );
    pool.check_invariants().unwrap();
}

#[test]
fn rejected_speculative_tokens_are_rewound() {
    let mut pool = BlockPool::<u64>::new(8, 4, true).unwrap();
    pool.allocate_slots(&1, &tokens(0..4), 4, 0, None, None)
        .unwrap()
        .unwrap();
    // One real token plus three speculative ones, of which two are rejected.
    pool.allocate_slots(&1, &[4], 4, 0, None, None)
        .unwrap()
        .unwrap();
    pool.rewind_computed_tokens(&1, 2).unwrap();
    assert_eq!(pool.num_computed_tokens(&1), Some(6));
    assert!(
        pool.rewind_computed_tokens(&1, 3).is_err(),
        "cannot rewind into cached blocks"
    );
    pool.check_invariants().unwrap();
}

#[test]
fn reset_prefix_cache_only_when_idle() {
    let mut pool = BlockPool::<u64>::new(4, 2, true).unwrap();
    pool.allocate_slots(&1, &tokens(0..4), 4, 0, None, None)
        .unwrap()
        .unwrap();
    assert!(!pool.reset_prefix_cache());
    pool.free(&1).unwrap();
    assert!(pool.reset_prefix_cache());
    assert_eq!(pool.num_cached_blocks(), 0);
    assert_eq!(
        pool.get_computed_blocks(&tokens(0..4), None)
            .num_computed_tokens,
        0
    );
    pool.check_invariants().unwrap();
}

#[test]
fn caching_off_hashes_nothing() {
    let mut pool = BlockPool::<u64>::new(4, 2, false).unwrap();
    pool.allocate_slots(&1, &tokens(0..4), 4, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&1).unwrap();
    assert_eq!(
        pool.get_computed_blocks(&tokens(0..4), None)
            .num_computed_tokens,
        0
    );
    assert_eq!(pool.num_cached_blocks(), 0);
    assert_eq!(pool.stats().num_lookups, 0);
}

#[derive(Debug, Clone)]
enum Op {
    Admit {
        id: u64,
        prompt: u32,
        len: usize,
        chunk: usize,
        asynchronous: bool,
    },
    Step {
        id: u64,
        tokens: usize,
        lookahead: usize,
    },
    Free {
        id: u64,
    },
    CacheLoaded {
        id: u64,
    },
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..6, 0u32..3, 1usize..20, 1usize..20, any::<bool>()).prop_map(
            |(id, prompt, len, chunk, asynchronous)| Op::Admit {
                id,
                prompt,
                len,
                chunk,
                asynchronous,
            }
        ),
        4 => (0u64..6, 1usize..6, 0usize..3).prop_map(|(id, tokens, lookahead)| Op::Step {
            id,
            tokens,
            lookahead
        }),
        3 => (0u64..6).prop_map(|id| Op::Free { id }),
        1 => (0u64..6).prop_map(|id| Op::CacheLoaded { id }),
        1 => Just(Op::Reset),
    ]
}

/// Admits a request with a prefix shared by its `prompt` group. An asynchronous admission
/// with a host hit loads it with `allocate_slots_external`; otherwise the host hit is
/// loaded synchronously along with a chunk of the rest.
fn admit(
    pool: &mut BlockPool<u64>,
    id: u64,
    prompt: u32,
    len: usize,
    chunk: usize,
    asynchronous: bool,
) {
    if pool.block_ids(&id).is_some() {
        return;
    }
    let ids: Vec<TokenId> = (0..len as u32).map(|t| prompt * 100 + t).collect();
    let hit = pool.get_computed_blocks(&ids, None);
    let num_hit = hit.num_computed_tokens + hit.num_host_tokens();
    assert!(num_hit < len, "a hit never covers the whole prompt");
    let before = pool.stats().num_loaded_blocks;
    let loaded = if asynchronous && hit.num_host_blocks > 0 {
        pool.allocate_slots_external(&id, &ids, 0, Some(&hit), None)
            .unwrap()
    } else {
        let n = chunk.min(len - num_hit);
        pool.allocate_slots_counted(&id, &ids, n, 0, Some(&hit), None)
            .unwrap()
    };
    let expected = if loaded.is_some() {
        hit.num_host_blocks
    } else {
        0
    };
    assert_eq!(pool.stats().num_loaded_blocks - before, expected as u64);
}

proptest! {
    #[test]
    fn blocks_are_conserved_under_random_operations(
        ops in prop::collection::vec(op(), 1..120),
        block_size in 1usize..5,
        caching in any::<bool>(),
        host_num_blocks in 0usize..6,
    ) {
        let mut pool = BlockPool::<u64>::new(12, block_size, caching).unwrap();
        if caching && host_num_blocks > 0 {
            pool = pool.with_host_tier(host_num_blocks).unwrap();
        }
        pool.enable_events();
        let mut host_from_events = std::collections::HashSet::new();
        let mut num_host_stored = 0u64;
        let mut next_token = 1000u32;
        for op in ops {
            match op {
                Op::Admit { id, prompt, len, chunk, asynchronous } => {
                    admit(&mut pool, id, prompt, len, chunk, asynchronous);
                }
                Op::Step { id, tokens, lookahead } => {
                    if pool.num_computed_tokens(&id).is_none() { continue; }
                    let new: Vec<TokenId> = (0..tokens as u32).map(|i| next_token + i).collect();
                    next_token += tokens as u32;
                    let _ = pool.allocate_slots(&id, &new, tokens, lookahead, None, None).unwrap();
                }
                Op::Free { id } => {
                    let held = pool.block_ids(&id).is_some();
                    prop_assert_eq!(pool.free(&id).is_ok(), held);
                }
                Op::CacheLoaded { id } => {
                    let held = pool.block_ids(&id).is_some();
                    prop_assert_eq!(pool.cache_loaded_blocks(&id).is_ok(), held);
                }
                Op::Reset => {
                    prop_assert_eq!(pool.reset_prefix_cache(), pool.num_requests() == 0);
                }
            }
            prop_assert!(pool.check_invariants().is_ok(), "{:?}", pool.check_invariants());
            prop_assert!(pool.num_free_blocks() <= pool.num_total_blocks());
            // The host events replay to exactly the tier's contents.
            for event in pool.drain_events() {
                match event {
                    KvEvent::HostStored(h) => {
                        prop_assert!(host_from_events.insert(h), "stored twice");
                        num_host_stored += 1;
                    }
                    KvEvent::HostRemoved(h) => prop_assert!(host_from_events.remove(&h)),
                    KvEvent::AllCleared => host_from_events.clear(),
                    KvEvent::Stored(_) | KvEvent::Removed(_) => {}
                }
            }
            let tier: std::collections::HashSet<_> =
                pool.host_tier().into_iter().flat_map(HostTier::iter_lru).collect();
            prop_assert_eq!(&tier, &host_from_events);
            prop_assert!(tier.len() <= host_num_blocks);
            prop_assert_eq!(pool.stats().num_offloaded_blocks, num_host_stored);
        }
    }
}

#[test]
fn cache_events_report_stored_and_evicted_blocks_when_enabled() {
    let mut pool = BlockPool::new(3, 4, true).unwrap();
    pool.allocate_slots(&1u64, &tokens(0..8), 8, 0, None, None)
        .unwrap()
        .unwrap();
    assert!(pool.drain_events().is_empty(), "off by default");
    pool.free(&1).unwrap();
    pool.enable_events();
    // Request 2 takes all three blocks; the two cached ones are evicted (oldest first).
    pool.allocate_slots(&2u64, &tokens(100..112), 12, 0, None, None)
        .unwrap()
        .unwrap();
    let events = pool.drain_events();
    let removed = events
        .iter()
        .filter(|e| matches!(e, KvEvent::Removed(_)))
        .count();
    let stored = events
        .iter()
        .filter(|e| matches!(e, KvEvent::Stored(_)))
        .count();
    assert_eq!((removed, stored), (2, 3));
    assert!(pool.drain_events().is_empty(), "drained");
}

#[test]
fn loaded_blocks_count_as_computed_but_are_cached_only_once_they_land() {
    let mut pool = BlockPool::new(8, 4, true).unwrap();
    let prompt = tokens(0..10);
    let hit = pool.get_computed_blocks(&prompt, None);
    // 9 tokens loaded from outside (a P/D transfer), the last one computed later.
    let n = pool
        .allocate_slots_external(&1u64, &prompt, 9, Some(&hit), None)
        .unwrap();
    assert_eq!(n, Some(3));
    assert_eq!(pool.num_computed_tokens(&1), Some(9));
    assert_eq!(pool.num_cached_blocks(), 0, "the data has not landed");
    let other = pool.get_computed_blocks(&prompt, None);
    assert_eq!(
        other.num_computed_tokens, 0,
        "a block still loading is not found"
    );
    pool.cache_loaded_blocks(&1).unwrap();
    assert_eq!(pool.num_cached_blocks(), 2);
    assert_eq!(
        pool.get_computed_blocks(&prompt, None).num_computed_tokens,
        8
    );
    // The request goes on: its last prompt token computes in its own slot.
    pool.allocate_slots(&1u64, &[], 1, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(pool.num_computed_tokens(&1), Some(10));
    pool.check_invariants().unwrap();
}

#[test]
fn an_external_load_that_does_not_fit_changes_nothing_and_is_refused_after_admission() {
    let mut pool = BlockPool::new(2, 4, true).unwrap();
    let prompt = tokens(0..12);
    assert_eq!(
        pool.allocate_slots_external(&1u64, &prompt, 11, None, None)
            .unwrap(),
        None
    );
    assert_eq!(pool.num_free_blocks(), 2);
    assert!(pool.block_ids(&1).is_none());
    assert!(
        pool.allocate_slots_external(&1u64, &prompt, 13, None, None)
            .is_err(),
        "more tokens than the request has"
    );
    pool.allocate_slots(&2u64, &tokens(0..4), 4, 0, None, None)
        .unwrap()
        .unwrap();
    assert!(
        pool.allocate_slots_external(&2u64, &tokens(4..8), 4, None, None)
            .is_err(),
        "only a first allocation loads"
    );
    // Freed before landing: the loaded blocks were never cached, so they are reused first.
    let mut pool = BlockPool::new(4, 4, true).unwrap();
    pool.allocate_slots_external(&3u64, &tokens(0..9), 8, None, None)
        .unwrap()
        .unwrap();
    pool.free(&3).unwrap();
    assert_eq!(pool.num_cached_blocks(), 0);
    pool.check_invariants().unwrap();
}

/// vLLM's tests force `FreeKVCacheBlockQueue.num_free_blocks`: the fit checks read the
/// forced count, which then moves with the queue (a free adds what it frees), and the queue
/// keeps its blocks in order, so once the count is back a request gets the blocks an
/// unforced pool hands out.
#[test]
fn a_forced_free_count_fails_allocations_moves_with_the_queue_and_keeps_its_order() {
    let mut pool = BlockPool::new(8, 4, true).unwrap();
    pool.allocate_slots(&1u64, &tokens(0..10), 10, 0, None, None)
        .unwrap()
        .unwrap();
    let mut twin = pool.clone();
    let order = pool.free_block_ids();
    let err = pool.force_num_free_blocks(6).unwrap_err();
    assert!(err.to_string().contains("num_free_blocks"), "{err}");
    pool.force_num_free_blocks(0).unwrap();
    assert_eq!((pool.num_free_blocks(), pool.usage()), (0, 1.0));
    assert_eq!(pool.free_block_ids(), order);
    let refused = pool.allocate_slots(&2u64, &tokens(100..104), 4, 0, None, None);
    assert_eq!(refused.unwrap(), None);
    crate::kv::PrefixPool::free(&mut pool, &1u64).unwrap();
    crate::kv::PrefixPool::free(&mut twin, &1u64).unwrap();
    assert_eq!(pool.num_free_blocks(), 3, "the 3 freed blocks count again");
    assert_eq!(pool.free_block_ids(), twin.free_block_ids());
    pool.force_num_free_blocks(8).unwrap();
    let got = pool.allocate_slots(&2u64, &tokens(100..104), 4, 0, None, None);
    let want = twin.allocate_slots(&2u64, &tokens(100..104), 4, 0, None, None);
    assert_eq!(got.unwrap(), want.unwrap());
    assert_eq!(pool.num_free_blocks(), twin.num_free_blocks());
    pool.check_invariants().unwrap();
}
