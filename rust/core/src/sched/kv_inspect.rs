//! The scheduler's KV pool seen from outside a step: its blocks, free list, tables and
//! cached prefixes for inspection (O(blocks), not for a step), and the per-step zeroing of
//! new blocks. The pool itself is `sched::kv::Kv`.

use crate::kv::{BlockHash, BlockId, TokenId};
use crate::{Error, Result};

impl<R: crate::kv::RequestKey> super::Scheduler<R> {
    /// The pool slot of a request that holds (or may hold) blocks: a live one, or a
    /// finished one whose blocks a KV transfer holds.
    fn kv_slot(&self, request_id: &R) -> Option<u32> {
        (self.index.get(request_id).copied())
            .or_else(|| self.transfer_holds.get(request_id).map(|&(slot, _)| slot))
            .or_else(|| self.outside_kv.get(request_id).copied())
    }

    /// Per KV block, how many requests hold it and the hash it caches, in block-id order
    /// (the single pool's own ids; with several KV groups block 0 is vLLM's null block).
    /// Empty for the radix pool. O(blocks): for inspection, not for a step.
    pub fn kv_block_states(&self) -> Vec<(u32, Option<BlockHash>)> {
        self.kv.block_states()
    }

    /// Free KV block ids, next to be handed out first. O(free blocks).
    pub fn kv_free_block_ids(&self) -> Vec<BlockId> {
        self.kv.free_block_ids()
    }

    /// The requests holding a block table in the KV pool (live ones, finished ones a KV
    /// transfer holds, and those `kv_allocate_outside` gave blocks), in no order (vLLM's
    /// `req_to_blocks` keys).
    pub fn kv_request_ids(&self) -> Vec<R> {
        let holds = self.transfer_holds.iter().map(|(id, (slot, _))| (id, slot));
        (self.index.iter().chain(holds).chain(&self.outside_kv))
            .filter(|&(_, &slot)| self.kv.num_tokens(slot).is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The request's block table of each KV group (one with a single group), a finished
    /// request's whose blocks a KV transfer holds and one `kv_allocate_outside` gave
    /// blocks included; `None` if it holds none.
    pub fn kv_block_tables(&self, request_id: &R) -> Option<Vec<Vec<BlockId>>> {
        let slot = self.kv_slot(request_id)?;
        // HiSparse's host tables among the groups, at the source group's place.
        let tables = self.kv.block_tables(slot)?;
        Some(super::hisparse::with_host_table(
            &self.host_pages,
            slot,
            tables,
        ))
    }

    /// Per KV group, the request's leading blocks registered in the prefix cache (vLLM's
    /// `num_cached_block`); `None` if it holds no blocks.
    pub fn kv_num_cached_blocks(&self, request_id: &R) -> Option<Vec<usize>> {
        self.kv.num_cached_blocks_of(self.kv_slot(request_id)?)
    }

    /// Tokens of `token_ids` the prefix cache holds now, as an admission would find them
    /// (whole cached blocks, never the last token); nothing is allocated or pinned (vLLM's
    /// `KVCacheManager.get_computed_blocks`). The pool's lookup counters count the query.
    pub fn num_cached_prefix_tokens(
        &mut self,
        token_ids: &[TokenId],
        lora_id: Option<u64>,
    ) -> usize {
        self.kv
            .lookup(token_ids, lora_id, None, Vec::new(), usize::MAX)
            .num_computed_tokens()
    }
}

impl<R: crate::kv::RequestKey> super::Scheduler<R> {
    /// Zeroes new KV blocks before use: each step's are taken by `take_new_block_ids`
    /// (vLLM 0.33's `needs_kv_cache_zeroing`, with Mamba layers or mixed-precision KV
    /// groups; several KV groups only). A load's blocks in the groups it writes are not
    /// zeroed (the connector's `get_loaded_kv_cache_group_ids`).
    ///
    /// Errors: `ConfigError` (`kv_cache_zeroing`) with a single-group pool.
    pub fn set_kv_cache_zeroing(&mut self, on: bool) -> Result<()> {
        self.kv.set_zero_new_blocks(on)
    }

    /// The blocks to zero handed out since the last call, group by group (vLLM's
    /// `SchedulerOutput.new_block_ids_to_zero`); empty without zeroing.
    pub fn take_new_block_ids(&mut self) -> Vec<BlockId> {
        self.kv.take_new_block_ids()
    }

    /// Frees the blocks the request's KV groups no longer attend to on the processed-token
    /// basis (its computed tokens less those of steps in flight), as vLLM 0.33's
    /// `_connector_finished` does before handing a block table to a connector. Returns
    /// each group's table after. Errors: `InputError` for an unknown request.
    pub fn prune_skipped_blocks(&mut self, request_id: &R) -> Result<Vec<Vec<BlockId>>> {
        let slot = *self
            .index
            .get(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let request = self.req(slot);
        let processed =
            (request.num_computed_tokens).saturating_sub(self.num_in_flight_tokens(slot));
        self.kv.prune_skipped_blocks(slot, processed);
        Ok(self.kv.block_tables(slot).unwrap_or_default())
    }
}
