//! The block pool's prefix-hit search (vLLM 0.33's `KVCacheManager.get_computed_blocks`
//! with `BlockPool.get_cached_block`), continued into the host tier, and the check that a
//! hit handed back to `allocate_slots` is still current.
//!
//! Hashes are chained, so the search stops at the first block neither tier holds; a
//! host hit only follows the GPU hit.

use super::{
    BlockHash, BlockMeta, BlockPool, ComputedBlocks, FreeQueue, LookupQuery, RequestKey, TokenId,
    WARM_RUN, hash_block,
};
use crate::{Error, Result};

impl<R: RequestKey, Q: FreeQueue> BlockPool<R, Q> {
    /// The longest run of leading full blocks of `token_ids` that is cached, then the run
    /// of blocks after it that the host tier holds. Never covers the whole prompt (GPU and
    /// host hits together): the last token is always recomputed so the model yields logits.
    /// The host tier's LRU order is left alone: only a load is a use.
    pub fn get_computed_blocks(
        &mut self,
        token_ids: &[TokenId],
        extra_key: Option<u64>,
    ) -> ComputedBlocks {
        self.get_computed_blocks_from(token_ids, extra_key, Vec::new(), usize::MAX)
    }

    /// [`Self::get_computed_blocks`], given `known`: the hashes of the first full blocks of
    /// these token ids under this extra key (from an earlier lookup of the same request,
    /// whose ids only grow). A request that waits at the head of the queue is looked up
    /// again every step; its hashes are not recomputed. The GPU and host hits together are
    /// no longer than `max_hit_tokens` (vLLM's `max_cache_hit_length`).
    pub(crate) fn get_computed_blocks_from(
        &mut self,
        token_ids: &[TokenId],
        extra_key: Option<u64>,
        known: Vec<BlockHash>,
        max_hit_tokens: usize,
    ) -> ComputedBlocks {
        let mut result = ComputedBlocks {
            block_size: self.block_size,
            query: LookupQuery {
                num_tokens: token_ids.len(),
                extra_key,
            },
            ..ComputedBlocks::default()
        };
        if !self.enable_caching {
            return result;
        }
        result.block_hashes = known;
        // Hashes are chained, so no block after the first miss can hit: hash up to it, a
        // run of `WARM_RUN` blocks at a time so that their map slots are read together.
        // Admission reuses these hashes and hashes the rest once (`append_tokens`).
        let bs = self.block_size;
        // With a hash look-ahead, a block is hashed only with the tokens past it.
        let lookahead = self.rules.num_hash_lookahead_tokens;
        let max_hit_blocks = (token_ids.len().saturating_sub(1).min(max_hit_tokens) / bs)
            .min(token_ids.len().saturating_sub(lookahead) / bs);
        // A request retried at the head of the queue brings its hashes: they are probed a
        // run at a time too (read ahead together, and none past the run of the first miss:
        // a long prompt's hundreds of known hashes were all read ahead at every retry).
        let num_known = result.block_hashes.len().min(max_hit_blocks);
        // A run of one trace block's known names is probed at once while the hit is on
        // the GPU (`CacheMap::get_named_run`); the hash it stopped at, and every other
        // hash, one at a time.
        let names_blocks = self.cached.names_blocks();
        let mut warmed = 0;
        let mut i = 0;
        while i < max_hit_blocks {
            let mut named_miss = false;
            if result.num_host_blocks == 0 && i < num_known && names_blocks {
                let hashes = &result.block_hashes[i..num_known];
                match self.cached.get_named_run(hashes, &mut result.block_ids) {
                    Some(0) => named_miss = true,
                    Some(num_hits) => {
                        i += num_hits;
                        continue;
                    }
                    None => {}
                }
            }
            // Nothing is read ahead at a named miss or once the host hit began: past
            // either the GPU hit is over (only the host tier may go on), and each read
            // was a cache miss for nothing.
            let gpu_probes_next = result.num_host_blocks == 0 && !named_miss;
            if i < num_known && i >= warmed && gpu_probes_next {
                warmed = (i + WARM_RUN).min(num_known);
                self.cached.warm(&result.block_hashes[i..warmed]);
            }
            if i == result.block_hashes.len() {
                let end = (i + WARM_RUN).min(max_hit_blocks);
                for b in i..end {
                    let parent = result.block_hashes.last().copied();
                    let block = &token_ids[b * bs..(b + 1) * bs + lookahead];
                    result
                        .block_hashes
                        .push(hash_block(parent, block, extra_key));
                }
                self.cached.warm(&result.block_hashes[i..end]);
            }
            let hash = &result.block_hashes[i];
            if result.num_host_blocks == 0
                && let Some(block_id) = self.cached.get(hash, self.blocks.as_slice())
            {
                result.block_ids.push(block_id);
            } else if self.host.as_ref().is_some_and(|t| t.contains(hash)) {
                result.num_host_blocks += 1;
            } else {
                break;
            }
            i += 1;
        }
        if self.rules.drop_eagle_block {
            crate::kv::lookahead::drop_eagle_block(&mut result);
        }
        result.num_computed_tokens = result.block_ids.len() * self.block_size;
        self.stats
            .record_lookup(token_ids.len(), result.num_computed_tokens);
        self.stats.num_host_hit_tokens += result.num_host_tokens() as u64;
        result
    }

    pub(super) fn check_hit_is_current(
        &self,
        hit: &ComputedBlocks,
        num_token_ids: usize,
        extra_key: Option<u64>,
    ) -> Result<()> {
        hit.query.check_matches(num_token_ids, extra_key)?;
        let stale = hit
            .block_ids
            .iter()
            .zip(&hit.block_hashes)
            .any(|(&b, &h)| self.blocks.get(b as usize).and_then(BlockMeta::hash) != Some(h));
        if stale {
            return Err(Error::input(
                "new_computed_blocks",
                format!("{:?}", hit.block_ids),
                "stale: a hit block was evicted since the lookup",
            ));
        }
        let host_hashes = hit.host_hashes();
        let host_stale = host_hashes.len() != hit.num_host_blocks
            || host_hashes
                .iter()
                .any(|h| !self.host.as_ref().is_some_and(|t| t.contains(h)));
        if host_stale {
            return Err(Error::input(
                "new_computed_blocks",
                format!("{} host blocks", hit.num_host_blocks),
                "stale: a host-hit block left the host tier since the lookup",
            ));
        }
        Ok(())
    }
}
