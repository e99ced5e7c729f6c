//! vLLM 0.33's prefix-cache rules for EAGLE/EAGLE3/MTP drafters (`PrefixRules`), which
//! the block pool and the coordinator follow when set (all off: the classic rules, and
//! nothing here runs).
//!
//! - **Hash look-ahead** (`VllmConfig.num_hash_lookahead_tokens`, L): each block's hash also
//!   covers the L tokens after it (`get_request_block_hasher` in `v1/core/kv_cache_utils.py`:
//!   the drafter's KV at a block's last position reads them), so a block gets its hash, and
//!   can be cached or hit, only once those tokens exist. Here the hashed bytes are the
//!   block's tokens followed by those L tokens (vLLM keys them as extra keys: an equal
//!   split of the same information, one pool having one block size and one L).
//! - **The trailing-block drop** (`use_eagle` of `KVCacheCoordinator`, when look-ahead
//!   hashes are off): a prefix hit loses its last block (`FullAttentionManager
//!   .find_longest_cache_hit`, `drop_eagle_block`), which is recomputed for the drafter.
//! - **Re-prefillable tokens** (`KVCacheCoordinator.num_reprefillable_tokens`,
//!   `max(0, num_prefill_lookahead - 1)`, multi-module MTP): the last ones of a request's
//!   computed tokens, drafts in flight not counted, are never cached
//!   (`get_num_cacheable_tokens`).
//!
//! Invariant: a request's `block_hashes` and `tail_tokens` together hold every token the
//! pool knows of it, in order: `block_hashes.len() * block_size + tail_tokens.len()` of
//! them (with L > 0 the tail keeps the L tokens past the last hashed block, and more).

use super::block_hash::{BlockHash, hash_block};
use super::block_pool::RequestBlocks;
use super::{BlockPool, ComputedBlocks, FreeQueue, KvCoordinator, RequestKey, TokenId};
use crate::{Error, Result};

/// vLLM 0.33's prefix-cache rules for speculative decoding with a drafter that reads the
/// target's KV (module docs). `Default`: all off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixRules {
    /// Tokens past each block that its hash covers (vLLM's `num_hash_lookahead_tokens`).
    pub num_hash_lookahead_tokens: usize,
    /// Trailing computed tokens never cached (vLLM's `num_reprefillable_tokens`).
    pub num_reprefillable_tokens: usize,
    /// A prefix hit drops its last block (vLLM's `use_eagle` / `drop_eagle_block`).
    pub drop_eagle_block: bool,
}

impl PrefixRules {
    /// Whether any rule is on.
    pub fn any(&self) -> bool {
        *self != Self::default()
    }

    /// The computed tokens whose full blocks may be cached, of a request with `num_tokens`
    /// tokens (drafts not counted) and `num_computed_tokens` computed (drafts in flight
    /// counted). vLLM 0.33 caps at the request's tokens first (`KVCacheManager
    /// .allocate_slots`' `num_tokens_to_cache = min(computed + new, request.num_tokens)`;
    /// `update_from_output` hands the landed tokens, at most those), then holds back the
    /// re-prefillable ones (`KVCacheCoordinator.get_num_cacheable_tokens` of the one-group
    /// coordinator): drafts in flight never stand in for them.
    pub fn num_cacheable_tokens(&self, num_computed_tokens: usize, num_tokens: usize) -> usize {
        (num_computed_tokens.min(num_tokens)).saturating_sub(self.num_reprefillable_tokens)
    }
}

impl<R: RequestKey, Q: FreeQueue> BlockPool<R, Q> {
    /// The prefix-cache rules this pool follows.
    pub fn prefix_rules(&self) -> PrefixRules {
        self.rules
    }

    /// Follows `rules` from now on. Only while no request holds blocks (the rules are the
    /// pool's alone, which every entry's hashes and caching read); blocks cached before
    /// stay cached, under hashes the new rules never compute if the look-ahead changed.
    ///
    /// Errors: `ConfigError` with caching off, or while a request holds blocks.
    pub fn set_prefix_rules(&mut self, rules: PrefixRules) -> Result<()> {
        if rules.any() && !self.enable_caching() {
            return Err(Error::config(
                "num_hash_lookahead_tokens",
                rules.num_hash_lookahead_tokens,
                "EAGLE/MTP prefix-cache rules need prefix caching (enable_caching)",
            ));
        }
        if rules != self.rules && self.request_ids().next().is_some() {
            return Err(Error::config(
                "num_hash_lookahead_tokens",
                rules.num_hash_lookahead_tokens,
                "the prefix-cache rules change only while no request holds blocks",
            ));
        }
        self.rules = rules;
        Ok(())
    }
}

impl<R: RequestKey> KvCoordinator<R> {
    /// The hash look-ahead this coordinator follows (0: off).
    pub fn hash_lookahead(&self) -> usize {
        self.hash_lookahead
    }

    /// Hashes each block with the `lookahead` tokens after it from now on (vLLM 0.33's
    /// hybrid coordinator over look-ahead hashes; beside differing block sizes its
    /// full-attention groups then keep partial tail-block entries, `coordinator_sizes_tail`).
    /// The re-prefillable lag is not served with several groups (the scheduler refuses it).
    ///
    /// Errors: `ConfigError` as [`BlockPool::set_prefix_rules`].
    pub fn set_hash_lookahead(&mut self, lookahead: usize) -> Result<()> {
        if lookahead > 0 && !self.enable_caching() {
            return Err(Error::config(
                "num_hash_lookahead_tokens",
                lookahead,
                "a hash look-ahead needs prefix caching (enable_caching)",
            ));
        }
        if lookahead != self.hash_lookahead && self.num_requests() > 0 {
            return Err(Error::config(
                "num_hash_lookahead_tokens",
                lookahead,
                "the hash look-ahead changes only while no request holds blocks",
            ));
        }
        self.hash_lookahead = lookahead;
        self.refresh_partial_tails();
        Ok(())
    }
}

/// The trailing-block drop of vLLM 0.33's `FullAttentionManager.find_longest_cache_hit`
/// (`drop_eagle_block`): a hit loses its last block, the host tier's last if it reached
/// there (`num_computed_tokens` is the caller's to recount).
pub(crate) fn drop_eagle_block(hit: &mut ComputedBlocks) {
    if hit.num_host_blocks > 0 {
        hit.num_host_blocks -= 1;
    } else {
        hit.block_ids.pop();
    }
}

/// [`super::block_ops::append_tokens`] with a hash look-ahead of `lookahead` (> 0) tokens:
/// records `new_token_ids` and hashes every block whose look-ahead tokens they complete.
/// Hashes that came with a prefix hit are kept (its tokens are skipped).
pub(super) fn append_tokens(
    block_size: usize,
    lookahead: usize,
    request: &mut RequestBlocks,
    new_token_ids: &[TokenId],
) {
    let first_new = request.num_tokens - new_token_ids.len();
    let bs = block_size;
    let num_seen = request.block_hashes.len() * bs + request.tail_tokens.len();
    let skip = num_seen.saturating_sub(first_new).min(new_token_ids.len());
    request
        .tail_tokens
        .extend_from_slice(&new_token_ids[skip..]);
    let num_blocks = request.tail_tokens.len().saturating_sub(lookahead) / bs;
    if num_blocks == 0 {
        return;
    }
    let RequestBlocks {
        block_hashes,
        tail_tokens,
        extra_key,
        ..
    } = request;
    push_hashes(
        block_hashes,
        tail_tokens,
        bs,
        lookahead,
        *extra_key,
        num_blocks,
    );
    tail_tokens.drain(..num_blocks * bs);
}

/// Hashes the blocks whose own tokens the request's entry holds but whose look-ahead
/// tokens are only in `ahead` (tokens the request has past those the pool knows: sampled,
/// not yet computed), as vLLM's block hasher does when a token is appended. The pool's
/// known tokens are unchanged; nothing happens with the look-ahead off.
pub(super) fn hash_ahead(
    block_size: usize,
    lookahead: usize,
    request: &mut RequestBlocks,
    ahead: &[TokenId],
) {
    let tail_len = request.tail_tokens.len();
    if lookahead == 0 || ahead.is_empty() || tail_len < block_size {
        return;
    }
    let bs = block_size;
    let num_blocks = ((tail_len + ahead.len()).saturating_sub(lookahead) / bs).min(tail_len / bs);
    if num_blocks == 0 {
        return;
    }
    // The look-ahead tokens join the tail only while it is hashed.
    let RequestBlocks {
        block_hashes,
        tail_tokens,
        extra_key,
        ..
    } = request;
    tail_tokens.extend_from_slice(ahead);
    push_hashes(
        block_hashes,
        tail_tokens,
        bs,
        lookahead,
        *extra_key,
        num_blocks,
    );
    tail_tokens.truncate(tail_len);
    tail_tokens.drain(..num_blocks * bs);
}

/// Appends to `hashes` (the first blocks' hashes of `tokens`) the look-ahead hashes of the
/// following blocks, up to `max_blocks` blocks in all: block `i` is hashed only if `tokens`
/// holds the `lookahead` tokens past it.
pub fn hash_full_blocks_lookahead(
    hashes: &mut Vec<BlockHash>,
    tokens: &[TokenId],
    block_size: usize,
    lookahead: usize,
    extra_key: Option<u64>,
    max_blocks: usize,
) {
    let num_blocks = (tokens.len().saturating_sub(lookahead) / block_size).min(max_blocks);
    let first = hashes.len();
    let window = &tokens[(first * block_size).min(tokens.len())..];
    let num_new = num_blocks.saturating_sub(first);
    push_hashes(hashes, window, block_size, lookahead, extra_key, num_new);
}

/// Appends the look-ahead hashes of `window`'s first `num_blocks` blocks to `hashes`,
/// chained to its last: block `b` covers `window[b * bs..(b + 1) * bs + lookahead]`.
fn push_hashes(
    hashes: &mut Vec<BlockHash>,
    window: &[TokenId],
    bs: usize,
    lookahead: usize,
    extra_key: Option<u64>,
    num_blocks: usize,
) {
    hashes.reserve(num_blocks);
    for b in 0..num_blocks {
        let parent = hashes.last().copied();
        let covered = &window[b * bs..(b + 1) * bs + lookahead];
        hashes.push(hash_block(parent, covered, extra_key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's entry hashed with `lookahead` (the pool's rule, which the calls pass).
    struct Entry {
        r: RequestBlocks,
        lookahead: usize,
    }

    fn entry(lookahead: usize) -> Entry {
        let r = RequestBlocks {
            block_ids: Vec::new(),
            block_hashes: Vec::new(),
            tail_tokens: Vec::new(),
            num_tokens: 0,
            num_computed_tokens: 0,
            num_cached_blocks: 0,
            extra_key: None,
        };
        Entry { r, lookahead }
    }

    fn append(entry: &mut Entry, tokens: &[TokenId]) {
        entry.r.num_tokens += tokens.len();
        append_tokens(2, entry.lookahead, &mut entry.r, tokens);
    }

    #[test]
    fn a_block_is_hashed_once_its_lookahead_tokens_exist() {
        // Block size 2, L = 1: [0, 1, 2, 3] hashes block [0, 2) (with token 2) only.
        let mut r = entry(1);
        append(&mut r, &[0, 1, 2, 3]);
        assert_eq!(r.r.block_hashes.len(), 1);
        assert_eq!(r.r.tail_tokens, vec![2, 3]);
        append(&mut r, &[5]);
        assert_eq!(r.r.block_hashes.len(), 2);
        let mut whole = Vec::new();
        hash_full_blocks_lookahead(&mut whole, &[0, 1, 2, 3, 5], 2, 1, None, usize::MAX);
        assert_eq!(r.r.block_hashes, whole);
    }

    #[test]
    fn the_lookahead_tokens_key_the_hash() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        hash_full_blocks_lookahead(&mut a, &[0, 1, 2, 3, 5], 2, 1, None, usize::MAX);
        hash_full_blocks_lookahead(&mut b, &[0, 1, 2, 3, 6], 2, 1, None, usize::MAX);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        // Same tokens, no look-ahead: other hashes (legacy ones).
        let mut legacy = Vec::new();
        super::super::hash_full_blocks(&mut legacy, &[0, 1, 2, 3, 5], 2, None);
        assert_ne!(a[0], legacy[0]);
    }

    #[test]
    fn tokens_given_one_at_a_time_hash_as_all_at_once() {
        let tokens: Vec<TokenId> = (0..23).map(|t| t * 7 % 11).collect();
        for lookahead in 1..4 {
            let mut r = entry(lookahead);
            tokens.iter().for_each(|&t| append(&mut r, &[t]));
            let mut whole = Vec::new();
            hash_full_blocks_lookahead(&mut whole, &tokens, 2, lookahead, None, usize::MAX);
            assert_eq!(r.r.block_hashes, whole);
            assert_eq!(r.r.block_hashes.len(), (23 - lookahead) / 2);
        }
    }

    #[test]
    fn tokens_ahead_of_the_known_ones_complete_a_hash() {
        // Known [0, 1, 2, 3] (computed), token 5 sampled: block [2, 4) is hashed with it,
        // and the pool still knows 4 tokens.
        let mut r = entry(1);
        append(&mut r, &[0, 1, 2, 3]);
        hash_ahead(2, r.lookahead, &mut r.r, &[5]);
        assert_eq!((r.r.block_hashes.len(), r.r.num_tokens), (2, 4));
        assert!(r.r.tail_tokens.is_empty());
        let mut whole = Vec::new();
        hash_full_blocks_lookahead(&mut whole, &[0, 1, 2, 3, 5], 2, 1, None, usize::MAX);
        assert_eq!(r.r.block_hashes, whole);
        // The token then given as known is not hashed twice.
        append(&mut r, &[5, 7]);
        assert_eq!(r.r.block_hashes.len(), 2);
        append(&mut r, &[8]);
        hash_full_blocks_lookahead(&mut whole, &[0, 1, 2, 3, 5, 7, 8], 2, 1, None, usize::MAX);
        assert_eq!(r.r.block_hashes, whole);
    }

    #[test]
    fn reprefillable_tokens_are_not_cacheable() {
        let rules = PrefixRules {
            num_reprefillable_tokens: 2,
            ..PrefixRules::default()
        };
        assert_eq!(rules.num_cacheable_tokens(9, 9), 7);
        assert_eq!(rules.num_cacheable_tokens(1, 1), 0);
        // Drafts in flight (computed 57 of 53 tokens) do not cover the held-back tokens:
        // 53 - 3 = 50 (3 blocks of 16), not min(57 - 3, 53) = 53.
        let mtp = PrefixRules {
            num_reprefillable_tokens: 3,
            ..PrefixRules::default()
        };
        assert_eq!(mtp.num_cacheable_tokens(57, 53), 50);
        assert_eq!(mtp.num_cacheable_tokens(52, 48), 45);
        assert_eq!(PrefixRules::default().num_cacheable_tokens(57, 53), 53);
        assert!(!PrefixRules::default().any());
    }
}
