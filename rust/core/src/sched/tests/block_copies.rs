//! Block copies (vLLM 0.33's `SchedulerOutput.kv_cache_block_copies`): a queued copy rides
//! the next step's output and its endpoints stay out of the pool until that step is
//! processed. The numbers follow vLLM 0.33's
//! `test_cow_retentions_deferred_until_copy_step_processed` (4-token blocks here).

use super::*;
use crate::kv::KvGroupSpec;
use crate::sched::*;

/// 16 blocks of 4 tokens; a 9-token prompt takes 3 blocks.
fn scheduler(defer: bool) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        num_blocks: 16,
        max_num_batched_tokens: 64,
        ..config()
    };
    let mut s = Scheduler::new(cfg, true).unwrap();
    s.set_defer_block_free(defer);
    s
}

#[test]
fn a_copy_rides_the_next_step_and_its_endpoints_wait_for_that_step() {
    let mut s = scheduler(true);
    s.add_request(0, prompt(0, 9)).unwrap();
    let (src, dst) = match s.take_loose_blocks(2).unwrap()[..] {
        [a, b] => (a, b),
        _ => unreachable!(),
    };
    s.queue_block_copies(&[(src, dst)]).unwrap();
    let out0 = s.schedule().unwrap();
    assert_eq!(out0.kv_cache_block_copies, [(src, dst)]);
    assert!(s.pending_block_copies().is_empty());
    // Only the copy's endpoints would be left for a new 8-token (2-block) request.
    let rest = s.num_free_blocks();
    s.take_loose_blocks(rest).unwrap();
    s.add_request(1, prompt(1, 8)).unwrap();
    let out1 = s.schedule().unwrap(); // step 1 is still in flight
    assert!(out1.kv_cache_block_copies.is_empty());
    assert!(out1.scheduled_new_reqs.is_empty());
    assert_eq!(s.deferred_frees(), [(1, vec![dst, src])]);
    assert_eq!(s.num_free_blocks(), 0);
    s.check_invariants().unwrap();
    // Step 1 processed: the copy has run, its endpoints return and request 1 gets them.
    s.step_processed().unwrap();
    s.update_from_output(&[sample(0, 7)]).unwrap();
    assert!(s.deferred_frees().is_empty());
    assert_eq!(s.num_free_blocks(), 2);
    let out2 = s.schedule().unwrap();
    assert_eq!(out2.scheduled_new_reqs[0].request_id, 1);
    let mut given = out2.scheduled_new_reqs[0].block_ids.clone();
    given.sort_unstable();
    let mut endpoints = vec![src, dst];
    endpoints.sort_unstable();
    assert_eq!(given, endpoints);
    s.check_invariants().unwrap();
}

#[test]
fn without_deferred_frees_the_endpoints_return_as_the_step_is_formed() {
    let mut s = scheduler(false);
    let taken = s.take_loose_blocks(2).unwrap();
    s.queue_block_copies(&[(taken[0], taken[1])]).unwrap();
    assert_eq!(s.num_free_blocks(), 14);
    // A step that schedules nothing carries the copy all the same.
    let out = s.schedule().unwrap();
    assert_eq!(out.kv_cache_block_copies, [(taken[0], taken[1])]);
    assert_eq!(s.num_free_blocks(), 16);
    assert!(s.deferred_frees().is_empty());
    s.check_invariants().unwrap();
}

#[test]
fn an_empty_step_defers_the_copy_to_the_next_step_that_schedules() {
    let mut s = scheduler(true);
    let taken = s.take_loose_blocks(2).unwrap();
    s.queue_block_copies(&[(taken[0], taken[1])]).unwrap();
    let out = s.schedule().unwrap(); // nothing to schedule: not numbered
    assert_eq!(out.total_num_scheduled_tokens, 0);
    assert_eq!(s.deferred_frees(), [(1, vec![taken[1], taken[0]])]);
    s.check_invariants().unwrap();
    s.add_request(0, prompt(0, 9)).unwrap();
    s.schedule().unwrap(); // step 1
    s.step_processed().unwrap();
    assert!(s.deferred_frees().is_empty());
    assert_eq!(s.num_free_blocks(), 13);
    s.check_invariants().unwrap();
}

#[test]
fn an_endpoint_needs_a_reference_no_copy_retains() {
    let mut s = scheduler(true);
    s.add_request(0, prompt(0, 9)).unwrap();
    let out = s.schedule().unwrap();
    let held = out.scheduled_new_reqs[0].block_ids[0];
    let taken = s.take_loose_blocks(2).unwrap();
    // A block of a request's table is not retained by a copy: vLLM's copy would free a
    // reference the request holds.
    let err = s.queue_block_copies(&[(held, taken[0])]).unwrap_err();
    assert!(err.to_string().contains("kv_cache_block_copies"), "{err}");
    let err = s.queue_block_copies(&[(taken[0], taken[0])]).unwrap_err();
    assert!(err.to_string().contains("onto itself"), "{err}");
    s.queue_block_copies(&[(taken[0], taken[1])]).unwrap();
    // Each reference retains one copy: a second copy from the same source needs another.
    let err = s.queue_block_copies(&[(taken[0], taken[1])]).unwrap_err();
    assert!(err.to_string().contains("kv_cache_block_copies"), "{err}");
    let err = s.free_loose_blocks(&[taken[0]]).unwrap_err();
    assert!(err.to_string().contains("block_ids"), "{err}");
    assert!(s.pending_block_copies().len() == 1);
    s.check_invariants().unwrap();
}

#[test]
fn the_radix_pool_refuses_blocks_outside_a_request() {
    let cfg = SchedulerConfig {
        prefix_cache: PrefixCache::Radix,
        enable_prefix_caching: true,
        ..config()
    };
    let mut s = Scheduler::<u32>::new(cfg, false).unwrap();
    let err = s.take_loose_blocks(1).unwrap_err();
    assert!(err.to_string().contains("prefix_cache"), "{err}");
}

#[test]
fn over_several_kv_groups_the_copy_holds_the_coordinators_blocks() {
    let cfg = SchedulerConfig {
        num_blocks: 16,
        max_num_batched_tokens: 64,
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::FullAttention],
        ..config()
    };
    let mut s = Scheduler::<u32>::new(cfg, true).unwrap();
    s.set_defer_block_free(true);
    let free = s.num_free_blocks();
    let taken = s.take_loose_blocks(2).unwrap();
    // The coordinator's block 0 is the null block: never handed out.
    assert!(!taken.contains(&0));
    s.queue_block_copies(&[(taken[0], taken[1])]).unwrap();
    s.add_request(0, prompt(0, 9)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.kv_cache_block_copies, [(taken[0], taken[1])]);
    assert_eq!(s.deferred_frees(), [(1, vec![taken[1], taken[0]])]);
    s.check_invariants().unwrap();
    s.step_processed().unwrap();
    s.update_from_output(&[sample(0, 7)]).unwrap();
    assert!(s.deferred_frees().is_empty());
    // Request 0 holds 3 blocks per group (9 prompt tokens and the decode slot).
    assert_eq!(s.num_free_blocks(), free - 6);
    s.check_invariants().unwrap();
}

#[test]
fn a_step_formed_without_schedule_takes_the_copies_as_schedule_would() {
    let mut s = scheduler(true);
    let taken = s.take_loose_blocks(2).unwrap();
    s.queue_block_copies(&[(taken[0], taken[1])]).unwrap();
    assert_eq!(s.take_pending_block_copies(), [(taken[0], taken[1])]);
    assert!(s.take_pending_block_copies().is_empty());
    // No step has scheduled a token: the endpoints wait for the next one that does.
    assert_eq!(s.deferred_frees(), [(1, vec![taken[1], taken[0]])]);
    s.check_invariants().unwrap();
}
