//! HiSparse host pages (`sched::hisparse`, vLLM 0.33's `hisparse_host_num_blocks`): one
//! host block per device block a request holds, block 0 the null block; the whole prompt's
//! pages checked at admission; a running request short of pages preempts, or waits while
//! a reclamation is pending; pages come back when the blocks do.

use super::*;
use crate::Result;
use crate::kv::BlockId;
use crate::sched::{ExternalTokens, KvConnector, RequestStatus};

/// Loads `tokens` of every request asynchronously at its first admission.
struct AsyncLoads {
    tokens: usize,
}

impl KvConnector<u32> for AsyncLoads {
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<u32>,
        num_computed_tokens: usize,
    ) -> Result<Option<ExternalTokens>> {
        let fresh = request.num_preemptions == 0 && num_computed_tokens == 0;
        Ok(Some(ExternalTokens {
            num_tokens: if fresh { self.tokens } else { 0 },
            load_async: true,
        }))
    }

    fn request_finished(&mut self, _: &Request<u32>, _: &[BlockId]) -> Result<bool> {
        Ok(false)
    }
}

/// Reports block frees pending (HiSparse's reclamation in flight) when `pending`.
struct Reclaiming {
    pending: bool,
}

impl StepHooks<u32> for Reclaiming {
    fn pending_block_frees(&self) -> Result<bool> {
        Ok(self.pending)
    }
}

/// Blocks of 4 tokens, a device pool that never runs out, full-prompt admission, and a
/// HiSparse host pool of `host_blocks` (the null block included).
fn hisparse(host_blocks: usize) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        num_blocks: 64,
        max_num_batched_tokens: 64,
        scheduler_reserve_full_isl: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_hisparse_host_pages(Some((host_blocks, 4))).unwrap();
    s
}

fn free_host_blocks(s: &Scheduler<u32>) -> usize {
    s.hisparse_host_pages().unwrap().num_free_blocks
}

fn async_admission(host_blocks: usize) -> Scheduler<u32> {
    // vLLM 0.33's test_hisparse_async_admission_requires_full_prompt_host_pages in blocks
    // of 4: a 12-token prompt loads its first 4 tokens (one host page, in flight); a
    // 16-token prompt needs its 4 pages beside it and the null block.
    let mut s = hisparse(host_blocks);
    s.set_connector(Box::new(AsyncLoads { tokens: 4 })).unwrap();
    s.add_request(0, prompt(0, 12)).unwrap();
    s.schedule().unwrap();
    assert_eq!(s.inflight_prefill_ids(), [0]);
    assert_eq!(free_host_blocks(&s), host_blocks - 2);
    s.add_request(1, prompt(1, 16)).unwrap();
    s.schedule().unwrap();
    s.check_invariants().unwrap();
    s
}

#[test]
fn four_prompt_pages_beside_an_in_flight_page_and_the_null_block_need_six_host_blocks() {
    let s = async_admission(5);
    assert_eq!(s.inflight_prefill_ids(), [0]);
    assert_eq!(s.get_request(&1).unwrap().status, RequestStatus::Waiting);
    assert!(s.block_ids(&1).is_none());

    let s = async_admission(6);
    assert_eq!(s.inflight_prefill_ids(), [0, 1]);
    assert_eq!(
        s.get_request(&1).unwrap().status,
        RequestStatus::WaitingForRemoteKvs
    );
    // Its load holds one page; the other three are checked, not reserved.
    assert_eq!(free_host_blocks(&s), 3);
}

#[test]
fn admitted_async_loads_finish_on_host_pages_and_the_next_follows() {
    // vLLM 0.33's test_hisparse_admitted_async_loads_can_finish_with_nothing_running: three
    // usable host blocks, two 10-token prompts of three pages each, with two output tokens
    // (12 tokens, still three pages). Only the first load starts (the second's whole prompt
    // does not fit beside its page), so it can always finish and hand its pages on.
    let mut s = hisparse(4);
    s.set_connector(Box::new(AsyncLoads { tokens: 4 })).unwrap();
    for id in 0..2 {
        s.add_request(
            id,
            RequestSpec {
                max_tokens: 2,
                ..prompt(id, 10)
            },
        )
        .unwrap();
        s.schedule().unwrap();
    }
    assert_eq!(s.inflight_prefill_ids(), [0]);
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 6)]);
    assert_eq!(free_host_blocks(&s), 0);
    let mut served_second = false;
    for _ in 0..20 {
        let out = run_step(&mut s);
        served_second |= out.num_scheduled_tokens.iter().any(|&(id, _)| id == 1);
        for load in &out.kv_loads {
            s.finish_kv_transfers(&[load.request_id], &[], &[]).unwrap();
        }
        if !s.has_unfinished_requests() {
            break;
        }
    }
    assert!(served_second);
    assert!(!s.has_unfinished_requests());
    assert_eq!(free_host_blocks(&s), 3);
}

/// A (8 tokens, two pages) and B (4 tokens, one page) fill a pool of three usable host
/// blocks with their prefills; A's first decode needs a third page.
fn two_prefilled(host_hooks: Option<Reclaiming>) -> Scheduler<u32> {
    let mut s = hisparse(4);
    s.add_request(0, prompt(0, 8)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 8), (1, 4)]);
    assert_eq!(free_host_blocks(&s), 0);
    if let Some(hooks) = host_hooks {
        s.set_step_hooks(Some(Box::new(hooks)));
    }
    s
}

#[test]
fn a_decode_short_of_host_pages_preempts_the_last_running_request() {
    let mut s = two_prefilled(None);
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 1)]);
    assert_eq!(out.preempted_req_ids, [1]);
    assert_eq!(s.get_request(&1).unwrap().num_preemptions, 1);
    // A holds three pages, B none.
    assert_eq!(s.block_ids(&0).unwrap().len(), 3);
    assert_eq!(free_host_blocks(&s), 0);
}

#[test]
fn a_pending_reclamation_stalls_the_decode_instead_of_preempting() {
    let mut s = two_prefilled(Some(Reclaiming { pending: true }));
    let out = run_step(&mut s);
    assert!(out.num_scheduled_tokens.is_empty());
    assert!(out.preempted_req_ids.is_empty());
    for id in [0, 1] {
        let r = s.get_request(&id).unwrap();
        assert_eq!((r.status, r.num_preemptions), (RequestStatus::Running, 0));
    }
    // Nothing pending: the no-room path preempts as before.
    s.set_step_hooks(Some(Box::new(Reclaiming { pending: false })));
    let out = run_step(&mut s);
    assert_eq!(out.preempted_req_ids, [1]);
}

#[test]
fn without_the_host_pool_the_same_requests_run_side_by_side() {
    let mut s = two_prefilled(None);
    s.set_hisparse_host_pages(None).unwrap();
    assert!(s.hisparse_host_pages().is_none());
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 1), (1, 1)]);
}

#[test]
fn host_pages_come_back_when_requests_finish() {
    let mut s = hisparse(8);
    for id in 0..3 {
        s.add_request(id, prompt(id, 6)).unwrap();
    }
    for _ in 0..10 {
        run_step(&mut s);
    }
    assert!(!s.has_unfinished_requests());
    assert_eq!(free_host_blocks(&s), 7);
}

#[test]
fn a_prompt_longer_than_the_host_pool_waits_and_the_queue_behind_it_too() {
    let mut s = hisparse(4);
    s.add_request(0, prompt(0, 13)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    let out = s.schedule().unwrap();
    assert!(out.num_scheduled_tokens.is_empty());
    assert_eq!(free_host_blocks(&s), 3);
}

#[test]
fn host_pages_refuse_settings_they_cannot_serve() {
    let mut s = hisparse(4);
    assert!(s.set_hisparse_host_pages(Some((1, 4))).is_err());
    assert!(s.set_hisparse_host_pages(Some((8, 16))).is_err());
    s.add_request(0, prompt(0, 4)).unwrap();
    s.schedule().unwrap();
    let err = s.set_hisparse_host_pages(Some((8, 4))).unwrap_err();
    assert!(err.to_string().contains("hold KV blocks"), "{err}");

    let cfg = SchedulerConfig {
        scheduler_reserve_full_isl: false,
        ..config()
    };
    let mut s = Scheduler::<u32>::new(cfg, false).unwrap();
    let err = s.set_hisparse_host_pages(Some((8, 4))).unwrap_err();
    assert!(
        err.to_string().contains("scheduler_reserve_full_isl"),
        "{err}"
    );
}

#[test]
fn no_decode_window_opens_beside_host_pages() {
    // A coalesced decode window allocates without asking for pages; with the pool on,
    // each step is formed on its own.
    let mut s = hisparse(32);
    s.add_request(0, prompt(0, 4)).unwrap();
    run_step(&mut s);
    assert!(s.open_decode_window().is_none());
    s.set_hisparse_host_pages(None).unwrap();
    assert!(s.open_decode_window().is_some());
}

/// A request adopted as running (`adopt_running`) takes host pages for its device blocks
/// as an admitted one does, and is refused when the host pool cannot back them.
#[test]
fn an_adopted_request_takes_host_pages_as_admission_does() {
    let mut s = hisparse(4); // 3 usable host blocks beside the null block
    s.add_request(0, prompt(0, 12)).unwrap();
    s.adopt_running(&0, &[], 12).unwrap();
    assert_eq!(free_host_blocks(&s), 0);
    s.check_invariants().unwrap();
    s.add_request(1, prompt(100, 8)).unwrap();
    let refused = s.adopt_running(&1, &[], 8);
    assert!(matches!(
        refused,
        Err(crate::Error::Capacity {
            requested: 2,
            available: 0,
            ..
        })
    ));
    assert_eq!((s.num_running(), s.num_waiting()), (1, 1));
    s.check_invariants().unwrap();
}
