//! The block pool's host tier (`host_num_blocks`): offloads, lookups continuing into it,
//! its events (split from `block_pool_tests.rs`).

use super::tests::tokens;
use super::*;

/// Hashes of the full blocks of `ids`, as the pool computes them.
fn hashes(ids: &[TokenId], block_size: usize) -> Vec<BlockHash> {
    let mut out = Vec::new();
    crate::kv::hash_full_blocks(&mut out, ids, block_size, None);
    out
}

fn host_lru(pool: &BlockPool<u64>) -> Vec<BlockHash> {
    pool.host_tier().unwrap().iter_lru().collect()
}

/// Pool of 4 blocks of 4 tokens with a host tier of 8. Request 1 computes a 9-token prompt
/// (blocks 0, 1 full and cached, block 2 partial) and is freed: the queue is [2, 3, 1, 0].
/// Request 2's 16 fresh tokens take all four blocks, evicting the prompt's hashes (block 1's
/// then block 0's) into the tier; freed, its blocks queue as [0, 1, 3, 2], all cached.
fn prompt_evicted_to_host() -> BlockPool<u64> {
    let mut pool = BlockPool::new(4, 4, true)
        .unwrap()
        .with_host_tier(8)
        .unwrap();
    pool.allocate_slots(&1, &tokens(0..9), 9, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&1).unwrap();
    pool.enable_events();
    pool.allocate_slots(&2, &tokens(100..116), 16, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&2).unwrap();
    assert_eq!(pool.free_block_ids(), [0, 1, 3, 2]);
    pool
}

#[test]
fn evicted_blocks_are_offloaded_and_a_lookup_continues_into_the_host_tier() {
    let mut pool = prompt_evicted_to_host();
    let [h0, h1] = hashes(&tokens(0..8), 4)[..] else {
        unreachable!()
    };
    let g = hashes(&tokens(100..116), 4);
    assert_eq!(
        pool.drain_events(),
        [
            KvEvent::Removed(h1),
            KvEvent::HostStored(h1),
            KvEvent::Removed(h0),
            KvEvent::HostStored(h0),
            KvEvent::Stored(g[0]),
            KvEvent::Stored(g[1]),
            KvEvent::Stored(g[2]),
            KvEvent::Stored(g[3]),
        ]
    );
    assert_eq!(host_lru(&pool), [h1, h0]);
    let hit = pool.get_computed_blocks(&tokens(0..9), None);
    assert_eq!(
        (
            hit.num_computed_tokens,
            hit.num_host_blocks,
            hit.num_host_tokens()
        ),
        (0, 2, 8)
    );
    assert_eq!(host_lru(&pool), [h1, h0], "a lookup is not a use");
    let stats = pool.stats();
    assert_eq!(
        (
            stats.num_hit_tokens,
            stats.num_host_hit_tokens,
            stats.num_offloaded_blocks
        ),
        (0, 8, 2)
    );
    assert_eq!(
        pool.get_computed_blocks(&tokens(0..8), None)
            .num_host_blocks,
        1,
        "GPU and host hits together never cover the whole prompt"
    );
}

#[test]
fn a_synchronous_load_takes_fresh_blocks_and_caches_them_at_once() {
    let mut pool = prompt_evicted_to_host();
    let [h0, h1] = hashes(&tokens(0..8), 4)[..] else {
        unreachable!()
    };
    let g = hashes(&tokens(100..116), 4);
    let hit = pool.get_computed_blocks(&tokens(0..9), None);
    // 8 loaded tokens + 1 computed = 3 blocks, from the front of [0, 1, 3, 2]: blocks 0 and
    // 1 receive the loaded prefix, block 3 the last token.
    let new = pool
        .allocate_slots(&3, &tokens(0..9), 1, 0, Some(&hit), None)
        .unwrap()
        .unwrap();
    assert_eq!(new, [0, 1, 3]);
    assert_eq!(pool.num_computed_tokens(&3), Some(9));
    // The loaded entries were touched, then request 2's evicted hashes were offloaded.
    assert_eq!(host_lru(&pool), [h0, h1, g[3], g[2], g[1]]);
    let stats = pool.stats();
    assert_eq!(
        (stats.num_loaded_blocks, stats.num_offloaded_blocks),
        (2, 5)
    );
    let again = pool.get_computed_blocks(&tokens(0..9), None);
    assert_eq!(
        (again.block_ids.as_slice(), again.num_host_blocks),
        ([0u32, 1].as_slice(), 0),
        "both loaded hashes are registered in the prefix cache"
    );
    pool.check_invariants().unwrap();
}

#[test]
fn an_asynchronous_load_is_cached_only_once_it_lands() {
    let mut pool = prompt_evicted_to_host();
    let hit = pool.get_computed_blocks(&tokens(0..9), None);
    assert_eq!(
        pool.allocate_slots_external(&3, &tokens(0..9), 0, Some(&hit), None)
            .unwrap(),
        Some(2)
    );
    assert_eq!(pool.block_ids(&3).unwrap(), [0, 1]);
    assert_eq!(pool.num_computed_tokens(&3), Some(8));
    assert_eq!(pool.stats().num_loaded_blocks, 2);
    let during = pool.get_computed_blocks(&tokens(0..9), None);
    assert_eq!(
        (during.num_computed_tokens, during.num_host_blocks),
        (0, 2),
        "still loading: found only in the host tier"
    );
    pool.cache_loaded_blocks(&3).unwrap();
    assert_eq!(
        pool.get_computed_blocks(&tokens(0..9), None)
            .num_computed_tokens,
        8
    );
    pool.allocate_slots(&3, &[], 1, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(pool.num_computed_tokens(&3), Some(9));
    assert!(
        matches!(
            pool.allocate_slots_external(&4, &tokens(0..9), 0, None, None),
            Err(Error::Input { .. })
        ),
        "nothing to load"
    );
    pool.check_invariants().unwrap();
}

#[test]
fn a_host_hit_evicted_from_the_tier_since_the_lookup_is_stale() {
    let mut pool = BlockPool::new(4, 4, true)
        .unwrap()
        .with_host_tier(2)
        .unwrap();
    pool.allocate_slots(&1u64, &tokens(0..9), 9, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&1).unwrap();
    pool.allocate_slots(&2, &tokens(100..116), 16, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&2).unwrap();
    let hit = pool.get_computed_blocks(&tokens(0..9), None);
    assert_eq!(hit.num_host_blocks, 2);
    // Two more evictions fill the tier of 2 with request 2's hashes.
    pool.allocate_slots(&4, &tokens(200..208), 8, 0, None, None)
        .unwrap()
        .unwrap();
    let err = pool
        .allocate_slots(&3, &tokens(0..9), 1, 0, Some(&hit), None)
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Input { arg: "new_computed_blocks", reason, .. } if reason.contains("stale")
        ),
        "{err}"
    );
    assert_eq!(
        (pool.num_requests(), pool.stats().num_loaded_blocks),
        (1, 0)
    );
    pool.check_invariants().unwrap();
}

#[test]
fn the_fit_check_counts_host_hit_blocks_as_new_blocks() {
    // Pool of 6 blocks of 2: request 1's prompt 0..9 hashes p0..p3 on blocks 0..3.
    let mut pool = BlockPool::new(6, 2, true)
        .unwrap()
        .with_host_tier(8)
        .unwrap();
    let prompt = tokens(0..9);
    let p = hashes(&prompt, 2);
    pool.allocate_slots(&1u64, &prompt, 9, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&1).unwrap();
    // Request 2 takes blocks 4, 5, 3, 2: the prompt's tail blocks p3, p2 go to the tier.
    pool.allocate_slots(&2, &tokens(100..108), 8, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(host_lru(&pool), [p[3], p[2]]);
    let hit = pool.get_computed_blocks(&prompt, None);
    assert_eq!(
        (hit.block_ids.as_slice(), hit.num_host_blocks),
        ([0u32, 1].as_slice(), 2)
    );
    // 2 shared + 2 loaded + 1 computed = 5 blocks; only the 2 hit blocks are free.
    assert_eq!(
        pool.allocate_slots(&3, &prompt, 1, 0, Some(&hit), None)
            .unwrap(),
        None
    );
    assert_eq!(
        (pool.stats().num_loaded_blocks, host_lru(&pool)),
        (0, vec![p[3], p[2]]),
        "a load that does not fit changes nothing"
    );
    pool.free(&2).unwrap();
    let new = pool
        .allocate_slots(&3, &prompt, 1, 0, Some(&hit), None)
        .unwrap()
        .unwrap();
    assert_eq!(new.len(), 3);
    assert_eq!(pool.get_computed_blocks(&prompt, None).block_ids.len(), 4);
    pool.check_invariants().unwrap();
}

#[test]
fn host_events_report_entries_and_evictions_but_not_refreshes() {
    // Pool of 2 blocks of 2, tier of 4.
    let mut pool = BlockPool::new(2, 2, true)
        .unwrap()
        .with_host_tier(4)
        .unwrap();
    let [a0, a1] = hashes(&tokens(0..4), 2)[..] else {
        unreachable!()
    };
    pool.allocate_slots(&1u64, &tokens(0..4), 4, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&1).unwrap();
    pool.allocate_slots(&2, &tokens(100..104), 4, 0, None, None)
        .unwrap()
        .unwrap();
    pool.free(&2).unwrap();
    // Request 3 loads a0 back (taking block 0) and computes one token in block 1.
    let hit = pool.get_computed_blocks(&tokens(0..3), None);
    assert_eq!(hit.num_host_blocks, 1);
    pool.allocate_slots(&3, &tokens(0..3), 1, 0, Some(&hit), None)
        .unwrap()
        .unwrap();
    let [b0, b1] = hashes(&tokens(100..104), 2)[..] else {
        unreachable!()
    };
    assert_eq!(host_lru(&pool), [a1, a0, b1, b0], "the tier is full");
    pool.free(&3).unwrap();
    pool.enable_events();
    // a0 is evicted from the GPU again: its host copy is only refreshed.
    pool.allocate_slots(&4, &tokens(200..204), 4, 0, None, None)
        .unwrap()
        .unwrap();
    let c = hashes(&tokens(200..204), 2);
    assert_eq!(
        pool.drain_events(),
        [
            KvEvent::Removed(a0),
            KvEvent::Stored(c[0]),
            KvEvent::Stored(c[1])
        ]
    );
    assert_eq!(host_lru(&pool), [a1, b1, b0, a0]);
    pool.free(&4).unwrap();
    // c1 enters the full tier: the least recent, a1, leaves first.
    pool.allocate_slots(&5, &tokens(300..301), 1, 0, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(
        pool.drain_events(),
        [
            KvEvent::Removed(c[1]),
            KvEvent::HostRemoved(a1),
            KvEvent::HostStored(c[1])
        ]
    );
    assert_eq!(pool.stats().num_offloaded_blocks, 5);
    pool.free(&5).unwrap();
    assert!(pool.reset_prefix_cache());
    assert_eq!(pool.drain_events(), [KvEvent::AllCleared]);
    assert_eq!(
        pool.host_tier().unwrap().len(),
        0,
        "the reset clears the tier"
    );
    assert_eq!(
        pool.get_computed_blocks(&tokens(0..3), None)
            .num_host_blocks,
        0
    );
    pool.check_invariants().unwrap();
}

#[test]
fn a_host_tier_needs_caching_and_a_size() {
    for pool in [
        BlockPool::<u64>::new(4, 2, false)
            .unwrap()
            .with_host_tier(4),
        BlockPool::<u64>::new(4, 2, true).unwrap().with_host_tier(0),
    ] {
        assert!(matches!(
            pool,
            Err(Error::Config {
                field: "host_num_blocks",
                ..
            })
        ));
    }
}
