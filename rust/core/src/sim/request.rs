//! A simulated request with Vidur's lifecycle (seed 000 §2.1, §13): prefill, then one
//! decode token per iteration; finishing the prefill yields the first output token; a
//! restart after preemption folds every processed token into the prefill.

/// Index of a live request in the simulator's arena.
pub type ReqIdx = u32;

#[derive(Debug, Clone)]
pub struct SimRequest {
    /// Position in the workload (0-based), the id users see.
    pub id: u64,
    pub arrived_at: f64,
    pub original_prefill_tokens: u32,
    pub original_decode_tokens: u32,
    /// Current prefill length (grows on restart).
    pub num_prefill_tokens: u32,
    pub num_decode_tokens: u32,
    pub num_processed_tokens: u32,
    pub is_prefill_complete: bool,
    pub scheduled: bool,
    pub completed: bool,
    pub num_restarts: u32,
    pub replica: u32,
    /// Prompt tokens served from a prefix cache (first admission).
    pub prefix_hit_tokens: u32,
    /// Prefix identity: block content ids, each covering the workload's hash block size.
    pub hash_ids: Vec<u64>,
    pub timing: RequestTiming,
}

/// When things happened to a request (seconds of simulated time; NaN = never).
#[derive(Debug, Clone, Copy)]
pub struct RequestTiming {
    pub scheduled_at: f64,
    pub first_token_at: f64,
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
            timing: RequestTiming::default(),
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
    pub fn on_batch_end(&mut self, now: f64, num_tokens: u32) -> (bool, Option<f64>) {
        self.num_processed_tokens += num_tokens;
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

    /// Output tokens so far are `processed - original prefill` (restarts fold earlier
    /// outputs into the prefill, so they are not produced twice).
    fn record_new_tokens(&mut self, now: f64) -> Option<f64> {
        let produced = self
            .num_processed_tokens
            .saturating_sub(self.original_prefill_tokens);
        if !self.is_prefill_complete || produced <= self.timing.num_output_tokens {
            return None;
        }
        let t = &mut self.timing;
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
    /// A request restarted in the middle of a chunked prefill keeps its whole prompt as
    /// prefill (Vidur would turn the unprocessed prompt tokens into decode steps).
    pub fn restart(&mut self) {
        let total = self.total_tokens();
        self.num_prefill_tokens = self.num_processed_tokens.max(self.num_prefill_tokens);
        self.num_decode_tokens = total - self.num_prefill_tokens;
        self.num_processed_tokens = 0;
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
        r.restart();
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
        r.restart();
        assert_eq!((r.num_prefill_tokens, r.num_decode_tokens), (8, 5));
    }
}
