//! vLLM 0.33's prefill cadence (`prefill_schedule_interval`) and DP prefill throttling
//! (`schedule_throttled`), their capacity escape, and the deferred-waiting count.

use super::*;
use crate::sched::*;

fn cadence_config(interval: usize) -> SchedulerConfig {
    SchedulerConfig {
        prefill_schedule_interval: interval,
        ..config()
    }
}

fn long(id: u32, len: usize) -> RequestSpec {
    RequestSpec {
        max_tokens: 40,
        ..prompt(id, len)
    }
}

fn ids(out: &SchedulerOutput<u32>) -> Vec<u32> {
    out.num_scheduled_tokens.iter().map(|&(id, _)| id).collect()
}

/// Request 0 prefilled (executed step 1) and decoding.
fn decoding(cfg: SchedulerConfig) -> Scheduler<u32> {
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.add_request(0, long(0, 4)).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 4)]);
    s
}

#[test]
fn interval_3_admits_a_prompt_behind_a_decode_on_the_third_step_after_the_last_prefill() {
    let mut s = decoding(cadence_config(3));
    assert_eq!(s.last_prefill_step(), 1);
    s.add_request(1, long(1, 4)).unwrap();
    // Executed steps 2 and 3 are 1 and 2 steps after the prefill: held, 0 decodes alone.
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1)]);
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1)]);
    // Step 4 is 3 after it: released, and it restarts the interval.
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 4)]);
    assert_eq!((s.num_executed_steps(), s.last_prefill_step()), (4, 4));
}

#[test]
fn interval_1_the_default_admits_at_once() {
    let mut s = decoding(config());
    s.add_request(1, long(1, 4)).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 4)]);
}

#[test]
fn cadence_never_holds_prefill_with_nothing_decoding() {
    // A lone 25-token prompt under a budget of 10 runs its chunks back to back.
    let mut s = Scheduler::new(cadence_config(4), false).unwrap();
    s.add_request(0, long(0, 25)).unwrap();
    for n in [10, 10, 5] {
        assert_eq!(scheduled(&run_step(&mut s)), [(0, n)]);
    }
    assert_eq!(s.last_prefill_step(), 3);
}

#[test]
fn empty_schedule_calls_do_not_advance_the_cadence() {
    let mut s = decoding(cadence_config(3));
    s.add_request(1, long(1, 4)).unwrap();
    // A decode left in flight (synchronous: nothing more can run until it is reported),
    // then two calls that schedule nothing.
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 1)]);
    for _ in 0..2 {
        assert_eq!(s.schedule().unwrap().total_num_scheduled_tokens, 0);
    }
    assert_eq!(s.num_executed_steps(), 2);
    s.update_from_output(&[sample(0, 7)]).unwrap();
    // Executed step 3 is still held; step 4 releases.
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1)]);
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 4)]);
}

#[test]
fn cadence_holds_a_running_prefill_chunk_too() {
    // Interval 2, budget 10: 1 (30 tokens) starts on step 3 with 9, is held on step 4,
    // resumes on step 5.
    let mut s = decoding(cadence_config(2));
    s.add_request(1, long(1, 30)).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1)]);
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 9)]);
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1)]);
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 9)]);
}

#[test]
fn cadence_lets_a_whole_prefix_hit_through() {
    // A prompt hit in full but its last token has no prefill to hold.
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        ..cadence_config(4)
    };
    let mut s = decoding(cfg);
    let shared = || RequestSpec {
        prompt_token_ids: (500..509).collect(),
        max_tokens: 40,
        ..RequestSpec::default()
    };
    s.add_request(1, shared()).unwrap();
    // Held three steps, then released at step 5 (1 + 4).
    for _ in 0..3 {
        assert_eq!(ids(&run_step(&mut s)), [0]);
    }
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 9)]);
    assert_eq!(s.last_prefill_step(), 5);
    // 2 repeats 1's prompt: 8 tokens hit, 1 left; it is admitted on a held step and does
    // not restart the interval.
    s.add_request(2, shared()).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 1), (2, 1)]);
    assert_eq!(s.last_prefill_step(), 5);
}

#[test]
fn throttled_step_defers_admission_while_a_request_decodes() {
    let mut s = decoding(config());
    s.add_request(1, long(1, 4)).unwrap();
    let out = s.schedule_throttled(true).unwrap();
    assert_eq!(scheduled(&out), [(0, 1)]);
    s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1), (1, 4)]);
}

#[test]
fn throttled_step_admits_when_nothing_decodes() {
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, long(0, 4)).unwrap();
    assert_eq!(scheduled(&s.schedule_throttled(true).unwrap()), [(0, 4)]);
}

#[test]
fn throttled_step_defers_a_running_prefill_chunk() {
    let mut s = decoding(config());
    s.add_request(1, long(1, 30)).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 9)]);
    let out = s.schedule_throttled(true).unwrap();
    assert_eq!(scheduled(&out), [(0, 1)]);
    s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 1), (1, 9)]);
}

#[test]
fn capacity_escape_a_release_that_leaves_the_queue_undrained_lifts_the_throttle() {
    // Budget 10: a takes it all on the release step, b is left waiting.
    let mut s = Scheduler::new(config(), false).unwrap();
    s.add_request(0, long(0, 10)).unwrap();
    s.add_request(1, long(1, 10)).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 10)]);
    assert!(s.prefill_capacity_bound());
    // Throttled, with 0 decoding: b is admitted anyway (9 of its 10 tokens).
    assert_eq!(scheduled(&run_step_throttled(&mut s)), [(0, 1), (1, 9)]);
    // That release drained the queue: the throttle holds again (b's last token waits).
    assert!(!s.prefill_capacity_bound());
    assert_eq!(scheduled(&run_step_throttled(&mut s)), [(0, 1)]);
}

#[test]
fn capacity_escape_lifts_the_cadence_too() {
    let mut s = Scheduler::new(cadence_config(4), false).unwrap();
    s.add_request(0, long(0, 10)).unwrap();
    s.add_request(1, long(1, 10)).unwrap();
    s.add_request(2, long(2, 10)).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 10)]);
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 9)]);
    assert!(s.prefill_capacity_bound());
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 1), (2, 8)]);
    // The queue drained: held again (2's last 2 tokens wait), decodes only.
    assert!(!s.prefill_capacity_bound());
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 1), (1, 1)]);
}

fn run_step_throttled(s: &mut Scheduler<u32>) -> SchedulerOutput<u32> {
    let out = s.schedule_throttled(true).unwrap();
    answer_step(s, out)
}

#[test]
fn skipped_requests_count_as_deferred_and_do_not_make_a_step_capacity_bound() {
    let cfg = SchedulerConfig {
        max_loras: 1,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    let with_lora = |id: u32, lora: u64| RequestSpec {
        lora_id: Some(lora),
        ..long(id, 4)
    };
    s.add_request(0, with_lora(0, 1)).unwrap();
    s.add_request(1, with_lora(1, 2)).unwrap();
    assert_eq!(scheduled(&run_step(&mut s)), [(0, 4)]);
    assert_eq!(s.stats().num_deferred_waiting, 1);
    assert_eq!(s.deferred_waiting_ids(), [1]);
    assert!(!s.prefill_capacity_bound());
    s.abort(&[1]).unwrap();
    assert_eq!(s.stats().num_deferred_waiting, 0);
}

#[test]
fn interval_0_is_refused() {
    let err = Scheduler::<u32>::new(cadence_config(0), false)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("prefill_schedule_interval"),
        "{err}"
    );
}
