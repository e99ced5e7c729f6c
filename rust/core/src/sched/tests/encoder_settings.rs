//! The encoder budget and cache set on a built scheduler (as vLLM 0.33's tests assign
//! `scheduler.max_num_encoder_input_tokens` and `scheduler.encoder_cache_manager`): each
//! changes the next step's answer.

use super::encoder::{image, mm_prompt};
use super::*;
use crate::sched::*;

/// Budget 2048 tokens, 1024 blocks of 16; the encoder budget and cache default to 2048.
fn built() -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 2048,
        num_blocks: 1024,
        block_size: 16,
        max_model_len: 4096,
        ..config()
    };
    Scheduler::new(cfg, false).unwrap()
}

#[test]
fn a_budget_set_after_construction_holds_the_second_image_to_the_next_step() {
    // vLLM's test_max_loras_counts_running_request_skipped_for_encoder_budget: budget 100,
    // images of 100 at 0 and 150: the first step encodes one and stops at the second.
    let mut s = built();
    assert_eq!(s.encoder_budget(), 2048);
    s.set_encoder_budget(100);
    let items = vec![image(0, 100, "a0"), image(150, 100, "a1")];
    s.add_request(0, mm_prompt(0, 300, items)).unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 150)]);
    assert_eq!(out.scheduled_encoder_inputs, [(0, vec![0])]);
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 150)]);
    assert_eq!(out.scheduled_encoder_inputs, [(0, vec![1])]);
}

#[test]
fn a_zero_budget_schedules_only_the_text_before_an_image() {
    let mut s = built();
    s.add_request(0, mm_prompt(0, 60, vec![image(20, 30, "a")]))
        .unwrap();
    s.set_encoder_budget(0);
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 20)]);
    assert!(s.schedule().unwrap().num_scheduled_tokens.is_empty());
}

#[test]
fn a_cache_set_after_construction_bounds_the_items_and_drops_freeable_entries() {
    let mut s = built();
    s.set_encoder_cache_size(300).unwrap();
    assert_eq!(s.encoder_cache_usage(), (300, 300, 300));
    // An item larger than the new cache could never be scheduled: refused.
    let err = s.add_request(0, mm_prompt(0, 400, vec![image(0, 301, "big")]));
    assert!(
        err.unwrap_err()
            .to_string()
            .contains("encoder_cache_size=300")
    );
    s.add_request(1, mm_prompt(1, 120, vec![image(0, 100, "a")]))
        .unwrap();
    let out = s.schedule().unwrap();
    // Request 1 holds its entry until its step's output passes it: the cache cannot be
    // replaced under it.
    assert_eq!(s.encoder_cache_entries(), [("a".to_string(), vec![1])]);
    assert!(s.set_encoder_cache_size(200).is_err());
    answer_step(&mut s, out);
    while s.has_unfinished_requests() {
        run_step(&mut s);
    }
    assert_eq!(s.encoder_cache_freeable(), [("a".to_string(), 100)]);
    // Now only freeable: replaced; the worker hears the entry is gone with the next step.
    s.set_encoder_cache_size(200).unwrap();
    assert_eq!(s.encoder_cache_usage(), (200, 200, 200));
    assert_eq!(s.encoder_cache_freed(), ["a"]);
    assert_eq!(s.schedule().unwrap().free_encoder_mm_hashes, ["a"]);
    s.check_invariants().unwrap();
}
