//! The HiSparse connector's device half (`hisparse_residency.rs`): numbers checked by hand.

use super::*;

fn pool(num_blocks: usize) -> DeviceResidency<u64> {
    DeviceResidency::new(num_blocks, 40, 4, 2, 4, 32).unwrap()
}

#[test]
fn values_are_checked() {
    assert!(matches!(
        DeviceResidency::<u64>::new(1, 8, 4, 2, 4, 8),
        Err(Error::Config {
            field: "num_blocks",
            ..
        })
    ));
    assert!(matches!(
        DeviceResidency::<u64>::new(8, 8, 4, 0, 4, 8),
        Err(Error::Config {
            field: "blocks_per_request",
            ..
        })
    ));
}

#[test]
fn write_backs_hold_host_and_resident_blocks_until_acknowledged() {
    let mut pool = pool(100);
    // 9 tokens: 3 pages; indexer 1-3, resident 4-6; pages 0 and 1 sealed.
    assert!(pool.admit(1, 9, None).unwrap());
    let (host, indexer, resident, hot) = pool.tables(&1).unwrap();
    assert_eq!(
        (host, indexer, resident),
        (vec![1, 2, 3], vec![1, 2, 3], vec![4, 5, 6])
    );
    assert!(hot.is_empty());
    let planned = pool.take_transfers();
    assert_eq!(
        planned[1],
        DeviceTransfer {
            transfer_id: 1,
            host_block_id: 2,
            resident_block_id: 5
        }
    );
    pool.free(&1).unwrap();
    // The resident blocks of pending pages stay with their transfers.
    // The indexer's blocks go first, then the resident group's, each to the front.
    assert_eq!(&pool.free_blocks()[..4], &[6, 3, 2, 1]);
    pool.acknowledge(&[(0, 1), (1, 1)], &[(0, 1), (1, 1)])
        .unwrap();
    assert_eq!(&pool.free_blocks()[..3], &[5, 4, 6]);
    pool.check().unwrap();
}

#[test]
fn a_full_admission_window_requires_a_hot_region_then_clean_pages_unpin() {
    let mut pool = pool(100);
    // 16 tokens: 4 resident blocks, the admission window: hot required.
    assert!(pool.admit(1, 16, None).unwrap());
    let transfers: Vec<(u64, u32)> = pool
        .take_transfers()
        .iter()
        .map(|t| (t.transfer_id, 1))
        .collect();
    assert_eq!(transfers.len(), 4);
    // The next allocation takes the hot region; landed pages unpin but the last two.
    assert!(pool.decode(&1).unwrap());
    assert_eq!(pool.tables(&1).unwrap().3.len(), 2);
    let free_before = pool.num_free_blocks();
    pool.acknowledge(&transfers, &transfers).unwrap();
    // Pages 0-2 of 5 are unpinned (page 3 and 4 are the tail): blocks to the tail.
    assert_eq!(pool.num_free_blocks(), free_before + 3);
    let free = pool.free_blocks();
    let resident = pool.tables(&1).unwrap().2;
    assert_eq!(
        &free[free.len() - 3..],
        &[resident[0], resident[1], resident[2]]
    );
    pool.check().unwrap();
}

#[test]
fn a_reused_unpinned_block_loses_its_page() {
    let mut pool = DeviceResidency::new(14, 40, 4, 2, 2, 32).unwrap();
    assert!(pool.admit(1, 12, None).unwrap());
    let t: Vec<(u64, u32)> = pool
        .take_transfers()
        .iter()
        .map(|t| (t.transfer_id, 1))
        .collect();
    // Its resident blocks fill the admission window: the next allocation takes the
    // hot region, and the landed pages but the last two unpin.
    assert!(pool.step(&1, 1).unwrap());
    assert!(pool.decode(&1).unwrap());
    pool.acknowledge(&t, &t).unwrap();
    let resident = pool.tables(&1).unwrap().2;
    assert_eq!(resident[0], 4);
    // Another request takes every free block, the unpinned one last.
    let free = pool.num_free_blocks();
    assert!(pool.admit(2, 4 * (free / 2), None).unwrap());
    assert_eq!(pool.tables(&1).unwrap().2[0], NULL_BLOCK);
    pool.check().unwrap();
}

#[test]
fn the_schedulers_order_plans_after_all_allocations() {
    // vLLM's scheduler allocates every scheduled request, then advances them.
    let mut pool = pool(100);
    assert!(pool.allocate_slots(1, 9).unwrap());
    assert!(pool.allocate_slots(2, 5).unwrap());
    // Nothing is planned before the advance.
    assert!(pool.take_transfers().is_empty());
    assert!(!pool.has_pending_work());
    pool.advance_scheduled(&1, 9).unwrap();
    pool.advance_scheduled(&2, 5).unwrap();
    let planned: Vec<_> = pool
        .take_transfers()
        .into_iter()
        .map(|t| (t.host_block_id, t.resident_block_id))
        .collect();
    // Request 1: host 1-3, indexer 1-3, resident 4-6; request 2: host 4-5, indexer 7-8,
    // resident 9-10. Two sealed pages of 1, one of 2.
    assert_eq!(planned, vec![(1, 4), (2, 5), (4, 9)]);
    // A second allocation to the same slots takes nothing.
    assert!(pool.allocate_slots(1, 9).unwrap());
    assert_eq!(pool.tables(&1).unwrap().1, vec![1, 2, 3]);
    assert!(matches!(
        pool.advance_scheduled(&3, 4),
        Err(Error::UnknownRequest(_))
    ));
    assert!(matches!(
        pool.allocate_slots(3, 0),
        Err(Error::Input {
            arg: "num_tokens",
            ..
        })
    ));
    // Refused when the pools cannot back it (60 host pages); nothing changes.
    let free = pool.free_blocks();
    assert!(!pool.allocate_slots(3, 4 * 60).unwrap());
    assert_eq!(pool.free_blocks(), free);
    assert!(pool.tables(&3).is_none());
    pool.check().unwrap();
}
