//! One step's two budgets, as vLLM 0.33's `Scheduler.schedule()` keeps them: the token
//! budget (`max_num_scheduled_tokens`, the tokens the step schedules) and the input budget
//! (`max_num_batched_tokens`, the model's input rows: those tokens and each scheduled
//! request's draft slots, `num_draft_slots_per_request`). Without draft slots and with
//! `max_num_scheduled_tokens` unset they are one budget.

use super::config::SchedulerConfig;

/// What is left of one step's budgets (`Default`: nothing, for a preemption outside a
/// step, which refunds none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StepBudget {
    /// vLLM's `token_budget`.
    tokens: usize,
    /// vLLM's `input_budget`.
    input: usize,
    /// Input rows each scheduled request takes beside its tokens (vLLM's `draft_slots`).
    draft_slots: usize,
}

impl StepBudget {
    /// A step's budgets before anything is scheduled.
    pub(crate) fn of(config: &SchedulerConfig) -> Self {
        Self {
            tokens: config.token_budget(),
            input: config.max_num_batched_tokens,
            draft_slots: config.num_draft_slots_per_request,
        }
    }

    /// Whether another request may be scheduled: vLLM's loops run while `token_budget > 0`
    /// and stop once `input_budget <= draft_slots`.
    pub(crate) fn is_open(&self) -> bool {
        self.tokens > 0 && self.input > self.draft_slots
    }

    /// The most tokens one request may take now (vLLM's `min(token_budget, input_budget -
    /// draft_slots)`, its `request_token_budget`).
    pub(crate) fn room(&self) -> usize {
        self.tokens.min(self.input.saturating_sub(self.draft_slots))
    }

    /// One request scheduled for `n` tokens: its tokens from both budgets, its draft slots
    /// from the input budget.
    pub(crate) fn take(&mut self, n: usize) {
        debug_assert!(n <= self.room(), "scheduled past the step's budget");
        self.tokens -= n;
        self.input -= n + self.draft_slots;
    }

    /// A request scheduled for `n` tokens this step and then preempted: what [`Self::take`]
    /// took comes back (vLLM's refund in its running loop).
    pub(crate) fn refund(&mut self, n: usize) {
        self.tokens += n;
        self.input += n + self.draft_slots;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(scheduled: u32, batched: usize, slots: usize) -> StepBudget {
        StepBudget::of(&SchedulerConfig {
            max_num_scheduled_tokens: scheduled,
            max_num_batched_tokens: batched,
            num_draft_slots_per_request: slots,
            ..SchedulerConfig::default()
        })
    }

    #[test]
    fn one_budget_when_scheduled_tokens_are_unset() {
        let mut b = budget(0, 20, 0);
        assert_eq!(b.room(), 20);
        b.take(12);
        assert_eq!(b.room(), 8);
        b.take(8);
        assert!(!b.is_open());
    }

    #[test]
    fn the_token_budget_caps_tokens_and_the_input_budget_caps_tokens_and_slots() {
        // vLLM 0.33: 20 input rows, 12 tokens, 3 slots a request.
        let mut b = budget(12, 20, 3);
        assert_eq!(b.room(), 12);
        b.take(10);
        // Tokens left: 2; input left: 20 - 13 = 7, less 3 slots = 4.
        assert_eq!(b.room(), 2);
        b.take(2);
        assert!(!b.is_open());
        b.refund(10);
        assert_eq!(b.room(), 10);
    }

    #[test]
    fn the_input_budget_closes_once_no_more_than_the_slots_remain() {
        let mut b = budget(100, 20, 3);
        b.take(10);
        // Input left: 7 > 3, open with room 4.
        assert!(b.is_open());
        assert_eq!(b.room(), 4);
        b.take(4);
        // Input left: 0.
        assert!(!b.is_open());
    }
}
