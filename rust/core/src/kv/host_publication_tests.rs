//! Host publication (vLLM 0.33's HiSparse host pool under the connector): numbers checked
//! by hand against the rules in `host_publication.rs`, and a seeded random stream keeping
//! the pool's invariant.

use super::*;

const BS: usize = 4;

fn prompt(start: u32, len: usize) -> Vec<TokenId> {
    (start..start + len as u32).collect()
}

fn pool(num_blocks: usize) -> HostPublication<u64> {
    HostPublication::new(num_blocks, BS, 64).unwrap()
}

fn ids(transfers: &[HostTransfer]) -> Vec<u64> {
    transfers.iter().map(|t| t.transfer_id).collect()
}

fn ack(pool: &mut HostPublication<u64>, transfers: &[u64]) -> Vec<u64> {
    let counts: Vec<(u64, u32)> = transfers.iter().map(|&t| (t, 1)).collect();
    let live = pool.acknowledge(&counts, &counts).unwrap();
    pool.publish_ready(&live);
    live
}

#[test]
fn rejects_a_pool_without_a_usable_block() {
    assert!(matches!(
        HostPublication::<u64>::new(1, BS, 8),
        Err(Error::Config {
            field: "hisparse_host_num_blocks",
            ..
        })
    ));
    assert!(matches!(
        HostPublication::<u64>::new(8, 0, 8),
        Err(Error::Config {
            field: "block_size",
            ..
        })
    ));
}

#[test]
fn at_most_max_spill_pages_are_planned_a_step() {
    let mut pool = HostPublication::new(12, BS, 3).unwrap();
    pool.admit(1, prompt(0, 20), None).unwrap();
    assert_eq!(ids(&pool.take_transfers()), vec![0, 1, 2]);
    // The next step plans the rest (vLLM's budget counts this step's planned ones).
    pool.admit(2, prompt(100, 9), None).unwrap();
    pool.step(&1, 1).unwrap();
    let planned = pool.take_transfers();
    // Request 2's pages 0 and 1 (blocks 6, 7), then request 1's page 3 (block 4).
    assert_eq!(ids(&planned), vec![3, 4, 5]);
    assert_eq!(planned[2].host_block_id, 4);
    pool.step(&1, 1).unwrap();
    assert_eq!(
        pool.take_transfers(),
        vec![HostTransfer {
            transfer_id: 6,
            host_block_id: 5
        }]
    );
    pool.check().unwrap();
}

#[test]
fn sealed_pages_get_write_backs_holding_their_blocks() {
    let mut pool = pool(10);
    // 10 tokens: pages 0 and 1 sealed, page 2 partial; blocks 1, 2, 3.
    assert_eq!(pool.admit(7, prompt(0, 10), None).unwrap(), Some(0));
    assert_eq!(pool.table(&7).unwrap(), &[1, 2, 3]);
    let planned = pool.take_transfers();
    assert_eq!(ids(&planned), vec![0, 1]);
    assert_eq!(planned[1].host_block_id, 2);
    assert_eq!((pool.ref_count(1), pool.ref_count(3)), (2, 1));
    assert!(pool.take_transfers().is_empty());
    assert!(pool.has_pending_work());
    pool.check().unwrap();
}

#[test]
fn nothing_is_published_before_its_write_back_lands() {
    let mut pool = pool(10);
    pool.admit(1, prompt(0, 9), None).unwrap();
    pool.take_transfers();
    assert!(pool.published_blocks().is_empty());
    assert!(pool.hit_blocks(&prompt(0, 12)).is_empty());
    // Page 1 lands first: not ready while page 0 is pending.
    assert_eq!(ack(&mut pool, &[1]), vec![1]);
    assert!(pool.published_blocks().is_empty());
    ack(&mut pool, &[0]);
    assert_eq!(pool.published_blocks(), vec![1, 2]);
    assert_eq!(pool.hit_blocks(&prompt(0, 12)), vec![1, 2]);
    // Never the prompt's last token: an 8-token prompt hits one page.
    assert_eq!(pool.hit_blocks(&prompt(0, 8)), vec![1]);
    assert!(!pool.has_pending_work());
    pool.check().unwrap();
}

#[test]
fn a_transfer_waits_for_every_worker() {
    let mut pool = pool(10);
    pool.admit(1, prompt(0, 5), None).unwrap();
    pool.take_transfers();
    // Two workers enqueued it; one completion is not enough.
    assert!(pool.acknowledge(&[(0, 2)], &[(0, 1)]).unwrap().is_empty());
    assert_eq!(pool.ref_count(1), 2);
    // A later enqueue count does not change what it waits for.
    assert_eq!(pool.acknowledge(&[(0, 5)], &[(0, 1)]).unwrap(), vec![1]);
    assert_eq!(pool.ref_count(1), 1);
    pool.check().unwrap();
}

#[test]
fn completions_before_the_enqueue_count_are_kept() {
    let mut pool = pool(10);
    pool.admit(1, prompt(0, 5), None).unwrap();
    assert!(pool.acknowledge(&[], &[(0, 1)]).unwrap().is_empty());
    assert_eq!(pool.acknowledge(&[(0, 1)], &[]).unwrap(), vec![1]);
    pool.check().unwrap();
}

#[test]
fn a_hit_shares_published_blocks_and_an_evictable_one_counts_against_the_pool() {
    let mut pool = pool(6);
    pool.admit(1, prompt(0, 9), None).unwrap();
    ack(&mut pool, &[0, 1]);
    pool.free(&1, true).unwrap();
    // Freed tail first: block 3 (unpublished) to the front, 2 and 1 (published) to the tail.
    assert_eq!(pool.free_blocks(), vec![3, 4, 5, 2, 1]);
    // 13 tokens: a two-page hit on evictable blocks, two new pages: 2 + 2 <= 5.
    assert_eq!(pool.admit(2, prompt(0, 13), None).unwrap(), Some(8));
    assert_eq!(pool.table(&2).unwrap(), &[1, 2, 3, 4]);
    assert_eq!(pool.free_blocks(), vec![5]);
    pool.check().unwrap();
    // A third prompt sharing the prefix needs 2 pages + 0 evictable, with one free.
    assert_eq!(pool.admit(3, prompt(0, 14), None).unwrap(), None);
    assert_eq!(pool.admit(3, prompt(0, 10), None).unwrap(), Some(8));
    assert_eq!(pool.table(&3).unwrap(), &[1, 2, 5]);
    pool.check().unwrap();
}

#[test]
fn taking_a_published_block_evicts_its_page() {
    let mut pool = pool(4);
    pool.admit(1, prompt(0, 5), None).unwrap();
    ack(&mut pool, &[0]);
    pool.free(&1, true).unwrap();
    assert_eq!(pool.free_blocks(), vec![2, 3, 1]);
    pool.admit(2, prompt(100, 12), None).unwrap();
    assert!(pool.published_blocks().is_empty());
    assert!(pool.hit_blocks(&prompt(0, 5)).is_empty());
    pool.check().unwrap();
}

#[test]
fn a_finished_request_publishes_when_its_last_write_lands() {
    let mut pool = pool(10);
    pool.admit(1, prompt(0, 9), None).unwrap();
    pool.take_transfers();
    pool.free(&1, true).unwrap();
    // Its pages stay referenced by the lease and the transfers; page 2 (partial) is free.
    assert_eq!(
        (pool.ref_count(1), pool.ref_count(2), pool.ref_count(3)),
        (2, 2, 0)
    );
    assert!(ack(&mut pool, &[0]).is_empty());
    assert!(pool.published_blocks().is_empty());
    ack(&mut pool, &[1]);
    assert_eq!(pool.published_blocks(), vec![1, 2]);
    // The lease goes tail first after the transfer's own: 2 then 1 to the tail.
    assert_eq!(pool.free_blocks(), vec![3, 4, 5, 6, 7, 8, 9, 1, 2]);
    pool.check().unwrap();
}

#[test]
fn a_preempted_request_publishes_nothing_more_and_is_admitted_again() {
    let mut pool = pool(10);
    pool.admit(1, prompt(0, 9), None).unwrap();
    assert_eq!(ids(&pool.take_transfers()), vec![0, 1]);
    ack(&mut pool, &[0]);
    assert_eq!(pool.published_blocks(), vec![1]);
    pool.free(&1, false).unwrap();
    // Admitted again while its old write of page 1 is pending: hits page 0 only.
    assert_eq!(pool.admit(1, prompt(0, 9), None).unwrap(), Some(4));
    let planned = pool.take_transfers();
    // Page 1 is planned again for the new request.
    assert_eq!(ids(&planned), vec![2]);
    // The old transfer lands for no one: the new request's page 1 stays pending.
    assert!(ack(&mut pool, &[1]).is_empty());
    assert_eq!(pool.published_blocks(), vec![1]);
    ack(&mut pool, &[2]);
    assert_eq!(pool.published_blocks().len(), 2);
    pool.check().unwrap();
}

#[test]
fn chunks_and_decodes_plan_each_sealed_page_once() {
    let mut pool = pool(12);
    pool.admit(1, prompt(0, 20), Some(6)).unwrap();
    assert_eq!(ids(&pool.take_transfers()), vec![0]);
    assert!(pool.step(&1, 6).unwrap());
    assert_eq!(ids(&pool.take_transfers()), vec![1, 2]);
    assert!(pool.step(&1, 100).unwrap());
    assert_eq!(pool.num_computed_tokens(&1), Some(20));
    assert_eq!(ids(&pool.take_transfers()), vec![3, 4]);
    for token in 0..4 {
        assert!(pool.decode(&1, 500 + token).unwrap());
    }
    assert_eq!(ids(&pool.take_transfers()), vec![5]);
    assert_eq!(pool.table(&1).unwrap().len(), 6);
    pool.check().unwrap();
}

#[test]
fn a_chunk_without_room_changes_nothing() {
    let mut pool = pool(4);
    pool.admit(1, prompt(0, 20), Some(4)).unwrap();
    pool.admit(2, prompt(100, 8), None).unwrap();
    assert!(!pool.step(&1, 8).unwrap());
    assert_eq!(pool.num_computed_tokens(&1), Some(4));
    assert!(matches!(pool.step(&9, 1), Err(Error::UnknownRequest(_))));
    assert!(matches!(
        pool.admit(1, prompt(0, 3), None),
        Err(Error::Input {
            arg: "request_id",
            ..
        })
    ));
    pool.check().unwrap();
}

/// A seeded stream of every operation keeps blocks conserved.
#[test]
fn random_streams_conserve_blocks() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    for num_blocks in [6, 12, 30] {
        let mut pool = pool(num_blocks);
        let mut planned: Vec<u64> = Vec::new();
        let mut next_id = 0u64;
        for _ in 0..400 {
            let live: Vec<u64> = {
                let mut v: Vec<u64> = pool.requests.keys().copied().collect();
                v.sort_unstable();
                v
            };
            match next(5) {
                0 => {
                    let base = 1000 * (next(3) as u32);
                    let shared = 4 * next(4) as usize;
                    let mut tokens = prompt(base, shared);
                    tokens.extend(prompt(50_000 + next_id as u32 * 100, 1 + next(20) as usize));
                    let chunk = [None, Some(4), Some(9)][next(3) as usize];
                    pool.admit(next_id, tokens, chunk).unwrap();
                    next_id += 1;
                }
                1 if !live.is_empty() => {
                    let id = live[next(live.len() as u64) as usize];
                    pool.step(&id, 1 + next(10) as usize).unwrap();
                    pool.decode(&id, 7).unwrap();
                }
                2 if !planned.is_empty() => {
                    let k = 1 + next(planned.len() as u64) as usize;
                    let done: Vec<u64> = planned.drain(..k).collect();
                    ack(&mut pool, &done);
                }
                3 | 4 if !live.is_empty() => {
                    let id = live[next(live.len() as u64) as usize];
                    pool.free(&id, next(3) != 0).unwrap();
                }
                _ => {}
            }
            planned.extend(ids(&pool.take_transfers()));
            pool.check().unwrap();
        }
    }
}

#[test]
fn a_write_back_alone_holding_its_block_is_a_pending_reclamation() {
    let mut pool = pool(10);
    pool.admit(1, prompt(0, 9), None).unwrap();
    pool.take_transfers();
    assert!(!pool.has_pending_host_reclamation());
    // Finished: the lease holds the pages beside the transfers.
    pool.admit(2, prompt(100, 5), None).unwrap();
    pool.free(&1, true).unwrap();
    assert!(!pool.has_pending_host_reclamation());
    // Preempted: its transfer (id 2) alone holds block 4.
    pool.free(&2, false).unwrap();
    assert_eq!(pool.ref_count(4), 1);
    assert!(pool.has_pending_host_reclamation());
    ack(&mut pool, &[2]);
    assert!(!pool.has_pending_host_reclamation());
    assert_eq!(pool.ref_count(4), 0);
    pool.check().unwrap();
}
