//! Vidur's counting allocator (seed 000 §4): no block ids, only how many blocks each request
//! holds. It owns the count of allocated blocks; invariant: the per-request counts add up
//! to `num_allocated_blocks`, which never exceeds `num_blocks`.

use rustc_hash::FxHashMap;

use super::{KvCapacity, RequestKey, check_num_blocks};
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub struct CountingAllocator<R: RequestKey> {
    num_blocks: usize,
    watermark_blocks: usize,
    num_allocated_blocks: usize,
    allocation: FxHashMap<R, usize>,
}

impl<R: RequestKey> CountingAllocator<R> {
    /// A pool of `num_blocks`, keeping `floor(watermark_fraction * num_blocks)` blocks in
    /// reserve against new admissions (Vidur's vLLM scheduler uses the watermark so running
    /// requests can still grow).
    pub fn new(num_blocks: usize, watermark_fraction: f64) -> Result<Self> {
        check_num_blocks(num_blocks)?;
        if !(0.0..1.0).contains(&watermark_fraction) {
            return Err(Error::config(
                "watermark_fraction",
                watermark_fraction,
                "must be in [0, 1)",
            ));
        }
        Ok(Self {
            num_blocks,
            watermark_blocks: (watermark_fraction * num_blocks as f64) as usize,
            num_allocated_blocks: 0,
            allocation: FxHashMap::default(),
        })
    }

    /// A pool of `num_blocks` keeping exactly `watermark_blocks` in reserve (the simulator
    /// derives the count from the fraction once, in the config).
    pub fn with_watermark_blocks(num_blocks: usize, watermark_blocks: usize) -> Result<Self> {
        check_num_blocks(num_blocks)?;
        if watermark_blocks >= num_blocks {
            return Err(Error::config(
                "watermark_blocks",
                watermark_blocks,
                format!("must be below num_blocks = {num_blocks}"),
            ));
        }
        Ok(Self {
            num_blocks,
            watermark_blocks,
            num_allocated_blocks: 0,
            allocation: FxHashMap::default(),
        })
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn watermark_blocks(&self) -> usize {
        self.watermark_blocks
    }

    pub fn num_allocated_blocks(&self) -> usize {
        self.num_allocated_blocks
    }

    /// Number of requests holding blocks.
    pub fn num_requests(&self) -> usize {
        self.allocation.len()
    }

    /// Blocks held by `request_id`, or `None` if it holds none.
    pub fn num_blocks_of(&self, request_id: &R) -> Option<usize> {
        self.allocation.get(request_id).copied()
    }

    /// Whether `num_blocks` more blocks fit (a running request growing).
    pub fn can_allocate(&self, num_blocks: usize) -> bool {
        self.num_free_blocks() >= num_blocks
    }

    /// Whether `num_blocks` fit while leaving the watermark free (a new admission).
    pub fn can_admit(&self, num_blocks: usize) -> bool {
        self.num_free_blocks()
            .checked_sub(num_blocks)
            .is_some_and(|left| left >= self.watermark_blocks)
    }

    /// Gives `num_blocks` more blocks to `request_id` (creating its entry if needed).
    pub fn allocate(&mut self, request_id: R, num_blocks: usize) -> Result<()> {
        if num_blocks == 0 {
            return Err(Error::input("num_blocks", 0, "must be at least 1"));
        }
        if !self.can_allocate(num_blocks) {
            return Err(Error::Capacity {
                what: "blocks",
                requested: num_blocks,
                available: self.num_free_blocks(),
            });
        }
        self.num_allocated_blocks += num_blocks;
        *self.allocation.entry(request_id).or_insert(0) += num_blocks;
        Ok(())
    }

    /// Frees every block of each request; all-or-nothing: an unknown or repeated id fails
    /// the whole call before anything is freed. Returns the number of blocks freed.
    pub fn free(&mut self, request_ids: &[R]) -> Result<usize> {
        for (i, id) in request_ids.iter().enumerate() {
            if !self.allocation.contains_key(id) {
                return Err(Error::unknown_request(id));
            }
            if request_ids[..i].contains(id) {
                return Err(Error::input("request_ids", format!("{id:?}"), "repeated"));
            }
        }
        let freed: usize = request_ids
            .iter()
            .filter_map(|id| self.allocation.remove(id))
            .sum();
        self.num_allocated_blocks -= freed;
        Ok(freed)
    }

    /// Frees every block of one request, if it holds any; returns how many were freed (0
    /// for a request holding none). For callers that own the request's life and may ask
    /// twice; `free` is the strict, all-or-nothing form.
    pub fn release(&mut self, request_id: &R) -> usize {
        let freed = self.allocation.remove(request_id).unwrap_or(0);
        self.num_allocated_blocks -= freed;
        freed
    }

    /// Describes the first broken invariant, if any.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let held: usize = self.allocation.values().sum();
        if held != self.num_allocated_blocks {
            return Err(format!(
                "per-request counts sum to {held}, allocated count is {}",
                self.num_allocated_blocks
            ));
        }
        if self.num_allocated_blocks > self.num_blocks {
            return Err(format!(
                "{} blocks allocated out of {}",
                self.num_allocated_blocks, self.num_blocks
            ));
        }
        if self.allocation.values().any(|&n| n == 0) {
            return Err("a request holds zero blocks".into());
        }
        Ok(())
    }
}

impl<R: RequestKey> KvCapacity for CountingAllocator<R> {
    fn num_total_blocks(&self) -> usize {
        self.num_blocks
    }

    fn num_free_blocks(&self) -> usize {
        self.num_blocks - self.num_allocated_blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn watermark_reserves_blocks_for_admission_only() {
        let mut alloc = CountingAllocator::new(100, 0.1).unwrap();
        assert_eq!(alloc.watermark_blocks(), 10);
        alloc.allocate(1u64, 85).unwrap();
        assert!(alloc.can_admit(5));
        assert!(!alloc.can_admit(6));
        assert!(alloc.can_allocate(15));
        assert!(!alloc.can_allocate(16));
    }

    #[test]
    fn allocate_accumulates_per_request_and_free_returns_all() {
        let mut alloc = CountingAllocator::new(10, 0.0).unwrap();
        alloc.allocate(7u64, 3).unwrap();
        alloc.allocate(7u64, 2).unwrap();
        alloc.allocate(8u64, 1).unwrap();
        assert_eq!(alloc.num_blocks_of(&7), Some(5));
        assert_eq!(alloc.free(&[7, 8]).unwrap(), 6);
        assert_eq!(alloc.num_allocated_blocks(), 0);
    }

    #[test]
    fn failed_calls_change_nothing() {
        let mut alloc = CountingAllocator::new(4, 0.0).unwrap();
        alloc.allocate(1u64, 3).unwrap();
        assert!(matches!(
            alloc.allocate(2, 2),
            Err(Error::Capacity {
                requested: 2,
                available: 1,
                ..
            })
        ));
        assert!(matches!(alloc.free(&[1, 9]), Err(Error::UnknownRequest(_))));
        assert!(matches!(alloc.free(&[1, 1]), Err(Error::Input { .. })));
        assert_eq!(alloc.num_blocks_of(&1), Some(3));
        assert_eq!(alloc.num_requests(), 1);
    }

    #[test]
    fn watermark_given_in_blocks_and_release_of_one_request() {
        let mut alloc = CountingAllocator::with_watermark_blocks(10, 3).unwrap();
        assert_eq!(alloc.watermark_blocks(), 3);
        assert!(alloc.can_admit(7) && !alloc.can_admit(8));
        alloc.allocate(5u64, 4).unwrap();
        assert_eq!(alloc.release(&5), 4);
        assert_eq!(
            alloc.release(&5),
            0,
            "a request holding nothing frees nothing"
        );
        assert_eq!(alloc.num_allocated_blocks(), 0);
        assert!(CountingAllocator::<u64>::with_watermark_blocks(10, 10).is_err());
        assert!(CountingAllocator::<u64>::with_watermark_blocks(0, 0).is_err());
    }

    #[test]
    fn bad_config_is_rejected() {
        assert!(CountingAllocator::<u64>::new(0, 0.0).is_err());
        assert!(CountingAllocator::<u64>::new(10, 1.0).is_err());
        assert!(CountingAllocator::<u64>::new(10, f64::NAN).is_err());
        assert!(CountingAllocator::<u64>::new(10, -0.1).is_err());
    }

    proptest! {
        #[test]
        fn counts_are_conserved(ops in prop::collection::vec((0u8..2, 0u64..6, 1usize..8), 1..200)) {
            let mut alloc = CountingAllocator::new(32, 0.0).unwrap();
            for (kind, id, n) in ops {
                let before = alloc.num_allocated_blocks();
                match kind {
                    0 => {
                        let fits = alloc.can_allocate(n);
                        prop_assert_eq!(alloc.allocate(id, n).is_ok(), fits);
                    }
                    _ => {
                        let held = alloc.num_blocks_of(&id);
                        prop_assert_eq!(alloc.free(&[id]).ok(), held);
                        prop_assert_eq!(alloc.num_allocated_blocks(), before - held.unwrap_or(0));
                    }
                }
                prop_assert!(alloc.check_invariants().is_ok(), "{:?}", alloc.check_invariants());
            }
        }
    }
}
