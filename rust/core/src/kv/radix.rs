//! SGLang's radix cache (seed 003): a radix tree over token ids whose values are KV-cache
//! slot indices, so requests sharing a prefix share its KV.
//!
//! It owns the tree, the lock counts and the LRU order of evictable leaves. Keys are
//! aligned to `page_size`: edges split only at page boundaries and children are indexed by
//! their first page. Invariants (see `check_invariants`):
//! - `evictable_size + protected_size` = tokens stored = sum of node key lengths;
//! - a node is protected exactly when its lock count is positive, and a lock on a node is
//!   also a lock on every ancestor, so locked prefixes are never evicted;
//! - `lru` holds exactly the unlocked leaves, keyed by last access.
//!
//! Recency is a logical clock ticked once per node touched, so eviction order is
//! deterministic and has no ties.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::TokenId;
use crate::{Error, Result};

type NodeId = u32;
const ROOT: NodeId = 0;

/// The largest page size accepted (SGLang's are 1–64).
pub const MAX_PAGE_SIZE: usize = 1 << 16;

/// Names a node returned by `match_prefix`; used to lock the matched path. It goes stale
/// when the node is evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeHandle {
    node: NodeId,
    generation: u32,
}

/// What `match_prefix` found: the matched length (a multiple of the page size), the KV slot
/// indices of that prefix, and a handle on the last matched node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchResult {
    pub matched_len: usize,
    pub values: Vec<i64>,
    pub handle: NodeHandle,
}

#[derive(Debug, Clone, Default)]
struct Node {
    key: Vec<TokenId>,
    value: Vec<i64>,
    parent: NodeId,
    children: FxHashMap<Box<[TokenId]>, NodeId>,
    lock_ref: u32,
    last_access: u64,
    /// Bumped when the slot is freed, so handles to an evicted node are recognised.
    generation: u32,
    alive: bool,
}

#[derive(Debug, Clone)]
pub struct RadixCache {
    page_size: usize,
    nodes: Vec<Node>,
    free_slots: Vec<NodeId>,
    lru: BTreeSet<(u64, NodeId)>,
    clock: u64,
    evictable_size: usize,
    protected_size: usize,
}

impl RadixCache {
    pub fn new(page_size: usize) -> Result<Self> {
        if page_size == 0 || page_size > MAX_PAGE_SIZE {
            return Err(Error::config(
                "page_size",
                page_size,
                format!("must be between 1 and {MAX_PAGE_SIZE}"),
            ));
        }
        let root = Node {
            alive: true,
            ..Node::default()
        };
        Ok(Self {
            page_size,
            nodes: vec![root],
            free_slots: Vec::new(),
            lru: BTreeSet::new(),
            clock: 0,
            evictable_size: 0,
            protected_size: 0,
        })
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Tokens in unlocked nodes: what `evict` could free.
    pub fn evictable_size(&self) -> usize {
        self.evictable_size
    }

    /// Tokens in locked nodes (in use by running requests).
    pub fn protected_size(&self) -> usize {
        self.protected_size
    }

    pub fn total_size(&self) -> usize {
        self.evictable_size + self.protected_size
    }

    /// Nodes in the tree, not counting the root.
    pub fn num_nodes(&self) -> usize {
        self.nodes.len() - 1 - self.free_slots.len()
    }

    /// A handle on the root: the result of matching nothing. Locking it is a no-op.
    pub fn root_handle(&self) -> NodeHandle {
        NodeHandle {
            node: ROOT,
            generation: self.nodes[ROOT as usize].generation,
        }
    }

    /// The longest cached prefix of `token_ids`, rounded down to whole pages. A match that
    /// ends inside an edge splits it, so the handle names exactly the matched prefix.
    /// Touches the matched path (it becomes most recently used).
    pub fn match_prefix(&mut self, token_ids: &[TokenId]) -> MatchResult {
        let key = &token_ids[..token_ids.len() / self.page_size * self.page_size];
        let mut node = ROOT;
        let mut matched_len = 0;
        let mut values = Vec::new();
        while matched_len < key.len() {
            let Some((child, partial)) = self.descend(node, &key[matched_len..]) else {
                break;
            };
            let child_len = self.nodes[child as usize].key.len();
            values.extend_from_slice(&self.nodes[child as usize].value);
            matched_len += child_len;
            node = child;
            if partial {
                break;
            }
        }
        MatchResult {
            matched_len,
            values,
            handle: self.handle(node),
        }
    }

    /// Stores `values` (one KV slot per token) under `token_ids`, whose length must be a
    /// multiple of the page size. Returns how many leading tokens were already cached: the
    /// caller owns those duplicate slots and should free them.
    pub fn insert(&mut self, token_ids: &[TokenId], values: &[i64]) -> Result<usize> {
        if values.len() != token_ids.len() {
            return Err(Error::input(
                "values",
                format!("array of length {}", values.len()),
                format!("must have one value per token ({} tokens)", token_ids.len()),
            ));
        }
        if !token_ids.len().is_multiple_of(self.page_size) {
            return Err(Error::input(
                "token_ids",
                format!("sequence of length {}", token_ids.len()),
                format!("length must be a multiple of page_size={}", self.page_size),
            ));
        }
        let mut node = ROOT;
        let mut matched_len = 0;
        while matched_len < token_ids.len() {
            let Some((child, partial)) = self.descend(node, &token_ids[matched_len..]) else {
                break;
            };
            matched_len += self.nodes[child as usize].key.len();
            node = child;
            if partial {
                break;
            }
        }
        if matched_len < token_ids.len() {
            let leaf = self.add_leaf(node, &token_ids[matched_len..], &values[matched_len..]);
            self.touch(leaf);
        }
        Ok(matched_len)
    }

    /// Tokens on the path from the handle's node to the root that are evictable now (on
    /// unlocked nodes): what `lock` would take out of `evictable_size`.
    pub fn unlocked_len(&self, handle: NodeHandle) -> Result<usize> {
        let mut node = self.check_handle(handle)?;
        let mut tokens = 0;
        while node != ROOT {
            let n = &self.nodes[node as usize];
            if n.lock_ref == 0 {
                tokens += n.key.len();
            }
            node = n.parent;
        }
        Ok(tokens)
    }

    /// Protects the path from the handle's node to the root from eviction.
    pub fn lock(&mut self, handle: NodeHandle) -> Result<()> {
        let mut node = self.check_handle(handle)?;
        while node != ROOT {
            let n = &mut self.nodes[node as usize];
            if n.lock_ref == 0 {
                self.evictable_size -= n.key.len();
                self.protected_size += n.key.len();
                self.lru.remove(&(n.last_access, node));
            }
            n.lock_ref += 1;
            node = n.parent;
        }
        Ok(())
    }

    /// Undoes one `lock` of the same handle.
    pub fn unlock(&mut self, handle: NodeHandle) -> Result<()> {
        let mut node = self.check_handle(handle)?;
        if node != ROOT && self.nodes[node as usize].lock_ref == 0 {
            return Err(Error::input(
                "handle",
                format!("{handle:?}"),
                "is not locked",
            ));
        }
        while node != ROOT {
            let n = &mut self.nodes[node as usize];
            n.lock_ref -= 1;
            if n.lock_ref == 0 {
                self.protected_size -= n.key.len();
                self.evictable_size += n.key.len();
                if n.children.is_empty() {
                    self.lru.insert((n.last_access, node));
                }
            }
            node = n.parent;
        }
        Ok(())
    }

    /// Evicts least recently used unlocked leaves (a parent left childless becomes a
    /// candidate itself) until at least `num_tokens` are freed or nothing is evictable.
    /// Returns the freed values, in eviction order.
    pub fn evict(&mut self, num_tokens: usize) -> Vec<i64> {
        let mut freed = Vec::new();
        while freed.len() < num_tokens {
            let Some((_, leaf)) = self.lru.pop_first() else {
                break;
            };
            let parent = self.nodes[leaf as usize].parent;
            let first_page = self.nodes[leaf as usize].key[..self.page_size].to_vec();
            self.nodes[parent as usize]
                .children
                .remove(first_page.as_slice());
            let node = std::mem::take(&mut self.nodes[leaf as usize]);
            self.evictable_size -= node.key.len();
            freed.extend_from_slice(&node.value);
            self.nodes[leaf as usize].generation = node.generation.wrapping_add(1);
            self.free_slots.push(leaf);
            let p = &self.nodes[parent as usize];
            if parent != ROOT && p.children.is_empty() && p.lock_ref == 0 {
                self.lru.insert((p.last_access, parent));
            }
        }
        freed
    }

    /// Drops everything, locked or not (SGLang's `reset`); outstanding handles go stale.
    pub fn reset(&mut self) {
        for (slot, node) in self.nodes.iter_mut().enumerate().skip(1) {
            if node.alive {
                let generation = node.generation.wrapping_add(1);
                *node = Node {
                    generation,
                    ..Node::default()
                };
                self.free_slots.push(slot as NodeId);
            }
        }
        self.nodes[ROOT as usize].children.clear();
        self.lru.clear();
        self.evictable_size = 0;
        self.protected_size = 0;
    }

    /// Follows the edge from `node` that shares at least a page with `key`, splitting it if
    /// the match ends inside; touches and returns the node reached and whether the match
    /// was partial (the walk stops there).
    fn descend(&mut self, node: NodeId, key: &[TokenId]) -> Option<(NodeId, bool)> {
        let child = self.child(node, key)?;
        let common = self.common_prefix_len(&self.nodes[child as usize].key, key);
        let partial = common < self.nodes[child as usize].key.len();
        let reached = if partial {
            // SGLang (0.5.23's `_match_prefix_helper` / `_insert_helper`) refreshes the whole
            // edge before splitting it, so the unmatched remainder counts as used too: the
            // eviction order depends on it.
            self.touch(child);
            self.split(child, common)
        } else {
            child
        };
        self.touch(reached);
        Some((reached, partial))
    }

    fn child(&self, node: NodeId, key: &[TokenId]) -> Option<NodeId> {
        let children = &self.nodes[node as usize].children;
        if children.is_empty() {
            return None;
        }
        children.get(&key[..self.page_size]).copied()
    }

    /// Length of the common prefix of two keys, rounded down to whole pages.
    fn common_prefix_len(&self, a: &[TokenId], b: &[TokenId]) -> usize {
        // Whole chunks compare as slices (memcmp); only the differing chunk goes by token.
        const CHUNK: usize = 32;
        let len = a.len().min(b.len());
        let mut common = 0;
        while common + CHUNK <= len && a[common..common + CHUNK] == b[common..common + CHUNK] {
            common += CHUNK;
        }
        common += a[common..len]
            .iter()
            .zip(&b[common..len])
            .take_while(|(x, y)| x == y)
            .count();
        common / self.page_size * self.page_size
    }

    /// Splits `child` so its first `at` tokens become a new parent node; returns that node.
    fn split(&mut self, child: NodeId, at: usize) -> NodeId {
        debug_assert!(at > 0 && at < self.nodes[child as usize].key.len());
        let c = &mut self.nodes[child as usize];
        let suffix_key = c.key.split_off(at);
        let suffix_value = c.value.split_off(at);
        let prefix_key = std::mem::replace(&mut c.key, suffix_key);
        let prefix_value = std::mem::replace(&mut c.value, suffix_value);
        let (parent, lock_ref, last_access) = (c.parent, c.lock_ref, c.last_access);
        let child_first_page: Box<[TokenId]> = c.key[..self.page_size].into();
        let new = self.new_node(Node {
            key: prefix_key,
            value: prefix_value,
            parent,
            lock_ref,
            last_access,
            ..Node::default()
        });
        self.nodes[new as usize]
            .children
            .insert(child_first_page, child);
        self.nodes[child as usize].parent = new;
        let parent_first_page: Box<[TokenId]> =
            self.nodes[new as usize].key[..self.page_size].into();
        self.nodes[parent as usize]
            .children
            .insert(parent_first_page, new);
        new
    }

    fn add_leaf(&mut self, parent: NodeId, key: &[TokenId], value: &[i64]) -> NodeId {
        let p = &self.nodes[parent as usize];
        if parent != ROOT && p.children.is_empty() && p.lock_ref == 0 {
            self.lru.remove(&(p.last_access, parent));
        }
        let leaf = self.new_node(Node {
            key: key.to_vec(),
            value: value.to_vec(),
            parent,
            ..Node::default()
        });
        self.nodes[parent as usize]
            .children
            .insert(key[..self.page_size].into(), leaf);
        self.evictable_size += key.len();
        self.lru.insert((0, leaf));
        leaf
    }

    fn new_node(&mut self, mut node: Node) -> NodeId {
        node.alive = true;
        match self.free_slots.pop() {
            Some(slot) => {
                node.generation = self.nodes[slot as usize].generation;
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as NodeId
            }
        }
    }

    /// Marks a node most recently used, keeping the LRU index in step.
    fn touch(&mut self, node: NodeId) {
        self.clock += 1;
        let n = &mut self.nodes[node as usize];
        if self.lru.remove(&(n.last_access, node)) {
            self.lru.insert((self.clock, node));
        }
        n.last_access = self.clock;
    }

    fn handle(&self, node: NodeId) -> NodeHandle {
        NodeHandle {
            node,
            generation: self.nodes[node as usize].generation,
        }
    }

    fn check_handle(&self, handle: NodeHandle) -> Result<NodeId> {
        match self.nodes.get(handle.node as usize) {
            Some(n) if n.alive && n.generation == handle.generation => Ok(handle.node),
            _ => Err(Error::input(
                "handle",
                format!("{handle:?}"),
                "is stale: its node was evicted or the cache was reset",
            )),
        }
    }

    /// Describes the first broken invariant, if any. O(nodes + tokens).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let (mut evictable, mut protected) = (0, 0);
        for (id, n) in self
            .nodes
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, n)| n.alive)
        {
            let id = id as NodeId;
            if n.key.is_empty()
                || !n.key.len().is_multiple_of(self.page_size)
                || n.key.len() != n.value.len()
            {
                return Err(format!(
                    "node {id}: key/value lengths {}/{}",
                    n.key.len(),
                    n.value.len()
                ));
            }
            let parent = &self.nodes[n.parent as usize];
            if !parent.alive || parent.children.get(&n.key[..self.page_size]) != Some(&id) {
                return Err(format!("node {id} is not its parent's child"));
            }
            if n.parent != ROOT && parent.lock_ref < n.lock_ref {
                return Err(format!("node {id} is locked more than its parent"));
            }
            if n.lock_ref > 0 {
                protected += n.key.len();
            } else {
                evictable += n.key.len();
            }
            let is_candidate = n.lock_ref == 0 && n.children.is_empty();
            if is_candidate != self.lru.contains(&(n.last_access, id)) {
                return Err(format!(
                    "node {id}: LRU membership disagrees with lock/leaf state"
                ));
            }
        }
        if (evictable, protected) != (self.evictable_size, self.protected_size) {
            return Err(format!(
                "sizes: counted evictable {evictable} protected {protected}, recorded {} and {}",
                self.evictable_size, self.protected_size
            ));
        }
        if self.lru.len() > self.num_nodes() {
            return Err("LRU index holds dead nodes".into());
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "radix_tests.rs"]
mod tests;
