//! SWA bounded replay (vLLM 0.33's `SlidingWindowMLASpec(bounded_replay=True)`): the
//! window group is not prefix-cached; after a hit the scheduler recomputes the hit's last
//! window (`replay_start`), keeps the hit's blocks and allocates only past the hit.

use super::*;
use crate::kv::{KvGroupSpec, NULL_BLOCK};
use crate::sched::*;

const REPLAY: KvGroupSpec = KvGroupSpec::SlidingWindowReplay { sliding_window: 8 };

/// A full-attention group (prefix-cached) and a replayed window-8 group, block 4.
fn replay_config() -> SchedulerConfig {
    SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, REPLAY],
        enable_prefix_caching: true,
        max_num_batched_tokens: 64,
        ..config()
    }
}

/// `len` tokens shared by every request built with it (`max_tokens` 2).
fn shared(len: usize) -> RequestSpec {
    RequestSpec {
        prompt_token_ids: (0..len as u32).collect(),
        max_tokens: 2,
        ..RequestSpec::default()
    }
}

fn finish(s: &mut Scheduler<u32>) {
    while s.has_unfinished_requests() {
        run_step(s);
    }
}

#[test]
fn a_hit_replays_its_last_window_and_keeps_its_blocks() {
    let mut s = Scheduler::new(replay_config(), false).unwrap();
    assert_eq!(s.config().prefix_replay_tokens(), 8);
    s.add_request(0, shared(25)).unwrap();
    run_step(&mut s);
    let first = s.group_block_ids(&0);
    s.add_request(1, shared(25)).unwrap();
    let out = run_step(&mut s);
    // 25 tokens: 6 full blocks hit (24 tokens); the last 8 are replayed from 16.
    let new = &out.scheduled_new_reqs[0];
    assert_eq!((new.num_computed_tokens, new.replay_start), (16, 16));
    assert_eq!(scheduled(&out), [(0, 1), (1, 9)]);
    let tables = s.group_block_ids(&1);
    assert_eq!(
        tables[0][..6],
        first[0][..6],
        "the full-attention hit is shared"
    );
    assert_eq!(tables[0].len(), 7, "one new block past the hit");
    // The window group never hits: (24 + 1 - 8) / 4 = 4 null blocks, then 3 fresh ones.
    assert!(tables[1][..4].iter().all(|&b| b == NULL_BLOCK));
    assert_eq!(tables[1].len(), 7);
    let held_by_first = s.group_block_ids(&0).concat();
    assert!(
        tables[1][4..]
            .iter()
            .all(|b| !held_by_first.contains(b) && *b != NULL_BLOCK)
    );
    assert_eq!(s.get_request(&1).unwrap().num_computed_tokens, 25);
    finish(&mut s);
}

#[test]
fn replay_only_chunks_allocate_nothing_and_make_progress() {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 4,
        ..replay_config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, shared(25)).unwrap();
    finish(&mut s);
    s.add_request(1, shared(25)).unwrap();
    let mut chunks = Vec::new();
    let mut full_blocks = Vec::new();
    while s.has_unfinished_requests() && chunks.len() < 3 {
        let out = run_step(&mut s);
        chunks.extend(out.num_scheduled_tokens.iter().map(|&(_, n)| n));
        full_blocks.push(s.group_block_ids(&1)[0].len());
    }
    // 8 replayed + 1 new token in 4-token chunks: two replay-only chunks hold the hit's 6
    // blocks; the third allocates the seventh.
    assert_eq!(chunks, [4, 4, 1]);
    assert_eq!(full_blocks, [6, 6, 7]);
    finish(&mut s);
}

#[test]
fn a_hit_no_longer_than_the_window_is_not_adopted() {
    let mut s = Scheduler::new(replay_config(), false).unwrap();
    s.add_request(0, shared(9)).unwrap();
    finish(&mut s);
    s.add_request(1, shared(25)).unwrap();
    let out = run_step(&mut s);
    // The cache holds 8 tokens = the window: recomputed in full, nothing replayed.
    let new = &out.scheduled_new_reqs[0];
    assert_eq!((new.num_computed_tokens, new.replay_start), (0, 0));
    assert_eq!(scheduled(&out), [(1, 25)]);
    finish(&mut s);
}

#[test]
fn a_plain_window_group_hits_without_replay() {
    // The same layout with an ordinary (cached) window replays nothing.
    let cfg = SchedulerConfig {
        kv_groups: vec![
            KvGroupSpec::FullAttention,
            KvGroupSpec::SlidingWindow { sliding_window: 8 },
        ],
        ..replay_config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    assert_eq!(s.config().prefix_replay_tokens(), 0);
    s.add_request(0, shared(25)).unwrap();
    run_step(&mut s);
    s.add_request(1, shared(25)).unwrap();
    let out = run_step(&mut s);
    let new = &out.scheduled_new_reqs[0];
    assert_eq!((new.num_computed_tokens, new.replay_start), (24, 0));
}

#[test]
fn replay_windows_must_agree() {
    let cfg = SchedulerConfig {
        kv_groups: vec![
            KvGroupSpec::FullAttention,
            REPLAY,
            KvGroupSpec::SlidingWindowReplay { sliding_window: 16 },
        ],
        ..replay_config()
    };
    match Scheduler::<u32>::new(cfg, false) {
        Err(crate::Error::Config { field, .. }) => assert_eq!(field, "kv_groups"),
        other => panic!("expected a config error, got {:?}", other.map(|_| ())),
    }
}

/// Full attention, the replayed window-8 group and a Mamba `align` group, blocks of 4, the
/// split on (vLLM 0.33's DeepSeek-style replay beside a hybrid model's Mamba layers).
fn replay_mamba_config() -> SchedulerConfig {
    SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, REPLAY, KvGroupSpec::MAMBA_ALIGN],
        mamba_align: Some(MambaAlignSplit::new(4)),
        num_blocks: 200,
        ..replay_config()
    }
}

/// `shared` tokens of `shared(..)`'s prompt, then `tail` others.
fn diverging(shared: usize, tail: usize) -> RequestSpec {
    RequestSpec {
        prompt_token_ids: (0..shared as u32).chain(1000..1000 + tail as u32).collect(),
        max_tokens: 2,
        ..RequestSpec::default()
    }
}

/// Runs `spec` to its end alone.
fn after(s: &mut Scheduler<u32>, id: u32, spec: RequestSpec) {
    s.add_request(id, spec).unwrap();
    finish(s);
}

#[test]
fn the_mamba_split_of_a_replayed_hit_is_measured_from_the_hits_end() {
    // vLLM 0.33's `_mamba_block_aligned_split` starts at `num_computed_tokens +
    // num_new_local_computed_tokens`, before `_mark_prefix_replay` rewinds the hit: a
    // 50-token prompt hitting 40 (every group caches there) replays from 32, and the chunk
    // ends where one from 40 would, at the last reusable state (49 / 4 * 4 = 48): 40 + 8,
    // so 8 tokens from 32 (the chunk from 32 would run 16, to 48).
    let mut s = Scheduler::new(replay_mamba_config(), false).unwrap();
    after(&mut s, 0, shared(40));
    s.add_request(1, shared(50)).unwrap();
    let out = run_step(&mut s);
    let new = &out.scheduled_new_reqs[0];
    assert_eq!((new.num_computed_tokens, new.replay_start), (32, 32));
    assert_eq!(scheduled(&out), [(1, 8)]);
    finish(&mut s);
}

#[test]
fn a_hit_dropped_for_the_window_keeps_its_shared_prefix_junction() {
    // Mamba states are cached at 8 (a 9-token prompt's split) and 16 (a 20-token one's);
    // full attention caches every block. A prompt sharing 14 tokens hits 8 (the agreed
    // boundary) where full attention caches to 12: vLLM drops the hit (8 <= the 8-token
    // window) but keeps `shared_prefix_boundary` = 12 from the lookup, so the chunk stops
    // at the junction, 12, for the state there to be cached (not at 32, the last reusable
    // state of its 33 tokens: (33 - 1) / 4 * 4).
    let mut s = Scheduler::new(replay_mamba_config(), false).unwrap();
    after(&mut s, 0, shared(9));
    after(&mut s, 1, shared(20));
    s.add_request(2, diverging(14, 19)).unwrap();
    let out = run_step(&mut s);
    let new = &out.scheduled_new_reqs[0];
    assert_eq!((new.num_computed_tokens, new.replay_start), (0, 0));
    assert_eq!(s.get_request(&2).unwrap().shared_prefix_boundary, 12);
    assert_eq!(scheduled(&out), [(2, 12)]);
    finish(&mut s);
    // No agreed hit (no Mamba state at or below 6) where full attention caches 4: nothing
    // to drop (vLLM drops only a hit > 0), the junction at 4 stands.
    s.add_request(3, diverging(6, 20)).unwrap();
    let out = run_step(&mut s);
    assert_eq!(s.get_request(&3).unwrap().shared_prefix_boundary, 4);
    assert_eq!(scheduled(&out), [(3, 4)]);
}
