//! The KV pool driven from outside the step, over several KV groups (the coordinator):
//! per-group hits and evictions (vLLM's `coordinator.find_longest_cache_hit_per_group`,
//! `block_pool.evict_blocks`), and block tables for requests the scheduler does not
//! schedule (vLLM 0.33's `KVCacheManager` driven directly: `allocate_slots`,
//! `get_block_ids`, `free` on a request never added to the `Scheduler`, as vLLM's own tests
//! seed a prefix cache). Those share the scheduler's pool and prefix cache with its
//! requests; the scheduler never schedules, preempts or frees them. Each has its own pool
//! key near `u32::MAX` (the scheduler's slots count up from 0).

use super::Scheduler;
use crate::kv::{BlockHash, BlockId, RequestKey, TokenId};
use crate::{Error, Result};

impl<R: RequestKey> Scheduler<R> {
    /// vLLM's `allocate_slots(request, num_new_tokens)` for `request_id`, a request the
    /// scheduler does not hold: `token_ids` are its tokens not given before (its prompt on
    /// the first call); its computed tokens become those before plus `num_new_tokens`
    /// (full blocks cached in every group). No prefix hit is adopted. Returns each group's
    /// new blocks, or `None` when they do not fit (nothing changed but what leaves a
    /// group's window, as in vLLM).
    ///
    /// Errors: `ConfigError` (`kv_groups`) without several KV groups, or
    /// (`hisparse_host_num_blocks`) beside the HiSparse host pool, whose pages it would not
    /// take; `InputError` for a request the scheduler holds (its slots come from
    /// `schedule()`), or more tokens than it has.
    pub fn kv_allocate_outside(
        &mut self,
        request_id: &R,
        token_ids: &[TokenId],
        num_new_tokens: usize,
        lora_id: Option<u64>,
    ) -> Result<Option<Vec<Vec<BlockId>>>> {
        self.kv_tables_outside_check(request_id)?;
        if let Some(pool) = self.hisparse_host_pages() {
            return Err(Error::config(
                "hisparse_host_num_blocks",
                pool.num_blocks,
                "blocks for a request outside the scheduler beside the HiSparse host pool are \
                 not modelled (its host pages would not be taken)",
            ));
        }
        let key = match self.outside_kv.get(request_id) {
            Some(&key) => key,
            // The first key no such request holds (they are few: vLLM's tests hold one).
            None => (0..=self.outside_kv.len() as u32)
                .map(|k| u32::MAX - k)
                .find(|k| !self.outside_kv.values().any(|held| held == k))
                .expect("one of len + 1 keys is free"),
        };
        let known = self.kv.num_tokens(key).unwrap_or(0) + token_ids.len();
        let computed = self.kv.num_computed_tokens(key).unwrap_or(0);
        if computed + num_new_tokens > known {
            return Err(Error::input(
                "num_new_tokens",
                num_new_tokens,
                format!("request {request_id:?} has {known} tokens, {computed} computed"),
            ));
        }
        let allocated =
            (self.kv).allocate(key, token_ids, num_new_tokens, 0, None, lora_id, true)?;
        if allocated.is_none() {
            return Ok(None);
        }
        self.outside_kv.insert(request_id.clone(), key);
        Ok(Some(self.kv.take_group_blocks(key)))
    }

    /// The tokens given and computed of a request [`Self::kv_allocate_outside`] gave blocks
    /// to, `None` for any other.
    pub fn kv_outside_tokens(&self, request_id: &R) -> Option<(usize, usize)> {
        let key = *self.outside_kv.get(request_id)?;
        Some((self.kv.num_tokens(key)?, self.kv.num_computed_tokens(key)?))
    }

    /// vLLM's `free(request)` for a request [`Self::kv_allocate_outside`] gave blocks to:
    /// its blocks go back to the pool (cached ones stay cached). `InputError` for any other.
    pub fn kv_free_outside(&mut self, request_id: &R) -> Result<()> {
        let key =
            (self.outside_kv.get(request_id)).ok_or_else(|| Error::unknown_request(request_id))?;
        self.kv.free(*key)?;
        self.outside_kv.remove(request_id);
        Ok(())
    }

    /// Each KV group's own prefix hit over `block_hashes` (the hashes of a query's first
    /// full blocks, `tokenyard.kv.block_hashes`' values; LoRA-keyed as its requests were),
    /// no longer than `max_length` tokens, not reconciled across groups (vLLM 0.33's
    /// `coordinator.find_longest_cache_hit_per_group`): every group's blocks and hit
    /// length. Nothing is allocated or counted. Errors: `ConfigError` (`kv_groups`)
    /// without several KV groups.
    pub fn kv_hits_per_group(
        &self,
        block_hashes: &[BlockHash],
        max_length: usize,
    ) -> Result<(Vec<Vec<BlockId>>, Vec<usize>)> {
        let pool = self.kv.hybrid_pool("find_longest_cache_hit_per_group")?;
        Ok(pool.find_longest_cache_hit_per_group_hashes(block_hashes, max_length))
    }

    /// Takes `block_ids` out of the prefix cache, held or free (vLLM's
    /// `BlockPool.evict_blocks`). Errors: `ConfigError` (`kv_groups`) without several KV
    /// groups; `InputError` for an id past the pool (nothing changed then).
    pub fn kv_evict_blocks(&mut self, block_ids: &[BlockId]) -> Result<()> {
        self.kv
            .hybrid_pool_mut("evict_blocks")?
            .evict_blocks(block_ids)
    }

    fn kv_tables_outside_check(&self, request_id: &R) -> Result<()> {
        self.kv.hybrid_pool("allocate_slots")?;
        if self.index.contains_key(request_id) || self.transfer_holds.contains_key(request_id) {
            return Err(Error::input(
                "request_id",
                format!("{request_id:?}"),
                "is the scheduler's: its slots are allocated within schedule()",
            ));
        }
        Ok(())
    }
}
