//! Global schedulers (seed 000 §3 and beyond): which replica a new request goes to.
//!
//! - `round_robin`: replica `counter % N`.
//! - `lor`: least outstanding requests — Vidur's: the fewest requests waiting in the
//!   replica's queue (ties: lowest replica id).
//! - `random`: uniform, from the simulation's seed.
//! - `least_kv_load`: the lowest KV memory usage (ties: fewer outstanding requests).
//! - `power_of_two`: two distinct random replicas, the one with fewer outstanding requests.
//! - `prefix_affinity`: a cluster-wide prefix index, fed by the replicas' cache events
//!   (block stored / removed), tells how many prompt tokens each replica already holds;
//!   `score = cached_tokens − balance × queued_prefill_tokens`, highest wins (ties: fewer
//!   outstanding requests, then lowest id). One cached token is worth `balance` tokens of
//!   queued prefill work. With host-memory tiers, a prefix run continues into the blocks a
//!   replica holds in host memory (told by host-tier events), each such token counting
//!   `host_hit_weight` of one on its GPUs (it still crosses PCIe).

use rustc_hash::{FxHashMap, FxHashSet};

use super::rng::Rng;
use crate::kv::{BlockHash, KvEvent, TokenId, hash_full_blocks};
use crate::{Error, Result};

/// What the router knows of a replica when it routes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplicaLoad {
    pub num_pending: usize,
    pub num_outstanding: usize,
    pub queued_prefill_tokens: u64,
    pub kv_usage: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GlobalPolicy {
    RoundRobin,
    Lor,
    Random,
    LeastKvLoad,
    PowerOfTwo,
    PrefixAffinity { balance: f64 },
}

impl GlobalPolicy {
    pub const NAMES: [&'static str; 6] = [
        "round_robin",
        "lor",
        "random",
        "least_kv_load",
        "power_of_two",
        "prefix_affinity",
    ];

    pub fn from_name(name: &str, balance: f64) -> Result<Self> {
        Ok(match name {
            "round_robin" => Self::RoundRobin,
            "lor" => Self::Lor,
            "random" => Self::Random,
            "least_kv_load" => Self::LeastKvLoad,
            "power_of_two" => Self::PowerOfTwo,
            "prefix_affinity" => {
                if !(balance.is_finite() && balance >= 0.0) {
                    return Err(Error::config(
                        "global_scheduler.balance",
                        balance,
                        "must be a finite number >= 0",
                    ));
                }
                Self::PrefixAffinity { balance }
            }
            other => {
                return Err(Error::config(
                    "global_scheduler.policy",
                    other,
                    format!("unknown policy; expected one of {}", Self::NAMES.join(", ")),
                ));
            }
        })
    }

    pub fn needs_queued_tokens(&self) -> bool {
        matches!(self, Self::PrefixAffinity { .. })
    }

    pub fn needs_kv_events(&self) -> bool {
        matches!(self, Self::PrefixAffinity { .. })
    }
}

/// What a routing plugin sees of a new request.
#[derive(Debug, Clone, Copy)]
pub struct RouteInfo<'a> {
    pub request_id: u64,
    pub arrived_at: f64,
    pub num_prefill_tokens: u32,
    pub num_decode_tokens: u32,
    pub hash_ids: &'a [u64],
}

/// A global scheduler written elsewhere (Python): picks a replica index for each request.
pub trait RoutePlugin: Send {
    fn route(&mut self, request: &RouteInfo<'_>, loads: &[ReplicaLoad]) -> Result<usize>;
}

pub struct Router {
    policy: GlobalPolicy,
    counter: u64,
    rng: Rng,
    block_size: usize,
    /// Per replica: the block hashes its prefix cache holds (prefix_affinity), on its GPUs
    /// and in its host tier.
    /// Per replica, the blocks caching each hash (a hash may be cached in several).
    index: Vec<FxHashMap<BlockHash, u32>>,
    host_index: Vec<FxHashSet<BlockHash>>,
    host_hit_weight: f64,
}

impl Router {
    pub fn new(policy: GlobalPolicy, num_replicas: usize, block_size: usize, seed: u64) -> Self {
        Self {
            policy,
            counter: 0,
            rng: Rng::new(seed ^ 0x5EED_0F40_07E5),
            block_size,
            index: vec![FxHashMap::default(); num_replicas],
            host_index: vec![FxHashSet::default(); num_replicas],
            host_hit_weight: 0.0,
        }
    }

    /// A host-tier token's worth against a GPU one (`prefix_affinity`).
    pub fn with_host_hit_weight(mut self, weight: f64) -> Self {
        self.host_hit_weight = weight;
        self
    }

    pub fn needs_queued_tokens(&self) -> bool {
        self.policy.needs_queued_tokens()
    }

    /// Applies a replica's cache events to the index.
    pub fn on_kv_events(&mut self, replica: usize, events: &[KvEvent]) {
        let (held, host) = (&mut self.index[replica], &mut self.host_index[replica]);
        for event in events {
            match *event {
                KvEvent::Stored(hash) => *held.entry(hash).or_insert(0) += 1,
                KvEvent::Removed(hash) => {
                    if let Some(num_blocks) = held.get_mut(&hash) {
                        *num_blocks -= 1;
                        if *num_blocks == 0 {
                            held.remove(&hash);
                        }
                    }
                }
                KvEvent::AllCleared => held.clear(),
                KvEvent::HostStored(hash) => {
                    host.insert(hash);
                }
                KvEvent::HostRemoved(hash) => {
                    host.remove(&hash);
                }
            }
        }
    }

    /// The replica for a request; `prompt` is needed only by `prefix_affinity`, whose block
    /// hashes take `extra_key` as the replicas' caches do (the request's LoRA adapter: an
    /// adapter's KV is its own).
    pub fn route(
        &mut self,
        loads: &[ReplicaLoad],
        extra_key: Option<u64>,
        prompt: impl FnOnce() -> Vec<TokenId>,
    ) -> usize {
        self.route_hashed(loads, |block_size| {
            let mut hashes = Vec::new();
            hash_full_blocks(&mut hashes, &prompt(), block_size, extra_key);
            hashes
        })
    }

    /// [`Self::route`] given the prompt's block hashes for a block size, as the replicas'
    /// pools name them (`tokens::prompt_block_hashes`, which names blocks of trace ids by
    /// id), asked only by `prefix_affinity`.
    pub fn route_hashed(
        &mut self,
        loads: &[ReplicaLoad],
        prompt_hashes: impl FnOnce(usize) -> Vec<BlockHash>,
    ) -> usize {
        let n = loads.len();
        let fewest = |candidates: &mut dyn Iterator<Item = usize>, key: &dyn Fn(usize) -> f64| {
            candidates
                .min_by(|&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)))
                .unwrap_or(0)
        };
        match self.policy {
            GlobalPolicy::RoundRobin => {
                let r = (self.counter % n as u64) as usize;
                self.counter += 1;
                r
            }
            GlobalPolicy::Lor => fewest(&mut (0..n), &|r| loads[r].num_pending as f64),
            GlobalPolicy::Random => self.rng.below(n),
            GlobalPolicy::LeastKvLoad => fewest(&mut (0..n), &|r| {
                loads[r].kv_usage * 1e9 + loads[r].num_outstanding as f64
            }),
            GlobalPolicy::PowerOfTwo => {
                if n == 1 {
                    return 0;
                }
                let a = self.rng.below(n);
                let b = (a + 1 + self.rng.below(n - 1)) % n;
                if loads[b].num_outstanding < loads[a].num_outstanding {
                    b
                } else {
                    a
                }
            }
            GlobalPolicy::PrefixAffinity { balance } => {
                let hashes = prompt_hashes(self.block_size);
                let score = |r: usize| {
                    self.cached_tokens(r, &hashes) - balance * loads[r].queued_prefill_tokens as f64
                };
                (0..n)
                    .max_by(|&a, &b| {
                        score(a)
                            .total_cmp(&score(b))
                            .then(loads[b].num_outstanding.cmp(&loads[a].num_outstanding))
                            .then(b.cmp(&a))
                    })
                    .unwrap_or(0)
            }
        }
    }
}

impl Router {
    /// Replica `r`'s cached prefix of a prompt with block `hashes`, in GPU-token units: the
    /// run its GPUs hold, then the run its host tier holds after it (weighted), as its
    /// block pool's lookup would find them.
    fn cached_tokens(&self, r: usize, hashes: &[BlockHash]) -> f64 {
        let on_gpu = hashes
            .iter()
            .take_while(|h| self.index[r].contains_key(h))
            .count();
        let in_host = hashes[on_gpu..]
            .iter()
            .take_while(|h| self.host_index[r].contains(h))
            .count();
        let blocks = on_gpu as f64 + self.host_hit_weight * in_host as f64;
        blocks * self.block_size as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loads(pending: &[usize]) -> Vec<ReplicaLoad> {
        pending
            .iter()
            .map(|&p| ReplicaLoad {
                num_pending: p,
                num_outstanding: p,
                queued_prefill_tokens: 100 * p as u64,
                kv_usage: 0.0,
            })
            .collect()
    }

    #[test]
    fn round_robin_cycles_and_lor_takes_the_shortest_queue() {
        let mut rr = Router::new(GlobalPolicy::RoundRobin, 3, 16, 0);
        let picks: Vec<_> = (0..5)
            .map(|_| rr.route(&loads(&[0, 0, 0]), None, Vec::new))
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1]);
        let mut lor = Router::new(GlobalPolicy::Lor, 3, 16, 0);
        assert_eq!(
            lor.route(&loads(&[2, 1, 1]), None, Vec::new),
            1,
            "ties go to the lowest id"
        );
    }

    #[test]
    fn power_of_two_picks_two_distinct_replicas_and_the_lighter_wins() {
        let mut p2 = Router::new(GlobalPolicy::PowerOfTwo, 2, 16, 3);
        for _ in 0..20 {
            assert_eq!(p2.route(&loads(&[5, 1]), None, Vec::new), 1);
        }
    }

    #[test]
    fn prefix_affinity_follows_the_cache_until_the_queue_outweighs_it() {
        let mut router = Router::new(GlobalPolicy::PrefixAffinity { balance: 1.0 }, 2, 4, 0);
        let prompt: Vec<TokenId> = (0..12).collect();
        let mut hashes = Vec::new();
        hash_full_blocks(&mut hashes, &prompt, 4, None);
        let stored: Vec<_> = hashes.iter().map(|&h| KvEvent::Stored(h)).collect();
        router.on_kv_events(1, &stored);
        assert_eq!(router.route(&loads(&[0, 0]), None, || prompt.clone()), 1);
        // The same tokens under a LoRA adapter are other blocks: no affinity.
        assert_eq!(router.route(&loads(&[0, 0]), Some(5), || prompt.clone()), 0);
        // 12 cached tokens against 100 queued prefill tokens: replica 0 wins.
        assert_eq!(router.route(&loads(&[0, 1]), None, || prompt.clone()), 0);
        router.on_kv_events(1, &[KvEvent::AllCleared]);
        assert_eq!(router.route(&loads(&[0, 0]), None, || prompt.clone()), 0);
    }

    #[test]
    fn prefix_affinity_counts_a_host_tier_run_after_the_gpu_run_at_its_weight() {
        let mut router = Router::new(GlobalPolicy::PrefixAffinity { balance: 0.0 }, 2, 4, 0)
            .with_host_hit_weight(0.5);
        let prompt: Vec<TokenId> = (0..16).collect();
        let mut hashes = Vec::new();
        hash_full_blocks(&mut hashes, &prompt, 4, None);
        // Replica 0: the first block on its GPUs, the next two in host memory (10 tokens'
        // worth); replica 1: the first two blocks on its GPUs (8).
        router.on_kv_events(
            0,
            &[
                KvEvent::Stored(hashes[0]),
                KvEvent::HostStored(hashes[1]),
                KvEvent::HostStored(hashes[2]),
            ],
        );
        router.on_kv_events(1, &[KvEvent::Stored(hashes[0]), KvEvent::Stored(hashes[1])]);
        assert_eq!(router.cached_tokens(0, &hashes), 4.0 + 0.5 * 8.0);
        assert_eq!(router.route(&loads(&[0, 0]), None, || prompt.clone()), 0);
        // Once the host copy of block 1 is dropped, the host run stops there.
        router.on_kv_events(0, &[KvEvent::HostRemoved(hashes[1])]);
        assert_eq!(router.cached_tokens(0, &hashes), 4.0);
        assert_eq!(router.route(&loads(&[0, 0]), None, || prompt.clone()), 1);
    }

    #[test]
    fn prefix_affinity_keeps_a_hash_while_any_copy_of_it_is_cached() {
        let mut router = Router::new(GlobalPolicy::PrefixAffinity { balance: 0.0 }, 2, 4, 0);
        let prompt: Vec<TokenId> = (0..8).collect();
        let mut hashes = Vec::new();
        hash_full_blocks(&mut hashes, &prompt, 4, None);
        // Two blocks of replica 1 cache the first hash (vLLM keeps both copies).
        let stored = KvEvent::Stored(hashes[0]);
        router.on_kv_events(1, &[stored, stored]);
        router.on_kv_events(1, &[KvEvent::Removed(hashes[0])]);
        assert_eq!(router.cached_tokens(1, &hashes), 4.0, "one copy is left");
        router.on_kv_events(1, &[KvEvent::Removed(hashes[0])]);
        assert_eq!(router.cached_tokens(1, &hashes), 0.0);
    }
}
