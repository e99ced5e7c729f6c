//! The block pool's hash → block map (the prefix cache's index), an open-addressing table
//! made for a replay whose pool is full: there every new block of a prompt evicts a cached
//! one and is cached itself, so the map sees one removal and one insertion per block, and
//! each was a cache miss or two in a general-purpose map.
//!
//! - A slot is one `u64`: 32 bits of the hash (its tag) and the block id + 1 (0: empty).
//!   Block hashes are xxh3 digests, already uniform: the tag also picks the home slot,
//!   linear probing from there, so a slot can be moved without its block's hash. A tag
//!   match is confirmed against the block's own hash, so an answer is always exact.
//! - `block_tags[b]` is the tag of block b's cached hash (0: none), a small array that stays
//!   in cache. Eviction touches no slot: it clears the block's tag, and every slot of that
//!   block with the old tag goes *dead*. Dead slots are dropped when the table is rebuilt,
//!   which happens when live and dead slots fill half of it (amortized O(1): a rebuild
//!   leaves it at most an eighth full), in place unless it grows, and reads only the tags.
//!
//! - A hash may be cached in several blocks, as in vLLM (two requests computed the same
//!   prefix before either was cached). The table holds its first copy, the one lookups
//!   return; `copies` lists every copy of such a hash, oldest first, and when the first is
//!   evicted the next takes its slot. Duplicates are few, so that side map stays small.
//!
//! - Hashes of KV blocks named by trace block ([`content_block`]'s, which carry their
//!   seed and place) are indexed per trace block instead ([`NamedCache`]: one entry per
//!   seed, a slot per place): no slot here, no tag, no rebuilds for them. The counts and
//!   the copies stay here for both kinds. The index takes over once a trace block of more
//!   than one KV block is cached (a named hash of place 1 or more; its slots here move
//!   to it then): where every trace block is one KV block (the built-in job's 16-token
//!   blocks), an entry per trace block is an entry per block, and this table, whose
//!   evictions probe nothing, is the cheaper of the two.
//!
//! Invariant: the first block caching a token hash `h` has a slot on `h`'s probe run (the
//! one answer [`CacheMap::get`] gives for `h`), the first block caching a named hash has
//! its place's slot in the named index, later copies have neither, and `num_live` and
//! `num_named` count the hashes of each kind. What the map answers is exactly what a map
//! with eager removals would answer.
//!
//! [`content_block`]: super::content_block

use rustc_hash::FxHashMap;

use super::block_hash::{BlockHash, MAX_NAMED_PLACES, NamedKey, named_parts};
use super::block_pool::BlockId;
use super::named_cache::NamedCache;

/// A block's cached hash, as the map reads it (the pool's block metadata).
pub(super) trait HashOf {
    fn hash_of(&self, block: BlockId) -> Option<BlockHash>;
}

const MIN_SLOTS: usize = 64;

/// A rebuild leaves the table at most 1/`REBUILT_SPARSITY` full, so that the next comes
/// after (1/2 - 1/`REBUILT_SPARSITY`) of the table in inserts. A replay whose pool is
/// full inserts (and kills) a slot per block: at 4, rebuilds were a tenth of a Mooncake
/// replay (each reads the whole table and re-places every live slot).
const REBUILT_SPARSITY: usize = 8;

#[derive(Debug, Clone)]
pub(super) struct CacheMap {
    slots: Vec<u64>,
    /// The tag of each block's cached hash; 0 when it caches none (tags are never 0).
    block_tags: Vec<u32>,
    /// Slots in use, live or dead.
    num_used: usize,
    /// Token hashes cached (in one block or more): those with a live slot here.
    num_live: usize,
    /// Named hashes cached (in one block or more): those with a slot in `named`.
    num_named: usize,
    /// Blocks caching a hash, copies included.
    num_blocks: usize,
    /// Every block caching a hash cached more than once, in the order they were cached.
    copies: FxHashMap<BlockHash, Vec<BlockId>>,
    /// The first blocks caching named hashes, per trace block.
    named: NamedCache,
    /// Whether named hashes go to `named`.
    naming: Naming,
}

/// Whether a map indexes named hashes per trace block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Naming {
    /// Never: every hash has a slot here, as before the named index (the differential
    /// test's reference, built only by [`CacheMap::per_block`]).
    #[cfg_attr(not(test), allow(dead_code))]
    Never,
    /// Not yet: turned on at the first named hash of a place past 0.
    Pending,
    /// Named hashes go to `named`.
    On,
}

/// Lists `block` as a later copy of `hash`, whose first is `first`.
fn add_copy(
    copies: &mut FxHashMap<BlockHash, Vec<BlockId>>,
    hash: BlockHash,
    first: BlockId,
    block: BlockId,
) {
    copies
        .entry(hash)
        .or_insert_with(|| vec![first])
        .push(block);
}

#[cfg(test)]
thread_local! {
    /// Planted faults for the differential test (`run_pool_tests`): a run of evicted places
    /// leaves its last place in the named index; a run of cached places takes one hash
    /// past its trace block (as a place of it).
    pub(super) static PLANTED_RUN_TAIL_KEPT: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
    pub(super) static PLANTED_RUN_PAST_KEY: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

/// The most evicted blocks [`CacheMap::forget_all`] takes at once.
pub(super) const FORGET_RUN: usize = 16;

fn tag(hash: &BlockHash) -> u64 {
    ((hash.0 >> 96) as u64) | 1
}

fn pack(hash: &BlockHash, block: BlockId) -> u64 {
    (tag(hash) << 32) | (u64::from(block) + 1)
}

fn block_of(slot: u64) -> BlockId {
    ((slot & 0xFFFF_FFFF) - 1) as BlockId
}

impl CacheMap {
    pub(super) fn new(num_blocks: usize) -> crate::Result<Self> {
        let block_tags = super::try_filled_vec(num_blocks, 0, "num_blocks")?;
        Ok(Self::empty(block_tags, Naming::Pending))
    }

    /// A map that gives named hashes a slot per block too (the per-block map before the
    /// named index): the reference of the differential test.
    #[cfg(test)]
    pub(super) fn per_block(num_blocks: usize) -> Self {
        Self::empty(vec![0; num_blocks], Naming::Never)
    }

    /// An empty map over `block_tags` (all zero: no block caches a hash).
    fn empty(block_tags: Vec<u32>, naming: Naming) -> Self {
        Self {
            slots: vec![0; MIN_SLOTS],
            block_tags,
            num_used: 0,
            num_live: 0,
            num_named: 0,
            num_blocks: 0,
            copies: FxHashMap::default(),
            named: NamedCache::default(),
            naming,
        }
    }

    /// `hash`'s seed part and place, if it is a named block's and named blocks are
    /// indexed per trace block.
    #[inline]
    fn named(&self, hash: &BlockHash) -> Option<(super::block_hash::NamedKey, u32)> {
        if self.naming == Naming::On {
            named_parts(hash)
        } else {
            None
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    fn home_of_tag(&self, tag: u64) -> usize {
        // The tag's high bits: its low bit is always set.
        (tag >> 1) as usize & self.mask()
    }

    fn home(&self, hash: &BlockHash) -> usize {
        self.home_of_tag(tag(hash))
    }

    fn is_live(&self, slot: u64) -> bool {
        u64::from(self.block_tags[block_of(slot) as usize]) == slot >> 32
    }

    /// Whether named hashes are indexed per trace block (the run operations apply).
    #[inline]
    pub(super) fn names_blocks(&self) -> bool {
        self.naming == Naming::On
    }

    /// Hashes cached, each counted once.
    pub(super) fn num_hashes(&self) -> usize {
        self.num_live + self.num_named
    }

    /// Blocks caching a hash, copies included.
    pub(super) fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// The blocks caching `hash` after the first (the one [`Self::get`] answers), oldest
    /// first.
    pub(super) fn later_copies(&self, hash: &BlockHash) -> &[BlockId] {
        self.copies.get(hash).map_or(&[], |copies| &copies[1..])
    }

    /// The first block caching `hash`, if any.
    pub(super) fn get(&self, hash: &BlockHash, blocks: &(impl HashOf + ?Sized)) -> Option<BlockId> {
        if let Some((key, place)) = self.named(hash) {
            return self.named.get(key, place);
        }
        let mask = self.mask();
        let want = tag(hash);
        let mut i = self.home(hash);
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                return None;
            }
            if slot >> 32 == want && self.is_live(slot) {
                let block = block_of(slot);
                if blocks.hash_of(block) == Some(*hash) {
                    return Some(block);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// The first blocks caching the leading run of `hashes` that name consecutive places
    /// of one trace block, pushed onto `out` up to the first one not cached ([`Self::get`]
    /// of each, with one probe of the named index); returns how many, or `None` when
    /// `hashes[0]` is not named or the index is off.
    pub(super) fn get_named_run(
        &self,
        hashes: &[BlockHash],
        out: &mut Vec<BlockId>,
    ) -> Option<usize> {
        let (key, first_place, len, _) = self.named_run(hashes, usize::MAX)?;
        Some(self.named.get_run(key, first_place, len, out))
    }

    /// The trace block and first place of `hashes[0]` (`None`: not named, or the index is
    /// off), how many of the leading `hashes` (at most `cap`) name its consecutive places,
    /// and how many could (the cap and the places left).
    fn named_run(&self, hashes: &[BlockHash], cap: usize) -> Option<(NamedKey, u32, usize, usize)> {
        let (key, first_place) = hashes.first().and_then(|h| self.named(h))?;
        // Places `first_place + k` of one seed are the hash plus `k` (`content_block`).
        let max_len = ((MAX_NAMED_PLACES - first_place) as usize).min(cap);
        let len = (hashes.iter().zip(0..).take(max_len))
            .take_while(|&(h, k)| h.0 == hashes[0].0 + k)
            .count();
        Some((key, first_place, len, max_len))
    }

    /// Reads the home slots of `hashes` ahead of their inserts or lookups: independent
    /// loads that the CPU overlaps, where the probes one by one would wait for each miss.
    /// A named hash's entry is read once for the run of its trace block's hashes.
    pub(super) fn warm(&self, hashes: &[BlockHash]) {
        let mut last = None;
        let mut acc = 0u64;
        for hash in hashes {
            match self.named(hash) {
                Some((key, _)) if last == Some(key) => {}
                Some((key, _)) => {
                    last = Some(key);
                    acc ^= self.named.home_word(key);
                }
                None => acc ^= self.slots[self.home(hash)],
            }
        }
        std::hint::black_box(acc);
    }

    /// Registers `block` (which the caller then gives `hash`) as caching `hash`: the
    /// first, or a later copy when another block already caches it.
    pub(super) fn insert(
        &mut self,
        hash: BlockHash,
        block: BlockId,
        blocks: &(impl HashOf + ?Sized),
    ) {
        self.num_blocks += 1;
        // The first named hash past place 0 turns the index on.
        if self.naming == Naming::Pending && named_parts(&hash).is_some_and(|(_, place)| place > 0)
        {
            self.name_blocks_now(blocks);
        }
        if let Some((key, place)) = self.named(&hash) {
            match self.named.insert(key, place, block) {
                None => self.num_named += 1,
                Some(first) => self.add_copy(hash, first, block),
            }
            return;
        }
        match self.get(&hash, blocks) {
            None => {
                self.occupy(&hash, block);
                self.num_live += 1;
            }
            Some(first) => self.add_copy(hash, first, block),
        }
    }

    /// Registers the leading run of `hashes` that name consecutive places of one trace
    /// block as cached by the blocks of `ids` (the same length), with one probe of the
    /// named index for the run, in the order [`Self::insert`] would; returns how many it
    /// took: 0 when `hashes[0]` is not named or the index is off (then `insert` takes
    /// it). The caller then gives each block its hash.
    pub(super) fn insert_named_run(&mut self, hashes: &[BlockHash], ids: &[BlockId]) -> usize {
        let Some((key, first_place, len, _max_len)) = self.named_run(hashes, ids.len()) else {
            return 0;
        };
        #[cfg(test)]
        let len = match PLANTED_RUN_PAST_KEY.get() && len < _max_len {
            true => len + 1,
            false => len,
        };
        let Self { named, copies, .. } = self;
        let mut num_copies = 0;
        named.insert_run(key, first_place, &ids[..len], |k, first| {
            add_copy(copies, hashes[k], first, ids[k]);
            num_copies += 1;
        });
        self.num_blocks += len;
        self.num_named += len - num_copies;
        len
    }

    /// [`Self::forget`] of each `(block, hash)` of `evicted` (at most [`FORGET_RUN`]), in
    /// order: a run of one trace block's named places, none of them copied, is removed
    /// from the named index with one probe (a freed request's blocks are evicted together,
    /// tail first).
    pub(super) fn forget_all(&mut self, evicted: &[(BlockId, BlockHash)]) {
        debug_assert!(evicted.len() <= FORGET_RUN);
        let mut places = [0u32; FORGET_RUN];
        // The run's key and named mark (a named hash's bits 16..128) and its places.
        let mut run: Option<(NamedKey, u128)> = None;
        let mut num_places = 0;
        for &(block, hash) in evicted {
            if let Some((_, bits)) = run
                && hash.0 >> 16 == bits
                && (hash.0 as u16 as u32) < MAX_NAMED_PLACES
                && !self.is_copied(&hash)
            {
                places[num_places] = hash.0 as u16 as u32;
                num_places += 1;
                continue;
            }
            if let Some((key, _)) = run.take() {
                self.forget_places(key, &places[..num_places]);
                num_places = 0;
            }
            match self.named(&hash) {
                Some((key, place)) if !self.is_copied(&hash) => {
                    run = Some((key, hash.0 >> 16));
                    places[0] = place;
                    num_places = 1;
                }
                _ => self.forget(block, &hash),
            }
        }
        if let Some((key, _)) = run {
            self.forget_places(key, &places[..num_places]);
        }
    }

    /// Whether more than one block caches `hash` (most pools never hold a copy: then no
    /// lookup).
    fn is_copied(&self, hash: &BlockHash) -> bool {
        !self.copies.is_empty() && self.copies.contains_key(hash)
    }

    /// Forgets `places` of `key`, each cached by one block, none copied.
    fn forget_places(&mut self, key: NamedKey, places: &[u32]) {
        #[cfg(test)]
        let places = match PLANTED_RUN_TAIL_KEPT.get() {
            true => &places[..places.len() - 1],
            false => places,
        };
        self.named.remove_run(key, places);
        self.num_named -= places.len();
        self.num_blocks -= places.len();
    }

    /// Turns the named index on, moving the named hashes cached so far (their first
    /// blocks' slots) into it.
    #[cold]
    fn name_blocks_now(&mut self, blocks: &(impl HashOf + ?Sized)) {
        let mut moving: Vec<(BlockId, BlockHash)> = (self.slots.iter())
            .filter(|&&slot| slot != 0 && self.is_live(slot))
            .filter_map(|&slot| {
                let block = block_of(slot);
                let hash = blocks.hash_of(block)?;
                named_parts(&hash)?;
                // A slot that only looks live (its block now caches another hash with the
                // same tag, maybe as a later copy) moves nothing: the first block is asked.
                (self.get(&hash, blocks) == Some(block)).then_some((block, hash))
            })
            .collect();
        moving.sort_unstable_by_key(|&(block, _)| block);
        moving.dedup_by_key(|&mut (block, _)| block);
        self.naming = Naming::On;
        for (block, hash) in moving {
            let (key, place) = named_parts(&hash).expect("kept named hashes only");
            let first = self.named.insert(key, place, block);
            debug_assert!(first.is_none(), "one first block per hash");
            // Its slot here goes dead.
            self.block_tags[block as usize] = 0;
            self.num_live -= 1;
            self.num_named += 1;
        }
    }

    /// Lists `block` as a later copy of `hash`, whose first is `first`.
    fn add_copy(&mut self, hash: BlockHash, first: BlockId, block: BlockId) {
        add_copy(&mut self.copies, hash, first, block);
    }

    /// Gives `block` the slot of `hash`, whose only live slot it will be.
    fn occupy(&mut self, hash: &BlockHash, block: BlockId) {
        self.make_room();
        self.place_live(hash, block);
    }

    /// Rebuilds the table if one more slot would fill half of it.
    fn make_room(&mut self) {
        if (self.num_used + 1) * 2 > self.slots.len() {
            self.rebuild();
        }
    }

    /// Places `block`'s slot for `hash` (room was made).
    fn place_live(&mut self, hash: &BlockHash, block: BlockId) {
        let slot = pack(hash, block);
        self.place(slot);
        self.block_tags[block as usize] = (slot >> 32) as u32;
    }

    /// Writes `slot` at the first empty slot of its tag's probe run.
    fn place(&mut self, slot: u64) {
        let mask = self.mask();
        let mut i = self.home_of_tag(slot >> 32);
        while self.slots[i] != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = slot;
        self.num_used += 1;
    }

    /// `block`, which cached `hash`, was evicted (its hash cleared by the caller): its slot,
    /// if it has one, is dead, and the next copy of `hash`, if any, takes over.
    pub(super) fn forget(&mut self, block: BlockId, hash: &BlockHash) {
        self.num_blocks -= 1;
        // The common case costs no lookup: most pools never hold a copy.
        if !self.copies.is_empty()
            && let Some(copies) = self.copies.get_mut(hash)
        {
            let at = copies
                .iter()
                .position(|&b| b == block)
                .expect("a copy of a hash is listed under it");
            copies.remove(at);
            let next = copies[0];
            if copies.len() == 1 {
                self.copies.remove(hash);
            }
            if at == 0 {
                if let Some((key, place)) = self.named(hash) {
                    self.named.replace(key, place, next);
                    return;
                }
                // Room first, while the hash still has its live slot (a rebuild keeps it).
                self.make_room();
                self.block_tags[block as usize] = 0;
                self.place_live(hash, next);
            }
            return;
        }
        match self.named(hash) {
            Some((key, place)) => {
                self.named.remove(key, place);
                self.num_named -= 1;
            }
            None => {
                self.block_tags[block as usize] = 0;
                self.num_live -= 1;
            }
        }
    }

    pub(super) fn clear(&mut self) {
        // In place: the per-block tags keep their allocation (a reset never allocates).
        let mut block_tags = std::mem::take(&mut self.block_tags);
        block_tags.fill(0);
        let mut named = std::mem::take(&mut self.named);
        named.clear();
        // The index stays on: the pool's trace blocks keep their size.
        *self = Self {
            named,
            ..Self::empty(block_tags, self.naming)
        };
    }

    /// Drops the dead slots, leaving the table at most 1/`REBUILT_SPARSITY` full (grown
    /// into a fresh table if need be, else swept in place). A dead slot whose block caches
    /// another hash with the same tag looks live and is kept: it says what that hash's own
    /// slot says, on the same probe run.
    fn rebuild(&mut self) {
        let mut len = self.slots.len();
        while (self.num_live + 1) * REBUILT_SPARSITY > len {
            len *= 2;
        }
        if len == self.slots.len() {
            self.sweep();
            debug_assert!(self.num_used >= self.num_live);
            return;
        }
        let old = std::mem::replace(&mut self.slots, vec![0; len]);
        self.num_used = 0;
        for &slot in old.iter().filter(|&&s| s != 0) {
            if self.is_live(slot) {
                self.place(slot);
            }
        }
        debug_assert!(self.num_used >= self.num_live);
    }

    /// Re-places every slot in one pass from an empty slot around the table, dead ones
    /// dropped: a slot's probe run from its home holds no empty slot, so its home lies
    /// between that empty slot and it, where every slot is already re-placed, and it lands
    /// at or before where it was. No second table: a replay's pool rebuilds its map
    /// hundreds of times, and a spare table was as big as the map.
    fn sweep(&mut self) {
        let mask = self.mask();
        let start = (self.slots.iter().position(|&s| s == 0))
            .expect("the table is never more than half full");
        self.num_used = 0;
        for k in 1..=self.slots.len() {
            let i = (start + k) & mask;
            let slot = std::mem::take(&mut self.slots[i]);
            if slot != 0 && self.is_live(slot) {
                self.place(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Each block's hash, as the pool keeps it.
    struct Hashes(Vec<Option<BlockHash>>);

    impl HashOf for Hashes {
        fn hash_of(&self, block: BlockId) -> Option<BlockHash> {
            self.0[block as usize]
        }
    }

    /// Random inserts (of `hash_at(step, n)`) and evictions on `map`, checked after each
    /// against vLLM's dict of copies.
    fn check_against_an_eager_map(map: &mut CacheMap, hash_at: impl Fn(usize, u64) -> BlockHash) {
        const NUM_BLOCKS: usize = 40;
        let mut blocks = Hashes(vec![None; NUM_BLOCKS]);
        // Every block caching each hash, oldest first (vLLM's dict of copies).
        let mut eager: HashMap<BlockHash, Vec<BlockId>> = HashMap::new();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for step in 0..20_000 {
            let block = (next() % NUM_BLOCKS as u64) as BlockId;
            let hash = hash_at(step, next());
            if let Some(old) = blocks.0[block as usize].take() {
                // Evict, as `take_free_block` does.
                let copies = eager.get_mut(&old).unwrap();
                copies.retain(|&b| b != block);
                if copies.is_empty() {
                    eager.remove(&old);
                }
                map.forget(block, &old);
            } else {
                map.insert(hash, block, &blocks);
                blocks.0[block as usize] = Some(hash);
                eager.entry(hash).or_default().push(block);
            }
            assert_eq!(map.num_hashes(), eager.len());
            let num_blocks: usize = eager.values().map(Vec::len).sum();
            assert_eq!(map.num_blocks(), num_blocks);
            let probe = hash_at(step, next());
            let want = eager.get(&probe);
            assert_eq!(map.get(&probe, &blocks), want.map(|c| c[0]), "step {step}");
            assert_eq!(map.later_copies(&probe), want.map_or(&[][..], |c| &c[1..]));
        }
        for (hash, copies) in &eager {
            assert_eq!(map.get(hash, &blocks), Some(copies[0]));
        }
        map.clear();
        assert_eq!(map.num_hashes(), 0);
        assert_eq!(map.num_blocks(), 0);
        assert!(eager.keys().all(|h| map.get(h, &blocks).is_none()));
    }

    #[test]
    fn answers_as_an_eager_map_through_copies_evictions_rebuilds_and_tag_collisions() {
        // Few distinct top bits: many hashes share a tag (and so a home slot); few hashes
        // overall, so many are cached in several blocks.
        let hash_of = |_, n: u64| BlockHash((u128::from(n % 5) << 96) | u128::from(n % 31));
        check_against_an_eager_map(&mut CacheMap::new(40).unwrap(), hash_of);
    }

    #[test]
    fn named_hashes_answer_as_an_eager_map_before_and_after_the_named_index_takes_over() {
        use super::super::block_hash::{content_block, hash_content};
        let seeds: Vec<BlockHash> = (0..6).map(|id| hash_content(None, id, None)).collect();
        // Token hashes beside trace blocks' names; only place 0 for the first 3,000 steps
        // (the named index off, named hashes slotted here), then places up to 5: the
        // switch moves the cached ones into the index.
        let hash_at = |step: usize, n: u64| match n % 3 {
            0 => BlockHash((u128::from(n % 5) << 96) | u128::from(n % 31)),
            _ => {
                let places = if step < 3_000 { 1 } else { 6 };
                content_block(seeds[(n / 3 % 6) as usize], (n / 18 % places) as u32)
            }
        };
        let mut map = CacheMap::new(40).unwrap();
        check_against_an_eager_map(&mut map, hash_at);
        assert_eq!(map.naming, Naming::On);
        // The per-block reference answers the same.
        check_against_an_eager_map(&mut CacheMap::per_block(40), hash_at);
    }
}
