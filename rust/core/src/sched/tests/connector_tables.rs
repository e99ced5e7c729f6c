//! The block tables a finished request hands its KV connector (vLLM 0.33's
//! `_connector_finished` through `KVCacheManager.get_block_ids_for_computed_tokens`): an
//! attention group's clipped to `cdiv(num_computed_tokens, block_size)` blocks, so the
//! slots allocated ahead of the computed tokens (lookahead, rejected drafts) are not sent;
//! a recurrent group's whole.

use std::sync::{Arc, Mutex};

use super::*;
use crate::kv::{BlockId, KvGroupSpec};
use crate::sched::{ExternalTokens, KvConnector};

/// Each `request_finished` call's tables.
type Finished = Arc<Mutex<Vec<Vec<Vec<BlockId>>>>>;

/// Offers `offer` tokens (asynchronously when `load_async`); logs the tables it is handed
/// when a request finishes.
#[derive(Default)]
struct TableConnector {
    offer: usize,
    load_async: bool,
    finished: Finished,
}

impl KvConnector<u32> for TableConnector {
    fn get_num_new_matched_tokens(
        &mut self,
        _: &Request<u32>,
        _: usize,
    ) -> crate::Result<Option<ExternalTokens>> {
        Ok(Some(ExternalTokens {
            num_tokens: self.offer,
            load_async: self.load_async,
        }))
    }

    fn request_finished(&mut self, _: &Request<u32>, block_ids: &[BlockId]) -> crate::Result<bool> {
        self.finished.lock().unwrap().push(vec![block_ids.to_vec()]);
        Ok(false)
    }

    fn request_finished_groups(
        &mut self,
        _: &Request<u32>,
        block_ids: &[&[BlockId]],
    ) -> crate::Result<bool> {
        let tables = block_ids.iter().map(|t| t.to_vec()).collect();
        self.finished.lock().unwrap().push(tables);
        Ok(false)
    }
}

fn with_connector(cfg: SchedulerConfig, connector: TableConnector) -> Scheduler<u32> {
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_connector(Box::new(connector)).unwrap();
    s
}

fn one_token(id: u32, len: usize) -> RequestSpec {
    RequestSpec {
        max_tokens: 1,
        ..prompt(id, len)
    }
}

#[test]
fn lookahead_slots_are_not_handed_to_the_connector() {
    // Blocks of 4, 3 lookahead slots: an 8-token prompt holds 8 + 3 = 11 slots (3 blocks);
    // it finishes with 8 computed tokens, so the connector gets cdiv(8, 4) = 2 blocks.
    let finished = Finished::default();
    let cfg = SchedulerConfig {
        num_lookahead_tokens: 3,
        ..config()
    };
    let connector = TableConnector {
        finished: finished.clone(),
        ..TableConnector::default()
    };
    let mut s = with_connector(cfg, connector);
    s.add_request(0, one_token(0, 8)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 8)]);
    let held = s.block_ids(&0).unwrap().to_vec();
    assert_eq!(held.len(), 3);
    s.update_from_output(&[sample(0, 7)]).unwrap();
    assert_eq!(*finished.lock().unwrap(), [vec![held[..2].to_vec()]]);
}

#[test]
fn rejected_drafts_slots_are_not_handed_to_the_connector() {
    // k = 3, blocks of 4: a 3-token prompt prefills and drafts 3 tokens; the next step
    // computes positions 3..7 (2 blocks), all 3 drafts are rejected, so 4 tokens are
    // computed. Aborted then, it hands cdiv(4, 4) = 1 block, not the 2 it holds.
    let finished = Finished::default();
    let cfg = SchedulerConfig {
        num_speculative_tokens: 3,
        ..config()
    };
    let connector = TableConnector {
        finished: finished.clone(),
        ..TableConnector::default()
    };
    let mut s = with_connector(cfg, connector);
    let spec = RequestSpec {
        max_tokens: 20,
        ..prompt(0, 3)
    };
    s.add_request(0, spec).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 3)]);
    let drafted = SampledOutput {
        spec_token_ids: vec![101, 102, 103],
        ..sample(0, 7)
    };
    s.update_from_output(&[drafted]).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 4)]);
    let rejected = SampledOutput {
        num_rejected_tokens: 3,
        ..sample(0, 8)
    };
    s.update_from_output(&[rejected]).unwrap();
    assert_eq!(s.get_request(&0).unwrap().num_computed_tokens, 4);
    let held = s.block_ids(&0).unwrap().to_vec();
    assert_eq!(held.len(), 2);
    s.abort(&[0]).unwrap();
    assert_eq!(*finished.lock().unwrap(), [vec![held[..1].to_vec()]]);
}

#[test]
fn a_request_aborted_while_loading_hands_the_blocks_being_loaded() {
    // vLLM counts the tokens being loaded as computed while the request waits for them:
    // a 10-token load into blocks of 4 hands all cdiv(10, 4) = 3 blocks.
    let finished = Finished::default();
    let connector = TableConnector {
        offer: 10,
        load_async: true,
        finished: finished.clone(),
    };
    let mut s = with_connector(config(), connector);
    s.add_request(0, prompt(0, 10)).unwrap();
    assert!(scheduled(&s.schedule().unwrap()).is_empty());
    let held = s.block_ids(&0).unwrap().to_vec();
    assert_eq!(held.len(), 3);
    s.abort(&[0]).unwrap();
    assert_eq!(*finished.lock().unwrap(), [vec![held]]);
}

#[test]
fn an_attention_group_is_clipped_and_a_mamba_group_is_not() {
    // Full attention + Mamba, blocks of 4, 3 lookahead slots: the 8-token prompt holds 3
    // attention blocks and 1 Mamba state block; the connector gets 2 and 1.
    let finished = Finished::default();
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::MAMBA],
        num_lookahead_tokens: 3,
        ..config()
    };
    let connector = TableConnector {
        finished: finished.clone(),
        ..TableConnector::default()
    };
    let mut s = with_connector(cfg, connector);
    s.add_request(0, one_token(0, 8)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 8)]);
    let held = s.group_block_ids(&0);
    assert_eq!((held[0].len(), held[1].len()), (3, 1));
    s.update_from_output(&[sample(0, 7)]).unwrap();
    let expected = vec![held[0][..2].to_vec(), held[1].clone()];
    assert_eq!(*finished.lock().unwrap(), [expected]);
}
