//! vLLM 0.33's HiSparse host publication (the host half of the HiSparse connector's
//! scheduler side): the host `BlockPool` of `HiSparseSourceManager` with prefix caching on,
//! as `HiSparseCoordinator` (`vllm/v1/hisparse/coordinator.py`) runs it when the
//! connector drives it. A host page is published (its block hashed, so a later admission
//! can hit it) only once the worker has acknowledged its write-back; until then each
//! write-back holds a reference on its host block. The rules, numbered as
//! docs/integrations.md writes them down ("vLLM 0.33's scheduler-side HiSparse rule"):
//!
//! - admission (rule 5): the hit is the longest run of published pages (never the prompt's
//!   last token), each hit block referenced (one without a reference leaves the free queue
//!   and counts against the free blocks); the rest take new blocks from the queue's front,
//!   evicting whatever page a block was published for; refused when the pool cannot back
//!   them (`HiSparseSourceManager.get_num_blocks_to_allocate`);
//! - write-backs (rule 2, `plan_prefix_materialization`): after each allocation every
//!   sealed page past the ready prefix that is neither valid nor pending gets a transfer,
//!   numbered in planning order, holding a reference on its host block, at most
//!   `max_spill_pages` (vLLM: `max_model_len // block_size`) planned per step;
//! - acknowledgement (rule 3, `update_spills`): a transfer's first enqueued count is how
//!   many completions it waits for (summed over workers); once they are in, in transfer
//!   order, its page turns valid and its reference goes; the live requests then advance
//!   their ready prefix over valid pages and publish that much (rule 4,
//!   `_complete_host_writes`, `_publish_host_blocks_if_ready`), in an order the caller
//!   gives ([`HostPublication::publish_ready`]: vLLM walks a Python `set` of request ids);
//! - free (rule 8, `HiSparseCoordinator.free`): a finished request with writes pending keeps
//!   the pages of its publication referenced and publishes them when its last write lands
//!   (`_publish_detached_blocks`); a preempted one's publication is dropped (its writes
//!   land for no one); its own references go tail first (`BlockPool.free_blocks`: blocks
//!   without a published page to the queue's front, published ones to its tail).
//!
//! Not modelled here: the device side (resident pages, unpinning, GPU copies, hot
//! regions), copy-on-write for hits ending inside a block, host imports, and
//! `num_reprefillable_tokens` (the caller passes tokens already less them). The pure-Python
//! reference model is `tests/hisparse_publication_model.py`;
//! `tests/test_hisparse_host_publication.py` runs this structure, that model and vLLM's own
//! coordinator side by side.
//!
//! Invariant ([`HostPublication::check`]): every usable block (all but the null block 0) is
//! either in the free queue with no reference or holds as many references as the tables,
//! transfers and finished requests' leases naming it.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::block_ops::{BlockMeta, Eviction, check_cached_count, release_blocks, take_free_blocks};
use super::cache_map::CacheMap;
use super::hisparse_shared::{Completions, PageState, free_queue_without_null, landed};
use super::{
    BlockHash, BlockId, BlockPoolStats, FreeBlockQueue, RequestKey, TokenId, hash_full_blocks,
};
use crate::{Error, Result};

/// One request's host pages and publication state (vLLM's `_HiSparseRequestState` with the
/// source manager's table).
#[derive(Debug, Clone)]
struct HostRequest {
    /// Tells a request admitted again after preemption from its earlier self (vLLM
    /// compares the state objects by identity).
    generation: u64,
    tokens: Vec<TokenId>,
    /// Chained hashes of the full pages of `tokens` known so far.
    hashes: Vec<BlockHash>,
    table: Vec<BlockId>,
    /// Valid, ready and pending pages.
    pages: PageState,
    /// Pages published (vLLM's `num_cached_block`).
    num_cached: usize,
    /// Whether a publication of the `computed` tokens is pending (vLLM's
    /// `publish_when_ready`); false once all of it is published.
    publishing: bool,
    computed: usize,
    /// Pages a finished request's publication keeps referenced until it lands (0: none).
    lease: usize,
}

/// A planned write-back (vLLM's `_PendingSpill`).
#[derive(Debug, Clone)]
struct Transfer<R> {
    request: R,
    generation: u64,
    page: usize,
    block: BlockId,
    completions: Completions,
}

/// A write-back planned by the last allocations, as the step's offload command carries it
/// (vLLM's `SparseKVPageTransfer`, host side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostTransfer {
    pub transfer_id: u64,
    pub host_block_id: BlockId,
}

/// vLLM 0.33's HiSparse host pool with prefix caching on, driven by the HiSparse
/// connector's write-backs and the worker's acknowledgements (see the module docs).
#[derive(Debug, Clone)]
pub struct HostPublication<R: RequestKey> {
    block_size: usize,
    num_blocks: usize,
    free: FreeBlockQueue,
    /// Each block's references and the page it is published for.
    blocks: Vec<BlockMeta>,
    /// Published page -> its blocks, first published first (a hit takes the first).
    cached: CacheMap,
    requests: FxHashMap<R, HostRequest>,
    /// Finished requests whose publication waits for writes, by generation.
    detached: FxHashMap<u64, HostRequest>,
    /// Pending transfers in id (planning) order.
    transfers: BTreeMap<u64, Transfer<R>>,
    /// Planned since the last [`Self::take_transfers`] (`spills_to_send`).
    planned: Vec<HostTransfer>,
    /// Write-backs planned per step at most.
    max_spill_pages: usize,
    next_transfer: u64,
    next_generation: u64,
}

impl<R: RequestKey> HostPublication<R> {
    /// A pool of `num_blocks` host blocks (block 0 the null block) of `block_size` tokens,
    /// planning at most `max_spill_pages` write-backs between two [`Self::take_transfers`].
    ///
    /// # Errors
    /// `Error::Config` when `num_blocks` < 2, or `block_size` or `max_spill_pages` is 0.
    pub fn new(num_blocks: usize, block_size: usize, max_spill_pages: usize) -> Result<Self> {
        if num_blocks < 2 {
            return Err(Error::config(
                "hisparse_host_num_blocks",
                num_blocks,
                "must be at least 2 (block 0 is the null block)",
            ));
        }
        if block_size == 0 {
            return Err(Error::config("block_size", block_size, "must be positive"));
        }
        if max_spill_pages == 0 {
            return Err(Error::config(
                "max_spill_pages",
                max_spill_pages,
                "must be positive",
            ));
        }
        Ok(Self {
            block_size,
            num_blocks,
            free: free_queue_without_null(num_blocks)?,
            blocks: vec![BlockMeta::default(); num_blocks],
            cached: CacheMap::new(num_blocks)?,
            requests: FxHashMap::default(),
            detached: FxHashMap::default(),
            transfers: BTreeMap::new(),
            planned: Vec::new(),
            max_spill_pages,
            next_transfer: 0,
            next_generation: 0,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Free blocks, the next handed out first.
    pub fn free_blocks(&self) -> Vec<BlockId> {
        self.free.iter().collect()
    }

    /// Blocks published for a page, ascending.
    pub fn published_blocks(&self) -> Vec<BlockId> {
        (0..self.num_blocks as BlockId)
            .filter(|&b| self.blocks[b as usize].cached)
            .collect()
    }

    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.blocks.get(block as usize).map_or(0, |m| m.ref_cnt)
    }

    /// The request's host table, or None when it holds none.
    pub fn table(&self, request_id: &R) -> Option<&[BlockId]> {
        self.requests.get(request_id).map(|r| r.table.as_slice())
    }

    /// Tokens the request has computed (admitted, chunks and decodes).
    pub fn num_computed_tokens(&self, request_id: &R) -> Option<usize> {
        self.requests.get(request_id).map(|r| r.computed)
    }

    /// Whether write-backs are planned or awaited (the connector's `has_pending_push_work`,
    /// host side).
    pub fn has_pending_work(&self) -> bool {
        !self.planned.is_empty() || !self.transfers.is_empty()
    }

    /// Whether a pending write-back alone holds its host block, so that acknowledging it
    /// frees the block (the host half of `has_pending_reclamation`).
    pub fn has_pending_host_reclamation(&self) -> bool {
        self.transfers
            .values()
            .any(|t| self.blocks[t.block as usize].ref_cnt == 1)
    }

    fn hashes_of(&self, tokens: &[TokenId]) -> Vec<BlockHash> {
        let mut hashes = Vec::new();
        hash_full_blocks(&mut hashes, tokens, self.block_size, None);
        hashes
    }

    fn hit_of(&self, hashes: &[BlockHash], num_tokens: usize) -> Vec<BlockId> {
        let limit = num_tokens.saturating_sub(1) / self.block_size;
        hashes[..limit.min(hashes.len())]
            .iter()
            .map_while(|hash| self.cached.get(hash, &self.blocks[..]))
            .collect()
    }

    /// The host blocks of the longest published prefix of `tokens` (all but its last
    /// token).
    pub fn hit_blocks(&self, tokens: &[TokenId]) -> Vec<BlockId> {
        self.hit_of(&self.hashes_of(tokens), tokens.len())
    }

    /// Takes `n` blocks from the free queue's front, unpublishing their pages.
    fn take(&mut self, n: usize, out: &mut Vec<BlockId>) {
        let mut eviction = Eviction {
            cached: &mut self.cached,
            events: &mut None,
            host: &mut None,
            stats: &mut BlockPoolStats::default(),
            secondary: None,
        };
        take_free_blocks(&mut self.free, &mut self.blocks, &mut eviction, n, out);
    }

    fn touch(&mut self, blocks: &[BlockId]) {
        for &block in blocks {
            let meta = &mut self.blocks[block as usize];
            if meta.ref_cnt == 0 {
                self.free.remove(block);
            }
            meta.ref_cnt += 1;
        }
    }

    /// vLLM's `BlockPool.free_blocks` ([`release_blocks`]): blocks reaching no reference go
    /// to the queue's front (unpublished, in the order given) or its tail (published).
    fn release(&mut self, blocks: impl IntoIterator<Item = BlockId>) -> Result<()> {
        let blocks: Vec<BlockId> = blocks.into_iter().collect();
        if let Some(block) = blocks
            .iter()
            .find(|&&b| self.blocks[b as usize].ref_cnt == 0)
        {
            return Err(Error::Internal(format!("host block {block} freed twice")));
        }
        release_blocks(&mut self.free, &mut self.blocks, blocks, &mut Vec::new());
        Ok(())
    }

    /// Admits `tokens` (at most `max_new_tokens` of them past the hit: a first prefill
    /// chunk). Returns the hit in tokens, or None when the pool cannot back the request
    /// (nothing changes).
    ///
    /// # Errors
    /// `Error::Input` when `tokens` is empty or the request holds blocks already.
    pub fn admit(
        &mut self,
        request_id: R,
        tokens: Vec<TokenId>,
        max_new_tokens: Option<usize>,
    ) -> Result<Option<usize>> {
        if tokens.is_empty() {
            return Err(Error::input("token_ids", "[]", "a request has a token"));
        }
        if self.requests.contains_key(&request_id) {
            return Err(Error::input(
                "request_id",
                format!("{request_id:?}"),
                "the request holds host blocks already",
            ));
        }
        let hashes = self.hashes_of(&tokens);
        let hit = self.hit_of(&hashes, tokens.len());
        let num_hit = hit.len() * self.block_size;
        let mut new = tokens.len() - num_hit;
        if let Some(max) = max_new_tokens {
            new = new.min(max);
        }
        let need = (num_hit + new).div_ceil(self.block_size) - hit.len();
        let evictable = hit
            .iter()
            .filter(|&&b| self.blocks[b as usize].ref_cnt == 0)
            .count();
        if need + evictable > self.free.len() {
            return Ok(None);
        }
        self.touch(&hit);
        let mut table = hit;
        self.take(need, &mut table);
        let num_hit_pages = num_hit / self.block_size;
        let request = HostRequest {
            generation: self.next_generation,
            tokens,
            hashes,
            table,
            pages: PageState::with_valid_prefix(num_hit_pages),
            num_cached: num_hit_pages,
            publishing: false,
            computed: 0,
            lease: 0,
        };
        self.next_generation += 1;
        self.requests.insert(request_id.clone(), request);
        self.computed(&request_id, num_hit + new);
        Ok(Some(num_hit))
    }

    /// The next prefill chunk of a running request, at most `num_new_tokens`. Returns false
    /// when the pool cannot back its pages (nothing changes).
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn step(&mut self, request_id: &R, num_new_tokens: usize) -> Result<bool> {
        let request = self.live(request_id)?;
        let total = (request.computed + num_new_tokens).min(request.tokens.len());
        let need = total
            .div_ceil(self.block_size)
            .saturating_sub(request.table.len());
        if need > self.free.len() {
            return Ok(false);
        }
        let mut new_blocks = Vec::with_capacity(need);
        self.take(need, &mut new_blocks);
        let request = self.requests.get_mut(request_id).expect("looked up above");
        request.table.extend(new_blocks);
        self.computed(request_id, total);
        Ok(true)
    }

    /// A decode step of a request whose tokens are all computed: `token` (sampled by its
    /// last step) joins its tokens and is computed. Returns false when the pool cannot back
    /// its page (the token stays appended, as vLLM's request keeps it).
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn decode(&mut self, request_id: &R, token: TokenId) -> Result<bool> {
        let block_size = self.block_size;
        let request = self
            .requests
            .get_mut(request_id)
            .ok_or_else(|| Error::UnknownRequest(format!("{request_id:?}")))?;
        request.tokens.push(token);
        hash_full_blocks(&mut request.hashes, &request.tokens, block_size, None);
        self.step(request_id, 1)
    }

    fn live(&self, request_id: &R) -> Result<&HostRequest> {
        self.requests
            .get(request_id)
            .ok_or_else(|| Error::UnknownRequest(format!("{request_id:?}")))
    }

    /// After an allocation: the publication covers `num_computed` tokens
    /// (`publish_when_ready`), then each sealed page past the ready prefix gets a
    /// write-back holding a reference on its block (`plan_prefix_materialization`).
    fn computed(&mut self, request_id: &R, num_computed: usize) {
        let block_size = self.block_size;
        let mut request = self.requests.remove(request_id).expect("a live request");
        request.computed = num_computed;
        request.publishing = true;
        self.publish(&mut request);
        for page in request.pages.ready()..num_computed / block_size {
            if self.planned.len() >= self.max_spill_pages {
                break;
            }
            if !request.pages.needs_write(page) {
                continue;
            }
            let block = request.table[page];
            self.touch(&[block]);
            let transfer_id = self.next_transfer;
            self.next_transfer += 1;
            request.pages.plan(page, transfer_id);
            self.transfers.insert(
                transfer_id,
                Transfer {
                    request: request_id.clone(),
                    generation: request.generation,
                    page,
                    block,
                    completions: Completions::default(),
                },
            );
            self.planned.push(HostTransfer {
                transfer_id,
                host_block_id: block,
            });
        }
        self.requests.insert(request_id.clone(), request);
    }

    fn publish(&mut self, request: &mut HostRequest) {
        if !request.publishing {
            return;
        }
        let num_pages = request.computed / self.block_size;
        let upto = request.pages.ready().min(num_pages);
        // `admit` and `decode` hash every full block of the tokens they add.
        debug_assert!(upto <= request.hashes.len());
        for index in request.num_cached..upto {
            let block = request.table[index];
            let page = request.hashes[index];
            self.cached.insert(page, block, &self.blocks[..]);
            self.blocks[block as usize].set_hash(page);
        }
        request.num_cached = request.num_cached.max(upto);
        if request.pages.ready() >= num_pages {
            request.publishing = false;
        }
    }

    /// The write-backs planned since the last call (vLLM's `build_offload_command`).
    pub fn take_transfers(&mut self) -> Vec<HostTransfer> {
        std::mem::take(&mut self.planned)
    }

    /// The workers' acknowledgements (vLLM's `update_spills`): `enqueued` and `completed`
    /// counts by transfer id (summed over workers, as `HiSparseConnectorWorkerMetadata`'s
    /// `aggregate` sums them; unknown ids are passed by). Each transfer whose completions
    /// reach its first enqueued count lands, in transfer order: its page turns valid, a
    /// finished request's publication lands with its last write, the transfer's reference
    /// goes. Returns the live requests with pages landed, in transfer order, each once:
    /// pass them to [`Self::publish_ready`] in the order to publish them in.
    ///
    /// # Errors
    /// `Error::Internal` if a reference would be released twice (a bug).
    pub fn acknowledge(
        &mut self,
        enqueued: &[(u64, u32)],
        completed: &[(u64, u32)],
    ) -> Result<Vec<R>> {
        let landed = landed(&mut self.transfers, enqueued, completed, |t| {
            &mut t.completions
        });
        let mut live = Vec::new();
        for id in landed {
            let transfer = self.transfers.remove(&id).expect("listed above");
            let is_live = self
                .requests
                .get(&transfer.request)
                .is_some_and(|r| r.generation == transfer.generation);
            if is_live {
                let request = self.requests.get_mut(&transfer.request).expect("live");
                request.pages.land(transfer.page);
                if !live.contains(&transfer.request) {
                    live.push(transfer.request.clone());
                }
            } else if let Some(mut request) = self.detached.remove(&transfer.generation) {
                request.pages.land(transfer.page);
                // A detached request holds a lease: its pending pages lie in it.
                if !request.pages.has_pending() {
                    request.pages.advance_ready();
                    self.publish(&mut request);
                    let lease: Vec<BlockId> = request.table[..request.lease]
                        .iter()
                        .rev()
                        .copied()
                        .collect();
                    self.release(lease)?;
                } else {
                    self.detached.insert(transfer.generation, request);
                }
            }
            self.release([transfer.block])?;
        }
        Ok(live)
    }

    /// Publishes, in the order given, the ready prefix of each live request named (vLLM's
    /// `_complete_host_writes` walking its set of request ids; the order picks which of two
    /// blocks published for one page a later hit takes). Unknown ids are passed by.
    pub fn publish_ready(&mut self, request_ids: &[R]) {
        for request_id in request_ids {
            let Some(mut request) = self.requests.remove(request_id) else {
                continue;
            };
            request.pages.advance_ready();
            self.publish(&mut request);
            self.requests.insert(request_id.clone(), request);
        }
    }

    /// Frees the request's host blocks: finished (`finished`) or preempted. A finished one's
    /// publication waits for writes pending (holding its pages), a preempted one's is
    /// dropped; its own references go, tail first.
    ///
    /// # Errors
    /// `Error::UnknownRequest` when the request holds no blocks.
    pub fn free(&mut self, request_id: &R, finished: bool) -> Result<()> {
        let mut request = self
            .requests
            .remove(request_id)
            .ok_or_else(|| Error::UnknownRequest(format!("{request_id:?}")))?;
        let table: Vec<BlockId> = request.table.iter().rev().copied().collect();
        if finished && request.publishing && request.pages.has_pending() {
            request.lease = request.computed / self.block_size;
            let lease = request.table[..request.lease].to_vec();
            self.touch(&lease);
            self.detached.insert(request.generation, request);
        }
        self.release(table)
    }

    /// Checks that blocks are conserved (see the module docs).
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub fn check(&self) -> std::result::Result<(), String> {
        let mut refs = vec![0u32; self.num_blocks];
        for request in self.requests.values() {
            request.table.iter().for_each(|&b| refs[b as usize] += 1);
        }
        for transfer in self.transfers.values() {
            refs[transfer.block as usize] += 1;
        }
        for request in self.detached.values() {
            request.table[..request.lease]
                .iter()
                .for_each(|&b| refs[b as usize] += 1);
        }
        let ref_cnt: Vec<u32> = self.blocks.iter().map(|m| m.ref_cnt).collect();
        if refs != ref_cnt {
            return Err(format!("references {ref_cnt:?} but held {refs:?}"));
        }
        let free = self.free_blocks();
        if free.iter().any(|&b| b == 0 || ref_cnt[b as usize] != 0) {
            return Err(format!(
                "free queue {free:?} holds a referenced or null block"
            ));
        }
        let held = (1..self.num_blocks).filter(|&b| ref_cnt[b] != 0).count();
        if free.len() + held != self.num_blocks - 1 {
            return Err("a block is neither free nor referenced".into());
        }
        check_cached_count(&self.blocks, &self.cached)?;
        for (block, meta) in self.blocks.iter().enumerate() {
            if let Some(page) = meta.hash()
                && self.cached.get(&page, &self.blocks[..]).is_none()
            {
                return Err(format!("block {block}'s page {page:?} is not published"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "host_publication_tests.rs"]
mod tests;
