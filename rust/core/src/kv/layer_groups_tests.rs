//! Unit tests of `layer_groups.rs` (the group kinds' rules), split out to keep that file short.

use super::*;

#[test]
fn skipped_tokens_follow_vllm_examples() {
    let window = KvGroupSpec::SlidingWindow { sliding_window: 4 };
    assert_eq!(window.num_skipped_tokens(7), 4);
    assert_eq!(window.num_skipped_tokens(2), 0);
    // vLLM's `max(0, n - window + 1 - extra_retained_tokens)`; other kinds ignore it.
    assert_eq!(window.num_skipped_tokens_retaining(7, 3), 1);
    assert_eq!(window.num_skipped_tokens_retaining(7, 9), 0);
    assert_eq!(
        KvGroupSpec::FullAttention.num_skipped_tokens_retaining(7, 3),
        0
    );
    let local = KvGroupSpec::ChunkedLocalAttention {
        attention_chunk_size: 8,
    };
    assert_eq!([13, 8, 7].map(|n| local.num_skipped_tokens(n)), [8, 8, 0]);
    assert_eq!(KvGroupSpec::MAMBA.num_required_blocks(1000, 16), 1);
}

#[test]
fn sliding_window_hit_needs_a_full_window_run_or_one_from_the_start() {
    // Window 8, block 4: a hit needs the 2 blocks before its end (vLLM's example:
    // [NULL, NULL, 7, 8]).
    let spec = KvGroupSpec::SlidingWindow { sliding_window: 8 };
    let cached = [false, true, true, true, false, true];
    let lookup = |i: usize| cached[i].then(|| vec![10 + i as BlockId]);
    let hit = find_longest_cache_hit(spec, 1, 4, 4, 6, 24, false, lookup);
    assert_eq!(hit.blocks[0], [0, 0, 12, 13]);
    assert_eq!(hit.num_tokens, 16);
    let from_start = [true, false, true];
    let hit = find_longest_cache_hit(spec, 1, 4, 4, 3, 12, false, |i| {
        from_start[i].then(|| vec![20 + i as BlockId])
    });
    assert_eq!(
        (hit.blocks[0].as_slice(), hit.num_tokens),
        ([20].as_slice(), 4)
    );
}

#[test]
fn a_replayed_window_neither_caches_nor_limits_a_hit() {
    let spec = KvGroupSpec::SlidingWindowReplay { sliding_window: 8 };
    assert!(!spec.caches_blocks());
    assert_eq!(spec.prefix_replay_tokens(), 8);
    assert_eq!(
        KvGroupSpec::SlidingWindow { sliding_window: 8 }.prefix_replay_tokens(),
        0
    );
    // It frees blocks leaving its window as a plain window does.
    assert_eq!(spec.num_skipped_tokens(24), 17);
    let hit = find_longest_cache_hit(spec, 1, 4, 4, 6, 24, false, |_| None);
    assert_eq!((hit.blocks[0].len(), hit.num_tokens), (0, 24));
}

#[test]
fn chunked_local_hit_starts_at_the_last_chunk() {
    // vLLM's examples: chunk 8, block 4, max length 15 → [null, null, block 3?].
    let spec = KvGroupSpec::ChunkedLocalAttention {
        attention_chunk_size: 8,
    };
    let hit = find_longest_cache_hit(spec, 1, 4, 4, 4, 15, false, |i| {
        Some(vec![i as BlockId + 1])
    });
    assert_eq!(hit.blocks[0], [0, 0, 3]);
    let hit = find_longest_cache_hit(spec, 1, 4, 4, 4, 16, false, |_| None);
    assert_eq!(
        (hit.blocks[0].as_slice(), hit.num_tokens),
        ([0; 4].as_slice(), 16)
    );
}
