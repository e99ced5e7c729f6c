//! The host-memory KV tier of the block pool: which block hashes have a copy in host (CPU)
//! memory, as vLLM's CPU offloading connector and SGLang's HiCache keep them. It holds
//! hashes only (no data) with a capacity in blocks, evicting the least recently used.
//!
//! An intrusive doubly linked list threaded through an arena of slots, plus a hash → slot
//! map: every operation is O(1), and once the arena has grown to capacity a full tier reuses
//! the evicted hash's slot, so nothing is allocated per operation.
//!
//! Invariant (see `check_invariants`): every held hash is in exactly one linked slot and the
//! map points at it; `len <= capacity`. Front = least recently used, back = most recent.

use rustc_hash::FxHashMap;

use super::MAX_NUM_BLOCKS;
use super::block_hash::BlockHash;
use crate::{Error, Result};

/// Slot 0 is the list's head/tail marker; held hashes occupy slots 1..=len.
const SENTINEL: u32 = 0;
const PREV: usize = 0;
const NEXT: usize = 1;

#[derive(Debug, Clone)]
struct Slot {
    hash: BlockHash,
    links: [u32; 2],
}

#[derive(Debug, Clone)]
pub struct HostTier {
    capacity: usize,
    slots: Vec<Slot>,
    index: FxHashMap<BlockHash, u32>,
}

impl HostTier {
    /// A tier of `num_blocks` blocks. The arena and the map grow as hashes arrive, so a large
    /// tier costs nothing until it fills.
    pub fn new(num_blocks: usize) -> Result<Self> {
        if num_blocks == 0 || num_blocks > MAX_NUM_BLOCKS {
            return Err(Error::config(
                "host_num_blocks",
                num_blocks,
                format!("must be between 1 and {MAX_NUM_BLOCKS}"),
            ));
        }
        let sentinel = Slot {
            hash: BlockHash(0),
            links: [SENTINEL; 2],
        };
        Ok(Self {
            capacity: num_blocks,
            slots: vec![sentinel],
            index: FxHashMap::default(),
        })
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn contains(&self, hash: &BlockHash) -> bool {
        self.index.contains_key(hash)
    }

    /// Stores `hash` as the most recent (or refreshes it if held). When the tier is full,
    /// the least recent hash makes room and is returned.
    pub fn offload(&mut self, hash: BlockHash) -> Option<BlockHash> {
        use std::collections::hash_map::Entry;
        match self.index.entry(hash) {
            Entry::Occupied(held) => {
                move_to_back(&mut self.slots, *held.get());
                None
            }
            Entry::Vacant(room) if self.slots.len() <= self.capacity => {
                let slot = self.slots.len() as u32;
                self.slots.push(Slot {
                    hash,
                    links: [SENTINEL; 2],
                });
                link_back(&mut self.slots, slot);
                room.insert(slot);
                None
            }
            Entry::Vacant(room) => {
                let slot = self.slots[SENTINEL as usize].links[NEXT];
                room.insert(slot);
                let evicted = std::mem::replace(&mut self.slots[slot as usize].hash, hash);
                self.index.remove(&evicted);
                move_to_back(&mut self.slots, slot);
                Some(evicted)
            }
        }
    }

    /// A use of `hash` (a load back to GPU) makes it the most recent; an absent hash is
    /// ignored.
    pub fn touch(&mut self, hash: BlockHash) {
        if let Some(&slot) = self.index.get(&hash) {
            move_to_back(&mut self.slots, slot);
        }
    }

    /// Forgets every hash; the arena keeps its memory.
    pub fn clear(&mut self) {
        self.slots.truncate(1);
        self.slots[SENTINEL as usize].links = [SENTINEL; 2];
        self.index.clear();
    }

    /// Held hashes, least recently used first.
    pub fn iter_lru(&self) -> impl Iterator<Item = BlockHash> + '_ {
        let first = self.slots[SENTINEL as usize].links[NEXT];
        std::iter::successors(Some(first), move |&s| {
            Some(self.slots[s as usize].links[NEXT])
        })
        .take_while(|&s| s != SENTINEL)
        .map(move |s| self.slots[s as usize].hash)
    }

    /// Describes the first broken invariant, if any. O(len).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        if self.len() > self.capacity || self.slots.len() != self.len() + 1 {
            return Err(format!(
                "host tier holds {} hashes in {} slots, capacity {}",
                self.len(),
                self.slots.len() - 1,
                self.capacity
            ));
        }
        let mut prev = SENTINEL;
        let mut slot = self.slots[SENTINEL as usize].links[NEXT];
        let mut linked = 0;
        while slot != SENTINEL && linked <= self.len() {
            let Slot { hash, links } = &self.slots[slot as usize];
            if links[PREV] != prev {
                return Err(format!("host tier slot {slot}: back link broken"));
            }
            if self.index.get(hash) != Some(&slot) {
                return Err(format!(
                    "host tier slot {slot}: the map does not point back"
                ));
            }
            (prev, slot, linked) = (slot, links[NEXT], linked + 1);
        }
        if linked != self.len() || self.slots[SENTINEL as usize].links[PREV] != prev {
            return Err(format!(
                "host tier links {linked} slots but holds {} hashes",
                self.len()
            ));
        }
        Ok(())
    }
}

fn unlink(slots: &mut [Slot], slot: u32) {
    let [prev, next] = slots[slot as usize].links;
    slots[prev as usize].links[NEXT] = next;
    slots[next as usize].links[PREV] = prev;
}

fn link_back(slots: &mut [Slot], slot: u32) {
    let last = slots[SENTINEL as usize].links[PREV];
    slots[last as usize].links[NEXT] = slot;
    slots[slot as usize].links = [last, SENTINEL];
    slots[SENTINEL as usize].links[PREV] = slot;
}

fn move_to_back(slots: &mut [Slot], slot: u32) {
    unlink(slots, slot);
    link_back(slots, slot);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(i: u128) -> BlockHash {
        BlockHash(i)
    }

    fn lru(tier: &HostTier) -> Vec<u128> {
        tier.iter_lru().map(|h| h.0).collect()
    }

    #[test]
    fn a_full_tier_evicts_the_least_recent_and_a_touch_refreshes() {
        let mut tier = HostTier::new(3).unwrap();
        assert_eq!(tier.offload(h(1)), None);
        assert_eq!(tier.offload(h(2)), None);
        assert_eq!(tier.offload(h(3)), None);
        tier.touch(h(1));
        assert_eq!(lru(&tier), [2, 3, 1]);
        assert_eq!(tier.offload(h(4)), Some(h(2)), "2 is now the least recent");
        assert_eq!(lru(&tier), [3, 1, 4]);
        assert!(!tier.contains(&h(2)) && tier.contains(&h(4)));
        tier.check_invariants().unwrap();
    }

    #[test]
    fn offloading_a_held_hash_refreshes_it_without_evicting() {
        let mut tier = HostTier::new(2).unwrap();
        tier.offload(h(1));
        tier.offload(h(2));
        assert_eq!(tier.offload(h(1)), None);
        assert_eq!(lru(&tier), [2, 1]);
        tier.touch(h(9));
        assert_eq!(
            (tier.len(), tier.capacity()),
            (2, 2),
            "absent hashes are ignored"
        );
        tier.check_invariants().unwrap();
    }

    #[test]
    fn clear_empties_and_the_tier_refills() {
        let mut tier = HostTier::new(2).unwrap();
        tier.offload(h(1));
        tier.offload(h(2));
        tier.clear();
        assert!(tier.is_empty() && !tier.contains(&h(1)));
        assert_eq!(tier.offload(h(3)), None);
        assert_eq!(lru(&tier), [3]);
        tier.check_invariants().unwrap();
    }

    #[test]
    fn sizes_out_of_range_are_config_errors() {
        for bad in [0, MAX_NUM_BLOCKS + 1] {
            assert!(matches!(
                HostTier::new(bad),
                Err(Error::Config {
                    field: "host_num_blocks",
                    ..
                })
            ));
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Offload(u128),
        Touch(u128),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u128..8).prop_map(Op::Offload),
            3 => (0u128..8).prop_map(Op::Touch),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        #[test]
        fn agrees_with_a_vec_model(
            ops in prop::collection::vec(op(), 1..80),
            capacity in 1usize..5,
        ) {
            let mut tier = HostTier::new(capacity).unwrap();
            // Least recent first.
            let mut model: Vec<u128> = Vec::new();
            for op in ops {
                match op {
                    Op::Offload(x) => {
                        let expected = if let Some(i) = model.iter().position(|&m| m == x) {
                            model.remove(i);
                            None
                        } else if model.len() == capacity {
                            Some(h(model.remove(0)))
                        } else {
                            None
                        };
                        model.push(x);
                        prop_assert_eq!(tier.offload(h(x)), expected);
                    }
                    Op::Touch(x) => {
                        if let Some(i) = model.iter().position(|&m| m == x) {
                            model.remove(i);
                            model.push(x);
                        }
                        tier.touch(h(x));
                    }
                    Op::Clear => {
                        model.clear();
                        tier.clear();
                    }
                }
                prop_assert_eq!(lru(&tier), model.clone());
                prop_assert_eq!(tier.len(), model.len());
                for x in 0..8 {
                    prop_assert_eq!(tier.contains(&h(x)), model.contains(&x));
                }
                prop_assert!(tier.check_invariants().is_ok(), "{:?}", tier.check_invariants());
            }
        }
    }
}
