//! The KV coordinator's read-only views: its groups, counts and stats, a request's block
//! tables and token counts, a block's ref count and cached key, the free queue's order,
//! and the invariant check (O(blocks), for tests and inspection).

use super::{
    BlockHash, BlockId, BlockMeta, BlockPoolStats, KvCoordinator, KvGroupSpec, NULL_BLOCK,
    RequestKey, group_key,
};
use crate::kv::block_ops::{check_cached_count, check_pool_blocks, count_holders};

impl<R: RequestKey> KvCoordinator<R> {
    pub fn groups(&self) -> &[KvGroupSpec] {
        &self.groups
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    /// Lookups, query tokens and hit tokens (hits agreed across groups).
    pub fn stats(&self) -> BlockPoolStats {
        self.stats
    }

    /// Blocks registered in the prefix cache, every group's, held or free.
    pub fn num_cached_blocks(&self) -> usize {
        self.cached.num_blocks()
    }

    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// The request's block table of each group, or `None` if it holds no blocks.
    pub fn block_ids(&self, request_id: &R) -> Option<Vec<&[BlockId]>> {
        let request = self.requests.get(request_id)?;
        Some(request.tables.iter().map(Vec::as_slice).collect())
    }

    pub fn num_computed_tokens(&self, request_id: &R) -> Option<usize> {
        self.requests
            .get(request_id)
            .map(|r| r.tokens.num_computed_tokens)
    }

    /// How many requests hold the block (0 for the null block), or `None` past the pool.
    pub fn ref_count(&self, block: BlockId) -> Option<u32> {
        self.blocks.get(block as usize).map(|m| m.ref_cnt)
    }

    /// Free block ids, next to be handed out first.
    pub fn free_block_ids(&self) -> Vec<BlockId> {
        self.free_queue.iter().collect()
    }

    /// The block of `group` caching the block hash `hash`, if one does (vLLM's
    /// `BlockPool.get_cached_block` for one group).
    pub fn cached_block(&self, hash: BlockHash, group: usize) -> Option<BlockId> {
        self.cached
            .get(&group_key(hash, group), self.blocks.as_slice())
    }

    /// The key a block caches (its hash keyed by its group), `None` if it caches none or
    /// is past the pool.
    pub fn block_hash(&self, block: BlockId) -> Option<BlockHash> {
        self.blocks.get(block as usize).and_then(BlockMeta::hash)
    }

    /// Per group, the request's leading blocks offered to the prefix cache (vLLM's
    /// `num_cached_block`), or `None` if it holds no blocks.
    pub fn num_cached_blocks_of(&self, request_id: &R) -> Option<&[usize]> {
        self.requests
            .get(request_id)
            .map(|r| r.num_cached.as_slice())
    }

    /// The requests the coordinator holds block tables for, in no order.
    pub fn request_ids(&self) -> impl Iterator<Item = &R> {
        self.requests.keys()
    }

    /// Tokens of the request the coordinator knows (given ids), or `None` if it holds none.
    pub fn num_tokens(&self, request_id: &R) -> Option<usize> {
        self.requests.get(request_id).map(|r| r.tokens.num_tokens)
    }

    /// The request's block table of group `group` (null blocks where it no longer
    /// attends), or `None` if it holds no blocks or the group does not exist.
    pub fn group_block_ids(&self, request_id: &R, group: usize) -> Option<&[BlockId]> {
        let request = self.requests.get(request_id)?;
        request.tables.get(group).map(Vec::as_slice)
    }

    /// Describes the first broken invariant, if any. O(blocks + held blocks).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let null = &self.blocks[NULL_BLOCK as usize];
        if null.ref_cnt != 0 || null.cached || self.free_queue.contains(NULL_BLOCK) {
            return Err("the null block is held, cached or free".into());
        }
        let mut holders = vec![0u32; self.blocks.len()];
        for (id, request) in &self.requests {
            let pins = self.hisparse_pins.as_deref();
            let held = (request.tables.iter().enumerate()).flat_map(|(g, table)| {
                (table.iter().enumerate())
                    .filter(move |&(page, _)| !pins.is_some_and(|p| p.unheld(id, g, page)))
                    .map(|(_, &b)| b)
            });
            if count_holders(&mut holders, held.filter(|&b| b != NULL_BLOCK)) {
                return Err(format!("request {id:?} holds a block twice"));
            }
            let computed = request.tokens.num_computed_tokens;
            for (g, (spec, table)) in self.groups.iter().zip(&request.tables).enumerate() {
                // A cross-attention group's slots are encoder tokens, not computed ones.
                let cross = *spec == KvGroupSpec::CrossAttention;
                let size = self.sizes.groups[g];
                if !cross && table.len() < spec.num_required_blocks(computed, size) {
                    return Err(format!(
                        "request {id:?} group {g}: fewer slots than computed tokens"
                    ));
                }
                let num_full = computed.min(request.tokens.num_tokens) / size;
                if self.enable_caching && request.num_cached[g] > num_full.max(table.len()) {
                    return Err(format!("request {id:?} group {g}: cached past its blocks"));
                }
                let retired = request.align[g].retired.min(table.len());
                if table[..retired].iter().any(|&b| b != NULL_BLOCK) {
                    return Err(format!(
                        "request {id:?} group {g}: a retired slot holds a block"
                    ));
                }
            }
        }
        self.loose.count_into(&mut holders);
        if let Some(pins) = self.hisparse_pins.as_deref() {
            pins.count_touched(&mut holders);
        }
        let first_block = NULL_BLOCK as usize + 1;
        check_pool_blocks(
            &self.blocks,
            &self.free_queue,
            &self.cached,
            &holders,
            first_block,
        )?;
        let held = holders.iter().filter(|&&h| h > 0).count();
        if held + self.free_queue.len() + 1 != self.blocks.len() {
            return Err(format!(
                "{held} held + {} free + the null block != {} blocks",
                self.free_queue.len(),
                self.blocks.len()
            ));
        }
        check_cached_count(&self.blocks, &self.cached)
    }
}
