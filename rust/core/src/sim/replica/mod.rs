//! Replica schedulers (seed 000 §4-§10, plus vLLM V1 and SGLang): each forms the batches of
//! one replica and owns its KV memory.

mod faster_transformer;
mod lightllm;
mod orca;
mod plugin;
mod sarathi;
mod sglang;
mod v1;
mod vidur;
mod vllm;

pub use faster_transformer::FasterTransformer;
pub use lightllm::LightLlm;
pub use orca::Orca;
pub use plugin::{PluginReplica, ReplicaPluginHost};
pub use sarathi::Sarathi;
pub use sglang::Sglang;
pub use sglang::SglangLimits;
pub use v1::VllmV1;
pub use vidur::VidurLimits;
pub use vllm::Vllm;

use super::arena::Requests;
use super::batch::Batch;
use super::lora::{LoraConfig, LoraShape};
use super::request::ReqIdx;
use super::tokens::PromptMemos;
use crate::Result;
use crate::kv::KvEvent;
use crate::sched::{KvLoad, PolicyPlugin};

/// A replica's part in disaggregated serving (`super::disagg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PdRole {
    /// Prefill and decode on one replica.
    #[default]
    Aggregated,
    /// Computes prompts and first tokens; keeps a request's blocks until its KV is sent.
    Prefill,
    /// Receives KV computed elsewhere, then decodes.
    Decode,
}

/// The requests of a new batch and the tokens each computes.
pub type BatchPlan = (Vec<ReqIdx>, Vec<u32>);

pub trait ReplicaPolicy: Send {
    /// A request routed to this replica. The simulator has already refused (or skipped) a
    /// request longer than the replica can ever serve (`ReplicaPolicyConfig::request_limit`).
    fn add_request(&mut self, requests: &mut Requests, idx: ReqIdx) -> Result<()>;

    /// The next batch to run, if any (called while pipeline stages are free).
    fn next_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>>;

    /// Called after every request of `batch` took its `on_batch_end`. Returns the requests
    /// the replica has let go of for good (completed, memory freed).
    fn on_batch_end(&mut self, requests: &mut Requests, batch: &Batch) -> Result<Vec<ReqIdx>>;

    /// Vidur's `num_pending_requests`: requests waiting for their first schedule.
    fn num_pending(&self) -> usize;

    /// Requests routed here and not yet released.
    fn num_outstanding(&self) -> usize;

    /// Prompt tokens of waiting requests: the prefill work queued here.
    fn pending_prefill_tokens(&self, requests: &Requests) -> u64;

    /// Fraction of the KV memory allocated.
    fn kv_usage(&self) -> f64;

    /// Takes back the vectors of a plan this replica made, once its batch has ended, for
    /// its next plans (a replica that plans every step need not allocate every step).
    fn recycle(&mut self, _plan: BatchPlan) {}

    /// Cache events since the last call (replicas with a prefix cache).
    fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        Vec::new()
    }

    /// Hands the waiting order and preemption victims to a step-scheduler policy plugin
    /// (the one `crate::sched::Scheduler` takes); only `vllm_v1` replicas have them.
    fn set_policy_plugin(&mut self, _plugin: Box<dyn PolicyPlugin<ReqIdx>>) -> Result<()> {
        Err(crate::Error::config(
            "replica.scheduler.policy_plugin",
            "set",
            "only vllm_v1 replicas take a step-scheduler policy plugin",
        ))
    }

    /// Serves LoRA adapters with `config` (`[replica.lora]`); only `vllm_v1` replicas can.
    fn enable_lora(&mut self, _config: &LoraConfig) -> Result<()> {
        Err(crate::Error::config(
            "replica.lora",
            "set",
            "LoRA adapters are simulated on vllm_v1 replicas only",
        ))
    }

    /// The LoRA part of a new batch's shape, loading the adapters it needs (zero without
    /// LoRA).
    fn lora_shape(
        &mut self,
        _ids: &[ReqIdx],
        _num_tokens: &[u32],
        _requests: &Requests,
    ) -> Result<LoraShape> {
        Ok(LoraShape::default())
    }

    /// Takes part in disaggregated serving as `role`; only `vllm_v1` replicas can.
    fn set_pd_role(&mut self, _role: PdRole) -> Result<()> {
        Err(crate::Error::config(
            "replica.scheduler.policy",
            "set",
            "prefill and decode pools run vllm_v1 replicas only",
        ))
    }

    /// KV loads that began since the last call: transfers in from a prefill replica (a
    /// decode replica's requests; a request admitted with no tokens to load reports a load
    /// of zero), or a host-memory tier's blocks.
    fn drain_kv_loads(&mut self) -> Vec<KvLoad<ReqIdx>> {
        Vec::new()
    }

    /// A transfer of request `idx` ended here: its KV landed (`sent = false`) or, on the
    /// replica that computed it, it has been sent and its blocks can go.
    fn finish_kv_transfer(&mut self, _idx: ReqIdx, _sent: bool) -> Result<()> {
        Err(crate::Error::Internal(
            "a KV transfer ended on a replica that runs none".into(),
        ))
    }

    /// KV blocks still allocated: 0 once every request routed here has been released, or
    /// blocks leaked (the simulator checks it at the end of a run).
    fn num_allocated_blocks(&self) -> usize {
        0
    }

    /// Host-memory tier totals: blocks offloaded to it and loaded back (0 without one).
    fn host_tier_blocks(&self) -> (u64, u64) {
        (0, 0)
    }

    /// Lets the replica coalesce pure-decode steps (`SimConfig::coalesce_decode_steps`; a
    /// replica of one pipeline stage). Only `vllm_v1` does; the others ignore it.
    fn enable_decode_coalescing(&mut self) {}

    /// Whether the batch `next_batch` formed last is a step of a coalesced decode window:
    /// its requests decode one token each, with no drafts, and none is preempted or
    /// restarted before it ends, but for the requests it admitted
    /// (`window_step_admissions`), listed last. The simulator may then settle the others
    /// lazily (`engine::lazy`). `false` by default.
    fn batch_is_window_step(&self) -> bool {
        false
    }

    /// The requests a window step (`batch_is_window_step`) admitted beside the window's,
    /// the last ones of its batch; 0 by default.
    fn window_step_admissions(&self) -> usize {
        0
    }

    /// Whether the next `next_batch` is certain to form the next step of the window whose
    /// latest step has ended, over that step's requests less those it finished (plus those
    /// it admitted that joined the window), reading and changing no request of the arena
    /// but those it admits. `false` by default (and whenever unsure: the
    /// simulator then brings the window's requests up to date first).
    fn next_batch_continues_window(&self) -> bool {
        false
    }

    /// Shares the replica's prompt memos with the other replicas' (`memos`: one per
    /// shape for the whole simulation). Only `vllm_v1` keeps any; the others ignore it.
    fn share_prompt_memos(&mut self, _memos: &mut PromptMemos) {}

    /// Padding rows of decode batches (SGLang's CUDA-graph sizes); 0 by default.
    fn padding_rows(&self, _plan: &BatchPlan, _requests: &Requests) -> u64 {
        0
    }
}
