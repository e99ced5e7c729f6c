//! Behaviours of the step scheduler, each with numbers checkable by hand, by topic; the
//! shared fixtures are here.

mod arrivals;
mod async_scheduling;
mod aux_outputs;
mod block_copies;
mod block_free;
mod budgets;
mod cadence;
mod connector_tables;
mod connectors;
mod cross_attention;
mod deferred;
mod draft_slots;
mod encoder;
mod encoder_connector;
mod encoder_loads;
mod encoder_settings;
mod hisparse;
mod hisparse_step;
mod hooks;
mod hybrid;
mod hybrid_connectors;
mod kv_views;
mod lifecycle;
mod load_failures;
mod mamba_align;
mod mamba_connectors;
mod memory;
mod multistep;
mod plugins;
mod prefix_rules;
mod repetition;
mod replay;
mod samplers;
mod sessions;
mod speculative;
mod stale_outputs;

use super::*;

pub(super) fn config() -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 0,
        max_num_batched_tokens: 10,
        block_size: 4,
        num_blocks: 64,
        max_model_len: 64,
        enable_prefix_caching: false,
        ..SchedulerConfig::without_vllm_reservations()
    }
}

pub(super) fn prompt(id: u32, len: usize) -> RequestSpec {
    RequestSpec {
        prompt_token_ids: (0..len as u32).map(|t| id * 1000 + t).collect(),
        max_tokens: 4,
        ..RequestSpec::default()
    }
}

pub(super) fn scheduled(out: &SchedulerOutput<u32>) -> Vec<(u32, usize)> {
    out.num_scheduled_tokens.clone()
}

/// A fake model: one token (`7`) for each request that caught up with its tokens.
pub(super) fn run_step(s: &mut Scheduler<u32>) -> SchedulerOutput<u32> {
    let out = s.schedule().unwrap();
    answer_step(s, out)
}

/// The fake model's answer to the step `out`: one token (`7`) for each request that caught
/// up with its tokens. Returns `out`.
pub(super) fn answer_step(
    s: &mut Scheduler<u32>,
    out: SchedulerOutput<u32>,
) -> SchedulerOutput<u32> {
    let outputs: Vec<_> = out
        .num_scheduled_tokens
        .iter()
        .filter(|(id, _)| {
            let r = s.get_request(id).unwrap();
            r.num_computed_tokens >= r.num_tokens()
        })
        .map(|&(id, _)| SampledOutput {
            request_id: id,
            token_ids: vec![7],
            ..Default::default()
        })
        .collect();
    s.update_from_output(&outputs).unwrap();
    s.check_invariants().unwrap();
    out
}

pub(super) fn sample(request_id: u32, token: u32) -> SampledOutput<u32> {
    SampledOutput {
        request_id,
        token_ids: vec![token],
        ..Default::default()
    }
}
