//! vLLM 0.33's prefix-cache rules for EAGLE/EAGLE3/MTP drafters, as the scheduler's config
//! sets them (`SchedulerConfig::num_hash_lookahead_tokens`, `eagle_block_drop`, and the
//! re-prefillable lag from `num_prefill_lookahead`), checked and handed to the KV pool
//! (`kv::lookahead` applies them). With all off nothing changes anywhere.

use super::{PrefixCache, SchedulerConfig};
use crate::kv::PrefixRules;
use crate::{Error, Result};

impl SchedulerConfig {
    /// The single-group pool's rules: vLLM's `KVCacheCoordinator` with
    /// `num_hash_lookahead_tokens`, `use_eagle` and `num_reprefillable_tokens =
    /// max(0, num_prefill_lookahead - 1)` (read at construction, as vLLM builds its
    /// coordinator once). Without prefix caching, none.
    pub fn prefix_rules(&self) -> PrefixRules {
        if !self.enable_prefix_caching {
            return PrefixRules::default();
        }
        PrefixRules {
            num_hash_lookahead_tokens: self.num_hash_lookahead_tokens,
            num_reprefillable_tokens: self.num_prefill_lookahead.saturating_sub(1),
            drop_eagle_block: self.eagle_block_drop,
        }
    }

    /// Refuses what the rules cannot mean or the core does not serve: a look-ahead or the
    /// drop without block-hash prefix caching, both at once (vLLM's scheduler turns the drop
    /// off when look-ahead hashes are on), and the drop or look-ahead hashes with blocks
    /// smaller than a multi-module MTP look-ahead (vLLM's coordinator raises), and under the
    /// drop a multi-module MTP look-ahead beside a Mamba `align` group with a prefill
    /// checkpoint block (named
    /// `num_prefill_lookahead` here, before the coordinator's own guard in
    /// `kv::KvCoordinator::set_num_reprefillable_tokens` would name its argument).
    pub(super) fn validate_prefix_rules(&self) -> Result<()> {
        let block_hash = self.enable_prefix_caching && self.prefix_cache == PrefixCache::BlockHash;
        if self.num_hash_lookahead_tokens > 0 && !block_hash {
            return Err(Error::config(
                "num_hash_lookahead_tokens",
                self.num_hash_lookahead_tokens,
                "look-ahead block hashes need enable_prefix_caching with prefix_cache = \
                 \"block_hash\"",
            ));
        }
        let scheduler_block_size = self.scheduler_block_size();
        if self.num_hash_lookahead_tokens > 0 && scheduler_block_size < self.num_prefill_lookahead {
            // vLLM 0.33's `KVCacheCoordinator.__init__` raises while any group is an EAGLE
            // group: look-ahead hashes clear `use_eagle` but the drafter's groups stay
            // flagged (`kv_cache_planning` marks them for every drafter that drops).
            return Err(mtp_block_size(
                scheduler_block_size,
                self.num_prefill_lookahead,
            ));
        }
        if !self.eagle_block_drop {
            return Ok(());
        }
        if !block_hash {
            return Err(Error::config(
                "eagle_block_drop",
                "True",
                "the trailing-block drop acts on prefix hits: it needs enable_prefix_caching \
                 with prefix_cache = \"block_hash\"",
            ));
        }
        if self.num_hash_lookahead_tokens > 0 {
            return Err(Error::config(
                "eagle_block_drop",
                "True",
                format!(
                    "with num_hash_lookahead_tokens={} the look-ahead hashes prove the boundary \
                     token and vLLM 0.33 drops no block; set one of the two",
                    self.num_hash_lookahead_tokens
                ),
            ));
        }
        if scheduler_block_size < self.num_prefill_lookahead {
            return Err(mtp_block_size(
                scheduler_block_size,
                self.num_prefill_lookahead,
            ));
        }
        let checkpoints = |g: &crate::kv::KvGroupSpec| {
            g.is_mamba_align() && g.prefill_checkpoint_alignment().is_some()
        };
        if self.num_prefill_lookahead > 1 && self.kv_groups.iter().any(checkpoints) {
            // The coordinator's guard (`set_num_reprefillable_tokens`), named by the field
            // set here: vLLM keys a Mamba prefill checkpoint block at its position whatever
            // the lag (`MambaManager._cache_partial_tail_block`), the core with the lag.
            return Err(Error::config(
                "num_prefill_lookahead",
                self.num_prefill_lookahead,
                "under eagle_block_drop a multi-module MTP drafter's re-prefilled tokens beside a \
                 Mamba align group with a prefill checkpoint block are not modelled",
            ));
        }
        Ok(())
    }

    /// vLLM 0.33's `scheduler_block_size`: the least common multiple of the KV groups'
    /// block sizes (`kv_group_block_sizes`), else `block_size`. Hits land on it.
    fn scheduler_block_size(&self) -> usize {
        fn gcd(a: usize, b: usize) -> usize {
            if b == 0 { a } else { gcd(b, a % b) }
        }
        (self.kv_group_block_sizes.iter()).fold(self.block_size, |lcm, &s| {
            if s == 0 { lcm } else { lcm / gcd(lcm, s) * s }
        })
    }
}

/// vLLM 0.33's refusal of blocks smaller than a multi-module MTP drafter's prefill
/// look-ahead with prefix caching (`KVCacheCoordinator.__init__`: the dropped or
/// re-prefilled tail must hold the tokens the drafter reads past a chunk).
fn mtp_block_size(block_size: usize, num_prefill_lookahead: usize) -> Error {
    Error::config(
        "block_size",
        block_size,
        format!(
            "must be >= num_prefill_lookahead={num_prefill_lookahead} with the trailing-block \
             drop or look-ahead hashes (vLLM 0.33: multi-module MTP with prefix caching \
             requires scheduler_block_size >= num_speculative_tokens)"
        ),
    )
}

impl<R: crate::kv::RequestKey> super::Scheduler<R> {
    /// The hash look-ahead in force (`SchedulerConfig::num_hash_lookahead_tokens`).
    pub fn num_hash_lookahead_tokens(&self) -> usize {
        self.config.num_hash_lookahead_tokens
    }

    /// Hashes blocks with `lookahead` tokens past them from now on, as vLLM 0.33 does for
    /// requests whose block hasher (`get_request_block_hasher(..., lookahead)`) says so.
    /// Only while no request holds blocks.
    ///
    /// Errors: `ConfigError` as [`SchedulerConfig::validate_scheduler`] would raise for the
    /// new value, with a KV connector, or while a request holds blocks.
    pub fn set_num_hash_lookahead_tokens(&mut self, lookahead: usize) -> Result<()> {
        if lookahead == self.config.num_hash_lookahead_tokens {
            return Ok(());
        }
        let mut config = self.config.clone();
        config.num_hash_lookahead_tokens = lookahead;
        config.validate_prefix_rules()?;
        if lookahead > 0 && self.connector.is_some() {
            return Err(connector_refusal(lookahead));
        }
        self.kv.set_hash_lookahead(lookahead)?;
        self.config.num_hash_lookahead_tokens = lookahead;
        Ok(())
    }
}

/// vLLM 0.33 keeps the legacy hashes with a KV connector (`num_hash_lookahead_tokens` is 0
/// with a `kv_transfer_config`): the two are refused together.
pub(super) fn connector_refusal(lookahead: usize) -> Error {
    Error::config(
        "num_hash_lookahead_tokens",
        lookahead,
        "a KV connector keeps vLLM's legacy block hashes (vLLM 0.33 sets no look-ahead with a \
         kv_transfer_config)",
    )
}
