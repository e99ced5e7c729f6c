//! A batch (seed 000 §2.2): the requests of one iteration with the tokens each computes,
//! and the shape the execution-time model prices.

use super::exec::StageTime;
use super::lora::LoraShape;
use super::request::{ReqIdx, SimRequest};

#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub id: u64,
    pub replica: u32,
    pub requests: Vec<ReqIdx>,
    pub num_tokens: Vec<u32>,
    /// Each request's restart count when the batch formed: work of a request restarted
    /// while the batch was in flight is discarded.
    pub epochs: Vec<u32>,
    pub shape: BatchShape,
    /// A one-stage batch's stage time, charged to its requests when it ends (in the pass
    /// that ends them, not one of its own; nothing else charges them in between).
    pub stage_time: Option<StageTime>,
    /// A step of a coalesced decode window (`ReplicaPolicy::batch_is_window_step`).
    pub window_step: bool,
    /// Its requests are settled lazily (`engine::lazy`): the batch's passes over them are
    /// skipped, and `epochs` is empty.
    pub lazy: bool,
}

/// What a batch costs depends on: its prefill and decode tokens and the context each
/// attends to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchShape {
    pub num_requests: u32,
    pub num_prefill_tokens: u64,
    pub num_decode_tokens: u64,
    /// Σ over decoding requests of the tokens already in the KV cache. A request verifying
    /// k speculative drafts computes 1 + k decode tokens (each through every GEMM) but
    /// counts its context once: its queries read the same KV, and decode attention is
    /// bound by those reads (docs/speculative.md).
    pub sum_decode_context: u64,
    /// Σ over prefill chunks of chunk tokens × (tokens before the chunk + chunk tokens).
    pub sum_prefill_context: u64,
    /// Σ over prefill chunks of chunk tokens² (with the above: the causal attention work).
    pub sum_prefill_squared: u64,
    /// Decode rows added to reach a CUDA-graph batch size (they cost, they produce nothing).
    pub num_padding_rows: u64,
    /// LoRA tokens, adapters and loads (the replica fills it in; zero without LoRA).
    pub lora: LoraShape,
    /// Speculative drafts among the decode tokens (verified this batch): each is a GEMM row,
    /// but its request's attention is one sequence (`decode_sequences` in the features).
    pub num_spec_decode_tokens: u64,
    /// Speculative decoding: requests the drafter runs for after this batch (those that
    /// sample at its end), and Σ of their contexts then. Only the draft pricing reads them
    /// (`sim::spec::SpecExec`); 0 when speculation is off.
    pub num_draft_rows: u32,
    pub sum_draft_context: u64,
}

impl BatchShape {
    /// The shape of `num_tokens[i]` tokens of each `requests[i]`, taken before the batch runs.
    pub fn of<'a>(requests: impl IntoIterator<Item = &'a SimRequest>, num_tokens: &[u32]) -> Self {
        let mut shape = BatchShape::default();
        for (request, &n) in requests.into_iter().zip(num_tokens) {
            shape.add(request, n);
        }
        shape
    }

    /// Adds `n` tokens of `request` (taken before the batch runs) to the shape.
    #[inline]
    pub fn add(&mut self, request: &SimRequest, n: u32) {
        let n = n as u64;
        let done = request.num_processed_tokens as u64;
        self.num_requests += 1;
        if request.spec.proposes {
            self.num_draft_rows += 1;
            self.sum_draft_context += done + n - request.spec.in_flight_drafts as u64;
        }
        if request.is_prefill_complete {
            self.num_decode_tokens += n;
            self.num_spec_decode_tokens += request.spec.in_flight_drafts as u64;
            self.sum_decode_context += done;
        } else {
            self.num_prefill_tokens += n;
            self.sum_prefill_context += n * (done + n);
            self.sum_prefill_squared += n * n;
        }
    }

    pub fn total_tokens(&self) -> u64 {
        self.num_prefill_tokens + self.num_decode_tokens
    }
}
