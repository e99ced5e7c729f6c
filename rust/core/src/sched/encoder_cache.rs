//! The encoder cache (vLLM 0.33's `EncoderCacheManager`, `v1/core/encoder_cache_manager.py`):
//! the bookkeeping of the multimodal encoder outputs held for the decoder, measured in
//! encoder embeddings. An entry is keyed by its item's identifier (vLLM's `mm_hash`) and
//! shared by every request whose item has that identifier; an entry no request references
//! is *freeable*: it stays (a later request may hit it) until an allocation needs its room,
//! oldest first, and the evicted identifiers are reported once (`take_freed`).
//!
//! Invariants (`check`): `num_free_slots <= num_freeable_slots <= cache_size`; the entries
//! hold `cache_size - num_free_slots` embeddings; the freeable ones, exactly the entries no
//! request references, hold `num_freeable_slots - num_free_slots`.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;

use rustc_hash::{FxHashMap, FxHashSet};

pub struct EncoderCache<K> {
    cache_size: usize,
    num_free_slots: usize,
    num_freeable_slots: usize,
    /// Identifier -> the requests referencing its entry (empty: freeable).
    cached: FxHashMap<String, FxHashSet<K>>,
    /// Identifier -> embeddings its entry holds.
    num_embeds_by_hash: FxHashMap<String, usize>,
    /// Request -> its input ids (indices into its items) the cache holds for it, ascending
    /// (the order vLLM's `set` of small ints iterates in).
    request_cached_ids: FxHashMap<K, BTreeSet<usize>>,
    /// Request -> identifier -> how many of its cached input ids have it (an item repeated
    /// in one request holds one reference until its last occurrence is freed).
    request_hash_refs: FxHashMap<K, FxHashMap<String, usize>>,
    /// The freeable entries in the order they became freeable (vLLM's `OrderedDict`):
    /// sequence number -> identifier, and identifier -> (sequence number, embeddings).
    freeable_order: BTreeMap<u64, String>,
    freeable: FxHashMap<String, (u64, usize)>,
    next_seq: u64,
    /// Identifiers evicted since the last `take_freed`.
    freed: Vec<String>,
}

impl<K: Hash + Eq + Clone> EncoderCache<K> {
    pub fn new(cache_size: usize) -> Self {
        Self {
            cache_size,
            num_free_slots: cache_size,
            num_freeable_slots: cache_size,
            cached: FxHashMap::default(),
            num_embeds_by_hash: FxHashMap::default(),
            request_cached_ids: FxHashMap::default(),
            request_hash_refs: FxHashMap::default(),
            freeable_order: BTreeMap::new(),
            freeable: FxHashMap::default(),
            next_seq: 0,
            freed: Vec::new(),
        }
    }

    pub fn cache_size(&self) -> usize {
        self.cache_size
    }

    /// Embeddings not held by any entry.
    pub fn num_free_slots(&self) -> usize {
        self.num_free_slots
    }

    /// Free embeddings plus those of the freeable entries.
    pub fn num_freeable_slots(&self) -> usize {
        self.num_freeable_slots
    }

    /// Whether an entry for `mm_hash` is held (referenced or freeable).
    pub fn contains(&self, mm_hash: &str) -> bool {
        self.cached.contains_key(mm_hash)
    }

    /// The embeddings held for `mm_hash`, if an entry is.
    pub fn cached_num_embeds(&self, mm_hash: &str) -> Option<usize> {
        self.num_embeds_by_hash.get(mm_hash).copied()
    }

    /// Requests referencing the entry of `mm_hash` (0 for a freeable or absent one).
    pub fn num_refs(&self, mm_hash: &str) -> usize {
        self.cached.get(mm_hash).map_or(0, FxHashSet::len)
    }

    /// The held entries' identifiers (any order).
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.cached.keys().map(String::as_str)
    }

    /// The requests referencing the entry of `mm_hash` (any order; none for a freeable or
    /// absent one).
    pub fn referencing(&self, mm_hash: &str) -> Vec<&K> {
        self.cached
            .get(mm_hash)
            .map_or_else(Vec::new, |refs| refs.iter().collect())
    }

    /// Identifiers evicted since the last `take_freed` (vLLM's `freed`), oldest first.
    pub fn freed(&self) -> &[String] {
        &self.freed
    }

    /// The freeable entries' identifiers, oldest first (the eviction order).
    pub fn freeable_ids(&self) -> Vec<&str> {
        self.freeable_order.values().map(String::as_str).collect()
    }

    /// vLLM's `check_and_update_cache`: whether the entry of `mm_hash` is held; if so,
    /// `request` references it (taking it off the freeable list).
    pub fn check_and_update_cache(&mut self, request: &K, input_id: usize, mm_hash: &str) -> bool {
        let Some(refs) = self.cached.get_mut(mm_hash) else {
            return false;
        };
        if refs.is_empty() {
            let (seq, num_embeds) = self
                .freeable
                .remove(mm_hash)
                .expect("unreferenced is freeable");
            self.freeable_order.remove(&seq);
            self.num_freeable_slots -= num_embeds;
        }
        refs.insert(request.clone());
        self.add_cached_input_id(request, input_id, mm_hash);
        true
    }

    /// vLLM's `can_allocate`: whether `num_embeds` more embeddings (after
    /// `num_embeds_to_schedule` already promised this step) fit under the encoder compute
    /// `budget` and in the cache, evicting freeable entries (oldest first) if needed.
    pub fn can_allocate(
        &mut self,
        num_embeds: usize,
        budget: usize,
        num_embeds_to_schedule: usize,
    ) -> bool {
        if num_embeds > budget {
            return false;
        }
        let needed = num_embeds + num_embeds_to_schedule;
        if needed <= self.num_free_slots {
            return true;
        }
        if needed > self.num_freeable_slots {
            return false;
        }
        while needed > self.num_free_slots {
            let (_, mm_hash) = self
                .freeable_order
                .pop_first()
                .expect("freeable room implies a freeable entry");
            let (_, num_free_embeds) = self.freeable.remove(&mm_hash).expect("listed");
            self.cached.remove(&mm_hash);
            self.num_embeds_by_hash.remove(&mm_hash);
            self.num_free_slots += num_free_embeds;
            self.freed.push(mm_hash);
        }
        true
    }

    /// vLLM's `allocate`: room for the entry of `mm_hash` (`num_embeds` embeddings),
    /// referenced by `request`. `can_allocate` said yes for it.
    pub fn allocate(&mut self, request: &K, input_id: usize, mm_hash: &str, num_embeds: usize) {
        let refs = self.cached.entry(mm_hash.to_owned()).or_default();
        debug_assert!(refs.is_empty() || !self.freeable.contains_key(mm_hash));
        refs.insert(request.clone());
        let held = *self
            .num_embeds_by_hash
            .entry(mm_hash.to_owned())
            .or_insert(num_embeds);
        debug_assert_eq!(
            held, num_embeds,
            "the scheduler rejects mismatched identifiers"
        );
        debug_assert!(self.num_free_slots >= num_embeds && self.num_freeable_slots >= num_embeds);
        self.add_cached_input_id(request, input_id, mm_hash);
        self.num_free_slots -= num_embeds;
        self.num_freeable_slots -= num_embeds;
    }

    fn add_cached_input_id(&mut self, request: &K, input_id: usize, mm_hash: &str) {
        let ids = self.request_cached_ids.entry(request.clone()).or_default();
        if !ids.insert(input_id) {
            return;
        }
        *self
            .request_hash_refs
            .entry(request.clone())
            .or_default()
            .entry(mm_hash.to_owned())
            .or_insert(0) += 1;
    }

    /// The input ids the cache holds for `request`, ascending.
    pub fn cached_input_ids(&self, request: &K) -> Vec<usize> {
        self.request_cached_ids
            .get(request)
            .map_or_else(Vec::new, |ids| ids.iter().copied().collect())
    }

    /// Whether any request holds a reference (the scheduler's cheap test before a pass).
    pub fn has_requests(&self) -> bool {
        !self.request_cached_ids.is_empty()
    }

    /// vLLM's `free_encoder_input`: `request` lets go of its input `input_id` (item
    /// `mm_hash`); the entry becomes freeable when no request references it any more.
    pub fn free_encoder_input(&mut self, request: &K, input_id: usize, mm_hash: &str) {
        if let Some(ids) = self.request_cached_ids.get_mut(request)
            && ids.remove(&input_id)
        {
            let refs = self.request_hash_refs.get_mut(request).expect("paired");
            // A caller naming another identifier than the input's (the standalone cache's
            // misuse; vLLM raises KeyError) changes no count.
            if let Some(count) = refs.get_mut(mm_hash) {
                *count -= 1;
                if *count == 0 {
                    refs.remove(mm_hash);
                }
            }
            if ids.is_empty() {
                self.request_cached_ids.remove(request);
                self.request_hash_refs.remove(request);
            }
        }
        let Some(refs) = self.cached.get_mut(mm_hash) else {
            return;
        };
        if refs.is_empty() {
            return;
        }
        // One reference per request covers every occurrence of a repeated item.
        if self
            .request_hash_refs
            .get(request)
            .is_some_and(|r| r.contains_key(mm_hash))
        {
            return;
        }
        refs.remove(request);
        if refs.is_empty() {
            let num_embeds = self.num_embeds_by_hash[mm_hash];
            let seq = self.next_seq;
            self.next_seq += 1;
            self.freeable_order.insert(seq, mm_hash.to_owned());
            self.freeable.insert(mm_hash.to_owned(), (seq, num_embeds));
            self.num_freeable_slots += num_embeds;
        }
    }

    /// vLLM's `free`: every input of `request` (`hash_of(input_id)` names its item).
    pub fn free(&mut self, request: &K, hash_of: impl Fn(usize) -> String) {
        for input_id in self.cached_input_ids(request) {
            self.free_encoder_input(request, input_id, &hash_of(input_id));
        }
    }

    /// Reports `freed` (identifiers of a cache this one replaces) with the next `take_freed`.
    pub fn report_freed(&mut self, freed: Vec<String>) {
        self.freed.extend(freed);
    }

    /// vLLM's `get_freed_mm_hashes`: the identifiers evicted since the last call, less those
    /// allocated again since (the worker keeps that tensor).
    pub fn take_freed(&mut self) -> Vec<String> {
        let freed = std::mem::take(&mut self.freed);
        freed
            .into_iter()
            .filter(|h| !self.cached.contains_key(h))
            .collect()
    }

    /// The invariants in the module docs; `Err` names the first that fails.
    pub fn check(&self) -> Result<(), String> {
        if !(self.num_free_slots <= self.num_freeable_slots
            && self.num_freeable_slots <= self.cache_size)
        {
            return Err(format!(
                "free {} <= freeable {} <= size {} fails",
                self.num_free_slots, self.num_freeable_slots, self.cache_size
            ));
        }
        let held: usize = self.num_embeds_by_hash.values().sum();
        if held != self.cache_size - self.num_free_slots {
            return Err(format!(
                "entries hold {held}, but {} slots are taken",
                self.cache_size - self.num_free_slots
            ));
        }
        let unreferenced: usize = self
            .cached
            .iter()
            .filter(|(_, refs)| refs.is_empty())
            .map(|(h, _)| self.num_embeds_by_hash[h])
            .sum();
        let listed: usize = self.freeable.values().map(|&(_, n)| n).sum();
        if unreferenced != listed || listed != self.num_freeable_slots - self.num_free_slots {
            return Err(format!(
                "unreferenced entries hold {unreferenced}, the freeable list {listed}, the \
                 counters {}",
                self.num_freeable_slots - self.num_free_slots
            ));
        }
        if self.freeable.len() != self.freeable_order.len()
            || self.freeable.keys().any(|h| !self.cached.contains_key(h))
        {
            return Err("the freeable list names entries not held".into());
        }
        Ok(())
    }
}
