//! The cluster simulator (seed 000): requests arrive, a global scheduler routes them to
//! replicas, each replica's scheduler forms batches under its memory and batch rules, and
//! batches pass the replica's pipeline stages, each stage priced by an execution-time
//! model. Everything runs on simulated time in one deterministic event loop.
//!
//! - [`engine`]: the event loop; [`SimConfig`] and a [`RequestSource`] in, [`SimOutput`] out.
//! - [`replica`]: Vidur's vLLM, Sarathi, Orca, LightLLM and FasterTransformer schedulers,
//!   vLLM V1 (the step scheduler of `crate::sched`) and SGLang.
//! - [`global`]: routing policies; [`exec`]: execution-time models; [`lora`]: LoRA adapters.
//! - [`spec`]: speculative decoding in `vllm_v1` replicas (drafts, acceptance, draft cost).
//! - [`sessions`]: when each turn of a session is sent; closed-loop users.

pub mod arena;
pub mod batch;
mod config;
pub mod disagg;
pub mod engine;
pub mod exec;
pub mod global;
pub mod host_tier;
pub mod lora;
mod metrics;
pub mod replica;
pub mod request;
mod rng;
pub mod sessions;
pub mod spec;
mod tokens;

pub use arena::Requests;
pub use batch::{Batch, BatchShape};
pub use config::{
    KvOffload, MAX_CLUSTER_BLOCKS, OverLength, REPLICA_POLICIES, ReplicaPolicyConfig,
    ReplicaPolicyEntry, RequestLimit, SimConfig, VidurKind,
};
pub use disagg::{KvLink, Links, PdConfig, Transfer};
pub use engine::{ArrivingRequest, RequestSource, SimOutput, Simulator};
pub use exec::{ExecModel, LinearModel, OpModel, StageTime};
pub use global::{GlobalPolicy, ReplicaLoad, RouteInfo, RoutePlugin};
pub use host_tier::{HostLink, HostPorts};
pub use lora::{AdapterCache, LoraConfig, LoraShape};
pub use metrics::{GapHistogram, ReplicaTotals, RequestTable, Samples, StageTrace};
pub use replica::{
    BatchPlan, PdRole, PluginReplica, ReplicaPluginHost, ReplicaPolicy, SglangLimits, VidurLimits,
};
pub use request::{KvMoves, ReqIdx, RestartMode, SimRequest};
pub use rng::Rng;

#[cfg(test)]
mod coalesce_tests;
#[cfg(test)]
mod host_tier_tests;
#[cfg(test)]
mod pd_tests;
#[cfg(test)]
mod session_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_spec;
