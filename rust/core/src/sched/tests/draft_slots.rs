//! vLLM 0.33's draft slots (`max_num_new_slots_for_drafting`): each scheduled request takes
//! its tokens and the slots of the budget, gets at most the budget less the slots, and none
//! is scheduled once no more than the slots remain; beside `max_num_scheduled_tokens`, the
//! token budget kept apart (`sched::budget`).

use super::*;

fn with_slots(budget: usize, slots: usize) -> Scheduler<u32> {
    with_budgets(budget, 0, slots)
}

fn with_budgets(batched: usize, scheduled: u32, slots: usize) -> Scheduler<u32> {
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_num_batched_tokens: batched,
            max_num_scheduled_tokens: scheduled,
            ..config()
        },
        false,
    )
    .unwrap();
    s.set_num_draft_slots_per_request(slots);
    s
}

#[test]
fn admissions_pay_their_draft_slots_from_the_budget() {
    // vLLM's own case: budget 20, 3 slots, two 10-token prompts: 10 (13 taken), then
    // min(10, 7 - 3) = 4. Without slots: 10 and 10.
    let mut s = with_slots(20, 3);
    s.add_request(0, prompt(0, 10)).unwrap();
    s.add_request(1, prompt(1, 10)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 10), (1, 4)]);
    assert_eq!(s.num_draft_slots_per_request(), 3);
    let mut s = with_slots(20, 0);
    s.add_request(0, prompt(0, 10)).unwrap();
    s.add_request(1, prompt(1, 10)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 10), (1, 10)]);
}

#[test]
fn running_requests_stop_once_no_more_than_the_slots_remain() {
    // Budget 10, 3 slots: three 2-token prompts are admitted 2 + 3, 2 + 3, then 0 remain.
    // Decoding, each takes 1 + 3: two fit (2 left, not above 3), the third waits a step.
    let mut s = with_slots(10, 3);
    for id in 0..3 {
        s.add_request(
            id,
            RequestSpec {
                max_tokens: 10,
                ..prompt(id, 2)
            },
        )
        .unwrap();
    }
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 2), (1, 2)]);
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 1)]);
    s.set_num_draft_slots_per_request(0);
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 1), (2, 2)]);
}

#[test]
fn no_decode_window_opens_while_requests_take_draft_slots() {
    // A decode window charges one token per request: with draft slots it stays shut.
    let mut s = with_slots(20, 0);
    s.add_request(
        0,
        RequestSpec {
            max_tokens: 10,
            ..prompt(0, 2)
        },
    )
    .unwrap();
    run_step(&mut s);
    assert!(s.open_decode_window().is_some());
    s.set_num_draft_slots_per_request(3);
    assert!(s.open_decode_window().is_none());
}

fn two_prompts_of_ten(mut s: Scheduler<u32>) -> Vec<(u32, usize)> {
    s.add_request(0, prompt(0, 10)).unwrap();
    s.add_request(1, prompt(1, 10)).unwrap();
    scheduled(&s.schedule().unwrap())
}

#[test]
fn the_token_budget_is_kept_apart_from_the_input_budget() {
    // vLLM 0.33, input budget 20, 3 slots, token budget 12: 10 (tokens 2 left, input 7),
    // then min(2, 7 - 3) = 2. With one budget of 20: 10 then 4.
    assert_eq!(
        two_prompts_of_ten(with_budgets(20, 12, 3)),
        [(0, 10), (1, 2)]
    );
    // Token budget 30 above the input budget: the input budget binds (10, then 7 - 3).
    assert_eq!(
        two_prompts_of_ten(with_budgets(20, 30, 3)),
        [(0, 10), (1, 4)]
    );
    // No slots: the smaller budget binds.
    assert_eq!(
        two_prompts_of_ten(with_budgets(20, 12, 0)),
        [(0, 10), (1, 2)]
    );
    assert_eq!(
        two_prompts_of_ten(with_budgets(12, 20, 0)),
        [(0, 10), (1, 2)]
    );
}
