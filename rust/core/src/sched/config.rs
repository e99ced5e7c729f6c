//! Configuration of the step scheduler (vLLM V1's `SchedulerConfig` and cache options).

use crate::{Error, Result};

/// Order of the waiting queue and choice of preemption victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Arrival order; the last running request is preempted first.
    Fcfs,
    /// Lowest `(priority, arrival)` first; the running request with the largest
    /// `(priority, arrival)` is preempted first.
    Priority,
}

impl Policy {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "fcfs" => Ok(Policy::Fcfs),
            "priority" => Ok(Policy::Priority),
            _ => Err(Error::config(
                "policy",
                name,
                "must be \"fcfs\" or \"priority\"",
            )),
        }
    }
}

/// Which prefix cache backs the scheduler's KV memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixCache {
    /// vLLM V1's block pool with chained block hashes; caches blocks as they are computed.
    BlockHash,
    /// SGLang's radix tree over a page allocator; caches a request's pages when it ends.
    Radix,
}

impl PrefixCache {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "block_hash" => Ok(PrefixCache::BlockHash),
            "radix" => Ok(PrefixCache::Radix),
            _ => Err(Error::config(
                "prefix_cache",
                name,
                "must be \"block_hash\" or \"radix\"",
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Cap on running requests; 0 = unbounded.
    pub max_num_seqs: usize,
    /// Token budget of one step.
    pub max_num_batched_tokens: usize,
    /// Per-request cap on tokens in one step; 0 = off. As in vLLM 0.33 it applies only in
    /// steps that start with more than one request running or waiting (alone, a request
    /// starves nobody).
    pub long_prefill_token_threshold: usize,
    /// vLLM 0.33's `long_prefill_token_threshold_adaptive`: the cap is at least
    /// `max_num_batched_tokens / (requests running or waiting)`, a fair share of the step.
    pub long_prefill_token_threshold_adaptive: bool,
    pub enable_chunked_prefill: bool,
    pub policy: Policy,
    pub enable_prefix_caching: bool,
    pub prefix_cache: PrefixCache,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Longest sequence (prompt + output) a request may reach.
    pub max_model_len: usize,
    /// Seed 001: prefill work takes the budget first, decodes fill the rest.
    pub prioritize_prefill: bool,
    /// Slots reserved per step for speculative tokens.
    pub num_lookahead_tokens: usize,
    /// Distinct LoRA adapters allowed in one step; 0 = no gating.
    pub max_loras: usize,
    /// Blocks of the host-memory KV tier evicted cached blocks are offloaded to (block-hash
    /// pool with prefix caching only; `kv::host_tier`); 0 = none.
    pub host_num_blocks: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            long_prefill_token_threshold: 0,
            long_prefill_token_threshold_adaptive: false,
            enable_chunked_prefill: true,
            policy: Policy::Fcfs,
            enable_prefix_caching: true,
            prefix_cache: PrefixCache::BlockHash,
            block_size: 16,
            num_blocks: 8192,
            max_model_len: 8192,
            prioritize_prefill: false,
            num_lookahead_tokens: 0,
            max_loras: 0,
            host_num_blocks: 0,
        }
    }
}

impl SchedulerConfig {
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("block_size", self.block_size),
            ("num_blocks", self.num_blocks),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(Error::config(field, 0, "must be at least 1"));
            }
        }
        if self.max_model_len < 2 {
            return Err(Error::config(
                "max_model_len",
                self.max_model_len,
                "must be at least 2",
            ));
        }
        let capacity = self.num_blocks.saturating_mul(self.block_size);
        if self.max_model_len.saturating_add(self.num_lookahead_tokens) > capacity {
            return Err(Error::config(
                "max_model_len",
                self.max_model_len,
                format!(
                    "one request of this length (plus {} lookahead slots) needs more than the \
                     KV capacity of num_blocks * block_size = {capacity} tokens",
                    self.num_lookahead_tokens
                ),
            ));
        }
        if self.host_num_blocks > 0
            && !(self.enable_prefix_caching && self.prefix_cache == PrefixCache::BlockHash)
        {
            return Err(Error::config(
                "host_num_blocks",
                self.host_num_blocks,
                "a host-memory tier holds cached blocks: it needs enable_prefix_caching with \
                 prefix_cache = \"block_hash\"",
            ));
        }
        if !self.enable_chunked_prefill && self.max_num_batched_tokens < self.max_model_len {
            return Err(Error::config(
                "max_num_batched_tokens",
                self.max_num_batched_tokens,
                format!(
                    "must be >= max_model_len={} when chunked prefill is off, or the longest \
                     prompts could never be scheduled",
                    self.max_model_len
                ),
            ));
        }
        Ok(())
    }
}
