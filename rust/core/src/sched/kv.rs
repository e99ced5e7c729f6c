//! The scheduler's KV memory: vLLM's block-hash pool or SGLang's radix pool, chosen by
//! `SchedulerConfig::prefix_cache`. Both implement [`PrefixPool`]; this enum only picks one
//! (static dispatch, so the step pays no virtual calls) and pairs each hit with its pool.

use crate::kv::{
    BlockHash, BlockId, BlockPool, BlockPoolStats, ComputedBlocks, KvCapacity, KvEvent, PrefixPool,
    RadixHit, RadixPool, TokenId,
};
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub(super) enum Kv {
    BlockHash(BlockPool<u32>),
    Radix(RadixPool<u32>),
}

/// A prefix hit from either pool.
pub(super) enum Hit {
    BlockHash(ComputedBlocks),
    Radix(RadixHit),
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
        }
    };
}

impl Hit {
    pub fn num_computed_tokens(&self) -> usize {
        match self {
            Hit::BlockHash(h) => <BlockPool<u32> as PrefixPool<u32>>::hit_tokens(h),
            Hit::Radix(h) => <RadixPool<u32> as PrefixPool<u32>>::hit_tokens(h),
        }
    }

    /// Tokens after the GPU hit that the pool's host-memory tier holds (loaded, not
    /// computed).
    pub fn num_host_tokens(&self) -> usize {
        match self {
            Hit::BlockHash(h) => h.num_host_tokens(),
            Hit::Radix(_) => 0,
        }
    }
}

impl Kv {
    /// The cached prefix of `token_ids`. `earlier`: this request's previous hit, whose
    /// block hashes are reused (the block-hash pool's; its block ids are looked up again);
    /// without one, `known`: hashes of the first full blocks, if the caller has them.
    pub fn lookup(
        &mut self,
        token_ids: &[TokenId],
        extra_key: Option<u64>,
        earlier: Option<Hit>,
        known: Vec<BlockHash>,
    ) -> Hit {
        match self {
            Kv::BlockHash(p) => {
                let known = match earlier {
                    Some(Hit::BlockHash(hit)) => hit.into_block_hashes(),
                    _ => known,
                };
                Hit::BlockHash(p.get_computed_blocks_from(token_ids, extra_key, known))
            }
            Kv::Radix(p) => Hit::Radix(p.lookup(token_ids, extra_key)),
        }
    }

    /// Slots for the request's new tokens (see `BlockPool::allocate_slots`). The new block
    /// ids come back only `with_ids`; otherwise the vector is empty (and never allocated).
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
        match (self, hit) {
            (Kv::BlockHash(p), hit) => {
                let hit = match hit {
                    None => None,
                    Some(Hit::BlockHash(h)) => Some(h),
                    Some(Hit::Radix(_)) => return Err(other_pool(slot)),
                };
                if with_ids {
                    p.allocate_slots(&slot, new_token_ids, n, lookahead, hit, extra_key)
                } else {
                    let counted = p.allocate_slots_counted(
                        &slot,
                        new_token_ids,
                        n,
                        lookahead,
                        hit,
                        extra_key,
                    )?;
                    Ok(counted.map(|_| Vec::new()))
                }
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
            (_, Some(_)) => Err(other_pool(slot)),
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
        }
    }

    /// The loaded blocks of `slot` have landed: they enter the prefix cache.
    pub fn cache_loaded(&mut self, slot: u32) -> Result<()> {
        match self {
            Kv::BlockHash(p) => p.cache_loaded_blocks(&slot),
            Kv::Radix(_) => Ok(()),
        }
    }

    /// Caches the full blocks of `slot`'s computed tokens, giving the pool its known tokens
    /// past those it has (`BlockPool::cache_blocks`). The radix pool caches at the end.
    pub fn cache_blocks(&mut self, slot: u32, new_token_ids: &[TokenId]) -> Result<()> {
        match self {
            Kv::BlockHash(p) => p.cache_blocks(&slot, new_token_ids),
            Kv::Radix(_) => Ok(()),
        }
    }

    /// Forgets every cached prefix if no request holds blocks (vLLM's
    /// `reset_prefix_cache`); the radix pool answers `false`.
    pub fn reset_prefix_cache(&mut self) -> bool {
        match self {
            Kv::BlockHash(p) => p.reset_prefix_cache(),
            Kv::Radix(_) => false,
        }
    }

    pub fn is_radix(&self) -> bool {
        matches!(self, Kv::Radix(_))
    }

    pub fn enable_events(&mut self) {
        on_pool!(self, p => PrefixPool::<u32>::enable_events(p));
    }

    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        on_pool!(self, p => PrefixPool::<u32>::drain_events(p))
    }

    pub fn free(&mut self, slot: u32) -> Result<()> {
        on_pool!(self, p => PrefixPool::free(p, &slot))
    }

    pub fn rewind(&mut self, slot: u32, num_tokens: usize) -> Result<()> {
        on_pool!(self, p => PrefixPool::rewind_computed_tokens(p, &slot, num_tokens))
    }

    pub fn num_tokens(&self, slot: u32) -> Option<usize> {
        on_pool!(self, p => PrefixPool::num_tokens(p, &slot))
    }

    pub fn num_computed_tokens(&self, slot: u32) -> Option<usize> {
        on_pool!(self, p => PrefixPool::num_computed_tokens(p, &slot))
    }

    pub fn block_ids(&self, slot: u32) -> Option<&[BlockId]> {
        on_pool!(self, p => PrefixPool::block_ids(p, &slot))
    }

    pub fn num_free_blocks(&self) -> usize {
        on_pool!(self, p => p.num_free_blocks())
    }

    pub fn usage(&self) -> f64 {
        on_pool!(self, p => p.usage())
    }

    pub fn stats(&self) -> BlockPoolStats {
        on_pool!(self, p => PrefixPool::<u32>::stats(p))
    }

    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        on_pool!(self, p => PrefixPool::<u32>::check_invariants(p))
    }
}

impl<R: crate::kv::RequestKey> super::Scheduler<R> {
    /// Tokens of `token_ids` the prefix cache holds now, as an admission would find them
    /// (whole cached blocks, never the last token); nothing is allocated or pinned (vLLM's
    /// `KVCacheManager.get_computed_blocks`). The pool's lookup counters count the query.
    pub fn num_cached_prefix_tokens(
        &mut self,
        token_ids: &[TokenId],
        lora_id: Option<u64>,
    ) -> usize {
        self.kv
            .lookup(token_ids, lora_id, None, Vec::new())
            .num_computed_tokens()
    }
}
