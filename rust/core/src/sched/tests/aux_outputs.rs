//! Auxiliary outputs beside KV blocks (vLLM 0.33's `AuxOutputSchedulerConnector`): a prefix
//! hit is capped where the connector no longer keeps its blocks' records, a KV connector's
//! external tokens are kept whole or dropped, and asynchronous loads are reported.

use std::sync::{Arc, Mutex};

use super::*;
use crate::sched::{AuxOutputConnector, CachedBlocks, ExternalTokens, KvConnector};

/// Keeps the records of the first `kept` tokens; logs its calls.
struct Kept {
    kept: usize,
    log: Arc<Mutex<Vec<String>>>,
}

impl AuxOutputConnector<u32> for Kept {
    fn max_cache_hit(
        &mut self,
        request: &Request<u32>,
        blocks: CachedBlocks<'_>,
    ) -> crate::Result<usize> {
        let cached = blocks.block_ids.iter().filter(|b| b.is_some()).count();
        self.log.lock().unwrap().push(format!(
            "max_cache_hit {} ({cached} of {} blocks cached)",
            request.request_id,
            blocks.block_hashes.len()
        ));
        Ok(self.kept)
    }

    fn cap_external_hit(
        &mut self,
        request: &Request<u32>,
        num_local: usize,
        num_external: usize,
        _: CachedBlocks<'_>,
    ) -> crate::Result<usize> {
        self.log.lock().unwrap().push(format!(
            "cap {} {num_local}+{num_external}",
            request.request_id
        ));
        Ok(if num_local + num_external <= self.kept {
            num_external
        } else {
            0
        })
    }

    fn request_loading(&mut self, request: &Request<u32>, num_tokens: usize) -> crate::Result<()> {
        self.log
            .lock()
            .unwrap()
            .push(format!("loading {} {num_tokens}", request.request_id));
        Ok(())
    }
}

/// Offers `offer` tokens after the local hit, loaded asynchronously or not.
struct Offers {
    offer: usize,
    load_async: bool,
}

impl KvConnector<u32> for Offers {
    fn get_num_new_matched_tokens(
        &mut self,
        request: &Request<u32>,
        num_computed_tokens: usize,
    ) -> crate::Result<Option<ExternalTokens>> {
        let most = request.num_tokens() - num_computed_tokens - 1;
        Ok(Some(ExternalTokens {
            num_tokens: self.offer.min(most),
            load_async: self.load_async,
        }))
    }

    fn request_finished(
        &mut self,
        _: &Request<u32>,
        _: &[crate::kv::BlockId],
    ) -> crate::Result<bool> {
        Ok(false)
    }
}

fn caching() -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        max_num_batched_tokens: 32,
        ..config()
    };
    Scheduler::new(cfg, false).unwrap()
}

/// Caches the 16-token prompt of request 0 (four 4-token blocks), then aborts it.
fn seeded() -> Scheduler<u32> {
    let mut s = caching();
    s.add_request(0, prompt(0, 16)).unwrap();
    s.schedule().unwrap();
    s.abort(&[0]).unwrap();
    s
}

fn kept(s: &mut Scheduler<u32>, kept: usize) -> Arc<Mutex<Vec<String>>> {
    let log = Arc::new(Mutex::new(Vec::new()));
    s.set_aux_output_connector(Some(Box::new(Kept {
        kept,
        log: log.clone(),
    })))
    .unwrap();
    log
}

#[test]
fn a_local_hit_stops_at_the_last_whole_block_whose_records_are_kept() {
    // Without a connector: 15 of 16 tokens may hit, so three blocks (12 tokens).
    let mut s = seeded();
    s.add_request(1, prompt(0, 16)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 12);
    // Records kept for 9 tokens: the hit is two blocks (8 tokens), 8 are computed.
    let mut s = seeded();
    let log = kept(&mut s, 9);
    s.add_request(1, prompt(0, 16)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 8);
    assert_eq!(scheduled(&out), [(1, 8)]);
    assert_eq!(
        *log.lock().unwrap(),
        ["max_cache_hit 1 (4 of 4 blocks cached)"]
    );
    s.check_invariants().unwrap();
}

#[test]
fn no_kept_records_means_no_hit_and_a_removed_connector_caps_nothing() {
    let mut s = seeded();
    kept(&mut s, 0);
    s.add_request(1, prompt(0, 16)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 16)]);
    let mut s = seeded();
    kept(&mut s, 0);
    s.set_aux_output_connector(None).unwrap();
    assert!(!s.has_aux_output_connector());
    s.add_request(1, prompt(0, 16)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 4)]);
}

#[test]
fn external_tokens_past_the_kept_records_are_all_dropped() {
    // 8 offered, records for 12: kept whole.
    let mut s = caching();
    s.set_connector(Box::new(Offers {
        offer: 8,
        load_async: false,
    }))
    .unwrap();
    let log = kept(&mut s, 12);
    s.add_request(0, prompt(0, 16)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 8)]);
    assert_eq!(
        *log.lock().unwrap(),
        ["max_cache_hit 0 (0 of 4 blocks cached)", "cap 0 0+8"]
    );
    // Records for 4 only: none of the 8 is loaded, all 16 are computed.
    let mut s = caching();
    s.set_connector(Box::new(Offers {
        offer: 8,
        load_async: false,
    }))
    .unwrap();
    kept(&mut s, 4);
    s.add_request(0, prompt(0, 16)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 16)]);
    assert!(out.kv_loads.is_empty());
}

#[test]
fn an_asynchronous_load_is_reported_with_the_tokens_it_brings() {
    let mut s = caching();
    s.set_connector(Box::new(Offers {
        offer: 8,
        load_async: true,
    }))
    .unwrap();
    let log = kept(&mut s, 12);
    s.add_request(0, prompt(0, 16)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.kv_loads.len(), 1);
    assert_eq!(
        *log.lock().unwrap(),
        [
            "max_cache_hit 0 (0 of 4 blocks cached)",
            "cap 0 0+8",
            "loading 0 8"
        ]
    );
    // Dropped by the cap: no load starts, the request is computed from scratch.
    let mut s = caching();
    s.set_connector(Box::new(Offers {
        offer: 8,
        load_async: true,
    }))
    .unwrap();
    let log = kept(&mut s, 4);
    s.add_request(0, prompt(0, 16)).unwrap();
    let out = s.schedule().unwrap();
    assert!(out.kv_loads.is_empty());
    assert_eq!(scheduled(&out), [(0, 16)]);
    assert_eq!(
        *log.lock().unwrap(),
        ["max_cache_hit 0 (0 of 4 blocks cached)", "cap 0 0+8"]
    );
}

#[test]
fn the_radix_pool_refuses_an_auxiliary_output_connector() {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        prefix_cache: crate::sched::PrefixCache::Radix,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let err = s
        .set_aux_output_connector(Some(Box::new(Kept { kept: 0, log })))
        .unwrap_err();
    assert!(err.to_string().contains("prefix_cache"), "{err}");
    assert!(!s.has_aux_output_connector());
}
