//! The connector's device half on the coordinator against [`DeviceResidency`] (which agrees
//! with vLLM's own `KVCacheManager` + `HiSparseCoordinator`, tests/test_hisparse_residency_model.py):
//! seeded streams of allocations, `advance_scheduled`, acknowledgements and frees, every
//! table, both free queues in order, the write-backs and the pending answers equal after
//! every operation.

use super::super::{DeviceResidency, TokenId};
use super::*;

const BLOCK_SIZE: usize = 4;
const HOT_BLOCKS: usize = 2;

struct Pair {
    reference: DeviceResidency<u64>,
    coord: KvCoordinator<u64>,
    connector: HiSparseConnectorKv<u64>,
    /// Slots allocated per request (its computed tokens in the coordinator).
    slots: Vec<usize>,
}

impl Pair {
    fn new(num_blocks: usize, host_num_blocks: usize, max_admission: usize) -> Self {
        let groups = vec![
            KvGroupSpec::FullAttention,
            KvGroupSpec::HiSparseResident {
                max_admission_blocks: max_admission,
            },
            KvGroupSpec::HiSparseHot {
                blocks_per_request: HOT_BLOCKS,
            },
        ];
        let mut coord = KvCoordinator::new(groups, num_blocks, BLOCK_SIZE, false).unwrap();
        let connector = HiSparseConnectorKv::new(&mut coord, host_num_blocks, 16).unwrap();
        let reference = DeviceResidency::new(
            num_blocks,
            host_num_blocks,
            BLOCK_SIZE,
            HOT_BLOCKS,
            max_admission,
            16,
        )
        .unwrap();
        Self {
            reference,
            coord,
            connector,
            slots: vec![0; 6],
        }
    }

    /// Both allocate; `Err` when the coordinator's pages lost to the allocation required a
    /// hot region that did not fit (vLLM raises there; the reference would panic).
    fn allocate(&mut self, id: u64, n: usize) -> std::result::Result<bool, ()> {
        let start = self.slots[id as usize];
        let tokens: Vec<TokenId> = (0..(start + n) as TokenId).collect();
        let ours = self.connector.host_fits(&id, start + n)
            && match self
                .coord
                .allocate_slots(&id, &tokens[start..], n, 0, None, None)
            {
                Ok(out) => out.is_some(),
                Err(_) => return Err(()),
            };
        if ours {
            self.connector.charge_host(&self.coord, &id).unwrap();
            self.slots[id as usize] += n;
        }
        let theirs = self.reference.allocate_slots(id, start + n).unwrap();
        assert_eq!(ours, theirs, "allocation of {n} for request {id}");
        Ok(ours)
    }

    fn compare(&self, what: &str) {
        for id in 0..self.slots.len() as u64 {
            let theirs = self.reference.tables(&id);
            let ours = self.coord.block_ids(&id).map(|t| {
                (
                    self.connector.host_table(&id).unwrap_or_default().to_vec(),
                    t[0].to_vec(),
                    self.coord.hisparse_resident_row(&id).unwrap(),
                    t[2].to_vec(),
                )
            });
            assert_eq!(ours, theirs, "{what}: request {id}'s tables");
        }
        assert_eq!(
            self.coord.free_block_ids(),
            self.reference.free_blocks(),
            "{what}"
        );
        assert_eq!(
            self.connector.host_free_blocks(),
            self.reference.host_free_blocks(),
            "{what}: host"
        );
        assert_eq!(
            self.connector.has_pending_reclamation(&self.coord),
            self.reference.has_pending_reclamation(),
            "{what}: has_pending_reclamation"
        );
        assert_eq!(
            self.connector.has_pending_work(),
            self.reference.has_pending_work()
        );
        self.coord.check_invariants().unwrap();
        self.connector.check().unwrap();
        self.reference.check().unwrap();
    }
}

fn rng(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move |n| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    }
}

/// Runs one seeded stream; returns (steps, write-backs, unpinned pages seen, pages lost).
fn run_stream(
    seed: u64,
    num_blocks: usize,
    host_num_blocks: usize,
) -> (usize, usize, usize, usize) {
    let mut next = rng(seed);
    let mut pair = Pair::new(num_blocks, host_num_blocks, 4 + next(4) as usize);
    let mut outstanding: Vec<u64> = Vec::new();
    let (mut steps, mut transfers, mut unpinned, mut lost) = (0, 0, 0, 0);
    'stream: for step in 0..120 {
        // A step: some requests get tokens (admissions among them), then each scheduled
        // one is advanced once all allocations are done (vLLM's `build_connector_meta`).
        let mut scheduled = Vec::new();
        for id in 0..6u64 {
            if next(3) == 0 {
                continue;
            }
            let held = pair.slots[id as usize] > 0;
            let n = if held && next(3) > 0 {
                1
            } else {
                1 + next(12) as usize
            };
            match pair.allocate(id, n) {
                Ok(true) => scheduled.push(id),
                Ok(false) => {}
                Err(()) => break 'stream,
            }
        }
        for &id in &scheduled {
            let computed = pair.slots[id as usize];
            pair.connector
                .advance_scheduled(&mut pair.coord, &id, computed)
                .unwrap();
            pair.reference.advance_scheduled(&id, computed).unwrap();
        }
        let ours = pair.connector.take_transfers();
        assert_eq!(
            ours,
            pair.reference.take_transfers(),
            "seed {seed} step {step}: transfers"
        );
        transfers += ours.len();
        outstanding.extend(ours.iter().map(|t| t.transfer_id));
        pair.compare(&format!("seed {seed} step {step} scheduled"));
        // The workers acknowledge some write-backs.
        let acked: Vec<(u64, u32)> = (outstanding.iter())
            .filter(|_| next(2) == 0)
            .map(|&id| (id, 1))
            .collect();
        outstanding.retain(|id| !acked.iter().any(|(a, _)| a == id));
        pair.connector
            .acknowledge(&mut pair.coord, &acked, &acked)
            .unwrap();
        pair.reference.acknowledge(&acked, &acked).unwrap();
        lost += pair.coord.take_hisparse_lost_pages().len();
        unpinned += (0..6u64)
            .map(|id| pair.coord.hisparse_unpinned_pages(&id).len())
            .sum::<usize>();
        pair.compare(&format!("seed {seed} step {step} acknowledged"));
        // Requests finish or are preempted (the same with caching off).
        for id in 0..6u64 {
            if pair.slots[id as usize] > 0 && next(10) == 0 {
                pair.connector.free(&mut pair.coord, &id).unwrap();
                pair.reference.free(&id).unwrap();
                pair.slots[id as usize] = 0;
            }
        }
        pair.compare(&format!("seed {seed} step {step} freed"));
        steps += 1;
    }
    (steps, transfers, unpinned, lost)
}

/// 24 streams over 40, 60 and 100 device blocks: the coordinator-backed connector hands
/// out the reference's block ids everywhere, with pages unpinned and lost in them.
#[test]
fn the_coordinator_backed_connector_matches_the_reference() {
    let mut totals = (0, 0, 0, 0);
    for seed in 1..=24u64 {
        let num_blocks = [40, 60, 100][(seed % 3) as usize];
        let (s, t, u, l) = run_stream(seed, num_blocks, 48);
        assert!(s > 10, "seed {seed} ran {s} steps");
        totals = (totals.0 + s, totals.1 + t, totals.2 + u, totals.3 + l);
    }
    let (steps, transfers, unpinned, lost) = totals;
    assert!(transfers > 100 && unpinned > 0 && lost > 0, "{totals:?}");
    assert!(steps > 1000, "{totals:?}");
}

/// The connector refuses layouts it does not model.
#[test]
fn unmodelled_layouts_are_refused() {
    let groups = vec![
        KvGroupSpec::FullAttention,
        KvGroupSpec::HiSparseHot {
            blocks_per_request: 2,
        },
    ];
    let mut coord = KvCoordinator::<u64>::new(groups, 20, 4, false).unwrap();
    assert!(HiSparseConnectorKv::new(&mut coord, 10, 4).is_err());
    let groups = vec![
        KvGroupSpec::FullAttention,
        KvGroupSpec::HiSparseResident {
            max_admission_blocks: 4,
        },
        KvGroupSpec::HiSparseHot {
            blocks_per_request: 2,
        },
    ];
    let mut coord = KvCoordinator::<u64>::new(groups.clone(), 20, 4, true).unwrap();
    let err = HiSparseConnectorKv::new(&mut coord, 10, 4).unwrap_err();
    assert!(err.to_string().contains("enable_caching"), "{err}");
    let mut coord = KvCoordinator::<u64>::new(groups, 20, 4, false).unwrap();
    assert!(HiSparseConnectorKv::new(&mut coord, 1, 4).is_err());
    assert!(HiSparseConnectorKv::new(&mut coord, 10, 4).is_ok());
}
