//! Chained block hashes (vLLM V1 prefix caching): the hash of block i covers its own
//! token ids, the hash of block i-1 and an optional extra key (LoRA adapter, model id), so
//! equal hashes mean equal whole prefixes. 128-bit xxh3 keeps accidental collisions out of
//! reach and is stable across runs, processes and machines of the same endianness.

use std::cell::RefCell;

use xxhash_rust::xxh3::xxh3_128;

use super::TokenId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

thread_local! {
    /// The bytes of a block too long for the stack buffer, reused from block to block.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Tokens a block may hold to be laid out on the stack (vLLM's block sizes go to 64; a
/// sim's 512-token hash blocks are hashed in KV-block pieces).
const STACK_TOKENS: usize = 128;

/// Tokens of the small stack buffer, enough for the usual 16-token block: the buffer is
/// zeroed at every call, and zeroing the large one cost more than the hash on Mooncake's
/// 9M blocks (a 538-byte `memset` each).
const SMALL_TOKENS: usize = 16;

/// Bytes of the tagged parent hash and tagged extra key at most.
const HEADER_BYTES: usize = 1 + 16 + 1 + 8;

/// Hash of one full block, chained to its parent's hash.
///
/// The bytes hashed are: a tagged parent hash, a tagged extra key, then the token ids
/// little-endian. They are laid out in one buffer and hashed in one call: xxh3's one-shot
/// and streaming forms give the same digest, and the one-shot form is the faster (the
/// streaming hasher copied every block through its own buffer). The buffer is on the
/// stack for blocks of up to `STACK_TOKENS` tokens (this runs for every block of every
/// replayed prompt).
pub fn hash_block(
    parent: Option<BlockHash>,
    tokens: &[TokenId],
    extra_key: Option<u64>,
) -> BlockHash {
    #[cfg(test)]
    if tokens
        .first()
        .is_some_and(|&t| Some(t) == LOOKALIKE_TOKEN.get())
    {
        return look_alike(hash_block_digest(parent, tokens, extra_key));
    }
    hash_block_digest(parent, tokens, extra_key)
}

#[cfg(test)]
thread_local! {
    /// Planted for the differential test: a block of tokens opening with this token hashes
    /// to a look-alike of a named hash (the named mark in its low bits, as one token hash in
    /// 2^32 has by chance), which the named index must keep as exactly as any.
    pub(super) static LOOKALIKE_TOKEN: std::cell::Cell<Option<TokenId>> =
        const { std::cell::Cell::new(None) };
    /// Look-alikes made so far on this thread.
    pub(super) static LOOKALIKES_MADE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `hash` with the named mark and a place from its own bits (0 to 39) in its low 48 bits.
#[cfg(test)]
fn look_alike(hash: BlockHash) -> BlockHash {
    LOOKALIKES_MADE.set(LOOKALIKES_MADE.get() + 1);
    let place = (hash.0 >> 100) % 40;
    BlockHash((hash.0 & !LOW_48) | NAMED_MARK | place)
}

/// [`hash_block`]'s digest.
#[inline(always)]
fn hash_block_digest(
    parent: Option<BlockHash>,
    tokens: &[TokenId],
    extra_key: Option<u64>,
) -> BlockHash {
    if tokens.len() <= SMALL_TOKENS {
        return hash_on_stack::<{ HEADER_BYTES + 4 * SMALL_TOKENS }>(parent, tokens, extra_key);
    }
    if tokens.len() <= STACK_TOKENS {
        return hash_on_stack::<{ HEADER_BYTES + 4 * STACK_TOKENS }>(parent, tokens, extra_key);
    }
    SCRATCH.with_borrow_mut(|bytes| {
        bytes.clear();
        bytes.resize(HEADER_BYTES + 4 * tokens.len(), 0);
        let len = lay_out(bytes, parent, tokens, extra_key);
        BlockHash(xxh3_128(&bytes[..len]))
    })
}

/// [`hash_block`] with the bytes laid out in a stack buffer of `BYTES` (long enough).
#[inline(always)]
fn hash_on_stack<const BYTES: usize>(
    parent: Option<BlockHash>,
    tokens: &[TokenId],
    extra_key: Option<u64>,
) -> BlockHash {
    let mut bytes = [0u8; BYTES];
    let len = lay_out(&mut bytes, parent, tokens, extra_key);
    BlockHash(xxh3_128(&bytes[..len]))
}

/// Writes the hashed bytes of a block into the front of `bytes` (long enough) and returns
/// how many there are.
fn lay_out(
    bytes: &mut [u8],
    parent: Option<BlockHash>,
    tokens: &[TokenId],
    extra_key: Option<u64>,
) -> usize {
    // Tag the optional parts so "no parent" and "no extra key" never collide with a value.
    let mut len = 0;
    match parent {
        Some(BlockHash(h)) => {
            bytes[0] = 1;
            bytes[1..17].copy_from_slice(&h.to_le_bytes());
            len += 17;
        }
        None => {
            bytes[0] = 0;
            len += 1;
        }
    }
    match extra_key {
        Some(key) => {
            bytes[len] = 1;
            bytes[len + 1..len + 9].copy_from_slice(&key.to_le_bytes());
            len += 9;
        }
        None => {
            bytes[len] = 0;
            len += 1;
        }
    }
    let body = &mut bytes[len..len + 4 * tokens.len()];
    for (out, token) in body.chunks_exact_mut(4).zip(tokens) {
        out.copy_from_slice(&token.to_le_bytes());
    }
    len + body.len()
}

/// Hash of one full block named by its content instead of its tokens: the `offset`-th
/// block of the content `content_id` (a simulator's trace block, whose tokens depend only
/// on its id) after the prefix whose last block hashed to `parent`, under `extra_key`
/// ([`content_block`] of [`hash_content`]). It stands for the block's tokens: a caller that
/// names a block this way must name every block of that content this way (then equal
/// hashes mean equal prefixes, as with tokens).
pub fn hash_block_id(
    parent: Option<BlockHash>,
    content_id: u64,
    offset: u32,
    extra_key: Option<u64>,
) -> BlockHash {
    content_block(hash_content(parent, content_id, extra_key), offset)
}

/// The seed of the blocks of content `content_id` after `parent` under `extra_key`: one
/// xxh3 digest per content, not per block. The leading tag (2 or 3, where a token block's
/// is 0 or 1) keeps it apart from token blocks' inputs.
pub fn hash_content(
    parent: Option<BlockHash>,
    content_id: u64,
    extra_key: Option<u64>,
) -> BlockHash {
    let mut bytes = [0u8; HEADER_BYTES + 8];
    let len = lay_out(&mut bytes, parent, &[], extra_key);
    bytes[0] += 2;
    bytes[len..len + 8].copy_from_slice(&content_id.to_le_bytes());
    BlockHash(xxh3_128(&bytes[..len + 8]))
}

/// The hash of the `offset`-th block of the content seeded `content` ([`hash_content`]).
/// The blocks of one content are not chained to each other: the seed already names the
/// prefix before them and the content fixes their tokens, so (seed, offset) names the
/// whole prefix, and a trace block's 32 hashes cost one digest instead of 32 serial ones.
///
/// For an offset below [`MAX_NAMED_PLACES`] the hash *is* the pair, recoverably
/// ([`named_parts`]): the seed's top 80 bits, a 32-bit mark, the offset in the low 16
/// bits; so the prefix cache indexes a trace block's KV blocks under one entry
/// (`kv::named_cache`). Two seeds share a block's hash only if their top 80 bits agree
/// (odds of 2^-80 a pair; block hashes are compared for equality only). A larger offset
/// (a trace block of more than 1,024 KV blocks) is mixed into the seed instead: each half
/// of the seed mixed with the offset by SplitMix's finalizer.
pub fn content_block(content: BlockHash, offset: u32) -> BlockHash {
    if offset < MAX_NAMED_PLACES {
        return BlockHash((content.0 & !LOW_48) | NAMED_MARK | u128::from(offset));
    }
    let o = u64::from(offset);
    let lo = finalize((content.0 as u64) ^ o.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let hi = finalize(((content.0 >> 64) as u64) ^ o.wrapping_mul(0xD1B5_4A32_D192_ED03));
    BlockHash(u128::from(lo) | (u128::from(hi) << 64))
}

/// Offsets [`content_block`] writes into the hash as they are (places of a trace block).
pub const MAX_NAMED_PLACES: u32 = 1 << 10;

const LOW_48: u128 = (1 << 48) - 1;

/// Bits 16..48 of a named block's hash: a token block's hash (an xxh3 digest) has them
/// by chance once in 2^32, and is then indexed as a named one: still exact, since the
/// index answers for the whole hash.
const NAMED_MARK: u128 = 0xA5C3_96E1 << 16;

/// The seed part of a named block's hash ([`named_parts`]): its top 80 bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(super) struct NamedKey {
    /// The hash's bits 64..128.
    pub(super) hi: u64,
    /// The hash's bits 48..64.
    pub(super) lo: u16,
}

impl NamedKey {
    /// A home slot for the key in a power-of-two table (its bits are a digest's).
    pub(super) fn home(&self) -> usize {
        self.hi as usize
    }

    #[cfg(test)]
    pub(super) fn from_parts(hi: u64, lo: u16) -> Self {
        Self { hi, lo }
    }
}

/// The seed part and the place of a hash made by [`content_block`] with an offset below
/// [`MAX_NAMED_PLACES`]; `None` for other hashes (but for one token hash in 2^32, whose
/// parts then name it as exactly).
#[inline]
pub(super) fn named_parts(hash: &BlockHash) -> Option<(NamedKey, u32)> {
    let low = hash.0 as u64;
    let place = (low & 0xFFFF) as u32;
    if (u128::from(low) & LOW_48 & !0xFFFF) != NAMED_MARK || place >= MAX_NAMED_PLACES {
        return None;
    }
    let key = NamedKey {
        hi: (hash.0 >> 64) as u64,
        lo: (low >> 48) as u16,
    };
    Some((key, place))
}

/// SplitMix64's finalizer: a bijection that spreads every input bit over the output.
fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Appends to `hashes` the hashes of every full block of `tokens` beyond the ones already
/// in `hashes` (which must be the hashes of `tokens`' first blocks).
pub fn hash_full_blocks(
    hashes: &mut Vec<BlockHash>,
    tokens: &[TokenId],
    block_size: usize,
    extra_key: Option<u64>,
) {
    let num_full = tokens.len() / block_size;
    for i in hashes.len()..num_full {
        let parent = i.checked_sub(1).map(|p| hashes[p]);
        let block = &tokens[i * block_size..(i + 1) * block_size];
        hashes.push(hash_block(parent, block, extra_key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_hash_equal_and_chain() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        hash_full_blocks(&mut a, &[1, 2, 3, 4, 5], 2, None);
        hash_full_blocks(&mut b, &[1, 2, 3, 9], 2, None);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        // Same tokens in block 2 but a different first block: different hash.
        let mut c = Vec::new();
        hash_full_blocks(&mut c, &[7, 2, 3, 4], 2, None);
        assert_ne!(a[1], c[1]);
    }

    #[test]
    fn extra_key_separates_otherwise_equal_blocks() {
        let none = hash_block(None, &[1, 2], None);
        assert_ne!(none, hash_block(None, &[1, 2], Some(0)));
        assert_ne!(
            hash_block(None, &[1, 2], Some(1)),
            hash_block(None, &[1, 2], Some(2))
        );
    }

    /// The streaming form `hash_block` used before (its digests are in golden outputs).
    fn streamed(parent: Option<BlockHash>, tokens: &[TokenId], extra_key: Option<u64>) -> u128 {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        match parent {
            Some(BlockHash(h)) => {
                hasher.update(&[1]);
                hasher.update(&h.to_le_bytes());
            }
            None => hasher.update(&[0]),
        }
        match extra_key {
            Some(key) => {
                hasher.update(&[1]);
                hasher.update(&key.to_le_bytes());
            }
            None => hasher.update(&[0]),
        }
        for token in tokens {
            hasher.update(&token.to_le_bytes());
        }
        hasher.digest128()
    }

    #[test]
    fn one_shot_hash_equals_the_streamed_one() {
        let tokens: Vec<TokenId> = (0..2000u32)
            .map(|t| t.wrapping_mul(2_654_435_761))
            .collect();
        for len in [0, 1, 3, 15, 16, 17, 40, 64, 100, 128, 129, 512, 2000] {
            for parent in [None, Some(BlockHash(u128::MAX / 3))] {
                for key in [None, Some(7)] {
                    let got = hash_block(parent, &tokens[..len], key);
                    assert_eq!(got.0, streamed(parent, &tokens[..len], key), "{len} tokens");
                }
            }
        }
    }

    #[test]
    fn id_named_blocks_differ_by_every_part_and_never_hash_like_token_blocks() {
        let parent = Some(BlockHash(5));
        let a = hash_block_id(parent, 7, 0, None);
        assert_eq!(a, hash_block_id(parent, 7, 0, None));
        for other in [
            hash_block_id(parent, 7, 1, None),
            hash_block_id(parent, 8, 0, None),
            hash_block_id(None, 7, 0, None),
            hash_block_id(Some(BlockHash(6)), 7, 0, None),
            hash_block_id(parent, 7, 0, Some(0)),
        ] {
            assert_ne!(a, other);
        }
        // The seed's bytes after the tag are those of a token block of tokens 7, 0: the
        // tag tells them apart.
        assert_ne!(
            hash_content(parent, 7, None),
            hash_block(parent, &[7, 0], None)
        );
        // No two of many contents' blocks share a hash; each carries its seed and place,
        // and the seeds' top bits (the named index's home slots) are spread.
        let mut seen = std::collections::HashSet::new();
        let mut homes = std::collections::HashSet::new();
        for id in 0..2000u64 {
            let seed = hash_content(parent, id, None);
            for offset in 0..32 {
                let hash = content_block(seed, offset);
                assert!(seen.insert(hash), "content {id}, block {offset}");
                let (key, place) = named_parts(&hash).expect("a named block");
                assert_eq!(place, offset);
                assert_eq!(Some(key), named_parts(&content_block(seed, 0)).map(|p| p.0));
                homes.insert(key.home() & 0xFFFF);
            }
        }
        assert!(homes.len() > 1900, "{} distinct homes of 2000", homes.len());
        // Past the named offsets the hash is mixed, and not taken for a named one.
        let far = content_block(hash_content(parent, 1, None), MAX_NAMED_PLACES);
        assert_eq!(named_parts(&far), None);
        assert_ne!(far, content_block(hash_content(parent, 1, None), 0));
        // Token blocks' digests are not named ones.
        assert!((0..1000u32).all(|t| named_parts(&hash_block(None, &[t], None)).is_none()));
    }

    #[test]
    fn incremental_hashing_matches_one_shot() {
        let tokens: Vec<TokenId> = (0..100).collect();
        let mut one_shot = Vec::new();
        hash_full_blocks(&mut one_shot, &tokens, 16, Some(3));
        let mut incremental = Vec::new();
        for end in [5, 16, 40, 100] {
            hash_full_blocks(&mut incremental, &tokens[..end], 16, Some(3));
        }
        assert_eq!(one_shot, incremental);
    }
}
