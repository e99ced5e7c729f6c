use super::*;
use proptest::prelude::*;

fn values(range: std::ops::Range<i64>) -> Vec<i64> {
    range.collect()
}

#[test]
fn insert_reports_the_already_cached_prefix_and_match_finds_it() {
    let mut cache = RadixCache::new(1).unwrap();
    assert_eq!(cache.insert(&[1, 2, 3], &values(10..13)).unwrap(), 0);
    assert_eq!(cache.insert(&[1, 2, 4, 5], &values(20..24)).unwrap(), 2);
    assert_eq!(
        cache.num_nodes(),
        3,
        "split into [1,2] with children [3] and [4,5]"
    );
    let m = cache.match_prefix(&[1, 2, 4, 9]);
    assert_eq!(m.matched_len, 3);
    // Values of the shared part come from the first insert.
    assert_eq!(m.values, [10, 11, 22]);
    assert_eq!(cache.total_size(), 5);
    assert_eq!(
        cache.num_nodes(),
        4,
        "the match ended inside [4,5] and split it"
    );
    cache.check_invariants().unwrap();
}

#[test]
fn match_inside_an_edge_splits_it() {
    let mut cache = RadixCache::new(1).unwrap();
    cache.insert(&[1, 2, 3, 4], &values(0..4)).unwrap();
    let m = cache.match_prefix(&[1, 2, 7]);
    assert_eq!(
        (m.matched_len, m.values.as_slice()),
        (2, [0i64, 1].as_slice())
    );
    assert_eq!(cache.num_nodes(), 2);
    cache.lock(m.handle).unwrap();
    assert_eq!((cache.protected_size(), cache.evictable_size()), (2, 2));
    cache.check_invariants().unwrap();
}

#[test]
fn pages_align_keys_and_matches() {
    let mut cache = RadixCache::new(2).unwrap();
    assert!(cache.insert(&[1, 2, 3], &values(0..3)).is_err());
    cache.insert(&[1, 2, 3, 4], &values(0..4)).unwrap();
    // Diverges inside the second page: only the first page matches.
    let m = cache.match_prefix(&[1, 2, 3, 9, 5]);
    assert_eq!(m.matched_len, 2);
    // A query of odd length is truncated to whole pages.
    assert_eq!(cache.match_prefix(&[1, 2, 3]).matched_len, 2);
    assert_eq!(cache.insert(&[1, 2, 3, 5], &values(10..14)).unwrap(), 2);
    cache.check_invariants().unwrap();
}

#[test]
fn evict_takes_least_recently_used_leaves_and_cascades_to_parents() {
    let mut cache = RadixCache::new(1).unwrap();
    cache.insert(&[1, 2, 3], &values(0..3)).unwrap();
    cache.insert(&[1, 2, 4], &values(10..13)).unwrap();
    cache.insert(&[5], &values(20..21)).unwrap();
    cache.match_prefix(&[1, 2, 3]);
    // LRU leaf is [4] (value 12), then [5], then [3] and finally its parent [1, 2].
    assert_eq!(cache.evict(1), [12]);
    assert_eq!(cache.evict(1), [20]);
    assert_eq!(cache.evict(3), [2, 0, 1]);
    assert_eq!(cache.total_size(), 0);
    cache.check_invariants().unwrap();
}

#[test]
fn locked_paths_survive_eviction_until_unlocked() {
    let mut cache = RadixCache::new(1).unwrap();
    cache.insert(&[1, 2, 3], &values(0..3)).unwrap();
    cache.insert(&[1, 9], &values(5..7)).unwrap();
    let m = cache.match_prefix(&[1, 2, 3]);
    cache.lock(m.handle).unwrap();
    assert_eq!(cache.evict(100), [6], "only the unlocked leaf [9] goes");
    assert_eq!((cache.protected_size(), cache.evictable_size()), (3, 0));
    cache.unlock(m.handle).unwrap();
    assert!(
        cache.unlock(m.handle).is_err(),
        "unlock without a matching lock"
    );
    assert_eq!(cache.evict(100).len(), 3);
    assert!(
        cache.lock(m.handle).is_err(),
        "handle went stale with its node"
    );
    cache.check_invariants().unwrap();
}

#[test]
fn values_must_match_tokens_and_page_size_must_be_positive() {
    let mut cache = RadixCache::new(1).unwrap();
    assert!(cache.insert(&[1, 2], &values(0..3)).is_err());
    assert_eq!(cache.total_size(), 0);
    assert!(RadixCache::new(0).is_err());
}

#[test]
fn reset_drops_everything_and_stales_handles() {
    let mut cache = RadixCache::new(1).unwrap();
    cache.insert(&[1, 2], &values(0..2)).unwrap();
    let m = cache.match_prefix(&[1, 2]);
    cache.lock(m.handle).unwrap();
    cache.reset();
    assert_eq!(cache.total_size(), 0);
    assert!(cache.lock(m.handle).is_err());
    cache.insert(&[1, 2], &values(0..2)).unwrap();
    cache.check_invariants().unwrap();
}

// SGLang 0.5.23 (`RadixCache._match_prefix_helper` / `_insert_helper`) sets the access time
// of an edge a walk ends inside *before* `_split_node`, so the unmatched remainder counts as
// just used and the new parent (a fresh `TreeNode`) as used right after; the core follows it
// (issue 15). Each test failed with the earlier split-first order its comment gives.

#[test]
fn a_match_inside_an_edge_refreshes_the_remainder_too() {
    let mut cache = RadixCache::new(1).unwrap();
    cache.insert(&[1, 2, 3], &values(0..3)).unwrap();
    cache.insert(&[9], &[9]).unwrap();
    // Ends inside [1, 2, 3]: the remainder [3] is refreshed with the matched part.
    assert_eq!(cache.match_prefix(&[1, 2]).matched_len, 2);
    // So [9], untouched since its insert, is the least recently used leaf, not [3].
    assert_eq!(cache.evict(1), [9]);
    assert_eq!(cache.evict(1), [2]);
    assert_eq!(cache.evict(2), [0, 1]);
    cache.check_invariants().unwrap();
}

#[test]
fn the_split_parent_is_newer_than_the_remainder_and_older_than_later_leaves() {
    let mut cache = RadixCache::new(1).unwrap();
    cache.insert(&[1, 2, 3], &values(0..3)).unwrap();
    cache.insert(&[9], &[9]).unwrap();
    cache.match_prefix(&[1, 2]);
    cache.insert(&[5], &[5]).unwrap();
    // Times: [9] < remainder [3] < its new parent [1, 2] < [5]. The parent becomes a leaf
    // once [3] goes and is evicted before [5]. (Splitting first gives [2, 9, 0, 1, 5].)
    assert_eq!(cache.evict(5), [9, 2, 0, 1, 5]);
    cache.check_invariants().unwrap();
}

#[test]
fn an_insert_ending_inside_an_edge_refreshes_the_remainder() {
    let mut cache = RadixCache::new(1).unwrap();
    cache.insert(&[1, 2, 3, 4], &values(10..14)).unwrap();
    cache.insert(&[7], &[20]).unwrap();
    // [1, 2] is already cached inside [1, 2, 3, 4]: the edge splits, nothing is added.
    assert_eq!(cache.insert(&[1, 2], &[30, 31]).unwrap(), 2);
    assert_eq!(cache.num_nodes(), 3);
    // The remainder [3, 4] was refreshed by the insert, so [7] goes first (splitting first
    // leaves [3, 4] older: values [12, 13] would go).
    assert_eq!(cache.evict(1), [20]);
    assert_eq!(cache.evict(4), [12, 13, 10, 11]);
    cache.check_invariants().unwrap();
}

#[test]
fn an_insert_diverging_inside_an_edge_orders_remainder_before_new_leaf() {
    let mut cache = RadixCache::new(1).unwrap();
    cache.insert(&[1, 2, 3], &values(0..3)).unwrap();
    cache.insert(&[9], &[9]).unwrap();
    assert_eq!(cache.insert(&[1, 2, 4], &values(20..23)).unwrap(), 2);
    // [9] < remainder [3] (refreshed, then split) < new leaf [4] (created after the split).
    // (Splitting first evicts [3] before [9]: [2, 9, 22, 0, 1].)
    assert_eq!(cache.evict(5), [9, 2, 22, 0, 1]);
    cache.check_invariants().unwrap();
}

#[test]
fn pages_refresh_the_remainder_the_same_way() {
    let mut cache = RadixCache::new(2).unwrap();
    cache.insert(&[1, 1, 2, 2, 3, 3], &values(0..6)).unwrap();
    cache.insert(&[9, 9], &[90, 91]).unwrap();
    // Diverges inside the second page: matches the first page only, splitting after it. The
    // remainder [2, 2, 3, 3] is refreshed, so [9, 9] goes first (splitting first: [2, 3, 4, 5]).
    assert_eq!(cache.match_prefix(&[1, 1, 2, 7]).matched_len, 2);
    assert_eq!(cache.evict(2), [90, 91]);
    assert_eq!(cache.evict(6), [2, 3, 4, 5, 0, 1]);
    cache.check_invariants().unwrap();
}

#[test]
fn a_locked_remainder_keeps_its_refreshed_time_when_unlocked() {
    let mut cache = RadixCache::new(1).unwrap();
    cache.insert(&[1, 2, 3], &values(0..3)).unwrap();
    let whole = cache.match_prefix(&[1, 2, 3]);
    cache.lock(whole.handle).unwrap();
    cache.insert(&[9], &[9]).unwrap();
    // Splits the locked edge; the remainder [3] (still locked) is refreshed with it.
    cache.match_prefix(&[1, 2]);
    cache.unlock(whole.handle).unwrap();
    // Back in the LRU with that time, it outlives [9] (splitting first: [3] goes, value 2).
    assert_eq!(cache.evict(1), [9]);
    cache.check_invariants().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<TokenId>),
    Match { tokens: Vec<TokenId>, lock: bool },
    Unlock(usize),
    Evict(usize),
}

fn key(page_size: usize) -> impl Strategy<Value = Vec<TokenId>> {
    // A small alphabet so keys share prefixes and splits happen.
    prop::collection::vec(0u32..3, 0..5).prop_map(move |pages| {
        pages
            .iter()
            .flat_map(|&p| (0..page_size as u32).map(move |i| p * 10 + i % 2))
            .collect()
    })
}

fn op(page_size: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        key(page_size).prop_map(Op::Insert),
        (key(page_size), any::<bool>()).prop_map(|(tokens, lock)| Op::Match { tokens, lock }),
        (0usize..8).prop_map(Op::Unlock),
        (0usize..10).prop_map(Op::Evict),
    ]
}

proptest! {
    #[test]
    fn sizes_add_up_and_locked_values_are_never_evicted(
        (page_size, ops) in (1usize..4).prop_flat_map(|ps| (Just(ps), prop::collection::vec(op(ps), 1..80)))
    ) {
        let mut cache = RadixCache::new(page_size).unwrap();
        let mut locked: Vec<(NodeHandle, Vec<i64>)> = Vec::new();
        let mut next_value = 0i64;
        for op in ops {
            match op {
                Op::Insert(tokens) => {
                    let vals: Vec<i64> = (next_value..next_value + tokens.len() as i64).collect();
                    next_value += tokens.len() as i64;
                    let before = cache.total_size();
                    let cached = cache.insert(&tokens, &vals).unwrap();
                    prop_assert_eq!(cache.total_size(), before + tokens.len() - cached);
                }
                Op::Match { tokens, lock } => {
                    let m = cache.match_prefix(&tokens);
                    prop_assert_eq!(m.matched_len % page_size, 0);
                    prop_assert_eq!(m.values.len(), m.matched_len);
                    if lock {
                        cache.lock(m.handle).unwrap();
                        locked.push((m.handle, m.values));
                    }
                }
                Op::Unlock(i) => {
                    if !locked.is_empty() {
                        let (handle, _) = locked.remove(i % locked.len());
                        cache.unlock(handle).unwrap();
                    }
                }
                Op::Evict(n) => {
                    let before = cache.evictable_size();
                    let freed = cache.evict(n);
                    prop_assert_eq!(cache.evictable_size(), before - freed.len());
                    for (_, vals) in &locked {
                        prop_assert!(vals.iter().all(|v| !freed.contains(v)), "a locked value was evicted");
                    }
                }
            }
            prop_assert!(cache.check_invariants().is_ok(), "{:?}", cache.check_invariants());
        }
    }
}
