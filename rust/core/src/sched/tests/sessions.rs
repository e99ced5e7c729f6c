//! Streaming-input sessions (`sched::session`, vLLM 0.33's resumable requests): a turn that
//! stops parks the request with its blocks, and the next input chunk resumes it from its
//! computed tokens.

use super::*;
use crate::Error;

fn session(id: u32, len: usize) -> RequestSpec {
    RequestSpec {
        resumable: true,
        eos_token_id: Some(7),
        ..prompt(id, len)
    }
}

fn update(tokens: &[u32]) -> SessionUpdate {
    SessionUpdate {
        prompt_token_ids: tokens.to_vec(),
        max_tokens: 4,
        eos_token_id: Some(7),
        ..SessionUpdate::default()
    }
}

#[test]
fn a_stopped_session_parks_with_its_blocks_and_is_reported_stopped() {
    // A 6-token prompt (2 blocks of 4) samples EOS: reported as stopped, but parked with its
    // 2 blocks and its 6 computed tokens, among the waiting block holders (skipped there).
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, session(0, 6)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 6)]);
    let finished = s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(finished, [(0, FinishReason::Stop)]);
    let r = s.get_request(&0).unwrap();
    assert_eq!(r.status, RequestStatus::WaitingForStreamingInput);
    assert_eq!(r.num_computed_tokens, 6);
    assert_eq!(s.block_ids(&0).unwrap().len(), 2);
    assert_eq!(
        (s.num_running(), s.num_waiting(), s.num_parked()),
        (0, 1, 1)
    );
    assert!(!s.has_unfinished_requests());
    assert!(s.finished_since_last_step.is_empty());
    assert_eq!(s.deferred_waiting_ids(), [0]);
    assert!(s.schedule().unwrap().num_scheduled_tokens.is_empty());
    s.check_invariants().unwrap();
}

#[test]
fn a_resumed_session_computes_only_its_new_chunk_in_the_same_blocks() {
    // Parked at 6 computed of 7 tokens (its EOS is dropped on resume), the 3-token chunk
    // makes a 9-token prompt: 3 tokens scheduled, the first 2 blocks kept, one new block.
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, session(0, 6)).unwrap();
    run_step(&mut s);
    let blocks = s.block_ids(&0).unwrap().to_vec();
    s.resume_session(&0, update(&[50, 51, 52])).unwrap();
    let r = s.get_request(&0).unwrap();
    assert_eq!((r.num_prompt_tokens(), r.num_computed_tokens), (9, 6));
    assert_eq!(&r.all_token_ids[6..], [50, 51, 52]);
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 3)]);
    let new = &out.scheduled_new_reqs[0];
    assert_eq!(new.num_computed_tokens, 6);
    assert_eq!(&new.block_ids[..2], &blocks[..]);
    assert_eq!(new.block_ids.len(), 3);
    s.check_invariants().unwrap();
}

#[test]
fn kept_outputs_join_the_prompt_and_max_tokens_restarts() {
    // Two turns of output (8 then EOS) keep 8 as a prompt token; the new turn may sample
    // its own max_tokens.
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, session(0, 4)).unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[sample(0, 8)]).unwrap();
    s.schedule().unwrap();
    let finished = s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(finished, [(0, FinishReason::Stop)]);
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 5);
    s.resume_session(&0, update(&[60])).unwrap();
    let r = s.get_request(&0).unwrap();
    assert_eq!(&r.all_token_ids[4..], [8, 60]);
    assert_eq!((r.num_prompt_tokens(), r.num_output_tokens()), (6, 0));
    s.check_invariants().unwrap();
}

#[test]
fn a_parked_session_holds_a_sequence_slot() {
    // max_num_seqs 1: the parked session keeps the slot, so a new request waits until it
    // is aborted.
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: 1,
            ..config()
        },
        false,
    )
    .unwrap();
    s.add_request(0, session(0, 4)).unwrap();
    run_step(&mut s);
    s.add_request(1, prompt(1, 4)).unwrap();
    assert!(s.schedule().unwrap().num_scheduled_tokens.is_empty());
    s.abort(&[0]).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 4)]);
    assert_eq!(s.num_parked(), 0);
    s.check_invariants().unwrap();
}

#[test]
fn a_session_stopping_with_steps_in_flight_parks_at_its_landed_frontier() {
    // Async: three steps in flight (prefill, then two decodes on placeholders); the first
    // samples EOS. The frontier is the 4 prompt tokens; the other two steps' outputs are
    // no longer expected.
    let mut s = Scheduler::new(config(), true).unwrap();
    s.add_request(0, session(0, 4)).unwrap();
    for _ in 0..3 {
        s.schedule().unwrap();
    }
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 6);
    s.update_from_output(&[sample(0, 7)]).unwrap();
    let r = s.get_request(&0).unwrap();
    assert_eq!((r.num_computed_tokens, r.num_output_placeholders), (4, 0));
    assert_eq!(s.num_outputs_in_flight(&0), 0);
    let err = s.update_from_output(&[sample(0, 9)]).unwrap_err();
    assert!(err.to_string().contains("not running"), "{err}");
    s.check_invariants().unwrap();
}

#[test]
fn only_a_parked_session_resumes() {
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, session(0, 4)).unwrap();
    let err = s.resume_session(&0, update(&[1])).unwrap_err();
    assert!(matches!(err, Error::Input { .. }), "{err:?}");
    assert!(s.resume_session(&5, update(&[1])).is_err());
    // A non-resumable request finishes as usual.
    let plain = RequestSpec {
        eos_token_id: Some(7),
        ..prompt(1, 4)
    };
    s.add_request(1, plain).unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[sample(0, 7), sample(1, 7)]).unwrap();
    assert_eq!(s.num_parked(), 1);
    assert!(s.get_request(&1).is_none());
    // Too long a chunk is refused, the session unchanged.
    let err = s.resume_session(&0, update(&[1; 64])).unwrap_err();
    assert!(err.to_string().contains("max_model_len"), "{err}");
    assert_eq!(s.num_parked(), 1);
    s.check_invariants().unwrap();
}

#[test]
fn resumed_sessions_are_admitted_in_the_order_they_parked() {
    // A parks before B; B's chunk comes first. vLLM keeps each where it parked in
    // `kv_holding_waiting`: A (resumed second) is still admitted first.
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, session(0, 4)).unwrap();
    s.add_request(1, session(1, 4)).unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[sample(0, 7), sample(1, 8)]).unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[sample(1, 7)]).unwrap();
    s.resume_session(&1, update(&[70, 71, 72])).unwrap();
    s.resume_session(&0, update(&[80, 81, 82, 83, 84])).unwrap();
    assert_eq!(s.waiting_ids(), [0, 1]);
    // A: 4 computed + 5 new; B: 5 computed (its 8 kept) + 3 new.
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 5), (1, 3)]);
    s.check_invariants().unwrap();
}

#[test]
fn a_preempted_session_stopping_on_a_late_output_parks_without_blocks() {
    // Async: preempted while its prefill's step is in flight, whose output is EOS. vLLM
    // parks it all the same (`stopped_preempted_reqs`), with nothing computed: it waits
    // among the requests holding no blocks, and its 2-token chunk makes a 6-token prompt
    // computed from scratch.
    let mut s = Scheduler::new(config(), true).unwrap();
    s.add_request(0, session(0, 4)).unwrap();
    s.schedule().unwrap();
    s.preempt_request(&0).unwrap();
    let finished = s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(finished, [(0, FinishReason::Stop)]);
    let r = s.get_request(&0).unwrap();
    assert_eq!(r.status, RequestStatus::WaitingForStreamingInput);
    assert_eq!((r.num_computed_tokens, s.block_ids(&0)), (0, None));
    assert_eq!((s.num_waiting(), s.num_parked()), (1, 1));
    s.check_invariants().unwrap();
    s.resume_session(&0, update(&[90, 91])).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 6)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 0);
    s.check_invariants().unwrap();
}

#[test]
fn a_session_with_an_empty_first_chunk_waits_and_is_skipped_each_step() {
    // vLLM 0.33 queues it; each step that reaches it finds 0 tokens to compute and skips it
    // (deferred), going on to the request behind it. It never stops, so never parks.
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, session(0, 0)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    for _ in 0..3 {
        let out = run_step(&mut s);
        assert!(scheduled(&out).iter().all(|&(id, _)| id == 1));
        assert_eq!(s.get_request(&0).unwrap().status, RequestStatus::Waiting);
        assert_eq!(s.deferred_waiting_ids(), [0]);
        s.check_invariants().unwrap();
    }
    assert_eq!((s.num_waiting(), s.num_parked()), (1, 0));
    assert!(s.has_unfinished_requests());
    // Not resumable: an empty prompt is refused as before.
    let err = s.add_request(2, prompt(2, 0)).unwrap_err();
    assert!(err.to_string().contains("must not be empty"), "{err}");
    s.abort(&[0]).unwrap();
    assert_eq!(s.num_waiting(), 0);
    s.check_invariants().unwrap();
}

#[test]
fn a_chunk_for_a_wait_set_by_hand_is_admitted_from_the_computed_tokens_set() {
    // A 3-token session queued, never scheduled; by hand one output (10) and 3 computed
    // tokens. Its 2-token chunk drops the 10: prompt [0, 1, 2, 50, 51], 3 computed, and it
    // is admitted from there (2 tokens, new blocks for all 5), not looked up.
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, session(0, 3)).unwrap();
    s.add_request(1, prompt(1, 2)).unwrap();
    s.resume_unparked_session(&0, &[10], 3, update(&[50, 51]))
        .unwrap();
    let r = s.get_request(&0).unwrap();
    assert_eq!(r.all_token_ids, [0, 1, 2, 50, 51]);
    assert_eq!((r.num_prompt_tokens(), r.num_computed_tokens), (5, 3));
    assert_eq!(s.waiting_ids(), [0, 1]);
    assert_eq!(s.num_unparked_resumes(), 1);
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 2), (1, 2)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 3);
    assert_eq!(s.block_ids(&0).unwrap().len(), 2);
    s.check_invariants().unwrap();
}

#[test]
fn a_chunk_for_a_wait_set_by_hand_is_refused_where_vllm_asserts() {
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, session(0, 3)).unwrap();
    // The last token counted computed (vLLM asserts it is not): nothing changes.
    let err = (s.resume_unparked_session(&0, &[10], 4, update(&[50]))).unwrap_err();
    assert!(err.to_string().contains("num_computed_tokens"), "{err}");
    assert_eq!(s.get_request(&0).unwrap().all_token_ids, [0, 1, 2]);
    // A session scheduled since, or parked, is not queued untouched.
    run_step(&mut s);
    let err = (s.resume_unparked_session(&0, &[], 1, update(&[50]))).unwrap_err();
    assert!(err.to_string().contains("untouched"), "{err}");
    assert_eq!(s.num_unparked_resumes(), 0);
    s.check_invariants().unwrap();
}

#[test]
fn a_chunks_image_lands_after_the_kept_tokens_and_is_encoded_on_resume() {
    // A 20-token session with a 16-token image at 2 stops on its first output (EOS). Its
    // chunk of 3 text tokens then a 16-token image (at 3 in the chunk) starts the image at
    // 20 + 3 = 23 (the EOS dropped); the resume schedules the 20 new tokens with input 1.
    use super::encoder::{enc_config, image};
    let mut s = Scheduler::new(enc_config(64, 64), false).unwrap();
    let spec = RequestSpec {
        mm_features: vec![image(2, 16, "a")],
        ..session(0, 20)
    };
    s.add_request(0, spec).unwrap();
    let out = run_step(&mut s);
    assert_eq!(out.scheduled_encoder_inputs, [(0, vec![0])]);
    assert_eq!(s.num_parked(), 1);
    let mut chunk = update(&[50, 51, 52]);
    chunk.prompt_token_ids.extend([9; 17]);
    chunk.mm_features = vec![image(3, 16, "b")];
    s.resume_session(&0, chunk).unwrap();
    let r = s.get_request(&0).unwrap();
    assert_eq!((r.num_prompt_tokens(), r.num_computed_tokens), (40, 20));
    assert_eq!(r.spec.mm_features, [image(2, 16, "a"), image(23, 16, "b")]);
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 20)]);
    assert_eq!(out.scheduled_encoder_inputs, [(0, vec![1])]);
    s.check_invariants().unwrap();
}

#[test]
fn a_chunks_images_are_checked_over_the_new_prompt_and_refused_by_name() {
    // Past the chunk's end or longer than the encoder budget: each refused naming
    // mm_features, the session still parked and unchanged.
    use super::encoder::{enc_config, image};
    let mut s = Scheduler::new(enc_config(16, 64), false).unwrap();
    s.add_request(0, session(0, 6)).unwrap();
    run_step(&mut s);
    let with = |items: Vec<MmFeature>| SessionUpdate {
        mm_features: items,
        ..update(&[9; 8])
    };
    for items in [
        vec![image(4, 8, "x")],
        vec![image(0, 8, "x"), image(4, 4, "y")],
    ] {
        let err = s.resume_session(&0, with(items)).unwrap_err();
        assert!(matches!(
            err,
            Error::Input {
                arg: "mm_features",
                ..
            }
        ));
    }
    let mut s = Scheduler::new(enc_config(4, 64), false).unwrap();
    s.add_request(0, session(0, 6)).unwrap();
    run_step(&mut s);
    let err = s
        .resume_session(&0, with(vec![image(0, 8, "x")]))
        .unwrap_err();
    assert!(matches!(
        err,
        Error::Input {
            arg: "mm_features",
            ..
        }
    ));
    assert_eq!(s.num_parked(), 1);
    assert_eq!(s.get_request(&0).unwrap().num_prompt_tokens(), 6);
}

#[test]
fn a_hand_set_chunks_image_is_encoded_from_the_computed_tokens_set() {
    // A 6-token session queued and never scheduled gets an output (8) and 4 computed
    // tokens by hand, then a chunk of 8 tokens with a 4-token image at 0: the image lands
    // at 6 (the 8 dropped), and admission schedules the 10 tokens past the 4 computed
    // with encoder input 0, as vLLM 0.33's branch for a waiting request with computed
    // tokens does. An image past the chunk is refused by name, the session unchanged.
    use super::encoder::{enc_config, image};
    let mut s = Scheduler::new(enc_config(4, 64), false).unwrap();
    s.add_request(1, session(1, 6)).unwrap();
    let with = |items: Vec<MmFeature>| SessionUpdate {
        mm_features: items,
        ..update(&[9; 8])
    };
    let err = s
        .resume_unparked_session(&1, &[8], 4, with(vec![image(6, 4, "x")]))
        .unwrap_err();
    assert!(matches!(
        err,
        Error::Input {
            arg: "mm_features",
            ..
        }
    ));
    assert_eq!(s.get_request(&1).unwrap().num_prompt_tokens(), 6);
    s.resume_unparked_session(&1, &[8], 4, with(vec![image(0, 4, "x")]))
        .unwrap();
    let r = s.get_request(&1).unwrap();
    assert_eq!((r.num_prompt_tokens(), r.num_computed_tokens), (14, 4));
    assert_eq!(r.spec.mm_features, [image(6, 4, "x")]);
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(1, 10)]);
    assert_eq!(out.scheduled_encoder_inputs, [(1, vec![0])]);
    s.check_invariants().unwrap();
}
