//! What a simulation reports: one row per request (columns, appended as requests are
//! released), a histogram of the gaps between consecutive output tokens, sampled KV usage
//! and batch sizes over time, per-replica busy time, and optionally every batch stage.

use super::lora::LoraShape;
use super::request::SimRequest;

/// Column-wise per-request results, in release order.
///
/// The columns of features a run may not use (sessions, speculative decoding,
/// disaggregation, a host tier) stay empty while every value is the column's default and
/// are filled in by [`RequestTable::finish`]: a run without those features holds 92 of the
/// 168 bytes per request while it runs, and hands over their zero columns allocated
/// zeroed (memory the OS provides at its first write: a column of zeros need never be
/// resident).
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
    /// Adds a released request. Until [`Self::finish`], the optional features' columns may
    /// be shorter than the others.
    pub fn push(&mut self, r: &SimRequest) {
        let row = self.len();
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
        self.second_token_at.push(r.timing.second_token_at);
        // Session ids are checked to be < 2^63 when they arrive.
        let session = r.session.map_or(-1, |s| s as i64);
        push_sparse(&mut self.session_id, row, session, -1);
        push_sparse(&mut self.turn, row, r.turn, 0);
        push_sparse(&mut self.spec_steps, row, r.spec.num_steps, 0);
        push_sparse(&mut self.spec_draft_tokens, row, r.spec.num_draft_tokens, 0);
        push_sparse(
            &mut self.spec_accepted_tokens,
            row,
            r.spec.num_accepted_tokens,
            0,
        );
        let prefill_replica = r.kv.prefill_replica.map_or(-1, i64::from);
        push_sparse(&mut self.prefill_replica, row, prefill_replica, -1);
        push_sparse(&mut self.kv_transfer_tokens, row, r.kv.transfer_tokens, 0);
        push_sparse(&mut self.kv_transfer_wait_s, row, r.kv.transfer_wait_s, 0.0);
        push_sparse(&mut self.kv_transfer_s, row, r.kv.transfer_s, 0.0);
        push_sparse(&mut self.host_hit_tokens, row, r.kv.host_hit_tokens, 0);
        push_sparse(&mut self.host_load_tokens, row, r.kv.host_load_tokens, 0);
        push_sparse(&mut self.host_load_wait_s, row, r.kv.host_load_wait_s, 0.0);
        push_sparse(&mut self.host_load_s, row, r.kv.host_load_s, 0.0);
    }

    /// Fills the optional features' columns to the table's length (with their defaults):
    /// after it, every column has a value per request.
    pub fn finish(&mut self) {
        let len = self.len();
        fill(&mut self.session_id, len, -1);
        fill(&mut self.turn, len, 0);
        fill(&mut self.spec_steps, len, 0);
        fill(&mut self.spec_draft_tokens, len, 0);
        fill(&mut self.spec_accepted_tokens, len, 0);
        fill(&mut self.prefill_replica, len, -1);
        fill(&mut self.kv_transfer_tokens, len, 0);
        fill(&mut self.kv_transfer_wait_s, len, 0.0);
        fill(&mut self.kv_transfer_s, len, 0.0);
        fill(&mut self.host_hit_tokens, len, 0);
        fill(&mut self.host_load_tokens, len, 0);
        fill(&mut self.host_load_wait_s, len, 0.0);
        fill(&mut self.host_load_s, len, 0.0);
    }

    pub fn len(&self) -> usize {
        self.request_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.request_id.is_empty()
    }
}

/// A column value compared by its bits (a default of 0.0 is not -0.0).
trait Bits: Copy {
    fn bits(self) -> u64;
}

impl Bits for u32 {
    fn bits(self) -> u64 {
        self.into()
    }
}

impl Bits for i64 {
    fn bits(self) -> u64 {
        self as u64
    }
}

impl Bits for f64 {
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

/// Puts `value` at `row` of an optional feature's column, which stays empty while every
/// value is `default` (and is then brought up to `row` with it).
fn push_sparse<T: Bits>(column: &mut Vec<T>, row: usize, value: T, default: T) {
    if column.is_empty() && value.bits() == default.bits() {
        return;
    }
    column.resize(row, default);
    column.push(value);
}

/// Brings `column` to `len` rows of `default`. An empty one is made whole, which for a
/// default of zero is an allocation of zeroed memory, left untouched.
fn fill<T: Bits>(column: &mut Vec<T>, len: usize, default: T) {
    if column.is_empty() {
        *column = vec![default; len];
    } else {
        column.resize(len, default);
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
        self.record_n(gap_s, 1);
    }

    /// Records `n` gaps of `gap_s` (the requests of one decode step, `engine::lazy`).
    pub fn record_n(&mut self, gap_s: f64, n: u64) {
        let bucket = if gap_s == self.last.0 {
            self.last.1
        } else {
            let position =
                (gap_s.max(Self::MIN_S) / Self::MIN_S).log10() * Self::BUCKETS_PER_DECADE;
            let bucket = (position as usize).min(Self::NUM_BUCKETS - 1);
            self.last = (gap_s, bucket);
            bucket
        };
        self.counts[bucket] += n;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn released(id: u64) -> SimRequest {
        SimRequest::new(id, id as f64, 10, 3, Vec::new())
    }

    #[test]
    fn optional_columns_are_whole_after_finish() {
        let mut table = RequestTable::default();
        for id in 0..3 {
            table.push(&released(id));
        }
        assert!(
            table.turn.is_empty() && table.session_id.is_empty(),
            "all defaults so far"
        );
        let mut turn = released(3);
        turn.session = Some(9);
        turn.turn = 2;
        turn.kv.transfer_s = -0.0;
        table.push(&turn);
        table.push(&released(4));
        table.finish();
        table.push(&released(5));
        table.finish();
        assert_eq!(table.request_id, [0, 1, 2, 3, 4, 5]);
        assert_eq!(table.session_id, [-1, -1, -1, 9, -1, -1]);
        assert_eq!(table.turn, [0, 0, 0, 2, 0, 0]);
        assert_eq!(table.prefill_replica, [-1; 6]);
        assert_eq!(table.spec_steps, [0; 6]);
        assert_eq!(table.host_load_s, [0.0; 6]);
        let signs: Vec<bool> = (table.kv_transfer_s.iter())
            .map(|s| s.is_sign_negative())
            .collect();
        assert_eq!(
            signs,
            [false, false, false, true, false, false],
            "-0.0 is kept"
        );
    }
}
