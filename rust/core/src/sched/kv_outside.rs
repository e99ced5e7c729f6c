//! Block tables for requests the scheduler does not schedule: vLLM 0.33's `KVCacheManager`
//! driven directly (`allocate_slots`, `get_block_ids`, `free` on a request never added to
//! the `Scheduler`, as vLLM's own tests seed a prefix cache). They share the scheduler's
//! pool and prefix cache with its requests; the scheduler never schedules, preempts or
//! frees them. Served over several KV groups (the coordinator); each such request has its
//! own pool key near `u32::MAX` (the scheduler's slots count up from 0).

use super::Scheduler;
use crate::kv::{BlockId, RequestKey, TokenId};
use crate::{Error, Result};

impl<R: RequestKey> Scheduler<R> {
    /// vLLM's `allocate_slots(request, num_new_tokens)` for `request_id`, a request the
    /// scheduler does not hold: `token_ids` are its tokens not given before (its prompt on
    /// the first call); its computed tokens become those before plus `num_new_tokens`
    /// (full blocks cached in every group). No prefix hit is adopted. Returns each group's
    /// new blocks, or `None` when they do not fit (nothing changed but what leaves a
    /// group's window, as in vLLM).
    ///
    /// Errors: `ConfigError` (`kv_groups`) without several KV groups; `InputError` for a
    /// request the scheduler holds (its slots come from `schedule()`), or more tokens than
    /// it has.
    pub fn kv_allocate_outside(
        &mut self,
        request_id: &R,
        token_ids: &[TokenId],
        num_new_tokens: usize,
        lora_id: Option<u64>,
    ) -> Result<Option<Vec<Vec<BlockId>>>> {
        self.kv_tables_outside_check(request_id)?;
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

    /// The block table of each KV group of a request [`Self::kv_allocate_outside`] gave
    /// blocks to, `None` for any other.
    pub fn kv_tables_outside(&self, request_id: &R) -> Option<Vec<Vec<BlockId>>> {
        self.kv.block_tables(*self.outside_kv.get(request_id)?)
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

    fn kv_tables_outside_check(&self, request_id: &R) -> Result<()> {
        if self.kv.hybrid_groups().is_none() {
            return Err(Error::config(
                "kv_groups",
                "[]",
                "blocks for a request outside the scheduler need several KV cache groups",
            ));
        }
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
