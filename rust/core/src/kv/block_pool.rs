//! vLLM V1's prefix-caching block pool (seed 004 §4), with the per-request bookkeeping of
//! its single-group KV cache manager.
//!
//! It owns every block's ref count and cached hash, the LRU free queue, the hash → block
//! map and each request's block table. Invariants (see `check_invariants`):
//! - a block is in the free queue exactly when no request holds it (ref count 0);
//! - a block's ref count equals the number of requests whose table holds it;
//! - the hash map and the blocks' hashes agree; a hash cached in several blocks (as vLLM
//!   allows) answers lookups with its oldest copy;
//! - free + in use = total, where free = uncached-free + cached-free.
//!
//! The per-block steps (taking a free block, hashing, caching) are in `block_ops`; the
//! read-only views and the invariant check in `block_pool_inspect`.
//!
//! With a host tier ([`BlockPool::with_host_tier`]), a cached hash evicted from a GPU block
//! is offloaded to the tier, and lookups continue into it. A hash may be both GPU-cached and
//! in the tier: loading a block back leaves its host copy (as vLLM's offloading connector
//! and SGLang's HiCache do), so evicting it again costs no copy.

use rustc_hash::FxHashMap;

use super::block_hash::{BlockHash, hash_block};
use super::block_ops::{
    BlockMeta, Eviction, Growth, WARM_RUN, append_tokens, cache_full_blocks, release_blocks,
};
use super::cache_map::CacheMap;
use super::free_queue::{FreeBlockQueue, FreeQueue};
use super::host_tier::HostTier;
use super::lookahead::PrefixRules;
use super::loose_blocks::LooseBlocks;
use super::{
    KvCapacity, LookupQuery, RequestKey, TokenId, blocks_needed, check_allocation,
    check_block_size, check_extra_key, check_num_blocks,
};
use crate::{Error, Result};

pub type BlockId = u32;

/// The largest block size accepted (vLLM's are 16–128; LightLLM's is 1).
pub const MAX_BLOCK_SIZE: usize = 1 << 16;

/// The longest cached prefix of some token ids, from [`BlockPool::get_computed_blocks`].
/// Hand it to [`BlockPool::allocate_slots`] when admitting the request, so the hit blocks are
/// shared and the hashes are not computed twice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputedBlocks {
    /// The GPU hit: cached blocks, shared on admission.
    pub block_ids: Vec<BlockId>,
    /// Tokens of the GPU hit only.
    pub num_computed_tokens: usize,
    /// Blocks after the GPU hit whose hashes the host tier holds: loaded on admission.
    pub num_host_blocks: usize,
    block_size: usize,
    query: LookupQuery,
    /// Hashes of the GPU hits, the host hits, the first block that missed and up to
    /// `WARM_RUN - 1` blocks after it (empty when caching is off); the request's later
    /// blocks are hashed when it is admitted.
    block_hashes: Vec<BlockHash>,
}

impl ComputedBlocks {
    /// Tokens of the host hit (loaded, not shared, on admission).
    pub fn num_host_tokens(&self) -> usize {
        self.num_host_blocks * self.block_size
    }

    fn host_hashes(&self) -> &[BlockHash] {
        let first = self.block_ids.len();
        let end = (first + self.num_host_blocks).min(self.block_hashes.len());
        &self.block_hashes[first.min(end)..end]
    }

    /// The hashes this lookup computed, for the request's next lookup
    /// ([`BlockPool::get_computed_blocks_from`]).
    pub(crate) fn into_block_hashes(self) -> Vec<BlockHash> {
        self.block_hashes
    }
}

/// Prefix-cache lookups since the pool was built (vLLM's `PrefixCacheStats`), and the
/// host tier's traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockPoolStats {
    pub num_lookups: u64,
    pub num_query_tokens: u64,
    /// GPU hits only.
    pub num_hit_tokens: u64,
    /// Host-tier hits after the GPU hits.
    pub num_host_hit_tokens: u64,
    /// Hashes that entered the host tier (a refresh of a held one copies nothing).
    pub num_offloaded_blocks: u64,
    /// Host-tier blocks loaded back into GPU blocks.
    pub num_loaded_blocks: u64,
}

impl BlockPoolStats {
    pub(super) fn record_lookup(&mut self, num_query_tokens: usize, num_hit_tokens: usize) {
        self.num_lookups += 1;
        self.num_query_tokens += num_query_tokens as u64;
        self.num_hit_tokens += num_hit_tokens as u64;
    }

    pub fn hit_rate(&self) -> f64 {
        if self.num_query_tokens == 0 {
            0.0
        } else {
            self.num_hit_tokens as f64 / self.num_query_tokens as f64
        }
    }
}

/// The tokens one allocation adds to a request.
struct NewTokens<'a> {
    token_ids: &'a [TokenId],
    num_tokens: usize,
    num_lookahead: usize,
    /// Register newly full computed blocks in the prefix cache now (false: loaded tokens
    /// whose data has not landed).
    cache: bool,
    /// `token_ids` is the request's whole token list: the new ones are those past the
    /// tokens the pool knows of it (read from the entry the allocation looks up anyway).
    after_known: bool,
}

#[derive(Debug, Clone)]
pub(super) struct RequestBlocks {
    pub(super) block_ids: Vec<BlockId>,
    /// Hashes of the request's full blocks so far (maintained only with caching on).
    pub(super) block_hashes: Vec<BlockHash>,
    /// Token ids after the last full block, waiting for their block to fill up.
    pub(super) tail_tokens: Vec<TokenId>,
    pub(super) num_tokens: usize,
    pub(super) num_computed_tokens: usize,
    /// Leading blocks already registered in (or offered to) the prefix cache.
    pub(super) num_cached_blocks: usize,
    pub(super) extra_key: Option<u64>,
}

/// `Q` is the free queue: vLLM's linked list by default, or a [`RunQueue`](super::RunQueue)
/// ([`RunBlockPool`](super::RunBlockPool)); both hand out the same blocks in the same order.
#[derive(Debug, Clone)]
pub struct BlockPool<R: RequestKey, Q: FreeQueue = FreeBlockQueue> {
    block_size: usize,
    enable_caching: bool,
    blocks: Vec<BlockMeta>,
    free_queue: Q,
    /// Free blocks the fit checks and the free count leave out (vLLM's forced
    /// `FreeKVCacheBlockQueue.num_free_blocks`: `force_num_free_blocks`); 0 unless forced.
    withheld: usize,
    cached: CacheMap,
    requests: FxHashMap<R, RequestBlocks>,
    stats: BlockPoolStats,
    /// Cache events for KV-aware routers (vLLM's BlockStored / BlockRemoved), when enabled.
    events: Option<Vec<KvEvent>>,
    /// Each cache call beside the events, when enabled (`kv::event_log`).
    cache_calls: Option<Vec<CacheCall<R>>>,
    host: Option<HostTier>,
    /// Entries of freed requests, emptied, whose vectors the next requests reuse (at most
    /// `MAX_SPARE`): a replay admits a request every few steps, and each entry's three
    /// vectors were fresh allocations, often fresh pages.
    spare: Vec<RequestBlocks>,
    /// `free`'s list of uncached blocks, kept between calls.
    evict_first: Vec<BlockId>,
    /// vLLM 0.33's prefix-cache rules for EAGLE/MTP drafters (`kv::lookahead`).
    pub(super) rules: PrefixRules,
    /// Blocks held outside any request (`kv::loose_blocks`).
    loose: LooseBlocks,
}

/// Freed request entries kept for reuse, per pool.
const MAX_SPARE: usize = 64;

/// A change to what the prefix cache holds, as vLLM and SGLang publish them to routers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEvent {
    /// A full block was cached under this content hash. One event per block, as vLLM
    /// reports them: a hash cached in two blocks is stored twice.
    Stored(BlockHash),
    /// A block caching this hash was evicted. The hash stays findable while another block
    /// still caches it (as many `Removed` as `Stored`).
    Removed(BlockHash),
    /// A hash entered the host tier (vLLM's `BlockStored` with the CPU medium).
    HostStored(BlockHash),
    /// A hash left the host tier, evicted to make room.
    HostRemoved(BlockHash),
    /// Every cached block was forgotten, the host tier's included.
    AllCleared,
}

impl<R: RequestKey> BlockPool<R> {
    pub fn new(num_blocks: usize, block_size: usize, enable_caching: bool) -> Result<Self> {
        Self::over_queue(num_blocks, block_size, enable_caching)
    }
}

impl<R: RequestKey> BlockPool<R, super::RunQueue> {
    /// [`BlockPool::new`] over a free queue of runs (the same answers, block for block).
    pub fn over_runs(num_blocks: usize, block_size: usize, enable_caching: bool) -> Result<Self> {
        Self::over_queue(num_blocks, block_size, enable_caching)
    }
}

impl<R: RequestKey, Q: FreeQueue> BlockPool<R, Q> {
    fn over_queue(num_blocks: usize, block_size: usize, enable_caching: bool) -> Result<Self> {
        check_num_blocks(num_blocks)?;
        check_block_size(block_size)?;
        Ok(Self {
            block_size,
            enable_caching,
            blocks: super::try_filled_vec(num_blocks, BlockMeta::default(), "num_blocks")?,
            free_queue: Q::with_all_blocks(num_blocks)?,
            withheld: 0,
            cached: CacheMap::new(num_blocks)?,
            requests: FxHashMap::default(),
            stats: BlockPoolStats::default(),
            events: None,
            cache_calls: None,
            host: None,
            spare: Vec::new(),
            evict_first: Vec::new(),
            rules: PrefixRules::default(),
            loose: LooseBlocks::default(),
        })
    }

    /// Adds a host-memory tier of `host_num_blocks` blocks: hashes evicted from GPU blocks
    /// are offloaded there and lookups continue into it (see `docs/kv.md`).
    pub fn with_host_tier(mut self, host_num_blocks: usize) -> Result<Self> {
        if !self.enable_caching {
            return Err(Error::config(
                "host_num_blocks",
                host_num_blocks,
                "a host tier needs prefix caching (enable_caching)",
            ));
        }
        self.host = Some(HostTier::new(host_num_blocks)?);
        Ok(self)
    }

    /// The pool with every hash slotted per block in its prefix-cache map, named blocks'
    /// too (the map before the per-trace-block index): the differential test's reference.
    #[cfg(test)]
    pub(super) fn with_per_block_map(mut self) -> Self {
        debug_assert_eq!(self.cached.num_blocks(), 0);
        self.cached = CacheMap::per_block(self.blocks.len());
        self
    }

    /// Starts recording cache events (drained with [`Self::drain_events`]).
    pub fn enable_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The cache events since the last drain, oldest first.
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn emit(&mut self, event: KvEvent) {
        if let Some(events) = &mut self.events {
            events.push(event);
        }
    }

    /// Steps the request's computed tokens back by `num_tokens` (speculative tokens the
    /// model rejected). Their slots stay allocated for the next step; they were never
    /// cached, since only known token ids are.
    pub fn rewind_computed_tokens(&mut self, request_id: &R, num_tokens: usize) -> Result<()> {
        let block_size = self.block_size;
        let request = self
            .requests
            .get_mut(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        // Cached blocks may run past the computed tokens after a failed load's truncation.
        let num_uncached =
            (request.num_computed_tokens).saturating_sub(request.num_cached_blocks * block_size);
        if num_tokens > num_uncached {
            return Err(Error::input(
                "num_tokens",
                num_tokens,
                format!("only {num_uncached} computed tokens are not yet cached"),
            ));
        }
        request.num_computed_tokens -= num_tokens;
        Ok(())
    }

    /// vLLM 0.33's truncation after a failed KV load (`_update_requests_with_invalid_blocks`):
    /// the request's computed tokens drop to `num_tokens`, and its blocks stay allocated (it
    /// recomputes into them). With `evict`, its blocks cached past that leave the prefix
    /// cache (vLLM's `evict_blocks` under `kv_load_failure_policy="fail"`; a block another
    /// request shares leaves it too). Without, they stay cached and counted as cached, as
    /// vLLM's `num_cached_block` keeps them: the request's cached blocks may then run past
    /// its computed tokens until it recomputes them, and nothing caches them twice.
    /// Errors on an unknown request or `num_tokens` past its computed tokens (nothing
    /// changed then).
    pub fn truncate_computed_tokens(
        &mut self,
        request_id: &R,
        num_tokens: usize,
        evict: bool,
    ) -> Result<()> {
        let block_size = self.block_size;
        let Self {
            requests,
            cached,
            blocks,
            events,
            ..
        } = self;
        let request = requests
            .get_mut(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        if num_tokens > request.num_computed_tokens {
            return Err(Error::input(
                "num_tokens",
                num_tokens,
                format!("only {} tokens are computed", request.num_computed_tokens),
            ));
        }
        if evict {
            let keep = num_tokens / block_size;
            let cached_ids = request.block_ids.iter().take(request.num_cached_blocks);
            for &block in cached_ids.skip(keep) {
                if let Some(hash) = blocks[block as usize].take_hash() {
                    cached.forget(block, &hash);
                    if let Some(events) = events {
                        events.push(KvEvent::Removed(hash));
                    }
                }
            }
            request.num_cached_blocks = request.num_cached_blocks.min(keep);
        }
        request.num_computed_tokens = num_tokens;
        Ok(())
    }

    /// Gives `request_id` slots for `num_new_tokens` more tokens plus `num_lookahead_tokens`
    /// speculative ones, appending `new_token_ids` to what the pool knows of the request.
    /// The new tokens may run ahead of the known ids (speculative tokens, or tokens still
    /// being sampled under async scheduling): as in vLLM, only known ids are hashed and
    /// cached, and the rest are cached once their ids arrive.
    ///
    /// On a request's first call, `new_computed` (from `get_computed_blocks` over the same
    /// token ids) shares its cached prefix. Full blocks that become computed are registered
    /// in the prefix cache. Returns the newly allocated block ids, or `Ok(None)` when the
    /// free blocks do not suffice; either way a failed call changes nothing, so the caller
    /// passes the same token ids again when it retries.
    pub fn allocate_slots(
        &mut self,
        request_id: &R,
        new_token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        new_computed: Option<&ComputedBlocks>,
        extra_key: Option<u64>,
    ) -> Result<Option<Vec<BlockId>>> {
        let allocated = self.allocate_slots_counted(
            request_id,
            new_token_ids,
            num_new_tokens,
            num_lookahead_tokens,
            new_computed,
            extra_key,
        )?;
        Ok(allocated.map(|num_new_blocks| {
            let table = self.block_ids(request_id).unwrap_or_default();
            table[table.len() - num_new_blocks..].to_vec()
        }))
    }

    /// [`Self::allocate_slots`] returning how many blocks were allocated (the last ones of
    /// the request's table), not their ids: a decode step calls this for every running
    /// request, and a caller that needs only the count should not pay a vector per call.
    pub(crate) fn allocate_slots_counted(
        &mut self,
        request_id: &R,
        new_token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        new_computed: Option<&ComputedBlocks>,
        extra_key: Option<u64>,
    ) -> Result<Option<usize>> {
        let new = NewTokens {
            token_ids: new_token_ids,
            num_tokens: num_new_tokens,
            num_lookahead: num_lookahead_tokens,
            cache: true,
            after_known: false,
        };
        self.allocate_noted(request_id, new, new_computed, extra_key)
    }

    /// [`Self::allocate_slots_counted`] without a prefix hit, given the request's whole
    /// token list `token_ids`: the new tokens are those past the ones the pool knows of it
    /// (all of them on a first allocation). A caller that keeps the whole list would
    /// otherwise ask [`Self::num_tokens`] first, a second lookup of the request per step.
    pub(crate) fn allocate_slots_after_known(
        &mut self,
        request_id: &R,
        token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        extra_key: Option<u64>,
    ) -> Result<Option<usize>> {
        let new = NewTokens {
            token_ids,
            num_tokens: num_new_tokens,
            num_lookahead: num_lookahead_tokens,
            cache: true,
            after_known: true,
        };
        self.allocate_noted(request_id, new, None, extra_key)
    }

    /// A request's first allocation when its `num_external_tokens` tokens after the prefix
    /// hit `new_computed` (GPU and host hits) will be *loaded* rather than computed (vLLM's
    /// KV connectors: a prefill instance's transfer). The hit's host blocks are loaded too.
    /// They get slots and count as computed, but their blocks enter the prefix cache only at
    /// [`Self::cache_loaded_blocks`], once the data has landed: until then no lookup may
    /// find a block still being written (vLLM's `delay_cache_blocks`). At least one token
    /// is loaded: `num_external_tokens` may be 0 only when the hit has host blocks. Returns
    /// the number of new blocks, or `Ok(None)` (nothing changed) when they do not fit.
    pub fn allocate_slots_external(
        &mut self,
        request_id: &R,
        token_ids: &[TokenId],
        num_external_tokens: usize,
        new_computed: Option<&ComputedBlocks>,
        extra_key: Option<u64>,
    ) -> Result<Option<usize>> {
        if self.requests.contains_key(request_id) {
            return Err(Error::input(
                "request_id",
                format!("{request_id:?}"),
                "external tokens are only loaded on a request's first allocation",
            ));
        }
        let hit = new_computed.map_or(0, |h| h.num_computed_tokens + h.num_host_tokens());
        if hit + num_external_tokens > token_ids.len() {
            return Err(Error::input(
                "num_external_tokens",
                num_external_tokens,
                format!(
                    "the prefix hit ({hit}) and the loaded tokens exceed the request's {} \
                     tokens",
                    token_ids.len()
                ),
            ));
        }
        let new = NewTokens {
            token_ids,
            num_tokens: num_external_tokens,
            num_lookahead: 0,
            cache: false,
            after_known: false,
        };
        self.allocate_noted(request_id, new, new_computed, extra_key)
    }

    /// vLLM 0.33's admission gate (`scheduler_reserve_full_isl`): whether `num_tokens` of a
    /// request (its whole sequence) fit in the free blocks beside the blocks it holds or
    /// its prefix hit `hit` (a cached hit block nobody holds leaves the free queue too).
    pub fn full_sequence_fits(
        &self,
        request_id: &R,
        num_tokens: usize,
        hit: Option<&ComputedBlocks>,
    ) -> bool {
        self.num_blocks_to_allocate(request_id, num_tokens, hit) <= self.num_free_blocks()
    }

    /// The blocks of the free queue that `num_tokens` slots of the request take beside the
    /// blocks it holds or its prefix hit `hit` (vLLM's `get_num_blocks_to_allocate`: new
    /// blocks, and cached hit blocks nobody holds, which leave the free queue).
    pub fn num_blocks_to_allocate(
        &self,
        request_id: &R,
        num_tokens: usize,
        hit: Option<&ComputedBlocks>,
    ) -> usize {
        let (held, evictable) = match (self.requests.get(request_id), hit) {
            (Some(request), _) => (request.block_ids.len(), 0),
            (None, Some(hit)) => {
                let blocks = &hit.block_ids;
                let free = (blocks.iter())
                    .filter(|&&b| self.blocks[b as usize].ref_cnt == 0)
                    .count();
                (blocks.len(), free)
            }
            (None, None) => (0, 0),
        };
        blocks_needed(num_tokens, self.block_size, held) + evictable
    }

    /// Registers the request's loaded blocks (see [`Self::allocate_slots_external`]) in the
    /// prefix cache: their data has landed.
    pub fn cache_loaded_blocks(&mut self, request_id: &R) -> Result<()> {
        self.cache_blocks(request_id, &[])
    }

    /// Gives the pool the request's `new_token_ids` (known now, past those it has) and
    /// caches its full blocks of computed tokens, without allocating: vLLM 0.33's
    /// `cache_blocks` in `update_from_output`, for blocks that accepted drafts completed.
    pub fn cache_blocks(&mut self, request_id: &R, new_token_ids: &[TokenId]) -> Result<()> {
        self.cache_blocks_ahead(request_id, new_token_ids, &[])
    }

    /// [`Self::cache_blocks`], with `ahead`: the request's tokens past `new_token_ids`,
    /// which complete the hashes of a hash look-ahead (`kv::lookahead`; ignored without).
    pub fn cache_blocks_ahead(
        &mut self,
        request_id: &R,
        new_token_ids: &[TokenId],
        ahead: &[TokenId],
    ) -> Result<()> {
        let mark = self.cache_mark();
        let (block_size, caching, rules) = (self.block_size, self.enable_caching, self.rules);
        let lookahead = rules.num_hash_lookahead_tokens;
        let Self {
            requests,
            cached,
            blocks,
            events,
            ..
        } = self;
        let request = requests
            .get_mut(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        append_tokens(block_size, caching, lookahead, request, new_token_ids);
        if caching {
            super::lookahead::hash_ahead(block_size, lookahead, request, ahead);
            cache_full_blocks(block_size, rules, cached, blocks, events, request);
        }
        self.note_cache_call(request_id, mark);
        Ok(())
    }

    /// The requests' entries beside the parts that grow one of them (disjoint borrows: a
    /// request is updated in place in the map; a decode step does it for every running
    /// request, and moving it out and back cost a tenth of a step).
    #[inline(always)]
    pub(super) fn split_for_growth(&mut self) -> (&mut FxHashMap<R, RequestBlocks>, Growth<'_, Q>) {
        let Self {
            block_size,
            enable_caching,
            rules,
            requests,
            cached,
            blocks,
            events,
            free_queue,
            withheld,
            host,
            stats,
            ..
        } = self;
        let growth = Growth {
            block_size: *block_size,
            caching: *enable_caching,
            rules: *rules,
            blocks,
            free_queue,
            withheld: *withheld,
            eviction: Eviction {
                cached,
                events,
                host,
                stats,
                secondary: None,
            },
        };
        (requests, growth)
    }

    fn allocate(
        &mut self,
        request_id: &R,
        new: NewTokens<'_>,
        new_computed: Option<&ComputedBlocks>,
        extra_key: Option<u64>,
    ) -> Result<Option<usize>> {
        if new_computed.is_none()
            && let Some(allocated) = self.allocate_held(request_id, &new, extra_key)
        {
            return allocated;
        }
        // A first allocation: the pool knows none of the request's tokens yet.
        let NewTokens {
            token_ids: new_token_ids,
            num_tokens: num_new_tokens,
            num_lookahead: num_lookahead_tokens,
            cache,
            after_known: _,
        } = new;
        let num_new_blocks = self.plan_allocation(
            request_id,
            new_token_ids,
            num_new_tokens,
            num_lookahead_tokens,
            new_computed,
            extra_key,
        )?;
        let evictable_hits = new_computed.map_or(0, |hit| {
            hit.block_ids
                .iter()
                .filter(|&&b| self.blocks[b as usize].ref_cnt == 0)
                .count()
        });
        if num_new_blocks + evictable_hits > self.num_free_blocks() {
            return Ok(None);
        }
        if !self.requests.contains_key(request_id) {
            let request = self.admit(new_computed, extra_key);
            self.requests.insert(request_id.clone(), request);
        }
        let (requests, growth) = self.split_for_growth();
        let request = requests.get_mut(request_id).expect("inserted above");
        growth.grow(
            request,
            num_new_blocks,
            new_token_ids,
            num_new_tokens,
            cache,
        );
        Ok(Some(num_new_blocks))
    }

    /// Releases every block of the request, as vLLM V1 (0.33) does: blocks are visited last
    /// first; a block left with no holder and no cached hash goes to the front of the free
    /// queue (reused first, LIFO, for locality), a cached one to the back (LRU), so among
    /// one request's cached blocks the tail is evicted before the head.
    pub fn free(&mut self, request_id: &R) -> Result<()> {
        let request = self
            .requests
            .remove(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let ordered = request.block_ids.iter().rev().copied();
        release_blocks(
            &mut self.free_queue,
            &mut self.blocks,
            ordered,
            &mut self.evict_first,
        );
        if self.spare.len() < MAX_SPARE {
            let mut request = request;
            request.block_ids.clear();
            request.block_hashes.clear();
            request.tail_tokens.clear();
            self.spare.push(request);
        }
        Ok(())
    }

    /// Forgets every cached prefix. Only possible when no request holds blocks (as in
    /// vLLM, e.g. after weights change); returns whether it happened.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if !self.requests.is_empty() || !self.loose.is_empty() {
            return false;
        }
        self.cached.clear();
        self.blocks.iter_mut().for_each(|b| b.cached = false);
        if let Some(host) = &mut self.host {
            host.clear();
        }
        self.emit(KvEvent::AllCleared);
        true
    }

    fn plan_allocation(
        &self,
        request_id: &R,
        new_token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        new_computed: Option<&ComputedBlocks>,
        extra_key: Option<u64>,
    ) -> Result<usize> {
        let existing = self.requests.get(request_id);
        // Tokens loaded from the host tier also count as added (an asynchronous load may
        // compute nothing yet).
        let num_loaded = new_computed.map_or(0, ComputedBlocks::num_host_tokens);
        check_allocation(
            request_id,
            num_new_tokens + num_loaded,
            existing.is_some(),
            new_computed.is_some(),
        )?;
        let (num_computed, num_held) = match existing {
            Some(request) => {
                check_extra_key(extra_key, request.extra_key, "request was admitted with")?;
                (request.num_computed_tokens, request.block_ids.len())
            }
            None => match new_computed {
                Some(hit) => {
                    self.check_hit_is_current(hit, new_token_ids.len(), extra_key)?;
                    // Host-hit blocks need fresh GPU blocks: they count as new ones.
                    (hit.num_computed_tokens + num_loaded, hit.block_ids.len())
                }
                None => (0, 0),
            },
        };
        let num_slots = num_computed + num_new_tokens + num_lookahead_tokens;
        Ok(blocks_needed(num_slots, self.block_size, num_held))
    }

    /// A fresh request entry holding the GPU hit blocks (their ref counts taken), with the
    /// host hit's tokens counted as computed: their blocks come next, and are cached with
    /// the request's newly computed blocks. A load is a use of those host entries; it reads
    /// them before this allocation's evictions offload anything, so even an entry those
    /// offloads push out of the tier has been loaded.
    fn admit(&mut self, hit: Option<&ComputedBlocks>, extra_key: Option<u64>) -> RequestBlocks {
        let mut request = self.spare.pop().unwrap_or_else(|| RequestBlocks {
            block_ids: Vec::new(),
            block_hashes: Vec::new(),
            tail_tokens: Vec::new(),
            num_tokens: 0,
            num_computed_tokens: 0,
            num_cached_blocks: 0,
            extra_key,
        });
        debug_assert!(request.block_ids.is_empty() && request.tail_tokens.is_empty());
        request.block_hashes.clear();
        request.num_tokens = 0;
        request.num_computed_tokens = 0;
        request.num_cached_blocks = 0;
        request.extra_key = extra_key;
        if let Some(hit) = hit {
            for &block in &hit.block_ids {
                self.touch(block);
            }
            if let Some(host) = &mut self.host {
                hit.host_hashes().iter().for_each(|&h| host.touch(h));
            }
            self.stats.num_loaded_blocks += hit.num_host_blocks as u64;
            request.block_ids.extend_from_slice(&hit.block_ids);
            request.block_hashes.extend_from_slice(&hit.block_hashes);
            request.num_computed_tokens = hit.num_computed_tokens + hit.num_host_tokens();
            request.num_cached_blocks = hit.block_ids.len();
            request.extra_key = hit.query.extra_key;
        }
        request
    }

    /// Takes a reference on a block found in the prefix cache.
    fn touch(&mut self, block: BlockId) {
        if self.blocks[block as usize].ref_cnt == 0 {
            self.free_queue.remove(block);
        }
        self.blocks[block as usize].ref_cnt += 1;
    }
}

impl<R: RequestKey, Q: FreeQueue> KvCapacity for BlockPool<R, Q> {
    fn num_total_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The free queue's blocks less those withheld (`force_num_free_blocks`): the count
    /// vLLM's checks read (`FreeKVCacheBlockQueue.num_free_blocks`).
    fn num_free_blocks(&self) -> usize {
        self.free_queue.len().saturating_sub(self.withheld)
    }
}

#[path = "block_pool_hits.rs"]
mod hits;

#[path = "block_pool_held.rs"]
mod held;

#[path = "event_log.rs"]
mod event_log;
pub use event_log::CacheCall;

#[path = "block_pool_inspect.rs"]
mod inspect;

#[path = "block_pool_loose.rs"]
mod loose;

#[cfg(test)]
#[path = "block_pool_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "block_pool_host_tests.rs"]
mod host_tests;
