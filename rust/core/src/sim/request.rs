//! A simulated request with Vidur's lifecycle (seed 000 §2.1, §13): prefill, then one
//! decode token per iteration; finishing the prefill yields the first output token; a
//! restart after preemption folds every processed token into the prefill.

use super::spec::SpecCounters;
use crate::{Error, Result};

/// Index of a live request in the simulator's arena.
pub type ReqIdx = u32;

/// What a preempted request's prefill becomes when it restarts (config key
/// `replica.scheduler.restart`). The two differ only for a request preempted in the middle
/// of a chunked prefill (Vidur's Sarathi scheduler can pick one as a victim).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RestartMode {
    /// `"recompute"` (default): the prefill becomes everything processed so far, but never
    /// less than the prompt: the whole prompt is recomputed as a prefill.
    #[default]
    Recompute,
    /// `"vidur"`: Vidur 0.0.26's `Request.restart` exactly: the prefill becomes the tokens
    /// processed so far, also when that is only part of the prompt. The rest of the prompt
    /// then runs as one-token decode steps, and the first token comes when the shortened
    /// prefill completes (Vidur's `prefill_completed_at`).
    Vidur,
}

impl RestartMode {
    /// The mode named by a config value.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "recompute" => Ok(Self::Recompute),
            "vidur" => Ok(Self::Vidur),
            other => Err(Error::config(
                "replica.scheduler.vidur.restart",
                format!("{other:?}"),
                "expected \"recompute\" or \"vidur\"",
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Recompute => "recompute",
            Self::Vidur => "vidur",
        }
    }
}

/// Laid out hot first: each step's passes over a batch (its formation, its end, the token
/// each request samples) read the first two cache lines of a request (the test
/// `hot_fields_share_two_cache_lines`), not fields spread over the whole of it.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
pub struct SimRequest {
    pub timing: RequestTiming,
    pub num_processed_tokens: u32,
    /// Current prefill length (changes on restart).
    pub num_prefill_tokens: u32,
    pub num_decode_tokens: u32,
    /// Processed tokens beyond this many are output tokens: the original prompt, or less
    /// after a `RestartMode::Vidur` restart in the middle of the prompt.
    pub output_after_tokens: u32,
    pub num_restarts: u32,
    pub original_prefill_tokens: u32,
    /// Speculative decoding (`vllm_v1` with `[replica.speculative]`; zeros otherwise).
    pub spec: SpecCounters,
    pub is_prefill_complete: bool,
    pub scheduled: bool,
    pub completed: bool,
    /// Prefix identity: block content ids, each covering the workload's hash block size.
    pub hash_ids: Vec<u64>,
    /// Position in the workload (0-based), the id users see.
    pub id: u64,
    pub arrived_at: f64,
    pub original_decode_tokens: u32,
    pub replica: u32,
    /// Prompt tokens served from a prefix cache (first admission).
    pub prefix_hit_tokens: u32,
    pub turn: u32,
    /// The session this request is a turn of (`super::sessions`), and its place in it
    /// (`turn`).
    pub session: Option<u64>,
    /// The LoRA adapter it runs with; `None` = the base model.
    pub lora_id: Option<u64>,
    /// KV moved for it: from a prefill replica (disaggregated serving) or a host tier.
    pub kv: KvMoves,
}

/// The KV a request moved (`super::disagg`; zeros when none moved).
#[derive(Debug, Clone, Copy, Default)]
pub struct KvMoves {
    /// The prefill replica that computed its prompt, while its blocks are held there for
    /// the transfer; and for the results, which replica that was.
    pub held_by: Option<u32>,
    pub prefill_replica: Option<u32>,
    /// Its restarts when it was handed over: a decode replica tells its own restarts (which
    /// recompute everything there) from the prefill replica's.
    pub restarts_at_handover: u32,
    /// Prompt tokens whose KV crossed the link, the wait for the link, and the transfer.
    pub transfer_tokens: u32,
    pub transfer_wait_s: f64,
    pub transfer_s: f64,
    /// Host-memory tier (`super::host_tier`): prompt tokens its first admission loaded from
    /// host memory instead of computing (part of `prefix_hit_tokens`); every token loaded
    /// over the host link (restarts and decode replicas included), the wait for the link
    /// and the loads' time.
    pub host_hit_tokens: u32,
    pub host_load_tokens: u32,
    pub host_load_wait_s: f64,
    pub host_load_s: f64,
}

/// When things happened to a request (seconds of simulated time; NaN = never).
#[derive(Debug, Clone, Copy)]
pub struct RequestTiming {
    pub scheduled_at: f64,
    pub first_token_at: f64,
    /// When the second output token came (disaggregated: after the KV transfer).
    pub second_token_at: f64,
    pub completed_at: f64,
    pub last_token_at: f64,
    pub max_token_gap: f64,
    /// Output tokens produced so far (counting each token once across restarts).
    pub num_output_tokens: u32,
    /// Sum of the model and total execution times of the stages it ran in.
    pub execution_time: f64,
    pub model_execution_time: f64,
}

impl Default for RequestTiming {
    fn default() -> Self {
        Self {
            scheduled_at: f64::NAN,
            first_token_at: f64::NAN,
            second_token_at: f64::NAN,
            completed_at: f64::NAN,
            last_token_at: f64::NAN,
            max_token_gap: 0.0,
            num_output_tokens: 0,
            execution_time: 0.0,
            model_execution_time: 0.0,
        }
    }
}

impl SimRequest {
    pub fn new(id: u64, arrived_at: f64, prefill: u32, decode: u32, hash_ids: Vec<u64>) -> Self {
        Self {
            id,
            arrived_at,
            original_prefill_tokens: prefill,
            original_decode_tokens: decode,
            output_after_tokens: prefill,
            num_prefill_tokens: prefill,
            num_decode_tokens: decode,
            num_processed_tokens: 0,
            is_prefill_complete: false,
            scheduled: false,
            completed: false,
            num_restarts: 0,
            replica: 0,
            prefix_hit_tokens: 0,
            hash_ids,
            session: None,
            turn: 0,
            lora_id: None,
            timing: RequestTiming::default(),
            spec: SpecCounters::default(),
            kv: KvMoves::default(),
        }
    }

    pub fn total_tokens(&self) -> u32 {
        self.num_prefill_tokens + self.num_decode_tokens
    }

    /// Tokens the next iteration computes when the whole remaining prefill runs at once.
    pub fn next_num_tokens(&self) -> u32 {
        if self.is_prefill_complete {
            1
        } else {
            self.num_prefill_tokens - self.num_processed_tokens
        }
    }

    /// Vidur's `on_batch_schedule`: the first scheduling sets `scheduled_at`.
    pub fn on_batch_schedule(&mut self, now: f64) {
        if !self.scheduled && self.timing.scheduled_at.is_nan() {
            self.timing.scheduled_at = now;
        }
        self.scheduled = true;
    }

    /// Vidur's `on_batch_end`: advances the processed tokens; completing the prefill yields
    /// one output token. Returns whether the request completed and, if this iteration
    /// produced an output token after an earlier one, the gap between the two.
    /// Drafts the batch verified are not progress yet: `accept_drafts` adds the accepted.
    pub fn on_batch_end(&mut self, now: f64, num_tokens: u32) -> (bool, Option<f64>) {
        self.num_processed_tokens += num_tokens - std::mem::take(&mut self.spec.in_flight_drafts);
        if !self.is_prefill_complete && self.num_processed_tokens == self.num_prefill_tokens {
            self.is_prefill_complete = true;
            self.num_processed_tokens += 1;
        }
        let gap = self.record_new_tokens(now);
        if self.num_processed_tokens == self.total_tokens() {
            self.completed = true;
            self.timing.completed_at = now;
        }
        (self.completed, gap)
    }

    /// `num_steps` calls of `on_batch_end(end, 1)` for decode steps ending at `first_end`,
    /// ..., `last_end`, whose largest token gap (each step's end less the previous one's,
    /// the first's less this request's last token) is `max_gap`: the same fields, for a
    /// request that takes a new output token at each step (its prefill complete, no
    /// drafts in flight, its output count at its produced tokens: `on_batch_end` gave it a
    /// gap at its last step). A coalesced decode window settles its requests so
    /// (`engine::lazy`).
    pub fn on_decode_steps(&mut self, num_steps: u32, first_end: f64, last_end: f64, max_gap: f64) {
        debug_assert!(self.is_prefill_complete && self.spec.in_flight_drafts == 0);
        debug_assert!(!self.timing.first_token_at.is_nan());
        self.num_processed_tokens += num_steps;
        let produced = self
            .num_processed_tokens
            .saturating_sub(self.output_after_tokens);
        let t = &mut self.timing;
        debug_assert!(produced >= t.num_output_tokens + num_steps);
        // Only the first step can bring the output to its second token.
        if t.num_output_tokens < 2 && produced >= 2 {
            t.second_token_at = first_end;
        }
        t.num_output_tokens = produced;
        t.max_token_gap = t.max_token_gap.max(max_gap);
        t.last_token_at = last_end;
        if self.num_processed_tokens == self.total_tokens() {
            self.completed = true;
            self.timing.completed_at = last_end;
        }
    }

    /// Speculative decoding: `accepted` drafts of the step that just ended become output at
    /// the instant its sampled token did (`on_batch_end` ran first), never past the
    /// request's output length. One emission: the token-gap histogram got its gap already.
    pub fn accept_drafts(&mut self, accepted: u32) {
        let room = self.total_tokens() - self.num_processed_tokens;
        if accepted == 0 || room == 0 {
            return;
        }
        let now = self.timing.last_token_at;
        self.num_processed_tokens += accepted.min(room);
        self.record_new_tokens(now);
        if self.num_processed_tokens == self.total_tokens() {
            self.completed = true;
            self.timing.completed_at = now;
        }
    }

    /// Output tokens so far are `processed - output_after_tokens` (restarts fold earlier
    /// outputs into the prefill, so they are not produced twice).
    fn record_new_tokens(&mut self, now: f64) -> Option<f64> {
        let produced = self
            .num_processed_tokens
            .saturating_sub(self.output_after_tokens);
        if !self.is_prefill_complete || produced <= self.timing.num_output_tokens {
            return None;
        }
        let t = &mut self.timing;
        if t.num_output_tokens < 2 && produced >= 2 {
            t.second_token_at = now;
        }
        t.num_output_tokens = produced;
        let gap = if t.first_token_at.is_nan() {
            t.first_token_at = now;
            None
        } else {
            let gap = now - t.last_token_at;
            t.max_token_gap = t.max_token_gap.max(gap);
            Some(gap)
        };
        t.last_token_at = now;
        gap
    }

    /// Vidur's `restart`: everything processed so far becomes prefill, to recompute at once.
    /// In the middle of a chunked prefill, `Recompute` keeps the whole prompt as prefill;
    /// `Vidur` takes only the processed part (the rest of the prompt becomes decode steps).
    pub fn restart(&mut self, mode: RestartMode) {
        let total = self.total_tokens();
        self.num_prefill_tokens = match mode {
            RestartMode::Recompute => self.num_processed_tokens.max(self.num_prefill_tokens),
            // Nothing processed yet: nothing to fold (and a prefill is never empty).
            RestartMode::Vidur if self.num_processed_tokens == 0 => self.num_prefill_tokens,
            RestartMode::Vidur => {
                // Vidur records the first prefill completion only; before it, the token
                // after the shortened prefill is the first output.
                if self.timing.first_token_at.is_nan() {
                    self.output_after_tokens =
                        self.output_after_tokens.min(self.num_processed_tokens);
                }
                self.num_processed_tokens
            }
        };
        self.num_decode_tokens = total - self.num_prefill_tokens;
        self.num_processed_tokens = 0;
        self.spec.in_flight_drafts = 0;
        self.spec.proposes = false;
        self.scheduled = false;
        self.completed = false;
        self.is_prefill_complete = false;
        self.num_restarts += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_completion_yields_the_first_token_and_decodes_follow() {
        let mut r = SimRequest::new(0, 0.0, 4, 3, vec![]);
        assert_eq!(r.next_num_tokens(), 4);
        assert!(!r.on_batch_end(1.0, 4).0);
        assert!(r.is_prefill_complete);
        assert_eq!(r.num_processed_tokens, 5, "prompt + first output token");
        assert_eq!(r.timing.first_token_at, 1.0);
        assert_eq!(r.next_num_tokens(), 1);
        assert_eq!(r.on_batch_end(1.5, 1), (false, Some(0.5)));
        assert!(r.on_batch_end(2.5, 1).0, "4 + 3 tokens processed");
        assert_eq!(r.timing.num_output_tokens, 3);
        assert_eq!(r.timing.max_token_gap, 1.0);
        assert_eq!(r.timing.completed_at, 2.5);
    }

    #[test]
    fn restart_folds_processed_tokens_into_the_prefill() {
        let mut r = SimRequest::new(0, 0.0, 4, 5, vec![]);
        r.on_batch_end(1.0, 4); // 5 processed: one output
        r.on_batch_end(2.0, 1); // 6 processed: two outputs
        r.restart(RestartMode::Recompute);
        assert_eq!((r.num_prefill_tokens, r.num_decode_tokens), (6, 3));
        assert_eq!((r.num_processed_tokens, r.num_restarts), (0, 1));
        assert!(!r.is_prefill_complete);
        // Recomputing the 6 tokens yields the third output token, not a repeat.
        r.on_batch_end(3.0, 6);
        assert_eq!(r.timing.num_output_tokens, 3);
        assert_eq!(r.timing.first_token_at, 1.0);
        assert_eq!(r.timing.max_token_gap, 1.0);
        r.on_batch_end(4.0, 1);
        assert!(r.on_batch_end(5.0, 1).0);
        assert_eq!(r.timing.num_output_tokens, 5);
    }

    #[test]
    fn restart_in_a_chunked_prefill_keeps_the_prompt_as_prefill() {
        let mut r = SimRequest::new(0, 0.0, 8, 5, vec![]);
        r.on_batch_end(1.0, 3);
        r.restart(RestartMode::Recompute);
        assert_eq!((r.num_prefill_tokens, r.num_decode_tokens), (8, 5));
    }

    #[test]
    fn vidur_restart_in_a_chunked_prefill_folds_only_the_processed_tokens() {
        // Prompt 8, output 5; a 3-token chunk ran, then the request is preempted.
        let mut r = SimRequest::new(0, 0.0, 8, 5, vec![]);
        r.on_batch_end(1.0, 3);
        r.restart(RestartMode::Vidur);
        // Vidur: prompt := 3 processed, decode := 13 - 3 = 10.
        assert_eq!((r.num_prefill_tokens, r.num_decode_tokens), (3, 10));
        assert_eq!((r.num_processed_tokens, r.num_restarts), (0, 1));
        assert_eq!(r.next_num_tokens(), 3);
        // The shortened prefill completes: Vidur's prefill_completed_at, our first token.
        assert!(!r.on_batch_end(2.0, 3).0);
        assert!(r.is_prefill_complete);
        assert_eq!(r.num_processed_tokens, 4);
        assert_eq!(r.timing.first_token_at, 2.0);
        // The other 9 tokens (5 of prompt, 4 of output) run one per iteration.
        for step in 0..8 {
            assert_eq!(r.next_num_tokens(), 1);
            assert!(!r.on_batch_end(3.0 + step as f64, 1).0);
        }
        assert!(r.on_batch_end(11.0, 1).0);
        assert_eq!(r.timing.completed_at, 11.0);
        assert_eq!(r.timing.num_output_tokens, 10);
    }

    #[test]
    fn vidur_restart_after_the_prefill_matches_recompute() {
        let mut vidur = SimRequest::new(0, 0.0, 4, 5, vec![]);
        let mut recompute = vidur.clone();
        for r in [&mut vidur, &mut recompute] {
            r.on_batch_end(1.0, 4);
            r.on_batch_end(2.0, 1);
        }
        vidur.restart(RestartMode::Vidur);
        recompute.restart(RestartMode::Recompute);
        assert_eq!((vidur.num_prefill_tokens, vidur.num_decode_tokens), (6, 3));
        assert_eq!(vidur.output_after_tokens, recompute.output_after_tokens);
        assert_eq!(vidur.num_prefill_tokens, recompute.num_prefill_tokens);
    }

    #[test]
    fn restart_mode_names_parse_and_a_bad_one_names_the_key() {
        assert_eq!(
            RestartMode::parse("recompute").unwrap(),
            RestartMode::Recompute
        );
        assert_eq!(RestartMode::parse("vidur").unwrap(), RestartMode::Vidur);
        assert_eq!(RestartMode::default().name(), "recompute");
        let err = RestartMode::parse("Vidur").unwrap_err().to_string();
        assert!(err.contains("replica.scheduler.vidur.restart"), "{err}");
    }

    #[test]
    fn hot_fields_share_two_cache_lines() {
        use std::mem::{offset_of, size_of};
        // What a batch's formation and end, and the sampled token, read of each request.
        let hot_end = [
            offset_of!(SimRequest, timing) + size_of::<RequestTiming>(),
            offset_of!(SimRequest, num_processed_tokens) + 4,
            offset_of!(SimRequest, num_prefill_tokens) + 4,
            offset_of!(SimRequest, num_decode_tokens) + 4,
            offset_of!(SimRequest, output_after_tokens) + 4,
            offset_of!(SimRequest, num_restarts) + 4,
            offset_of!(SimRequest, original_prefill_tokens) + 4,
            offset_of!(SimRequest, spec) + size_of::<SpecCounters>(),
            offset_of!(SimRequest, is_prefill_complete) + 1,
            offset_of!(SimRequest, scheduled) + 1,
            offset_of!(SimRequest, completed) + 1,
        ];
        assert!(hot_end.iter().all(|&end| end <= 128), "{hot_end:?}");
        assert_eq!(std::mem::align_of::<SimRequest>(), 64);
    }
}
