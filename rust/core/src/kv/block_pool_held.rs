//! The block pool's allocation for a request it already holds (every step of a running
//! request): the plan, the checks and the update read its one entry, looked up once.

use super::{
    BlockPool, FreeQueue, NewTokens, RequestKey, blocks_needed, check_allocation, check_extra_key,
};
use crate::Result;

impl<R: RequestKey, Q: FreeQueue> BlockPool<R, Q> {
    /// [`Self::allocate`] for a request the pool holds, without a hit (every step of a
    /// running request): the plan, the checks and the update read the one entry, looked up
    /// once (`plan_allocation`, then the insert check, then the update looked it up three
    /// times). Same checks in the same order, same answer. `None`: no entry.
    pub(super) fn allocate_held(
        &mut self,
        request_id: &R,
        new: &NewTokens<'_>,
        extra_key: Option<u64>,
    ) -> Option<Result<Option<usize>>> {
        let block_size = self.block_size;
        let (requests, growth) = self.split_for_growth();
        let request = requests.get_mut(request_id)?;
        if let Err(e) = check_allocation(request_id, new.num_tokens, true, false).and_then(|()| {
            check_extra_key(extra_key, request.extra_key, "request was admitted with")
        }) {
            return Some(Err(e));
        }
        let num_slots = request.num_computed_tokens + new.num_tokens + new.num_lookahead;
        let num_new_blocks = blocks_needed(num_slots, block_size, request.block_ids.len());
        if num_new_blocks > growth.num_free_blocks() {
            return Some(Ok(None));
        }
        let new_token_ids = match new.after_known {
            true => &new.token_ids[request.num_tokens.min(new.token_ids.len())..],
            false => new.token_ids,
        };
        growth.grow(
            request,
            num_new_blocks,
            new_token_ids,
            new.num_tokens,
            new.cache,
        );
        Some(Ok(Some(num_new_blocks)))
    }
}
