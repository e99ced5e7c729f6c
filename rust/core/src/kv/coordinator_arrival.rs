//! A request that arrives computed (vLLM 0.33's `add_request` with
//! `request.num_computed_tokens > 0`, a P/D decode side's) over several KV groups. Its first
//! `allocate_slots` adopts no hit and loads nothing, so vLLM's coordinator calls no
//! `allocate_new_computed_blocks`: every group's `allocate_new_blocks` gives it new blocks
//! for all its slots from 0, a window group's below its window included (a Mamba `align`
//! group nulls the slots before its running state, as on any first allocation); they are
//! freed by the next allocation's `remove_skipped_blocks`. The count that admits it
//! (`get_num_blocks_to_allocate` with `total_computed_tokens` the arrived tokens) skips
//! what a window has left and counts a Mamba `align` group's table from 0. Invariant: the
//! blocks taken are the count plus, per group that is not Mamba `align`, the blocks its
//! window has left; when those do not fit, vLLM's `BlockPool.get_new_blocks` raises, and
//! so does the core (`Error::Capacity`), before changing anything.

use super::{
    BlockId, GroupSlots, GroupedComputedBlocks, KvCapacity, KvCoordinator, RequestKey, TokenId,
};
use crate::{Error, Result};

/// The error where vLLM 0.33's `BlockPool.get_new_blocks` raises `ValueError` ("Cannot
/// get N free blocks from the pool"): its count admitted the request, its allocation then
/// wants more than the free blocks.
pub(super) fn overdraw(taken: usize, free: usize) -> Error {
    Error::Capacity {
        what: "the blocks of a request that arrived with num_computed_tokens (vLLM 0.33's \
               count skips what a window has left, its allocation does not; its \
               get_new_blocks raises here)",
        requested: taken,
        available: free,
    }
}

impl<R: RequestKey> KvCoordinator<R> {
    /// The first allocation of a request that arrived with `num_computed_tokens` computed
    /// (no hit, nothing held): slots for those and `num_new_tokens` more (and
    /// `num_lookahead_tokens`), as vLLM 0.33's `allocate_slots` gives them (module doc);
    /// the full blocks of the computed and new tokens cached. `token_ids`: the request's
    /// tokens. Returns each group's new blocks, or `Ok(None)` when vLLM's count does not
    /// fit.
    ///
    /// Errors: `InputError` when the request holds blocks; `Error::Capacity` where vLLM's
    /// count fits but its allocation does not (vLLM raises there); nothing changes then.
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_slots_arrived(
        &mut self,
        request_id: &R,
        token_ids: &[TokenId],
        num_computed_tokens: usize,
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        extra_key: Option<u64>,
        num_encoder_tokens: usize,
    ) -> Result<Option<Vec<Vec<BlockId>>>> {
        if self.requests.contains_key(request_id) {
            return Err(Error::input(
                "num_computed_tokens",
                num_computed_tokens,
                format!(
                    "request {request_id:?} already holds blocks (only its first allocation arrives computed)"
                ),
            ));
        }
        let (n, lookahead, c) = (num_new_tokens, num_lookahead_tokens, num_computed_tokens);
        let from = (0, num_encoder_tokens, c);
        self.allocate_slots_from(request_id, token_ids, n, lookahead, None, extra_key, from)
    }

    /// vLLM 0.33's full-sequence admission gate for a request that arrived with
    /// `num_computed_tokens` and holds nothing: `get_num_blocks_to_allocate` over
    /// `num_tokens` with those as `total_computed_tokens`, window groups capped for
    /// `max_in_flight_tokens` (`apply_admission_cap`).
    pub fn full_sequence_fits_arrived(
        &self,
        request_id: &R,
        num_tokens: usize,
        num_computed_tokens: usize,
        max_in_flight_tokens: usize,
        num_encoder_tokens: usize,
    ) -> bool {
        let slots = GroupSlots {
            encoder: num_encoder_tokens,
            ..GroupSlots::decoder(num_tokens)
        };
        let cap = Some(max_in_flight_tokens);
        let (needed, _) = self.arrival_needs(request_id, slots, num_computed_tokens, cap);
        needed <= self.num_free_blocks()
    }

    /// `(vLLM's count, blocks taken)` for the first allocation of `slots` of a request that
    /// arrived with `num_computed` tokens: the count skips the blocks a window (or chunk)
    /// has left, and counts a Mamba `align` table from 0 (vLLM's align-mode count subtracts
    /// only hit and held blocks, capped at `physical_block_cap`); the allocation takes the
    /// skipped blocks too.
    pub(super) fn arrival_needs(
        &self,
        request_id: &R,
        slots: GroupSlots,
        num_computed: usize,
        max_in_flight_tokens: Option<usize>,
    ) -> (usize, usize) {
        let hit: Option<&GroupedComputedBlocks> = None;
        let counted =
            self.num_blocks_to_allocate(request_id, slots, num_computed, hit, max_in_flight_tokens);
        let extra = self.window_extra_retained;
        let (mut align_short, mut skipped_taken) = (0, 0);
        for (g, spec) in self.groups.iter().enumerate() {
            let bs = self.sizes.groups[g];
            let required = spec.num_required_blocks(slots.of(spec), bs);
            let skipped = spec.num_skipped_tokens_retaining(num_computed, extra) / bs;
            if spec.is_mamba_align() {
                let checkpoint = self.internal_checkpoint(request_id, g, spec, slots, num_computed);
                let cap = 1 + usize::from(checkpoint.is_some()) + spec.num_speculative_blocks();
                align_short += required.min(cap) - required.saturating_sub(skipped).min(cap);
            } else {
                let capped = max_in_flight_tokens
                    .and_then(|f| spec.max_admission_blocks_retaining(f, bs, extra))
                    .map_or(required, |cap| required.min(cap));
                skipped_taken += skipped.min(capped);
            }
        }
        let needed = counted + align_short;
        (needed, needed + skipped_taken)
    }
}
