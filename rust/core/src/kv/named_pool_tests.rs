//! Behaviours of the prefix cache keyed per trace block (`named_cache`) through the block
//! pool, with hand-checked numbers: a trace block's KV blocks evicted tail first and the
//! rest still hit, copies of a named hash served in vLLM's order, a reset, and the index
//! taking over from the per-block map. Each scenario runs on the pool as the simulator
//! builds it and on the per-block reference (`with_per_block_map`), which must agree.

use super::block_hash::{BlockHash, content_block, hash_content};
use super::{BlockId, KvCapacity, KvEvent, RunBlockPool, TokenId};

type Pool = RunBlockPool<u32>;

/// The KV-block names of trace block `id` (after `parent`), `n` places.
fn names(parent: Option<BlockHash>, id: u64, n: u32) -> Vec<BlockHash> {
    let seed = hash_content(parent, id, None);
    (0..n).map(|place| content_block(seed, place)).collect()
}

/// Admits `id` with prompt `tokens` whose first blocks are `named`; returns its blocks and
/// its hit's block ids.
fn admit(pool: &mut Pool, id: u32, tokens: &[TokenId], named: &[BlockHash]) -> [Vec<BlockId>; 2] {
    let hit = pool.get_computed_blocks_from(tokens, None, named.to_vec(), usize::MAX);
    let num_new = tokens.len() - hit.num_computed_tokens;
    let blocks = (pool.allocate_slots(&id, tokens, num_new, 0, Some(&hit), None))
        .unwrap()
        .expect("fits");
    [blocks, hit.block_ids]
}

fn hit_of(pool: &mut Pool, tokens: &[TokenId], named: &[BlockHash]) -> Vec<BlockId> {
    (pool.get_computed_blocks_from(tokens, None, named.to_vec(), usize::MAX)).block_ids
}

/// Runs `scenario` on both pools (built by `build`) and requires equal reports and equal
/// block states; returns the named pool's report.
fn on_both<T: PartialEq + std::fmt::Debug>(
    build: impl Fn() -> Pool,
    scenario: impl Fn(&mut Pool) -> T,
) -> T {
    let mut named = build();
    let mut reference = build().with_per_block_map();
    let (a, b) = (scenario(&mut named), scenario(&mut reference));
    assert_eq!(a, b, "the named index and the per-block map disagree");
    let states = |p: &Pool| {
        let n = p.num_total_blocks() as BlockId;
        let blocks: Vec<_> = (0..n).map(|b| (p.ref_count(b), p.block_hash(b))).collect();
        (blocks, p.free_block_ids(), p.num_cached_blocks())
    };
    assert_eq!(states(&named), states(&reference));
    named.check_invariants().unwrap();
    a
}

#[test]
fn a_trace_blocks_tail_is_evicted_first_and_its_head_still_hits() {
    // Blocks of 2 tokens, trace blocks of 4 KV blocks (8 tokens).
    let prompt: Vec<TokenId> = [vec![0; 8], vec![1]].concat();
    let named = names(None, 7, 4);
    let report = on_both(
        || {
            let mut pool = Pool::over_runs(8, 2, true).unwrap();
            pool.enable_events();
            pool
        },
        |pool| {
            let [blocks, _] = admit(pool, 1, &prompt, &named);
            assert_eq!(blocks, [0, 1, 2, 3, 4]);
            let stored = pool.drain_events();
            pool.free(&1).unwrap();
            // The uncached tail block first, then the trace block's blocks tail first.
            assert_eq!(pool.free_block_ids(), [4, 5, 6, 7, 3, 2, 1, 0]);
            // Eleven other tokens take 6 blocks: places 3 and 2 are evicted.
            let other: Vec<TokenId> = (100..111).collect();
            let [blocks, _] = admit(pool, 2, &other, &[]);
            assert_eq!(blocks, [4, 5, 6, 7, 3, 2]);
            let events = pool.drain_events();
            assert_eq!(
                events[..2],
                [KvEvent::Removed(named[3]), KvEvent::Removed(named[2])]
            );
            // The prompt again: places 0 and 1 hit.
            let hit = hit_of(pool, &prompt, &named);
            assert_eq!(hit, [0, 1]);
            assert_eq!(pool.cached_block(named[2]), None);
            (stored, events, hit)
        },
    );
    assert_eq!(
        report.0,
        named
            .iter()
            .map(|&h| KvEvent::Stored(h))
            .collect::<Vec<_>>()
    );
}

#[test]
fn one_allocation_evicts_a_trace_block_whole_and_the_next_ones_tail_as_runs() {
    // Blocks of 2 tokens, two trace blocks of 4 KV blocks each, then one token.
    let first = names(None, 3, 4);
    let second = names(first.last().copied(), 4, 4);
    let named = [first.clone(), second.clone()].concat();
    let prompt: Vec<TokenId> = [vec![0; 16], vec![1]].concat();
    on_both(
        || {
            let mut pool = Pool::over_runs(12, 2, true).unwrap();
            pool.enable_events();
            pool
        },
        |pool| {
            let [blocks, _] = admit(pool, 1, &prompt, &named);
            assert_eq!(blocks, (0..9).collect::<Vec<_>>());
            pool.free(&1).unwrap();
            pool.drain_events();
            // The uncached tail block, the never-used blocks, then both trace blocks tail
            // first.
            assert_eq!(
                pool.free_block_ids(),
                [8, 9, 10, 11, 7, 6, 5, 4, 3, 2, 1, 0]
            );
            // Nineteen other tokens take 10 blocks: the second trace block's four places
            // and the first one's places 3 and 2, evicted in one run of taken blocks.
            let other: Vec<TokenId> = (100..119).collect();
            let [blocks, _] = admit(pool, 2, &other, &[]);
            assert_eq!(blocks, [8, 9, 10, 11, 7, 6, 5, 4, 3, 2]);
            let removed: Vec<_> = [3, 2, 1, 0]
                .map(|p| KvEvent::Removed(second[p]))
                .into_iter()
                .chain([3, 2].map(|p| KvEvent::Removed(first[p])))
                .collect();
            assert_eq!(pool.drain_events()[..6], removed[..]);
            assert_eq!(hit_of(pool, &prompt, &named), [0, 1]);
            assert!(named[2..].iter().all(|&h| pool.cached_block(h).is_none()));
            // The head's two places and the other request's 9 full blocks.
            assert_eq!(pool.num_cached_blocks(), 2 + 9);
            // The prompt again, once the other request is done, takes its head from the
            // cache and caches the rest anew, each trace block's places as one run; 6 of
            // the other request's 9 cached blocks make room.
            pool.free(&2).unwrap();
            let [blocks, hit] = admit(pool, 3, &prompt, &named);
            assert_eq!((hit, blocks), (vec![0, 1], vec![2, 3, 4, 5, 6, 7, 11]));
            assert_eq!(pool.num_cached_blocks(), 8 + 3);
            (named.iter().map(|&h| pool.cached_block(h)))
                .collect::<Option<Vec<_>>>()
                .expect("every place cached again")
        },
    );
}

#[test]
fn a_copy_of_a_named_block_serves_once_the_first_is_evicted() {
    let prompt: Vec<TokenId> = [vec![0; 4], vec![9]].concat();
    let named = names(None, 5, 2);
    on_both(
        || Pool::over_runs(12, 2, true).unwrap(),
        |pool| {
            // Both looked up before either cached: both compute the trace block.
            let hits = [1, 2]
                .map(|_| pool.get_computed_blocks_from(&prompt, None, named.clone(), usize::MAX));
            let [a, b] = [(1, &hits[0]), (2, &hits[1])].map(|(id, hit)| {
                (pool.allocate_slots(&id, &prompt, 5, 0, Some(hit), None))
                    .unwrap()
                    .unwrap()
            });
            assert_eq!(
                (a.as_slice(), b.as_slice()),
                (&[0, 1, 2][..], &[3, 4, 5][..])
            );
            assert_eq!(pool.num_cached_blocks(), 4);
            assert_eq!(hit_of(pool, &prompt, &named), [0, 1]);
            pool.free(&1).unwrap();
            assert_eq!(pool.free_block_ids(), [2, 6, 7, 8, 9, 10, 11, 1, 0]);
            // 17 other tokens take the 9 free blocks: the first copies go, place 1 first.
            let other: Vec<TokenId> = (100..117).collect();
            admit(pool, 3, &other, &[]);
            let hit = hit_of(pool, &prompt, &named);
            assert_eq!(hit, [3, 4]);
            assert_eq!(pool.num_cached_blocks(), 2 + 8);
            hit
        },
    );
}

#[test]
fn a_reset_forgets_named_blocks_and_they_are_cached_again() {
    let prompt: Vec<TokenId> = [vec![0; 16], vec![3, 4]].concat();
    let named = [names(None, 1, 4), names(None, 2, 4)].concat();
    on_both(
        || Pool::over_runs(16, 2, true).unwrap(),
        |pool| {
            admit(pool, 1, &prompt, &named);
            assert_eq!(hit_of(pool, &prompt, &named).len(), 8);
            pool.free(&1).unwrap();
            assert!(pool.reset_prefix_cache());
            assert_eq!(pool.num_cached_blocks(), 0);
            assert_eq!(hit_of(pool, &prompt, &named), []);
            let [blocks, hit] = admit(pool, 2, &prompt, &named);
            assert_eq!(hit, []);
            assert_eq!(hit_of(pool, &prompt, &named), blocks[..8]);
            pool.free(&2).unwrap();
        },
    );
}

#[test]
fn the_named_index_takes_over_the_names_the_per_block_map_cached() {
    // Blocks of 2 tokens; the first prompts name one KV block of their trace blocks (the
    // per-block map holds them), a later one two places: the index takes over.
    let one = |id: u64| names(None, id, 1);
    let short: Vec<TokenId> = vec![0, 0, 5];
    let long: Vec<TokenId> = vec![0, 0, 0, 0, 5];
    on_both(
        || Pool::over_runs(20, 2, true).unwrap(),
        |pool| {
            for id in 0..4u32 {
                admit(pool, id, &short, &one(u64::from(id)));
                pool.free(&id).unwrap();
            }
            let two = names(None, 9, 2);
            admit(pool, 10, &long, &two);
            let hits: Vec<_> = (0..4).map(|id| hit_of(pool, &short, &one(id))).collect();
            assert!(hits.iter().all(|h| h.len() == 1), "{hits:?}");
            assert_eq!(hit_of(pool, &long, &two).len(), 2);
            hits
        },
    );
}
