//! `PrefixPool`: what a step scheduler needs of a paged KV pool with a prefix cache. vLLM's
//! block-hash pool and SGLang's radix pool both implement it, so the scheduler is written
//! once against this interface.

use super::free_queue::FreeQueue;
use super::{
    BlockId, BlockPool, BlockPoolStats, ComputedBlocks, KvCapacity, KvEvent, RadixHit, RadixPool,
    RequestKey, TokenId,
};
use crate::Result;

/// A paged KV pool with a prefix cache, keyed by request.
pub trait PrefixPool<R: RequestKey>: KvCapacity {
    /// A prefix found by `lookup`, handed back to `allocate_slots` on admission.
    type Hit;

    /// The longest cached prefix of `token_ids` (never the whole prompt).
    fn lookup(&mut self, token_ids: &[TokenId], extra_key: Option<u64>) -> Self::Hit;
    /// Tokens a hit covers.
    fn hit_tokens(hit: &Self::Hit) -> usize;
    /// Slots for `num_new_tokens` more tokens (plus lookahead); `Ok(None)` when memory does
    /// not suffice, in which case nothing changed (see `BlockPool::allocate_slots`).
    fn allocate_slots(
        &mut self,
        request_id: &R,
        new_token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        hit: Option<&Self::Hit>,
        extra_key: Option<u64>,
    ) -> Result<Option<Vec<BlockId>>>;
    fn free(&mut self, request_id: &R) -> Result<()>;
    fn rewind_computed_tokens(&mut self, request_id: &R, num_tokens: usize) -> Result<()>;
    fn num_tokens(&self, request_id: &R) -> Option<usize>;
    fn num_computed_tokens(&self, request_id: &R) -> Option<usize>;
    fn block_ids(&self, request_id: &R) -> Option<&[BlockId]>;
    fn stats(&self) -> BlockPoolStats;
    fn check_invariants(&self) -> std::result::Result<(), String>;
    /// Starts recording cache events (pools without events ignore it).
    fn enable_events(&mut self) {}
    /// Cache events since the last call.
    fn drain_events(&mut self) -> Vec<KvEvent> {
        Vec::new()
    }
}

/// The methods both pools define under the same names.
macro_rules! delegate_pool {
    () => {
        fn allocate_slots(
            &mut self,
            request_id: &R,
            new_token_ids: &[TokenId],
            num_new_tokens: usize,
            num_lookahead_tokens: usize,
            hit: Option<&Self::Hit>,
            extra_key: Option<u64>,
        ) -> Result<Option<Vec<BlockId>>> {
            Self::allocate_slots(
                self,
                request_id,
                new_token_ids,
                num_new_tokens,
                num_lookahead_tokens,
                hit,
                extra_key,
            )
        }
        fn free(&mut self, request_id: &R) -> Result<()> {
            Self::free(self, request_id)
        }
        fn rewind_computed_tokens(&mut self, request_id: &R, num_tokens: usize) -> Result<()> {
            Self::rewind_computed_tokens(self, request_id, num_tokens)
        }
        fn num_tokens(&self, request_id: &R) -> Option<usize> {
            Self::num_tokens(self, request_id)
        }
        fn num_computed_tokens(&self, request_id: &R) -> Option<usize> {
            Self::num_computed_tokens(self, request_id)
        }
        fn block_ids(&self, request_id: &R) -> Option<&[BlockId]> {
            Self::block_ids(self, request_id)
        }
        fn stats(&self) -> BlockPoolStats {
            Self::stats(self)
        }
        fn check_invariants(&self) -> std::result::Result<(), String> {
            Self::check_invariants(self)
        }
    };
}

impl<R: RequestKey, Q: FreeQueue> PrefixPool<R> for BlockPool<R, Q> {
    type Hit = ComputedBlocks;

    fn lookup(&mut self, token_ids: &[TokenId], extra_key: Option<u64>) -> ComputedBlocks {
        self.get_computed_blocks(token_ids, extra_key)
    }

    fn hit_tokens(hit: &ComputedBlocks) -> usize {
        hit.num_computed_tokens
    }

    delegate_pool!();

    fn enable_events(&mut self) {
        Self::enable_events(self);
    }

    fn drain_events(&mut self) -> Vec<KvEvent> {
        Self::drain_events(self)
    }
}

impl<R: RequestKey> PrefixPool<R> for RadixPool<R> {
    type Hit = RadixHit;

    fn lookup(&mut self, token_ids: &[TokenId], extra_key: Option<u64>) -> RadixHit {
        self.get_computed_blocks(token_ids, extra_key)
    }

    fn hit_tokens(hit: &RadixHit) -> usize {
        hit.num_computed_tokens
    }

    delegate_pool!();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One scheduler-shaped routine over the trait: admit a prompt, free it, admit a second
    /// prompt sharing its first 8 tokens.
    fn shared_prefix_hit<P: PrefixPool<u32>>(pool: &mut P) -> usize {
        let first: Vec<TokenId> = (0..12).collect();
        let hit = pool.lookup(&first, None);
        assert_eq!(P::hit_tokens(&hit), 0);
        let blocks = pool.allocate_slots(&1, &first, 12, 0, Some(&hit), None);
        assert!(blocks.unwrap().is_some());
        pool.free(&1).unwrap();
        let second: Vec<TokenId> = (0..8).chain(100..104).collect();
        let hit = pool.lookup(&second, None);
        let tokens = P::hit_tokens(&hit);
        let blocks = pool.allocate_slots(&2, &second, 12 - tokens, 0, Some(&hit), None);
        assert!(blocks.unwrap().is_some());
        assert_eq!(pool.num_computed_tokens(&2), Some(12));
        pool.check_invariants().unwrap();
        tokens
    }

    #[test]
    fn both_pools_serve_the_same_routine_through_the_trait() {
        let mut blocks = BlockPool::<u32>::new(16, 4, true).unwrap();
        let mut radix = RadixPool::<u32>::new(16, 4).unwrap();
        assert_eq!(shared_prefix_hit(&mut blocks), 8);
        assert_eq!(shared_prefix_hit(&mut radix), 8);
    }
}
