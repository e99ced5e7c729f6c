//! vLLM 0.33's HiSparse connector in the step (`sched::hisparse_step`, prefix caching off):
//! the host pool is the connector's, each step plans the write-backs of the pages its
//! scheduled requests sealed (after the allocations, in the output's order), the workers'
//! counts land them, and the frees return host and device blocks. Checked against vLLM
//! step by step in `tests/test_integrations_vllm_hisparse_step.py`; here the numbers by
//! hand and the settings refused.

use super::*;
use crate::Error;
use crate::kv::{DeviceTransfer, KvGroupSpec};

/// Blocks of 4 tokens over vLLM's HiSparse device groups (indexer, resident with an
/// admission window of 4 blocks, hot of 2), 16 host blocks with the source group first.
fn connector_scheduler(with_connector: bool) -> Scheduler<u32> {
    let cfg = SchedulerConfig {
        num_blocks: 64,
        max_num_batched_tokens: 64,
        scheduler_reserve_full_isl: true,
        kv_groups: vec![
            KvGroupSpec::FullAttention,
            KvGroupSpec::HiSparseResident {
                max_admission_blocks: 4,
            },
            KvGroupSpec::HiSparseHot {
                blocks_per_request: 2,
            },
        ],
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    s.set_hisparse_host_pages(Some((16, 4))).unwrap();
    s.set_hisparse_source_group(Some(0)).unwrap();
    if with_connector {
        s.set_hisparse_connector(16).unwrap();
    }
    s
}

#[test]
fn a_prefill_plans_the_write_backs_of_its_sealed_pages() {
    let mut s = connector_scheduler(true);
    s.add_request(0, prompt(0, 10)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 10)]);
    // Ten tokens: three pages on host and in the resident row; two are sealed.
    let (host, indexer, row, hot) = s.hisparse_tables(&0).unwrap();
    assert_eq!(
        (host.len(), indexer.len(), row.len(), hot.len()),
        (3, 3, 3, 0)
    );
    assert_eq!(out.scheduled_new_reqs[0].group_block_ids[0], host);
    let transfers = s.take_hisparse_transfers().unwrap();
    let expected: Vec<_> = (0..2)
        .map(|page| DeviceTransfer {
            transfer_id: page as u64,
            host_block_id: host[page],
            resident_block_id: row[page],
        })
        .collect();
    assert_eq!(transfers, expected);
    assert!(s.hisparse_pending_work());
    // Each host block is held by its table and its write-back: nothing to reclaim.
    assert!(!s.hisparse_pending_reclamation());
    assert_eq!(s.hisparse_num_pending_transfers(), 2);
    s.check_invariants().unwrap();
    answer_step(&mut s, out);
    s.hisparse_acknowledge(&[(0, 1), (1, 1)], &[(0, 1), (1, 1)])
        .unwrap();
    assert!(!s.hisparse_pending_work());
    s.check_invariants().unwrap();
}

#[test]
fn requests_run_to_their_end_and_give_every_block_back() {
    let mut s = connector_scheduler(true);
    for id in 0..3 {
        s.add_request(id, prompt(id, 9)).unwrap();
    }
    let mut transfers = Vec::new();
    for _ in 0..12 {
        run_step(&mut s);
        let planned = s.take_hisparse_transfers().unwrap();
        transfers.extend(planned.iter().map(|t| (t.transfer_id, 1)));
        s.hisparse_acknowledge(&transfers, &transfers).unwrap();
        transfers.clear();
        s.check_invariants().unwrap();
    }
    assert!(!s.has_unfinished_requests());
    assert!(!s.hisparse_pending_work());
    assert_eq!(s.hisparse_host_pages().unwrap().num_free_blocks, 15);
    assert_eq!(s.hisparse_host_free_blocks().len(), 15);
}

#[test]
fn without_acknowledgements_the_host_blocks_stay_held_by_their_write_backs() {
    let mut s = connector_scheduler(true);
    s.add_request(0, prompt(0, 9)).unwrap();
    for _ in 0..8 {
        run_step(&mut s);
    }
    assert!(!s.has_unfinished_requests());
    // 9 prompt tokens and 3 outputs computed: 3 pages sealed, their host blocks held.
    assert_eq!(s.hisparse_num_pending_transfers(), 3);
    assert_eq!(s.hisparse_host_pages().unwrap().num_free_blocks, 12);
    // Only the write-backs hold them now: their landing frees blocks.
    assert!(s.hisparse_pending_reclamation());
    s.check_invariants().unwrap();
}

#[test]
fn the_connector_refuses_settings_it_cannot_serve() {
    let mut s = connector_scheduler(false);
    s.add_request(0, prompt(0, 9)).unwrap();
    run_step(&mut s);
    assert!(matches!(
        s.set_hisparse_connector(16),
        Err(Error::Config { .. })
    ));
    assert!(!s.hisparse_connector());
    // No host pool.
    let mut s: Scheduler<u32> = Scheduler::new(config(), false).unwrap();
    assert!(matches!(
        s.set_hisparse_connector(16),
        Err(Error::Config { .. })
    ));
    assert!(matches!(
        s.take_hisparse_transfers(),
        Err(Error::Config { .. })
    ));
    // The host pool is the connector's once it is on.
    let mut s = connector_scheduler(true);
    assert!(matches!(
        s.set_hisparse_host_pages(Some((8, 4))),
        Err(Error::Config { .. })
    ));
    assert!(s.hisparse_connector());
}

#[test]
fn prefix_caching_with_the_connector_is_refused() {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        ..connector_scheduler(false).config().clone()
    };
    let mut s: Scheduler<u32> = Scheduler::new(cfg, false).unwrap();
    s.set_hisparse_host_pages(Some((16, 4))).unwrap();
    let err = s.set_hisparse_connector(16).unwrap_err();
    assert!(err.to_string().contains("enable_caching"), "{err}");
}
