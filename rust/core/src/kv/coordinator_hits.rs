//! The coordinator's prefix-hit search (vLLM 0.33's `find_longest_cache_hit` of
//! `kv_cache_coordinator.py`, over the managers' own searches in `layer_groups`) and the
//! check that a hit handed back to `allocate_slots` is still current.
//!
//! A hit is found group by group, full-attention groups first; it is cached under
//! (hash, group), so a lookup never sees another group's blocks.

use super::super::block_ops::remove_secondary;
use super::{
    BlockHash, BlockId, BlockMeta, GroupedComputedBlocks, KvCoordinator, KvGroupSpec, LookupQuery,
    NULL_BLOCK, RequestKey, TokenId, find_longest_cache_hit, group_key, hash_full_blocks, sizes,
};
use crate::{Error, Result};

impl<R: RequestKey> KvCoordinator<R> {
    /// vLLM's `find_longest_cache_hit` of the coordinator: the longest prefix of
    /// `token_ids` (never all of it: the last token is recomputed) that every group can
    /// serve. Full-attention groups are looked up first (their hit only shrinks), then
    /// each other spec group verifies within the current length; when any group shortens
    /// it, all are checked again, except in the "simple hybrid" (one full-attention spec
    /// group + one other), where vLLM stops after one round.
    pub fn get_computed_blocks(
        &mut self,
        token_ids: &[TokenId],
        extra_key: Option<u64>,
    ) -> GroupedComputedBlocks {
        self.get_computed_blocks_from(token_ids, extra_key, Vec::new(), usize::MAX)
    }

    /// [`Self::get_computed_blocks`], given `known`: the hashes of the first full blocks of
    /// these token ids under this extra key (an earlier lookup's, or the caller's), which
    /// are not recomputed (as `BlockPool::get_computed_blocks_from`), and a hit no longer
    /// than `max_hit_tokens`.
    pub(crate) fn get_computed_blocks_from(
        &mut self,
        token_ids: &[TokenId],
        extra_key: Option<u64>,
        known: Vec<BlockHash>,
        max_hit_tokens: usize,
    ) -> GroupedComputedBlocks {
        let num_groups = self.groups.len();
        let mut hit = GroupedComputedBlocks {
            block_ids: vec![Vec::new(); num_groups],
            query: LookupQuery {
                num_tokens: token_ids.len(),
                extra_key,
            },
            ..GroupedComputedBlocks::default()
        };
        if !self.enable_caching {
            return hit;
        }
        let bs = self.block_size;
        let max_length = token_ids.len().saturating_sub(1).min(max_hit_tokens);
        // EAGLE groups read a block past the candidate hit, up to the request's full blocks
        // (vLLM's `len(block_hashes) * hash_block_size`), then drop it.
        let eagle = self.sizes.drop_eagle;
        let num_hashed = if eagle { token_ids.len() } else { max_length };
        let mut hashes = known;
        hashes.truncate(num_hashed / bs);
        hashes.reserve_exact(num_hashed / bs - hashes.len());
        if self.hash_lookahead > 0 {
            let lookahead = self.hash_lookahead;
            let max_blocks = max_length / bs;
            crate::kv::hash_full_blocks_lookahead(
                &mut hashes,
                token_ids,
                bs,
                lookahead,
                extra_key,
                max_blocks,
            );
        } else {
            hash_full_blocks(&mut hashes, &token_ids[..num_hashed], bs, extra_key);
        }
        let simple_hybrid =
            self.lookup_order.len() == 2 && self.lookup_order[0].spec.is_full_attention();
        // HiSparse: nothing past the host pool's published prefix (coordinator_hisparse).
        let mut hit_length = max_length.min(self.hisparse_published_tokens());
        // vLLM's `longest_hit_length`: the longest hit of a group looked up.
        let mut longest = 0;
        let mut found: Vec<Option<Vec<BlockId>>> = vec![None; num_groups];
        let mut found_length = vec![0usize; num_groups];
        // vLLM's `eagle_verified`: the spec groups (by lookup index, at most 64) whose drop
        // was applied at the current candidate length; each drops at most once per length.
        let mut eagle_verified = 0u64;
        loop {
            let mut current = hit_length;
            for (idx, group) in self.lookup_order.iter().enumerate() {
                let first = group.group_ids[0];
                if group.spec.is_full_attention() && found[first].is_some() {
                    current = current.min(found_length[first]);
                    continue;
                }
                let drop = self.drops_in(group) && eagle_verified & (1 << idx) == 0;
                // The drop's margin is one of the group's blocks; Mamba's finder never drops.
                let lookup_length = match drop && !group.spec.is_mamba() {
                    true => (current + group.block_size).min(hashes.len() * bs),
                    false => current,
                };
                let (cached, blocks) = (&self.cached, self.blocks.as_slice());
                let scale = sizes::scale(group.block_size, bs);
                let lookup = |i: usize| {
                    let hash = hashes[sizes::group_hash_index(i, scale)];
                    (group.group_ids.iter())
                        .map(|&g| cached.get(&group_key(hash, g), blocks))
                        .collect::<Option<Vec<_>>>()
                };
                let result = find_longest_cache_hit(
                    group.spec,
                    group.group_ids.len(),
                    group.block_size,
                    self.sizes.scheduler,
                    hashes.len() / scale,
                    lookup_length,
                    drop,
                    lookup,
                );
                if drop {
                    eagle_verified |= 1 << idx;
                } else if result.num_tokens < current {
                    eagle_verified = 0;
                }
                current = result.num_tokens;
                longest = longest.max(current);
                for (&g, table) in group.group_ids.iter().zip(result.blocks) {
                    found[g] = Some(table);
                    found_length[g] = current;
                }
            }
            if current >= hit_length {
                break;
            }
            hit_length = current;
            if simple_hybrid {
                break;
            }
        }
        for (g, spec) in self.groups.iter().enumerate() {
            if let (true, Some(table)) = (spec.is_full_attention(), &mut found[g]) {
                table.truncate(hit_length.div_ceil(self.sizes.groups[g]));
            }
        }
        hit.block_ids = found.into_iter().map(Option::unwrap_or_default).collect();
        hit.num_computed_tokens = hit_length;
        hit.num_uncached_prefix_tokens = longest.saturating_sub(hit_length);
        hit.block_hashes = hashes;
        self.stats.record_lookup(token_ids.len(), hit_length);
        hit
    }

    /// vLLM 0.33's `find_longest_cache_hit_per_group`: each spec group's own hit over the
    /// first `max_length` tokens of `token_ids`, not reconciled across groups (a Mamba
    /// `align` group may reach deeper than full attention, or the reverse). Returns each
    /// group's blocks and hit length in tokens; records no lookup.
    pub fn find_longest_cache_hit_per_group(
        &self,
        token_ids: &[TokenId],
        extra_key: Option<u64>,
        max_length: usize,
    ) -> (Vec<Vec<BlockId>>, Vec<usize>) {
        let max_length = max_length.min(token_ids.len());
        let mut hashes = Vec::with_capacity(max_length / self.block_size);
        hash_full_blocks(
            &mut hashes,
            &token_ids[..max_length],
            self.block_size,
            extra_key,
        );
        self.hits_per_group(&hashes, max_length)
    }

    /// [`Self::find_longest_cache_hit_per_group`] over the hashes of the query's first full
    /// blocks (`tokenyard.kv.block_hashes`' values), as vLLM's call takes them: hashes past
    /// `max_length` tokens are not read.
    pub fn find_longest_cache_hit_per_group_hashes(
        &self,
        block_hashes: &[BlockHash],
        max_length: usize,
    ) -> (Vec<Vec<BlockId>>, Vec<usize>) {
        let num = (max_length / self.block_size).min(block_hashes.len());
        self.hits_per_group(&block_hashes[..num], max_length)
    }

    fn hits_per_group(
        &self,
        hashes: &[BlockHash],
        max_length: usize,
    ) -> (Vec<Vec<BlockId>>, Vec<usize>) {
        let num_groups = self.groups.len();
        let (mut blocks, mut lengths) = (vec![Vec::new(); num_groups], vec![0; num_groups]);
        if !self.enable_caching {
            return (blocks, lengths);
        }
        for group in &self.lookup_order {
            let (cached, pool) = (&self.cached, self.blocks.as_slice());
            let scale = sizes::scale(group.block_size, self.block_size);
            let lookup = |i: usize| {
                let hash = hashes[sizes::group_hash_index(i, scale)];
                (group.group_ids.iter())
                    .map(|&g| cached.get(&group_key(hash, g), pool))
                    .collect::<Option<Vec<_>>>()
            };
            let n = group.group_ids.len();
            let drop = self.drops_in(group);
            let lookup_length = match drop && !group.spec.is_mamba() {
                true => (max_length + group.block_size).min(hashes.len() * self.block_size),
                false => max_length,
            };
            let hit = find_longest_cache_hit(
                group.spec,
                n,
                group.block_size,
                self.sizes.scheduler,
                hashes.len() / scale,
                lookup_length,
                drop,
                lookup,
            );
            for (&g, table) in group.group_ids.iter().zip(hit.blocks) {
                blocks[g] = table;
                lengths[g] = hit.num_tokens;
            }
        }
        (blocks, lengths)
    }

    /// vLLM 0.33's `KVCacheManager.get_computed_blocks_for_connector`, the local lookup
    /// beside a connector that can restore a lagging recurrent state
    /// (`supports_divergent_local_hybrid_hits`). With a Mamba group beside full attention
    /// the groups are looked up one by one: when another group reaches deeper than full
    /// attention (its full-attention blocks were evicted) the hit is the reconciled one
    /// ([`Self::get_computed_blocks`]); otherwise it is full attention's, each group
    /// adopting its own blocks, and the answer's `bool` says a group lags behind it (a
    /// "diverged" hit: its boundary has a valid state only if the connector loads past
    /// it; the caller reconciles when it loads nothing). Other layouts: the reconciled hit.
    /// A diverged hit is not counted in the lookup stats: the caller counts the hit it
    /// takes ([`Self::record_lookup`], or the reconciled lookup's own count).
    pub(crate) fn get_computed_blocks_for_connector(
        &mut self,
        token_ids: &[TokenId],
        extra_key: Option<u64>,
        known: Vec<BlockHash>,
        max_hit_tokens: usize,
    ) -> (GroupedComputedBlocks, bool) {
        let full = self.groups.iter().position(KvGroupSpec::is_full_attention);
        let (true, true, Some(full)) = (
            self.enable_caching,
            self.groups.iter().any(KvGroupSpec::is_mamba),
            full,
        ) else {
            let hit = self.get_computed_blocks_from(token_ids, extra_key, known, max_hit_tokens);
            return (hit, false);
        };
        let bs = self.block_size;
        let max_length = token_ids.len().saturating_sub(1).min(max_hit_tokens);
        let mut hashes = known;
        hashes.truncate(max_length / bs);
        hashes.reserve_exact(max_length / bs - hashes.len());
        hash_full_blocks(&mut hashes, &token_ids[..max_length], bs, extra_key);
        let (blocks, lengths) = self.hits_per_group(&hashes, max_length);
        let num_local = lengths[full];
        if lengths.iter().any(|&n| n > num_local) {
            let hit = self.get_computed_blocks_from(token_ids, extra_key, hashes, max_hit_tokens);
            return (hit, false);
        }
        let diverged = lengths.iter().any(|&n| n < num_local);
        if !diverged {
            self.stats.record_lookup(token_ids.len(), num_local);
        }
        let hit = GroupedComputedBlocks {
            block_ids: blocks,
            num_computed_tokens: num_local,
            // vLLM: per-group lookups do not detect an uncached shared prefix.
            num_uncached_prefix_tokens: 0,
            query: LookupQuery {
                num_tokens: token_ids.len(),
                extra_key,
            },
            block_hashes: hashes,
        };
        (hit, diverged)
    }

    /// Counts a lookup of `num_query_tokens` that hit `num_hit_tokens` (a diverged hit the
    /// caller kept, [`Self::get_computed_blocks_for_connector`]).
    pub(crate) fn record_lookup(&mut self, num_query_tokens: usize, num_hit_tokens: usize) {
        self.stats.record_lookup(num_query_tokens, num_hit_tokens);
    }

    /// vLLM's `BlockPool.evict_blocks`: each of `block_ids` that caches a hash leaves the
    /// prefix cache (a held block stays held, a free one stays free, uncached). An id past
    /// the pool is an error naming it; then nothing changed.
    pub fn evict_blocks(&mut self, block_ids: &[BlockId]) -> Result<()> {
        // The null block caches nothing: evicting it changes nothing, as in vLLM.
        if let Some(&bad) = block_ids.iter().find(|&&b| b as usize >= self.blocks.len()) {
            return Err(Error::input(
                "block_ids",
                bad,
                format!("not a block of this pool (0..{})", self.blocks.len()),
            ));
        }
        for &block in block_ids {
            if let Some(hash) = self.blocks[block as usize].take_hash() {
                self.cached.forget(block, &hash);
                self.note_removed(hash);
                remove_secondary(&mut self.secondary, &mut self.events, block);
            }
        }
        Ok(())
    }

    pub(super) fn check_hit_is_current(
        &self,
        hit: &GroupedComputedBlocks,
        num_token_ids: usize,
        extra_key: Option<u64>,
    ) -> Result<()> {
        if hit.block_ids.len() != self.groups.len() {
            return Err(Error::input(
                "new_computed_blocks",
                format!("{} groups", hit.block_ids.len()),
                format!("this coordinator has {} groups", self.groups.len()),
            ));
        }
        hit.query.check_matches(num_token_ids, extra_key)?;
        for (g, table) in hit.block_ids.iter().enumerate() {
            let scale = sizes::scale(self.sizes.groups[g], self.block_size);
            for (i, &block) in table.iter().enumerate() {
                if block == NULL_BLOCK {
                    continue;
                }
                let index = sizes::group_hash_index(i, scale);
                let expected = hit.block_hashes.get(index).map(|&h| group_key(h, g));
                let current = self.blocks.get(block as usize).and_then(BlockMeta::hash);
                if expected.is_none() || current != expected {
                    return Err(Error::input(
                        "new_computed_blocks",
                        format!("group {g} block {block}"),
                        "stale: a hit block was evicted since the lookup",
                    ));
                }
            }
        }
        Ok(())
    }
}
