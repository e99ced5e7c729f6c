//! EAGLE/EAGLE3/MTP prefix rules beside KV groups of different block sizes (vLLM 0.33's
//! `HybridKVCacheCoordinator` with `use_eagle` or look-ahead hashes over groups whose
//! block sizes differ, e.g. Gemma 4 under an EAGLE drafter).
//!
//! - **The drop's caching** (`get_num_cacheable_tokens`): each group of a drop caches one
//!   of its own blocks past the scheduler block boundary, the block its hits read and drop.
//! - **The drop's window reach** (`SlidingWindowManager.reachable_block_mask` with
//!   `use_eagle`): a window group keeps one contiguous block more before each boundary,
//!   and the run ends one block later (the peek).
//! - **Partial tail-block entries** (`FullAttentionManager._cache_partial_tail_block`): a
//!   full-attention group whose block holds several hash blocks registers the hash at the
//!   prompt's last hash boundary (`num_prompt_tokens`, less one without the drop) on the
//!   block holding it. No lookup here reads such an entry (they serve fine-grained partial
//!   hits, which come only with Mamba `align` groups), but a block not yet fully hashed then
//!   has a hash: it is freed as cached, to the back of the free queue. vLLM registers them
//!   beside differing sizes whatever the drafter; without the drop or a look-ahead the
//!   block is always full and cached by then (the boundary lies below the cacheable,
//!   scheduler-aligned tokens, which are all hashed), so the entry changes nothing and
//!   none is kept, but with the KV cache events on it is recorded beside the block's hash
//!   for them alone (`coordinator_events`).
//!
//! Invariant: a block caches one key, which the cache map holds; a partial entry is kept
//! only on a block that caches nothing else, and leaves when the block is fully cached.

use super::super::{
    BlockMeta, CacheMap, CoordinatedRequest, EventSink, KvCoordinator, KvGroupSpec,
};
use super::super::{NULL_BLOCK, RequestKey, group_key};
use super::GroupSizes;

impl GroupSizes {
    /// Whether full-attention groups keep partial tail-block entries (module docs): beside
    /// differing block sizes, with EAGLE's drop or a hash look-ahead.
    #[inline]
    pub(in super::super) fn keeps_partial_tails(&self) -> bool {
        self.partial_tails
    }
}

/// vLLM's `FullAttentionManager._cache_partial_tail_block` for group `g` of the request,
/// once its full blocks are cached: `cacheable` the tokens the group caches, `hash_block`
/// the hash block size, `drops` whether EAGLE's drop acts in the group (its manager's
/// `use_eagle`). The prompt's last hash boundary (its tokens, less one without the drop,
/// as far as the request is hashed) is keyed on the block holding it when it ends
/// inside that block; the key is kept only if the block caches nothing yet.
#[allow(clippy::too_many_arguments)]
pub(in super::super) fn cache_partial_tail<R: RequestKey>(
    sizes: &GroupSizes,
    g: usize,
    drops: bool,
    hash_block: usize,
    cacheable: usize,
    cached: &mut CacheMap,
    blocks: &mut [BlockMeta],
    request: &mut CoordinatedRequest,
    log: Option<&mut EventSink<'_, R>>,
) {
    let block_size = sizes.groups[g];
    if block_size == hash_block {
        return;
    }
    let tokens = &request.tokens;
    // Without a caller's count, the tokens known at the first caching: the prompt.
    let prompt = *request.num_prompt_tokens.get_or_insert(tokens.num_tokens);
    let limit = if drops {
        prompt
    } else {
        prompt.saturating_sub(1)
    };
    let num_hashes = (limit / hash_block).min(tokens.block_hashes.len());
    let boundary = num_hashes * hash_block;
    if boundary == 0 || boundary > cacheable || boundary.is_multiple_of(block_size) {
        return;
    }
    let Some(&block) = request.tables[g].get(boundary / block_size) else {
        return;
    };
    if block == NULL_BLOCK {
        return;
    }
    let primary = blocks[block as usize].hash();
    let keeps = sizes.keeps_partial_tails();
    if primary.is_none() && !keeps {
        // Not reached: without the drop or a look-ahead the block is cached by now
        // (module docs).
        return;
    }
    let key = group_key(tokens.block_hashes[num_hashes - 1], g);
    if let Some(log) = log {
        log.partial_entry(g, num_hashes - 1, block, key, primary);
    }
    if primary.is_none() {
        cached.insert(key, block, blocks);
        blocks[block as usize].set_hash(key);
    }
}

/// Frees `block`'s partial entry before it is cached in full (vLLM's partial-to-full
/// promotion in `BlockPool.cache_full_blocks`).
#[inline]
pub(in super::super) fn forget_partial(
    cached: &mut CacheMap,
    blocks: &mut [BlockMeta],
    block: u32,
) -> Option<super::super::BlockHash> {
    let old = blocks[block as usize].take_hash()?;
    cached.forget(block, &old);
    Some(old)
}

impl<R: RequestKey> KvCoordinator<R> {
    /// The request's prompt length (vLLM's `num_prompt_tokens`), which places the partial
    /// tail-block entries of full-attention groups beside differing block sizes under
    /// EAGLE's drop or a hash look-ahead (`coordinator_sizes_tail`). Kept for the request
    /// id across its entries (a preempted request's next one reads it) until set again;
    /// without it an entry takes the tokens known when it is first cached. Read by no
    /// other rule.
    pub fn set_num_prompt_tokens(&mut self, request_id: &R, num_prompt_tokens: usize) {
        self.prompt_tokens
            .insert(request_id.clone(), num_prompt_tokens);
        if let Some(request) = self.requests.get_mut(request_id) {
            request.num_prompt_tokens = Some(num_prompt_tokens);
        }
    }

    /// The prompt length set for `request_id` ([`Self::set_num_prompt_tokens`]).
    pub(in super::super) fn prompt_tokens_of(&self, request_id: &R) -> Option<usize> {
        self.prompt_tokens.get(request_id).copied()
    }

    /// Turns the partial tail-block entries on or off after a rule changed (module docs).
    pub(in crate::kv) fn refresh_partial_tails(&mut self) {
        let rules = self.sizes.drop_eagle || self.hash_lookahead > 0;
        self.sizes.partial_tails = rules && self.has_mixed_block_sizes();
    }
}

/// Whether `spec` registers partial tail-block entries (vLLM's `FullAttentionManager`; a
/// window's manager registers none).
#[inline]
pub(in super::super) fn registers_partial_tail(spec: &KvGroupSpec) -> bool {
    spec.is_full_attention()
}

#[cfg(test)]
#[path = "coordinator_sizes_tail_tests.rs"]
mod tests;
