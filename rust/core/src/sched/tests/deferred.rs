//! Prompts given by length (`RequestSpec::num_deferred_prompt_tokens`): made at the first
//! admission attempt, with or without their block hashes, and scheduled exactly as the
//! same prompts given up front.

use super::*;
use crate::kv::{hash_block_id, hash_full_blocks};
use crate::sched::*;

/// Prompts sharing a 10-token prefix (ids below 100) then the request's own tokens.
fn tokens(id: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|t| if t < 10 { t } else { id * 1000 + t })
        .collect()
}

/// Makes `tokens(id, len)`, with their full blocks' hashes when `with_hashes`, and counts
/// the prompts made.
struct Source {
    with_hashes: bool,
    block_size: usize,
    num_made: usize,
    /// Name the blocks inside the shared prefix by their place (`hash_block_id`) instead
    /// of hashing their tokens, as the simulator names blocks of trace ids.
    by_name: bool,
}

impl PromptSource<u32> for Source {
    fn prompt(&mut self, id: &u32, num_tokens: usize) -> DeferredPrompt {
        self.num_made += 1;
        let token_ids = tokens(*id, num_tokens);
        let mut block_hashes = Vec::new();
        if self.by_name {
            let mut parent = None;
            for b in 0..10 / self.block_size {
                let hash = hash_block_id(parent, 0, b as u32, None);
                block_hashes.push(hash);
                parent = Some(hash);
            }
        } else if self.with_hashes {
            hash_full_blocks(&mut block_hashes, &token_ids, self.block_size, None);
        }
        DeferredPrompt {
            token_ids,
            block_hashes,
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

fn num_made(s: &mut Scheduler<u32>) -> usize {
    let source = s.prompt_source_mut().unwrap().as_any_mut();
    source.downcast_mut::<Source>().unwrap().num_made
}

#[test]
fn deferred_prompts_schedule_as_given_ones_and_are_made_at_admission() {
    // 16 blocks of 4 tokens, prefix caching: 8 prompts of 14-29 tokens crowd the
    // pool, so later requests wait, hit the shared prefix, and some are preempted.
    let cfg = SchedulerConfig {
        num_blocks: 16,
        max_model_len: 48,
        max_num_batched_tokens: 32,
        enable_prefix_caching: true,
        ..config()
    };
    // Hashes named by place stand for the tokens only if the request keeps them for every
    // lookup: a preempted request looked up by its tokens would miss its own prefix.
    for (with_hashes, by_name) in [(false, false), (true, false), (false, true)] {
        let mut given = Scheduler::new(cfg.clone(), false).unwrap();
        let mut deferred = Scheduler::new(cfg.clone(), false).unwrap();
        deferred.set_prompt_source(Box::new(Source {
            with_hashes,
            block_size: cfg.block_size,
            num_made: 0,
            by_name,
        }));
        for id in 0..8u32 {
            let len = 14 + (id as usize * 5) % 16;
            let max_tokens = 6 + id as usize % 9;
            given
                .add_request(
                    id,
                    RequestSpec {
                        prompt_token_ids: tokens(id, len),
                        max_tokens,
                        ..RequestSpec::default()
                    },
                )
                .unwrap();
            deferred
                .add_request(
                    id,
                    RequestSpec {
                        num_deferred_prompt_tokens: len,
                        max_tokens,
                        ..RequestSpec::default()
                    },
                )
                .unwrap();
        }
        assert_eq!(num_made(&mut deferred), 0, "nothing made before a step");
        let mut num_preemptions = 0;
        for step in 0..60 {
            let a = run_step(&mut given);
            let b = run_step(&mut deferred);
            assert_eq!(
                a.num_scheduled_tokens, b.num_scheduled_tokens,
                "step {step}"
            );
            assert_eq!(a.preempted_req_ids, b.preempted_req_ids, "step {step}");
            num_preemptions += a.preempted_req_ids.len();
            let (sa, sb) = (given.stats(), deferred.stats());
            assert_eq!(sa.prefix_cache_hits, sb.prefix_cache_hits, "step {step}");
            assert_eq!(sa.kv_usage, sb.kv_usage, "step {step}");
            let made = num_made(&mut deferred);
            assert!(made <= 8, "each prompt is made once");
            assert!(
                deferred.num_waiting() + made >= 8,
                "a request's prompt is made no sooner than its admission attempt"
            );
        }
        assert!(!given.has_unfinished_requests() && !deferred.has_unfinished_requests());
        assert!(num_preemptions > 0, "the scenario preempts");
        assert!(given.stats().prefix_cache_hits > 0, "the scenario hits");
        assert_eq!(num_made(&mut deferred), 8);
    }
}

#[test]
fn a_deferred_prompt_needs_a_source_and_no_token_ids() {
    let mut s = Scheduler::new(config(), false).unwrap();
    let by_length = RequestSpec {
        num_deferred_prompt_tokens: 4,
        max_tokens: 1,
        ..RequestSpec::default()
    };
    let err = s.add_request(0, by_length.clone()).unwrap_err();
    assert!(err.to_string().contains("prompt source"), "{err}");
    s.set_prompt_source(Box::new(Source {
        with_hashes: false,
        block_size: 4,
        num_made: 0,
        by_name: false,
    }));
    let both = RequestSpec {
        prompt_token_ids: vec![1, 2],
        ..by_length.clone()
    };
    let err = s.add_request(0, both).unwrap_err();
    assert!(
        err.to_string().contains("num_deferred_prompt_tokens"),
        "{err}"
    );
    s.add_request(0, by_length).unwrap();
    assert_eq!(s.get_request(&0).unwrap().num_tokens(), 4);
}
