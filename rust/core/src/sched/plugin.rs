//! Policy plugins: a user-supplied waiting-queue order and preemption order (the slow path,
//! for experiments). Both are asked once at the start of a step, before anything changes,
//! so a failing plugin leaves the scheduler untouched.

use super::request::{Request, RequestStatus};
use crate::{Error, Result};

/// What a plugin sees of a request.
#[derive(Debug, Clone)]
pub struct RequestView<R> {
    pub request_id: R,
    pub num_prompt_tokens: usize,
    pub num_tokens: usize,
    pub num_computed_tokens: usize,
    pub max_tokens: usize,
    pub priority: i64,
    pub arrival_time: f64,
    pub num_preemptions: u32,
    pub status: RequestStatus,
    /// `RequestSpec::external_id`.
    pub external_id: Option<u64>,
    /// vLLM 0.33's `Request.shared_prefix_boundary`, as the latest prefix lookup set it.
    pub shared_prefix_boundary: usize,
}

impl<R: Clone> RequestView<R> {
    pub fn of(request: &Request<R>) -> Self {
        Self {
            request_id: request.request_id.clone(),
            num_prompt_tokens: request.num_prompt_tokens(),
            num_tokens: request.num_tokens(),
            num_computed_tokens: request.num_computed_tokens,
            max_tokens: request.spec.max_tokens,
            priority: request.spec.priority,
            arrival_time: request.spec.arrival_time,
            num_preemptions: request.num_preemptions,
            status: request.status,
            external_id: request.spec.external_id,
            shared_prefix_boundary: request.shared_prefix_boundary,
        }
    }
}

/// Replaces the built-in orders. Each method returns a permutation of the indices of the
/// requests it was given.
pub trait PolicyPlugin<R>: Send + Sync {
    /// Admission order of the waiting requests (head-of-line blocking still applies).
    fn order_waiting(&mut self, waiting: &[RequestView<R>]) -> Result<Vec<usize>>;
    /// Preemption order of the running requests: the first is preempted first.
    fn preemption_order(&mut self, running: &[RequestView<R>]) -> Result<Vec<usize>>;
}

/// Checks that `order` is a permutation of `0..len`.
pub(super) fn check_permutation(order: &[usize], len: usize, method: &str) -> Result<()> {
    let mut seen = vec![false; len];
    for &i in order {
        if i >= len || std::mem::replace(&mut seen[i], true) {
            return Err(Error::Plugin(format!(
                "{method} must return each of the {len} given requests exactly once"
            )));
        }
    }
    if order.len() != len {
        return Err(Error::Plugin(format!(
            "{method} returned {} requests, expected {len}",
            order.len()
        )));
    }
    Ok(())
}
