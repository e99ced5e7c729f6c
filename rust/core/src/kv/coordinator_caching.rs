//! Caching a coordinator request's full blocks in every group (vLLM 0.33's
//! `KVCacheCoordinator.cache_blocks` and each manager's `cache_blocks`).

use rustc_hash::FxHashSet;

use super::{
    BlockHash, CoordinatedRequest, EagleGroups, EventSink, GroupSizes, KvCoordinator, KvGroupSpec,
    NULL_BLOCK, RequestKey, TokenId, group_key, sizes,
};
use crate::kv::block_ops::{BlockMeta, append_tokens};
use crate::kv::cache_map::CacheMap;
use crate::{Error, Result};

impl<R: RequestKey> KvCoordinator<R> {
    /// Gives the coordinator the request's `new_token_ids` (known now, past those it has)
    /// and caches its full computed blocks in every group, without allocating (vLLM's
    /// `cache_blocks`).
    pub fn cache_blocks(&mut self, request_id: &R, new_token_ids: &[TokenId]) -> Result<()> {
        self.cache_blocks_ahead(request_id, new_token_ids, &[])
    }

    /// [`Self::cache_blocks`] with the request's tokens `ahead` of `new_token_ids`, for a
    /// hash look-ahead (`BlockPool::cache_blocks_ahead`).
    pub fn cache_blocks_ahead(
        &mut self,
        request_id: &R,
        new_token_ids: &[TokenId],
        ahead: &[TokenId],
    ) -> Result<()> {
        let request = self
            .requests
            .get_mut(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let (block_size, lookahead) = (self.block_size, self.hash_lookahead);
        let tokens = &mut request.tokens;
        append_tokens(
            block_size,
            self.enable_caching,
            lookahead,
            tokens,
            new_token_ids,
        );
        if self.enable_caching {
            crate::kv::lookahead::hash_ahead(block_size, lookahead, tokens, ahead);
            cache_full_blocks(
                self.block_size,
                &self.sizes,
                &self.eagle,
                &self.groups,
                &mut self.cached,
                &mut self.blocks,
                request,
                &mut self.cached_this_step,
                EventSink::of(
                    &mut self.events,
                    &mut self.cache_calls,
                    &mut self.secondary,
                    request_id,
                ),
            );
        }
        Ok(())
    }
}

/// vLLM's `cache_blocks` per group: the request's full blocks of computed, known tokens
/// (below the scheduler block size's last boundary, `_align_cacheable`) past those already
/// offered are cached under (hash, group); null blocks are skipped. A group whose blocks
/// hold several hash blocks (`block_size`) caches each under its last one's hash. Under
/// EAGLE's drop a flagged group holds back re-prefillable tokens (`eagle`). With `log`,
/// each group's call is recorded as vLLM's block pool publishes it (`coordinator_events`).
#[allow(clippy::too_many_arguments)]
pub(super) fn cache_full_blocks<R: RequestKey>(
    block_size: usize,
    sizes: &GroupSizes,
    eagle: &EagleGroups,
    groups: &[KvGroupSpec],
    cached: &mut CacheMap,
    blocks: &mut [BlockMeta],
    request: &mut CoordinatedRequest,
    cached_this_step: &mut FxHashSet<BlockHash>,
    mut log: Option<EventSink<'_, R>>,
) {
    let tokens = &request.tokens;
    let num_computed = tokens.num_computed_tokens.min(tokens.num_tokens);
    for (g, _) in groups.iter().enumerate().filter(|(_, s)| s.caches_blocks()) {
        let tokens = &request.tokens;
        let cacheable = eagle.cacheable(sizes, g, num_computed);
        let drops = eagle.drops_in_group(sizes, g);
        let scale = sizes::scale(sizes.groups[g], block_size);
        let num_full = (cacheable / sizes.groups[g]).min(tokens.block_hashes.len() / scale);
        let table = &request.tables[g];
        let first = request.num_cached[g];
        if first < num_full {
            let end = num_full.min(table.len());
            let hashes = &tokens.block_hashes[sizes::group_hash_index(first, scale)..];
            let reachable = sizes.reachable_blocks(&groups[g], g, drops);
            let mut stored = log.as_ref().map(|_| Vec::new());
            let mut replaced = Vec::new();
            for (i, (&block, &hash)) in table[first.min(end)..end]
                .iter()
                .zip(hashes.iter().step_by(scale))
                .enumerate()
            {
                if block == NULL_BLOCK || reachable.is_some_and(|r| !r.reaches(first + i)) {
                    continue;
                }
                let key = group_key(hash, g);
                if let Some(stored) = &mut stored {
                    stored.push((first + i, key));
                }
                if sizes.keeps_partial_tails()
                    && let Some(old) = sizes::forget_partial(cached, blocks, block)
                    && let Some(log) = &mut log
                {
                    replaced.push(old);
                    replaced.extend(log.secondary.remove(&block).unwrap_or_default());
                }
                cached.insert(key, block, blocks);
                blocks[block as usize].set_hash(key);
                if groups[g].is_mamba_align() {
                    cached_this_step.insert(key);
                }
            }
            request.num_cached[g] = num_full;
            if let (Some(log), Some(stored)) = (&mut log, stored) {
                log.cache_call(g, first, num_full, replaced, stored);
            }
        }
        // Without the drop or a look-ahead the entries change no lookup: kept for the
        // events alone.
        if sizes::registers_partial_tail(&groups[g])
            && (sizes.keeps_partial_tails() || log.is_some())
        {
            sizes::cache_partial_tail(
                sizes,
                g,
                drops,
                block_size,
                cacheable,
                cached,
                blocks,
                request,
                log.as_mut(),
            );
        }
    }
}
