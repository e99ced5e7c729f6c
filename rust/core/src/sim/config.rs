//! The simulator's configuration, as the Python layer hands it over: every size already
//! derived (the memory planner and the catalog live in Python). The registry of replica
//! policies lives here: a new policy is one `ReplicaPolicy` type, one entry below and one
//! config section.

use super::disagg::PdConfig;
use super::exec::LinearModel;
use super::global::GlobalPolicy;
use super::host_tier::HostLink;
use super::lora::LoraConfig;
use super::replica::{
    FasterTransformer, LightLlm, Orca, ReplicaPolicy, Sarathi, Sglang, SglangLimits, VidurLimits,
    Vllm, VllmV1,
};
use super::spec::{self, SpecConfig};
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

/// One built-in replica policy: its name, the config section holding its knobs, and
/// whether it runs under pipeline parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaPolicyEntry {
    pub name: &'static str,
    pub section: &'static str,
    pub pipeline_parallel: bool,
    pub summary: &'static str,
}

const fn entry(
    name: &'static str,
    section: &'static str,
    pipeline_parallel: bool,
    summary: &'static str,
) -> ReplicaPolicyEntry {
    ReplicaPolicyEntry {
        name,
        section,
        pipeline_parallel,
        summary,
    }
}

/// The built-in replica policies, in the order the docs list them.
pub const REPLICA_POLICIES: [ReplicaPolicyEntry; 7] = [
    entry(
        "vllm_v1",
        "vllm_v1",
        true,
        "vLLM V1's token-budget step scheduler with chunked prefill and prefix caching",
    ),
    entry(
        "vllm",
        "vidur",
        true,
        "Vidur's vLLM: whole prefills under max_tokens_in_batch, block watermark",
    ),
    entry(
        "sarathi",
        "vidur",
        true,
        "Vidur's Sarathi-Serve: chunked prefills under chunk_size",
    ),
    entry(
        "orca",
        "vidur",
        true,
        "Vidur's Orca: iteration-level batches, a full reservation per request",
    ),
    entry(
        "lightllm",
        "vidur",
        false,
        "Vidur's LightLLM: token-level memory, prefills after max_waiting_iters",
    ),
    entry(
        "faster_transformer",
        "vidur",
        true,
        "Vidur's FasterTransformer: static batches run to completion",
    ),
    entry(
        "sglang",
        "sglang",
        false,
        "Mini-SGLang: extend batches under a token budget, else one decode batch",
    ),
];

impl ReplicaPolicyEntry {
    pub fn find(name: &str) -> Result<&'static ReplicaPolicyEntry> {
        REPLICA_POLICIES
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = REPLICA_POLICIES.iter().map(|e| e.name).collect();
                Error::config(
                    "replica.scheduler.policy",
                    name,
                    format!(
                        "unknown replica policy; expected one of {}",
                        names.join(", ")
                    ),
                )
            })
    }
}

/// What happens to a request longer than a replica can ever serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverLength {
    /// Stop the run with an `InputError` naming the request and the limiting setting.
    #[default]
    Error,
    /// Leave the request out and count it (`SimOutput::num_skipped_over_length`).
    Skip,
}

impl OverLength {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "error" => Ok(Self::Error),
            "skip" => Ok(Self::Skip),
            other => Err(Error::config(
                "replica.over_length",
                other,
                "must be 'error' or 'skip'",
            )),
        }
    }
}

#[derive(Debug, Clone)]
pub enum ReplicaPolicyConfig {
    Vidur(VidurKind, VidurLimits),
    VllmV1(SchedulerConfig),
    Sglang(SglangLimits),
    /// Replicas supplied by the caller (`Simulator::with_replica_policies`), e.g. Python
    /// plugins; `block_size` is what routers hash prompts with.
    External {
        block_size: u32,
    },
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
            Self::External { .. } => "plugin",
        }
    }

    /// The prefix-cache block size routers hash prompts with.
    pub fn block_size(&self) -> usize {
        match self {
            Self::Vidur(_, limits) => limits.block_size as usize,
            Self::VllmV1(config) => config.block_size,
            Self::Sglang(limits) => limits.page_size as usize,
            Self::External { block_size } => *block_size as usize,
        }
    }

    /// KV blocks a replica of this policy tracks one by one (GPU blocks and host-tier
    /// slots); Vidur's policies only count theirs.
    pub fn tracked_blocks(&self) -> u64 {
        match self {
            Self::VllmV1(config) => config.num_blocks as u64 + config.host_num_blocks as u64,
            Self::Sglang(limits) => limits.num_pages as u64,
            Self::Vidur(..) | Self::External { .. } => 0,
        }
    }

    /// Whether pipeline stages may run several batches of this policy at once.
    pub fn pipeline_parallel(&self) -> bool {
        match self {
            Self::External { .. } => true,
            _ => ReplicaPolicyEntry::find(self.name()).is_ok_and(|e| e.pipeline_parallel),
        }
    }

    /// Why a request of `prefill + decode` tokens can never run on one replica, naming the
    /// limiting setting; `None` if it fits (or the policy is external: it decides).
    pub fn request_limit(&self, prefill: u32, decode: u32) -> Option<String> {
        let total = prefill as u64 + decode as u64;
        let blocks = |block_size: u32| total.div_ceil(block_size as u64);
        match self {
            Self::Vidur(kind, l) => {
                let usable = l.num_blocks.saturating_sub(l.watermark_blocks) as u64;
                if matches!(kind, VidurKind::Vllm | VidurKind::LightLlm)
                    && prefill > l.max_tokens_in_batch
                {
                    return Some(format!(
                        "the prompt exceeds replica.scheduler.vidur.max_tokens_in_batch = {} \
                         ({} runs whole prompts in one batch)",
                        l.max_tokens_in_batch,
                        self.name()
                    ));
                }
                let reserved = l.max_blocks_per_sequence as u64 * l.block_size as u64;
                if matches!(kind, VidurKind::Orca | VidurKind::FasterTransformer)
                    && total > reserved
                {
                    return Some(format!(
                        "it exceeds replica.scheduler.max_request_tokens = {reserved}, which {} \
                         reserves per request",
                        self.name()
                    ));
                }
                if *kind == VidurKind::LightLlm {
                    // Admission needs the worst-case peak below the token slots: alone, the
                    // prompt and first token, plus every later output but the last.
                    let peak = prefill as u64 + 1 + (decode as u64).saturating_sub(2);
                    return (peak >= l.num_blocks as u64).then(|| {
                        format!(
                            "its worst-case peak of {peak} token slots must stay below \
                             replica.scheduler.vidur.num_blocks = {} (LightLLM admits on the \
                             peak)",
                            l.num_blocks
                        )
                    });
                }
                (blocks(l.block_size) > usable).then(|| {
                    format!(
                        "it needs {} KV blocks of {} tokens and a replica has {usable} usable \
                         (replica.scheduler.vidur.num_blocks minus the watermark)",
                        blocks(l.block_size),
                        l.block_size
                    )
                })
            }
            Self::VllmV1(c) => {
                if total > c.max_model_len as u64 {
                    Some(format!(
                        "it exceeds replica.scheduler.vllm_v1.max_model_len = {}",
                        c.max_model_len
                    ))
                } else if c.is_hybrid() {
                    let needed = c.blocks_per_request(total as usize);
                    (needed > c.num_kv_blocks()).then(|| {
                        format!(
                            "it needs {needed} KV blocks of {} tokens over its {} KV groups and \
                             a replica has {} (replica.scheduler.vllm_v1.num_blocks)",
                            c.block_size,
                            c.kv_groups.len(),
                            c.num_kv_blocks()
                        )
                    })
                } else if blocks(c.block_size as u32) > c.num_blocks as u64 {
                    Some(format!(
                        "it needs {} KV blocks of {} tokens and a replica has {} \
                         (replica.scheduler.vllm_v1.num_blocks)",
                        blocks(c.block_size as u32),
                        c.block_size,
                        c.num_blocks
                    ))
                } else {
                    None
                }
            }
            Self::Sglang(l) => (blocks(l.page_size) > l.num_pages as u64).then(|| {
                format!(
                    "it needs {} KV pages of {} tokens and a replica has {} \
                     (replica.scheduler.sglang.num_pages)",
                    blocks(l.page_size),
                    l.page_size,
                    l.num_pages
                )
            }),
            Self::External { .. } => None,
        }
    }

    /// Checks the limits without building a replica (which would allocate its KV pool).
    pub fn validate(&self) -> Result<()> {
        match self {
            Self::Vidur(..) => self.build(16, false).map(|_| ()), // counting: no pool to fill
            // Simulated requests decode: a model that samples no token is not simulated.
            Self::VllmV1(config) if config.num_sampled_tokens_per_step == 0 => Err(Error::config(
                "num_sampled_tokens_per_step",
                0,
                "a simulated replica samples a token at each step (a generation model); 0, a \
                 pooling or diffusion model, is not simulated",
            )),
            Self::VllmV1(config) => config.validate(),
            Self::Sglang(l) => {
                let positive = [
                    ("num_pages", l.num_pages),
                    ("page_size", l.page_size),
                    ("max_running_requests", l.max_running_requests),
                    ("max_extend_tokens", l.max_extend_tokens),
                ];
                match positive.iter().find(|(_, value)| *value == 0) {
                    Some((name, value)) => Err(Error::config(name, value, "must be >= 1")),
                    None => Ok(()),
                }
            }
            Self::External { block_size: 0 } => Err(Error::config("block_size", 0, "must be >= 1")),
            Self::External { .. } => Ok(()),
        }
    }

    pub fn build(&self, hash_block_size: u32, kv_events: bool) -> Result<Box<dyn ReplicaPolicy>> {
        Ok(match self {
            Self::Vidur(kind, limits) => {
                check_vidur_limits(limits)?;
                if matches!(kind, VidurKind::Orca | VidurKind::FasterTransformer) {
                    check_reservation(limits)?;
                }
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
            Self::External { .. } => {
                return Err(Error::config(
                    "replica.scheduler.policy",
                    "plugin",
                    "external replica policies are supplied by the caller",
                ));
            }
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

/// Orca and FasterTransformer reserve `max_blocks_per_sequence` per request: at least one
/// block, and no more than a replica's usable blocks, or nothing could ever be admitted.
fn check_reservation(limits: &VidurLimits) -> Result<()> {
    let usable = limits.num_blocks - limits.watermark_blocks;
    let reserved = limits.max_blocks_per_sequence;
    if reserved == 0 || reserved > usable {
        return Err(Error::config(
            "replica.scheduler.max_request_tokens",
            reserved as u64 * limits.block_size as u64,
            format!(
                "orca and faster_transformer reserve it per request, in blocks of {}: it must be \
                 at least one block and at most the replica's {usable} usable blocks",
                limits.block_size
            ),
        ));
    }
    Ok(())
}

/// The most replicas one simulation holds.
pub const MAX_REPLICAS: u32 = 4096;
/// The most KV blocks tracked one by one across a cluster (tens of bytes each).
pub const MAX_CLUSTER_BLOCKS: u64 = 1 << 26;

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
    pub over_length: OverLength,
    /// The longest request any replica serves, judged alike for every policy before its
    /// own limits; `None`: only the policy's limits.
    pub request_limit: Option<RequestLimit>,
    /// Closed-loop load: this many users, each sending its next session (or request) when
    /// its previous one completed (`super::sessions`); `None`: requests arrive at their
    /// times (open loop).
    pub concurrency: Option<u32>,
    /// `[replica.lora]`: LoRA adapters on `vllm_v1` replicas; `None` = no adapters.
    pub lora: Option<LoraConfig>,
    /// Speculative decoding (`vllm_v1` replicas only); `None` = off.
    pub speculative: Option<SpecConfig>,
    /// Disaggregated serving: the replicas above are the prefill pool, and this is the
    /// decode pool (`super::disagg`); `None` = every replica does both.
    pub pd: Option<PdConfig>,
    /// `[replica.kv_offload]`: the replicas' host-memory KV tier (its size is the `vllm_v1`
    /// scheduler's `host_num_blocks`); `None` = no tier.
    pub kv_offload: Option<KvOffload>,
    /// Coalesced decode steps (`vllm_v1` replicas of one pipeline stage): while a replica's
    /// batch is pure decode and nothing can change the next steps, the step scheduler
    /// advances them in closed form (`crate::sched::multistep`). The results are the same
    /// bit for bit either way; `false` steps the scheduler one step at a time (a check).
    pub coalesce_decode_steps: bool,
}

/// The longest request (prompt + output) a deployment serves: the model's context length
/// or the user's lower setting (vLLM's `max_model_len`, SGLang's `context_length`). Every
/// replica policy refuses a longer request at arrival, for this one reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLimit {
    pub max_tokens: u64,
    /// What sets it, with its value, for messages: `replica.scheduler.max_request_tokens =
    /// 4096`, or the model's context length when no setting lowers it.
    pub setting: String,
}

/// The host tier's link and what `prefix_affinity` makes of its hits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvOffload {
    pub link: HostLink,
    /// A cached token held in host memory is worth this many held on a GPU when routing.
    pub host_hit_weight: f64,
}

impl SimConfig {
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_REPLICAS).contains(&self.num_replicas) {
            return Err(Error::config(
                "cluster.num_replicas",
                self.num_replicas,
                format!("must be in [1, {MAX_REPLICAS}]"),
            ));
        }
        self.check_cluster_blocks()?;
        if let Some(limit) = &self.request_limit
            && limit.max_tokens < 2
        {
            return Err(Error::config(
                "replica.scheduler.max_request_tokens",
                limit.max_tokens,
                "must be >= 2 (a prompt token and an output token)",
            ));
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
        if self.num_stages > 1 && !self.replica_policy.pipeline_parallel() {
            return Err(Error::config(
                "replica.num_pipeline_stages",
                self.num_stages,
                format!("the {name} replica scheduler does not support pipeline parallelism"),
            ));
        }
        if self.concurrency == Some(0) {
            return Err(Error::config(
                "workload.concurrency",
                0,
                "must be >= 1 (or absent for open-loop arrivals)",
            ));
        }
        if !(self.sample_interval_s.is_finite() && self.sample_interval_s >= 0.0) {
            return Err(Error::config(
                "metrics.sample_interval_s",
                self.sample_interval_s,
                "must be a finite number >= 0",
            ));
        }
        if let Some(lora) = &self.lora {
            lora.validate()?;
        }
        self.validate_speculative()?;
        check_host_tier(
            "replica.kv_offload",
            &self.replica_policy,
            self.kv_offload.as_ref().map(|o| &o.link),
        )?;
        if let Some(offload) = &self.kv_offload {
            let weight = offload.host_hit_weight;
            if !(weight.is_finite() && (0.0..=1.0).contains(&weight)) {
                return Err(Error::config(
                    "replica.kv_offload.host_hit_weight",
                    weight,
                    "must be in [0, 1]",
                ));
            }
        }
        if let Some(pd) = &self.pd {
            pd.validate(&self.replica_policy)?;
            if self.speculative.is_some() {
                return Err(Error::config(
                    "replica.speculative.method",
                    "set",
                    "speculative decoding is not simulated in disaggregated pools yet",
                ));
            }
            if self.lora.is_some() {
                return Err(Error::config(
                    "replica.lora",
                    "set",
                    "LoRA adapters are not simulated in disaggregated pools yet",
                ));
            }
        }
        self.exec.validate()
    }

    /// One budget for every KV structure the run builds block by block: both pools' GPU
    /// blocks and host tiers, checked before anything is allocated.
    fn check_cluster_blocks(&self) -> Result<()> {
        let prefill = self.replica_policy.tracked_blocks() * self.num_replicas as u64;
        let decode = self.pd.as_ref().map_or(0, |pd| {
            pd.decode_policy.tracked_blocks() * pd.num_decode_replicas as u64
        });
        if prefill + decode <= MAX_CLUSTER_BLOCKS {
            return Ok(());
        }
        let pools = match &self.pd {
            None => format!(
                "{} replicas of {} KV blocks each (GPU and host tier)",
                self.num_replicas,
                self.replica_policy.tracked_blocks()
            ),
            Some(pd) => format!(
                "{} prefill replicas of {} KV blocks and {} decode replicas of {} (GPU and host \
                 tiers)",
                self.num_replicas,
                self.replica_policy.tracked_blocks(),
                pd.num_decode_replicas,
                pd.decode_policy.tracked_blocks()
            ),
        };
        Err(Error::config(
            "cluster.num_replicas",
            self.num_replicas,
            format!(
                "{pools} make {} blocks, over the simulator's limit of {MAX_CLUSTER_BLOCKS} in \
                 all (each block is tracked one by one under {}); use fewer replicas or a \
                 larger block size",
                prefill + decode,
                self.replica_policy.name()
            ),
        ))
    }

    /// Routers' weight of a host-tier hit (0 without a tier).
    pub fn host_hit_weight(&self) -> f64 {
        self.kv_offload.map_or(0.0, |o| o.host_hit_weight)
    }

    fn validate_speculative(&self) -> Result<()> {
        let Some(spec) = &self.speculative else {
            return Ok(());
        };
        let ReplicaPolicyConfig::VllmV1(sched) = &self.replica_policy else {
            return Err(Error::config(
                "replica.speculative.method",
                spec.method.name(),
                format!(
                    "speculative decoding runs in vllm_v1 replicas only, not {}",
                    self.replica_policy.name()
                ),
            ));
        };
        spec.validate()?;
        spec::scheduler_config(sched, spec).validate()
    }

    /// Replica `replica`'s scheduler (with speculative decoding when configured).
    pub fn build_replica(&self, replica: u32, kv_events: bool) -> Result<Box<dyn ReplicaPolicy>> {
        match (&self.replica_policy, &self.speculative) {
            (ReplicaPolicyConfig::VllmV1(sched), Some(spec)) => {
                let config = spec::scheduler_config(sched, spec);
                let v1 = VllmV1::new(config, self.hash_block_size, kv_events)?;
                Ok(Box::new(v1.with_speculative(spec, self.seed, replica)))
            }
            _ => self.replica_policy.build(self.hash_block_size, kv_events),
        }
    }
}

/// A pool's host tier needs both its size (the `vllm_v1` scheduler's `host_num_blocks`) and
/// its link; either alone is refused, naming `key` (the pool's `kv_offload`).
pub(super) fn check_host_tier(
    key: &'static str,
    policy: &ReplicaPolicyConfig,
    link: Option<&HostLink>,
) -> Result<()> {
    let host_blocks = match policy {
        ReplicaPolicyConfig::VllmV1(config) => config.host_num_blocks,
        _ => 0,
    };
    match (host_blocks, link) {
        (0, None) => Ok(()),
        (0, Some(_)) => Err(Error::config(
            key,
            "set",
            format!(
                "a host tier is simulated on vllm_v1 replicas with host_num_blocks > 0, not {}",
                policy.name()
            ),
        )),
        (n, None) => Err(Error::config(
            key,
            "unset",
            format!("the scheduler has a host tier of {n} blocks but no host link to load it"),
        )),
        (_, Some(link)) => link.validate(),
    }
}
