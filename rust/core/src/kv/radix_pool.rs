//! SGLang's KV cache manager (seed 003): a page allocator plus the radix cache, with each
//! request's page table, behind the same per-request interface as [`BlockPool`] so the step
//! scheduler can use either. A page is a block of `page_size` token slots; slot `s` lives in
//! page `s / page_size`, and the radix tree stores slot indices, as SGLang's does.
//!
//! A request's first pages may come from the tree (its prefix hit, locked while it runs);
//! the rest are its own. When it is freed (finished or preempted), its computed full pages
//! are inserted into the tree, the pages the tree already had are returned to the allocator,
//! and the hit is unlocked. Invariant: free pages + pages in the tree + pages owned by
//! requests = total, and no page is in two places.
//!
//! [`BlockPool`]: super::BlockPool

use rustc_hash::FxHashMap;

use super::radix::{NodeHandle, RadixCache};
use super::{
    BlockId, BlockPoolStats, KvCapacity, RequestKey, TokenId, blocks_needed, check_allocation,
    check_num_blocks,
};
use crate::{Error, Result};

/// A prefix hit in the radix tree, from [`RadixPool::get_computed_blocks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadixHit {
    pub block_ids: Vec<BlockId>,
    pub num_computed_tokens: usize,
    handle: Option<NodeHandle>,
}

#[derive(Debug, Clone)]
struct RequestPages {
    block_ids: Vec<BlockId>,
    token_ids: Vec<TokenId>,
    num_computed_tokens: usize,
    /// Leading pages that belong to the tree (the prefix hit), locked by `handle`.
    num_tree_pages: usize,
    handle: Option<NodeHandle>,
    /// Requests with an extra key (a LoRA adapter) neither read nor fill the shared tree.
    uses_tree: bool,
}

#[derive(Debug, Clone)]
pub struct RadixPool<R: RequestKey> {
    page_size: usize,
    num_pages: usize,
    /// LIFO, as SGLang's allocator: the most recently freed page is reused first.
    free_pages: Vec<BlockId>,
    tree: RadixCache,
    requests: FxHashMap<R, RequestPages>,
    stats: BlockPoolStats,
}

impl<R: RequestKey> RadixPool<R> {
    pub fn new(num_pages: usize, page_size: usize) -> Result<Self> {
        check_num_blocks(num_pages)?;
        let mut free_pages = super::try_filled_vec(num_pages, 0, "num_pages")?;
        for (page, id) in free_pages.iter_mut().zip((0..num_pages as BlockId).rev()) {
            *page = id;
        }
        Ok(Self {
            tree: RadixCache::new(page_size)?,
            page_size,
            num_pages,
            free_pages,
            requests: FxHashMap::default(),
            stats: BlockPoolStats::default(),
        })
    }

    pub fn stats(&self) -> BlockPoolStats {
        self.stats
    }

    /// Pages of `hit` that are evictable now, which admitting it (locking its path) takes
    /// out of `num_free_blocks`.
    pub fn evictable_pages_of(&self, hit: &RadixHit) -> Result<usize> {
        match hit.handle {
            Some(handle) => Ok(self.tree.unlocked_len(handle)? / self.page_size),
            None => Ok(0),
        }
    }

    pub fn tree(&self) -> &RadixCache {
        &self.tree
    }

    pub fn block_ids(&self, request_id: &R) -> Option<&[BlockId]> {
        self.requests
            .get(request_id)
            .map(|r| r.block_ids.as_slice())
    }

    pub fn num_computed_tokens(&self, request_id: &R) -> Option<usize> {
        self.requests.get(request_id).map(|r| r.num_computed_tokens)
    }

    pub fn num_tokens(&self, request_id: &R) -> Option<usize> {
        self.requests.get(request_id).map(|r| r.token_ids.len())
    }

    /// The longest cached prefix in whole pages, never the whole prompt (the last token is
    /// recomputed). `extra_key` requests bypass the tree (no hit).
    pub fn get_computed_blocks(
        &mut self,
        token_ids: &[TokenId],
        extra_key: Option<u64>,
    ) -> RadixHit {
        let mut hit = RadixHit {
            block_ids: Vec::new(),
            num_computed_tokens: 0,
            handle: None,
        };
        if extra_key.is_some() {
            return hit;
        }
        let found = self
            .tree
            .match_prefix(&token_ids[..token_ids.len().saturating_sub(1)]);
        hit.block_ids = found
            .values
            .iter()
            .step_by(self.page_size)
            .map(|&slot| (slot as usize / self.page_size) as BlockId)
            .collect();
        hit.num_computed_tokens = found.matched_len;
        hit.handle = Some(found.handle);
        self.stats.record_lookup(token_ids.len(), found.matched_len);
        hit
    }

    /// Same contract as [`BlockPool::allocate_slots`](super::BlockPool::allocate_slots):
    /// `Ok(None)` when the free pages plus the evictable part of the tree do not suffice,
    /// in which case nothing changed.
    pub fn allocate_slots(
        &mut self,
        request_id: &R,
        new_token_ids: &[TokenId],
        num_new_tokens: usize,
        num_lookahead_tokens: usize,
        hit: Option<&RadixHit>,
        extra_key: Option<u64>,
    ) -> Result<Option<Vec<BlockId>>> {
        let existing = self.requests.contains_key(request_id);
        check_allocation(request_id, num_new_tokens, existing, hit.is_some())?;
        let (num_computed, num_held) = match (self.requests.get(request_id), hit) {
            (Some(r), _) => (r.num_computed_tokens, r.block_ids.len()),
            (None, Some(h)) => (h.num_computed_tokens, h.block_ids.len()),
            (None, None) => (0, 0),
        };
        // Lock the hit first so the pages it shares are not counted as evictable.
        let handle = hit.and_then(|h| h.handle);
        if let Some(handle) = handle {
            self.tree.lock(handle)?;
        }
        let num_slots = num_computed + num_new_tokens + num_lookahead_tokens;
        let needed = blocks_needed(num_slots, self.page_size, num_held);
        if needed > self.free_pages.len() + self.tree.evictable_size() / self.page_size {
            if let Some(handle) = handle {
                self.tree.unlock(handle)?;
            }
            return Ok(None);
        }
        self.evict_for(needed);
        let new_pages: Vec<BlockId> = (0..needed)
            .map(|_| self.free_pages.pop().expect("checked above"))
            .collect();
        let request = self
            .requests
            .entry(request_id.clone())
            .or_insert_with(|| RequestPages {
                block_ids: hit.map(|h| h.block_ids.clone()).unwrap_or_default(),
                token_ids: Vec::new(),
                num_computed_tokens: num_computed,
                num_tree_pages: hit.map_or(0, |h| h.block_ids.len()),
                handle,
                uses_tree: extra_key.is_none(),
            });
        request.block_ids.extend_from_slice(&new_pages);
        request.token_ids.extend_from_slice(new_token_ids);
        request.num_computed_tokens += num_new_tokens;
        Ok(Some(new_pages))
    }

    /// Evicts least recently used tree pages until `needed` pages are free.
    fn evict_for(&mut self, needed: usize) {
        if needed <= self.free_pages.len() {
            return;
        }
        let slots = self
            .tree
            .evict((needed - self.free_pages.len()) * self.page_size);
        let pages = slots
            .iter()
            .step_by(self.page_size)
            .map(|&s| (s as usize / self.page_size) as BlockId);
        self.free_pages.extend(pages);
    }

    /// Releases the request: its computed full pages go into the tree (duplicates of what the
    /// tree already holds are freed), the rest to the allocator, and its hit is unlocked.
    pub fn free(&mut self, request_id: &R) -> Result<()> {
        let request = self
            .requests
            .remove(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        let p = self.page_size;
        let mut num_kept = request.num_tree_pages;
        if request.uses_tree {
            let num_full = request.num_computed_tokens.min(request.token_ids.len()) / p;
            let slots: Vec<i64> = request.block_ids[..num_full]
                .iter()
                .flat_map(|&page| (0..p).map(move |i| (page as usize * p + i) as i64))
                .collect();
            let already = self
                .tree
                .insert(&request.token_ids[..num_full * p], &slots)?
                / p;
            // Pages [tree, already) duplicate the tree's own; [already, full) now belong to it.
            self.free_pages.extend(
                request.block_ids[request.num_tree_pages..already.max(request.num_tree_pages)]
                    .iter()
                    .rev(),
            );
            num_kept = num_full.max(request.num_tree_pages);
        }
        self.free_pages
            .extend(request.block_ids[num_kept..].iter().rev());
        if let Some(handle) = request.handle {
            self.tree.unlock(handle)?;
        }
        Ok(())
    }

    pub fn rewind_computed_tokens(&mut self, request_id: &R, num_tokens: usize) -> Result<()> {
        let request = self
            .requests
            .get_mut(request_id)
            .ok_or_else(|| Error::unknown_request(request_id))?;
        if num_tokens > request.num_computed_tokens {
            return Err(Error::input(
                "num_tokens",
                num_tokens,
                "more than the computed tokens",
            ));
        }
        request.num_computed_tokens -= num_tokens;
        Ok(())
    }

    /// Describes the first broken invariant, if any.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.tree.check_invariants()?;
        let mut owner = vec![0u8; self.num_pages];
        let mut count = |page: BlockId, what: &str| -> std::result::Result<(), String> {
            let slot = &mut owner[page as usize];
            *slot += 1;
            if *slot > 1 {
                Err(format!("page {page} is in two places ({what})"))
            } else {
                Ok(())
            }
        };
        for &page in &self.free_pages {
            count(page, "free")?;
        }
        for request in self.requests.values() {
            for &page in &request.block_ids[request.num_tree_pages..] {
                count(page, "request")?;
            }
        }
        let in_tree = self.tree.total_size() / self.page_size;
        let counted = owner.iter().filter(|&&n| n > 0).count();
        if counted + in_tree != self.num_pages {
            return Err(format!(
                "{counted} free or owned pages + {in_tree} in the tree != {} pages",
                self.num_pages
            ));
        }
        Ok(())
    }
}

impl<R: RequestKey> KvCapacity for RadixPool<R> {
    fn num_total_blocks(&self) -> usize {
        self.num_pages
    }

    /// Free pages plus the tree's evictable ones (reclaimed on demand).
    fn num_free_blocks(&self) -> usize {
        self.free_pages.len() + self.tree.evictable_size() / self.page_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tokens(range: std::ops::Range<u32>) -> Vec<TokenId> {
        range.collect()
    }

    #[test]
    fn a_finished_request_fills_the_tree_and_the_next_one_hits_it() {
        let mut pool = RadixPool::<u64>::new(8, 4).unwrap();
        let prompt = tokens(0..10);
        let hit = pool.get_computed_blocks(&prompt, None);
        assert_eq!(hit.num_computed_tokens, 0);
        assert_eq!(
            pool.allocate_slots(&1, &prompt, 10, 0, Some(&hit), None)
                .unwrap()
                .unwrap()
                .len(),
            3
        );
        pool.free(&1).unwrap();
        // Two full pages went into the tree; the partial third page is free again.
        assert_eq!(pool.tree().total_size(), 8);
        assert_eq!(pool.free_pages.len(), 6);
        let hit = pool.get_computed_blocks(&prompt, None);
        assert_eq!(hit.num_computed_tokens, 8);
        pool.allocate_slots(&2, &prompt, 2, 0, Some(&hit), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            pool.tree().protected_size(),
            8,
            "the shared prefix is locked while in use"
        );
        pool.check_invariants().unwrap();
        pool.free(&2).unwrap();
        pool.check_invariants().unwrap();
    }

    #[test]
    fn duplicate_pages_return_to_the_allocator() {
        let mut pool = RadixPool::<u64>::new(8, 2).unwrap();
        // Two requests compute the same 4 tokens side by side; the second finds the first's
        // pages in the tree when it ends and gives its own back.
        pool.allocate_slots(&1, &tokens(0..4), 4, 0, None, None)
            .unwrap()
            .unwrap();
        pool.allocate_slots(&2, &tokens(0..4), 4, 0, None, None)
            .unwrap()
            .unwrap();
        pool.free(&1).unwrap();
        pool.free(&2).unwrap();
        assert_eq!(pool.tree().total_size(), 4);
        assert_eq!(pool.free_pages.len(), 6);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn allocation_evicts_unlocked_tree_pages_and_fails_cleanly_when_it_cannot() {
        let mut pool = RadixPool::<u64>::new(4, 2).unwrap();
        pool.allocate_slots(&1, &tokens(0..8), 8, 0, None, None)
            .unwrap()
            .unwrap();
        pool.free(&1).unwrap();
        assert_eq!(
            pool.free_pages.len(),
            0,
            "all four pages are cached in the tree"
        );
        assert!(
            pool.allocate_slots(&2, &tokens(50..56), 6, 0, None, None)
                .unwrap()
                .is_some()
        );
        // Eviction takes whole leaves, as SGLang's: the single 4-page node goes.
        assert_eq!(pool.tree().total_size(), 0);
        assert_eq!(pool.free_pages.len(), 1);
        assert_eq!(
            pool.allocate_slots(&3, &tokens(60..64), 4, 0, None, None)
                .unwrap(),
            None
        );
        assert!(pool.block_ids(&3).is_none());
        pool.check_invariants().unwrap();
    }

    #[test]
    fn requests_with_an_extra_key_bypass_the_tree() {
        let mut pool = RadixPool::<u64>::new(4, 2).unwrap();
        pool.allocate_slots(&1, &tokens(0..4), 4, 0, None, Some(3))
            .unwrap()
            .unwrap();
        pool.free(&1).unwrap();
        assert_eq!(pool.tree().total_size(), 0);
        assert_eq!(
            pool.get_computed_blocks(&tokens(0..4), Some(3))
                .num_computed_tokens,
            0
        );
        pool.check_invariants().unwrap();
    }

    proptest! {
        #[test]
        fn pages_are_conserved(ops in prop::collection::vec((0u8..3, 0u64..5, 0u32..3, 1usize..12), 1..150)) {
            let mut pool = RadixPool::<u64>::new(16, 2).unwrap();
            let mut next = 1000u32;
            for (kind, id, prompt, len) in ops {
                match kind {
                    0 if pool.block_ids(&id).is_none() => {
                        let ids: Vec<TokenId> = (0..len as u32).map(|t| prompt * 100 + t).collect();
                        let hit = pool.get_computed_blocks(&ids, None);
                        let n = len - hit.num_computed_tokens;
                        let _ = pool.allocate_slots(&id, &ids, n, 0, Some(&hit), None).unwrap();
                    }
                    1 if pool.block_ids(&id).is_some() => {
                        let _ = pool.allocate_slots(&id, &[next], 1, 0, None, None).unwrap();
                        next += 1;
                    }
                    2 => {
                        let held = pool.block_ids(&id).is_some();
                        prop_assert_eq!(pool.free(&id).is_ok(), held);
                    }
                    _ => {}
                }
                prop_assert!(pool.check_invariants().is_ok(), "{:?}", pool.check_invariants());
            }
        }
    }
}
