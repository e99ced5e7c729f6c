//! The coordinator's side of KV connector loads and of KV-cache zeroing (vLLM 0.33's
//! `KVCacheManager.allocate_slots` with `num_external_computed_tokens`, the coordinator's
//! `allocate_new_computed_blocks` and the managers' `allocate_external_computed_blocks`,
//! `take_new_block_ids`).
//!
//! A first allocation may carry tokens a connector loads after the local hit: every group
//! counts the local hit and the loaded tokens as computed (a window group holds null blocks
//! for what falls before its window of the next token), takes new blocks for the loaded
//! tokens it still attends to, then for the tokens to compute. Blocks of an asynchronous
//! load enter the prefix cache only once it has landed (`cache_blocks`).
//!
//! With zeroing on, every attention group's new blocks are kept until the step takes them
//! (`take_new_block_ids`), but the loaded blocks of the groups an asynchronous load writes,
//! which zeroing would race.

use super::GroupSlots;
use super::KvCapacity;
use super::{
    BlockId, GroupedComputedBlocks, KvCoordinator, KvGroupSpec, RequestKey, Taking, TokenId,
    record_for_zeroing,
};
use crate::{Error, Result};

/// What a first allocation with loaded tokens asks for ([`KvCoordinator::allocate_slots_external`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ExternalAllocation<'a> {
    /// Tokens after the local hit the connector loads.
    pub num_external_tokens: usize,
    /// Tokens to compute after the loaded ones (0 for an asynchronous load).
    pub num_new_tokens: usize,
    pub num_lookahead_tokens: usize,
    /// Whether full blocks enter the prefix cache now (`false`: an asynchronous load, whose
    /// blocks are cached by `cache_blocks` once they landed; vLLM's `delay_cache_blocks`).
    pub cache: bool,
    /// Groups whose loaded blocks the load writes, so they are not zeroed (vLLM's
    /// `skip_zeroing_group_ids`).
    pub skip_zeroing_groups: &'a [usize],
}

impl<R: RequestKey> KvCoordinator<R> {
    /// Turns recording of new blocks for zeroing on or off (vLLM 0.33's
    /// `KVCacheConfig.needs_kv_cache_zeroing`: Mamba layers or mixed-precision caches).
    /// Turning it off forgets the blocks recorded.
    pub fn set_zero_new_blocks(&mut self, on: bool) {
        self.zeroing = on.then(|| vec![Vec::new(); self.groups.len()]);
    }

    pub fn zeroes_new_blocks(&self) -> bool {
        self.zeroing.is_some()
    }

    /// The blocks to zero before use handed out since the last call, group by group (vLLM's
    /// `KVCacheManager.take_new_block_ids`); empty with zeroing off.
    pub fn take_new_block_ids(&mut self) -> Vec<BlockId> {
        let Some(per_group) = &mut self.zeroing else {
            return Vec::new();
        };
        per_group.iter_mut().flat_map(std::mem::take).collect()
    }

    /// Frees the blocks each group no longer attends to with `num_processed_tokens`
    /// computed and processed (vLLM 0.33's `remove_skipped_blocks`, as `_connector_finished`
    /// calls it before a finished request's blocks go to its connector). Unknown requests
    /// are left alone.
    pub fn prune_skipped_blocks(&mut self, request_id: &R, num_processed_tokens: usize) {
        self.remove_skipped_blocks(request_id, num_processed_tokens);
    }

    /// A request's first allocation with `alloc.num_external_tokens` loaded after the local
    /// hit `new_computed` (see the module doc): each group's new blocks, or `Ok(None)` when
    /// they do not fit (nothing changed). The request then counts the hit, the loaded and
    /// the new tokens as computed.
    pub fn allocate_slots_external(
        &mut self,
        request_id: &R,
        token_ids: &[TokenId],
        new_computed: Option<&GroupedComputedBlocks>,
        extra_key: Option<u64>,
        alloc: ExternalAllocation<'_>,
    ) -> Result<Option<Vec<Vec<BlockId>>>> {
        if self.requests.contains_key(request_id) {
            return Err(Error::input(
                "request_id",
                format!("{request_id:?}"),
                "external tokens are only loaded on a request's first allocation",
            ));
        }
        if let Some(hit) = new_computed {
            self.check_hit_is_current(hit, token_ids.len(), extra_key)?;
        }
        let local = new_computed.map_or(0, |h| h.num_computed_tokens);
        let total = local + alloc.num_external_tokens;
        if total + alloc.num_new_tokens > token_ids.len() {
            return Err(Error::input(
                "num_external_tokens",
                alloc.num_external_tokens,
                format!(
                    "the prefix hit ({local}), the loaded and the new tokens exceed the \
                     request's {} tokens",
                    token_ids.len()
                ),
            ));
        }
        if !alloc.cache && alloc.num_new_tokens > 0 {
            return Err(Error::input(
                "cache",
                "false",
                "only a load with nothing to compute (asynchronous) caches its blocks later",
            ));
        }
        if let Some(&g) = (alloc.skip_zeroing_groups.iter()).find(|&&g| g >= self.groups.len()) {
            return Err(Error::input(
                "skip_zeroing_groups",
                g,
                format!("this coordinator has {} groups", self.groups.len()),
            ));
        }
        let num_slots = total + alloc.num_new_tokens + alloc.num_lookahead_tokens;
        // An align group's state goes at the last computed token's block, not the lookahead
        // slots' (as allocate_slots counts it, vLLM 0.33's `num_tokens_main_model`).
        let slots = GroupSlots {
            lookahead: alloc.num_lookahead_tokens,
            ..GroupSlots::decoder(num_slots)
        };
        let needed = self.num_blocks_to_allocate(request_id, slots, total, new_computed, None);
        if needed > self.num_free_blocks() {
            return Ok(None);
        }
        // vLLM counts a Mamba align group's blocks capped (`physical_block_cap`) without the
        // loaded state block `allocate_external_computed_blocks` takes beside them; where the
        // cap bites it takes one more block than it counted and, short of it, raises
        // (`BlockPool.get_new_blocks`). Not fitting here instead.
        let over = self.load_overshoot(
            request_id,
            new_computed,
            slots,
            total,
            alloc.num_external_tokens,
        );
        if needed + over > self.num_free_blocks() {
            return Ok(None);
        }
        let mut request = self.admit(request_id, new_computed, total, extra_key);
        let extra = self.window_extra_retained;
        let groups = self.groups.iter().zip(&self.sizes.groups);
        for ((spec, &size), table) in groups.zip(&mut request.tables) {
            let num_skipped = spec.num_skipped_tokens_retaining(total, extra) / size;
            if table.len() < num_skipped {
                // No hit to adopt: the blocks before the window are nulls all the same.
                table.resize(num_skipped, super::NULL_BLOCK);
            }
        }
        self.requests.insert(request_id.clone(), request);
        let mut loaded = self.allocate_loaded_blocks(request_id, total, alloc);
        let hisparse = self.has_hisparse() && alloc.num_external_tokens > 0;
        if hisparse {
            self.load_hisparse_pages(request_id, total, &mut loaded);
        }
        if alloc.num_new_tokens + alloc.num_lookahead_tokens == 0 {
            if hisparse {
                self.take_hot_regions(request_id, &mut loaded);
            }
            // vLLM still runs `allocate_new_blocks` for the loaded tokens: a Mamba group
            // takes its speculative blocks after the loaded state (and, in align mode,
            // counts as allocated).
            self.allocate_mamba_after_load(request_id, total, &mut loaded);
            // Nothing to compute: the tokens are given, their full blocks cached now or
            // once the load landed.
            let (block_size, caching) = (self.block_size, self.enable_caching);
            let lookahead = self.hash_lookahead;
            let request = self.requests.get_mut(request_id).expect("admitted");
            super::append_tokens(
                block_size,
                caching,
                lookahead,
                &mut request.tokens,
                token_ids,
            );
            if alloc.cache && caching {
                let (groups, cached, blocks) = (&self.groups, &mut self.cached, &mut self.blocks);
                let (sizes, this_step) = (&self.sizes, &mut self.cached_this_step);
                super::cache_full_blocks(
                    block_size,
                    sizes,
                    &self.eagle,
                    groups,
                    cached,
                    blocks,
                    request,
                    this_step,
                    super::EventSink::of(
                        &mut self.events,
                        &mut self.cache_calls,
                        &mut self.secondary,
                        request_id,
                    ),
                );
            }
            return Ok(Some(loaded));
        }
        let rest = self.allocate_slots_in_flight(
            request_id,
            token_ids,
            alloc.num_new_tokens,
            alloc.num_lookahead_tokens,
            None,
            extra_key,
            0,
            0,
        )?;
        let mut new_blocks = rest.expect("counted with the loaded blocks");
        for (group, mut first) in new_blocks.iter_mut().zip(loaded) {
            first.append(group);
            *group = first;
        }
        Ok(Some(new_blocks))
    }

    /// [`KvCoordinator::full_sequence_fits`] for a first allocation that also loads
    /// `num_external_tokens` after the hit: they count as computed, so a window group skips
    /// what falls before its window of the loaded tokens (vLLM 0.33's gate in
    /// `allocate_slots`, with `total_computed_tokens` the local and loaded ones).
    pub fn full_sequence_fits_external(
        &self,
        request_id: &R,
        num_tokens: usize,
        hit: Option<&GroupedComputedBlocks>,
        num_external_tokens: usize,
        max_in_flight_tokens: usize,
    ) -> bool {
        if self.requests.contains_key(request_id) {
            return self.full_sequence_fits(request_id, num_tokens, hit, max_in_flight_tokens, 0);
        }
        let total = hit.map_or(0, |h| h.num_computed_tokens) + num_external_tokens;
        let cap = Some(max_in_flight_tokens);
        self.num_blocks_to_allocate(request_id, GroupSlots::decoder(num_tokens), total, hit, cap)
            <= self.num_free_blocks()
    }

    /// vLLM's `allocate_new_blocks` of the Mamba groups for a load with nothing to compute
    /// (`total` computed tokens, no new ones; other groups already hold their slots): the
    /// speculative blocks after the state (`none` mode: up to `1 + num_speculative_blocks`;
    /// align mode: its `allocate_new_blocks`, no checkpoint as the chunk is empty). Adds
    /// them to `new_blocks`.
    fn allocate_mamba_after_load(
        &mut self,
        request_id: &R,
        total: usize,
        new_blocks: &mut [Vec<BlockId>],
    ) {
        let Taking {
            groups,
            sizes,
            request,
            mut taker,
            ..
        } = self.taking(request_id);
        let tables = request.tables.iter_mut().zip(&mut request.align);
        for (g, (spec, (table, state))) in groups.iter().zip(tables).enumerate() {
            if !spec.is_mamba() {
                continue;
            }
            let required = spec.num_required_blocks(total, sizes[g]);
            let mut take = |n| taker.take(n);
            let added = if spec.is_mamba_align() {
                super::allocate_align_blocks(table, state, spec, required, false, &mut take)
            } else {
                let added = take(required.saturating_sub(table.len()));
                table.extend_from_slice(&added);
                added
            };
            new_blocks[g].extend(added);
        }
    }

    /// vLLM's `allocate_external_computed_blocks` for every group of a request just
    /// admitted with `total` computed tokens: blocks for the loaded tokens the group still
    /// attends to. Returns each group's new blocks.
    fn allocate_loaded_blocks(
        &mut self,
        request_id: &R,
        total: usize,
        alloc: ExternalAllocation<'_>,
    ) -> Vec<Vec<BlockId>> {
        let extra = self.window_extra_retained;
        let Taking {
            groups,
            sizes,
            request,
            mut taker,
            zeroing,
        } = self.taking(request_id);
        let mut new_blocks = Vec::with_capacity(groups.len());
        for (g, (spec, table)) in groups.iter().zip(&mut request.tables).enumerate() {
            let attended = total - spec.num_skipped_tokens_retaining(total, extra).min(total);
            // vLLM's `CrossAttentionManager.allocate_external_computed_blocks` takes none:
            // a cross-attention group holds encoder tokens, which no load brings.
            let cross = matches!(spec, KvGroupSpec::CrossAttention);
            if alloc.num_external_tokens.min(attended) == 0 || spec.is_hisparse() || cross {
                new_blocks.push(Vec::new());
                continue;
            }
            // vLLM's `allocate_external_computed_blocks` takes blocks for the loaded tokens
            // alone (`cdiv(total, block_size)`): a Mamba group's speculative blocks come
            // with the allocation after it.
            let required =
                spec.num_required_blocks(total, sizes[g]) - spec.num_speculative_blocks();
            let added = taker.take(required.saturating_sub(table.len()));
            table.extend_from_slice(&added);
            if !alloc.skip_zeroing_groups.contains(&g) {
                record_for_zeroing(zeroing, g, spec, &added);
            }
            new_blocks.push(added);
        }
        new_blocks
    }
}

/// Whether `spec` is a group a hash-addressed store (a prefix-cache connector) holds: all
/// but the bounded-replay windows, which are rebuilt, never cached (vLLM 0.33's
/// `KVCacheSpec.prefix_cacheable`).
pub fn prefix_cacheable(spec: &KvGroupSpec) -> bool {
    !matches!(spec, KvGroupSpec::SlidingWindowReplay { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvCapacity, NULL_BLOCK};

    const FULL: KvGroupSpec = KvGroupSpec::FullAttention;
    const WINDOW: KvGroupSpec = KvGroupSpec::SlidingWindow { sliding_window: 8 };

    /// vLLM 0.33's layout: 8 local + 8 loaded tokens, 4 to compute, blocks of 4, window 8.
    /// The window group counts 16 computed: (16 + 1 - 8) / 4 = 2 nulls (the local hit's
    /// blocks there are not taken), the loaded block it attends to, then blocks to compute.
    #[test]
    fn loaded_tokens_count_as_computed_in_every_group() {
        let mut coord = KvCoordinator::<u64>::new(vec![FULL, WINDOW], 40, 4, true).unwrap();
        let tokens: Vec<TokenId> = (0..20).collect();
        coord
            .allocate_slots(&1, &tokens[..9], 9, 0, None, None)
            .unwrap();
        coord.free(&1).unwrap();
        let hit = coord.get_computed_blocks(&tokens, None);
        assert_eq!(hit.num_computed_tokens, 8);
        coord.set_zero_new_blocks(true);
        let alloc = ExternalAllocation {
            num_external_tokens: 8,
            num_new_tokens: 4,
            cache: true,
            skip_zeroing_groups: &[0],
            ..ExternalAllocation::default()
        };
        let new = coord.allocate_slots_external(&2, &tokens, Some(&hit), None, alloc);
        let new = new.unwrap().unwrap();
        let tables: Vec<Vec<BlockId>> = coord
            .block_ids(&2)
            .unwrap()
            .iter()
            .map(|t| t.to_vec())
            .collect();
        assert_eq!(tables[0][..2], hit.block_ids[0][..2]);
        assert_eq!((tables[0].len(), tables[1].len()), (5, 5));
        assert_eq!(tables[1][..2], [NULL_BLOCK, NULL_BLOCK]);
        assert_eq!((new[0].len(), new[1].len()), (3, 3));
        assert_eq!(coord.num_computed_tokens(&2), Some(20));
        // Every new block is zeroed but group 0's two loaded ones (skip_zeroing_groups).
        let zeroed = coord.take_new_block_ids();
        assert_eq!(zeroed, [&new[0][2..], &new[1][..]].concat());
        coord.check_invariants().unwrap();
    }

    /// A cross-attention group takes no blocks for loaded tokens (vLLM 0.33's
    /// `CrossAttentionManager.allocate_external_computed_blocks` returns at once): 12
    /// tokens loaded, asynchronously (no new ones) and with 2 to compute, take full
    /// attention's blocks alone, and the counted blocks match the taken ones.
    #[test]
    fn a_load_takes_no_cross_attention_blocks() {
        let tokens: Vec<TokenId> = (0..14).collect();
        for (num_new_tokens, cache, full_blocks) in [(0, false, 3), (2, true, 4)] {
            let groups = vec![FULL, KvGroupSpec::CrossAttention];
            let mut coord = KvCoordinator::<u64>::new(groups, 20, 4, false).unwrap();
            let free = coord.num_free_blocks();
            let alloc = ExternalAllocation {
                num_external_tokens: 12,
                num_new_tokens,
                cache,
                ..ExternalAllocation::default()
            };
            let new = coord.allocate_slots_external(&1, &tokens, None, None, alloc);
            let new = new.unwrap().unwrap();
            assert_eq!((new[0].len(), new[1].len()), (full_blocks, 0));
            assert!(coord.block_ids(&1).unwrap()[1].is_empty());
            assert_eq!(coord.num_free_blocks(), free - full_blocks);
            coord.check_invariants().unwrap();
        }
    }

    /// An align group's state block goes at the last computed token's block: the lookahead
    /// slots count for full attention only, in the check as in the allocation. 16 loaded
    /// tokens and 16 lookahead slots over blocks of 16 take 3 blocks (2 full attention, the
    /// loaded state): 3 free must do (counting the lookahead, the check asked for 4).
    #[test]
    fn a_load_with_lookahead_counts_an_align_group_without_it() {
        let groups = vec![FULL, KvGroupSpec::MAMBA_ALIGN];
        let mut coord = KvCoordinator::<u64>::new(groups, 4, 16, true).unwrap();
        assert_eq!(coord.num_free_blocks(), 3);
        let tokens: Vec<TokenId> = (0..16).collect();
        let alloc = ExternalAllocation {
            num_external_tokens: 16,
            num_lookahead_tokens: 16,
            ..ExternalAllocation::default()
        };
        let new = coord.allocate_slots_external(&1, &tokens, None, None, alloc);
        let new = new.unwrap().expect("3 blocks free, 3 needed");
        assert_eq!((new[0].len(), new[1].len()), (2, 1));
        assert_eq!(coord.num_free_blocks(), 0);
        coord.check_invariants().unwrap();
    }

    /// Groups of different block sizes (full attention in blocks of 8, the window of 8 in
    /// blocks of 4, hashed every 4): an asynchronous load of 16 of 20 tokens, once landed,
    /// caches up to the lcm boundary 16 in each group, and a hit lands there. Loaded past
    /// it (19), the window's nulls reach below 16 and the same prompt hits nothing: the
    /// window of the boundary's last token needs blocks the load did not take, as in
    /// vLLM 0.33 (`allocate_external_computed_blocks` skips them; hits land on the lcm).
    #[test]
    fn a_landed_load_beside_differing_sizes_caches_up_to_the_lcm() {
        let longer: Vec<TokenId> = (0..21).collect();
        // (loaded, new blocks per group, the window's nulls, the hit once landed)
        for (loaded, taken, nulls, hit) in [(16, (2, 2), 2, 16), (19, (3, 2), 3, 0)] {
            let mut coord = KvCoordinator::<u64>::new(vec![FULL, WINDOW], 40, 4, true).unwrap();
            coord.set_group_block_sizes(&[8, 4]).unwrap();
            let tokens: Vec<TokenId> = (0..20).collect();
            let alloc = ExternalAllocation {
                num_external_tokens: loaded,
                cache: false,
                ..ExternalAllocation::default()
            };
            let new = coord.allocate_slots_external(&1, &tokens, None, None, alloc);
            let new = new.unwrap().unwrap();
            // Blocks for the loaded tokens: ceil(loaded / 8) of 8; the window skips
            // (loaded + 1 - 8) / 4 blocks of 4 (nulls) and takes the rest of ceil(loaded / 4).
            assert_eq!((new[0].len(), new[1].len()), taken);
            let table = coord.block_ids(&1).unwrap()[1].to_vec();
            assert_eq!(table[..nulls], vec![NULL_BLOCK; nulls]);
            // Not cached before the load lands.
            assert_eq!(
                coord.get_computed_blocks(&longer, None).num_computed_tokens,
                0
            );
            coord.cache_blocks(&1, &[]).unwrap();
            assert_eq!(
                coord.get_computed_blocks(&longer, None).num_computed_tokens,
                hit
            );
            coord.check_invariants().unwrap();
        }
    }

    #[test]
    fn a_load_that_does_not_fit_changes_nothing() {
        let mut coord = KvCoordinator::<u64>::new(vec![FULL, WINDOW], 6, 4, true).unwrap();
        let tokens: Vec<TokenId> = (0..20).collect();
        let free = coord.num_free_blocks();
        let alloc = ExternalAllocation {
            num_external_tokens: 16,
            ..ExternalAllocation::default()
        };
        let hit = coord.get_computed_blocks(&tokens, None);
        let new = coord.allocate_slots_external(&1, &tokens, Some(&hit), None, alloc);
        assert!(new.unwrap().is_none());
        assert_eq!((coord.num_free_blocks(), coord.num_requests()), (free, 0));
        coord.check_invariants().unwrap();
    }
}
