//! The scheduler's KV memory: vLLM's block-hash pool or SGLang's radix pool, chosen by
//! `SchedulerConfig::prefix_cache`, or, for a model with several KV cache groups
//! (`SchedulerConfig::kv_groups`), vLLM's coordinator over one pool. The two single-group
//! pools implement [`PrefixPool`]; this enum only picks one (static dispatch, so the step
//! pays no virtual calls) and pairs each hit with its pool.
//!
//! The coordinator's allocations return a block list per group; the step's output takes
//! them from here (`take_group_blocks`), so the single-group path keeps its flat lists.
//! The calls only the coordinator answers are in `kv_groups`.

use rustc_hash::FxHashMap;

use super::{PrefixCache, SchedulerConfig};
use crate::kv::{
    BlockHash, BlockId, BlockPoolStats, ComputedBlocks, GroupedComputedBlocks, KvCapacity,
    KvCoordinator, KvEvent, PrefixPool, RadixHit, RadixPool, RunBlockPool, TokenId,
};
use crate::{Error, Result};

// One `Kv` per scheduler, never moved in a step: boxing the pool would add a pointer
// to every call on it.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub(super) enum Kv {
    BlockHash(RunBlockPool<u32>),
    Radix(RadixPool<u32>),
    Hybrid(Box<HybridKv>),
}

/// vLLM's KV cache coordinator with what the scheduler keeps beside it.
#[derive(Debug, Clone)]
pub(super) struct HybridKv {
    pub(super) pool: KvCoordinator<u32>,
    /// vLLM 0.33's `max_in_flight_tokens` (`max_concurrent_batches x
    /// max_num_batched_tokens`), which caps a window group's admission need.
    max_in_flight_tokens: usize,
    /// Per slot, each group's blocks allocated this step (only when ids are asked for).
    new_blocks: FxHashMap<u32, Vec<Vec<BlockId>>>,
    /// The encoder tokens of the inputs scheduled with the next allocation (vLLM's
    /// `num_encoder_tokens`, which sizes cross-attention groups): set by
    /// `set_encoder_tokens`, read by `full_sequence_fits`, taken by the allocation.
    encoder_tokens: usize,
}

/// A prefix hit from any pool.
pub(super) enum Hit {
    BlockHash(ComputedBlocks),
    Radix(RadixHit),
    Hybrid(GroupedComputedBlocks),
}

fn no_groups(what: &str) -> Error {
    Error::config(
        "kv_groups",
        "[]",
        format!("{what} needs several KV cache groups (vLLM's hybrid coordinator)"),
    )
}

/// `allocate_slots`' answer from the count of blocks an allocation added (the last ones of
/// the request's table), read only when blocks were added and asked for: a decode step
/// adds none for most requests (one lookup fewer each).
#[inline]
fn new_block_ids(p: &RunBlockPool<u32>, slot: u32, num_new: usize, with_ids: bool) -> Vec<BlockId> {
    if num_new == 0 || !with_ids {
        return Vec::new();
    }
    let table = PrefixPool::block_ids(p, &slot).unwrap_or_default();
    table[table.len() - num_new..].to_vec()
}

fn other_pool(slot: u32) -> Error {
    Error::input("hit", slot, "comes from the other kind of prefix pool")
}

/// Calls the same `PrefixPool` method on whichever pool this is.
macro_rules! on_pool {
    ($kv:expr, $pool:ident => $call:expr) => {
        match $kv {
            Kv::BlockHash($pool) => $call,
            Kv::Radix($pool) => $call,
            Kv::Hybrid(h) => {
                let $pool = &h.pool;
                $call
            }
        }
    };
}

impl Hit {
    pub fn num_computed_tokens(&self) -> usize {
        match self {
            Hit::BlockHash(h) => <RunBlockPool<u32> as PrefixPool<u32>>::hit_tokens(h),
            Hit::Radix(h) => <RadixPool<u32> as PrefixPool<u32>>::hit_tokens(h),
            Hit::Hybrid(h) => h.num_computed_tokens,
        }
    }

    /// vLLM 0.33's `shared_prefix_boundary` of the lookup: the hit plus the tokens some
    /// group caches past it, when there are any; 0 otherwise (and for single-group pools).
    pub fn shared_prefix_boundary(&self) -> usize {
        match self {
            Hit::Hybrid(h) if h.num_uncached_prefix_tokens > 0 => {
                h.num_computed_tokens + h.num_uncached_prefix_tokens
            }
            _ => 0,
        }
    }

    /// Forgets a coordinator hit's blocks (it will not be adopted); other pools' hits are
    /// left as they are (bounded replay exists only with KV groups).
    pub fn drop_hit(&mut self) {
        if let Hit::Hybrid(h) = self {
            h.drop_hit();
        }
    }

    /// Tokens after the GPU hit that the pool's host-memory tier holds (loaded, not
    /// computed).
    pub fn num_host_tokens(&self) -> usize {
        match self {
            Hit::BlockHash(h) => h.num_host_tokens(),
            Hit::Radix(_) | Hit::Hybrid(_) => 0,
        }
    }
}

impl Kv {
    /// The coordinator, for a call (`what`) only it answers.
    pub(super) fn hybrid_pool(&self, what: &str) -> Result<&KvCoordinator<u32>> {
        match self {
            Kv::Hybrid(h) => Ok(&h.pool),
            _ => Err(no_groups(what)),
        }
    }

    pub(super) fn hybrid_pool_mut(&mut self, what: &str) -> Result<&mut KvCoordinator<u32>> {
        match self {
            Kv::Hybrid(h) => Ok(&mut h.pool),
            _ => Err(no_groups(what)),
        }
    }

    /// The pool `config` asks for (checked by `SchedulerConfig::validate_scheduler`).
    /// `async_scheduling` doubles the tokens in flight a window group reserves for.
    pub fn new(config: &SchedulerConfig, async_scheduling: bool) -> Result<Self> {
        if config.is_hybrid() {
            // The coordinator's block 0 is vLLM's null block.
            let num_blocks = config.num_kv_blocks() + 1;
            let (groups, caching) = (config.kv_groups.clone(), config.enable_prefix_caching);
            let mut pool = KvCoordinator::new(groups, num_blocks, config.block_size, caching)?;
            if !config.kv_group_block_sizes.is_empty() {
                pool.set_group_block_sizes(&config.kv_group_block_sizes)?;
            }
            let rules = config.prefix_rules();
            pool.set_hash_lookahead(rules.num_hash_lookahead_tokens)?;
            pool.set_eagle_groups(&config.kv_group_is_eagle)?;
            pool.set_window_extra_retained_tokens(config.kv_window_extra_retained_tokens)?;
            pool.set_eagle_block_drop(rules.drop_eagle_block)?;
            if rules.drop_eagle_block {
                // vLLM's hybrid groups hold them back only where they drop.
                pool.set_num_reprefillable_tokens(rules.num_reprefillable_tokens)?;
            }
            if let Some(split) = &config.mamba_align {
                pool.set_mamba_checkpoint_rule(split.drop_eagle_block);
            }
            let batches = if async_scheduling { 2 } else { 1 };
            return Ok(Kv::Hybrid(Box::new(HybridKv {
                pool,
                max_in_flight_tokens: batches * config.max_num_batched_tokens,
                new_blocks: FxHashMap::default(),
                encoder_tokens: 0,
            })));
        }
        Ok(match (config.enable_prefix_caching, config.prefix_cache) {
            (true, PrefixCache::Radix) => {
                Kv::Radix(RadixPool::new(config.num_kv_blocks(), config.block_size)?)
            }
            (caching, _) => {
                let (num_blocks, block_size) = (config.num_kv_blocks(), config.block_size);
                let mut pool = RunBlockPool::over_runs(num_blocks, block_size, caching)?;
                pool.set_prefix_rules(config.prefix_rules())?;
                Kv::BlockHash(match config.host_num_blocks {
                    0 => pool,
                    n => pool.with_host_tier(n)?,
                })
            }
        })
    }

    /// The cached prefix of `token_ids`. `earlier`: this request's previous hit, whose
    /// block hashes are reused (the block-hash pool's and the coordinator's; its block ids
    /// are looked up again);
    /// without one, `known`: hashes of the first full blocks, if the caller has them. The
    /// hit is no longer than `max_hit_tokens` (vLLM's `max_cache_hit_length`; the radix
    /// pool, which serves no auxiliary-output connector, ignores it).
    pub fn lookup(
        &mut self,
        token_ids: &[TokenId],
        extra_key: Option<u64>,
        earlier: Option<Hit>,
        known: Vec<BlockHash>,
        max_hit_tokens: usize,
    ) -> Hit {
        match self {
            Kv::BlockHash(p) => {
                let known = match earlier {
                    Some(Hit::BlockHash(hit)) => hit.into_block_hashes(),
                    _ => known,
                };
                Hit::BlockHash(p.get_computed_blocks_from(
                    token_ids,
                    extra_key,
                    known,
                    max_hit_tokens,
                ))
            }
            Kv::Radix(p) => Hit::Radix(p.lookup(token_ids, extra_key)),
            Kv::Hybrid(h) => {
                let known = match earlier {
                    Some(Hit::Hybrid(hit)) => hit.into_block_hashes(),
                    _ => known,
                };
                Hit::Hybrid((h.pool).get_computed_blocks_from(
                    token_ids,
                    extra_key,
                    known,
                    max_hit_tokens,
                ))
            }
        }
    }

    /// [`Self::lookup`] beside a connector that restores lagging recurrent states (vLLM
    /// 0.33's `get_computed_blocks_for_connector`, `KvCoordinator`'s): with a Mamba group
    /// beside full attention, full attention's hit and whether another group lags behind it
    /// (then the caller reconciles, [`Self::lookup`], if the connector loads nothing past
    /// it, or counts the hit it keeps, [`Self::record_kept_lookup`]). Other pools:
    /// [`Self::lookup`], not diverged.
    pub fn lookup_for_connector(
        &mut self,
        token_ids: &[TokenId],
        extra_key: Option<u64>,
        earlier: Option<Hit>,
        known: Vec<BlockHash>,
        max_hit_tokens: usize,
    ) -> (Hit, bool) {
        let Kv::Hybrid(h) = self else {
            return (
                self.lookup(token_ids, extra_key, earlier, known, max_hit_tokens),
                false,
            );
        };
        let known = match earlier {
            Some(Hit::Hybrid(hit)) => hit.into_block_hashes(),
            _ => known,
        };
        let (hit, diverged) =
            (h.pool).get_computed_blocks_for_connector(token_ids, extra_key, known, max_hit_tokens);
        (Hit::Hybrid(hit), diverged)
    }

    /// Hashes with `lookahead` tokens past each block from now on (`sched::prefix_rules`).
    /// The pool's other rules stay as built (vLLM 0.33's coordinator reads
    /// `num_reprefillable_tokens` once; the scheduler's `num_prefill_lookahead` may be
    /// assigned apart). Errors as the pools' setters.
    pub fn set_hash_lookahead(&mut self, lookahead: usize) -> Result<()> {
        match self {
            Kv::BlockHash(p) => {
                let rules = p.prefix_rules();
                p.set_prefix_rules(crate::kv::PrefixRules {
                    num_hash_lookahead_tokens: lookahead,
                    ..rules
                })
            }
            Kv::Hybrid(h) => (h.pool).set_hash_lookahead(lookahead),
            Kv::Radix(_) => Ok(()),
        }
    }

    /// A step begins: Mamba `align` states cached before it may be hit (vLLM's
    /// `new_step_starts`); nothing for the single-group pools.
    pub fn new_step_starts(&mut self) {
        if let Kv::Hybrid(h) = self {
            h.pool.new_step_starts();
        }
    }

    /// Counts a diverged coordinator hit the caller keeps in the lookup stats
    /// ([`Self::lookup_for_connector`] leaves it uncounted); other pools count their own.
    pub fn record_kept_lookup(&mut self, num_query_tokens: usize, hit: &Hit) {
        if let Kv::Hybrid(h) = self {
            h.pool
                .record_lookup(num_query_tokens, hit.num_computed_tokens());
        }
    }

    /// The first allocation of a request that arrived with `num_computed` computed tokens:
    /// slots for those and `num_new_tokens` more. The single-group pool gives them as new
    /// slots from 0 (vLLM's count and allocation agree there); several groups go through
    /// `KvCoordinator::allocate_slots_arrived` (vLLM's count skips what a window has left).
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_arrived(
        &mut self,
        slot: u32,
        token_ids: &[TokenId],
        num_computed: usize,
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        extra_key: Option<u64>,
        with_ids: bool,
    ) -> Result<Option<Vec<BlockId>>> {
        let Kv::Hybrid(h) = self else {
            let (n, lookahead) = (num_computed + num_new_tokens, num_lookahead_tokens);
            return self.allocate(slot, token_ids, n, lookahead, None, extra_key, with_ids);
        };
        let encoder = std::mem::take(&mut h.encoder_tokens);
        let (n, lookahead) = (num_new_tokens, num_lookahead_tokens);
        let allocated = (h.pool).allocate_slots_arrived(
            &slot,
            token_ids,
            num_computed,
            n,
            lookahead,
            extra_key,
            encoder,
        )?;
        Ok(allocated.map(|groups| {
            if with_ids {
                h.new_blocks.insert(slot, groups);
            }
            Vec::new()
        }))
    }

    /// [`Self::full_sequence_fits`] for a request that arrived with `num_computed` tokens
    /// and holds nothing (with several groups a window's count skips what it has left).
    pub fn full_sequence_fits_arrived(
        &self,
        slot: u32,
        num_tokens: usize,
        num_computed: usize,
    ) -> bool {
        match self {
            Kv::Hybrid(h) => {
                let (in_flight, encoder) = (h.max_in_flight_tokens, h.encoder_tokens);
                (h.pool).full_sequence_fits_arrived(
                    &slot,
                    num_tokens,
                    num_computed,
                    in_flight,
                    encoder,
                )
            }
            _ => self.full_sequence_fits(slot, num_tokens, None),
        }
    }

    /// Slots for the request's new tokens (see `BlockPool::allocate_slots`). The new block
    /// ids come back only `with_ids`; otherwise the vector is empty (and never allocated).
    /// With several groups the vector is empty too: each group's new blocks wait in
    /// `take_group_blocks`.
    #[allow(clippy::too_many_arguments)]
    pub fn allocate(
        &mut self,
        slot: u32,
        new_token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        hit: Option<&Hit>,
        extra_key: Option<u64>,
        with_ids: bool,
    ) -> Result<Option<Vec<BlockId>>> {
        let (n, lookahead) = (num_new_tokens, num_lookahead_tokens);
        self.allocate_in_flight(
            slot,
            new_token_ids,
            n,
            lookahead,
            hit,
            extra_key,
            with_ids,
            0,
        )
    }

    /// [`Self::allocate`] for a request with `num_in_flight_tokens` of its computed tokens
    /// in steps not yet updated: window groups free blocks on the processed-token basis
    /// (`KvCoordinator::allocate_slots_in_flight`); single-group pools ignore it.
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_in_flight(
        &mut self,
        slot: u32,
        new_token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        hit: Option<&Hit>,
        extra_key: Option<u64>,
        with_ids: bool,
        num_in_flight_tokens: usize,
    ) -> Result<Option<Vec<BlockId>>> {
        let (n, lookahead) = (num_new_tokens, num_lookahead_tokens);
        match (self, hit) {
            (Kv::BlockHash(p), hit) => {
                let hit = match hit {
                    None => None,
                    Some(Hit::BlockHash(h)) => Some(h),
                    Some(_) => return Err(other_pool(slot)),
                };
                let counted =
                    p.allocate_slots_counted(&slot, new_token_ids, n, lookahead, hit, extra_key)?;
                Ok(counted.map(|num_new| new_block_ids(p, slot, num_new, with_ids)))
            }
            (Kv::Radix(p), None) => {
                PrefixPool::allocate_slots(p, &slot, new_token_ids, n, lookahead, None, extra_key)
            }
            (Kv::Radix(p), Some(Hit::Radix(h))) => PrefixPool::allocate_slots(
                p,
                &slot,
                new_token_ids,
                n,
                lookahead,
                Some(h),
                extra_key,
            ),
            (Kv::Hybrid(h), hit) => {
                let hit = match hit {
                    None => None,
                    Some(Hit::Hybrid(h)) => Some(h),
                    Some(_) => return Err(other_pool(slot)),
                };
                let allocated = (h.pool).allocate_slots_in_flight(
                    &slot,
                    new_token_ids,
                    n,
                    lookahead,
                    hit,
                    extra_key,
                    num_in_flight_tokens,
                    std::mem::take(&mut h.encoder_tokens),
                )?;
                Ok(allocated.map(|groups| {
                    if with_ids {
                        match h.new_blocks.get_mut(&slot) {
                            Some(earlier) => earlier
                                .iter_mut()
                                .zip(groups)
                                .for_each(|(e, g)| e.extend(g)),
                            None => {
                                h.new_blocks.insert(slot, groups);
                            }
                        }
                    }
                    Vec::new()
                }))
            }
            (_, Some(_)) => Err(other_pool(slot)),
        }
    }

    /// [`Self::allocate_in_flight`] without a hit or an extra key, given the request's
    /// whole token list `token_ids`: the new tokens are those past what the pool knows of
    /// it. The block-hash pool reads that count from the entry it looks up to allocate (a
    /// running request's step looked it up once more for it); the others are asked first.
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_after_known(
        &mut self,
        slot: u32,
        token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        with_ids: bool,
        num_in_flight_tokens: usize,
    ) -> Result<Option<Vec<BlockId>>> {
        let (n, lookahead) = (num_new_tokens, num_lookahead_tokens);
        if let Kv::BlockHash(p) = self {
            let counted = p.allocate_slots_after_known(&slot, token_ids, n, lookahead, None)?;
            return Ok(counted.map(|num_new| new_block_ids(p, slot, num_new, with_ids)));
        }
        let known = self.num_tokens(slot).unwrap_or(0);
        let new_token_ids = &token_ids[known..];
        let in_flight = num_in_flight_tokens;
        self.allocate_in_flight(
            slot,
            new_token_ids,
            n,
            lookahead,
            None,
            None,
            with_ids,
            in_flight,
        )
    }

    /// Blocks of the free queue that `num_tokens` slots of `slot` take beside what it holds
    /// or `hit` and `num_loaded` tokens loaded after it (vLLM's
    /// `get_num_blocks_to_allocate`, loaded tokens counted as computed); with `capped`,
    /// window groups count at most vLLM's admission cap (`apply_admission_cap`, as
    /// `_request_remaining_blocks` counts them). The radix pool, which vLLM does not have,
    /// counts 0.
    pub fn num_blocks_to_allocate(
        &self,
        slot: u32,
        num_tokens: usize,
        hit: Option<&Hit>,
        num_loaded: usize,
        capped: bool,
    ) -> usize {
        match (self, hit) {
            (Kv::BlockHash(p), Some(Hit::BlockHash(h))) => {
                p.num_blocks_to_allocate(&slot, num_tokens, Some(h))
            }
            (Kv::BlockHash(p), _) => p.num_blocks_to_allocate(&slot, num_tokens, None),
            (Kv::Hybrid(h), hit) => {
                let hit = match hit {
                    Some(Hit::Hybrid(g)) => Some(g),
                    _ => None,
                };
                let cap = capped.then_some(h.max_in_flight_tokens);
                h.pool
                    .blocks_to_allocate(&slot, num_tokens, hit, num_loaded, cap)
            }
            (Kv::Radix(_), _) => 0,
        }
    }

    /// vLLM 0.33's `_request_remaining_blocks`: [`Self::num_blocks_to_allocate`] (capped)
    /// for `num_tokens` and `num_spec_slots` of one speculative step, which a Mamba align
    /// group does not count (`KvCoordinator::remaining_blocks`).
    pub fn remaining_blocks(&self, slot: u32, num_tokens: usize, num_spec_slots: usize) -> usize {
        match self {
            Kv::Hybrid(h) => {
                (h.pool).remaining_blocks(&slot, num_tokens, num_spec_slots, h.max_in_flight_tokens)
            }
            _ => self.num_blocks_to_allocate(slot, num_tokens + num_spec_slots, None, 0, true),
        }
    }

    /// Slots for a first allocation whose `num_external_tokens` after the hit (and the hit's
    /// host-tier part) are loaded, not computed (`BlockPool::allocate_slots_external`);
    /// `false` if they do not fit (nothing changed). Connectors need the block-hash pool.
    pub fn allocate_external(
        &mut self,
        slot: u32,
        token_ids: &[TokenId],
        num_external_tokens: usize,
        hit: &Hit,
        extra_key: Option<u64>,
    ) -> Result<bool> {
        match (self, hit) {
            (Kv::BlockHash(p), Hit::BlockHash(h)) => Ok(p
                .allocate_slots_external(&slot, token_ids, num_external_tokens, Some(h), extra_key)?
                .is_some()),
            (Kv::Hybrid(h), _) => Err(Error::config(
                "kv_groups",
                format!("{:?}", h.pool.groups()),
                "KV connectors and loads need a single full-attention group",
            )),
            _ => Err(Error::config(
                "prefix_cache",
                "radix",
                "KV connectors and loads need the block-hash pool (prefix_cache = \"block_hash\")",
            )),
        }
    }

    /// Whether `num_tokens` of request `slot` fit beside what it holds or hits (vLLM 0.33's
    /// `scheduler_reserve_full_isl`; the radix pool, which vLLM does not have, never refuses).
    pub fn full_sequence_fits(&self, slot: u32, num_tokens: usize, hit: Option<&Hit>) -> bool {
        match (self, hit) {
            (Kv::BlockHash(p), Some(Hit::BlockHash(h))) => {
                p.full_sequence_fits(&slot, num_tokens, Some(h))
            }
            (Kv::BlockHash(p), _) => p.full_sequence_fits(&slot, num_tokens, None),
            (Kv::Radix(_), _) => true,
            (Kv::Hybrid(h), hit) => {
                let hit = match hit {
                    Some(Hit::Hybrid(g)) => Some(g),
                    _ => None,
                };
                let (in_flight, encoder) = (h.max_in_flight_tokens, h.encoder_tokens);
                (h.pool).full_sequence_fits(&slot, num_tokens, hit, in_flight, encoder)
            }
        }
    }

    /// [`Self::full_sequence_fits`] for an admission that also loads `num_external_tokens`
    /// after `hit` (with several KV groups they shorten what a window group needs; a single
    /// pool needs blocks for them all the same).
    pub fn full_sequence_fits_loaded(
        &self,
        slot: u32,
        num_tokens: usize,
        hit: &Hit,
        num_external_tokens: usize,
    ) -> bool {
        match (self, hit) {
            (Kv::Hybrid(h), Hit::Hybrid(g)) => (h.pool).full_sequence_fits_external(
                &slot,
                num_tokens,
                Some(g),
                num_external_tokens,
                h.max_in_flight_tokens,
            ),
            _ => self.full_sequence_fits(slot, num_tokens, Some(hit)),
        }
    }

    /// The loaded blocks of `slot` have landed: they enter the prefix cache.
    pub fn cache_loaded(&mut self, slot: u32) -> Result<()> {
        match self {
            Kv::BlockHash(p) => p.cache_loaded_blocks(&slot),
            Kv::Hybrid(h) => h.pool.cache_blocks(&slot, &[]),
            Kv::Radix(_) => Ok(()),
        }
    }

    /// Caches the full blocks of `slot`'s computed tokens, giving the pool its known tokens
    /// past those it has (`BlockPool::cache_blocks`). The radix pool caches at the end.
    pub fn cache_blocks(&mut self, slot: u32, new_token_ids: &[TokenId]) -> Result<()> {
        match self {
            Kv::BlockHash(p) => p.cache_blocks(&slot, new_token_ids),
            Kv::Hybrid(h) => h.pool.cache_blocks(&slot, new_token_ids),
            Kv::Radix(_) => Ok(()),
        }
    }

    /// [`Self::cache_blocks`] with the request's tokens `ahead` of `new_token_ids`, which
    /// complete look-ahead hashes (`kv::lookahead`).
    pub fn cache_blocks_ahead(
        &mut self,
        slot: u32,
        new_token_ids: &[TokenId],
        ahead: &[TokenId],
    ) -> Result<()> {
        match self {
            Kv::BlockHash(p) => p.cache_blocks_ahead(&slot, new_token_ids, ahead),
            Kv::Hybrid(h) => h.pool.cache_blocks_ahead(&slot, new_token_ids, ahead),
            Kv::Radix(_) => Ok(()),
        }
    }

    /// Forgets every cached prefix if no request holds blocks (vLLM's
    /// `reset_prefix_cache`); the radix pool answers `false`.
    pub fn reset_prefix_cache(&mut self) -> bool {
        match self {
            Kv::BlockHash(p) => p.reset_prefix_cache(),
            Kv::Hybrid(h) => h.pool.reset_prefix_cache(),
            Kv::Radix(_) => false,
        }
    }

    pub fn is_radix(&self) -> bool {
        matches!(self, Kv::Radix(_))
    }

    /// Whether this is the single-group block-hash pool (what decode windows and KV
    /// connectors need).
    pub fn is_block_hash(&self) -> bool {
        matches!(self, Kv::BlockHash(_))
    }

    /// The coordinator records no cache events: routers reading them see none (the
    /// simulator refuses KV-event routing with KV groups).
    pub fn enable_events(&mut self) {
        match self {
            Kv::BlockHash(p) => PrefixPool::<u32>::enable_events(p),
            Kv::Radix(p) => PrefixPool::<u32>::enable_events(p),
            Kv::Hybrid(_) => {}
        }
    }

    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        match self {
            Kv::BlockHash(p) => PrefixPool::<u32>::drain_events(p),
            Kv::Radix(p) => PrefixPool::<u32>::drain_events(p),
            Kv::Hybrid(h) => h.pool.drain_events(),
        }
    }

    /// Records each cache call beside the events (`kv::event_log`, `coordinator_events`):
    /// ConfigError (`kv_events`) for the radix pool and for the KV cache groups the
    /// coordinator does not record.
    pub fn enable_cache_calls(&mut self) -> Result<()> {
        match self {
            Kv::BlockHash(p) => {
                p.enable_cache_calls();
                Ok(())
            }
            Kv::Hybrid(h) => h.pool.enable_cache_calls(),
            Kv::Radix(_) => Err(Error::config(
                "kv_events",
                "detailed",
                "cache calls are not recorded by the radix pool",
            )),
        }
    }

    /// The cache calls since the last drain, by slot (drain the events with them).
    pub fn drain_cache_calls(&mut self) -> Vec<crate::kv::CacheCall<u32>> {
        match self {
            Kv::BlockHash(p) => p.drain_cache_calls(),
            Kv::Hybrid(h) => h.pool.drain_cache_calls(),
            Kv::Radix(_) => Vec::new(),
        }
    }

    pub fn free(&mut self, slot: u32) -> Result<()> {
        match self {
            Kv::BlockHash(p) => PrefixPool::free(p, &slot),
            Kv::Radix(p) => PrefixPool::free(p, &slot),
            Kv::Hybrid(h) => {
                h.new_blocks.remove(&slot);
                h.pool.free(&slot)
            }
        }
    }

    /// [`Self::free`] for blocks whose free was deferred to a fence: with several groups,
    /// one release of all groups' blocks, last first (vLLM's `_drain_deferred_frees`).
    pub fn free_popped(&mut self, slot: u32) -> Result<()> {
        match self {
            Kv::Hybrid(h) => {
                h.new_blocks.remove(&slot);
                h.pool.free_popped(&slot)
            }
            _ => self.free(slot),
        }
    }

    pub fn rewind(&mut self, slot: u32, num_tokens: usize) -> Result<()> {
        match self {
            Kv::BlockHash(p) => PrefixPool::rewind_computed_tokens(p, &slot, num_tokens),
            Kv::Radix(p) => PrefixPool::rewind_computed_tokens(p, &slot, num_tokens),
            Kv::Hybrid(h) => h.pool.rewind_computed_tokens(&slot, num_tokens),
        }
    }

    pub fn num_tokens(&self, slot: u32) -> Option<usize> {
        match self {
            Kv::BlockHash(p) => PrefixPool::num_tokens(p, &slot),
            Kv::Radix(p) => PrefixPool::num_tokens(p, &slot),
            Kv::Hybrid(h) => h.pool.num_tokens(&slot),
        }
    }

    pub fn num_computed_tokens(&self, slot: u32) -> Option<usize> {
        match self {
            Kv::BlockHash(p) => PrefixPool::num_computed_tokens(p, &slot),
            Kv::Radix(p) => PrefixPool::num_computed_tokens(p, &slot),
            Kv::Hybrid(h) => h.pool.num_computed_tokens(&slot),
        }
    }

    /// The request's block table; with several KV groups, group 0's (`group_block_ids`
    /// has them all). `None` if it holds no blocks.
    pub fn block_ids(&self, slot: u32) -> Option<&[BlockId]> {
        match self {
            Kv::BlockHash(p) => PrefixPool::block_ids(p, &slot),
            Kv::Radix(p) => PrefixPool::block_ids(p, &slot),
            Kv::Hybrid(h) => h.pool.group_block_ids(&slot, 0),
        }
    }

    pub fn num_free_blocks(&self) -> usize {
        on_pool!(self, p => p.num_free_blocks())
    }

    /// Forces the free count the fit checks read (`BlockPool::force_num_free_blocks`);
    /// refused for the radix pool, which keeps no free queue.
    pub fn force_num_free_blocks(&mut self, num_free_blocks: usize) -> Result<()> {
        match self {
            Kv::BlockHash(p) => p.force_num_free_blocks(num_free_blocks),
            Kv::Radix(_) => Err(crate::Error::input(
                "num_free_blocks",
                num_free_blocks,
                "the radix pool keeps no free-block queue to force",
            )),
            Kv::Hybrid(h) => h.pool.force_num_free_blocks(num_free_blocks),
        }
    }

    pub fn usage(&self) -> f64 {
        on_pool!(self, p => p.usage())
    }

    pub fn stats(&self) -> BlockPoolStats {
        match self {
            Kv::BlockHash(p) => PrefixPool::<u32>::stats(p),
            Kv::Radix(p) => PrefixPool::<u32>::stats(p),
            Kv::Hybrid(h) => h.pool.stats(),
        }
    }
}

#[path = "kv_groups.rs"]
mod groups;

#[path = "kv_reads.rs"]
mod reads;
