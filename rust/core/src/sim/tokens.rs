//! Token ids for simulated prompts. Workloads carry prefix identity as block content ids
//! (each covering `hash_block_size` prompt tokens); prefix caches and routers work on token
//! ids, so each block id is expanded into the same tokens wherever it appears, and the rest
//! of a prompt gets tokens unique to its request.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::kv::{BlockHash, TokenId, content_block, hash_block, hash_content, hash_full_blocks};

fn mix(a: u64, b: u64) -> TokenId {
    mix64(a, b) as TokenId
}

fn mix64(a: u64, b: u64) -> u64 {
    let mut z = a
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(b.wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The prompt of request `request_id` with `num_tokens` tokens and block ids `hash_ids`.
pub fn synthesize_prompt(
    request_id: u64,
    num_tokens: u32,
    hash_ids: &[u64],
    hash_block_size: u32,
) -> Vec<TokenId> {
    synthesize_prompt_with_room(request_id, num_tokens, hash_ids, hash_block_size, 0)
}

/// [`synthesize_prompt`] in a vector with room for `extra` more tokens (the outputs to
/// come), so a scheduler that appends them never moves a long prompt. Filled block by
/// block, not token by token: this runs for every arriving token of a replay.
pub fn synthesize_prompt_with_room(
    request_id: u64,
    num_tokens: u32,
    hash_ids: &[u64],
    hash_block_size: u32,
    extra: usize,
) -> Vec<TokenId> {
    BlockTokens::new(hash_block_size, 0).prompt(request_id, num_tokens, hash_ids, extra)
}

/// Tokens the block-token memo holds at most, over all its blocks (4 MiB).
pub const MEMO_TOKENS: usize = 1 << 20;

/// Prompt synthesis that generates each shared block's tokens once while it stays in a
/// small memo, instead of at every prompt that repeats its block id (a popular prefix is
/// repeated by thousands of requests). Direct-mapped by block id and bounded
/// (`memo_tokens`). A block enters the memo the second time its slot sees its id: the
/// first time its tokens go straight into the prompt, so a trace of mostly unique ids (the
/// built-in workload gives every unshared block an id of its own, Mooncake's ids rarely
/// repeat) writes an id per block, not its tokens twice. The tokens are the same as
/// [`synthesize_prompt`]'s with or without it.
pub struct BlockTokens {
    block: usize,
    /// Slots of the memo, allocated at the first prompt (a replica that never makes one,
    /// or a cluster of hundreds of small ones, holds none).
    num_slots: usize,
    /// Slot `id % len`: the block id whose tokens it holds (`None`: empty) and the tokens.
    slots: Vec<(Option<u64>, Box<[TokenId]>)>,
    /// Per slot, the last id it saw and did not keep, plus one (0: none; an id of
    /// `u64::MAX` then counts as seen, which only keeps it a sight early).
    seen: Vec<u64>,
}

impl BlockTokens {
    /// What its tokens depend on besides the ids: memos of one shape can be shared.
    fn shape(&self) -> (usize, usize) {
        (self.block, self.num_slots)
    }

    pub fn new(hash_block_size: u32, memo_tokens: usize) -> Self {
        let block = hash_block_size.max(1) as usize;
        let num_slots = memo_tokens / block;
        Self {
            block,
            num_slots,
            slots: Vec::new(),
            seen: Vec::new(),
        }
    }

    /// The prompt of request `request_id` (see [`synthesize_prompt_with_room`]).
    pub fn prompt(
        &mut self,
        request_id: u64,
        num_tokens: u32,
        hash_ids: &[u64],
        extra: usize,
    ) -> Vec<TokenId> {
        self.prompt_after(request_id, num_tokens, hash_ids, extra, 0)
    }

    /// [`Self::prompt`] with its first `num_unread` tokens (at most those its ids give)
    /// left 0: tokens no one reads, those of the KV blocks the pool is given named
    /// (`IdBlockHashes`), whose synthesis was a tenth of a Mooncake replay.
    pub fn prompt_after(
        &mut self,
        request_id: u64,
        num_tokens: u32,
        hash_ids: &[u64],
        extra: usize,
        num_unread: usize,
    ) -> Vec<TokenId> {
        let num_tokens = num_tokens as usize;
        let block = self.block;
        let num_unread = num_unread.min(num_tokens).min(hash_ids.len() * block);
        let mut tokens = Vec::with_capacity(num_tokens + extra);
        tokens.resize(num_unread, 0);
        let first = num_unread / block;
        for (&id, start) in hash_ids[first..]
            .iter()
            .zip((first * block..num_tokens).step_by(block))
        {
            let len = block.min(num_tokens - start);
            if start < num_unread {
                // The trace block read from its middle: only its read tail is made.
                let from = (num_unread - start) as u64;
                tokens.extend((from..len as u64).map(|offset| mix(id, offset)));
                continue;
            }
            match self.block_tokens(id) {
                Some(memo) => tokens.extend_from_slice(&memo[..len]),
                None => tokens.extend((0..len as u64).map(|offset| mix(id, offset))),
            }
        }
        let num_shared = tokens.len() as u64;
        tokens.extend((num_shared..num_tokens as u64).map(|pos| private_token(request_id, pos)));
        tokens
    }

    /// The whole block of `id` from the memo (generated into it on its second sight);
    /// `None` without a memo or on a first sight.
    fn block_tokens(&mut self, id: u64) -> Option<&[TokenId]> {
        if self.num_slots == 0 {
            return None;
        }
        if self.slots.is_empty() {
            self.slots = (0..self.num_slots)
                .map(|_| (None, Box::default()))
                .collect();
            self.seen = vec![0; self.num_slots];
        }
        let num_slots = self.num_slots as u64;
        let block = self.block;
        let index = (id % num_slots) as usize;
        let (held, memo) = &mut self.slots[index];
        if *held != Some(id) {
            if self.seen[index] != id.wrapping_add(1) {
                self.seen[index] = id.wrapping_add(1);
                return None;
            }
            if memo.len() != block {
                *memo = vec![0; block].into_boxed_slice();
            }
            for (offset, token) in memo.iter_mut().enumerate() {
                *token = mix(id, offset as u64);
            }
            *held = Some(id);
        }
        Some(memo)
    }
}

/// Block hashes the memo holds at most, over all its trace blocks (4 MiB).
pub const MEMO_HASHES: usize = 1 << 18;

/// Trace blocks the memo holds at most (8,192: 32-hash blocks fill `MEMO_HASHES`).
const MEMO_SLOTS: usize = 1 << 13;

/// KV blocks a trace block must hold for [`TraceBlockHashes`] to be used (with 16-token
/// trace blocks and KV blocks, the built-in workload's, it made the replay 1.3x slower).
pub const MIN_KV_BLOCKS: usize = 8;

/// The KV block hashes of a prompt's trace blocks, computed once per (parent hash, block
/// id, extra key) while they stay in a small memo. A trace block's tokens depend only on
/// its id, so the hashes of the KV blocks it holds depend only on the hash before it, its
/// id and the extra key: a popular prefix is hashed once, not at every prompt repeating
/// it. Direct-mapped and bounded (`memo_hashes`) like [`BlockTokens`]. The hashes are the
/// block-hash pool's own (`crate::kv::hash_block`), with or without the memo.
///
/// A block enters the memo the second time its slot sees it: a trace of mostly unique
/// ids (the Mooncake traces) then writes a fingerprint per block, not its hashes (writing
/// each unique block's hashes into a 4 MiB memo cost more than the hits saved there).
pub struct TraceBlockHashes {
    /// Tokens per trace block and per KV block; the second divides the first.
    trace_block: usize,
    kv_block: usize,
    /// Allocated at the first prompt (`num_slots` of them): a replica that never hashes
    /// (or a cluster of hundreds of small ones) holds none.
    num_slots: usize,
    slots: Vec<(Option<MemoKey>, Box<[BlockHash]>)>,
    /// Per slot, the fingerprint of the last block it saw and did not keep.
    seen: Vec<u64>,
}

type MemoKey = (Option<BlockHash>, u64, Option<u64>);

impl TraceBlockHashes {
    /// What its hashes depend on besides the keys: memos of one shape can be shared.
    fn shape(&self) -> (usize, usize, usize) {
        (self.trace_block, self.kv_block, self.num_slots)
    }

    /// `None` when KV blocks of `block_size` tokens do not tile trace blocks of
    /// `hash_block_size` (a KV block would straddle two ids), or when a trace block holds
    /// fewer than [`MIN_KV_BLOCKS`] of them (the memo's lookup would cost what it saves).
    pub fn new(hash_block_size: u32, block_size: usize, memo_hashes: usize) -> Option<Self> {
        let trace_block = hash_block_size as usize;
        if block_size == 0 || trace_block == 0 || !trace_block.is_multiple_of(block_size) {
            return None;
        }
        let per_block = trace_block / block_size;
        if per_block < MIN_KV_BLOCKS {
            return None;
        }
        Some(Self {
            trace_block,
            kv_block: block_size,
            // Capped: with trace blocks of one KV block each, slots would outnumber what
            // they save (96 bytes of slot per 16-byte hash).
            num_slots: (memo_hashes / per_block).min(MEMO_SLOTS),
            slots: Vec::new(),
            seen: Vec::new(),
        })
    }

    /// Appends to `hashes` (empty) the hashes of the KV blocks in the leading trace blocks
    /// that `tokens`, the prompt made from `hash_ids`, holds whole.
    pub fn extend(
        &mut self,
        hashes: &mut Vec<BlockHash>,
        tokens: &[TokenId],
        hash_ids: &[u64],
        extra_key: Option<u64>,
    ) {
        debug_assert!(hashes.is_empty());
        if self.slots.len() != self.num_slots {
            self.slots = (0..self.num_slots)
                .map(|_| (None, Box::default()))
                .collect();
            self.seen = vec![0; self.num_slots];
        }
        let num_whole = (tokens.len() / self.trace_block).min(hash_ids.len());
        hashes.reserve(num_whole * (self.trace_block / self.kv_block));
        for (k, &id) in hash_ids[..num_whole].iter().enumerate() {
            let parent = hashes.last().copied();
            let block_tokens = &tokens[k * self.trace_block..(k + 1) * self.trace_block];
            let key = (parent, id, extra_key);
            let num_slots = self.slots.len() as u64;
            if num_slots == 0 {
                push_hashes(hashes, parent, block_tokens, self.kv_block, extra_key);
                continue;
            }
            let parent_bits = parent.map_or(0, |h| h.0 as u64 ^ (h.0 >> 64) as u64);
            let fingerprint = mix64(id ^ extra_key.map_or(0, |k| mix64(k, 1)), parent_bits);
            let index = (fingerprint % num_slots) as usize;
            let (held, memo) = &mut self.slots[index];
            if *held != Some(key) && self.seen[index] != fingerprint {
                // First sight: hashed, not kept.
                self.seen[index] = fingerprint;
                push_hashes(hashes, parent, block_tokens, self.kv_block, extra_key);
                continue;
            }
            if *held != Some(key) {
                let per_block = self.trace_block / self.kv_block;
                if memo.len() != per_block {
                    *memo = vec![BlockHash(0); per_block].into_boxed_slice();
                }
                let mut parent = parent;
                for (hash, kv_block) in memo
                    .iter_mut()
                    .zip(block_tokens.chunks_exact(self.kv_block))
                {
                    *hash = hash_block(parent, kv_block, extra_key);
                    parent = Some(*hash);
                }
                *held = Some(key);
            }
            hashes.extend_from_slice(memo);
        }
    }
}

/// Tokens of a request, from its first, that are its block ids' own (`mix(id, offset)`),
/// whose KV blocks [`IdBlockHashes`] names by id: the prompt's up to the end of its ids,
/// and, when the ids reach past the prompt (a conversation's turn, see
/// [`shared_output_token`]), the outputs' up to the end of the ids too. `num_prompt_tokens`
/// is the prompt as synthesized (`SimRequest::num_prefill_tokens`), `original_prefill_tokens`
/// the prompt that decides whether outputs are shared (as [`shared_output_token`] takes it).
pub fn num_id_tokens(
    num_prompt_tokens: u32,
    original_prefill_tokens: u32,
    hash_ids: &[u64],
    hash_block_size: u32,
) -> usize {
    let block = hash_block_size.max(1) as usize;
    let num_covered = hash_ids.len() * block;
    let shared = hash_ids.len() > (original_prefill_tokens as usize).div_ceil(block);
    if shared {
        num_covered
    } else {
        num_covered.min(num_prompt_tokens as usize)
    }
}

/// KV block hashes named by trace block id (`kv::hash_block_id`: the hash before the trace
/// block, its id, the KV block's place in it, extra key) instead of hashed from synthesized tokens. A trace
/// block's tokens depend only on its id, so a KV block inside one is named by (id, offset)
/// as exactly as by its tokens; naming costs one short hash per KV block and no tokens.
/// Every KV block that lies whole inside a request's id tokens ([`num_id_tokens`]) must be
/// named so, wherever it is hashed (the replica's prompts, the router's prefix index), and
/// no other block: [`prompt_block_hashes`] is the one rule both use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdBlockHashes {
    trace_block: usize,
    kv_block: usize,
}

#[cfg(test)]
thread_local! {
    /// Tests turn naming off to compare whole simulations against token hashing.
    pub(crate) static NAME_BY_ID: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

impl IdBlockHashes {
    /// `None` when KV blocks of `block_size` tokens do not tile trace blocks of
    /// `hash_block_size` (a KV block would straddle two ids): blocks are then hashed from
    /// their tokens.
    pub fn new(hash_block_size: u32, block_size: usize) -> Option<Self> {
        #[cfg(test)]
        if !NAME_BY_ID.get() {
            return None;
        }
        let trace_block = hash_block_size.max(1) as usize;
        (block_size > 0 && trace_block.is_multiple_of(block_size)).then_some(Self {
            trace_block,
            kv_block: block_size,
        })
    }

    /// Tokens of the KV blocks whole inside the first `num_id_tokens` tokens.
    pub fn num_named_tokens(&self, num_id_tokens: usize) -> usize {
        num_id_tokens / self.kv_block * self.kv_block
    }

    /// Appends to `hashes` (empty) the names of the KV blocks whole inside the first
    /// `num_id_tokens` tokens.
    pub fn extend(
        &self,
        hashes: &mut Vec<BlockHash>,
        hash_ids: &[u64],
        num_id_tokens: usize,
        extra_key: Option<u64>,
    ) {
        debug_assert!(hashes.is_empty());
        let per_block = self.trace_block / self.kv_block;
        let num_blocks = num_id_tokens / self.kv_block;
        hashes.reserve(num_blocks);
        // One digest per trace block, chained to the last KV block before it; its KV
        // blocks are that seed and their place (`kv::hash_block_id`).
        for (k, &id) in hash_ids[..num_blocks.div_ceil(per_block)]
            .iter()
            .enumerate()
        {
            let seed = hash_content(hashes.last().copied(), id, extra_key);
            let num_here = per_block.min(num_blocks - k * per_block);
            hashes.extend((0..num_here as u32).map(|offset| content_block(seed, offset)));
        }
    }
}

/// The hashes of every full KV block of a request's prompt as its replicas' block-hash
/// pools name them: by id inside its id tokens ([`IdBlockHashes`], when KV blocks tile
/// trace blocks), then from its synthesized tokens (made only if blocks remain).
#[allow(clippy::too_many_arguments)]
pub fn prompt_block_hashes(
    request_id: u64,
    num_prompt_tokens: u32,
    original_prefill_tokens: u32,
    hash_ids: &[u64],
    hash_block_size: u32,
    block_size: usize,
    extra_key: Option<u64>,
) -> Vec<BlockHash> {
    let mut hashes = Vec::new();
    if let Some(ids) = IdBlockHashes::new(hash_block_size, block_size) {
        let num_ids = num_id_tokens(
            num_prompt_tokens,
            original_prefill_tokens,
            hash_ids,
            hash_block_size,
        );
        ids.extend(
            &mut hashes,
            hash_ids,
            num_ids.min(num_prompt_tokens as usize),
            extra_key,
        );
    }
    if hashes.len() < num_prompt_tokens as usize / block_size.max(1) {
        let tokens = synthesize_prompt(request_id, num_prompt_tokens, hash_ids, hash_block_size);
        hash_full_blocks(&mut hashes, &tokens, block_size, extra_key);
    }
    hashes
}

/// A memo that replicas may share (each holds a handle; one replica runs at a time).
pub type Shared<T> = Arc<Mutex<T>>;

/// Locks a shared memo. The lock is never contended (replicas run one at a time), and a
/// panic while it is held ends the run that owns the memo, so poisoning is ignored.
pub fn lock<T>(memo: &Shared<T>) -> MutexGuard<'_, T> {
    memo.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The prompt memos of one simulation's replicas. A block's tokens depend only on its id,
/// a trace block's KV hashes only on (parent hash, id, extra key), so what one replica
/// memoized serves the others: the cluster keeps one memo per shape instead of one per
/// replica (up to 2.5 MB of slots each: 2.5 GB for 1,000 replicas). Memos are shared, not
/// copied; a replica offers its own and takes the first of the same shape.
#[derive(Default)]
pub struct PromptMemos {
    tokens: Vec<Shared<BlockTokens>>,
    hashes: Vec<Shared<TraceBlockHashes>>,
}

impl PromptMemos {
    /// Replaces `memo` with the shared token memo of its shape (or shares it, the first).
    pub fn share_tokens(&mut self, memo: &mut Shared<BlockTokens>) {
        share(&mut self.tokens, memo, BlockTokens::shape);
    }

    /// Replaces `memo` with the shared hash memo of its shape (or shares it, the first).
    pub fn share_hashes(&mut self, memo: &mut Shared<TraceBlockHashes>) {
        share(&mut self.hashes, memo, TraceBlockHashes::shape);
    }
}

fn share<T, K: PartialEq>(pool: &mut Vec<Shared<T>>, memo: &mut Shared<T>, shape: fn(&T) -> K) {
    let key = shape(&lock(memo));
    match pool.iter().find(|shared| shape(&lock(shared)) == key) {
        Some(shared) => *memo = Arc::clone(shared),
        None => pool.push(Arc::clone(memo)),
    }
}

/// Pushes the chained hashes of `tokens`' blocks, the first chained to `parent`.
fn push_hashes(
    hashes: &mut Vec<BlockHash>,
    mut parent: Option<BlockHash>,
    tokens: &[TokenId],
    block_size: usize,
    extra_key: Option<u64>,
) {
    for block in tokens.chunks_exact(block_size) {
        let hash = hash_block(parent, block, extra_key);
        hashes.push(hash);
        parent = Some(hash);
    }
}

/// The output token at `position` (counted from the start of the prompt) when the request's
/// block ids reach past its prompt: a conversation's turn carries ids for its output too,
/// because the next turn's prompt repeats that output, and the two must share tokens for a
/// prefix cache to hit on them. `None` when the ids cover only the prompt (the usual case:
/// output tokens are then the request's own).
pub fn shared_output_token(
    num_prompt_tokens: u32,
    position: u64,
    hash_ids: &[u64],
    hash_block_size: u32,
) -> Option<TokenId> {
    let block = hash_block_size.max(1) as u64;
    if hash_ids.len() as u64 <= (num_prompt_tokens as u64).div_ceil(block) {
        return None;
    }
    let id = *hash_ids.get(usize::try_from(position / block).ok()?)?;
    Some(mix(id, position % block))
}

/// The token at `position` of a request's own (unshared) tokens. The salt no block id can
/// produce keeps them from matching other requests'.
pub fn private_token(request_id: u64, position: u64) -> TokenId {
    mix(request_id ^ 0xA5A5_5A5A_F0F0_0F0F, position | (1 << 63))
}

#[cfg(test)]
#[path = "id_names_tests.rs"]
mod id_names_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_block_ids_give_shared_tokens_and_the_rest_is_private() {
        let a = synthesize_prompt(1, 10, &[7, 8], 4);
        let b = synthesize_prompt(2, 10, &[7, 9], 4);
        assert_eq!(a[..4], b[..4]);
        assert_ne!(a[4..8], b[4..8]);
        assert_ne!(
            a[8..],
            b[8..],
            "tokens past the block ids are the request's own"
        );
    }

    #[test]
    fn block_by_block_matches_the_per_token_rule() {
        let ids = [7, 8, 9];
        // A memo of two 4-token slots: ids 7 and 9 share one, so it is refilled.
        let mut memo = BlockTokens::new(4, 8);
        for num_tokens in [1, 4, 5, 11, 12, 13, 20] {
            let tokens = synthesize_prompt_with_room(3, num_tokens, &ids, 4, 6);
            assert!(tokens.capacity() >= num_tokens as usize + 6);
            assert_eq!(memo.prompt(3, num_tokens, &ids, 0), tokens, "first sight");
            assert_eq!(memo.prompt(3, num_tokens, &ids, 0), tokens, "kept");
            assert_eq!(memo.prompt(3, num_tokens, &ids, 0), tokens, "from the memo");
            let expected: Vec<TokenId> = (0..num_tokens as u64)
                .map(|pos| match ids.get(pos as usize / 4) {
                    Some(&id) => mix(id, pos % 4),
                    None => private_token(3, pos),
                })
                .collect();
            assert_eq!(tokens, expected, "{num_tokens} tokens");
        }
    }

    #[test]
    fn unread_tokens_are_zero_and_the_rest_as_before() {
        let ids = [7, 8, 9];
        let mut memo = BlockTokens::new(4, 8);
        for num_tokens in [0, 3, 4, 9, 12, 15] {
            let full = synthesize_prompt(3, num_tokens, &ids, 4);
            for num_unread in 0..=16 {
                for _ in 0..3 {
                    let got = memo.prompt_after(3, num_tokens, &ids, 2, num_unread);
                    // Past the ids' 12 tokens, the request's own are made whatever asked.
                    let cut = num_unread.min(full.len()).min(12);
                    assert!(got[..cut].iter().all(|&t| t == 0));
                    assert_eq!(got[cut..], full[cut..], "{num_tokens} tokens, {num_unread}");
                    assert!(got.capacity() >= full.len() + 2);
                }
            }
        }
    }

    #[test]
    fn trace_block_hashes_are_the_pools_own_with_or_without_the_memo() {
        use crate::kv::hash_full_blocks;
        let ids = [7, 8, 9, 7];
        // Two 8-hash slots for 32-token trace blocks of 4-token KV blocks: 7 and 9 may
        // share one, so entries are replaced.
        let mut memo = TraceBlockHashes::new(32, 4, 16).unwrap();
        let mut bare = TraceBlockHashes::new(32, 4, 0).unwrap();
        for (request, num_tokens) in [(1, 10), (2, 32), (3, 95), (4, 96), (5, 128), (6, 140)] {
            for extra_key in [None, Some(3)] {
                let tokens = synthesize_prompt(request, num_tokens, &ids, 32);
                let mut expected = Vec::new();
                hash_full_blocks(&mut expected, &tokens, 4, extra_key);
                let whole = (num_tokens as usize / 32).min(ids.len()) * 8;
                expected.truncate(whole);
                // First sight, kept on the second, read from the memo on the third.
                for pass in 0..4 {
                    let hashes = if pass < 3 { &mut memo } else { &mut bare };
                    let mut got = Vec::new();
                    hashes.extend(&mut got, &tokens, &ids, extra_key);
                    assert_eq!(got, expected, "{num_tokens} tokens, key {extra_key:?}");
                }
            }
        }
        assert!(
            TraceBlockHashes::new(64, 5, 8).is_none(),
            "5 does not divide 64"
        );
        assert!(
            TraceBlockHashes::new(16, 4, 8).is_none(),
            "4 blocks: too few"
        );
    }

    #[test]
    fn id_tokens_are_exactly_the_tokens_the_ids_give() {
        // 8-token trace blocks. Ids covering the prompt only, reaching past it (a turn
        // whose output the next turn repeats), ending before it; a Vidur-style restart
        // whose prompt grew past the original one.
        let cases: [(u32, u32, &[u64]); 6] = [
            (10, 10, &[7, 8]),
            (10, 10, &[7, 8, 9]),
            (20, 20, &[7, 8]),
            (16, 16, &[7, 8]),
            (5, 5, &[7]),
            (14, 10, &[7, 8]),
        ];
        for (n, original, ids) in cases {
            let c = num_id_tokens(n, original, ids, 8);
            let prompt = synthesize_prompt(1, n, ids, 8);
            for p in 0..n as usize + 24 {
                let token = match prompt.get(p) {
                    Some(&t) => t,
                    None => shared_output_token(original, p as u64, ids, 8).unwrap_or(u32::MAX),
                };
                let by_id = ids
                    .get(p / 8)
                    .is_some_and(|&id| token == mix(id, p as u64 % 8));
                assert_eq!(by_id, p < c, "{n} tokens, ids {ids:?}, position {p}");
            }
        }
    }

    #[test]
    fn blocks_are_named_by_id_inside_id_tokens_and_hashed_after() {
        use crate::kv::hash_block_id;
        let names = IdBlockHashes::new(8, 4).unwrap();
        // A 10-token turn whose ids reach past it: its outputs up to token 24 are id tokens,
        // named as the next turn's (22-token) prompt names them.
        let ids = [7, 8, 9];
        let mut turn = Vec::new();
        names.extend(&mut turn, &ids, num_id_tokens(10, 10, &ids, 8), None);
        assert_eq!(turn.len(), 6);
        let next = prompt_block_hashes(2, 22, 22, &[7, 8, 9, 10], 8, 4, None);
        assert_eq!(next, turn[..5]);
        assert_eq!(next[0], hash_block_id(None, 7, 0, None));
        assert_eq!(next[1], hash_block_id(None, 7, 1, None));
        assert_eq!(next[3], hash_block_id(Some(next[1]), 8, 1, None));
        // Past the ids, the prompt's own tokens are hashed, chained to the last name.
        let hashes = prompt_block_hashes(3, 30, 30, &[7, 8], 8, 4, Some(2));
        let tokens = synthesize_prompt(3, 30, &[7, 8], 8);
        let mut expected = hashes[..4].to_vec();
        hash_full_blocks(&mut expected, &tokens, 4, Some(2));
        assert_eq!(hashes, expected);
        assert_eq!(hashes[0], hash_block_id(None, 7, 0, Some(2)));
        // KV blocks straddling trace blocks: all hashed from tokens.
        assert!(IdBlockHashes::new(6, 4).is_none());
        let mut expected = Vec::new();
        hash_full_blocks(
            &mut expected,
            &synthesize_prompt(3, 30, &[7, 8], 6),
            4,
            None,
        );
        assert_eq!(
            prompt_block_hashes(3, 30, 30, &[7, 8], 6, 4, None),
            expected
        );
    }

    #[test]
    fn replicas_share_one_memo_per_shape() {
        let mut memos = PromptMemos::default();
        let mut first = Arc::new(Mutex::new(BlockTokens::new(16, MEMO_TOKENS)));
        let mut second = Arc::new(Mutex::new(BlockTokens::new(16, MEMO_TOKENS)));
        let mut other = Arc::new(Mutex::new(BlockTokens::new(32, MEMO_TOKENS)));
        memos.share_tokens(&mut first);
        memos.share_tokens(&mut second);
        memos.share_tokens(&mut other);
        assert!(Arc::ptr_eq(&first, &second), "same shape: one memo");
        assert!(
            !Arc::ptr_eq(&first, &other),
            "another trace block size: its own"
        );
        let mut hashes = |block_size| {
            let mut memo = Arc::new(Mutex::new(
                TraceBlockHashes::new(512, block_size, MEMO_HASHES).unwrap(),
            ));
            memos.share_hashes(&mut memo);
            memo
        };
        let (a, b, c) = (hashes(16), hashes(16), hashes(32));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c), "another KV block size: its own");
        // A shared memo answers each replica as its own would.
        let ids = [7, 8, 9];
        let expected = synthesize_prompt(5, 40, &ids, 16);
        for _ in 0..3 {
            assert_eq!(lock(&first).prompt(5, 40, &ids, 0), expected);
            assert_eq!(lock(&second).prompt(5, 40, &ids, 0), expected);
        }
    }

    #[test]
    fn output_tokens_are_shared_only_when_the_ids_reach_past_the_prompt() {
        // A 6-token prompt with 4-token blocks needs 2 ids: 2 ids cover only the prompt.
        assert_eq!(shared_output_token(6, 6, &[7, 8], 4), None);
        // With 3 ids, the output continues the blocks: the next turn's prompt (10 tokens
        // with the same 3 ids) has the same tokens at positions 6..10.
        let next_turn = synthesize_prompt(99, 10, &[7, 8, 9], 4);
        for position in 6..10 {
            assert_eq!(
                shared_output_token(6, position, &[7, 8, 9], 4),
                Some(next_turn[position as usize])
            );
        }
        assert_eq!(
            shared_output_token(6, 12, &[7, 8, 9], 4),
            None,
            "past the ids"
        );
    }
}
