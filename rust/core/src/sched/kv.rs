//! The scheduler's KV memory: vLLM's block-hash pool or SGLang's radix pool, chosen by
//! `SchedulerConfig::prefix_cache`. Both implement [`PrefixPool`]; this enum only picks one
//! (static dispatch, so the step pays no virtual calls) and pairs each hit with its pool.

use crate::kv::{
    BlockId, BlockPool, BlockPoolStats, ComputedBlocks, KvCapacity, KvEvent, PrefixPool, RadixHit,
    RadixPool, TokenId,
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
}

impl Kv {
    pub fn lookup(&mut self, token_ids: &[TokenId], extra_key: Option<u64>) -> Hit {
        match self {
            Kv::BlockHash(p) => Hit::BlockHash(p.lookup(token_ids, extra_key)),
            Kv::Radix(p) => Hit::Radix(p.lookup(token_ids, extra_key)),
        }
    }

    pub fn allocate(
        &mut self,
        slot: u32,
        new_token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        hit: Option<&Hit>,
        extra_key: Option<u64>,
    ) -> Result<Option<Vec<BlockId>>> {
        let (n, lookahead) = (num_new_tokens, num_lookahead_tokens);
        match (self, hit) {
            (Kv::BlockHash(p), None) => {
                PrefixPool::allocate_slots(p, &slot, new_token_ids, n, lookahead, None, extra_key)
            }
            (Kv::BlockHash(p), Some(Hit::BlockHash(h))) => PrefixPool::allocate_slots(
                p,
                &slot,
                new_token_ids,
                n,
                lookahead,
                Some(h),
                extra_key,
            ),
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
            (_, Some(_)) => Err(Error::input(
                "hit",
                slot,
                "comes from the other kind of prefix pool",
            )),
        }
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
