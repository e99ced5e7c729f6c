//! The block pool's hash → block map (the prefix cache's index), an open-addressing table
//! made for a replay whose pool is full: there every new block of a prompt evicts a cached
//! one and is cached itself, so the map sees one removal and one insertion per block, and
//! each was a cache miss or two in a general-purpose map.
//!
//! - A slot is one `u64`: 32 bits of the hash (a tag) and the block id + 1 (0: empty).
//!   Block hashes are xxh3 digests, already uniform: the low 64 bits pick the home slot,
//!   linear probing from there. A tag match is confirmed against the block's own hash, so
//!   an answer is always exact.
//! - Eviction touches no slot: the block's hash is cleared (by the pool) and its slot goes
//!   *dead*; dead slots are dropped when the table is rebuilt, which happens when live and
//!   dead slots fill half of it (amortized O(1): a rebuild leaves it at most a quarter full).
//!
//! Invariant: a block that holds a hash `h` has a slot on `h`'s probe run (the one answer
//! [`CacheMap::get`] gives for `h`), and `num_live` counts such blocks. What the map answers
//! is exactly what a map with eager removals would answer.

use super::block_hash::BlockHash;
use super::block_pool::BlockId;

/// A block's cached hash, as the map reads it (the pool's block metadata).
pub(super) trait HashOf {
    fn hash_of(&self, block: BlockId) -> Option<BlockHash>;
}

const MIN_SLOTS: usize = 64;

#[derive(Debug, Clone)]
pub(super) struct CacheMap {
    slots: Vec<u64>,
    /// Slots in use, live or dead.
    num_used: usize,
    /// Blocks holding a cached hash.
    num_live: usize,
}

impl Default for CacheMap {
    fn default() -> Self {
        Self {
            slots: vec![0; MIN_SLOTS],
            num_used: 0,
            num_live: 0,
        }
    }
}

fn tag(hash: &BlockHash) -> u64 {
    (hash.0 >> 96) as u64
}

fn pack(hash: &BlockHash, block: BlockId) -> u64 {
    (tag(hash) << 32) | (u64::from(block) + 1)
}

fn block_of(slot: u64) -> BlockId {
    ((slot & 0xFFFF_FFFF) - 1) as BlockId
}

impl CacheMap {
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    fn home(&self, hash: &BlockHash) -> usize {
        hash.0 as usize & self.mask()
    }

    /// Cached blocks.
    pub(super) fn len(&self) -> usize {
        self.num_live
    }

    /// The block caching `hash`, if any.
    pub(super) fn get(&self, hash: &BlockHash, blocks: &(impl HashOf + ?Sized)) -> Option<BlockId> {
        let mask = self.mask();
        let want = tag(hash);
        let mut i = self.home(hash);
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                return None;
            }
            if slot >> 32 == want {
                let block = block_of(slot);
                if blocks.hash_of(block) == Some(*hash) {
                    return Some(block);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Reads the home slots of `hashes` ahead of their inserts or lookups: independent
    /// loads that the CPU overlaps, where the probes one by one would wait for each miss.
    pub(super) fn warm(&self, hashes: &[BlockHash]) {
        let acc = hashes
            .iter()
            .fold(0u64, |acc, h| acc ^ self.slots[self.home(h)]);
        std::hint::black_box(acc);
    }

    /// Registers `block` (which the caller then gives `hash`) as caching `hash`, unless a
    /// block already does; returns whether it was registered.
    pub(super) fn insert_if_absent(
        &mut self,
        hash: BlockHash,
        block: BlockId,
        blocks: &(impl HashOf + ?Sized),
    ) -> bool {
        if (self.num_used + 1) * 2 > self.slots.len() {
            self.rebuild(blocks);
        }
        if self.get(&hash, blocks).is_some() {
            return false;
        }
        self.place(pack(&hash, block), &hash);
        self.num_live += 1;
        true
    }

    /// Writes `slot` at the first empty slot of `hash`'s probe run.
    fn place(&mut self, slot: u64, hash: &BlockHash) {
        let mask = self.mask();
        let mut i = self.home(hash);
        while self.slots[i] != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = slot;
        self.num_used += 1;
    }

    /// A block caching a hash was evicted (its hash cleared by the caller): its slot is dead.
    pub(super) fn forget(&mut self) {
        self.num_live -= 1;
    }

    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }

    /// Re-inserts the live slots into a table at most a quarter full (grown if need be).
    fn rebuild(&mut self, blocks: &(impl HashOf + ?Sized)) {
        let mut len = self.slots.len();
        while (self.num_live + 1) * 4 > len {
            len *= 2;
        }
        let old = std::mem::replace(&mut self.slots, vec![0; len]);
        self.num_used = 0;
        for slot in old.into_iter().filter(|&s| s != 0) {
            let block = block_of(slot);
            let Some(hash) = blocks.hash_of(block) else {
                continue;
            };
            // A dead slot whose block now caches another hash with the same tag would
            // duplicate that hash's own slot: the lookup keeps one.
            if tag(&hash) == slot >> 32 && self.get(&hash, blocks).is_none() {
                self.place(slot, &hash);
            }
        }
        debug_assert_eq!(self.num_used, self.num_live);
    }
}
