//! The read accessors behind the vLLM adapter's views of its KV cache manager: per-block
//! ref counts and hashes, free blocks, per-request block tables and cached-block counts,
//! the requests holding blocks.

use super::*;
use crate::kv::{KvGroupSpec, NULL_BLOCK};
use crate::sched::*;

#[test]
fn the_single_pool_shows_a_requests_blocks_ref_counts_and_cached_hashes() {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 9)).unwrap();
    run_step(&mut s);
    // 9 prompt tokens in blocks of 4: three blocks, the first two full and cached.
    assert_eq!(s.kv_request_ids(), [0]);
    let tables = s.kv_block_tables(&0).unwrap();
    assert_eq!(tables.len(), 1);
    assert_eq!(tables[0].len(), 3);
    assert_eq!(s.kv_num_cached_blocks(&0), Some(vec![2]));
    let states = s.kv_block_states();
    assert_eq!(states.len(), 64);
    for (i, &block) in tables[0].iter().enumerate() {
        let (ref_cnt, hash) = states[block as usize];
        assert_eq!(ref_cnt, 1);
        assert_eq!(hash.is_some(), i < 2, "block {i}");
    }
    assert_eq!(states.iter().map(|&(r, _)| r).sum::<u32>(), 3);
    assert_eq!(s.kv_free_block_ids().len(), 61);

    s.abort(&[0]).unwrap();
    // Freed: no holder, no table, every block free; the two hashes stay cached (evicted
    // lazily, as in vLLM).
    assert!(s.kv_request_ids().is_empty());
    assert_eq!(s.kv_block_tables(&0), None);
    assert_eq!(s.kv_num_cached_blocks(&0), None);
    let states = s.kv_block_states();
    assert!(states.iter().all(|&(r, _)| r == 0));
    assert_eq!(states.iter().filter(|(_, h)| h.is_some()).count(), 2);
    assert_eq!(s.kv_free_block_ids().len(), 64);
}

#[test]
fn with_kv_groups_block_zero_is_the_null_block_and_each_group_has_a_table() {
    let cfg = SchedulerConfig {
        kv_groups: vec![
            KvGroupSpec::FullAttention,
            KvGroupSpec::SlidingWindow { sliding_window: 4 },
        ],
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, prompt(0, 16)).unwrap();
    run_step(&mut s);
    run_step(&mut s);
    let tables = s.kv_block_tables(&0).unwrap();
    assert_eq!(tables.len(), 2);
    assert!(
        tables[1].contains(&NULL_BLOCK),
        "the window left {:?}",
        tables[1]
    );
    let states = s.kv_block_states();
    assert_eq!(states.len(), 65, "64 blocks and the null block");
    assert_eq!(states[NULL_BLOCK as usize], (0, None));
    // Caching is off: nothing is registered.
    assert_eq!(s.kv_num_cached_blocks(&0), Some(vec![0, 0]));
    let held: u32 = states.iter().map(|&(r, _)| r).sum();
    let live = tables
        .iter()
        .flatten()
        .filter(|&&b| b != NULL_BLOCK)
        .count();
    assert_eq!(held as usize, live);
    assert_eq!(s.kv_free_block_ids().len(), 64 - live);
}

#[test]
fn preempt_request_frees_a_running_requests_blocks_and_requeues_it_first() {
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, prompt(0, 6)).unwrap();
    s.add_request(1, prompt(1, 3)).unwrap();
    run_step(&mut s);
    let out = s.schedule().unwrap();
    s.preempt_request(&0).unwrap();
    assert_eq!(s.running_ids(), [1]);
    assert_eq!(s.waiting_ids(), [0]);
    assert_eq!(s.kv_block_tables(&0), None);
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 0);
    // The step in flight still delivers request 0's token; then it recomputes from 0.
    assert_eq!(scheduled(&out), [(0, 1), (1, 1)]);
    s.update_from_output(&[sample(0, 7), sample(1, 7)]).unwrap();
    assert_eq!(s.get_request(&0).unwrap().num_tokens(), 8);
    assert!(
        s.preempt_request(&0).is_err(),
        "a waiting request is not preempted"
    );
    let out = run_step(&mut s);
    assert_eq!(out.scheduled_resumed_reqs.len(), 1);
    s.check_invariants().unwrap();
}
