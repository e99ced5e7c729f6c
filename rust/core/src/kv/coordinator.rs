//! vLLM V1's KV cache coordinator (0.33's `kv_cache_coordinator.py` with the managers of
//! `single_type_kv_cache_manager.py`): the KV cache of a hybrid model, one group per layer
//! kind ([`KvGroupSpec`]), over one shared pool of blocks.
//!
//! The pool is the [`BlockPool`](super::BlockPool)'s machinery: block records with ref
//! counts, the LRU free queue and the hash → block map, with block 0 set aside as vLLM's
//! null block. A block belongs to one group at a time; it is cached under its chained
//! block hash *and its group id* (vLLM's `BlockHashWithGroupId`), so the same tokens are
//! cached once per group. Each request has a block table per group.
//!
//! Invariants (see `check_invariants`): a block's ref count is the number of table entries
//! naming it; it is in the free queue exactly when that is 0; the null block is never
//! free, held or cached; free + held = `num_blocks - 1`; no request holds a block twice.
//! `allocate_slots` first frees the blocks a group no longer attends to (vLLM's step 1,
//! `remove_skipped_blocks`), so a sliding-window group holds at most
//! [`KvGroupSpec::max_live_blocks`] blocks per request after each allocation.

use rustc_hash::{FxHashMap, FxHashSet};
use xxhash_rust::xxh3::xxh3_128;

use super::block_hash::{BlockHash, hash_full_blocks};
use super::block_ops::{
    BlockMeta, Eviction, SecondaryHashes, append_tokens, release_blocks, take_free_block,
};
use super::block_pool::{BlockId, BlockPoolStats, CacheCall, KvEvent, RequestBlocks};
use super::cache_map::CacheMap;
use super::free_queue::FreeBlockQueue;
use super::layer_groups::{
    GroupSlots, KvGroupSpec, NULL_BLOCK, SpecGroup, find_longest_cache_hit, spec_groups,
};
use super::loose_blocks::LooseBlocks;
use super::{
    KvCapacity, LookupQuery, RequestKey, TokenId, check_allocation, check_block_size,
    check_extra_key, check_num_blocks,
};
use crate::{Error, Result};

/// The most groups a coordinator takes (vLLM's hybrid models have two or three).
pub const MAX_NUM_GROUPS: usize = 64;

/// The prefix hit every group agrees on, from [`KvCoordinator::get_computed_blocks`]:
/// per group, the blocks covering `num_computed_tokens` (null blocks where the group does
/// not attend). Hand it to [`KvCoordinator::allocate_slots`] on admission.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupedComputedBlocks {
    pub block_ids: Vec<Vec<BlockId>>,
    pub num_computed_tokens: usize,
    /// Tokens past the hit that some group caches but another does not (vLLM 0.33's
    /// `num_uncached_common_prefix_tokens`: the longest single group's hit less the
    /// agreed one), 0 when the groups agree. The step scheduler's Mamba `align` split
    /// stops a chunk there so the lagging state gets cached (`shared_prefix_boundary`).
    pub num_uncached_prefix_tokens: usize,
    query: LookupQuery,
    /// Hashes of the query's full blocks that may hit (all but the last token's).
    block_hashes: Vec<BlockHash>,
}

impl GroupedComputedBlocks {
    /// The hashes this lookup computed, for the request's next lookup
    /// ([`KvCoordinator::get_computed_blocks_from`]).
    pub(crate) fn into_block_hashes(self) -> Vec<BlockHash> {
        self.block_hashes
    }

    /// Forgets the hit's blocks, keeping the query and its hashes: a hit the caller will
    /// not adopt (vLLM 0.33 ignores a hit no longer than the prefix replay window).
    pub(crate) fn drop_hit(&mut self) {
        self.block_ids.iter_mut().for_each(Vec::clear);
        self.num_computed_tokens = 0;
        self.num_uncached_prefix_tokens = 0;
    }
}

#[derive(Debug, Clone)]
struct CoordinatedRequest {
    /// Token ids, hashes and computed count (its `block_ids` stay empty).
    tokens: RequestBlocks,
    tables: Vec<Vec<BlockId>>,
    /// Per group, leading blocks already offered to the prefix cache (vLLM's
    /// `num_cached_block`).
    num_cached: Vec<usize>,
    /// Per group, what a Mamba `align` group's manager keeps of the request (unused by
    /// other groups).
    align: Vec<AlignState>,
    /// Whether it reads host-backed history, holding HiSparse hot regions
    /// (`coordinator_hisparse`).
    reads_host: bool,
    /// vLLM's `num_prompt_tokens`, read only by partial tail-block entries
    /// (`coordinator_sizes_tail`); `None` until set or first needed.
    num_prompt_tokens: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct KvCoordinator<R: RequestKey> {
    groups: Vec<KvGroupSpec>,
    lookup_order: Vec<SpecGroup>,
    block_size: usize,
    enable_caching: bool,
    blocks: Vec<BlockMeta>,
    free_queue: FreeBlockQueue,
    /// Free blocks the fit checks and the free count leave out (vLLM's forced
    /// `FreeKVCacheBlockQueue.num_free_blocks`: `force_num_free_blocks`); 0 unless forced.
    withheld: usize,
    cached: CacheMap,
    requests: FxHashMap<R, CoordinatedRequest>,
    stats: BlockPoolStats,
    /// Per group, blocks handed out since the last `take_new_block_ids`, when new blocks
    /// are zeroed before use (vLLM 0.33's `needs_kv_cache_zeroing`); `None` otherwise.
    zeroing: Option<Vec<Vec<BlockId>>>,
    /// Hashes (group-keyed) of the Mamba `align` states cached since the step began (vLLM
    /// 0.33's `MambaManager.cached_blocks_this_step`, a set of `BlockHashWithGroupId`):
    /// their states are computed by this step, so no other request admitted in it may hit
    /// them ([`Self::new_step_starts`]); keyed by hash as vLLM's is, a state recomputed
    /// this step under a hash an older block caches defers a hit on that block too.
    cached_this_step: FxHashSet<BlockHash>,
    /// Whether Mamba `align` groups place a prefill checkpoint a block back for EAGLE's
    /// block drop (vLLM 0.33's `MambaManager.drop_eagle_checkpoint_block`; the look-ahead
    /// they also read is `hash_lookahead`, as vLLM's reads its block pool's).
    pub(super) drop_eagle_checkpoint_block: bool,
    /// vLLM 0.33's hash look-ahead (`kv::lookahead`; 0: off).
    pub(super) hash_lookahead: usize,
    /// Each group's block size and the scheduler block size (`coordinator_sizes`).
    sizes: GroupSizes,
    /// Blocks held outside any request (`kv::loose_blocks`).
    loose: LooseBlocks,
    /// Prompt lengths set by request id (`KvCoordinator::set_num_prompt_tokens`).
    prompt_tokens: FxHashMap<R, usize>,
    /// vLLM 0.33's `is_eagle_group` per group (where EAGLE's drop acts) and its
    /// re-prefillable tokens (`coordinator_eagle`).
    eagle: EagleGroups,
    /// Tokens below each window kept though not attended (vLLM 0.33's
    /// `SlidingWindowSpec.extra_retained_tokens`; [`Self::set_window_extra_retained_tokens`]).
    window_extra_retained: usize,
    /// vLLM 0.33's HiSparse connector's pins on the device pool (`coordinator_hisparse_pins`).
    hisparse_pins: Option<Box<hisparse_pins::HiSparsePins<R>>>,
    /// KV cache events and each cache call, when recorded (`coordinator_events`).
    events: Option<Vec<KvEvent>>,
    cache_calls: Option<Vec<CacheCall<R>>>,
    /// Partial entries beside blocks' hashes, recorded with the events only.
    secondary: SecondaryHashes,
}

/// The key a [`KvCoordinator`]'s block of `group` caching `hash` is cached under (its
/// `block_hash`): vLLM's `make_block_hash_with_group_id`.
pub fn group_block_hash(hash: BlockHash, group: usize) -> BlockHash {
    group_key(hash, group)
}

/// A block hash keyed by its group (vLLM appends the group id to the hash bytes).
fn group_key(hash: BlockHash, group: usize) -> BlockHash {
    let mut bytes = [0u8; 24];
    bytes[..16].copy_from_slice(&hash.0.to_le_bytes());
    bytes[16..].copy_from_slice(&(group as u64).to_le_bytes());
    BlockHash(xxh3_128(&bytes))
}

impl<R: RequestKey> KvCoordinator<R> {
    /// A coordinator over `num_blocks` blocks of `block_size` tokens, block 0 of which is
    /// the null block. Mamba groups (not `align`) hold states that are not prefix-cached,
    /// so they need `enable_caching = false` (as vLLM's `mamba_cache_mode="none"` does).
    pub fn new(
        groups: Vec<KvGroupSpec>,
        num_blocks: usize,
        block_size: usize,
        enable_caching: bool,
    ) -> Result<Self> {
        check_num_blocks(num_blocks)?;
        if num_blocks < 2 {
            return Err(Error::config(
                "num_blocks",
                num_blocks,
                "must be at least 2: block 0 is the null block",
            ));
        }
        check_block_size(block_size)?;
        if groups.is_empty() || groups.len() > MAX_NUM_GROUPS {
            return Err(Error::config(
                "groups",
                groups.len(),
                format!("must name between 1 and {MAX_NUM_GROUPS} KV cache groups"),
            ));
        }
        for (i, spec) in groups.iter().enumerate() {
            spec.check("groups", i)?;
            if enable_caching && spec.is_mamba_none() {
                return Err(Error::config(
                    "enable_caching",
                    "True",
                    format!(
                        "groups[{i}] is a Mamba group, whose states are not prefix-cached \
                         (vLLM's mamba_cache_mode='none'); pass enable_caching=False, or \
                         use a Mamba group in align mode"
                    ),
                ));
            }
            if enable_caching && *spec == KvGroupSpec::CrossAttention {
                return Err(Error::config(
                    "enable_caching",
                    "True",
                    format!(
                        "groups[{i}] is a cross-attention group: an encoder-decoder model is \
                         not prefix-cached (vLLM disables it); pass enable_caching=False"
                    ),
                ));
            }
        }
        let mut free_queue = FreeBlockQueue::with_all_blocks(num_blocks)?;
        free_queue.remove(NULL_BLOCK);
        Ok(Self {
            lookup_order: spec_groups(&groups, &vec![block_size; groups.len()]),
            sizes: GroupSizes::uniform(block_size, groups.len()),
            eagle: EagleGroups::every(groups.len()),
            window_extra_retained: 0,
            groups,
            block_size,
            enable_caching,
            blocks: super::try_filled_vec(num_blocks, BlockMeta::default(), "num_blocks")?,
            free_queue,
            withheld: 0,
            cached: CacheMap::new(num_blocks)?,
            requests: FxHashMap::default(),
            stats: BlockPoolStats::default(),
            zeroing: None,
            cached_this_step: FxHashSet::default(),
            drop_eagle_checkpoint_block: false,
            hash_lookahead: 0,
            loose: LooseBlocks::default(),
            prompt_tokens: FxHashMap::default(),
            hisparse_pins: None,
            events: None,
            cache_calls: None,
            secondary: SecondaryHashes::default(),
        })
    }

    /// vLLM's `KVCacheManager.allocate_slots` for `num_new_tokens` tokens to compute (and
    /// `num_lookahead_tokens` slots for speculative ones): first each group frees the
    /// blocks before its window (`remove_skipped_blocks`, null blocks in their place),
    /// then the blocks every group needs are counted against the free blocks, the hit is
    /// taken (its skipped blocks left as nulls), new blocks are allocated group by group,
    /// and newly full computed blocks are cached per group.
    ///
    /// `token_ids` are the request's tokens not yet given (the prompt on admission).
    /// Returns each group's new blocks, or `Ok(None)` when they do not fit: then nothing
    /// changed but the skipped blocks freed in step 1 (as in vLLM: no group attends to
    /// them any more). An `Err` changes nothing.
    pub fn allocate_slots(
        &mut self,
        request_id: &R,
        token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        new_computed: Option<&GroupedComputedBlocks>,
        extra_key: Option<u64>,
    ) -> Result<Option<Vec<Vec<BlockId>>>> {
        self.allocate_slots_in_flight(
            request_id,
            token_ids,
            num_new_tokens,
            num_lookahead_tokens,
            new_computed,
            extra_key,
            0,
            0,
        )
    }

    /// [`Self::allocate_slots`] for a request with `num_in_flight_tokens` of its computed
    /// tokens scheduled in steps the engine has not yet updated (async scheduling): step 1
    /// frees only the blocks no group attends to on the processed-token basis, the
    /// computed tokens less those (vLLM 0.33's `allocate_slots`,
    /// `num_computed_tokens - num_in_flight_tokens`), since a step in flight still reads
    /// the blocks just before its window. With 0 it is `allocate_slots`.
    ///
    /// `num_encoder_tokens` (vLLM's argument of that name) sizes the cross-attention
    /// groups: the encoder tokens of the inputs scheduled with this allocation (0 when
    /// none are: such a group then keeps what it holds).
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_slots_in_flight(
        &mut self,
        request_id: &R,
        token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        new_computed: Option<&GroupedComputedBlocks>,
        extra_key: Option<u64>,
        num_in_flight_tokens: usize,
        num_encoder_tokens: usize,
    ) -> Result<Option<Vec<Vec<BlockId>>>> {
        let (n, lookahead, in_flight) =
            (num_new_tokens, num_lookahead_tokens, num_in_flight_tokens);
        let (computed, key, encoder) = (new_computed, extra_key, num_encoder_tokens);
        let from = (in_flight, encoder, 0);
        self.allocate_slots_from(request_id, token_ids, n, lookahead, computed, key, from)
    }

    /// [`Self::allocate_slots_in_flight`] with `(num_in_flight_tokens, num_encoder_tokens,
    /// num_arrived_computed)`: the last, for a first allocation with no hit, the tokens the
    /// request arrived computed with (`arrival::allocate_slots_arrived`), else 0.
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots_from(
        &mut self,
        request_id: &R,
        token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        new_computed: Option<&GroupedComputedBlocks>,
        extra_key: Option<u64>,
        (num_in_flight_tokens, num_encoder_tokens, num_arrived): (usize, usize, usize),
    ) -> Result<Option<Vec<Vec<BlockId>>>> {
        let existing = self.requests.get(request_id);
        let arrived = existing.is_none() && new_computed.is_none() && num_arrived > 0;
        // vLLM 0.33 allocates no slots for a step that only adopts a hit, or only reserves
        // lookahead slots past it (a chunk ending inside the replayed tail of the hit, SWA
        // bounded replay).
        let adopts_hit =
            existing.is_none() && new_computed.is_some_and(|h| h.num_computed_tokens > 0);
        let only_lookahead = existing.is_some() && num_lookahead_tokens > 0;
        check_allocation(
            request_id,
            num_new_tokens.max(usize::from(adopts_hit || only_lookahead)),
            existing.is_some(),
            new_computed.is_some(),
        )?;
        if let Some(request) = existing {
            let admitted_key = request.tokens.extra_key;
            check_extra_key(extra_key, admitted_key, "request was admitted with")?;
        }
        if let Some(hit) = new_computed {
            self.check_hit_is_current(hit, token_ids.len(), extra_key)?;
        }
        let num_computed = match (existing, new_computed) {
            (Some(request), _) => request.tokens.num_computed_tokens,
            (None, Some(hit)) => hit.num_computed_tokens,
            (None, None) => num_arrived,
        };
        let num_slots = num_computed + num_new_tokens + num_lookahead_tokens;

        self.remove_skipped_blocks(
            request_id,
            num_computed.saturating_sub(num_in_flight_tokens),
        );
        let slots = GroupSlots {
            decoder: num_slots,
            encoder: num_encoder_tokens,
            lookahead: num_lookahead_tokens,
        };
        let (needed, taken) = match arrived {
            true => self.arrival_needs(request_id, slots, num_computed, None),
            false => {
                let n = self.num_blocks_to_allocate(
                    request_id,
                    slots,
                    num_computed,
                    new_computed,
                    None,
                );
                (n, n)
            }
        };
        if needed > self.num_free_blocks() {
            return Ok(None);
        }
        if taken > self.num_free_blocks() {
            return Err(arrival::overdraw(taken, self.num_free_blocks()));
        }
        // Mamba `align` prefill checkpoints are decided on the tables before the hit is
        // taken, as vLLM's `get_num_blocks_to_allocate` records them.
        let checkpoints = self.internal_checkpoints(request_id, slots, num_computed);
        if !self.requests.contains_key(request_id) {
            let request = self.admit(request_id, new_computed, num_computed, extra_key);
            self.requests.insert(request_id.clone(), request);
        }
        let Self {
            groups,
            requests,
            blocks,
            free_queue,
            cached,
            stats,
            block_size,
            enable_caching,
            zeroing,
            cached_this_step,
            sizes,
            eagle,
            hash_lookahead,
            hisparse_pins,
            events,
            cache_calls,
            withheld,
            secondary,
            ..
        } = self;
        let request = requests.get_mut(request_id).expect("inserted above");
        let mut eviction = Eviction {
            secondary: Some(secondary),
            cached,
            events,
            host: &mut None,
            stats,
        };
        let mut new_blocks = Vec::with_capacity(groups.len());
        for (g, (spec, table)) in groups.iter().zip(&mut request.tables).enumerate() {
            let group_size = sizes.groups[g];
            let required =
                hisparse::required_blocks(spec, request.reads_host, slots.of(spec), group_size);
            if spec.is_mamba_align() {
                let checkpoint = checkpoints.get(g).is_some_and(Option::is_some);
                let state = &mut request.align[g];
                let mut take = |n| {
                    (0..n)
                        .map(|_| take_free_block(free_queue, blocks, &mut eviction))
                        .collect::<Vec<_>>()
                };
                new_blocks.push(allocate_align_blocks(
                    table, state, spec, required, checkpoint, &mut take,
                ));
                continue;
            }
            if hisparse_pins.is_some()
                && required > table.len() + free_queue.len().saturating_sub(*withheld)
            {
                return Err(hisparse_pins::no_room_after_lost_pages(
                    g,
                    required - table.len(),
                ));
            }
            let added: Vec<BlockId> = (table.len()..required)
                .map(|_| take_free_block(free_queue, blocks, &mut eviction))
                .collect();
            table.extend_from_slice(&added);
            if let Some(pins) = hisparse_pins.as_deref_mut() {
                pins.blocks_reused(&added, request_id, &mut request.reads_host);
            }
            record_for_zeroing(zeroing, g, spec, &added);
            new_blocks.push(added);
        }
        let (block_size, lookahead) = (*block_size, *hash_lookahead);
        append_tokens(
            block_size,
            *enable_caching,
            lookahead,
            &mut request.tokens,
            token_ids,
        );
        request.tokens.num_computed_tokens += num_new_tokens;
        if *enable_caching {
            cache_full_blocks(
                block_size,
                sizes,
                eagle,
                groups,
                cached,
                blocks,
                request,
                cached_this_step,
                EventSink::of(events, cache_calls, secondary, request_id),
            );
        }
        self.apply_hisparse_reuse();
        Ok(Some(new_blocks))
    }

    /// Steps the request's computed tokens back by `num_tokens` (speculative tokens the
    /// model rejected); their slots stay allocated. Only tokens past the blocks already
    /// cached in some group may be rewound.
    pub fn rewind_computed_tokens(&mut self, request_id: &R, num_tokens: usize) -> Result<()> {
        let (groups, sizes) = (&self.groups, &self.sizes.groups);
        let request = self
            .requests
            .get_mut(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let num_cached_tokens = (groups.iter().zip(&request.num_cached).zip(sizes))
            .filter(|((spec, _), _)| self.enable_caching && spec.caches_blocks())
            .map(|((_, &n), &size)| n * size)
            .max()
            .unwrap_or(0);
        let computed = request.tokens.num_computed_tokens;
        let num_uncached = computed.saturating_sub(num_cached_tokens);
        if num_tokens > num_uncached {
            return Err(Error::input(
                "num_tokens",
                num_tokens,
                format!("only {num_uncached} computed tokens are not yet cached"),
            ));
        }
        request.tokens.num_computed_tokens -= num_tokens;
        Ok(())
    }

    /// New blocks an allocation up to `num_slots` token slots adds to the tables of a
    /// request that holds blocks, over its groups (after `remove_skipped_blocks`, which
    /// never shortens a table); 0 for an unknown request.
    pub fn num_new_blocks(&self, request_id: &R, num_slots: usize) -> usize {
        if !self.requests.contains_key(request_id) {
            return 0;
        }
        self.num_blocks_to_allocate(request_id, GroupSlots::decoder(num_slots), 0, None, None)
    }

    /// vLLM's `get_num_blocks_to_allocate` over the groups: the blocks of the free queue
    /// that `num_tokens` slots of the request take beside what it holds or, not yet held,
    /// beside `hit` and `num_external_tokens` loaded after it (counted as computed: a
    /// window group skips what precedes their window); with `max_in_flight_tokens`, each
    /// window group's need capped as the admission gate caps it (`apply_admission_cap`).
    pub fn blocks_to_allocate(
        &self,
        request_id: &R,
        num_tokens: usize,
        hit: Option<&GroupedComputedBlocks>,
        num_external_tokens: usize,
        max_in_flight_tokens: Option<usize>,
    ) -> usize {
        let num_computed = match (self.requests.get(request_id), hit) {
            (Some(request), _) => request.tokens.num_computed_tokens,
            (None, Some(hit)) => hit.num_computed_tokens + num_external_tokens,
            (None, None) => num_external_tokens,
        };
        let hit = hit.filter(|_| !self.requests.contains_key(request_id));
        let slots = GroupSlots::decoder(num_tokens);
        self.num_blocks_to_allocate(request_id, slots, num_computed, hit, max_in_flight_tokens)
    }

    /// vLLM 0.33's full-sequence admission gate (`allocate_slots` with
    /// `full_sequence_must_fit`): whether `num_tokens` of the request fit in the free
    /// blocks beside what it holds or `hit`, each window group's need capped at
    /// [`KvGroupSpec::max_admission_blocks`] for `max_in_flight_tokens`, cross-attention
    /// groups counted for `num_encoder_tokens` (as in `allocate_slots_in_flight`).
    pub fn full_sequence_fits(
        &self,
        request_id: &R,
        num_tokens: usize,
        hit: Option<&GroupedComputedBlocks>,
        max_in_flight_tokens: usize,
        num_encoder_tokens: usize,
    ) -> bool {
        let num_computed = match (self.requests.get(request_id), hit) {
            (Some(request), _) => request.tokens.num_computed_tokens,
            (None, Some(hit)) => hit.num_computed_tokens,
            (None, None) => 0,
        };
        let hit = hit.filter(|_| !self.requests.contains_key(request_id));
        let slots = GroupSlots {
            encoder: num_encoder_tokens,
            ..GroupSlots::decoder(num_tokens)
        };
        let needed = self.num_blocks_to_allocate(
            request_id,
            slots,
            num_computed,
            hit,
            Some(max_in_flight_tokens),
        );
        needed <= self.num_free_blocks()
    }

    /// Sets whether Mamba `align` groups with prefill checkpoint blocks place a checkpoint
    /// with EAGLE's block drop (vLLM 0.33 sets `MambaManager.drop_eagle_checkpoint_block`
    /// under EAGLE); the hash look-ahead they follow is [`Self::hash_lookahead`].
    pub fn set_mamba_checkpoint_rule(&mut self, drop_eagle_block: bool) {
        self.drop_eagle_checkpoint_block = drop_eagle_block;
    }

    /// A new step begins (vLLM's `new_step_starts`): Mamba `align` states cached before it
    /// may be hit.
    pub fn new_step_starts(&mut self) {
        self.cached_this_step.clear();
    }

    /// Forgets every cached block of every group if no request holds blocks (vLLM's
    /// `reset_prefix_cache`); `false`, changing nothing, otherwise.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if !self.requests.is_empty() || !self.loose.is_empty() {
            return false;
        }
        self.cached.clear();
        self.blocks.iter_mut().for_each(|b| b.cached = false);
        self.secondary.clear();
        self.note_all_cleared();
        true
    }

    /// Releases the request's blocks group by group, in group order, as vLLM's
    /// coordinator does: each group's table without its leading nulls, last block first;
    /// a block left unheld and uncached goes to the front of the free queue, a cached one
    /// to the back (so a later group's uncached blocks are reused before an earlier's).
    pub fn free(&mut self, request_id: &R) -> Result<()> {
        let request = self
            .requests
            .remove(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let tables = self.hisparse_tables_for_free(request_id, request.tables);
        for table in &tables {
            self.free_blocks(table.iter().rev().copied());
        }
        Ok(())
    }

    /// Releases the request's blocks as vLLM 0.33's deferred free does
    /// (`Scheduler._free_request_blocks` pops every group's table, leading nulls trimmed,
    /// in group order with `pop_blocks_for_free`; `_drain_deferred_frees` hands them to one
    /// `BlockPool.free_blocks` call reversed): the last group's last block first, and the
    /// uncached blocks of all groups prepended together. With one group this is [`Self::free`].
    pub fn free_popped(&mut self, request_id: &R) -> Result<()> {
        let request = self
            .requests
            .remove(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let tables = self.hisparse_tables_for_free(request_id, request.tables);
        self.free_blocks(tables.iter().rev().flat_map(|t| t.iter().rev().copied()));
        Ok(())
    }

    /// vLLM's `BlockPool.free_blocks`: `ordered` first-evicted first; null blocks skipped.
    fn free_blocks(&mut self, ordered: impl Iterator<Item = BlockId>) {
        let ordered = ordered.filter(|&b| b != NULL_BLOCK);
        release_blocks(
            &mut self.free_queue,
            &mut self.blocks,
            ordered,
            &mut Vec::new(),
        );
    }

    /// A new request's entry (with its prompt length, if set): per group, the hit's blocks past the skipped ones taken
    /// (their ref counts raised), nulls before them (vLLM's `add_local_computed_blocks`).
    fn admit(
        &mut self,
        request_id: &R,
        hit: Option<&GroupedComputedBlocks>,
        num_computed: usize,
        extra_key: Option<u64>,
    ) -> CoordinatedRequest {
        let num_groups = self.groups.len();
        let mut request = CoordinatedRequest {
            tokens: RequestBlocks {
                block_ids: Vec::new(),
                block_hashes: Vec::new(),
                tail_tokens: Vec::new(),
                num_tokens: 0,
                num_computed_tokens: num_computed,
                num_cached_blocks: 0,
                extra_key,
            },
            tables: vec![Vec::new(); num_groups],
            num_cached: vec![0; num_groups],
            align: vec![AlignState::default(); num_groups],
            reads_host: false,
            num_prompt_tokens: self.prompt_tokens_of(request_id),
        };
        let Some(hit) = hit else {
            return request;
        };
        request.tokens.block_hashes = hit.block_hashes.clone();
        request.tokens.extra_key = hit.query.extra_key;
        let extra = self.window_extra_retained;
        for (g, spec) in self.groups.iter().enumerate() {
            let hit_blocks = &hit.block_ids[g];
            let num_skipped =
                spec.num_skipped_tokens_retaining(num_computed, extra) / self.sizes.groups[g];
            let kept = &hit_blocks[num_skipped.min(hit_blocks.len())..];
            for &block in kept.iter().filter(|&&b| b != NULL_BLOCK) {
                let meta = &mut self.blocks[block as usize];
                if meta.ref_cnt == 0 {
                    self.free_queue.remove(block);
                }
                meta.ref_cnt += 1;
            }
            let table = &mut request.tables[g];
            table.resize(num_skipped, NULL_BLOCK);
            table.extend_from_slice(kept);
            request.num_cached[g] = table.len();
        }
        request
    }
}

impl<R: RequestKey> KvCapacity for KvCoordinator<R> {
    /// Blocks that can hold KV: the pool's, less the null block.
    fn num_total_blocks(&self) -> usize {
        self.blocks.len() - 1
    }

    /// The free queue's blocks less those withheld (`force_num_free_blocks`): the count
    /// vLLM's checks read (`FreeKVCacheBlockQueue.num_free_blocks`).
    fn num_free_blocks(&self) -> usize {
        self.free_queue.len().saturating_sub(self.withheld)
    }
}

impl<R: RequestKey> KvCoordinator<R> {
    /// Forces the free count to `num_free_blocks` as vLLM's tests set
    /// `FreeKVCacheBlockQueue.num_free_blocks` (`BlockPool::force_num_free_blocks`: the
    /// queue keeps its blocks and order; the checks and the count read the forced count,
    /// which then moves with the queue).
    ///
    /// # Errors
    /// `Input` naming `num_free_blocks` above the blocks the queue holds.
    pub fn force_num_free_blocks(&mut self, num_free_blocks: usize) -> Result<()> {
        let free = self.free_queue.len();
        if num_free_blocks > free {
            return Err(Error::input(
                "num_free_blocks",
                num_free_blocks,
                format!("above the {free} blocks the free queue holds"),
            ));
        }
        self.withheld = free - num_free_blocks;
        Ok(())
    }
}

#[path = "coordinator_caching.rs"]
mod caching;
use caching::cache_full_blocks;

#[path = "coordinator_hits.rs"]
mod hits;

#[path = "coordinator_hisparse.rs"]
mod hisparse;

#[path = "coordinator_hisparse_pins.rs"]
mod hisparse_pins;

#[path = "coordinator_loads.rs"]
mod loads;

#[path = "coordinator_needs.rs"]
mod needs;

#[path = "coordinator_align.rs"]
mod align;

#[path = "coordinator_inspect.rs"]
mod inspect;

#[path = "coordinator_loose.rs"]
mod loose;

#[path = "coordinator_sizes.rs"]
mod sizes;

#[path = "coordinator_eagle.rs"]
mod eagle;

#[path = "coordinator_arrival.rs"]
mod arrival;
#[path = "coordinator_events.rs"]
mod events;
#[path = "coordinator_taking.rs"]
mod taking;
use align::{AlignState, allocate_align_blocks};
use eagle::EagleGroups;
use events::EventSink;
pub use loads::{ExternalAllocation, prefix_cacheable};
use sizes::GroupSizes;
use taking::{Taking, record_for_zeroing};

#[cfg(test)]
#[path = "coordinator_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "coordinator_mamba_tests.rs"]
mod mamba_tests;

#[cfg(test)]
#[path = "coordinator_mamba_spec_tests.rs"]
mod mamba_spec_tests;

#[cfg(test)]
#[path = "coordinator_mamba_none_tests.rs"]
mod mamba_none_tests;

#[cfg(test)]
#[path = "coordinator_sizes_tests.rs"]
mod sizes_tests;

#[cfg(test)]
#[path = "coordinator_eagle_tests.rs"]
mod eagle_tests;

#[cfg(test)]
#[path = "coordinator_arrival_tests.rs"]
mod arrival_tests;
