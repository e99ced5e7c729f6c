//! An encoder-cache connector beside the encoder budget and cache (vLLM 0.33's
//! `ECConnectorBase.has_cache_item` in `_try_schedule_encoder_inputs`): an item it holds
//! takes cache room, no budget, and is not encoded; `update_state_after_free` in
//! `_free_encoder_input`, from an update only.

use std::sync::{Arc, Mutex};

use super::encoder::{enc_config, image, mm_prompt};
use super::*;
use crate::sched::*;

/// Holds the items named in `held`; logs its calls; fails on `"bad"`.
struct Holds {
    held: Vec<&'static str>,
    log: Arc<Mutex<Vec<String>>>,
}

impl EncoderConnector<u32> for Holds {
    fn has_cache_item(&mut self, identifier: &str) -> crate::Result<bool> {
        self.log.lock().unwrap().push(format!("has {identifier}"));
        if identifier == "bad" {
            return Err(crate::Error::connector(
                "has_cache_item",
                identifier,
                "refused",
            ));
        }
        Ok(self.held.contains(&identifier))
    }

    fn update_state_after_alloc(
        &mut self,
        request: &Request<u32>,
        input_id: usize,
    ) -> crate::Result<()> {
        self.log
            .lock()
            .unwrap()
            .push(format!("alloc {} {input_id}", request.request_id));
        Ok(())
    }

    fn update_state_after_free(
        &mut self,
        request: &Request<u32>,
        input_id: usize,
    ) -> crate::Result<()> {
        self.log
            .lock()
            .unwrap()
            .push(format!("free {} {input_id}", request.request_id));
        if request.spec.mm_features[input_id].identifier == "badfree" {
            return Err(crate::Error::connector(
                "update_state_after_free",
                "badfree",
                "refused",
            ));
        }
        Ok(())
    }
}

fn with_holds(
    budget: usize,
    cache: usize,
    held: Vec<&'static str>,
) -> (Scheduler<u32>, Arc<Mutex<Vec<String>>>) {
    let mut s = Scheduler::new(enc_config(budget, cache), false).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    s.set_encoder_connector(Some(Box::new(Holds {
        held,
        log: log.clone(),
    })));
    (s, log)
}

#[test]
fn an_item_the_connector_holds_takes_cache_room_but_no_budget_and_is_not_encoded() {
    // Budget 100: image "a" (100) is held by the connector, so image "b" (100) still fits
    // the budget and is the only one encoded; both take cache room (200 of 300).
    let (mut s, log) = with_holds(100, 300, vec!["a"]);
    s.add_request(
        0,
        mm_prompt(0, 220, vec![image(0, 100, "a"), image(110, 100, "b")]),
    )
    .unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 220)]);
    assert_eq!(out.scheduled_encoder_inputs, [(0, vec![1])]);
    assert_eq!(s.encoder_cache_usage(), (100, 100, 300), "200 of 300 taken");
    assert_eq!(
        *log.lock().unwrap(),
        // vLLM's order: the inputs to encode, then the held ones.
        ["has a", "has b", "alloc 0 1", "alloc 0 0"]
    );
}

#[test]
fn without_the_connector_the_same_items_wait_for_budget() {
    let mut s = Scheduler::new(enc_config(100, 300), false).unwrap();
    s.add_request(
        0,
        mm_prompt(0, 220, vec![image(0, 100, "a"), image(110, 100, "b")]),
    )
    .unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 110)], "stops before image b");
    assert_eq!(out.scheduled_encoder_inputs, [(0, vec![0])]);
}

#[test]
fn a_connector_error_is_returned_and_the_step_kept() {
    let (mut s, _) = with_holds(1000, 1000, vec![]);
    s.add_request(0, mm_prompt(0, 120, vec![image(10, 100, "bad")]))
        .unwrap();
    let err = s.schedule().unwrap_err();
    assert!(err.to_string().contains("has_cache_item"), "{err}");
    // The step was formed without the connector's answer (encoded) and comes next.
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 120)]);
    assert_eq!(out.scheduled_encoder_inputs, [(0, vec![0])]);
    s.set_encoder_connector(None);
    assert!(!s.has_encoder_connector());
}

/// Answers `ensure_cache_available` false for the requests in `transit`; logs each ask.
struct Transit {
    transit: Arc<Mutex<Vec<u32>>>,
    log: Arc<Mutex<Vec<(u32, usize)>>>,
}

impl EncoderConnector<u32> for Transit {
    fn has_cache_item(&mut self, _identifier: &str) -> crate::Result<bool> {
        Ok(false)
    }

    fn update_state_after_alloc(&mut self, _: &Request<u32>, _: usize) -> crate::Result<()> {
        Ok(())
    }

    fn ensure_cache_available(
        &mut self,
        request: &Request<u32>,
        num_computed_tokens: usize,
    ) -> crate::Result<bool> {
        let id = request.request_id;
        self.log.lock().unwrap().push((id, num_computed_tokens));
        Ok(!self.transit.lock().unwrap().contains(&id))
    }
}

#[test]
fn a_request_whose_encoder_input_is_in_transit_is_skipped_running_or_waiting() {
    // vLLM 0.33's `_ec_transfer_pending` (waiting: skip_request, its place kept) and the
    // running loop's `ensure_cache_available` check (skipped for the step, still running).
    let config = SchedulerConfig {
        max_num_batched_tokens: 100,
        ..enc_config(1000, 1000)
    };
    let mut s = Scheduler::new(config, false).unwrap();
    let transit = Arc::new(Mutex::new(vec![0]));
    let log = Arc::new(Mutex::new(Vec::new()));
    s.set_encoder_connector(Some(Box::new(Transit {
        transit: transit.clone(),
        log: log.clone(),
    })));
    s.add_request(0, mm_prompt(0, 150, vec![image(10, 40, "a")]))
        .unwrap();
    s.add_request(
        1,
        RequestSpec {
            max_tokens: 8,
            ..prompt(1, 30)
        },
    )
    .unwrap();
    let out = run_step(&mut s);
    assert_eq!(
        scheduled(&out),
        [(1, 30)],
        "0 waits, 1 behind it is admitted"
    );
    assert_eq!(s.waiting_ids(), [0], "0 keeps its place");
    transit.lock().unwrap().clear();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(1, 1), (0, 99)]);
    // Its next chunk's input in transit: running, skipped this step.
    transit.lock().unwrap().push(0);
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(1, 1)]);
    assert_eq!(s.running_ids(), [1, 0]);
    // Asked with what was computed: 0 while waiting (no hit), then its landed frontier;
    // the text-only request is never asked.
    assert_eq!(*log.lock().unwrap(), [(0, 0), (0, 0), (0, 99)]);
}

fn frees(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    let log = log.lock().unwrap();
    log.iter()
        .filter(|e| e.starts_with("free"))
        .cloned()
        .collect()
}

#[test]
fn an_update_reports_each_item_it_lets_go_once_its_range_is_computed() {
    // vLLM 0.33's `_free_encoder_inputs` in `update_from_output`: chunks of 100 tokens;
    // image a (10..50) is passed by the first update, b (100..140) by the second.
    let config = SchedulerConfig {
        max_num_batched_tokens: 100,
        ..enc_config(1000, 1000)
    };
    let mut s = Scheduler::new(config, false).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    s.set_encoder_connector(Some(Box::new(Holds {
        held: vec![],
        log: log.clone(),
    })));
    s.add_request(
        0,
        mm_prompt(0, 150, vec![image(10, 40, "a"), image(100, 40, "b")]),
    )
    .unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 100)]);
    assert!(
        frees(&log).is_empty(),
        "nothing is let go while a step is formed"
    );
    answer_step(&mut s, out);
    assert_eq!(frees(&log), ["free 0 0"]);
    run_step(&mut s);
    assert_eq!(frees(&log), ["free 0 0", "free 0 1"]);
    // Nothing is left to let go: later updates and the finish report nothing.
    run_step(&mut s);
    assert_eq!(
        s.running_ids(),
        Vec::<u32>::new(),
        "finished after 2 tokens"
    );
    assert_eq!(frees(&log), ["free 0 0", "free 0 1"]);
}

#[test]
fn a_finish_or_preemption_before_the_item_is_passed_reports_no_free() {
    // vLLM frees the encoder cache of a finished or preempted request without the
    // connector's `update_state_after_free` (`_free_request`, `_preempt_request`).
    let config = SchedulerConfig {
        max_num_batched_tokens: 50,
        ..enc_config(1000, 1000)
    };
    let mut s = Scheduler::new(config, false).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    s.set_encoder_connector(Some(Box::new(Holds {
        held: vec![],
        log: log.clone(),
    })));
    s.add_request(0, mm_prompt(0, 150, vec![image(40, 40, "a")]))
        .unwrap();
    run_step(&mut s);
    s.abort(&[0]).unwrap();
    run_step(&mut s);
    assert!(frees(&log).is_empty(), "{:?}", log.lock().unwrap());
    assert_eq!(s.encoder_cache_refs("a"), 0, "the abort let it go");
}

#[test]
fn a_connector_error_on_free_is_returned_after_the_update_is_applied() {
    let (mut s, log) = with_holds(1000, 1000, vec![]);
    s.add_request(
        0,
        mm_prompt(0, 120, vec![image(0, 10, "badfree"), image(20, 10, "c")]),
    )
    .unwrap();
    let out = s.schedule().unwrap();
    let outputs = [SampledOutput {
        request_id: 0,
        token_ids: vec![7],
        ..Default::default()
    }];
    let err = s.update_from_output(&outputs).unwrap_err();
    assert!(err.to_string().contains("update_state_after_free"), "{err}");
    // The update was applied: both items let go, the token appended; the connector was
    // told of the first only.
    assert_eq!(frees(&log), ["free 0 0"]);
    assert_eq!(s.encoder_cache_refs("c"), 0);
    assert_eq!(s.get_request(&0).unwrap().num_tokens(), 121);
    drop(out);
}

/// Answers delay-free `true` from `request_finished` for the requests in `hold`; logs it.
struct DelaysFree {
    hold: Vec<u32>,
    log: Arc<Mutex<Vec<String>>>,
}

impl EncoderConnector<u32> for DelaysFree {
    fn has_cache_item(&mut self, _: &str) -> crate::Result<bool> {
        Ok(false)
    }

    fn update_state_after_alloc(&mut self, _: &Request<u32>, _: usize) -> crate::Result<()> {
        Ok(())
    }

    fn request_finished(&mut self, request: &Request<u32>) -> crate::Result<bool> {
        let id = request.request_id;
        self.log.lock().unwrap().push(format!("finished {id}"));
        Ok(self.hold.contains(&id))
    }
}

#[test]
fn a_delay_free_answer_keeps_the_blocks_until_the_send_is_reported() {
    // vLLM 0.33's `_free_request` ORs the answer into the KV connector's (none here): the
    // request's blocks stay allocated until `finished_sending` lists it; its encoder-cache
    // entries are freed at once. Request 1's answer is false: freed at once.
    let mut s = Scheduler::new(enc_config(1000, 1000), false).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    s.set_encoder_connector(Some(Box::new(DelaysFree {
        hold: vec![0],
        log: log.clone(),
    })));
    let free = s.num_free_blocks();
    s.add_request(0, mm_prompt(0, 40, vec![image(0, 20, "a")]))
        .unwrap();
    s.add_request(1, mm_prompt(1, 40, vec![image(0, 20, "b")]))
        .unwrap();
    run_step(&mut s);
    run_step(&mut s);
    assert_eq!(s.running_ids(), Vec::<u32>::new(), "both finished");
    assert_eq!(*log.lock().unwrap(), ["finished 0", "finished 1"]);
    assert_eq!(
        s.encoder_cache_refs("a"),
        0,
        "its encoder-cache entry is freed"
    );
    assert_eq!(s.num_kv_transfers(), (0, 1));
    assert_eq!(
        s.num_free_blocks(),
        free - 3,
        "request 0 keeps its 3 blocks"
    );
    s.check_invariants().unwrap();
    s.finish_kv_transfers(&[], &[0], &[]).unwrap();
    assert_eq!(s.num_free_blocks(), free);
    assert_eq!(s.num_kv_transfers(), (0, 0));
    s.check_invariants().unwrap();
}
