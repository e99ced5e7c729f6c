//! Configuration of the step scheduler (vLLM V1's `SchedulerConfig` and cache options).

use crate::kv::KvGroupSpec;
use crate::{Error, Result};

/// Order of the waiting queue and choice of preemption victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Arrival order; the last running request is preempted first.
    Fcfs,
    /// Lowest `(priority, arrival)` first; the running request with the largest
    /// `(priority, arrival)` is preempted first.
    Priority,
}

impl Policy {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "fcfs" => Ok(Policy::Fcfs),
            "priority" => Ok(Policy::Priority),
            _ => Err(Error::config(
                "policy",
                name,
                "must be \"fcfs\" or \"priority\"",
            )),
        }
    }
}

/// How `Policy::Priority` breaks ties on `(priority, arrival_time)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriorityTies {
    /// vLLM 0.33: waiting requests by request id; the victim is the first tied request in
    /// running order (`max()` keeps the first). Two tied requests can preempt each other
    /// for good when memory holds only one.
    Vllm,
    /// Arrival order: waiting requests in the order they arrived; the victim is the latest
    /// arrival (the step scheduler's rule before issue 15; never livelocks).
    ArrivalOrder,
}

impl PriorityTies {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "vllm" => Ok(Self::Vllm),
            "arrival_order" => Ok(Self::ArrivalOrder),
            _ => Err(Error::config(
                "priority_ties",
                name,
                "must be \"vllm\" or \"arrival_order\"",
            )),
        }
    }
}

/// Which prefix cache backs the scheduler's KV memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixCache {
    /// vLLM V1's block pool with chained block hashes; caches blocks as they are computed.
    BlockHash,
    /// SGLang's radix tree over a page allocator; caches a request's pages when it ends.
    Radix,
}

impl PrefixCache {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "block_hash" => Ok(PrefixCache::BlockHash),
            "radix" => Ok(PrefixCache::Radix),
            _ => Err(Error::config(
                "prefix_cache",
                name,
                "must be \"block_hash\" or \"radix\"",
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Cap on running requests; 0 = unbounded.
    pub max_num_seqs: usize,
    /// Token budget of one step: the tokens it schedules and, as vLLM 0.33's input budget,
    /// each scheduled request's `num_draft_slots_per_request` beside them.
    pub max_num_batched_tokens: usize,
    /// vLLM 0.33's `max_num_scheduled_tokens`: the tokens one step schedules, a budget of
    /// its own beside `max_num_batched_tokens` (`sched::budget`); 0: the same as
    /// `max_num_batched_tokens` (vLLM's default, its `None`). (A `u32`, not an
    /// `Option<usize>`: it packs beside the flags, and the config sits in an enum of engine
    /// configs.)
    pub max_num_scheduled_tokens: u32,
    /// Per-request cap on tokens in one step; 0 = off. As in vLLM 0.33 it applies only in
    /// steps that start with more than one request running or waiting (alone, a request
    /// starves nobody).
    pub long_prefill_token_threshold: usize,
    /// vLLM 0.33's `long_prefill_token_threshold_adaptive`: the cap is at least
    /// `max_num_batched_tokens / (requests running or waiting)`, a fair share of the step.
    pub long_prefill_token_threshold_adaptive: bool,
    pub enable_chunked_prefill: bool,
    pub policy: Policy,
    pub priority_ties: PriorityTies,
    pub enable_prefix_caching: bool,
    pub prefix_cache: PrefixCache,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Longest sequence (prompt + output) a request may reach.
    pub max_model_len: usize,
    /// Tokens the model samples in a step that completes a request's known tokens, kept
    /// as room under `max_model_len` (vLLM 0.33's `num_sampled_tokens_per_step`): 1, or 0
    /// for a pooling or diffusion model, whose prompt may then fill `max_model_len` and
    /// whose last chunk may reach it.
    pub num_sampled_tokens_per_step: usize,
    /// Seed 001: prefill work takes the budget first, decodes fill the rest.
    pub prioritize_prefill: bool,
    /// KV slots reserved past a request's scheduled tokens, for a drafter that writes its
    /// own KV there (vLLM's `num_lookahead_tokens`: `k` for EAGLE, MTP and draft models, 0
    /// for n-gram); capped at `max_model_len`.
    pub num_lookahead_tokens: usize,
    /// Draft tokens per step under speculative decoding (vLLM's `num_speculative_tokens`,
    /// `k`); 0 = off. The scheduler schedules whatever drafts the engine proposes either
    /// way; `k` drives the two rules below.
    pub num_speculative_tokens: usize,
    /// vLLM 0.33 with `k > 0`: a waiting request admitted for exactly one token (its prompt
    /// hit or loaded but the last token, or a one-token prompt joining running decodes)
    /// in a step that schedules no running prefill is padded to `1 + k` tokens with `k`
    /// placeholder drafts ([`super::PLACEHOLDER_DRAFT`], never accepted), and admission
    /// stops if `1 + k` does not fit the budget. Off: it gets its one token.
    pub pad_spec_decode: bool,
    /// vLLM 0.33: full blocks that accepted drafts complete enter the prefix cache in
    /// `update_from_output` (even when the request finishes there). Off: at the request's
    /// next allocation, and never if it finished.
    pub cache_accepted_drafts: bool,
    /// Distinct LoRA adapters allowed in one step; 0 = no gating.
    pub max_loras: usize,
    /// vLLM 0.33's `scheduler_reserve_full_isl`: a waiting request is admitted only if its
    /// whole sequence (prompt and outputs so far, up to `max_model_len`) fits in free
    /// blocks, not just this step's chunk.
    pub scheduler_reserve_full_isl: bool,
    /// vLLM's null block: block 0 of the `num_blocks` is never handed out, so
    /// `num_blocks - 1` hold KV (as in vLLM, where `num_gpu_blocks` counts it).
    pub reserve_null_block: bool,
    /// Blocks of the host-memory KV tier evicted cached blocks are offloaded to (block-hash
    /// pool with prefix caching only; `kv::host_tier`); 0 = none.
    pub host_num_blocks: usize,
    /// vLLM 0.33's `prefill_schedule_interval` as one engine applies it (its
    /// `local_prefill_interval`): while a running request decodes, prefill work (admissions
    /// with prompt left to compute, running prefill chunks) is held until this many
    /// executed steps have passed since the last step that carried prefill, unless the last
    /// release step left the waiting queue undrained. 1 = off.
    pub prefill_schedule_interval: usize,
    /// The model's KV cache groups as vLLM 0.33's hybrid allocator forms them (one per
    /// layer kind and layer count: `kv_cache_planning.get_kv_cache_groups`), served by
    /// vLLM's coordinator over one pool (`kv::KvCoordinator`): a sliding-window group frees
    /// what leaves its window, a Mamba group holds one block per request. Empty, or one
    /// full-attention group: the single-group pool of `prefix_cache`.
    pub kv_groups: Vec<KvGroupSpec>,
    /// Each KV group's own block size, when the groups differ in it (vLLM 0.33 layouts whose
    /// layer kinds have different page sizes, e.g. Gemma 4): `block_size` is then vLLM's
    /// `hash_block_size`, every one of these a multiple of it, and prefix hits land on their
    /// least common multiple (`kv::KvCoordinator::set_group_block_sizes`). Empty: every
    /// group's is `block_size`. (Boxed, as `kv_group_is_eagle`.)
    pub kv_group_block_sizes: Box<[usize]>,
    /// vLLM 0.33's `KVCacheGroupSpec.is_eagle_group` of each KV group: the groups
    /// `eagle_block_drop` acts in (`kv::KvCoordinator::set_eagle_groups`). Empty, or none
    /// set: every group (vLLM's fallback). Only with several groups. (Boxed: the config
    /// sits in an enum of engine configs.)
    pub kv_group_is_eagle: Box<[bool]>,
    /// Tokens kept below every sliding window though not attended (vLLM 0.33's
    /// `SlidingWindowSpec.extra_retained_tokens`, `max(0, num_prefill_lookahead_tokens -
    /// 1)` of a multi-module MTP drafter): `kv::KvCoordinator::
    /// set_window_extra_retained_tokens`. 0 = off; only beside a window group.
    pub kv_window_extra_retained_tokens: usize,
    /// Multimodal encoder budget and cache (`sched::encoder`).
    pub encoder: super::EncoderConfig,
    /// vLLM 0.33's block-aligned prefill split for Mamba prefix caching in `align` mode
    /// (`sched::mamba_align`); `None` = off.
    pub mamba_align: Option<super::MambaAlignSplit>,
    /// Known prefill tokens a multi-module MTP (or EAGLE) drafter reads past a chunk's end
    /// (vLLM 0.33's `num_prefill_lookahead`): the encoder window reaches that far, and a
    /// prefill chunk never ends closer than this to the prefill's end
    /// (`_reserve_prefill_lookahead`); 0 = off.
    pub num_prefill_lookahead: usize,
    /// Input slots a parallel drafter takes per scheduled request beside its tokens (vLLM
    /// 0.33's `max_num_new_slots_for_drafting`): each request scheduled costs its tokens and
    /// these of `max_num_batched_tokens` (vLLM's input budget), gets at most that budget
    /// less these (and at most what `max_num_scheduled_tokens` leaves), and none is
    /// scheduled once no more than these remain; 0 = off.
    pub num_draft_slots_per_request: usize,
    /// Tokens past each block that its hash covers (vLLM 0.33's
    /// `VllmConfig.num_hash_lookahead_tokens`, on by default for EAGLE/EAGLE3/MTP drafters
    /// with prefix caching): a block is hashed, cached and hit only once they exist
    /// (`kv::lookahead`); 0 = off (the legacy hashes). Block-hash prefix caching only.
    pub num_hash_lookahead_tokens: usize,
    /// vLLM 0.33's trailing-block drop for EAGLE-style drafters when look-ahead hashes are
    /// off (`KVCacheCoordinator`'s `use_eagle`): every prefix hit loses its last block.
    /// Block-hash prefix caching with one KV group only. With it, and always with one KV
    /// group, the last `num_prefill_lookahead - 1` computed tokens are never cached
    /// (vLLM's `num_reprefillable_tokens`).
    pub eagle_block_drop: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_num_scheduled_tokens: 0,
            long_prefill_token_threshold: 0,
            long_prefill_token_threshold_adaptive: false,
            enable_chunked_prefill: true,
            policy: Policy::Fcfs,
            priority_ties: PriorityTies::Vllm,
            enable_prefix_caching: true,
            prefix_cache: PrefixCache::BlockHash,
            block_size: 16,
            num_blocks: 8192,
            max_model_len: 8192,
            num_sampled_tokens_per_step: 1,
            prioritize_prefill: false,
            num_lookahead_tokens: 0,
            num_speculative_tokens: 0,
            pad_spec_decode: true,
            cache_accepted_drafts: true,
            max_loras: 0,
            host_num_blocks: 0,
            scheduler_reserve_full_isl: true,
            reserve_null_block: true,
            prefill_schedule_interval: 1,
            kv_groups: Vec::new(),
            kv_group_block_sizes: Box::default(),
            kv_group_is_eagle: Box::default(),
            kv_window_extra_retained_tokens: 0,
            encoder: super::EncoderConfig::default(),
            mamba_align: None,
            num_prefill_lookahead: 0,
            num_draft_slots_per_request: 0,
            num_hash_lookahead_tokens: 0,
            eagle_block_drop: false,
        }
    }
}

impl SchedulerConfig {
    /// The default with tokenyard's accounting before it followed vLLM 0.33 there (seed
    /// 004): every one of `num_blocks` holds KV and admission checks only the step's chunk.
    /// Hand-computed tests count blocks this way.
    pub fn without_vllm_reservations() -> Self {
        Self {
            scheduler_reserve_full_isl: false,
            reserve_null_block: false,
            ..Self::default()
        }
    }

    /// Whether the KV cache has several groups, or one that is not full attention (served
    /// by the coordinator rather than the single-group pool).
    pub fn is_hybrid(&self) -> bool {
        !matches!(self.kv_groups.as_slice(), [] | [KvGroupSpec::FullAttention])
    }

    /// vLLM 0.33's `Scheduler.prefix_replay_tokens`: the tail of a prefix hit recomputed to
    /// rebuild the bounded-replay window groups (their common window), 0 without one.
    pub fn prefix_replay_tokens(&self) -> usize {
        (self.kv_groups.iter())
            .map(KvGroupSpec::prefix_replay_tokens)
            .max()
            .unwrap_or(0)
    }

    /// Blocks one request of `num_tokens` tokens holds at most: one table per group, a
    /// window group's capped at vLLM's admission cap for one step in flight, a Mamba
    /// `align` group's at the two states it holds (vLLM 0.33's
    /// `MambaSpec.max_memory_usage_bytes`: `2 + num_speculative_blocks +
    /// num_prefill_checkpoint_blocks` pages in `align` mode; its table has a slot per block, but the earlier slots hold the null block).
    pub fn blocks_per_request(&self, num_tokens: usize) -> usize {
        if !self.is_hybrid() {
            return num_tokens.div_ceil(self.block_size);
        }
        let in_flight = self.max_num_batched_tokens;
        let extra = self.kv_window_extra_retained_tokens;
        (self.kv_groups.iter().enumerate())
            .map(|(i, g)| {
                let bs = self.group_block_size(i);
                let required = g.num_required_blocks(num_tokens, bs);
                // A `none`-mode group with a block per slot counts `1 +
                // num_speculative_blocks`, vLLM's `max_memory_usage_bytes` outside align mode.
                let states = g.is_mamba_align() || matches!(g, KvGroupSpec::MambaPerBlock { .. });
                let cap = match states {
                    true => g.max_live_blocks(0, bs),
                    false => g.max_admission_blocks_retaining(in_flight, bs, extra),
                };
                cap.map_or(required, |cap| required.min(cap))
            })
            .sum()
    }

    /// Whether some KV group's block size (`kv_group_block_sizes`) is not `block_size`, the
    /// hash block size (the coordinator's `has_mixed_block_sizes`).
    pub fn has_mixed_block_sizes(&self) -> bool {
        self.kv_group_block_sizes
            .iter()
            .any(|&s| s != self.block_size)
    }

    /// The block size of KV group `i` (`kv_group_block_sizes`, else `block_size`).
    pub fn group_block_size(&self, i: usize) -> usize {
        self.kv_group_block_sizes
            .get(i)
            .copied()
            .unwrap_or(self.block_size)
    }

    /// The step's token budget (vLLM 0.33's `Scheduler.max_num_scheduled_tokens`):
    /// `max_num_scheduled_tokens`, else `max_num_batched_tokens`.
    pub fn token_budget(&self) -> usize {
        match self.max_num_scheduled_tokens {
            0 => self.max_num_batched_tokens,
            scheduled => scheduled as usize,
        }
    }

    /// The most tokens one step schedules without draft slots: the smaller budget.
    pub fn step_token_cap(&self) -> usize {
        self.token_budget().min(self.max_num_batched_tokens)
    }

    /// The budget that caps a step's tokens ([`Self::step_token_cap`]), by field name.
    fn smaller_budget(&self) -> (&'static str, usize) {
        match self.max_num_scheduled_tokens {
            scheduled if scheduled > 0 && (scheduled as usize) < self.max_num_batched_tokens => {
                ("max_num_scheduled_tokens", scheduled as usize)
            }
            _ => ("max_num_batched_tokens", self.max_num_batched_tokens),
        }
    }

    /// Blocks that hold KV: `num_blocks`, less vLLM's null block.
    pub fn num_kv_blocks(&self) -> usize {
        self.num_blocks - usize::from(self.reserve_null_block && self.num_blocks > 0)
    }

    /// The step scheduler's checks ([`SchedulerConfig::validate_scheduler`]) and that one
    /// request of `max_model_len` fits the KV cache: what the simulator requires (and what
    /// vLLM's engine checks against the memory it profiled).
    pub fn validate(&self) -> Result<()> {
        self.validate_scheduler()?;
        self.validate_capacity()
    }

    /// That one request of `max_model_len` (and its lookahead slots) fits the KV cache.
    pub fn validate_capacity(&self) -> Result<()> {
        let capacity = self.num_kv_blocks().saturating_mul(self.block_size);
        let longest = self.max_model_len.saturating_add(self.num_lookahead_tokens);
        if self.is_hybrid() {
            let needed = self.blocks_per_request(longest);
            if needed > self.num_kv_blocks() {
                return Err(Error::config(
                    "max_model_len",
                    self.max_model_len,
                    format!(
                        "one request of this length (plus {} lookahead slots) needs {needed} \
                         blocks over its {} KV groups, more than the {} that hold KV",
                        self.num_lookahead_tokens,
                        self.kv_groups.len(),
                        self.num_kv_blocks()
                    ),
                ));
            }
            return Ok(());
        }
        if longest > capacity {
            return Err(Error::config(
                "max_model_len",
                self.max_model_len,
                format!(
                    "one request of this length (plus {} lookahead slots) needs more than the \
                     KV capacity of {} blocks * block_size = {capacity} tokens",
                    self.num_lookahead_tokens,
                    if self.reserve_null_block {
                        "(num_blocks - 1 null block)"
                    } else {
                        "num_blocks"
                    }
                ),
            ));
        }
        Ok(())
    }

    /// What the embeddable [`super::Scheduler`] checks. Not the KV capacity: vLLM 0.33's
    /// `Scheduler` runs with a cache smaller than `max_model_len` (its engine, not its
    /// scheduler, checks the memory), and a request that cannot fit is simply never
    /// admitted, or preempts itself when it outgrows the cache.
    pub fn validate_scheduler(&self) -> Result<()> {
        let positive = [
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("block_size", self.block_size),
            ("num_blocks", self.num_blocks),
            ("prefill_schedule_interval", self.prefill_schedule_interval),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(Error::config(field, 0, "must be at least 1"));
            }
        }
        if let Some(split) = &self.mamba_align {
            split.validate()?;
        }
        if self.reserve_null_block && self.num_blocks < 2 {
            return Err(Error::config(
                "num_blocks",
                self.num_blocks,
                "must be at least 2: one is vLLM's null block (reserve_null_block)",
            ));
        }
        if self.max_model_len < 2 {
            return Err(Error::config(
                "max_model_len",
                self.max_model_len,
                "must be at least 2",
            ));
        }
        if self.num_sampled_tokens_per_step > 1 {
            return Err(Error::config(
                "num_sampled_tokens_per_step",
                self.num_sampled_tokens_per_step,
                "must be 1, or 0 for a pooling or diffusion model (vLLM 0.33's values)",
            ));
        }
        if self.host_num_blocks > 0
            && !(self.enable_prefix_caching && self.prefix_cache == PrefixCache::BlockHash)
        {
            return Err(Error::config(
                "host_num_blocks",
                self.host_num_blocks,
                "a host-memory tier holds cached blocks: it needs enable_prefix_caching with \
                 prefix_cache = \"block_hash\"",
            ));
        }
        self.validate_kv_groups()?;
        self.validate_group_block_sizes()?;
        self.validate_group_is_eagle()?;
        let extra = self.kv_window_extra_retained_tokens;
        if extra > 0 && !self.kv_groups.iter().any(|g| g.is_sliding_window()) {
            return Err(Error::config(
                "kv_window_extra_retained_tokens",
                extra,
                "retains tokens below a sliding window, and no KV group is one",
            ));
        }
        self.validate_prefix_rules()?;
        let padded = 1 + self.num_speculative_tokens;
        let (cap_field, cap) = self.smaller_budget();
        if self.num_speculative_tokens > 0 && self.pad_spec_decode && cap < padded {
            // vLLM 0.33 accepts it and then never admits a request padded past the budget
            // (it stops admission rather than schedule it unpadded): a hang, not a config.
            return Err(Error::config(
                cap_field,
                cap,
                format!(
                    "must be >= 1 + num_speculative_tokens = {padded} with pad_spec_decode: a \
                     request admitted with one token left is padded to {padded} tokens and \
                     would never fit the step"
                ),
            ));
        }
        if !self.enable_chunked_prefill && cap < self.max_model_len {
            return Err(Error::config(
                cap_field,
                cap,
                format!(
                    "must be >= max_model_len={} when chunked prefill is off, or the longest \
                     prompts could never be scheduled",
                    self.max_model_len
                ),
            ));
        }
        Ok(())
    }
}

impl SchedulerConfig {
    /// `kv_group_is_eagle`: one flag per group, and only with several groups (the
    /// single-group pool drops in its one group whatever the flag).
    fn validate_group_is_eagle(&self) -> Result<()> {
        let flags = &self.kv_group_is_eagle;
        if flags.is_empty() {
            return Ok(());
        }
        let reason = match self.is_hybrid() {
            false => {
                "one full-attention group is the single-group pool, where the drop acts \
                      in its one group; leave it empty"
            }
            true if flags.len() != self.kv_groups.len() => "must name one flag per KV group",
            true => return Ok(()),
        };
        Err(Error::config(
            "kv_group_is_eagle",
            format!("{flags:?}"),
            reason,
        ))
    }

    /// `kv_group_block_sizes`: one per group, each a multiple of `block_size` (the hash
    /// block size); the coordinator checks the kinds it serves with them.
    fn validate_group_block_sizes(&self) -> Result<()> {
        let sizes = &self.kv_group_block_sizes;
        if sizes.is_empty() {
            return Ok(());
        }
        let shown = || format!("{sizes:?}");
        if sizes.len() != self.kv_groups.len() {
            return Err(Error::config(
                "kv_group_block_sizes",
                shown(),
                format!(
                    "must name one block size per KV group ({})",
                    self.kv_groups.len()
                ),
            ));
        }
        if let Some(i) = sizes
            .iter()
            .position(|&s| s == 0 || !s.is_multiple_of(self.block_size))
        {
            return Err(Error::config(
                "kv_group_block_sizes",
                shown(),
                format!(
                    "kv_group_block_sizes[{i}] must be a positive multiple of block_size={} \
                     (the hash block size)",
                    self.block_size
                ),
            ));
        }
        if self.has_mixed_block_sizes() && !self.is_hybrid() {
            return Err(Error::config(
                "kv_group_block_sizes",
                shown(),
                "one full-attention group is the single-group pool, whose block size is \
                 block_size",
            ));
        }
        Ok(())
    }

    /// What the coordinator serves with several KV groups, refusing what vLLM 0.33's
    /// hybrid manager refuses or this scheduler cannot do.
    fn validate_kv_groups(&self) -> Result<()> {
        if !self.is_hybrid() {
            return Ok(());
        }
        let groups = || format!("{:?}", self.kv_groups);
        if self.kv_groups.len() > crate::kv::MAX_NUM_GROUPS {
            return Err(Error::config(
                "kv_groups",
                self.kv_groups.len(),
                format!("at most {} groups", crate::kv::MAX_NUM_GROUPS),
            ));
        }
        if self.enable_prefix_caching && self.prefix_cache == PrefixCache::Radix {
            return Err(Error::config(
                "prefix_cache",
                "radix",
                format!(
                    "KV groups {} are served by vLLM's coordinator over block hashes: use \
                     prefix_cache = \"block_hash\" (SGLang's radix cache has no groups)",
                    groups()
                ),
            ));
        }
        if self.host_num_blocks > 0 {
            return Err(Error::config(
                "host_num_blocks",
                self.host_num_blocks,
                format!(
                    "a host-memory tier is not supported with KV groups {} (vLLM 0.33 turns \
                     its hybrid manager off for a KV connector without HMA support)",
                    groups()
                ),
            ));
        }
        if self.enable_prefix_caching && self.kv_groups.iter().any(KvGroupSpec::is_mamba_none) {
            return Err(Error::config(
                "enable_prefix_caching",
                "true",
                "a Mamba KV group's states are not prefix-cached (vLLM's \
                 mamba_cache_mode='none'): set enable_prefix_caching = false",
            ));
        }
        if self.enable_prefix_caching && self.kv_groups.contains(&KvGroupSpec::CrossAttention) {
            return Err(Error::config(
                "enable_prefix_caching",
                "true",
                "a cross-attention KV group (an encoder-decoder model) is not prefix-cached \
                 (vLLM disables it for such models): set enable_prefix_caching = false",
            ));
        }
        for (i, group) in self.kv_groups.iter().enumerate() {
            group.check("kv_groups", i)?;
        }
        // vLLM 0.33's Scheduler asserts "Prefix replay windows should agree".
        let replay = self.prefix_replay_tokens();
        if let Some(i) = (self.kv_groups.iter()).position(|g| {
            !matches!(g.prefix_replay_tokens(), 0) && g.prefix_replay_tokens() != replay
        }) {
            return Err(Error::config(
                "kv_groups",
                format!("kv_groups[{i}]={:?}", self.kv_groups[i]),
                format!("bounded-replay windows must agree (another group replays {replay})"),
            ));
        }
        Ok(())
    }
}
