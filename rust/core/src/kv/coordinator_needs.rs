//! What an allocation of the coordinator needs and frees, group by group (vLLM 0.33's
//! `get_num_blocks_to_allocate` and `remove_skipped_blocks` of each manager): the blocks a
//! group no longer attends to, freed first (a Mamba `align` group stepping over its null
//! gaps), and the free blocks the allocation then takes (a Mamba `align` group one state
//! block per allocation, none for a hit on a state this step computes).

use super::{BlockId, GroupSlots, GroupedComputedBlocks, KvCoordinator, NULL_BLOCK, RequestKey};
use crate::error::{Error, Result};

impl<R: RequestKey> KvCoordinator<R> {
    /// vLLM 0.33's `SlidingWindowSpec.extra_retained_tokens` for every window group (its
    /// planning tags each window with `max(0, num_prefill_lookahead_tokens - 1)`, a
    /// multi-module MTP drafter's re-prefill runway): a window group frees a block only
    /// once it lies that many tokens further below the window, and its admission cap
    /// counts them (`SlidingWindowManager.get_num_skipped_tokens`,
    /// `max_admission_blocks_per_request`). Hits still need only the window's own run.
    ///
    /// Errors: `ConfigError` naming `extra_retained_tokens` without a window group, or
    /// when it changes while a request holds blocks.
    pub fn set_window_extra_retained_tokens(&mut self, extra_retained_tokens: usize) -> Result<()> {
        if extra_retained_tokens == self.window_extra_retained {
            return Ok(());
        }
        if !self.groups.iter().any(|g| g.is_sliding_window()) {
            return Err(Error::config(
                "extra_retained_tokens",
                extra_retained_tokens,
                "retains tokens below a sliding window, and no group is one",
            ));
        }
        if self.num_requests() > 0 {
            return Err(Error::config(
                "extra_retained_tokens",
                extra_retained_tokens,
                "changes only while no request holds blocks",
            ));
        }
        self.window_extra_retained = extra_retained_tokens;
        Ok(())
    }

    /// What the request's next allocation, at `num_computed_tokens` computed tokens, drops
    /// from its groups (`remove_skipped_blocks`): the blocks it drops, and of those the ones
    /// surely returned to the free queue, which it holds alone. A block another request
    /// also holds is not counted as returned (it is only if that one let it go first), so
    /// the second count may fall short, never over. `(0, 0)` for an unknown request.
    pub fn num_skipped_blocks(&self, request_id: &R, num_computed_tokens: usize) -> (usize, usize) {
        let Some(request) = self.requests.get(request_id) else {
            return (0, 0);
        };
        let (mut dropped, mut freed) = (0, 0);
        let extra = self.window_extra_retained;
        let mut count = |b: BlockId| {
            dropped += 1;
            freed += usize::from(self.blocks[b as usize].ref_cnt == 1);
        };
        let groups = self.groups.iter().zip(&self.sizes.groups);
        for (((spec, &size), table), align) in groups.zip(&request.tables).zip(&request.align) {
            let retired = align.retired;
            let num_skipped = spec.num_skipped_tokens_retaining(num_computed_tokens, extra) / size;
            let end = num_skipped.min(table.len());
            if spec.is_mamba_align() {
                // Its prefill leaves null gaps between states (vLLM's align-mode
                // `_remove_blocks_in_range` steps over them), down to the retired slots.
                let start = retired.min(end);
                table[start..end]
                    .iter()
                    .filter(|&&b| b != NULL_BLOCK)
                    .for_each(|&b| count(b));
            } else {
                let skipped = table[..end].iter().rev();
                skipped
                    .take_while(|&&b| b != NULL_BLOCK)
                    .for_each(|&b| count(b));
            }
        }
        (dropped, freed)
    }

    /// vLLM's `remove_skipped_blocks` for every group: blocks wholly before the tokens the
    /// next token attends to are freed (last first) and replaced by the null block. A
    /// group stops at a null it already left, as vLLM's backward scan does; a Mamba `align`
    /// group steps over its null gaps down to the slots it retired before.
    pub(super) fn remove_skipped_blocks(&mut self, request_id: &R, num_computed_tokens: usize) {
        let Some(request) = self.requests.get_mut(request_id) else {
            return;
        };
        let mut freed = Vec::new();
        let extra = self.window_extra_retained;
        let groups = self
            .groups
            .iter()
            .zip(&self.sizes.groups)
            .zip(&mut request.tables);
        for (((spec, &size), table), align) in groups.zip(&mut request.align) {
            let retired = &mut align.retired;
            let num_skipped = spec.num_skipped_tokens_retaining(num_computed_tokens, extra) / size;
            let end = num_skipped.min(table.len());
            let align = spec.is_mamba_align();
            let start = if align { (*retired).min(end) } else { 0 };
            let mut group_freed = Vec::new();
            for slot in table[start..end].iter_mut().rev() {
                if *slot == NULL_BLOCK {
                    // A Mamba `align` prefill leaves null gaps between states (vLLM's
                    // align-mode `_remove_blocks_in_range` steps over them).
                    if align {
                        continue;
                    }
                    break;
                }
                group_freed.push(std::mem::replace(slot, NULL_BLOCK));
            }
            if align {
                *retired = (*retired).max(end);
            }
            freed.push(group_freed);
        }
        for group_freed in freed {
            self.free_blocks(group_freed.into_iter());
        }
    }

    /// vLLM's `get_num_blocks_to_allocate` summed over groups: new blocks beyond those
    /// held (or, on admission, beyond the hit and the skipped blocks), plus hit blocks
    /// that now sit in the free queue (taking them removes them from it). With
    /// `max_in_flight_tokens`, each window group's need is capped as vLLM's admission gate
    /// caps it (`apply_admission_cap`).
    pub(super) fn num_blocks_to_allocate(
        &self,
        request_id: &R,
        slots: GroupSlots,
        num_computed: usize,
        hit: Option<&GroupedComputedBlocks>,
        max_in_flight_tokens: Option<usize>,
    ) -> usize {
        let request = self.requests.get(request_id);
        let extra = self.window_extra_retained;
        let mut total: isize = 0;
        for (g, spec) in self.groups.iter().enumerate() {
            let bs = self.sizes.groups[g];
            let held = request.map(|r| (r.tables[g].len(), r.reads_host));
            let loaded = num_computed > hit.map_or(0, |h| h.num_computed_tokens);
            if let Some(n) = super::hisparse::hisparse_need(
                spec,
                held,
                slots.of(spec),
                num_computed,
                loaded && request.is_none(),
                bs,
            ) {
                total += n as isize;
                continue;
            }
            let mut required = spec.num_required_blocks(slots.of(spec), bs);
            let cap = max_in_flight_tokens
                .and_then(|f| spec.max_admission_blocks_retaining(f, bs, extra));
            if let Some(cap) = cap {
                required = required.min(cap);
            }
            let hit_blocks = match request {
                Some(_) => &[][..],
                None => hit.map_or(&[][..], |h| h.block_ids[g].as_slice()),
            };
            if !spec.is_mamba_align() {
                let new = match request {
                    Some(request) => required.saturating_sub(request.tables[g].len()),
                    None => {
                        let num_skipped =
                            spec.num_skipped_tokens_retaining(num_computed, extra) / bs;
                        required.saturating_sub(num_skipped.max(hit_blocks.len()))
                            + self.num_evictable(&hit_blocks[num_skipped.min(hit_blocks.len())..])
                    }
                };
                total += new as isize;
                continue;
            }
            let last_hash = hit_blocks
                .last()
                .and_then(|&b| self.blocks[b as usize].hash());
            if last_hash.is_some_and(|hash| self.cached_this_step.contains(&hash)) {
                // vLLM 0.33: a state another request computes in this step cannot be
                // relied on yet; reported as not fitting, so it is admitted next step.
                return self.blocks.len() + 1;
            }
            // vLLM's align-mode `get_num_blocks_to_allocate`: the table's missing slots,
            // capped at the blocks one allocation takes (`physical_block_cap`: the state,
            // the checkpoint, the speculative blocks at the first; a load's state block,
            // taken by `allocate_external_computed_blocks`, is not counted, as in vLLM). A
            // table longer than needed (drafts rejected) counts negative, as in vLLM's sum.
            let checkpoint = self.internal_checkpoint(request_id, g, spec, slots, num_computed);
            let allocated = request.is_some_and(|r| r.align[g].allocated);
            let mut cap = 1 + usize::from(checkpoint.is_some());
            if !allocated {
                cap += spec.num_speculative_blocks();
            }
            let new = match request {
                Some(request) => required as isize - request.tables[g].len() as isize,
                None => {
                    let num_skipped = spec.num_skipped_tokens_retaining(num_computed, extra) / bs;
                    required.saturating_sub(num_skipped.max(hit_blocks.len())) as isize
                }
            };
            total += new.min(cap as isize) + self.num_evictable(hit_blocks) as isize;
        }
        total.max(0) as usize
    }

    /// Hit blocks that sit in the free queue (not the null block): taking them removes
    /// them from it (vLLM's `_get_num_evictable_blocks`).
    fn num_evictable(&self, hit_blocks: &[BlockId]) -> usize {
        (hit_blocks.iter())
            .filter(|&&b| b != NULL_BLOCK && self.blocks[b as usize].ref_cnt == 0)
            .count()
    }
}
