//! Policy plugins: their orders take effect; invalid answers change nothing.

use super::*;
use crate::Error;
use crate::sched::*;

/// Admits shortest prompts first; preempts the request with the most tokens first.
struct ShortestFirst;

impl PolicyPlugin<u32> for ShortestFirst {
    fn order_waiting(&mut self, waiting: &[RequestView<u32>]) -> crate::Result<Vec<usize>> {
        let mut order: Vec<usize> = (0..waiting.len()).collect();
        order.sort_by_key(|&i| (waiting[i].num_prompt_tokens, waiting[i].request_id));
        Ok(order)
    }

    fn preemption_order(&mut self, running: &[RequestView<u32>]) -> crate::Result<Vec<usize>> {
        let mut order: Vec<usize> = (0..running.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(running[i].num_tokens));
        Ok(order)
    }
}

struct Broken;

impl PolicyPlugin<u32> for Broken {
    fn order_waiting(&mut self, waiting: &[RequestView<u32>]) -> crate::Result<Vec<usize>> {
        Ok(vec![0; waiting.len()])
    }

    fn preemption_order(&mut self, running: &[RequestView<u32>]) -> crate::Result<Vec<usize>> {
        Ok((0..running.len()).collect())
    }
}

#[test]
fn a_plugin_orders_admissions_and_chooses_victims() {
    let cfg = SchedulerConfig {
        num_blocks: 6,
        max_model_len: 20,
        max_num_batched_tokens: 100,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_plugin(Box::new(ShortestFirst));
    s.add_request(0, prompt(0, 12)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    s.add_request(2, prompt(2, 8)).unwrap();
    let out = run_step(&mut s);
    // Shortest first; 4 + 8 + 12 tokens fill the 6 blocks exactly.
    assert_eq!(scheduled(&out), [(1, 4), (2, 8), (0, 12)]);
    // Next step every request needs a block; the longest (request 0) is the first victim.
    let out = s.schedule().unwrap();
    assert_eq!(out.preempted_req_ids, [0]);
}

#[test]
fn an_invalid_plugin_answer_is_an_error_and_changes_nothing() {
    let mut s = Scheduler::new(config(), false).unwrap();
    s.set_plugin(Box::new(Broken));
    s.add_request(0, prompt(0, 4)).unwrap();
    s.add_request(1, prompt(1, 4)).unwrap();
    assert!(matches!(s.schedule(), Err(Error::Plugin(_))));
    assert_eq!(s.waiting_ids(), [0, 1]);
    assert_eq!(s.stats().num_steps, 0);
    s.check_invariants().unwrap();
}
