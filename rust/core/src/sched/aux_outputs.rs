//! Auxiliary outputs beside KV blocks, scheduler side (vLLM 0.33's
//! `AuxOutputSchedulerConnector`, `vllm/distributed/aux_output_connector/connector.py`): per
//! token records the model runner emits while it computes KV (a MoE model's routed experts),
//! kept by block hash outside the KV pool. A prefix hit is worth adopting only as far as the
//! records of its blocks are still kept, since a hit's tokens are not computed again.
//!
//! So at each admission of a request with nothing computed the scheduler asks the connector
//! for the longest hit it may adopt, and caps the local lookup there (vLLM's
//! `get_computed_blocks(request, max_cache_hit_length)`); it lets the connector cap a KV
//! connector's external tokens; and it reports the asynchronous loads it starts. Invariant:
//! with no auxiliary-output connector set, the scheduler does exactly what it did without
//! one (no call, no cap).

use super::kv::Kv;
use super::request::Request;
use super::scheduler::Scheduler;
use crate::kv::{BlockHash, BlockId, RequestKey, hash_full_blocks};
use crate::{Error, Result};

/// A request's full blocks as the pool holds them when the connector is asked: each one's
/// hash (tokenyard's, chained as `kv::block_hashes` computes them) and the block of the KV
/// group the connector asks caching it, if one does (group 0, or with several groups the
/// first full-attention one: `asked_group`). vLLM's connector asks its block pool
/// (`get_cached_block`) while the scheduler forms a step; these are its answers, taken
/// before the call.
#[derive(Debug, Clone, Copy)]
pub struct CachedBlocks<'a> {
    pub block_hashes: &'a [BlockHash],
    pub block_ids: &'a [Option<BlockId>],
}

/// The scheduler's calls into vLLM 0.33's `AuxOutputSchedulerConnector` (the ones made
/// while a step is formed; its metadata, outputs and finished requests are the caller's).
pub trait AuxOutputConnector<R>: Send + Sync {
    /// Tokens of `request`'s prefix whose auxiliary outputs are kept (vLLM's
    /// `max_cache_hit`): the local prefix hit is capped there. Asked once per admission
    /// attempt of a request with nothing computed, before its lookup.
    fn max_cache_hit(&mut self, request: &Request<R>, blocks: CachedBlocks<'_>) -> Result<usize>;

    /// The external tokens a KV connector offered after `num_local` local ones, as far as
    /// their auxiliary outputs can be had (vLLM's `cap_external_hit`: all of them or none).
    fn cap_external_hit(
        &mut self,
        request: &Request<R>,
        num_local: usize,
        num_external: usize,
        blocks: CachedBlocks<'_>,
    ) -> Result<usize>;

    /// An asynchronous load of `request`'s first `num_tokens` tokens began (vLLM's
    /// `request_loading`): their records must be kept until it is scheduled.
    fn request_loading(&mut self, request: &Request<R>, num_tokens: usize) -> Result<()>;
}

impl<R: RequestKey> Scheduler<R> {
    /// Sets (or with `None` removes) the auxiliary-output connector asked at admission.
    ///
    /// Errors: `Config` with the radix pool, whose hits are not vLLM's blocks.
    pub fn set_aux_output_connector(
        &mut self,
        connector: Option<Box<dyn AuxOutputConnector<R>>>,
    ) -> Result<()> {
        if connector.is_some() && self.kv.is_radix() {
            return Err(Error::config(
                "prefix_cache",
                "radix",
                "an auxiliary-output connector needs the block-hash pool (prefix_cache = \"block_hash\")",
            ));
        }
        self.aux_outputs = connector;
        Ok(())
    }

    /// Whether an auxiliary-output connector is set.
    pub fn has_aux_output_connector(&self) -> bool {
        self.aux_outputs.is_some()
    }

    /// The block of KV group `group` (0 with a single pool) caching the block hash `hash`
    /// (tokenyard's, as `kv::block_hashes` computes it), if one does: vLLM's
    /// `BlockPool.get_cached_block`, which the connector asks whether a block's records are
    /// still worth keeping. Ids as `kv_block_tables` gives them; `None` with the radix pool.
    pub fn cached_block(&self, hash: BlockHash, group: usize) -> Option<BlockId> {
        self.kv.cached_block(hash, group)
    }

    /// The longest prefix hit the connector lets `slot` adopt, never past its last token
    /// but one; `None` without a connector (the lookup's own bound).
    pub(super) fn aux_max_cache_hit(&mut self, slot: u32) -> Result<Option<usize>> {
        let Some(connector) = self.aux_outputs.as_mut() else {
            return Ok(None);
        };
        let request = self.slots[slot as usize].as_ref().expect("live slot");
        let (block_hashes, block_ids) = cached_blocks(&self.kv, self.config.block_size, request);
        let blocks = CachedBlocks {
            block_hashes: &block_hashes,
            block_ids: &block_ids,
        };
        let most = request.num_tokens().saturating_sub(1);
        Ok(Some(connector.max_cache_hit(request, blocks)?.min(most)))
    }

    /// The external tokens `slot` keeps of `num_external` after `num_local` local ones.
    pub(super) fn aux_cap_external(
        &mut self,
        slot: u32,
        num_local: usize,
        num_external: usize,
    ) -> Result<usize> {
        let Some(connector) = self.aux_outputs.as_mut() else {
            return Ok(num_external);
        };
        let request = self.slots[slot as usize].as_ref().expect("live slot");
        let (block_hashes, block_ids) = cached_blocks(&self.kv, self.config.block_size, request);
        let blocks = CachedBlocks {
            block_hashes: &block_hashes,
            block_ids: &block_ids,
        };
        let capped = connector.cap_external_hit(request, num_local, num_external, blocks)?;
        // The connector may only drop tokens.
        Ok(capped.min(num_external))
    }

    /// Reports an asynchronous load of `slot`'s first `num_tokens` tokens.
    pub(super) fn aux_request_loading(&mut self, slot: u32, num_tokens: usize) -> Result<()> {
        let Some(connector) = self.aux_outputs.as_mut() else {
            return Ok(());
        };
        let request = self.slots[slot as usize].as_ref().expect("live slot");
        connector.request_loading(request, num_tokens)
    }
}

/// The hashes of `request`'s full blocks and the block of the asked group caching each
/// ([`asked_group`]; its prompt's known hashes reused).
fn cached_blocks<R: RequestKey>(
    kv: &Kv,
    block_size: usize,
    request: &Request<R>,
) -> (Vec<BlockHash>, Vec<Option<BlockId>>) {
    let mut hashes = request.prompt_block_hashes.clone();
    let tokens = &request.all_token_ids;
    hashes.truncate(tokens.len() / block_size);
    hash_full_blocks(&mut hashes, tokens, block_size, request.spec.lora_id);
    let group = asked_group(kv);
    let ids = hashes.iter().map(|&h| kv.cached_block(h, group)).collect();
    (hashes, ids)
}

/// The KV group vLLM 0.33's connector asks its block pool about
/// (`getattr(coordinator, "full_attention_group_id", None) or 0`): with several groups,
/// the first full-attention one (`HybridKVCacheCoordinator` sorts full attention first),
/// else 0.
fn asked_group(kv: &Kv) -> usize {
    match kv {
        Kv::Hybrid(h) => (h.pool.groups().iter())
            .position(|g| *g == crate::kv::KvGroupSpec::FullAttention)
            .unwrap_or(0),
        Kv::BlockHash(_) | Kv::Radix(_) => 0,
    }
}
