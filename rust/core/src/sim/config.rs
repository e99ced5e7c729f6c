//! The simulator's configuration, as the Python layer hands it over: every size already
//! derived (the memory planner and the catalog live in Python).

use super::exec::LinearModel;
use super::global::GlobalPolicy;
use super::replica::{
    FasterTransformer, LightLlm, Orca, ReplicaPolicy, Sarathi, Sglang, SglangLimits, VidurLimits,
    Vllm, VllmV1,
};
use crate::sched::SchedulerConfig;
use crate::{Error, Result};

/// Vidur's five replica schedulers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VidurKind {
    Vllm,
    Sarathi,
    Orca,
    LightLlm,
    FasterTransformer,
}

#[derive(Debug, Clone)]
pub enum ReplicaPolicyConfig {
    Vidur(VidurKind, VidurLimits),
    VllmV1(SchedulerConfig),
    Sglang(SglangLimits),
}

impl ReplicaPolicyConfig {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Vidur(VidurKind::Vllm, _) => "vllm",
            Self::Vidur(VidurKind::Sarathi, _) => "sarathi",
            Self::Vidur(VidurKind::Orca, _) => "orca",
            Self::Vidur(VidurKind::LightLlm, _) => "lightllm",
            Self::Vidur(VidurKind::FasterTransformer, _) => "faster_transformer",
            Self::VllmV1(_) => "vllm_v1",
            Self::Sglang(_) => "sglang",
        }
    }

    /// The prefix-cache block size routers hash prompts with.
    pub fn block_size(&self) -> usize {
        match self {
            Self::Vidur(_, limits) => limits.block_size as usize,
            Self::VllmV1(config) => config.block_size,
            Self::Sglang(limits) => limits.page_size as usize,
        }
    }

    pub fn build(&self, hash_block_size: u32, kv_events: bool) -> Result<Box<dyn ReplicaPolicy>> {
        Ok(match self {
            Self::Vidur(kind, limits) => {
                check_vidur_limits(limits)?;
                match kind {
                    VidurKind::Vllm => Box::new(Vllm::new(*limits)?),
                    VidurKind::Sarathi => Box::new(Sarathi::new(*limits)?),
                    VidurKind::Orca => Box::new(Orca::new(*limits)?),
                    VidurKind::LightLlm => Box::new(LightLlm::new(*limits)?),
                    VidurKind::FasterTransformer => Box::new(FasterTransformer::new(*limits)?),
                }
            }
            Self::VllmV1(config) => {
                Box::new(VllmV1::new(config.clone(), hash_block_size, kv_events)?)
            }
            Self::Sglang(limits) => Box::new(Sglang::new(limits.clone(), hash_block_size)?),
        })
    }
}

fn check_vidur_limits(limits: &VidurLimits) -> Result<()> {
    let positive = [
        ("num_blocks", limits.num_blocks),
        ("block_size", limits.block_size),
        ("batch_size_cap", limits.batch_size_cap),
        ("max_batch_size", limits.max_batch_size),
        ("num_stages", limits.num_stages),
        ("max_tokens_in_batch", limits.max_tokens_in_batch),
        ("chunk_size", limits.chunk_size),
    ];
    for (name, value) in positive {
        if value == 0 {
            return Err(Error::config(name, value, "must be >= 1"));
        }
    }
    if limits.watermark_blocks >= limits.num_blocks {
        return Err(Error::config(
            "watermark_blocks",
            limits.watermark_blocks,
            format!("must be below num_blocks = {}", limits.num_blocks),
        ));
    }
    Ok(())
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub num_replicas: u32,
    pub num_stages: u32,
    pub global_policy: GlobalPolicy,
    pub replica_policy: ReplicaPolicyConfig,
    pub exec: LinearModel,
    pub seed: u64,
    /// Tokens per workload hash id (prefix identity); 0 when the workload has none.
    pub hash_block_size: u32,
    /// Minimum simulated seconds between two samples of a replica's state.
    pub sample_interval_s: f64,
    pub record_stages: bool,
}

impl SimConfig {
    pub fn validate(&self) -> Result<()> {
        if self.num_replicas == 0 {
            return Err(Error::config("cluster.num_replicas", 0, "must be >= 1"));
        }
        if self.num_stages == 0 {
            return Err(Error::config(
                "replica.num_pipeline_stages",
                0,
                "must be >= 1",
            ));
        }
        if let ReplicaPolicyConfig::Vidur(_, limits) = &self.replica_policy
            && limits.num_stages != self.num_stages
        {
            return Err(Error::config(
                "replica.num_pipeline_stages",
                self.num_stages,
                format!(
                    "the replica scheduler's limits were derived for {} stages",
                    limits.num_stages
                ),
            ));
        }
        let name = self.replica_policy.name();
        if self.num_stages > 1 && matches!(name, "lightllm" | "sglang") {
            return Err(Error::config(
                "replica.num_pipeline_stages",
                self.num_stages,
                format!("the {name} replica scheduler does not support pipeline parallelism"),
            ));
        }
        if !(self.sample_interval_s.is_finite() && self.sample_interval_s >= 0.0) {
            return Err(Error::config(
                "metrics.sample_interval_s",
                self.sample_interval_s,
                "must be a finite number >= 0",
            ));
        }
        self.exec.validate()
    }
}
