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
