//! The embeddable step scheduler (vLLM V1 semantics, seeds 002 and 004): each step serves
//! running requests first, then admits waiting ones, under a token budget, a sequence cap
//! and KV memory, preempting (recompute) when memory runs out.

mod admission;
mod adopt;
mod aux_outputs;
mod block_free;
mod budget;
mod config;
mod connector;
mod encoder;
mod encoder_cache;
mod encoder_connector;
mod encoder_decoder;
mod hisparse;
mod hisparse_step;
mod hooks;
mod in_flight;
mod invariants;
mod kv;
mod kv_events;
mod kv_inspect;
mod kv_outside;
mod load_failures;
mod loads;
mod mamba_align;
mod multistep;
mod multistep_admit;
mod output;
mod outside_wait;
mod plugin;
mod prefix_rules;
mod queue;
mod request;
mod scheduler;
mod session;
mod stale;
mod update;

pub use adopt::OutsideStep;
pub use aux_outputs::{AuxOutputConnector, CachedBlocks};
pub use config::{Policy, PrefixCache, PriorityTies, SchedulerConfig};
pub use connector::{ExternalTokens, KvConnector, KvLoad};
pub use encoder::{EncoderConfig, MmFeature};
pub use encoder_cache::EncoderCache;
pub use encoder_connector::EncoderConnector;
pub use hisparse::HostPagesState;
pub use hooks::StepHooks;
pub use load_failures::{KvLoadFailurePolicy, KvLoadFailures};
pub use mamba_align::{MambaAlignSplit, MambaSplitRule};
pub use multistep::DecodeWindow;
#[cfg(test)]
pub(crate) use multistep_admit::admission_steps;
pub use output::{
    CachedRequestData, NewRequestData, SampledOutput, SchedulerOutput, SchedulerStats,
};
pub use outside_wait::OutsideWait;
pub use plugin::{PolicyPlugin, RequestView};
pub use request::{
    DeferredPrompt, FinishReason, PLACEHOLDER_DRAFT, PromptSource, RepetitionDetection, Request,
    RequestSpec, RequestStatus,
};
pub use scheduler::Scheduler;
pub use session::SessionUpdate;

#[cfg(test)]
mod tests;
