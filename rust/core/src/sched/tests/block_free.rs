//! Deferred block frees (vLLM 0.33's `defer_block_free`): a request finished or preempted
//! while a step that served it is in flight keeps its blocks out of the pool until the
//! newest step scheduled then is processed. The numbers follow vLLM 0.33's
//! `tests/v1/core/test_deferred_block_free.py` (4-token blocks here).

use super::*;
use crate::sched::*;
use crate::sched::{ExternalTokens, KvConnector};

/// 16 blocks of 4 tokens; a 9-token prompt takes 3 blocks.
fn deferring(async_scheduling: bool) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        num_blocks: 16,
        max_num_batched_tokens: 64,
        ..config()
    };
    let mut s = Scheduler::new(cfg, async_scheduling).unwrap();
    s.set_defer_block_free(true);
    s
}

fn stopping(id: u32) -> RequestSpec {
    RequestSpec {
        stop_token_ids: vec![42],
        max_tokens: 5,
        ..prompt(id, 9)
    }
}

#[test]
fn a_request_stopping_with_a_step_in_flight_keeps_its_blocks_until_that_step_is_processed() {
    let mut s = deferring(true);
    s.add_request(0, stopping(0)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 9)]); // step 1: the prompt
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]); // step 2: a decode, in flight
    assert_eq!(s.sched_step_seq(), 2);
    // 9 prompt tokens + the decode slot: 3 blocks (the 10th token fits the 3rd block).
    assert_eq!(s.num_free_blocks(), 13);
    s.step_processed().unwrap();
    assert_eq!(
        s.update_from_output(&[sample(0, 42)]).unwrap(),
        [(0, FinishReason::Stop)]
    );
    // Step 2 may still write its blocks: they wait for it (fence 2).
    assert_eq!(s.num_free_blocks(), 13);
    let deferred = s.deferred_frees();
    assert_eq!(deferred.len(), 1);
    assert_eq!((deferred[0].0, deferred[0].1.len()), (2, 3));
    s.check_invariants().unwrap();
    s.step_processed().unwrap();
    s.update_from_output(&[sample(0, 1)]).unwrap(); // the late output, dropped
    assert!(s.deferred_frees().is_empty());
    assert_eq!(s.num_free_blocks(), 16);
    s.check_invariants().unwrap();
}

#[test]
fn a_request_whose_last_step_is_processed_is_freed_at_once() {
    let mut s = deferring(true);
    s.add_request(0, stopping(0)).unwrap();
    s.schedule().unwrap();
    s.step_processed().unwrap();
    s.update_from_output(&[sample(0, 42)]).unwrap();
    assert!(s.deferred_frees().is_empty());
    assert_eq!(s.num_free_blocks(), 16);
}

#[test]
fn an_abort_with_three_steps_in_flight_waits_for_the_newest() {
    let mut s = deferring(true);
    s.add_request(0, prompt(0, 9)).unwrap();
    for _ in 0..3 {
        s.schedule().unwrap();
    }
    assert_eq!(s.sched_step_seq(), 3);
    let running = s.num_free_blocks();
    s.abort(&[0]).unwrap();
    assert_eq!(s.deferred_frees()[0].0, 3);
    // The first two steps' outputs do not fence the third's writes.
    for _ in 0..2 {
        s.step_processed().unwrap();
        assert_eq!(s.num_free_blocks(), running);
    }
    s.step_processed().unwrap();
    assert_eq!(s.num_free_blocks(), 16);
    s.check_invariants().unwrap();
}

#[test]
fn a_synchronous_engine_defers_through_the_step_fence_alone() {
    // No placeholders and a whole prompt in one step: only the step numbers tell that the
    // step is in flight (vLLM's test_non_async_abort_defers_via_last_sched_seq).
    let mut s = deferring(false);
    s.add_request(0, prompt(0, 9)).unwrap();
    s.schedule().unwrap();
    assert_eq!(s.get_request(&0).unwrap().last_sched_seq, 1);
    s.abort(&[0]).unwrap();
    assert_eq!(s.num_free_blocks(), 13);
    s.step_processed().unwrap();
    assert_eq!(s.num_free_blocks(), 16);
}

#[test]
fn a_request_not_in_the_step_in_flight_is_freed_at_once() {
    // max_tokens=1: the second step does not serve `short`; it finishes at step 1's output
    // while step 2 (serving only `long`) is in flight.
    let mut s = deferring(true);
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 1,
            ..prompt(0, 9)
        },
    )
    .unwrap();
    s.add_request(
        1,
        RequestSpec {
            max_tokens: 100,
            ..prompt(1, 9)
        },
    )
    .unwrap();
    s.schedule().unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 1)]);
    let before = s.num_free_blocks();
    s.step_processed().unwrap();
    s.update_from_output(&[sample(0, 3), sample(1, 3)]).unwrap();
    assert!(s.deferred_frees().is_empty());
    assert_eq!(s.num_free_blocks(), before + 3);
}

#[test]
fn a_victim_whose_blocks_wait_for_a_step_is_not_preempted_until_it_lands() {
    // 6 blocks: two 12-token prompts take 3 each; the first decode (the 13th token) needs a
    // 4th block. The victim (the last running) was served by the step in flight, so its
    // preemption would not free anything: the step serves what fits and preempts nothing.
    let cfg = SchedulerConfig {
        num_blocks: 6,
        max_num_batched_tokens: 64,
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    s.set_defer_block_free(true);
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 20,
            ..prompt(0, 12)
        },
    )
    .unwrap();
    s.add_request(
        1,
        RequestSpec {
            max_tokens: 20,
            ..prompt(1, 12)
        },
    )
    .unwrap();
    let first = s.schedule().unwrap();
    assert_eq!(scheduled(&first), [(0, 12), (1, 12)]);
    // Request 0's next decode needs a 4th block: none free, and request 1 is in step 1.
    let blocked = s.schedule().unwrap();
    assert!(blocked.preempted_req_ids.is_empty());
    assert!(blocked.num_scheduled_tokens.is_empty());
    s.step_processed().unwrap();
    s.update_from_output(&[sample(0, 3), sample(1, 3)]).unwrap();
    // Step 1 landed and step 2 scheduled nothing: request 1 can be preempted now.
    let resumed = s.schedule().unwrap();
    assert_eq!(resumed.preempted_req_ids, [1]);
    assert_eq!(scheduled(&resumed), [(0, 1)]);
    s.check_invariants().unwrap();
}

#[test]
fn a_request_preempted_with_a_step_in_flight_resumes_on_fresh_blocks() {
    // reset_prefix_cache(preempt_running) preempts the running request while step 1 is
    // in flight: its blocks wait, so the cache cannot be reset; the request waits with no
    // blocks and resumes once they are back.
    let mut s = deferring(true);
    s.add_request(0, prompt(0, 9)).unwrap();
    s.schedule().unwrap();
    let (reset, preempted) = s.reset_prefix_cache(true).unwrap();
    assert_eq!((reset, preempted), (false, vec![0]));
    assert_eq!(s.num_free_blocks(), 13);
    assert_eq!(s.block_ids(&0), None);
    s.check_invariants().unwrap();
    s.step_processed().unwrap();
    assert_eq!(s.num_free_blocks(), 16);
    // Its output in flight is dropped (vLLM's drop_stale_output for a reset).
    s.update_from_output(&[]).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 9)]);
    s.check_invariants().unwrap();
}

#[test]
fn without_the_flag_nothing_is_deferred_or_numbered() {
    let mut s = Scheduler::new(config(), true).unwrap();
    s.add_request(0, stopping(0)).unwrap();
    s.schedule().unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[sample(0, 42)]).unwrap();
    assert_eq!(s.sched_step_seq(), 0);
    assert!(s.deferred_frees().is_empty());
    assert_eq!(s.stats().kv_usage, 0.0);
}

/// Loads request 1's whole prompt asynchronously (nothing for the others) and logs the
/// requests whose blocks it is given (every admission: request 0's with no load).
struct LoadsOne(std::sync::Arc<std::sync::Mutex<Vec<u32>>>);

impl KvConnector<u32> for LoadsOne {
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<u32>,
        num_computed_tokens: usize,
    ) -> crate::Result<Option<ExternalTokens>> {
        let loads = request.request_id == 1;
        Ok(Some(ExternalTokens {
            num_tokens: if loads {
                request.num_tokens() - num_computed_tokens
            } else {
                0
            },
            load_async: true,
        }))
    }

    fn update_state_after_alloc(
        &mut self,
        request: &Request<u32>,
        _: &[crate::kv::BlockId],
        _: usize,
    ) -> crate::Result<()> {
        self.0.lock().unwrap().push(request.request_id);
        Ok(())
    }

    fn request_finished(
        &mut self,
        _: &Request<u32>,
        _: &[crate::kv::BlockId],
    ) -> crate::Result<bool> {
        Ok(false)
    }
}

/// Request 0 runs with two steps in flight; request 1 is admitted with an async load in
/// the third step. Returns the scheduler and the connector's log.
fn load_behind_steps_in_flight(
    defer_loads: bool,
) -> (Scheduler<u32>, std::sync::Arc<std::sync::Mutex<Vec<u32>>>) {
    let cfg = SchedulerConfig {
        num_blocks: 16,
        max_num_batched_tokens: 64,
        enable_prefix_caching: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    s.set_connector(Box::new(LoadsOne(log.clone()))).unwrap();
    s.set_defer_block_free(true);
    s.set_defer_async_loads(defer_loads);
    s.add_request(0, prompt(0, 9)).unwrap();
    s.schedule().unwrap();
    s.schedule().unwrap();
    s.add_request(1, prompt(1, 8)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.kv_loads.len(), 1);
    assert_eq!(
        s.get_request(&1).unwrap().status,
        RequestStatus::WaitingForRemoteKvs
    );
    (s, log)
}

#[test]
fn a_load_admitted_behind_a_step_in_flight_starts_once_that_step_is_processed() {
    // vLLM's test_deferred_async_load_registers_after_inflight_step: the fence is step 2,
    // the newest in flight when step 3 admitted the load.
    let (mut s, log) = load_behind_steps_in_flight(true);
    assert_eq!(*log.lock().unwrap(), [0]);
    assert_eq!(s.deferred_load_ids(), [1]);
    s.check_invariants().unwrap();
    s.step_processed().unwrap();
    assert_eq!(*log.lock().unwrap(), [0]);
    s.step_processed().unwrap();
    assert_eq!(*log.lock().unwrap(), [0, 1]);
    assert!(s.deferred_load_ids().is_empty());
    // Without the flag the load starts at admission.
    let (_, log) = load_behind_steps_in_flight(false);
    assert_eq!(*log.lock().unwrap(), [0, 1]);
}

#[test]
fn an_aborted_deferred_load_never_started_so_its_blocks_wait_only_for_the_fence() {
    let (mut s, log) = load_behind_steps_in_flight(true);
    let held = s.num_free_blocks();
    s.abort(&[1]).unwrap();
    // Not held for a load report that will never come: deferred to the newest step (3).
    assert_eq!(s.num_kv_transfers(), (0, 0));
    assert_eq!(s.deferred_frees().len(), 1);
    assert_eq!(s.num_free_blocks(), held);
    for _ in 0..3 {
        s.step_processed().unwrap();
    }
    assert_eq!(s.num_free_blocks(), held + 2);
    assert_eq!(*log.lock().unwrap(), [0]);
    s.check_invariants().unwrap();
}

/// With several KV groups the drain returns all groups' blocks in one release, last first
/// (vLLM 0.33's `_free_request_blocks` pops every group's table in group order,
/// `_drain_deferred_frees` hands them to one `BlockPool.free_blocks` reversed): the
/// uncached ones go to the front of the free queue, the cached ones to the back, the last
/// group's before the first's. A group-by-group release (`KVCacheManager.free`) would put
/// the first group's cached blocks at the back first.
#[test]
fn a_deferred_free_over_several_groups_releases_them_as_one_list_last_first() {
    let cfg = SchedulerConfig {
        num_blocks: 32,
        max_num_batched_tokens: 64,
        enable_prefix_caching: true,
        kv_groups: vec![
            crate::kv::KvGroupSpec::FullAttention,
            crate::kv::KvGroupSpec::SlidingWindow { sliding_window: 8 },
        ],
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    s.set_defer_block_free(true);
    let spec = RequestSpec {
        stop_token_ids: vec![42],
        max_tokens: 5,
        ..prompt(0, 13)
    };
    s.add_request(0, spec).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 13)]);
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1)]); // in flight
    s.step_processed().unwrap();
    s.update_from_output(&[sample(0, 42)]).unwrap();
    let crate::sched::block_free::Deferred::Slot(slot) = s.block_frees.queue[0].1 else {
        panic!("the request's blocks are deferred");
    };
    let tables = s.kv.group_block_ids(slot);
    // vLLM's free_blocks over reversed(group 0's table + group 1's), nulls skipped.
    let states = s.kv_block_states();
    let popped: Vec<u32> = (tables.iter().flatten().copied())
        .filter(|&b| b != crate::kv::NULL_BLOCK)
        .collect();
    let (mut first, mut last) = (Vec::new(), Vec::new());
    for &block in popped.iter().rev() {
        if states[block as usize].1.is_some() {
            last.push(block);
        } else {
            first.push(block);
        }
    }
    assert!(last.len() >= 2 && !first.is_empty(), "{tables:?}");
    let before = s.kv_free_block_ids();
    s.step_processed().unwrap();
    s.update_from_output(&[sample(0, 1)]).unwrap(); // the late output, dropped
    assert!(s.deferred_frees().is_empty());
    let expected: Vec<_> = first.into_iter().chain(before).chain(last).collect();
    assert_eq!(s.kv_free_block_ids(), expected);
    s.check_invariants().unwrap();
}
