//! `sglang` (seed 003, Mini-SGLang): while prefills are pending, a prefill batch under an
//! extend-token budget (one long prompt is chunked across batches and continues first);
//! otherwise one decode batch of every running request, padded up to a CUDA-graph batch
//! size for its cost. KV memory is SGLang's radix cache over a page allocator: prompts reuse
//! cached prefixes and finished requests' pages are cached. A request is admitted only if
//! its prompt and its whole output fit beside what running requests may still write, so
//! decodes never run out of memory and nothing is preempted.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::{BatchPlan, ReplicaPolicy};
use crate::kv::{KvCapacity, RadixPool, TokenId};
use crate::sim::arena::Requests;
use crate::sim::batch::Batch;
use crate::sim::request::ReqIdx;
use crate::sim::tokens::{private_token, shared_output_token, synthesize_prompt};
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SglangLimits {
    pub num_pages: u32,
    pub page_size: u32,
    pub max_running_requests: u32,
    /// Prompt tokens in one prefill batch (SGLang's chunked-prefill size).
    pub max_extend_tokens: u32,
    /// Decode batches up to the largest are padded to the next of these sizes.
    pub graph_batch_sizes: Vec<u32>,
}

pub struct Sglang {
    limits: SglangLimits,
    pool: RadixPool<ReqIdx>,
    hash_block_size: u32,
    pending: VecDeque<ReqIdx>,
    /// The request whose prompt is being prefilled in chunks.
    chunked: Option<ReqIdx>,
    /// Decoding requests between iterations.
    running: Vec<ReqIdx>,
    admitted: usize,
    prompts: FxHashMap<ReqIdx, Vec<TokenId>>,
}

impl Sglang {
    pub fn new(limits: SglangLimits, hash_block_size: u32) -> Result<Self> {
        let pool = RadixPool::new(limits.num_pages as usize, limits.page_size as usize)?;
        Ok(Self {
            limits,
            pool,
            hash_block_size,
            pending: VecDeque::new(),
            chunked: None,
            running: Vec::new(),
            admitted: 0,
            prompts: FxHashMap::default(),
        })
    }

    fn pages(&self, tokens: u64) -> usize {
        tokens.div_ceil(self.limits.page_size as u64) as usize
    }

    /// Pages a request still has to allocate to reach its full length (prompt and every
    /// output token): its length in pages less the pages it holds. Counted per request, as
    /// each request fills its own last page.
    fn pages_to_come(&self, requests: &Requests, idx: ReqIdx) -> usize {
        let held = self.pool.block_ids(&idx).map_or(0, <[_]>::len);
        self.pages(requests.get(idx).total_tokens() as u64)
            .saturating_sub(held)
    }

    /// Pages admitted requests may still allocate.
    fn reserved_pages(&self, requests: &Requests) -> usize {
        self.running
            .iter()
            .chain(&self.chunked)
            .map(|&idx| self.pages_to_come(requests, idx))
            .sum()
    }

    fn prefill_batch(&mut self, requests: &mut Requests) -> Result<BatchPlan> {
        let (mut batch, mut tokens): BatchPlan = (Vec::new(), Vec::new());
        let mut budget = self.limits.max_extend_tokens;
        // Pages still to come for a chunked prompt that completes in this batch: it is in
        // neither `running` nor `chunked` until the batch ends, yet it will decode.
        let mut completing = 0;
        if let Some(idx) = self.chunked {
            let r = requests.get(idx);
            let n = (r.num_prefill_tokens - r.num_processed_tokens).min(budget);
            self.allocate(idx, &[], n)?;
            budget -= n;
            batch.push(idx);
            tokens.push(n);
            if n < r.num_prefill_tokens - r.num_processed_tokens {
                return Ok((batch, tokens));
            }
            self.chunked = None;
            completing = self.pages_to_come(requests, idx);
        }
        let mut reserved = self.reserved_pages(requests) + completing;
        while budget > 0 && self.admitted < self.limits.max_running_requests as usize {
            let Some(&idx) = self.pending.front() else {
                break;
            };
            let prompt = &self.prompts[&idx];
            let hit = self.pool.get_computed_blocks(prompt, None);
            let r = requests.get(idx);
            let extend = r.num_prefill_tokens - hit.num_computed_tokens as u32;
            let hit_pages = hit.block_ids.len();
            let own_pages = self.pages(r.total_tokens() as u64) - hit_pages;
            // Locking the hit takes its unlocked pages out of the evictable ones.
            let locked_now = self.pool.evictable_pages_of(&hit)?;
            let available = self.pool.num_free_blocks().saturating_sub(locked_now);
            if own_pages + reserved > available {
                break;
            }
            let n = extend.min(budget);
            let prompt = self.prompts[&idx].clone();
            if self
                .pool
                .allocate_slots(&idx, &prompt, n as usize, 0, Some(&hit), None)?
                .is_none()
            {
                break;
            }
            self.pending.pop_front();
            self.admitted += 1;
            reserved += self.pages_to_come(requests, idx);
            let r = requests.get_mut(idx);
            r.prefix_hit_tokens = hit.num_computed_tokens as u32;
            r.num_processed_tokens += hit.num_computed_tokens as u32;
            budget -= n;
            batch.push(idx);
            tokens.push(n);
            if n < extend {
                self.chunked = Some(idx);
                break;
            }
        }
        Ok((batch, tokens))
    }

    fn allocate(&mut self, idx: ReqIdx, new_tokens: &[TokenId], n: u32) -> Result<()> {
        match self
            .pool
            .allocate_slots(&idx, new_tokens, n as usize, 0, None, None)?
        {
            Some(_) => Ok(()),
            None => Err(Error::Capacity {
                what: "sglang KV pages (admission reserves them: a bug)",
                requested: self.pages(n as u64),
                available: self.pool.num_free_blocks(),
            }),
        }
    }

    fn decode_batch(&mut self, requests: &mut Requests) -> Result<BatchPlan> {
        let batch = std::mem::take(&mut self.running);
        for &idx in &batch {
            // The token being decoded (the last one sampled): its content only matters to
            // this request, unless its block ids cover its output (a conversation turn).
            let r = requests.get(idx);
            let position = r.num_processed_tokens as u64 - 1;
            let token = shared_output_token(
                r.original_prefill_tokens,
                position,
                &r.hash_ids,
                self.hash_block_size,
            )
            .unwrap_or_else(|| private_token(r.id, r.num_processed_tokens as u64));
            self.allocate(idx, &[token], 1)?;
        }
        let tokens = vec![1; batch.len()];
        Ok((batch, tokens))
    }
}

impl ReplicaPolicy for Sglang {
    fn add_request(&mut self, requests: &mut Requests, idx: ReqIdx) -> Result<()> {
        let r = requests.get(idx);
        let prompt = synthesize_prompt(
            r.id,
            r.num_prefill_tokens,
            &r.hash_ids,
            self.hash_block_size,
        );
        self.prompts.insert(idx, prompt);
        self.pending.push_back(idx);
        Ok(())
    }

    fn next_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        let prefill = self.prefill_batch(requests)?;
        if !prefill.0.is_empty() {
            return Ok(Some(prefill));
        }
        let decode = self.decode_batch(requests)?;
        Ok((!decode.0.is_empty()).then_some(decode))
    }

    fn on_batch_end(&mut self, requests: &mut Requests, batch: &Batch) -> Result<Vec<ReqIdx>> {
        let mut released = Vec::new();
        for &idx in &batch.requests {
            let r = requests.get(idx);
            if r.completed {
                self.pool.free(&idx)?;
                self.prompts.remove(&idx);
                self.admitted -= 1;
                released.push(idx);
            } else if r.is_prefill_complete {
                self.running.push(idx);
            }
        }
        Ok(released)
    }

    fn num_pending(&self) -> usize {
        self.pending.len()
    }

    fn num_outstanding(&self) -> usize {
        self.pending.len() + self.admitted
    }

    fn pending_prefill_tokens(&self, requests: &Requests) -> u64 {
        self.pending
            .iter()
            .map(|&idx| requests.get(idx).num_prefill_tokens as u64)
            .sum()
    }

    fn kv_usage(&self) -> f64 {
        self.pool.usage()
    }

    fn padding_rows(&self, plan: &BatchPlan, requests: &Requests) -> u64 {
        let is_decode = plan
            .0
            .iter()
            .all(|&idx| requests.get(idx).is_prefill_complete);
        let size = plan.0.len() as u32;
        if !is_decode {
            return 0;
        }
        let padded = self
            .limits
            .graph_batch_sizes
            .iter()
            .copied()
            .find(|&s| s >= size)
            .unwrap_or(size);
        (padded - size) as u64
    }
}
