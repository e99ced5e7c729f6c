//! What a step hands its caller for the step's end: the requests that sample
//! (`step_samplers`) with slot hints for `append_one_token_each_at`, the lean output, and
//! recycled output vectors.

use super::*;
use crate::sched::*;

/// Two prompts of 8 and 5 tokens under a budget of 10: 8 + 2. Only the first caught up.
fn two_requests() -> (Scheduler<u32>, SchedulerOutput<u32>) {
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, prompt(0, 8)).unwrap();
    s.add_request(1, prompt(1, 5)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 8), (1, 2)]);
    (s, out)
}

#[test]
fn step_samplers_are_the_requests_a_step_caught_up() {
    let (mut s, _) = two_requests();
    let ids: Vec<u32> = s.step_samplers().iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, [0], "request 1 has 3 prompt tokens left");
    // Next step: request 0 decodes one token, request 1 takes its last 3: both sample.
    s.append_one_token_each(&[0], |_, _| 7).unwrap();
    s.schedule().unwrap();
    let ids: Vec<u32> = s.step_samplers().iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, [0, 1]);
}

#[test]
fn a_slot_hint_that_holds_another_request_is_not_followed() {
    let (mut s, _) = two_requests();
    let slot_of_0 = s.step_samplers()[0].1;
    let tokens = |s: &Scheduler<u32>, id: u32| s.get_request(&id).unwrap().all_token_ids.clone();
    // Request 1 with request 0's slot as its hint: its own slot gets the token.
    s.append_one_token_each_at(&[(1, slot_of_0)], |_, _| 9)
        .unwrap();
    assert_eq!(tokens(&s, 1).len(), 6);
    assert_eq!(tokens(&s, 1).last(), Some(&9));
    assert_eq!(tokens(&s, 0).len(), 8, "request 0 is untouched");
    s.append_one_token_each_at(&[(0, slot_of_0)], |_, _| 7)
        .unwrap();
    assert_eq!(tokens(&s, 0).last(), Some(&7));
    // A hint past the slots is looked up by id; an unknown id is refused as before.
    s.append_one_token_each_at(&[(0, 99)], |_, _| 8).unwrap();
    assert_eq!(tokens(&s, 0)[8..], [7, 8]);
    assert!(
        s.append_one_token_each_at(&[(5, slot_of_0)], |_, _| 7)
            .is_err()
    );
}

#[test]
fn lean_output_leaves_running_requests_out_and_keeps_their_counts() {
    let run = |lean: bool| {
        let mut s = Scheduler::new(config(), false).unwrap();
        s.set_lean_output(lean);
        s.add_request(0, prompt(0, 3)).unwrap();
        s.add_request(1, prompt(1, 3)).unwrap();
        run_step(&mut s);
        s.schedule().unwrap()
    };
    let (full, lean) = (run(false), run(true));
    assert_eq!(scheduled(&full), [(0, 1), (1, 1)]);
    assert_eq!(scheduled(&lean), scheduled(&full));
    assert_eq!(full.scheduled_running_reqs.len(), 2);
    assert!(lean.scheduled_running_reqs.is_empty());
}

#[test]
fn a_recycled_output_changes_no_later_step() {
    let run = |recycle: bool| {
        let mut s = Scheduler::new(config(), false).unwrap();
        for id in 0..4 {
            s.add_request(id, prompt(id, 3 + id as usize)).unwrap();
        }
        let mut outs = Vec::new();
        for _ in 0..8 {
            let out = run_step(&mut s);
            outs.push(out.clone());
            if recycle {
                s.recycle_output(out);
            }
        }
        outs
    };
    assert_eq!(run(true), run(false));
}
