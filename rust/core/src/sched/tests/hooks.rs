//! Step hooks (`sched::hooks`): an allocation refused takes the no-room path (a running
//! request preempts or waits; an admission waits at the head), a replaced Mamba split
//! decides the chunk, and `num_sampled_tokens_per_step` set on a built scheduler.

use std::sync::{Arc, Mutex};

use super::*;
use crate::Result;
use crate::kv::BlockId;

/// Refuses the allocations whose (1-based) call numbers are in `refuse`; records each
/// `(request, num_new_tokens)` asked. Splits `split_of` requests to its count.
#[derive(Default)]
struct Recorder {
    refuse: Vec<usize>,
    asked: Arc<Mutex<Vec<(u32, usize)>>>,
    split_of: Option<(u32, usize)>,
    priorities: Vec<(u32, i64)>,
}

impl StepHooks<u32> for Recorder {
    fn allow_allocation(
        &self,
        request: &Request<u32>,
        n: usize,
        _lookahead: usize,
    ) -> Result<bool> {
        let mut asked = self.asked.lock().unwrap();
        asked.push((request.request_id, n));
        Ok(!self.refuse.contains(&asked.len()))
    }

    fn mamba_split(
        &self,
        request: &Request<u32>,
        _start: usize,
        n: usize,
        core: usize,
    ) -> Result<usize> {
        match self.split_of {
            Some((id, split)) if id == request.request_id => Ok(split.min(n)),
            _ => Ok(core),
        }
    }

    fn priority(&self, request: &Request<u32>) -> Result<Option<i64>> {
        let found = self
            .priorities
            .iter()
            .find(|(id, _)| *id == request.request_id);
        Ok(found.map(|&(_, priority)| priority))
    }
}

/// Three 3-token prompts run their prefill (9 of the budget of 10) and sample a token.
fn three_running() -> Scheduler<u32> {
    let mut s = Scheduler::new(config(), false).unwrap();
    for id in 0..3 {
        s.add_request(id, prompt(id, 3)).unwrap();
    }
    run_step(&mut s);
    s
}

#[test]
fn a_refused_running_allocation_preempts_the_last_request_and_asks_again() {
    // FCFS: request 0's first ask is refused, so the last running request (2) is preempted
    // and request 0 asked again (granted); request 1 is asked once. Without hooks all three
    // decode.
    let mut s = three_running();
    let asked = Arc::new(Mutex::new(Vec::new()));
    s.set_step_hooks(Some(Box::new(Recorder {
        refuse: vec![1],
        asked: asked.clone(),
        ..Recorder::default()
    })));
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 1), (1, 1)]);
    assert_eq!(out.preempted_req_ids, [2]);
    assert_eq!(*asked.lock().unwrap(), [(0, 1), (0, 1), (1, 1)]);
    s.check_invariants().unwrap();

    let mut s = three_running();
    assert!(!s.has_step_hooks());
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1), (1, 1), (2, 1)]);
}

#[test]
fn the_victim_is_picked_by_the_priorities_the_hooks_give_at_that_moment() {
    // Priority policy, all three added with priority 0 at time 0: request 1's refused
    // allocation preempts the largest (priority, arrival), the first of equals (vLLM's
    // `max`): request 0, already scheduled, leaves. With the hooks giving request 2
    // priority 9 at that moment, request 2 leaves instead.
    let run = |priorities: Vec<(u32, i64)>| {
        let mut s = Scheduler::new(
            SchedulerConfig {
                policy: Policy::Priority,
                ..config()
            },
            false,
        )
        .unwrap();
        for id in 0..3 {
            s.add_request(id, prompt(id, 3)).unwrap();
        }
        run_step(&mut s);
        s.set_step_hooks(Some(Box::new(Recorder {
            refuse: vec![2],
            priorities,
            ..Recorder::default()
        })));
        let out = s.schedule().unwrap();
        s.check_invariants().unwrap();
        (scheduled(&out), out.preempted_req_ids)
    };
    assert_eq!(run(vec![(2, 9)]), (vec![(0, 1), (1, 1)], vec![2]));
    assert_eq!(run(vec![]), (vec![(1, 1), (2, 1)], vec![0]));
}

#[test]
fn a_refused_admission_waits_at_the_head_and_is_admitted_when_granted() {
    // Request 0's admission is refused: nothing is scheduled (the head blocks the queue);
    // the next step asks again and it is admitted with its whole prompt.
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, prompt(0, 6)).unwrap();
    s.add_request(1, prompt(1, 2)).unwrap();
    let asked = Arc::new(Mutex::new(Vec::new()));
    s.set_step_hooks(Some(Box::new(Recorder {
        refuse: vec![1],
        asked: asked.clone(),
        ..Recorder::default()
    })));
    let out = s.schedule().unwrap();
    assert!(scheduled(&out).is_empty());
    assert_eq!(s.num_waiting(), 2);
    assert_eq!(s.num_free_blocks(), 64);
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 6), (1, 2)]);
    assert_eq!(*asked.lock().unwrap(), [(0, 6), (0, 6), (1, 2)]);
    s.check_invariants().unwrap();
}

#[test]
fn a_replaced_split_that_clips_a_padded_decode_drops_its_padding() {
    // k = 3, the split on (blocks of 16: the core's split keeps the padded 4 tokens of a
    // 7-token prompt with 6 computed). A replaced split keeping 2 drops the padding: one
    // token, no drafts; one keeping the core's answer leaves it padded.
    let run = |split_of| {
        let mut s = Scheduler::new(
            SchedulerConfig {
                num_speculative_tokens: 3,
                mamba_align: Some(MambaAlignSplit::new(16)),
                ..config()
            },
            false,
        )
        .unwrap();
        s.set_step_hooks(Some(Box::new(Recorder {
            split_of,
            ..Recorder::default()
        })));
        s.add_request(
            1,
            RequestSpec {
                num_computed_tokens: 6,
                ..prompt(1, 7)
            },
        )
        .unwrap();
        let out = s.schedule().unwrap();
        (scheduled(&out), out.scheduled_spec_decode_tokens.len())
    };
    assert_eq!(run(Some((1, 2))), (vec![(1, 1)], 0));
    assert_eq!(run(None), (vec![(1, 4)], 1));
}

#[test]
fn a_split_longer_than_the_chunk_is_refused() {
    struct Grows;
    impl StepHooks<u32> for Grows {
        fn mamba_split(&self, _: &Request<u32>, _: usize, n: usize, _: usize) -> Result<usize> {
            Ok(n + 1)
        }
    }
    let mut s = Scheduler::new(
        SchedulerConfig {
            mamba_align: Some(MambaAlignSplit::new(4)),
            ..config()
        },
        false,
    )
    .unwrap();
    s.set_step_hooks(Some(Box::new(Grows)));
    s.add_request(0, prompt(0, 6)).unwrap();
    let err = s.schedule().unwrap_err().to_string();
    assert!(
        err.contains("mamba_split") && err.contains("returned 7"),
        "{err}"
    );
}

#[test]
fn no_sampled_token_per_step_set_on_a_built_scheduler_pads_no_admission() {
    // k = 2: request 1's one-token prompt joining a decode is padded to 3; with
    // num_sampled_tokens_per_step set to 0 (a diffusion model's) it keeps its one token.
    let run = |num_sampled| {
        let mut s = Scheduler::new(
            SchedulerConfig {
                num_speculative_tokens: 2,
                ..config()
            },
            false,
        )
        .unwrap();
        s.set_num_sampled_tokens_per_step(num_sampled).unwrap();
        s.add_request(
            0,
            RequestSpec {
                max_tokens: 20,
                ..prompt(0, 4)
            },
        )
        .unwrap();
        run_step(&mut s);
        s.add_request(1, prompt(1, 1)).unwrap();
        scheduled(&s.schedule().unwrap())
    };
    assert_eq!(run(1), [(0, 1), (1, 3)]);
    assert_eq!(run(0), [(0, 1), (1, 1)]);
    let mut s = Scheduler::<u32>::new(config(), false).unwrap();
    let err = s
        .set_num_sampled_tokens_per_step(2)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("num_sampled_tokens_per_step") && err.contains('2'),
        "{err}"
    );
    assert_eq!(s.num_sampled_tokens_per_step(), 1);
}

#[test]
fn a_refused_async_load_allocation_starts_no_load_until_granted() {
    // A connector offering every token asynchronously: the first allocation (the load's
    // blocks, no new tokens) is refused, so no load starts and the connector hears of no
    // blocks; the next step asks again and parks the request for its load.
    struct LoadsAll(Arc<Mutex<usize>>);
    impl crate::sched::KvConnector<u32> for LoadsAll {
        fn get_num_new_matched_tokens(
            &mut self,
            request: &Request<u32>,
            num_computed_tokens: usize,
        ) -> Result<Option<crate::sched::ExternalTokens>> {
            let num_tokens = request.num_tokens() - num_computed_tokens;
            let load_async = true;
            Ok(Some(crate::sched::ExternalTokens {
                num_tokens,
                load_async,
            }))
        }
        fn update_state_after_alloc(
            &mut self,
            _: &Request<u32>,
            _: &[BlockId],
            _: usize,
        ) -> Result<()> {
            *self.0.lock().unwrap() += 1;
            Ok(())
        }
        fn request_finished(&mut self, _: &Request<u32>, _: &[BlockId]) -> Result<bool> {
            Ok(false)
        }
    }
    let mut s = Scheduler::new(config(), false).unwrap();
    let allocs = Arc::new(Mutex::new(0));
    s.set_connector(Box::new(LoadsAll(allocs.clone()))).unwrap();
    let asked = Arc::new(Mutex::new(Vec::new()));
    s.set_step_hooks(Some(Box::new(Recorder {
        refuse: vec![1],
        asked: asked.clone(),
        ..Recorder::default()
    })));
    s.add_request(0, prompt(0, 8)).unwrap();
    let out = s.schedule().unwrap();
    assert!(out.kv_loads.is_empty());
    assert_eq!(*allocs.lock().unwrap(), 0);
    assert_eq!(s.num_free_blocks(), 64);
    let out = s.schedule().unwrap();
    assert_eq!(out.kv_loads.len(), 1);
    assert_eq!(*allocs.lock().unwrap(), 1);
    assert_eq!(
        s.get_request(&0).unwrap().status,
        RequestStatus::WaitingForRemoteKvs
    );
    assert_eq!(*asked.lock().unwrap(), [(0, 0), (0, 0)]);
}

/// A caller's `can_allocate` that refuses every encoder input while `refuse` is set.
struct EncoderGate(Arc<Mutex<bool>>);
impl StepHooks<u32> for EncoderGate {
    fn allow_encoder_input(
        &self,
        _request: &Request<u32>,
        input_index: usize,
        budget_left: usize,
        num_embeds_to_schedule: usize,
    ) -> Result<bool> {
        assert_eq!(
            (input_index, budget_left, num_embeds_to_schedule),
            (0, 600, 0)
        );
        Ok(!*self.0.lock().unwrap())
    }
}

#[test]
fn a_refused_encoder_input_schedules_only_the_text_before_it_and_leaves_the_cache() {
    // A 110-token prompt with a 100-token image at 10, budget 600: refused, the request
    // computes its 10 text tokens and the cache stays empty; allowed again, the image and
    // the rest (100 tokens) are scheduled with input 0.
    use super::encoder::{enc_config, image, mm_prompt};
    let refuse = Arc::new(Mutex::new(true));
    let mut s = Scheduler::new(enc_config(600, 4096), false).unwrap();
    s.set_step_hooks(Some(Box::new(EncoderGate(refuse.clone()))));
    s.add_request(0, mm_prompt(0, 110, vec![image(10, 100, "a")]))
        .unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 10)]);
    assert!(out.scheduled_encoder_inputs.is_empty());
    assert_eq!(s.encoder_cache_usage().0, 4096);
    *refuse.lock().unwrap() = false;
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 100)]);
    assert_eq!(out.scheduled_encoder_inputs, [(0, vec![0])]);
}
