//! Building a simulator: the replicas from the config's policies (or given ones), the
//! routers, the disaggregation and host-tier links, and the options set before a run
//! (the decode pool's execution model, policy plugins, a route plugin).

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::{EventQueue, Replica, SimOutput, Simulator};
use crate::sim::arena::Requests;
use crate::sim::config::SimConfig;
use crate::sim::disagg::Links;
use crate::sim::exec::ExecModel;
use crate::sim::global::{RoutePlugin, Router};
use crate::sim::host_tier::HostPorts;
use crate::sim::metrics::{ReplicaTotals, StageTrace};
use crate::sim::replica::{PdRole, ReplicaPolicy};
use crate::sim::request::ReqIdx;
use crate::sim::sessions::Sessions;
use crate::sim::tokens::PromptMemos;
use crate::{Error, Result};

impl<'a> Simulator<'a> {
    /// A simulator of `config`'s built-in replica policy.
    pub fn new(config: SimConfig, exec: &'a mut dyn ExecModel) -> Result<Self> {
        config.validate()?;
        let kv_events = config.global_policy.needs_kv_events();
        let mut policies = (0..config.num_replicas)
            .map(|replica| config.build_replica(replica, kv_events))
            .collect::<Result<Vec<_>>>()?;
        if let Some(pd) = &config.pd {
            for policy in &mut policies {
                policy.set_pd_role(PdRole::Prefill)?;
            }
            let kv_events = pd.decode_router.needs_kv_events();
            for _ in 0..pd.num_decode_replicas {
                let mut policy = pd.decode_policy.build(config.hash_block_size, kv_events)?;
                policy.set_pd_role(PdRole::Decode)?;
                policies.push(policy);
            }
        }
        Self::with_replica_policies(config, exec, policies)
    }

    /// Prices the decode pool's batches with `exec` (disaggregated runs; without it, the
    /// prefill pool's model prices both).
    pub fn with_decode_exec(mut self, exec: &'a mut dyn ExecModel) -> Self {
        self.decode_exec = Some(exec);
        self
    }

    /// A simulator whose replicas run `policies` (one per replica; e.g. plugins, with
    /// `ReplicaPolicyConfig::External` in `config`).
    pub fn with_replica_policies(
        config: SimConfig,
        exec: &'a mut dyn ExecModel,
        policies: Vec<Box<dyn ReplicaPolicy>>,
    ) -> Result<Self> {
        config.validate()?;
        let num_prefill = config.num_replicas as usize;
        let num_decode = config.pd.as_ref().map_or(0, |pd| pd.num_decode_replicas);
        if policies.len() != num_prefill + num_decode as usize {
            return Err(Error::config(
                "cluster.num_replicas",
                config.num_replicas,
                format!("{} replica policies were given", policies.len()),
            ));
        }
        let decode_stages = config.pd.as_ref().map_or(1, |pd| pd.decode_num_stages);
        let mut replicas: Vec<Replica> = policies
            .into_iter()
            .enumerate()
            .map(|(r, policy)| {
                let decode = r >= num_prefill;
                let num_stages = if decode {
                    decode_stages
                } else {
                    config.num_stages
                };
                Replica {
                    policy,
                    num_stages,
                    decode,
                    num_running_batches: 0,
                    stage_queues: vec![VecDeque::new(); num_stages as usize],
                    stage_busy: vec![false; num_stages as usize],
                    last_sample_at: f64::NEG_INFINITY,
                    lazy: None,
                }
            })
            .collect();
        let mut memos = PromptMemos::default();
        for replica in &mut replicas {
            replica.policy.share_prompt_memos(&mut memos);
            if let Some(lora) = &config.lora {
                replica.policy.enable_lora(lora)?;
            }
            if config.coalesce_decode_steps && replica.num_stages == 1 {
                replica.policy.enable_decode_coalescing();
            }
        }
        let router = Router::new(
            config.global_policy,
            num_prefill,
            config.replica_policy.block_size(),
            config.seed,
        )
        .with_host_hit_weight(config.host_hit_weight());
        let decode_router = config.pd.as_ref().map(|pd| {
            let seed = config.seed ^ 0xDEC0_DE00;
            Router::new(
                pd.decode_router,
                num_decode as usize,
                pd.decode_policy.block_size(),
                seed,
            )
        });
        let host_ports = host_ports(&config, num_prefill, num_decode as usize);
        let links = config
            .pd
            .as_ref()
            .map(|pd| Links::new(pd.link, num_prefill as u32, num_decode));
        let out = SimOutput {
            stages: config.record_stages.then(StageTrace::default),
            replicas: ReplicaTotals::new(replicas.len()),
            ..SimOutput::default()
        };
        let concurrency = config.concurrency;
        Ok(Self {
            config,
            exec,
            decode_exec: None,
            num_prefill,
            decode_router,
            links,
            host_ports,
            requests: Requests::default(),
            replicas,
            router,
            events: EventQueue::default(),
            spare_epochs: Vec::new(),
            now: 0.0,
            batches: FxHashMap::default(),
            next_batch_id: 0,
            chunk: VecDeque::new(),
            next_request_id: 0,
            last_arrival: f64::NEG_INFINITY,
            source_done: false,
            progress_due: false,
            route_plugin: None,
            sessions: Sessions::new(concurrency),
            deferred: FxHashMap::default(),
            next_deferred_key: 0,
            out,
        })
    }

    /// Gives each replica's step scheduler a policy plugin (one per replica; `vllm_v1`).
    pub fn with_policy_plugins(
        mut self,
        plugins: Vec<Box<dyn crate::sched::PolicyPlugin<ReqIdx>>>,
    ) -> Result<Self> {
        if plugins.len() != self.replicas.len() {
            return Err(Error::config(
                "cluster.num_replicas",
                self.replicas.len(),
                format!("{} policy plugins were given", plugins.len()),
            ));
        }
        for (replica, plugin) in self.replicas.iter_mut().zip(plugins) {
            replica.policy.set_policy_plugin(plugin)?;
        }
        Ok(self)
    }

    /// Routes with `plugin` instead of the configured global policy.
    pub fn with_route_plugin(mut self, plugin: Box<dyn RoutePlugin + 'a>) -> Self {
        self.route_plugin = Some(plugin);
        self
    }
}

/// Each replica's host link: the prefill (or only) pool's from `[replica.kv_offload]`, the
/// decode pool's priced for its own layout; `None` when no replica has a tier.
fn host_ports(config: &SimConfig, num_prefill: usize, num_decode: usize) -> Option<HostPorts> {
    let prefill = config.kv_offload.map(|o| o.link);
    let decode = config.pd.as_ref().and_then(|pd| pd.decode_host_link);
    if prefill.is_none() && decode.is_none() {
        return None;
    }
    let mut links = vec![prefill; num_prefill];
    links.resize(num_prefill + num_decode, decode);
    Some(HostPorts::new(links))
}
