//! vLLM 0.33's copy-on-write for fine-grained partial hash hits (`--prefix-match-unit` below
//! a Mamba `align` block): the pool's partial entries and the managers' allocation rules
//! for the shared blocks, the pieces the coordinator is to call when it serves the layout
//! (`partial_hits` has the lookups and the on-rule).
//!
//! - **Entries** ([`PartialEntries`], vLLM's `BlockPool` with `cached_block_hashes_by_block`):
//!   a block holds a primary key, with the prefix length it covers, and any further keys; a
//!   key may sit on several blocks, the first registered answering. A partial entry
//!   (`cache_partial_block`) on a block whose primary covers less replaces it; a block
//!   cached in full drops its partial keys first (`cache_full_blocks`' promotion); the
//!   entries of a block a running request keeps writing move to a fresh block
//!   (`move_block_hashes`).
//! - **Where entries are registered**: full attention keys the block holding the prompt's
//!   last hash boundary below `len(prompt) - 1` ([`full_partial_tail`],
//!   `FullAttentionManager._cache_partial_tail_block`); Mamba keys its running state when
//!   a chunk ends exactly on that boundary ([`align_partial_tail`],
//!   `MambaManager._cache_partial_tail_block`) and records the slot for the next allocation.
//! - **Allocations** ([`allocate_full_partial`], [`allocate_align_partial`]): an admission
//!   whose hit ends inside a block takes a fresh block in that slot, the shared one copied
//!   into it (`_apply_cow`; the copy's destination takes one more reference); a running
//!   Mamba request with a recorded entry stays on its block, the entry moving to a fresh
//!   block the copy fills (the source takes one more reference). Each takes one block more
//!   in the fit check ([`full_blocks_needed`], [`align_blocks_needed`]).
//! - **Copies** ([`CopyQueue`]): per group in the order made, drained group by group into
//!   the step's `kv_cache_block_copies` with the endpoints to release once the copy ran
//!   (`take_kv_cache_block_copies`; the scheduler's retained endpoints, `sched::block_free`).
//!
//! The layout's executable model, checked call by call against vLLM's `KVCacheManager`,
//! `Scheduler` and `AsyncScheduler`, is tests/kv_cow_reference.py; these pieces follow it.
//! Restricted as it is: no speculative or prefill checkpoint blocks in the Mamba group.
//!
//! Invariant ([`PartialEntries`]): `by_key` and `by_block` name the same (key, block) pairs;
//! a block's keys are distinct, its primary first.

use std::hash::Hash;

use rustc_hash::FxHashMap;

use super::block_pool::BlockId;
use super::layer_groups::NULL_BLOCK;
use crate::{Error, Result};

/// The keys one block holds: the primary first, and the prefix length it covers (vLLM's
/// `block_hash_num_tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct BlockKeys<K> {
    keys: Vec<K>,
    num_tokens: usize,
}

/// vLLM 0.33's prefix-cache index with partial entries (module docs).
#[derive(Debug, Clone)]
pub struct PartialEntries<K> {
    by_key: FxHashMap<K, Vec<BlockId>>,
    by_block: FxHashMap<BlockId, BlockKeys<K>>,
}

impl<K> Default for PartialEntries<K> {
    fn default() -> Self {
        Self {
            by_key: FxHashMap::default(),
            by_block: FxHashMap::default(),
        }
    }
}

impl<K: Copy + Eq + Hash> PartialEntries<K> {
    /// The block answering `key` (the first registered under it).
    pub fn get(&self, key: &K) -> Option<BlockId> {
        self.by_key
            .get(key)
            .and_then(|blocks| blocks.first().copied())
    }

    /// The block's keys, its primary first (empty when it caches none).
    pub fn keys_of(&self, block: BlockId) -> &[K] {
        self.by_block.get(&block).map_or(&[], |b| &b.keys)
    }

    /// The prefix length the block's primary key covers.
    pub fn primary_tokens(&self, block: BlockId) -> Option<usize> {
        self.by_block.get(&block).map(|b| b.num_tokens)
    }

    /// vLLM's `_insert_block_hash`: `key` on `block` (its primary, covering `num_tokens`,
    /// when it has none); nothing when it holds it already.
    pub fn insert(&mut self, key: K, block: BlockId, num_tokens: usize) {
        let held = self.by_block.entry(block).or_insert_with(|| BlockKeys {
            keys: Vec::new(),
            num_tokens,
        });
        if held.keys.contains(&key) {
            return;
        }
        held.keys.push(key);
        self.by_key.entry(key).or_default().push(block);
    }

    /// vLLM's `_remove_cached_block_hashes` (eviction, promotion, moves): every key of
    /// `block`, primary first.
    pub fn remove_block(&mut self, block: BlockId) -> Vec<K> {
        let Some(held) = self.by_block.remove(&block) else {
            return Vec::new();
        };
        for key in &held.keys {
            if let Some(blocks) = self.by_key.get_mut(key) {
                blocks.retain(|&b| b != block);
                if blocks.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
        held.keys
    }

    /// vLLM's `cache_partial_block` (without `replace_existing_hashes`): `key`, the prefix
    /// of `num_tokens` ending inside `block`, registered on it; a primary covering less
    /// is dropped first. Errors: `InputError` for the null block.
    pub fn cache_partial(&mut self, key: K, block: BlockId, num_tokens: usize) -> Result<()> {
        if block == NULL_BLOCK {
            return Err(Error::input(
                "block",
                block,
                "the null block caches nothing",
            ));
        }
        let held = self.keys_of(block).contains(&key);
        if !held && self.primary_tokens(block).is_some_and(|n| n < num_tokens) {
            self.remove_block(block);
        }
        self.insert(key, block, num_tokens);
        Ok(())
    }

    /// `cache_full_blocks` for one block: its partial entries go (the promotion), then
    /// `key` covering `num_tokens` becomes its primary. Errors: `InputError` when the
    /// block's primary already covers as much (a full block is cached once).
    pub fn cache_full(&mut self, key: K, block: BlockId, num_tokens: usize) -> Result<()> {
        if let Some(covered) = self.primary_tokens(block) {
            if covered >= num_tokens {
                return Err(Error::input(
                    "num_tokens",
                    num_tokens,
                    format!("block {block} is cached up to {covered} tokens already"),
                ));
            }
            self.remove_block(block);
        }
        self.insert(key, block, num_tokens);
        Ok(())
    }

    /// vLLM's `move_block_hashes`: `source`'s entries, live, onto `destination` (the
    /// primary's length with them). Errors: `InputError` when `destination` caches any
    /// key (vLLM asserts a fresh block), nothing moved.
    pub fn move_entries(&mut self, source: BlockId, destination: BlockId) -> Result<()> {
        if self.by_block.contains_key(&destination) {
            return Err(Error::input(
                "destination",
                destination,
                "the block an entry moves to must cache nothing",
            ));
        }
        let num_tokens = self.primary_tokens(source).unwrap_or(0);
        for key in self.remove_block(source) {
            self.insert(key, destination, num_tokens);
        }
        Ok(())
    }
}

/// A request's shared block to copy in one group (vLLM's `_partial_hit_reqs` entry): the
/// table slot and the block in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialSlot {
    pub slot: usize,
    pub source: BlockId,
}

/// How a copy keeps the shared state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// The request's slot takes the copy (`_apply_cow`): its destination holds one more
    /// reference until the copy ran.
    Private,
    /// The running request keeps its block, the cache entry moves to the copy
    /// (`move_block_hashes`): the source holds one more reference until the copy ran.
    MovedEntry,
}

/// One copy an allocation makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CowCopy {
    pub slot: usize,
    pub source: BlockId,
    pub destination: BlockId,
    pub kind: CopyKind,
}

/// vLLM's `_has_partial_local_hit` with the slot `add_local_computed_blocks` records: a
/// local hit of `num_local_computed_tokens` over the group's `kept` hit blocks (after
/// any skipped ones) ending inside a block of `block_size`.
pub fn partial_slot(
    kept: &[BlockId],
    num_local_computed_tokens: usize,
    block_size: usize,
) -> Option<PartialSlot> {
    super::partial_hits::partial_local_hit(kept, num_local_computed_tokens, block_size)
        .map(|(slot, source)| PartialSlot { slot, source })
}

/// Full attention's `get_num_blocks_to_allocate` for `required` blocks: a table of
/// `table_len` slots after a hit of `hit_len` blocks, `partial` when the hit ends inside
/// its last block (one block more for the copy), `evictable` hit blocks on the free queue.
pub fn full_blocks_needed(
    required: usize,
    table_len: usize,
    hit_len: usize,
    partial: bool,
    evictable: usize,
) -> usize {
    required.saturating_sub(hit_len + table_len) + usize::from(partial) + evictable
}

/// Mamba `align`'s `get_num_blocks_to_allocate` without speculative or checkpoint blocks:
/// the blocks past the table and the hit, one more for a copy (`partial`: a hit inside a
/// block or an entry to move), at most one state block and the copy's. Negative, as
/// vLLM's, when the table holds more than `required` (slots of rejected draft tokens): the
/// coordinator sums the groups' counts as they are.
pub fn align_blocks_needed(
    required: usize,
    table_len: usize,
    hit_len: usize,
    partial: bool,
    evictable: usize,
) -> isize {
    let mut new = required as isize - (hit_len + table_len) as isize;
    if partial {
        new = new.max(0) + 1;
    }
    if new > 0 {
        new = new.min(1 + isize::from(partial));
    }
    new + evictable as isize
}

/// Full attention's `allocate_new_blocks` with a partial hit: the copy's block first (it
/// takes `partial`'s slot), then blocks up to `required`; returns the new blocks as vLLM
/// lists them (the copy's first) and the copy. Errors: `InputError` when the slot does
/// not hold the source (nothing taken).
pub fn allocate_full_partial(
    table: &mut Vec<BlockId>,
    partial: Option<PartialSlot>,
    required: usize,
    take: &mut impl FnMut(usize) -> Vec<BlockId>,
) -> Result<(Vec<BlockId>, Option<CowCopy>)> {
    if let Some(p) = partial {
        check_slot(table, p)?;
    }
    let num_copies = usize::from(partial.is_some());
    let num_new = num_copies + required.saturating_sub(table.len());
    let new = taken(take, num_new)?;
    let copy = partial.map(|p| {
        table[p.slot] = new[0];
        CowCopy {
            slot: p.slot,
            source: p.source,
            destination: new[0],
            kind: CopyKind::Private,
        }
    });
    table.extend_from_slice(&new[num_copies..]);
    Ok((new, copy))
}

/// `take(n)`'s blocks, which must be `n` (the fit check ran). Errors: `InputError`
/// (`take`) otherwise, before anything else changes.
fn taken(take: &mut impl FnMut(usize) -> Vec<BlockId>, n: usize) -> Result<Vec<BlockId>> {
    let blocks = take(n);
    if blocks.len() != n {
        return Err(Error::input(
            "take",
            blocks.len(),
            format!("{n} blocks were asked for (the fit check admits the allocation)"),
        ));
    }
    Ok(blocks)
}

/// What Mamba `align`'s manager keeps of a request beside its table for these rules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlignPartialState {
    /// `_allocated_block_reqs`: an allocation gave the request its state block.
    pub allocated: bool,
    /// `last_state_block_idx`: the slot of the state the next step copies from, freed
    /// once the request has moved past it.
    pub last_state: Option<usize>,
}

/// Mamba `align`'s `allocate_new_blocks` with partial hits (no speculative or checkpoint
/// blocks): nulls up to the running state's slot and its block, one block more for a
/// copy. An admission's copy takes the slot (returned first among the new slots); a
/// running request's moves the entry and stays off its table. Returns the table's new
/// slots as vLLM lists them and the copy. Errors: `InputError` when the slot does not hold
/// the source (nothing taken).
pub fn allocate_align_partial(
    table: &mut Vec<BlockId>,
    state: &mut AlignPartialState,
    partial: Option<PartialSlot>,
    required: usize,
    take: &mut impl FnMut(usize) -> Vec<BlockId>,
) -> Result<(Vec<BlockId>, Option<CowCopy>)> {
    if let Some(p) = partial {
        check_slot(table, p)?;
    }
    if required <= table.len() && partial.is_none() {
        state.allocated = true;
        return Ok((Vec::new(), None));
    }
    let prev = table.len();
    // Nulls up to the running state's slot, its block, and the copy's.
    let num_nulls = required.saturating_sub(prev + 1);
    let num_new = required.saturating_sub(prev + num_nulls) + usize::from(partial.is_some());
    let mut new = taken(take, num_new)?;
    if state.allocated || prev > 0 {
        state.last_state = prev.checked_sub(1);
    }
    table.resize(prev + num_nulls, NULL_BLOCK);
    let mut returned: Vec<BlockId> = vec![NULL_BLOCK; num_nulls];
    let mut copy = None;
    if let Some(p) = partial {
        let destination = new.remove(0);
        let kind = if state.allocated {
            CopyKind::MovedEntry
        } else {
            table[p.slot] = destination;
            returned.insert(0, destination);
            CopyKind::Private
        };
        copy = Some(CowCopy {
            slot: p.slot,
            source: p.source,
            destination,
            kind,
        });
    }
    table.extend_from_slice(&new);
    returned.extend(new);
    state.allocated = true;
    Ok((returned, copy))
}

fn check_slot(table: &[BlockId], p: PartialSlot) -> Result<()> {
    if table.get(p.slot) != Some(&p.source) || p.source == NULL_BLOCK {
        return Err(Error::input(
            "partial_slot",
            p.slot,
            format!("the table does not hold block {} there", p.source),
        ));
    }
    Ok(())
}

/// Full attention's partial tail entry (`FullAttentionManager._cache_partial_tail_block`,
/// no EAGLE drop): the prompt's last hash boundary below `prompt_len - 1`, as far as the
/// request is hashed (`num_hashes` hash blocks), when it is cached (`<= cacheable`) and
/// ends inside a block of `block_size`: (the block's slot, the boundary).
pub fn full_partial_tail(
    prompt_len: usize,
    num_hashes: usize,
    hash_block: usize,
    block_size: usize,
    cacheable: usize,
) -> Option<(usize, usize)> {
    let boundary = (prompt_len.saturating_sub(1) / hash_block).min(num_hashes) * hash_block;
    (boundary > 0 && boundary <= cacheable && !boundary.is_multiple_of(block_size))
        .then_some((boundary / block_size, boundary))
}

/// Mamba `align`'s partial tail entry (`MambaManager._cache_partial_tail_block`, no
/// checkpoint block, no EAGLE drop or look-ahead): a chunk whose end `num_tokens` is the
/// prompt's last hash boundary (`get_mamba_prefill_checkpoint_position`) keys the state
/// block of that end: (its slot, the boundary). The entry moves at the request's next
/// allocation when the boundary is inside the block.
pub fn align_partial_tail(
    num_tokens: usize,
    prompt_len: usize,
    hash_block: usize,
    block_size: usize,
) -> Option<(usize, usize)> {
    let boundary = prompt_len.saturating_sub(1) / hash_block * hash_block;
    (num_tokens > 0 && num_tokens == boundary)
        .then_some((num_tokens.div_ceil(block_size) - 1, num_tokens))
}

/// The copies made since the last step was formed, per group (each manager's
/// `_pending_cow_copies`).
#[derive(Debug, Clone, Default)]
pub struct CopyQueue {
    groups: Vec<Vec<(BlockId, BlockId)>>,
}

impl CopyQueue {
    pub fn new(num_groups: usize) -> Self {
        Self {
            groups: vec![Vec::new(); num_groups],
        }
    }

    /// Queues a copy of group `g`. Errors: `InputError` for a group past the layout's.
    pub fn push(&mut self, g: usize, copy: &CowCopy) -> Result<()> {
        let Some(group) = self.groups.get_mut(g) else {
            return Err(Error::input("group", g, "past the layout's groups"));
        };
        group.push((copy.source, copy.destination));
        Ok(())
    }

    /// `take_kv_cache_block_copies`: the copies group by group, each in its order, and
    /// their endpoints (source, destination of each) to release once the copy ran.
    pub fn take(&mut self) -> (Vec<(BlockId, BlockId)>, Vec<BlockId>) {
        let copies: Vec<_> = self.groups.iter_mut().flat_map(std::mem::take).collect();
        let retained = copies.iter().flat_map(|&(s, d)| [s, d]).collect();
        (copies, retained)
    }
}

#[cfg(test)]
#[path = "partial_cow_tests.rs"]
mod tests;
