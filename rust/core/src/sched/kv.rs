//! The scheduler's KV memory: vLLM's block-hash pool or SGLang's radix pool, chosen by
//! `SchedulerConfig::prefix_cache`; an enum so the step pays no dynamic dispatch.

use crate::Result;
use crate::kv::{
    BlockId, BlockPool, BlockPoolStats, ComputedBlocks, KvCapacity, KvEvent, RadixHit, RadixPool,
    TokenId,
};

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

impl Hit {
    pub fn num_computed_tokens(&self) -> usize {
        match self {
            Hit::BlockHash(h) => h.num_computed_tokens,
            Hit::Radix(h) => h.num_computed_tokens,
        }
    }
}

impl Kv {
    pub fn lookup(&mut self, token_ids: &[TokenId], extra_key: Option<u64>) -> Hit {
        match self {
            Kv::BlockHash(p) => Hit::BlockHash(p.get_computed_blocks(token_ids, extra_key)),
            Kv::Radix(p) => Hit::Radix(p.get_computed_blocks(token_ids, extra_key)),
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
        match self {
            Kv::BlockHash(p) => {
                let hit = hit.map(|h| match h {
                    Hit::BlockHash(h) => h,
                    Hit::Radix(_) => unreachable!("a hit comes from the pool it is given to"),
                });
                p.allocate_slots(&slot, new_token_ids, n, lookahead, hit, extra_key)
            }
            Kv::Radix(p) => {
                let hit = hit.map(|h| match h {
                    Hit::Radix(h) => h,
                    Hit::BlockHash(_) => unreachable!("a hit comes from the pool it is given to"),
                });
                p.allocate_slots(&slot, new_token_ids, n, lookahead, hit, extra_key)
            }
        }
    }

    /// Cache events are recorded by the block-hash pool only.
    pub fn enable_events(&mut self) {
        if let Kv::BlockHash(p) = self {
            p.enable_events();
        }
    }

    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        match self {
            Kv::BlockHash(p) => p.drain_events(),
            Kv::Radix(_) => Vec::new(),
        }
    }

    pub fn free(&mut self, slot: u32) -> Result<()> {
        match self {
            Kv::BlockHash(p) => p.free(&slot),
            Kv::Radix(p) => p.free(&slot),
        }
    }

    pub fn rewind(&mut self, slot: u32, num_tokens: usize) -> Result<()> {
        match self {
            Kv::BlockHash(p) => p.rewind_computed_tokens(&slot, num_tokens),
            Kv::Radix(p) => p.rewind_computed_tokens(&slot, num_tokens),
        }
    }

    pub fn num_tokens(&self, slot: u32) -> Option<usize> {
        match self {
            Kv::BlockHash(p) => p.num_tokens(&slot),
            Kv::Radix(p) => p.num_tokens(&slot),
        }
    }

    pub fn num_computed_tokens(&self, slot: u32) -> Option<usize> {
        match self {
            Kv::BlockHash(p) => p.num_computed_tokens(&slot),
            Kv::Radix(p) => p.num_computed_tokens(&slot),
        }
    }

    pub fn block_ids(&self, slot: u32) -> Option<&[BlockId]> {
        match self {
            Kv::BlockHash(p) => p.block_ids(&slot),
            Kv::Radix(p) => p.block_ids(&slot),
        }
    }

    pub fn usage(&self) -> f64 {
        match self {
            Kv::BlockHash(p) => p.usage(),
            Kv::Radix(p) => p.usage(),
        }
    }

    pub fn stats(&self) -> BlockPoolStats {
        match self {
            Kv::BlockHash(p) => p.stats(),
            Kv::Radix(p) => p.stats(),
        }
    }

    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        match self {
            Kv::BlockHash(p) => p.check_invariants(),
            Kv::Radix(p) => p.check_invariants(),
        }
    }
}
