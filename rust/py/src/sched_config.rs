//! `tokenyard.sched.SchedulerConfig` (or any object with its fields) as the core's
//! `SchedulerConfig`: each field read, checked and named in the error. Conversions only.

use pyo3::prelude::*;
use tokenyard_core::sched::{MambaAlignSplit, Policy, PrefixCache, PriorityTies, SchedulerConfig};

use crate::errors::{OrRaise, config_error};

fn field<'py, T: for<'a> FromPyObject<'a, 'py>>(
    config: &Bound<'py, PyAny>,
    name: &'static str,
) -> PyResult<T> {
    let value = config.getattr(name)?;
    value.extract::<T>().map_err(|_| {
        let shown = value
            .repr()
            .map_or_else(|_| "?".to_string(), |r| r.to_string());
        config_error(config.py(), name, shown, "has the wrong type")
    })
}

fn count_field(config: &Bound<'_, PyAny>, name: &'static str) -> PyResult<usize> {
    let value: i64 = field(config, name)?;
    usize::try_from(value).map_err(|_| config_error(config.py(), name, value, "must be >= 0"))
}

/// An optional count below 2^32: absent or `None` reads as 0.
fn optional_count_field(config: &Bound<'_, PyAny>, name: &'static str) -> PyResult<u32> {
    if !config.hasattr(name)? || config.getattr(name)?.is_none() {
        return Ok(0);
    }
    let value: i64 = field(config, name)?;
    u32::try_from(value)
        .map_err(|_| config_error(config.py(), name, value, "must be >= 0 and below 2**32"))
}

/// A `tokenyard.sched.SchedulerConfig` (or any object with its fields) as the core's config,
/// and its `async_scheduling`.
pub(crate) fn core_config(config: &Bound<'_, PyAny>) -> PyResult<(SchedulerConfig, bool)> {
    let py = config.py();
    let policy: String = field(config, "policy")?;
    let prefix_cache: String = field(config, "prefix_cache")?;
    let priority_ties: String = field(config, "priority_ties")?;
    let core = SchedulerConfig {
        max_num_seqs: count_field(config, "max_num_seqs")?,
        max_num_batched_tokens: count_field(config, "max_num_batched_tokens")?,
        // `None` (vLLM's default): the core's 0, the same as max_num_batched_tokens.
        max_num_scheduled_tokens: optional_count_field(config, "max_num_scheduled_tokens")?,
        long_prefill_token_threshold: count_field(config, "long_prefill_token_threshold")?,
        long_prefill_token_threshold_adaptive: field(
            config,
            "long_prefill_token_threshold_adaptive",
        )?,
        enable_chunked_prefill: field(config, "enable_chunked_prefill")?,
        policy: Policy::parse(&policy).or_raise(py)?,
        priority_ties: PriorityTies::parse(&priority_ties).or_raise(py)?,
        enable_prefix_caching: field(config, "enable_prefix_caching")?,
        prefix_cache: PrefixCache::parse(&prefix_cache).or_raise(py)?,
        block_size: count_field(config, "block_size")?,
        num_blocks: count_field(config, "num_blocks")?,
        max_model_len: count_field(config, "max_model_len")?,
        num_sampled_tokens_per_step: if config.hasattr("num_sampled_tokens_per_step")? {
            count_field(config, "num_sampled_tokens_per_step")?
        } else {
            1
        },
        prioritize_prefill: field(config, "prioritize_prefill")?,
        num_lookahead_tokens: count_field(config, "num_lookahead_tokens")?,
        num_speculative_tokens: count_field(config, "num_speculative_tokens")?,
        pad_spec_decode: field(config, "pad_spec_decode")?,
        cache_accepted_drafts: field(config, "cache_accepted_drafts")?,
        max_loras: count_field(config, "max_loras")?,
        host_num_blocks: count_field(config, "host_num_blocks")?,
        scheduler_reserve_full_isl: field(config, "scheduler_reserve_full_isl")?,
        reserve_null_block: field(config, "reserve_null_block")?,
        prefill_schedule_interval: count_field(config, "prefill_schedule_interval")?,
        kv_groups: kv_groups(config)?,
        kv_group_block_sizes: if config.hasattr("kv_group_block_sizes")? {
            field::<Vec<usize>>(config, "kv_group_block_sizes")?.into_boxed_slice()
        } else {
            Box::default()
        },
        encoder: crate::sched_encoder::encoder_config(config)?,
        mamba_align: mamba_align(config)?,
        num_draft_slots_per_request: if config.hasattr("num_draft_slots_per_request")? {
            count_field(config, "num_draft_slots_per_request")?
        } else {
            0
        },
        num_prefill_lookahead: if config.hasattr("num_prefill_lookahead")? {
            count_field(config, "num_prefill_lookahead")?
        } else {
            0
        },
        num_hash_lookahead_tokens: if config.hasattr("num_hash_lookahead_tokens")? {
            count_field(config, "num_hash_lookahead_tokens")?
        } else {
            0
        },
        eagle_block_drop: if config.hasattr("eagle_block_drop")? {
            field(config, "eagle_block_drop")?
        } else {
            false
        },
        kv_group_is_eagle: if config.hasattr("kv_group_is_eagle")? {
            field::<Vec<bool>>(config, "kv_group_is_eagle")?.into_boxed_slice()
        } else {
            Box::default()
        },
        kv_window_extra_retained_tokens: if config.hasattr("kv_window_extra_retained_tokens")? {
            field(config, "kv_window_extra_retained_tokens")?
        } else {
            0
        },
    };
    Ok((core, field(config, "async_scheduling")?))
}

/// `config.mamba_align_block_size` (0 or absent: off) as the Mamba `align` split.
fn mamba_align(config: &Bound<'_, PyAny>) -> PyResult<Option<MambaAlignSplit>> {
    if !config.hasattr("mamba_align_block_size")? {
        return Ok(None);
    }
    let block_size = count_field(config, "mamba_align_block_size")?;
    Ok((block_size > 0).then(|| MambaAlignSplit::new(block_size)))
}

/// `config.kv_groups` (a sequence of `tokenyard.kv` group specs) as the core's groups.
fn kv_groups(config: &Bound<'_, PyAny>) -> PyResult<Vec<tokenyard_core::kv::KvGroupSpec>> {
    let groups = config.getattr("kv_groups")?;
    let items = groups.try_iter().map_err(|_| {
        config_error(
            config.py(),
            "kv_groups",
            crate::convert::short_repr(&groups),
            "must be a sequence of KV group specs",
        )
    })?;
    items
        .enumerate()
        .map(|(i, item)| crate::kv::group_spec(&item?, "kv_groups", i))
        .collect()
}
