//! What happens to one block of the [`BlockPool`](super::BlockPool): its record, and the
//! per-block steps of allocation, release, hashing and caching, as free functions over the
//! pool's parts (so a caller can hold a request's entry while they run). These run for every
//! block of every replayed prompt: their costs are the replay's (see benches/RESULTS.md).
//! The [`KvCoordinator`](super::KvCoordinator) runs the same steps over the same parts, and
//! both check the parts' invariants here (`check_pool_blocks`).

use super::TokenId;
use super::block_hash::{BlockHash, hash_block};
use super::block_pool::{BlockId, BlockPoolStats, KvEvent, RequestBlocks};
use super::cache_map::{CacheMap, FORGET_RUN, HashOf};
use super::free_queue::FreeQueue;
use super::host_tier::HostTier;
use super::lookahead::PrefixRules;

/// 24 bytes, not the 48 of a `u32` beside an `Option<u128>` (aligned to 16): a pool that
/// evicts on every allocation reads one of these per block, mostly from outside the cache.
#[derive(Debug, Clone, Default)]
pub(super) struct BlockMeta {
    /// The cached hash's halves (meaningful while `cached`).
    pub(super) hash: [u64; 2],
    pub(super) ref_cnt: u32,
    /// Set while the block is registered in the prefix cache.
    pub(super) cached: bool,
}

impl BlockMeta {
    pub(super) fn hash(&self) -> Option<BlockHash> {
        self.cached
            .then(|| BlockHash(u128::from(self.hash[0]) | (u128::from(self.hash[1]) << 64)))
    }

    pub(super) fn set_hash(&mut self, hash: BlockHash) {
        self.hash = [hash.0 as u64, (hash.0 >> 64) as u64];
        self.cached = true;
    }

    pub(super) fn take_hash(&mut self) -> Option<BlockHash> {
        let hash = self.hash();
        self.cached = false;
        hash
    }
}

impl HashOf for [BlockMeta] {
    fn hash_of(&self, block: BlockId) -> Option<BlockHash> {
        self[block as usize].hash()
    }
}

/// Where a reused block's cached hash goes: out of the cache map, into the events and the
/// host tier. The pool's parts, borrowed apart from the request's entry.
pub(super) struct Eviction<'a> {
    pub(super) cached: &'a mut CacheMap,
    pub(super) events: &'a mut Option<Vec<KvEvent>>,
    pub(super) host: &'a mut Option<HostTier>,
    pub(super) stats: &'a mut BlockPoolStats,
    /// The coordinator's partial entries beside blocks' hashes, where it records them.
    pub(super) secondary: Option<&'a mut SecondaryHashes>,
}

/// The partial prefix entries registered on blocks beside their cached hash (vLLM 0.33's
/// `BlockPool.cached_block_hashes_by_block`), kept only for the KV cache events: no lookup
/// reads them here, and they leave with the block's hash, each with a `Removed` event after
/// the block's (`_remove_cached_block_hashes`).
pub(super) type SecondaryHashes = rustc_hash::FxHashMap<BlockId, Vec<BlockHash>>;

/// The `Removed` events of `block`'s partial entries, which leave with its hash.
pub(super) fn remove_secondary(
    secondary: &mut SecondaryHashes,
    events: &mut Option<Vec<KvEvent>>,
    block: BlockId,
) {
    if let (Some(hashes), Some(events)) = (secondary.remove(&block), events) {
        events.extend(hashes.into_iter().map(KvEvent::Removed));
    }
}

/// Pops the least recently freed block, evicting its cached prefix if it had one. A free
/// function over the pool's parts, so the caller can hold the request's entry meanwhile.
pub(super) fn take_free_block(
    free_queue: &mut impl FreeQueue,
    blocks: &mut [BlockMeta],
    eviction: &mut Eviction<'_>,
) -> BlockId {
    let block = free_queue
        .pop_front()
        .expect("allocation was checked against the free count");
    evict_taken(block, blocks, eviction);
    block
}

/// Takes `n` blocks from the front of the free queue onto `out` ([`take_free_block`] `n`
/// times, with the same evictions in the same order). The ids are taken first, then
/// evicted a run at a time with their records read ahead together: a queue of runs hands
/// out ids without reading the blocks, so their records' misses overlap. The run's hashes
/// leave the cache map together ([`CacheMap::forget_all`]: one probe of the named index
/// per trace block's run of places, where a freed request's blocks come back in order).
pub(super) fn take_free_blocks(
    free_queue: &mut impl FreeQueue,
    blocks: &mut [BlockMeta],
    eviction: &mut Eviction<'_>,
    n: usize,
    out: &mut Vec<BlockId>,
) {
    let first = out.len();
    free_queue.pop_front_into(n, out);
    if !eviction.cached.names_blocks() {
        // No runs to take (every hash has its own slot): one block at a time.
        for run in out[first..].chunks(WARM_RUN) {
            let acc = (run.iter()).fold(0u32, |acc, &b| acc ^ blocks[b as usize].ref_cnt);
            std::hint::black_box(acc);
            for &block in run {
                evict_taken(block, blocks, eviction);
            }
        }
        return;
    }
    let mut evicted = [(0, BlockHash(0)); FORGET_RUN];
    for run in out[first..].chunks(WARM_RUN.min(FORGET_RUN)) {
        let acc = (run.iter()).fold(0u32, |acc, &b| acc ^ blocks[b as usize].ref_cnt);
        std::hint::black_box(acc);
        let mut num_evicted = 0;
        for &block in run {
            let meta = &mut blocks[block as usize];
            meta.ref_cnt = 1;
            if let Some(hash) = meta.take_hash() {
                evicted[num_evicted] = (block, hash);
                num_evicted += 1;
            }
        }
        let evicted = &evicted[..num_evicted];
        eviction.cached.forget_all(evicted);
        if eviction.events.is_some() || eviction.host.is_some() {
            for &(block, hash) in evicted {
                evicted_elsewhere(eviction, block, hash);
            }
        }
    }
}

/// What else an evicted hash leaves: a `Removed` event, and the host tier gets it.
fn evicted_elsewhere(eviction: &mut Eviction<'_>, block: BlockId, hash: BlockHash) {
    if let Some(events) = eviction.events {
        events.push(KvEvent::Removed(hash));
        if let Some(secondary) = eviction.secondary.as_deref_mut() {
            remove_secondary(secondary, eviction.events, block);
        }
    }
    // The only cost of the tier to a pool without one: this branch, on evictions only.
    if let Some(host) = eviction.host {
        offload(host, eviction.events, eviction.stats, hash);
    }
}

/// Gives a block just taken from the free queue its holder, evicting its cached hash.
fn evict_taken(block: BlockId, blocks: &mut [BlockMeta], eviction: &mut Eviction<'_>) {
    let meta = &mut blocks[block as usize];
    meta.ref_cnt = 1;
    if let Some(hash) = meta.take_hash() {
        // The map's entry goes stale with the block's hash (no probe: `cache_map`).
        eviction.cached.forget(block, &hash);
        evicted_elsewhere(eviction, block, hash);
    }
}

/// vLLM's `BlockPool.free_blocks`: drops one reference on each block of `ordered` (first
/// evicted first). A block left unheld goes to the free queue: a cached one to the back
/// (LRU), an uncached one to the front (reused first), in `ordered`'s order. `evict_first`
/// is scratch space, left empty.
pub(super) fn release_blocks(
    free_queue: &mut impl FreeQueue,
    blocks: &mut [BlockMeta],
    ordered: impl IntoIterator<Item = BlockId>,
    evict_first: &mut Vec<BlockId>,
) {
    // Cached blocks join the back a run at a time (the queue stamps a run at once).
    let mut evict_last = [0; RELEASE_RUN];
    let mut num_last = 0;
    for block in ordered {
        let meta = &mut blocks[block as usize];
        debug_assert!(meta.ref_cnt > 0, "block {block} freed with ref count 0");
        meta.ref_cnt -= 1;
        if meta.ref_cnt > 0 {
            continue;
        }
        if meta.cached {
            if num_last == RELEASE_RUN {
                free_queue.push_back_run(&evict_last);
                num_last = 0;
            }
            evict_last[num_last] = block;
            num_last += 1;
        } else {
            evict_first.push(block);
        }
    }
    free_queue.push_back_run(&evict_last[..num_last]);
    // Prepending in reverse keeps `evict_first` in order at the front (the back's pushes
    // and the front's do not interleave in the queue's order).
    for &block in evict_first.iter().rev() {
        free_queue.push_front(block);
    }
    evict_first.clear();
}

/// The most cached blocks [`release_blocks`] pushes to the back at once.
const RELEASE_RUN: usize = 64;

/// Writes an evicted block's hash back to the host tier (write-back on eviction). When the
/// tier is full its least recent hash leaves first; a hash already held is only refreshed.
fn offload(
    host: &mut HostTier,
    events: &mut Option<Vec<KvEvent>>,
    stats: &mut BlockPoolStats,
    hash: BlockHash,
) {
    let num_held = host.len();
    let dropped = host.offload(hash);
    if dropped.is_none() && host.len() == num_held {
        return;
    }
    stats.num_offloaded_blocks += 1;
    if let Some(events) = events {
        events.extend(dropped.map(KvEvent::HostRemoved));
        events.push(KvEvent::HostStored(hash));
    }
}

/// Records `new_token_ids` and hashes every block they complete. Hashes that arrived
/// with a prefix hit already cover the request's first tokens and are not recomputed.
pub(super) fn append_tokens(
    block_size: usize,
    enable_caching: bool,
    hash_lookahead: usize,
    request: &mut RequestBlocks,
    new_token_ids: &[TokenId],
) {
    let first_new = request.num_tokens;
    request.num_tokens += new_token_ids.len();
    if !enable_caching {
        return;
    }
    if hash_lookahead > 0 {
        return super::lookahead::append_tokens(block_size, hash_lookahead, request, new_token_ids);
    }
    let bs = block_size;
    let num_hashed = request.block_hashes.len() * bs + request.tail_tokens.len();
    // A decode step's one token, all before it hashed, into a tail it does not fill: what
    // the general path below does then, without its bookkeeping (every running request
    // takes this path 15 steps in 16).
    if let [token] = new_token_ids
        && num_hashed == first_new
        && request.tail_tokens.len() + 1 < bs
    {
        request.tail_tokens.push(*token);
        return;
    }
    let skip = num_hashed
        .saturating_sub(first_new)
        .min(new_token_ids.len());
    let mut rest = &new_token_ids[skip..];
    // Room for every hash this call adds, at once: a long prompt's hashes regrown one
    // doubling at a time cost a realloc and a copy each.
    let num_new_hashes = (request.tail_tokens.len() + rest.len()) / bs;
    request.block_hashes.reserve(num_new_hashes);
    if !request.tail_tokens.is_empty() {
        let take = (bs - request.tail_tokens.len()).min(rest.len());
        extend_tokens(&mut request.tail_tokens, &rest[..take]);
        rest = &rest[take..];
        if request.tail_tokens.len() < bs {
            return;
        }
        let parent = request.block_hashes.last().copied();
        let hash = hash_block(parent, &request.tail_tokens, request.extra_key);
        request.block_hashes.push(hash);
        request.tail_tokens.clear();
    }
    let num_whole = rest.len() / bs * bs;
    for block in rest[..num_whole].chunks_exact(bs) {
        let parent = request.block_hashes.last().copied();
        request
            .block_hashes
            .push(hash_block(parent, block, request.extra_key));
    }
    extend_tokens(&mut request.tail_tokens, &rest[num_whole..]);
}

/// `tokens.extend_from_slice(new)`, without a `memcpy` call for the one token of a decode
/// step (every running request's every step appends one).
fn extend_tokens(tokens: &mut Vec<TokenId>, new: &[TokenId]) {
    match new {
        [] => {}
        [token] => tokens.push(*token),
        _ => tokens.extend_from_slice(new),
    }
}

/// Blocks whose map slots are read ahead together.
pub(super) const WARM_RUN: usize = 16;

/// Registers the request's newly computed full blocks in the prefix cache. As in vLLM, a
/// block whose content another block already caches is registered too, as a later copy:
/// block tables are append-only, so the duplicate is not swapped for the cached block, and
/// it keeps the prefix cached once the first copy is evicted.
#[inline]
pub(super) fn cache_full_blocks(
    block_size: usize,
    rules: PrefixRules,
    cached: &mut CacheMap,
    blocks: &mut [BlockMeta],
    events: &mut Option<Vec<KvEvent>>,
    request: &mut RequestBlocks,
) {
    // Computed tokens the request has (not drafts in flight) less the re-prefillable ones
    // (`PrefixRules::num_cacheable_tokens`), and no block without its (look-ahead) hash.
    let num_cacheable = rules.num_cacheable_tokens(request.num_computed_tokens, request.num_tokens);
    let num_full = (num_cacheable / block_size).min(request.block_hashes.len());
    // Nothing newly full (15 decode steps in 16): nothing to register or count, and no
    // call (this runs for every running request every step).
    if request.num_cached_blocks < num_full {
        cache_new_full_blocks(cached, blocks, events, request, num_full);
    }
}

/// [`cache_full_blocks`] once blocks `num_cached_blocks..num_full` are newly full.
fn cache_new_full_blocks(
    cached: &mut CacheMap,
    blocks: &mut [BlockMeta],
    events: &mut Option<Vec<KvEvent>>,
    request: &mut RequestBlocks,
    num_full: usize,
) {
    let first = request.num_cached_blocks;
    let hashes = &request.block_hashes[first..num_full];
    let ids = &request.block_ids[first..num_full];
    // A prefill chunk caches hundreds of blocks. A run of one trace block's named places
    // is registered with one probe of the named index; other hashes' slots are read ahead
    // a run at a time.
    if !cached.names_blocks() {
        // No runs to take: one hash at a time, read ahead a run at a time.
        for (run_hashes, run_ids) in hashes.chunks(WARM_RUN).zip(ids.chunks(WARM_RUN)) {
            cached.warm(run_hashes);
            for (&hash, &block) in run_hashes.iter().zip(run_ids) {
                cached.insert(hash, block, blocks);
                blocks[block as usize].set_hash(hash);
                if let Some(events) = events {
                    events.push(KvEvent::Stored(hash));
                }
            }
        }
        request.num_cached_blocks = request.num_cached_blocks.max(num_full);
        return;
    }
    let mut at = 0;
    let mut warmed = 0;
    while at < hashes.len() {
        let len = match cached.insert_named_run(&hashes[at..], &ids[at..]) {
            0 => {
                if at >= warmed {
                    warmed = (at + WARM_RUN).min(hashes.len());
                    cached.warm(&hashes[at..warmed]);
                }
                cached.insert(hashes[at], ids[at], blocks);
                1
            }
            len => len,
        };
        for (&hash, &block) in hashes[at..at + len].iter().zip(&ids[at..at + len]) {
            blocks[block as usize].set_hash(hash);
            if let Some(events) = events {
                events.push(KvEvent::Stored(hash));
            }
        }
        at += len;
    }
    request.num_cached_blocks = request.num_cached_blocks.max(num_full);
}

/// Adds one request's blocks to `holders` (per block, the requests holding it); returns
/// whether the request holds a block twice.
pub(super) fn count_holders(holders: &mut [u32], held: impl IntoIterator<Item = BlockId>) -> bool {
    let mut seen: Vec<BlockId> = held.into_iter().collect();
    seen.iter().for_each(|&b| holders[b as usize] += 1);
    seen.sort_unstable();
    seen.windows(2).any(|w| w[0] == w[1])
}

/// The invariants of the pool's parts for blocks `first_block..` (the coordinator's null
/// block, before them, is checked apart): each ref count equals the block's `holders`, it
/// is 0 exactly when the block is free, a cached block is the cache map's answer for its
/// hash or a later copy of it, and the free queue links as many blocks as it counts.
/// O(blocks).
pub(super) fn check_pool_blocks(
    blocks: &[BlockMeta],
    free_queue: &impl FreeQueue,
    cached: &CacheMap,
    holders: &[u32],
    first_block: usize,
) -> Result<(), String> {
    for (b, meta) in blocks.iter().enumerate().skip(first_block) {
        if meta.ref_cnt != holders[b] {
            return Err(format!(
                "block {b}: ref count {} but {} holders",
                meta.ref_cnt, holders[b]
            ));
        }
        if (meta.ref_cnt == 0) != free_queue.contains(b as BlockId) {
            return Err(format!(
                "block {b}: ref count {} disagrees with the free queue",
                meta.ref_cnt
            ));
        }
        if let Some(hash) = meta.hash() {
            let first = cached.get(&hash, blocks);
            let is_copy = cached.later_copies(&hash).contains(&(b as BlockId));
            if first != Some(b as BlockId) && !is_copy {
                return Err(format!(
                    "block {b} has a hash the cache map does not point back from"
                ));
            }
        }
    }
    let linked = free_queue.ids().len();
    if linked != free_queue.len() {
        return Err(format!(
            "free queue links {linked} blocks but counts {}",
            free_queue.len()
        ));
    }
    Ok(())
}

/// The cache map counts every block that holds a hash.
pub(super) fn check_cached_count(blocks: &[BlockMeta], cached: &CacheMap) -> Result<(), String> {
    let num_hashed = blocks.iter().filter(|m| m.cached).count();
    if num_hashed != cached.num_blocks() {
        return Err(format!(
            "{num_hashed} blocks hold a hash but the cache map counts {}",
            cached.num_blocks()
        ));
    }
    Ok(())
}

/// What grows a request's block table: the free queue, the blocks' records and what an
/// eviction updates, borrowed beside the request's entry (`BlockPool::split_for_growth`).
pub(super) struct Growth<'a, Q> {
    pub(super) block_size: usize,
    pub(super) caching: bool,
    /// The pool's EAGLE/MTP prefix-cache rules (`kv::lookahead`).
    pub(super) rules: super::PrefixRules,
    pub(super) blocks: &'a mut Vec<BlockMeta>,
    pub(super) free_queue: &'a mut Q,
    /// The pool's withheld free blocks (`BlockPool::force_num_free_blocks`).
    pub(super) withheld: usize,
    pub(super) eviction: Eviction<'a>,
}

impl<Q: FreeQueue> Growth<'_, Q> {
    pub(super) fn num_free_blocks(&self) -> usize {
        self.free_queue.len().saturating_sub(self.withheld)
    }

    /// Takes `num_new_blocks` free blocks onto `request`'s table (evicting what they
    /// cached), records `new_token_ids`, counts `num_new_tokens` more computed and, with
    /// `cache`, registers the full blocks they complete: the end of every allocation.
    #[inline(always)]
    pub(super) fn grow(
        self,
        request: &mut RequestBlocks,
        num_new_blocks: usize,
        new_token_ids: &[TokenId],
        num_new_tokens: usize,
        cache: bool,
    ) {
        let Self {
            block_size,
            caching,
            rules,
            blocks,
            free_queue,
            mut eviction,
            ..
        } = self;
        // Most decode steps need no new block (a token into a block with room): nothing to
        // take then, and the free queue is not asked.
        if num_new_blocks > 0 {
            let table = &mut request.block_ids;
            table.reserve(num_new_blocks);
            take_free_blocks(free_queue, blocks, &mut eviction, num_new_blocks, table);
        }
        let Eviction { cached, events, .. } = eviction;
        let lookahead = rules.num_hash_lookahead_tokens;
        append_tokens(block_size, caching, lookahead, request, new_token_ids);
        request.num_computed_tokens += num_new_tokens;
        if caching && cache {
            cache_full_blocks(block_size, rules, cached, blocks, events, request);
        }
    }
}
