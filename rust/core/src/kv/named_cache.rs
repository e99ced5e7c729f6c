//! The prefix cache's index of KV blocks named by trace block ([`content_block`]): one
//! entry per trace block (per seed) holding, for each place of its KV blocks, the block
//! that caches it. A named KV block's hash carries its seed and place ([`named_parts`]),
//! so inserting, looking up and evicting one is a probe for its seed's entry (the same
//! entry, hot, for every KV block of a trace block: a 512-token trace block is 32 KV
//! blocks of 16) and a read or write of one slot in the entry's run of slots. The
//! per-block map ([`CacheMap`](super::cache_map::CacheMap)) keeps token-hashed blocks and
//! routes named hashes here; it still owns the counts and the list of copies of a hash.
//!
//! - Entries live in an open-addressing table (linear probing from the seed's top bits,
//!   at most half full, removed by backward shift, so no tombstones). An entry with no
//!   cached place is removed.
//! - An entry's slots are a chunk of `1 << shift` `u32`s (block id + 1; 0: not cached) in
//!   one slab, with free lists per size. A new entry's chunk fits the most places recent
//!   entries needed (the last [`WINDOW`] new entries or the ones before them), so a pool
//!   whose trace blocks are 32 KV blocks does not regrow 32 times per trace block, and a
//!   pool whose trace blocks got shorter stops handing out the long chunks.
//! - An eviction that leaves an entry's highest cached place in the first quarter of its
//!   chunk moves it into a chunk that fits (a head left by tail-first eviction holds a
//!   chunk of one or two slots, not its trace block's).
//! - An entry whose chunk the slab cannot address (past `u32` offsets) keeps its places in
//!   a side map instead (`spilled`): slower, never a panic.
//!
//! Invariant: a slot holds the first block caching its (seed, place) hash, exactly as the
//! per-block map would answer for that hash; `count` is the number of non-zero slots.
//!
//! [`content_block`]: super::content_block
//! [`named_parts`]: super::block_hash::named_parts

use super::block_hash::NamedKey;
use super::block_pool::BlockId;

const MIN_ENTRIES: usize = 64;

/// New entries per window of the needed size ([`NamedCache::insert`]).
const WINDOW: u32 = 64;

/// The `shift` of an entry whose slots are in the side map.
const SPILLED: u8 = 31;

/// Bits of an entry's `meta` that count its cached places (at most 1,024).
const COUNT_BITS: u16 = 11;
const COUNT_MASK: u16 = (1 << COUNT_BITS) - 1;

/// 16 bytes, four to a cache line.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// The key (`NamedKey`'s parts).
    hi: u64,
    lo: u16,
    /// Places cached (non-zero slots) in the low `COUNT_BITS`, the chunk's `shift` above;
    /// 0: the table slot is empty.
    meta: u16,
    /// With `shift` 0, the one slot itself (a trace block of one KV block needs no chunk);
    /// with `SPILLED`, nothing (its slots are in the side map); else the offset of the
    /// entry's chunk of `1 << shift` slots in the slab.
    slots: u32,
}

impl Entry {
    fn key(&self) -> NamedKey {
        NamedKey {
            hi: self.hi,
            lo: self.lo,
        }
    }

    fn count(&self) -> u16 {
        self.meta & COUNT_MASK
    }

    fn shift(&self) -> u8 {
        (self.meta >> COUNT_BITS) as u8
    }

    fn is_empty(&self) -> bool {
        self.meta == 0
    }
}

/// The side map of spilled entries' slots, by key and place.
type Spilled = rustc_hash::FxHashMap<(NamedKey, u32), u32>;

/// Slot `place` of `entry` (which has that many), inline, in the slab or in the side map
/// (where an uncached place reads 0 and is dropped again by [`NamedCache::remove`]).
fn slot_mut<'a>(
    entry: &'a mut Entry,
    slab: &'a mut [u32],
    spilled: &'a mut Spilled,
    place: u32,
) -> &'a mut u32 {
    match entry.shift() {
        0 => &mut entry.slots,
        SPILLED => spilled.entry((entry.key(), place)).or_insert(0),
        _ => &mut slab[(entry.slots + place) as usize],
    }
}

#[derive(Debug, Clone)]
pub(super) struct NamedCache {
    entries: Vec<Entry>,
    num_entries: usize,
    slab: Vec<u32>,
    /// Free chunks by `shift`.
    free_chunks: Vec<Vec<u32>>,
    /// The largest `shift` a place needed in the last full window of new entries.
    typical_shift: u8,
    /// The same in the window going on, and the new entries it has left.
    window_shift: u8,
    window_left: u32,
    /// Slots of the entries the slab could not address.
    spilled: Spilled,
    /// The slab's most slots (`u32` offsets; smaller in tests).
    slab_limit: usize,
}

#[cfg(test)]
thread_local! {
    /// Planted fault for the differential test: a cached place's eviction clears the slot
    /// of the place after it instead (a named block's eviction mis-addressed).
    pub(super) static PLANTED_WRONG_SLOT: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
    /// Planted fault: a run's lookup reads past a place not cached (its block counted
    /// again).
    pub(super) static PLANTED_RUN_READ_PAST: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

impl Default for NamedCache {
    fn default() -> Self {
        Self {
            entries: vec![Entry::default(); MIN_ENTRIES],
            num_entries: 0,
            slab: Vec::new(),
            free_chunks: Vec::new(),
            typical_shift: 0,
            window_shift: 0,
            window_left: WINDOW,
            spilled: Spilled::default(),
            slab_limit: u32::MAX as usize,
        }
    }
}

fn shift_for(place: u32) -> u8 {
    (u32::BITS - place.leading_zeros()) as u8
}

impl NamedCache {
    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    /// The table slot of `key`'s entry, or of the empty slot ending its probe run.
    fn find(&self, key: NamedKey) -> (usize, bool) {
        let mask = self.mask();
        let mut i = key.home() & mask;
        loop {
            let entry = &self.entries[i];
            if entry.is_empty() {
                return (i, false);
            }
            if entry.hi == key.hi && entry.lo == key.lo {
                return (i, true);
            }
            i = (i + 1) & mask;
        }
    }

    /// A word of `key`'s home slot, read ahead of a probe.
    #[inline]
    pub(super) fn home_word(&self, key: NamedKey) -> u64 {
        self.entries[key.home() & self.mask()].hi
    }

    /// The block caching place `place` of `key`, if any.
    pub(super) fn get(&self, key: NamedKey, place: u32) -> Option<BlockId> {
        let (i, found) = self.find(key);
        if !found {
            return None;
        }
        let entry = &self.entries[i];
        let slot = match entry.shift() {
            0 if place == 0 => entry.slots,
            SPILLED => self.spilled.get(&(key, place)).copied().unwrap_or(0),
            shift if place < 1 << shift && shift > 0 => self.slab[(entry.slots + place) as usize],
            _ => return None,
        };
        slot.checked_sub(1)
    }

    /// The blocks caching places `first_place..first_place + max_len` of `key`, pushed onto
    /// `out` up to the first place not cached ([`Self::get`] of each, the entry found
    /// once); returns how many.
    pub(super) fn get_run(
        &self,
        key: NamedKey,
        first_place: u32,
        max_len: usize,
        out: &mut Vec<BlockId>,
    ) -> usize {
        let (i, found) = self.find(key);
        if !found {
            return 0;
        }
        let entry = &self.entries[i];
        let shift = entry.shift();
        if shift == 0 || shift == SPILLED {
            let hits = (first_place..)
                .take(max_len)
                .map_while(|place| self.get(key, place));
            let before = out.len();
            out.extend(hits);
            return out.len() - before;
        }
        let end = (1usize << shift).min(first_place as usize + max_len);
        let chunk = &self.slab[entry.slots as usize..][..end];
        let slots = chunk.get(first_place as usize..).unwrap_or(&[]);
        #[cfg(test)]
        let planted = PLANTED_RUN_READ_PAST.get();
        let mut n = 0;
        for &slot in slots {
            match slot.checked_sub(1) {
                Some(block) => out.push(block),
                #[cfg(test)]
                None if planted && n > 0 => out.push(out[out.len() - 1]),
                None => break,
            }
            n += 1;
        }
        n
    }

    /// Caches `block` at `key`'s `place` unless a block caches it already: returns that
    /// block (then nothing changes).
    pub(super) fn insert(&mut self, key: NamedKey, place: u32, block: BlockId) -> Option<BlockId> {
        let i = self.entry_for(key, place);
        self.insert_at(i, place, block)
    }

    /// [`Self::insert`] of a run of one trace block's places, `first_place` onwards, one
    /// block each (`blocks`), in that order: the entry is found once. `on_copy(k, first)`
    /// is told of each place `first_place + k` that a block already cached (`first`).
    pub(super) fn insert_run(
        &mut self,
        key: NamedKey,
        first_place: u32,
        blocks: &[BlockId],
        mut on_copy: impl FnMut(usize, BlockId),
    ) {
        let Some(num_places) = u32::try_from(blocks.len()).ok().filter(|&n| n > 0) else {
            return;
        };
        let i = self.entry_for(key, first_place);
        // The chunk is sized for the run's last place at once (one place at a time, it
        // regrows at each power of two the run passes, to the same size).
        let last = first_place + num_places - 1;
        let shift = self.entries[i].shift();
        if shift != SPILLED && last >= 1 << shift {
            self.regrow(i, shift_for(last));
        }
        let shift = self.entries[i].shift();
        if shift == 0 || shift == SPILLED {
            // Place 0 alone, or a spilled entry: one place at a time.
            for (k, &block) in blocks.iter().enumerate() {
                if let Some(first) = self.insert_at(i, first_place + k as u32, block) {
                    on_copy(k, first);
                }
            }
            return;
        }
        self.window_shift = self.window_shift.max(shift_for(last));
        let entry = &mut self.entries[i];
        let base = (entry.slots + first_place) as usize;
        let mut num_new = 0;
        for (k, (slot, &block)) in (self.slab[base..base + blocks.len()].iter_mut())
            .zip(blocks)
            .enumerate()
        {
            match slot.checked_sub(1) {
                Some(first) => on_copy(k, first),
                None => {
                    *slot = block + 1;
                    num_new += 1;
                }
            }
        }
        entry.meta += num_new;
    }

    /// The table slot of `key`'s entry, made (with a chunk sized for recent entries and
    /// `place`) if it has none.
    fn entry_for(&mut self, key: NamedKey, place: u32) -> usize {
        let (mut i, found) = self.find(key);
        if found {
            return i;
        }
        if (self.num_entries + 1) * 2 > self.entries.len() {
            self.grow();
            i = self.find(key).0;
        }
        let shift = (self.typical_shift.max(self.window_shift)).max(shift_for(place));
        self.window_left -= 1;
        if self.window_left == 0 {
            self.typical_shift = self.window_shift;
            self.window_shift = 0;
            self.window_left = WINDOW;
        }
        let (shift, slots) = match shift {
            0 => (0, 0),
            _ => self
                .take_chunk(shift)
                .map_or((SPILLED, 0), |chunk| (shift, chunk)),
        };
        // Its count is raised by the insert that follows, before any other lookup.
        self.entries[i] = Entry {
            hi: key.hi,
            lo: key.lo,
            meta: u16::from(shift) << COUNT_BITS,
            slots,
        };
        self.num_entries += 1;
        i
    }

    /// [`Self::insert`] into the entry at table slot `i`.
    fn insert_at(&mut self, i: usize, place: u32, block: BlockId) -> Option<BlockId> {
        if self.entries[i].shift() != SPILLED && place >= 1 << self.entries[i].shift() {
            self.regrow(i, shift_for(place));
        }
        self.window_shift = self.window_shift.max(shift_for(place));
        let entry = &mut self.entries[i];
        let slot = slot_mut(entry, &mut self.slab, &mut self.spilled, place);
        if let Some(first) = slot.checked_sub(1) {
            return Some(first);
        }
        *slot = block + 1;
        entry.meta += 1;
        None
    }

    /// Makes `block` the one caching `key`'s `place`, which is cached (a later copy takes
    /// over from the evicted first).
    pub(super) fn replace(&mut self, key: NamedKey, place: u32, block: BlockId) {
        let (i, found) = self.find(key);
        debug_assert!(found, "a copy takes over a cached place");
        *slot_mut(
            &mut self.entries[i],
            &mut self.slab,
            &mut self.spilled,
            place,
        ) = block + 1;
    }

    /// Un-caches `key`'s `place` (its only block was evicted); the entry goes with its last
    /// place.
    pub(super) fn remove(&mut self, key: NamedKey, place: u32) {
        self.remove_run(key, &[place]);
    }

    /// [`Self::remove`] of several places of one trace block, in `places`' order (an
    /// eviction takes a freed request's blocks tail first): the entry is found once.
    pub(super) fn remove_run(&mut self, key: NamedKey, places: &[u32]) {
        let (i, found) = self.find(key);
        debug_assert!(found, "an evicted named block is cached");
        let entry = self.entries[i];
        let shift = entry.shift();
        #[cfg(test)]
        let shift = if PLANTED_WRONG_SLOT.get() { 0 } else { shift };
        if shift == 0 || shift == SPILLED {
            // Inline or spilled (or the planted fault): one place at a time.
            for &place in places {
                // Only its last place deletes the entry, and that is the run's last.
                if self.remove_at(i, key, place) {
                    return;
                }
            }
            return;
        }
        let chunk = &mut self.slab[entry.slots as usize..][..1 << shift];
        let mut highest = 0;
        for &place in places {
            debug_assert!(
                chunk[place as usize] != 0,
                "an evicted named block's place is cached"
            );
            chunk[place as usize] = 0;
            highest = highest.max(place);
        }
        let count = entry.count() - places.len() as u16;
        self.entries[i].meta = entry.meta - places.len() as u16;
        if count == 0 {
            self.free_chunks[shift as usize].push(entry.slots);
            self.num_entries -= 1;
            self.delete_at(i);
        } else if shift >= 2 {
            // As `remove_at`, once for the run: the entry moves to a chunk that fits if its
            // highest cached place may have left the upper three quarters.
            let quarter = 1u32 << (shift - 2);
            if u32::from(count) <= quarter && highest >= quarter {
                self.shrink(i, quarter);
            }
        }
    }

    /// Un-caches `place` of `key`'s entry, at table slot `i`; returns whether the entry
    /// went with it (its last place).
    fn remove_at(&mut self, i: usize, key: NamedKey, place: u32) -> bool {
        #[cfg(test)]
        let place = if PLANTED_WRONG_SLOT.get() && place + 1 < 1 << self.entries[i].shift() {
            place + 1
        } else {
            place
        };
        let entry = &mut self.entries[i];
        let slot = slot_mut(entry, &mut self.slab, &mut self.spilled, place);
        #[cfg(test)]
        if *slot == 0 && PLANTED_WRONG_SLOT.get() {
            // The mis-addressed place was not cached: nothing to clear.
            return false;
        }
        debug_assert!(*slot != 0, "an evicted named block's place is cached");
        *slot = 0;
        entry.meta -= 1;
        let (count, shift) = (entry.count(), entry.shift());
        if shift == SPILLED {
            self.spilled.remove(&(key, place));
        }
        if count == 0 {
            if shift > 0 && shift != SPILLED {
                self.free_chunks[shift as usize].push(entry.slots);
            }
            self.num_entries -= 1;
            self.delete_at(i);
            return true;
        }
        if shift >= 2 && shift != SPILLED {
            // The highest cached place may have left the chunk's upper three quarters: only
            // then (at most a quarter of the places cached, this one above the quarter) is
            // that span read.
            let quarter = 1u32 << (shift - 2);
            if u32::from(count) <= quarter && place >= quarter {
                self.shrink(i, quarter);
            }
        }
        false
    }

    /// Moves entry `i` into the smallest chunk holding its highest cached place, if that
    /// place is below `quarter` (a quarter of its chunk).
    fn shrink(&mut self, i: usize, quarter: u32) {
        let entry = self.entries[i];
        let base = entry.slots as usize;
        let chunk = &self.slab[base..base + (1usize << entry.shift())];
        if chunk[quarter as usize..].iter().any(|&slot| slot != 0) {
            return;
        }
        let highest = (chunk[..quarter as usize].iter())
            .rposition(|&slot| slot != 0)
            .expect("a counted entry caches a place") as u32;
        self.regrow(i, shift_for(highest));
    }

    /// Forgets every entry; the slab keeps its memory.
    pub(super) fn clear(&mut self) {
        self.entries.fill(Entry::default());
        self.num_entries = 0;
        self.slab.clear();
        self.free_chunks.iter_mut().for_each(Vec::clear);
        self.spilled.clear();
    }

    /// Slots the slab holds, in use or free.
    #[cfg(test)]
    pub(super) fn slab_len(&self) -> usize {
        self.slab.len()
    }

    /// Entries (trace blocks with a cached place).
    #[cfg(test)]
    pub(super) fn num_entries(&self) -> usize {
        self.num_entries
    }

    /// Empties table slot `i` and shifts back the entries after it whose probe run
    /// crosses it (linear probing's deletion without tombstones).
    fn delete_at(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let entry = self.entries[i];
            if entry.is_empty() {
                break;
            }
            let home = entry.key().home() & mask;
            // The entry may fill the hole unless its home lies cyclically in (hole, i].
            let stays = if hole <= i {
                hole < home && home <= i
            } else {
                hole < home || home <= i
            };
            if !stays {
                self.entries[hole] = entry;
                hole = i;
            }
        }
        self.entries[hole] = Entry::default();
    }

    fn grow(&mut self) {
        let len = self.entries.len() * 2;
        let old = std::mem::replace(&mut self.entries, vec![Entry::default(); len]);
        for entry in old.into_iter().filter(|e| !e.is_empty()) {
            let (i, _) = self.find(entry.key());
            self.entries[i] = entry;
        }
    }

    /// A chunk of `1 << shift` slots, all zero; `None` when the slab would pass its limit.
    fn take_chunk(&mut self, shift: u8) -> Option<u32> {
        if self.free_chunks.len() <= shift as usize {
            self.free_chunks.resize(shift as usize + 1, Vec::new());
        }
        if let Some(chunk) = self.free_chunks[shift as usize].pop() {
            return Some(chunk);
        }
        let chunk = self.slab.len();
        if chunk + (1 << shift) > self.slab_limit {
            return None;
        }
        self.slab.resize(chunk + (1 << shift), 0);
        u32::try_from(chunk).ok()
    }

    /// Moves entry `i`'s slots into a chunk of `1 << shift` (which holds its cached
    /// places), inline for `shift` 0, or into the side map if the slab has no room.
    fn regrow(&mut self, i: usize, shift: u8) {
        let entry = self.entries[i];
        let chunk = match shift {
            0 => None,
            _ => match self.take_chunk(shift) {
                Some(chunk) => Some(chunk),
                // A shrink can wait; a growth cannot.
                None if shift < entry.shift() => return,
                None => return self.spill(i),
            },
        };
        let old_value = match entry.shift() {
            0 => entry.slots,
            old_shift => {
                let (old, len) = (entry.slots as usize, 1usize << old_shift);
                let kept = len.min(1 << shift);
                if let Some(chunk) = chunk {
                    self.slab.copy_within(old..old + kept, chunk as usize);
                }
                let first = self.slab[old];
                // Free chunks are all zero (a fresh chunk's places are not cached).
                self.slab[old..old + len].fill(0);
                self.free_chunks[old_shift as usize].push(entry.slots);
                first
            }
        };
        let entry = &mut self.entries[i];
        entry.slots = match chunk {
            Some(chunk) => {
                if entry.shift() == 0 {
                    self.slab[chunk as usize] = old_value;
                }
                chunk
            }
            // Inline: place 0 only.
            None => old_value,
        };
        entry.meta = entry.count() | u16::from(shift) << COUNT_BITS;
    }

    /// Moves entry `i`'s slots (inline or in the slab) into the side map.
    #[cold]
    fn spill(&mut self, i: usize) {
        let entry = self.entries[i];
        let key = entry.key();
        match entry.shift() {
            0 => {
                if entry.slots != 0 {
                    self.spilled.insert((key, 0), entry.slots);
                }
            }
            shift => {
                let (old, len) = (entry.slots as usize, 1usize << shift);
                for (place, slot) in self.slab[old..old + len].iter_mut().enumerate() {
                    if *slot != 0 {
                        self.spilled.insert((key, place as u32), *slot);
                        *slot = 0;
                    }
                }
                self.free_chunks[shift as usize].push(entry.slots);
            }
        }
        let entry = &mut self.entries[i];
        entry.slots = 0;
        entry.meta = entry.count() | u16::from(SPILLED) << COUNT_BITS;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    #[should_panic(expected = "an evicted named block's place is cached")]
    fn removing_an_uncached_place_is_a_bug_outside_the_planted_fault() {
        let mut cache = NamedCache::default();
        let key = NamedKey::from_parts(1, 2);
        cache.insert(key, 0, 7);
        cache.insert(key, 3, 8);
        cache.remove(key, 1);
    }

    #[test]
    fn a_head_left_by_tail_first_eviction_shrinks_and_new_entries_follow_recent_sizes() {
        let mut cache = NamedCache::default();
        let key = |n: u64| NamedKey::from_parts(n, 1);
        // One trace block of 1,024 places, evicted tail-first down to its head.
        for place in 0..1024 {
            cache.insert(key(0), place, place);
        }
        for place in (1..1024).rev() {
            cache.remove(key(0), place);
        }
        assert_eq!(cache.get(key(0), 0), Some(0));
        assert_eq!(
            cache.entries[cache.find(key(0)).0].shift(),
            0,
            "the head is inline"
        );
        // Then trace blocks of one place each: past two windows of them, new ones are
        // inline (no chunk of 1,024 slots each).
        let windows = 2 * u64::from(WINDOW);
        for n in 1..=windows {
            cache.insert(key(n), 0, n as BlockId);
        }
        let slab = cache.slab_len();
        for n in windows + 1..=windows + 1000 {
            cache.insert(key(n), 0, n as BlockId);
        }
        assert_eq!(cache.slab_len(), slab);
        for n in 0..=windows + 1000 {
            assert_eq!(cache.get(key(n), 0), Some(n as BlockId));
        }
    }

    #[test]
    fn answers_as_a_map_of_places_through_growth_deletion_and_regrowth() {
        for slab_limit in [u32::MAX as usize, 64] {
            answers_as_a_map(slab_limit);
        }
    }

    /// The randomized check, with the slab capped at `slab_limit` slots (entries past it
    /// spill into the side map).
    fn answers_as_a_map(slab_limit: usize) {
        let mut cache = NamedCache {
            slab_limit,
            ..NamedCache::default()
        };
        let mut model: HashMap<(NamedKey, u32), BlockId> = HashMap::new();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // Few home slots for many keys: long probe runs, deletions inside them.
        let key_of = |n: u64| NamedKey::from_parts(n % 7, n as u16);
        for step in 0..100_000u64 {
            let key = key_of(next() % 300);
            let place = (next() % [1, 4, 40][(step / 30_000) as usize % 3]) as u32;
            if next() % 2 == 0 {
                let block = (next() % 10_000) as BlockId;
                let got = cache.insert(key, place, block);
                assert_eq!(got, model.get(&(key, place)).copied());
                model.entry((key, place)).or_insert(block);
            } else if let Some(&block) = model.get(&(key, place)) {
                if next() % 4 == 0 {
                    cache.replace(key, place, block + 1);
                    model.insert((key, place), block + 1);
                } else {
                    cache.remove(key, place);
                    model.remove(&(key, place));
                }
            }
            let probe = (key_of(next() % 300), (next() % 40) as u32);
            assert_eq!(cache.get(probe.0, probe.1), model.get(&probe).copied());
            // A run's lookup answers as the places' lookups up to the first miss.
            let (mut run, max_len) = (Vec::new(), (next() % 12) as usize);
            let num_hits = cache.get_run(probe.0, probe.1, max_len, &mut run);
            let want: Vec<BlockId> = (probe.1..probe.1 + max_len as u32)
                .map_while(|place| model.get(&(probe.0, place)).copied())
                .collect();
            assert_eq!((num_hits, run), (want.len(), want));
        }
        for (&(key, place), &block) in &model {
            assert_eq!(cache.get(key, place), Some(block));
        }
        let keys: std::collections::HashSet<_> = model.keys().map(|k| k.0).collect();
        assert_eq!(cache.num_entries(), keys.len());
        let spills = cache
            .entries
            .iter()
            .any(|e| !e.is_empty() && e.shift() == SPILLED);
        assert_eq!(
            spills,
            slab_limit < 1024,
            "entries spill only past the slab's limit"
        );
        cache.clear();
        assert_eq!(cache.num_entries(), 0);
        assert!(model.keys().all(|&(k, p)| cache.get(k, p).is_none()));
    }
}
