//! Multimodal items beside a KV connector, as vLLM 0.33's `schedule()` treats them: the
//! tokens a load brings count as computed, `_try_schedule_encoder_inputs` runs from them, so
//! items wholly inside the loaded prefix are never encoded and an item the prefix ends
//! inside is encoded whole; an asynchronous load encodes nothing until it lands; a failed
//! load that cuts the computed prefix back encodes what it no longer covers. Block size 4.

use std::sync::{Arc, Mutex};

use super::encoder::image;
use super::*;
use crate::kv::BlockId;
use crate::sched::*;

/// Loads `offer` tokens of the requests it names (at most all but the local hit, all but
/// one more for a synchronous load), asynchronously or not; logs each allocation as
/// "<id> <external tokens>".
struct Loads {
    offers: Vec<(u32, usize)>,
    load_async: bool,
    log: Arc<Mutex<Vec<String>>>,
}

impl KvConnector<u32> for Loads {
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<u32>,
        num_computed_tokens: usize,
    ) -> crate::Result<Option<ExternalTokens>> {
        let offer = (self.offers.iter())
            .find(|(id, _)| *id == request.request_id)
            .map_or(0, |&(_, n)| n);
        let rest = request.num_tokens() - num_computed_tokens - usize::from(!self.load_async);
        let num_tokens = offer.min(rest);
        Ok(Some(ExternalTokens {
            num_tokens,
            load_async: self.load_async && num_tokens > 0,
        }))
    }

    fn update_state_after_alloc(
        &mut self,
        request: &Request<u32>,
        _: &[BlockId],
        num_external_tokens: usize,
    ) -> crate::Result<()> {
        (self.log.lock().unwrap()).push(format!("{} {num_external_tokens}", request.request_id));
        Ok(())
    }

    fn request_finished(&mut self, _: &Request<u32>, _: &[BlockId]) -> crate::Result<bool> {
        Ok(false)
    }
}

/// 64 tokens a step (at most `long_prefill` a request when not 0), an encoder budget of
/// `budget` embeddings and a 128-embedding cache, prefix caching on, the connector `Loads`.
fn with_loads(
    offers: Vec<(u32, usize)>,
    load_async: bool,
    budget: usize,
    long_prefill: usize,
) -> (Scheduler<u32>, Arc<Mutex<Vec<String>>>) {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 64,
        long_prefill_token_threshold: long_prefill,
        num_blocks: 64,
        max_model_len: 128,
        enable_prefix_caching: true,
        encoder: EncoderConfig {
            max_num_encoder_input_tokens: budget,
            encoder_cache_size: 128,
            disable_chunked_mm_input: false,
        },
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let connector = Loads {
        offers,
        load_async,
        log: log.clone(),
    };
    s.set_connector(Box::new(connector)).unwrap();
    (s, log)
}

/// A 40-token prompt with a 16-token image "a" at 4 and an 8-token image "b" at 28.
fn two_images(id: u32) -> RequestSpec {
    RequestSpec {
        mm_features: vec![image(4, 16, "a"), image(28, 8, "b")],
        max_tokens: 2,
        ..prompt(id, 40)
    }
}

/// A step's scheduled tokens and encoder inputs, by request.
type StepView = (Vec<(u32, usize)>, Vec<(u32, Vec<usize>)>);

fn step_view(out: &SchedulerOutput<u32>) -> StepView {
    (scheduled(out), out.scheduled_encoder_inputs.clone())
}

#[test]
fn an_async_load_encodes_nothing_until_it_lands_then_only_the_items_past_it() {
    // 24 tokens loaded: image "a" ([4, 20)) lies inside them, "b" ([28, 36)) past them.
    let (mut s, _) = with_loads(vec![(0, 24)], true, 64, 0);
    s.add_request(0, two_images(0)).unwrap();
    let out = run_step(&mut s);
    assert_eq!(
        step_view(&out),
        (vec![], vec![]),
        "loading: no tokens, no encoder"
    );
    assert!(s.encoder_cache_entries().is_empty());
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    let out = run_step(&mut s);
    assert_eq!(step_view(&out), (vec![(0, 16)], vec![(0, vec![1])]));
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 24);
    assert!(!s.encoder_cache_contains("a"), "never encoded");
    assert_eq!(
        s.encoder_cache_refs("b"),
        0,
        "passed at the update: freeable"
    );
}

#[test]
fn a_landed_load_ending_inside_an_image_encodes_it_whole() {
    // 12 tokens loaded: they end inside "a" ([4, 20)), which the encoder sees whole.
    let (mut s, _) = with_loads(vec![(0, 12)], true, 64, 0);
    s.add_request(0, two_images(0)).unwrap();
    s.schedule().unwrap();
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    let out = run_step(&mut s);
    assert_eq!(step_view(&out), (vec![(0, 28)], vec![(0, vec![0, 1])]));
    assert!(s.encoder_cache_contains("a") && s.encoder_cache_contains("b"));
}

#[test]
fn a_synchronous_load_schedules_the_items_past_it_in_the_same_step() {
    let (mut s, log) = with_loads(vec![(0, 24)], false, 64, 0);
    s.add_request(0, two_images(0)).unwrap();
    let out = run_step(&mut s);
    assert_eq!(step_view(&out), (vec![(0, 16)], vec![(0, vec![1])]));
    assert_eq!(*log.lock().unwrap(), ["0 24"]);
}

#[test]
fn a_landed_load_steps_aside_while_the_encoder_budget_is_spent_keeping_its_blocks() {
    // Budget 32. Request 0 (no load, 24 tokens a step) encodes "y" at step 2 and "z" at
    // step 3, 16 each; request 1's load (12 tokens) lands after step 1 and ends inside its
    // 24-token image, which needs 24 embeddings: it steps aside (vLLM's skip_request) until
    // step 4, holding the blocks of its load (then 24 tokens, the threshold).
    let (mut s, _) = with_loads(vec![(1, 12)], true, 32, 24);
    let r0 = RequestSpec {
        mm_features: vec![image(24, 16, "y"), image(48, 16, "z")],
        max_tokens: 2,
        ..prompt(0, 100)
    };
    let r1 = RequestSpec {
        mm_features: vec![image(4, 24, "a")],
        max_tokens: 2,
        ..prompt(1, 40)
    };
    s.add_request(0, r0).unwrap();
    s.add_request(1, r1).unwrap();
    assert_eq!(step_view(&run_step(&mut s)), (vec![(0, 24)], vec![]));
    let held = s.block_ids(&1).unwrap().len();
    s.finish_kv_transfers(&[1], &[], &[]).unwrap();
    assert_eq!(
        step_view(&run_step(&mut s)),
        (vec![(0, 24)], vec![(0, vec![0])])
    );
    assert_eq!(
        step_view(&run_step(&mut s)),
        (vec![(0, 24)], vec![(0, vec![1])])
    );
    assert_eq!(
        s.block_ids(&1).unwrap().len(),
        held,
        "its loaded blocks stay"
    );
    assert_eq!(s.get_request(&1).unwrap().num_computed_tokens, 12);
    let out = run_step(&mut s);
    assert_eq!(
        step_view(&out),
        (vec![(0, 24), (1, 24)], vec![(1, vec![0])])
    );
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 12);
}

#[test]
fn a_load_cut_back_by_an_invalid_block_encodes_the_items_it_no_longer_covers() {
    // 24 tokens loaded would cover "a" ([4, 20)); block 1 comes back invalid, so 4 tokens
    // count as computed and "a" is encoded with the recomputed tokens.
    for (invalid, expect) in [(false, (16, vec![1])), (true, (36, vec![0, 1]))] {
        let (mut s, _) = with_loads(vec![(0, 24)], true, 64, 0);
        s.set_kv_load_failure_policy(KvLoadFailurePolicy::Recompute);
        s.add_request(0, two_images(0)).unwrap();
        s.schedule().unwrap();
        if invalid {
            let bad = s.block_ids(&0).unwrap()[1];
            s.handle_kv_load_failures(&[], &[bad], &[]).unwrap();
        }
        s.finish_kv_transfers(&[0], &[], &[]).unwrap();
        let out = run_step(&mut s);
        assert_eq!(step_view(&out), (vec![(0, expect.0)], vec![(0, expect.1)]));
    }
}

#[test]
fn a_whole_failed_load_recomputes_and_encodes_every_item() {
    let (mut s, _) = with_loads(vec![(0, 24)], true, 64, 0);
    s.set_kv_load_failure_policy(KvLoadFailurePolicy::Recompute);
    s.add_request(0, two_images(0)).unwrap();
    s.schedule().unwrap();
    s.finish_kv_transfers(&[], &[], &[0]).unwrap();
    let out = run_step(&mut s);
    assert_eq!(step_view(&out), (vec![(0, 40)], vec![(0, vec![0, 1])]));
}

#[test]
fn an_encoder_decoder_request_with_a_loaded_prefix_encodes_nothing() {
    // vLLM 0.33 under `is_encoder_decoder` skips every item once a token is computed: a
    // synchronous load of 24 tokens schedules the 16 left with no encoder input, and
    // every update then frees all its inputs (24 embeddings) in the counter it never
    // lowered. Request 1, offered nothing, encodes both items with its first tokens.
    let (mut s, _) = with_loads(vec![(0, 24)], false, 64, 0);
    s.set_encoder_decoder(true).unwrap();
    s.add_request(0, two_images(0)).unwrap();
    let out = run_step(&mut s);
    assert_eq!(step_view(&out), (vec![(0, 16)], vec![]));
    assert_eq!(s.encoder_cache_usage().0, 128 + 24);
    s.add_request(1, two_images(1)).unwrap();
    let out = run_step(&mut s);
    assert_eq!(
        step_view(&out),
        (vec![(0, 1), (1, 40)], vec![(1, vec![0, 1])])
    );
    s.check_invariants().unwrap();
}

#[test]
fn an_async_load_of_a_multimodal_request_meets_the_full_sequence_gate_as_a_text_ones() {
    // vLLM 0.33's `scheduler_reserve_full_isl`: the load's `allocate_slots` needs the whole
    // 40-token sequence (10 blocks) free; request 0 leaves 5, room for the load's own 2
    // blocks (8 tokens) but not the sequence's. Neither request 1, with
    // images or without, starts its load (the multimodal one's gate is met after its
    // encoder step when it computes tokens, and before its load when it loads).
    for items in [vec![image(4, 16, "a"), image(28, 8, "b")], vec![]] {
        let (s, _) = with_loads(vec![(1, 8)], true, 64, 0);
        let cfg = SchedulerConfig {
            num_blocks: 16,
            scheduler_reserve_full_isl: true,
            ..s.config().clone()
        };
        let mut s = Scheduler::new(cfg, false).unwrap();
        let loads = Loads {
            offers: vec![(1, 8)],
            load_async: true,
            log: Arc::new(Mutex::new(Vec::new())),
        };
        s.set_connector(Box::new(loads)).unwrap();
        s.add_request(0, prompt(0, 40)).unwrap();
        assert_eq!(scheduled(&run_step(&mut s)), [(0, 40)]);
        let r1 = RequestSpec {
            mm_features: items,
            max_tokens: 2,
            ..prompt(1, 40)
        };
        s.add_request(1, r1).unwrap();
        let out = run_step(&mut s);
        assert_eq!(scheduled(&out), [(0, 1)]);
        assert!(out.kv_loads.is_empty(), "no load started");
        assert_eq!(s.get_request(&1).unwrap().status, RequestStatus::Waiting);
        assert!(s.block_ids(&1).is_none());
    }
}
