//! vLLM 0.33's `MambaManager` in align mode beyond one state block per allocation: the
//! speculative state blocks (`num_speculative_blocks`) taken at a request's first
//! allocation and moved along behind the running state (`_relocate_speculative_block`),
//! and the prefill checkpoint block (`num_prefill_checkpoint_blocks`,
//! `_needs_internal_checkpoint`) a chunk writes its last reusable state into. Invariant: a
//! request's table holds its running state at slot `len - 1 - num_speculative_blocks`
//! after each allocation, the speculative blocks after it.

use super::{BlockId, GroupSlots, KvCoordinator, KvGroupSpec, NULL_BLOCK, RequestKey};
use crate::kv::{mamba_checkpoint_position, mamba_checkpoint_valid};

/// What vLLM 0.33's `MambaManager` in align mode keeps per request beside its table.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AlignState {
    /// Leading table slots known to hold the null block: skipped blocks are freed from
    /// the table's end down to here (`_num_retired_blocks`).
    pub(super) retired: usize,
    /// Whether an allocation gave the request its state blocks (`_allocated_block_reqs`):
    /// the speculative blocks are taken once, then moved along.
    pub(super) allocated: bool,
}

/// vLLM 0.33's align-mode `MambaManager.allocate_new_blocks` for a table that needs
/// `required` slots (`cdiv(num_tokens_main_model, block_size) + num_speculative_blocks`):
/// nothing when it has them (and no `checkpoint` block is due); else null slots up to the
/// block of the running state (or of the checkpoint, which gets a block), the speculative
/// blocks a running request holds moved past them, and new blocks (`take`) for the rest.
/// Returns the table's new slots (nulls and moved blocks included), as vLLM returns them.
pub(super) fn allocate_align_blocks(
    table: &mut Vec<BlockId>,
    state: &mut AlignState,
    spec: &KvGroupSpec,
    required: usize,
    checkpoint: bool,
    take: &mut impl FnMut(usize) -> Vec<BlockId>,
) -> Vec<BlockId> {
    let num_spec = spec.num_speculative_blocks();
    let was_allocated = state.allocated;
    state.allocated = true;
    if required <= table.len() && !checkpoint {
        return Vec::new();
    }
    let prev = table.len();
    let checkpoint = usize::from(checkpoint);
    // The running state's slot; the checkpoint's is the one before it.
    let num_skipped = required - num_spec - 1;
    if prev < num_skipped {
        table.resize(num_skipped - checkpoint, NULL_BLOCK);
    }
    if was_allocated {
        // `_relocate_speculative_block`: scratch blocks the state moved past go to the end
        // (one at the checkpoint's slot stays: the backend writes the checkpoint there).
        for i in prev.saturating_sub(num_spec)..prev {
            if i >= num_skipped - checkpoint {
                break;
            }
            let block = std::mem::replace(&mut table[i], NULL_BLOCK);
            table.push(block);
        }
    }
    let added = take(required.saturating_sub(table.len()));
    table.extend_from_slice(&added);
    table[prev..].to_vec()
}

impl<R: RequestKey> KvCoordinator<R> {
    /// vLLM 0.33's `MambaManager._needs_internal_checkpoint` for group `g` of an allocation
    /// from `num_computed` computed tokens to `slots` (the main model's tokens): where the
    /// backend writes the state of the chunk's last reusable boundary from inside it, as
    /// `(position in tokens, table slot)`, or `None`. The slot is the one before the
    /// running state's, and must be free to take it: past the table, null, or one of the
    /// speculative blocks of a request that holds them. Dense retention (every boundary
    /// kept), so no chunk needs to reach the prefill's end.
    pub(super) fn internal_checkpoint(
        &self,
        request_id: &R,
        g: usize,
        spec: &KvGroupSpec,
        slots: GroupSlots,
        num_computed: usize,
    ) -> Option<(usize, usize)> {
        let alignment = spec.prefill_checkpoint_alignment()?;
        let bs = self.block_size;
        let end = slots.of(spec);
        let (drop_eagle, lookahead) = (self.drop_eagle_checkpoint_block, self.hash_lookahead);
        let position = mamba_checkpoint_position(end, bs, drop_eagle, lookahead);
        if !mamba_checkpoint_valid(num_computed, end, position, bs, alignment) {
            return None;
        }
        let slot = end.div_ceil(bs).checked_sub(2)?;
        let (table, allocated) = match self.requests.get(request_id) {
            Some(r) => (r.tables[g].as_slice(), r.align[g].allocated),
            None => (&[][..], false),
        };
        let num_spec = spec.num_speculative_blocks();
        let free = slot >= table.len()
            || table[slot] == NULL_BLOCK
            || (allocated && slot >= table.len().saturating_sub(num_spec));
        free.then_some((position, slot))
    }

    /// [`Self::internal_checkpoint`] of every group (`None` for groups without one); empty,
    /// allocating nothing, when no group has a checkpoint block.
    pub(super) fn internal_checkpoints(
        &self,
        request_id: &R,
        slots: GroupSlots,
        num_computed: usize,
    ) -> Vec<Option<(usize, usize)>> {
        let any = self
            .groups
            .iter()
            .any(|g| g.prefill_checkpoint_alignment().is_some());
        if !any {
            return Vec::new();
        }
        (self.groups.iter().enumerate())
            .map(|(g, spec)| self.internal_checkpoint(request_id, g, spec, slots, num_computed))
            .collect()
    }

    /// Blocks a first allocation that loads `num_external` tokens after `hit` (`total`
    /// computed then) takes beyond vLLM's count of it: one per Mamba align group whose count
    /// the cap bounds (its loaded state block is not in the count; see
    /// `allocate_slots_external`).
    pub(super) fn load_overshoot(
        &self,
        request_id: &R,
        hit: Option<&super::GroupedComputedBlocks>,
        slots: GroupSlots,
        total: usize,
        num_external: usize,
    ) -> usize {
        if num_external == 0 {
            return 0;
        }
        (self.groups.iter().enumerate())
            .filter(|(_, spec)| spec.is_mamba_align())
            .filter(|&(g, spec)| {
                // The group's own block size (beside differing sizes not the hash block's).
                let bs = self.sizes.groups[g];
                let hit_len = hit.map_or(0, |h| h.block_ids[g].len());
                let held = hit_len.max(spec.num_skipped_tokens(total) / bs);
                let required = spec.num_required_blocks(slots.of(spec), bs);
                let checkpoint = self.internal_checkpoint(request_id, g, spec, slots, total);
                let cap = 1 + usize::from(checkpoint.is_some()) + spec.num_speculative_blocks();
                required.saturating_sub(held) > cap
            })
            .count()
    }

    /// vLLM 0.33's `Scheduler._request_remaining_blocks`: the blocks the request still
    /// needs for its `num_tokens` and `num_spec_slots` more of one speculative step (`1 + k
    /// + lookahead`), window groups capped at the admission cap for `max_in_flight_tokens`;
    /// a Mamba align group counts its tokens without the step's slots (vLLM passes
    /// `num_tokens_main_model` without them).
    pub fn remaining_blocks(
        &self,
        request_id: &R,
        num_tokens: usize,
        num_spec_slots: usize,
        max_in_flight_tokens: usize,
    ) -> usize {
        let num_computed = self
            .requests
            .get(request_id)
            .map_or(0, |r| r.tokens.num_computed_tokens);
        let slots = GroupSlots {
            decoder: num_tokens + num_spec_slots,
            encoder: 0,
            lookahead: num_spec_slots,
        };
        self.num_blocks_to_allocate(
            request_id,
            slots,
            num_computed,
            None,
            Some(max_in_flight_tokens),
        )
    }
}
