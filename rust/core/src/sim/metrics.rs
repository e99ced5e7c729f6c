//! What a simulation reports: one row per request (columns, appended as requests are
//! released), a histogram of the gaps between consecutive output tokens, sampled KV usage
//! and batch sizes over time, per-replica busy time, and optionally every batch stage.

use super::lora::LoraShape;
use super::request::SimRequest;

/// Column-wise per-request results, in release order.
#[derive(Debug, Default, Clone)]
pub struct RequestTable {
    pub request_id: Vec<u64>,
    pub replica: Vec<u32>,
    pub arrived_at: Vec<f64>,
    pub scheduled_at: Vec<f64>,
    pub first_token_at: Vec<f64>,
    pub completed_at: Vec<f64>,
    pub num_prefill_tokens: Vec<u32>,
    pub num_decode_tokens: Vec<u32>,
    pub num_restarts: Vec<u32>,
    pub prefix_hit_tokens: Vec<u32>,
    pub max_token_gap: Vec<f64>,
    pub execution_time: Vec<f64>,
    pub model_execution_time: Vec<f64>,
    /// -1 for a request outside any session.
    pub session_id: Vec<i64>,
    pub turn: Vec<u32>,
    /// Speculative decoding: steps that verified drafts, drafts verified, drafts accepted.
    pub spec_steps: Vec<u32>,
    pub spec_draft_tokens: Vec<u32>,
    pub spec_accepted_tokens: Vec<u32>,
    /// Disaggregated serving: the prefill replica (-1 without), and the KV transfer to the
    /// decode replica (`replica`): tokens moved, wait for the link, transfer time.
    pub prefill_replica: Vec<i64>,
    pub second_token_at: Vec<f64>,
    pub kv_transfer_tokens: Vec<u32>,
    pub kv_transfer_wait_s: Vec<f64>,
    pub kv_transfer_s: Vec<f64>,
    /// Host-memory KV tier: see `KvMoves`.
    pub host_hit_tokens: Vec<u32>,
    pub host_load_tokens: Vec<u32>,
    pub host_load_wait_s: Vec<f64>,
    pub host_load_s: Vec<f64>,
}

impl RequestTable {
    pub fn push(&mut self, r: &SimRequest) {
        self.request_id.push(r.id);
        self.replica.push(r.replica);
        self.arrived_at.push(r.arrived_at);
        self.scheduled_at.push(r.timing.scheduled_at);
        self.first_token_at.push(r.timing.first_token_at);
        self.completed_at.push(r.timing.completed_at);
        self.num_prefill_tokens.push(r.original_prefill_tokens);
        self.num_decode_tokens.push(r.original_decode_tokens);
        self.num_restarts.push(r.num_restarts);
        self.prefix_hit_tokens.push(r.prefix_hit_tokens);
        self.max_token_gap.push(r.timing.max_token_gap);
        self.execution_time.push(r.timing.execution_time);
        self.model_execution_time
            .push(r.timing.model_execution_time);
        // Session ids are checked to be < 2^63 when they arrive.
        self.session_id.push(r.session.map_or(-1, |s| s as i64));
        self.turn.push(r.turn);
        self.spec_steps.push(r.spec.num_steps);
        self.spec_draft_tokens.push(r.spec.num_draft_tokens);
        self.spec_accepted_tokens.push(r.spec.num_accepted_tokens);
        self.prefill_replica
            .push(r.kv.prefill_replica.map_or(-1, i64::from));
        self.second_token_at.push(r.timing.second_token_at);
        self.kv_transfer_tokens.push(r.kv.transfer_tokens);
        self.kv_transfer_wait_s.push(r.kv.transfer_wait_s);
        self.kv_transfer_s.push(r.kv.transfer_s);
        self.host_hit_tokens.push(r.kv.host_hit_tokens);
        self.host_load_tokens.push(r.kv.host_load_tokens);
        self.host_load_wait_s.push(r.kv.host_load_wait_s);
        self.host_load_s.push(r.kv.host_load_s);
    }

    pub fn len(&self) -> usize {
        self.request_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.request_id.is_empty()
    }
}

/// Log-spaced histogram from 1 µs to ~1000 s, 100 buckets per decade (quantiles within
/// 2.3%), for the gaps between output tokens: every emission counts, memory stays constant.
/// Tokens emitted together (a speculative step's accepted drafts) are one emission, its gap
/// counted once, as a streaming client sees them arrive in one chunk.
#[derive(Debug, Clone)]
pub struct GapHistogram {
    pub counts: Vec<u64>,
    /// The last gap and its bucket: requests of one batch mostly share their gap.
    last: (f64, usize),
}

impl GapHistogram {
    pub const MIN_S: f64 = 1e-6;
    pub const BUCKETS_PER_DECADE: f64 = 100.0;
    pub const NUM_BUCKETS: usize = 900;

    pub fn record(&mut self, gap_s: f64) {
        let bucket = if gap_s == self.last.0 {
            self.last.1
        } else {
            let position =
                (gap_s.max(Self::MIN_S) / Self::MIN_S).log10() * Self::BUCKETS_PER_DECADE;
            let bucket = (position as usize).min(Self::NUM_BUCKETS - 1);
            self.last = (gap_s, bucket);
            bucket
        };
        self.counts[bucket] += 1;
    }

    /// The lower edge of bucket `i`, in seconds.
    pub fn bucket_start(i: usize) -> f64 {
        Self::MIN_S * 10f64.powf(i as f64 / Self::BUCKETS_PER_DECADE)
    }
}

impl Default for GapHistogram {
    fn default() -> Self {
        Self {
            counts: vec![0; Self::NUM_BUCKETS],
            last: (f64::NAN, 0),
        }
    }
}

/// One replica's state at a moment (sampled at batch formation, at most every interval).
#[derive(Debug, Default, Clone)]
pub struct Samples {
    pub time: Vec<f64>,
    pub replica: Vec<u32>,
    pub kv_usage: Vec<f64>,
    pub batch_size: Vec<u32>,
    pub num_outstanding: Vec<u32>,
}

/// One batch stage, for a Chrome/Perfetto trace.
#[derive(Debug, Default, Clone)]
pub struct StageTrace {
    pub replica: Vec<u32>,
    pub stage: Vec<u32>,
    pub batch_id: Vec<u64>,
    pub start: Vec<f64>,
    pub duration: Vec<f64>,
    pub num_requests: Vec<u32>,
    pub num_prefill_tokens: Vec<u64>,
    pub num_decode_tokens: Vec<u64>,
}

/// Totals per replica.
#[derive(Debug, Default, Clone)]
pub struct ReplicaTotals {
    /// Seconds any of its stages was busy, summed over stages.
    pub busy_time: Vec<f64>,
    pub num_batches: Vec<u64>,
    pub sum_batch_size: Vec<u64>,
    pub num_prefill_tokens: Vec<u64>,
    pub num_decode_tokens: Vec<u64>,
    /// LoRA adapters copied into GPU slots, those read from disk first, and the seconds
    /// batches waited for them (summed over stages, as `busy_time`).
    pub lora_loads: Vec<u64>,
    pub lora_disk_loads: Vec<u64>,
    pub lora_load_s: Vec<f64>,
    /// Host-memory KV tier: blocks offloaded to it and loaded back from it.
    pub host_offloaded_blocks: Vec<u64>,
    pub host_loaded_blocks: Vec<u64>,
}

impl ReplicaTotals {
    pub fn new(num_replicas: usize) -> Self {
        Self {
            busy_time: vec![0.0; num_replicas],
            num_batches: vec![0; num_replicas],
            sum_batch_size: vec![0; num_replicas],
            num_prefill_tokens: vec![0; num_replicas],
            num_decode_tokens: vec![0; num_replicas],
            lora_loads: vec![0; num_replicas],
            lora_disk_loads: vec![0; num_replicas],
            lora_load_s: vec![0.0; num_replicas],
            host_offloaded_blocks: vec![0; num_replicas],
            host_loaded_blocks: vec![0; num_replicas],
        }
    }

    /// A batch's adapter loads on replica `r` (`num_stages` stages each wait `load_s`).
    pub fn record_lora(&mut self, r: usize, lora: &LoraShape, num_stages: u32) {
        self.lora_loads[r] += lora.num_loads as u64;
        self.lora_disk_loads[r] += lora.num_disk_loads as u64;
        self.lora_load_s[r] += lora.load_s * num_stages as f64;
    }
}
