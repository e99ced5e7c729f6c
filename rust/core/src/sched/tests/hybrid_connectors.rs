//! KV connectors beside several KV cache groups (vLLM 0.33 runs its coordinator with a
//! connector; only `request_finished` differs for one without `SupportsHMA`): loads over
//! every group, the bounded-replay rules for a connector's hit, zeroing of new blocks but
//! those a load writes, and finished requests' tables pruned on the processed-token basis.

use std::sync::{Arc, Mutex};

use super::*;
use crate::kv::{BlockId, KvGroupSpec, NULL_BLOCK};
use crate::sched::{ExternalTokens, KvConnector};

const WINDOW: KvGroupSpec = KvGroupSpec::SlidingWindow { sliding_window: 8 };
const REPLAY: KvGroupSpec = KvGroupSpec::SlidingWindowReplay { sliding_window: 8 };

/// What the connector was given: the call and each group's table.
type TableLog = Arc<Mutex<Vec<(String, Vec<Vec<BlockId>>)>>>;

/// Offers `offer` tokens (asynchronously or not), restores `loaded` groups (`None`: the
/// default), logs each group's table it is given.
#[derive(Default)]
struct GroupConnector {
    offer: usize,
    load_async: bool,
    loaded: Option<Vec<usize>>,
    tables: TableLog,
}

impl KvConnector<u32> for GroupConnector {
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

    fn request_finished(&mut self, _: &Request<u32>, _: &[BlockId]) -> crate::Result<bool> {
        unreachable!("several groups: request_finished_groups")
    }

    fn update_state_after_alloc_groups(
        &mut self,
        _: &Request<u32>,
        block_ids: &[&[BlockId]],
        _: usize,
    ) -> crate::Result<()> {
        let tables = block_ids.iter().map(|t| t.to_vec()).collect();
        self.tables.lock().unwrap().push(("alloc".into(), tables));
        Ok(())
    }

    fn request_finished_groups(
        &mut self,
        _: &Request<u32>,
        block_ids: &[&[BlockId]],
    ) -> crate::Result<bool> {
        let tables = block_ids.iter().map(|t| t.to_vec()).collect();
        self.tables
            .lock()
            .unwrap()
            .push(("finished".into(), tables));
        Ok(false)
    }

    fn get_loaded_kv_cache_group_ids(
        &mut self,
        _: &Request<u32>,
    ) -> crate::Result<Option<Vec<usize>>> {
        Ok(self.loaded.clone())
    }
}

fn scheduler(second: KvGroupSpec, connector: GroupConnector, async_: bool) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, second],
        enable_prefix_caching: true,
        max_num_batched_tokens: 64,
        ..config()
    };
    let mut s = Scheduler::new(cfg, async_).unwrap();
    s.set_connector(Box::new(connector)).unwrap();
    s
}

fn num_nulls(table: &[BlockId]) -> usize {
    table.iter().filter(|&&b| b == NULL_BLOCK).count()
}

#[test]
fn an_async_load_holds_the_window_groups_blocks_only_inside_its_window() {
    // 16 of 20 tokens loaded, window 8 of blocks of 4: (16 + 1 - 8) / 4 = 2 nulls, then
    // blocks for the loaded tokens the window still attends to.
    let tables = Arc::new(Mutex::new(Vec::new()));
    let connector = GroupConnector {
        offer: 16,
        load_async: true,
        tables: tables.clone(),
        ..GroupConnector::default()
    };
    let mut s = scheduler(WINDOW, connector, false);
    s.add_request(0, prompt(0, 20)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.kv_loads.len(), 1);
    let held = s.group_block_ids(&0);
    assert_eq!((held[0].len(), held[1].len()), (4, 4));
    assert_eq!(num_nulls(&held[1]), 2);
    assert_eq!(tables.lock().unwrap()[0], ("alloc".to_string(), held));
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 4)]);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 16);
    // The landed blocks are cached, both groups' (the window's inside its window).
    let tokens = prompt(0, 20).prompt_token_ids;
    assert_eq!(s.num_cached_prefix_tokens(&tokens, None), 16);
}

#[test]
fn a_connector_hit_under_bounded_replay_is_cut_to_whole_blocks_and_replayed_after_landing() {
    // 15 tokens offered: cut to 12 (a hit one token short of a block boundary would start
    // the replay in a block the window retires); after landing the last 8 are replayed.
    let connector = GroupConnector {
        offer: 15,
        load_async: true,
        ..GroupConnector::default()
    };
    let mut s = scheduler(REPLAY, connector, false);
    s.add_request(0, prompt(0, 25)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.kv_loads[0].num_external_tokens, 12);
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    let out = run_step(&mut s);
    let new = &out.scheduled_new_reqs[0];
    assert_eq!((new.num_computed_tokens, new.replay_start), (4, 4));
    assert_eq!(scheduled(&out), [(0, 21)]);
    let tables = s.group_block_ids(&0);
    assert_ne!(
        tables[1][1], NULL_BLOCK,
        "the replay starts in a live block"
    );
}

#[test]
fn a_connector_hit_no_longer_than_the_window_is_not_taken() {
    let connector = GroupConnector {
        offer: 8,
        load_async: true,
        ..GroupConnector::default()
    };
    let mut s = scheduler(REPLAY, connector, false);
    s.add_request(0, prompt(0, 25)).unwrap();
    let out = run_step(&mut s);
    assert!(out.kv_loads.is_empty(), "no load is started");
    let new = &out.scheduled_new_reqs[0];
    assert_eq!((new.num_computed_tokens, new.replay_start), (0, 0));
}

#[test]
fn a_load_that_restores_the_window_replays_nothing() {
    // A P/D transfer restores both groups: 15 tokens taken as they are, none replayed.
    for load_async in [false, true] {
        let connector = GroupConnector {
            offer: 15,
            load_async,
            loaded: Some(vec![0, 1]),
            ..GroupConnector::default()
        };
        let mut s = scheduler(REPLAY, connector, false);
        s.add_request(0, prompt(0, 25)).unwrap();
        if load_async {
            s.schedule().unwrap();
            s.finish_kv_transfers(&[0], &[], &[]).unwrap();
        }
        let out = run_step(&mut s);
        let new = &out.scheduled_new_reqs[0];
        assert_eq!((new.num_computed_tokens, new.replay_start), (15, 0));
        assert_eq!(scheduled(&out), [(0, 10)]);
    }
}

#[test]
fn zeroing_skips_the_blocks_an_async_load_writes_in_the_groups_it_restores() {
    let connector = GroupConnector {
        offer: 16,
        load_async: true,
        ..GroupConnector::default()
    };
    let mut s = scheduler(REPLAY, connector, false);
    s.set_kv_cache_zeroing(true).unwrap();
    s.add_request(0, prompt(0, 25)).unwrap();
    s.schedule().unwrap();
    // The load writes the full-attention group (the default: the prefix-cacheable groups);
    // the replayed window group's blocks are zeroed.
    let held = s.group_block_ids(&0);
    let zeroed = s.take_new_block_ids();
    let window_blocks: Vec<BlockId> = held[1].iter().copied().filter(|&b| b != 0).collect();
    assert_eq!(zeroed, window_blocks);
    assert!(held[0].iter().all(|b| !zeroed.contains(b)));
    s.finish_kv_transfers(&[0], &[], &[]).unwrap();
    run_step(&mut s);
    // Blocks for computing are zeroed in every group.
    let held_after = s.group_block_ids(&0);
    let zeroed = s.take_new_block_ids();
    let added = held_after.concat().len() - held.concat().len();
    assert_eq!(zeroed.len(), added);
    assert!(s.take_new_block_ids().is_empty(), "taken once");
}

#[test]
fn zeroing_needs_several_kv_groups() {
    let mut s = Scheduler::<u32>::new(config(), false).unwrap();
    match s.set_kv_cache_zeroing(true) {
        Err(crate::Error::Config { field, .. }) => assert_eq!(field, "kv_cache_zeroing"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_finished_requests_tables_reach_the_connector_pruned_on_the_processed_basis() {
    // Async scheduling: aborted while its 20-token prefill is in flight, the window group
    // frees nothing; aborted once it landed, the (20 + 1 - 8) / 4 = 3 blocks before the
    // window are freed before the connector sees the tables.
    let mut nulls = Vec::new();
    for landed in [false, true] {
        let tables = Arc::new(Mutex::new(Vec::new()));
        let connector = GroupConnector {
            tables: tables.clone(),
            ..GroupConnector::default()
        };
        let mut s = scheduler(WINDOW, connector, true);
        s.add_request(0, prompt(0, 20)).unwrap();
        s.schedule().unwrap();
        if landed {
            s.update_from_output(&[sample(0, 7)]).unwrap();
        }
        s.abort(&[0]).unwrap();
        s.check_invariants().unwrap();
        let log = tables.lock().unwrap();
        let (what, finished) = log.last().unwrap();
        assert_eq!(what, "finished");
        nulls.push(num_nulls(&finished[1]));
    }
    assert_eq!(nulls, [0, 3]);
}

#[test]
fn the_full_sequence_gate_counts_loaded_tokens_as_computed() {
    // 40 tokens over blocks of 4, 15 usable: counting only the (empty) local hit, both
    // groups need 10 blocks (20 > 15); with 36 tokens loaded the window group skips
    // (36 + 1 - 8) / 4 = 7 of its blocks, so 10 + 3 = 13 fit (vLLM 0.33 gates in
    // allocate_slots, after asking the connector).
    let connector = GroupConnector {
        offer: 36,
        load_async: true,
        ..GroupConnector::default()
    };
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, WINDOW],
        enable_prefix_caching: true,
        max_num_batched_tokens: 64,
        num_blocks: 16,
        scheduler_reserve_full_isl: true,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_connector(Box::new(connector)).unwrap();
    s.add_request(0, prompt(0, 40)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(out.kv_loads.len(), 1, "the load starts");
    let held = s.group_block_ids(&0);
    assert_eq!((held[0].len(), num_nulls(&held[1])), (9, 7));
    s.check_invariants().unwrap();
}
