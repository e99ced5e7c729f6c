//! What Vidur's replica schedulers share (seed 000 §4): the core's block-counting KV
//! allocator (`kv::CountingAllocator`), the request queue, the requests between iterations,
//! and the batch limits. Invariant: a request holds blocks from its admission until it
//! completes or restarts.

use std::collections::VecDeque;

use crate::Result;
use crate::kv::CountingAllocator;
use crate::sim::arena::Requests;
use crate::sim::batch::Batch;
use crate::sim::request::{ReqIdx, RestartMode, SimRequest};

/// The `ReplicaPolicy` methods a Vidur scheduler answers from its `base`: the queue and
/// memory questions, and (with `release_completed`) Vidur's base `on_batch_end`.
macro_rules! delegate_to_vidur_base {
    (release_completed) => {
        fn on_batch_end(
            &mut self,
            requests: &mut Requests,
            batch: &Batch,
        ) -> crate::Result<Vec<ReqIdx>> {
            Ok(self.base.release_completed(requests, batch))
        }

        delegate_to_vidur_base!();
    };
    () => {
        fn num_pending(&self) -> usize {
            self.base.request_queue.len()
        }

        fn num_outstanding(&self) -> usize {
            self.base.num_outstanding()
        }

        fn pending_prefill_tokens(&self, requests: &Requests) -> u64 {
            self.base.pending_prefill_tokens(requests)
        }

        fn kv_usage(&self) -> f64 {
            self.base.kv_usage()
        }
    };
}
pub(super) use delegate_to_vidur_base;

/// The limits of one replica, derived from the config and the memory planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VidurLimits {
    pub num_blocks: u32,
    pub block_size: u32,
    /// vLLM/Sarathi: blocks kept free when admitting a new request.
    pub watermark_blocks: u32,
    /// Requests holding memory at once (vLLM, Sarathi, LightLLM), and the base of their
    /// per-batch cap (see `max_micro_batch_size`).
    pub batch_size_cap: u32,
    /// Vidur's `_max_batch_size`, min(the memory planner's max batch size, batch_size_cap):
    /// requests in one Orca or FasterTransformer batch.
    pub max_batch_size: u32,
    /// Pipeline stages of the replica (the simulator checks it against its own).
    pub num_stages: u32,
    /// Orca / FasterTransformer: blocks reserved per request (max request tokens / block).
    pub max_blocks_per_sequence: u32,
    /// vLLM / LightLLM: (padded) tokens in one prefill batch.
    pub max_tokens_in_batch: u32,
    /// Sarathi: token budget of one batch.
    pub chunk_size: u32,
    /// LightLLM: decode iterations before a waiting prefill may run.
    pub max_waiting_iters: u32,
    /// What a preempted request's prefill becomes when it restarts.
    pub restart: RestartMode,
}

impl VidurLimits {
    /// Requests in one vLLM, Sarathi or LightLLM batch: Vidur's `_max_micro_batch_size`,
    /// `batch_size_cap // num_stages`. Memory is limited by the blocks, not by the memory
    /// planner's batch size (which Vidur applies to Orca and FasterTransformer only). At
    /// least 1, where Vidur (cap below the stage count) would never schedule anything.
    pub fn max_micro_batch_size(&self) -> u32 {
        (self.batch_size_cap / self.num_stages.max(1)).max(1)
    }
}

#[derive(Debug)]
pub(super) struct VidurBase {
    pub limits: VidurLimits,
    pub request_queue: VecDeque<ReqIdx>,
    /// Vidur's `_preempted_requests`: admitted requests between two of their iterations.
    pub running: Vec<ReqIdx>,
    /// Vidur's `_allocation_map` and `_num_allocated_blocks`.
    pub kv: CountingAllocator<ReqIdx>,
}

impl VidurBase {
    pub fn new(limits: VidurLimits) -> Result<Self> {
        Ok(Self {
            limits,
            request_queue: VecDeque::new(),
            running: Vec::new(),
            kv: CountingAllocator::with_watermark_blocks(
                limits.num_blocks as usize,
                limits.watermark_blocks as usize,
            )?,
        })
    }

    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.limits.block_size)
    }

    pub fn can_allocate(&self, num_blocks: u32) -> bool {
        self.kv.can_allocate(num_blocks as usize)
    }

    pub fn allocate(&mut self, idx: ReqIdx, num_blocks: u32) -> Result<()> {
        self.kv.allocate(idx, num_blocks as usize)
    }

    pub fn free(&mut self, idx: ReqIdx) {
        self.kv.release(&idx);
    }

    /// Whether `idx` holds memory (Vidur: `request.id in self._allocation_map`).
    pub fn is_allocated(&self, idx: ReqIdx) -> bool {
        self.kv.num_blocks_of(&idx).is_some()
    }

    /// Requests holding memory (Vidur: `len(self._allocation_map)`).
    pub fn num_allocated_requests(&self) -> u32 {
        self.kv.num_requests() as u32
    }

    /// vLLM/Sarathi admission: a new request needs its whole prompt's blocks on top of the
    /// watermark; a running one needs one free block.
    pub fn vllm_can_allocate(&self, request: &SimRequest, idx: ReqIdx) -> bool {
        if !self.is_allocated(idx) {
            return self
                .kv
                .can_admit(self.blocks_for(request.num_prefill_tokens) as usize);
        }
        self.kv.can_allocate(1)
    }

    /// vLLM/Sarathi allocation: the prompt's blocks at admission, then one block whenever
    /// the processed tokens outgrow the reserved ones.
    pub fn vllm_allocate(&mut self, request: &SimRequest, idx: ReqIdx) -> Result<()> {
        match self.kv.num_blocks_of(&idx) {
            None => self.allocate(idx, self.blocks_for(request.num_prefill_tokens)),
            Some(blocks)
                if request.num_processed_tokens as usize
                    > blocks * self.limits.block_size as usize =>
            {
                self.allocate(idx, 1)
            }
            Some(_) => Ok(()),
        }
    }

    /// vLLM/Sarathi: gives `idx` its block, restarting the requests at the back of the
    /// running list first (Vidur's `pop(-1)`; `later` is that list reversed, so index 0 is
    /// its last request) until it fits; with no victim left the request restarts itself.
    /// vLLM sorts the list by arrival first, so its victims are the latest arrivals;
    /// Sarathi does not. Returns whether it was scheduled.
    pub fn allocate_evicting(
        &mut self,
        requests: &mut Requests,
        idx: ReqIdx,
        later: &mut Vec<ReqIdx>,
    ) -> Result<bool> {
        while !self.vllm_can_allocate(requests.get(idx), idx) {
            if later.is_empty() {
                self.restart_to_front(requests, idx);
                return Ok(false);
            }
            let victim = later.remove(0);
            self.restart_to_front(requests, victim);
        }
        self.vllm_allocate(requests.get(idx), idx)?;
        Ok(true)
    }

    /// Restarts a request (preemption by recompute) and puts it at the front of the queue.
    pub fn restart_to_front(&mut self, requests: &mut Requests, idx: ReqIdx) {
        requests.get_mut(idx).restart(self.limits.restart);
        self.free(idx);
        self.request_queue.push_front(idx);
    }

    /// Vidur's base `on_batch_end`: completed requests free their memory, the others wait
    /// for their next iteration.
    pub fn release_completed(&mut self, requests: &Requests, batch: &Batch) -> Vec<ReqIdx> {
        let mut released = Vec::new();
        for &idx in &batch.requests {
            if requests.get(idx).completed {
                self.free(idx);
                released.push(idx);
            } else {
                self.running.push(idx);
            }
        }
        released
    }

    pub fn num_outstanding(&self) -> usize {
        self.request_queue.len() + self.kv.num_requests()
    }

    pub fn pending_prefill_tokens(&self, requests: &Requests) -> u64 {
        self.request_queue
            .iter()
            .map(|&idx| requests.get(idx).num_prefill_tokens as u64)
            .sum()
    }

    pub fn kv_usage(&self) -> f64 {
        self.kv.num_allocated_blocks() as f64 / self.limits.num_blocks as f64
    }

    /// The running requests in arrival order (Vidur's vLLM sorts them before its decode
    /// batch, its Sarathi after forming each batch): a stable sort on the arrival time
    /// alone, as Vidur's `sorted(..., key=arrived_at)`, so requests that arrived at the same
    /// time keep their list order (not their ids'). The list is often sorted already, which
    /// one pass detects.
    pub fn sort_running_by_arrival(&mut self, requests: &Requests) {
        let arrived = |idx: &ReqIdx| requests.get(*idx).arrived_at;
        if !self.running.is_sorted_by(|a, b| arrived(a) <= arrived(b)) {
            self.running
                .sort_by(|a, b| arrived(a).total_cmp(&arrived(b)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(batch_size_cap: u32, max_batch_size: u32, num_stages: u32) -> VidurLimits {
        VidurLimits {
            num_blocks: 100,
            block_size: 16,
            watermark_blocks: 1,
            batch_size_cap,
            max_batch_size,
            num_stages,
            max_blocks_per_sequence: 8,
            max_tokens_in_batch: 4096,
            chunk_size: 512,
            max_waiting_iters: 10,
            restart: RestartMode::Recompute,
        }
    }

    #[test]
    fn micro_batch_is_the_cap_over_the_stages_whatever_the_planner_says() {
        assert_eq!(limits(8, 2, 2).max_micro_batch_size(), 4);
        assert_eq!(limits(128, 29, 1).max_micro_batch_size(), 128);
        assert_eq!(limits(128, 65, 2).max_micro_batch_size(), 64);
        assert_eq!(limits(1, 1, 4).max_micro_batch_size(), 1, "never 0");
    }

    #[test]
    fn blocks_are_counted_by_the_core_allocator_with_the_watermark_in_blocks() {
        let mut base = VidurBase::new(limits(8, 8, 1)).unwrap();
        // A new request needs its prompt's blocks plus the 1 watermark block free.
        let request = SimRequest::new(0, 0.0, 99 * 16 + 1, 1, vec![]);
        assert!(!base.vllm_can_allocate(&request, 7), "100 blocks + 1 > 100");
        let request = SimRequest::new(0, 0.0, 98 * 16, 1, vec![]);
        assert!(base.vllm_can_allocate(&request, 7), "98 + 1 <= 100");
        base.vllm_allocate(&request, 7).unwrap();
        assert!(base.is_allocated(7));
        assert_eq!(base.num_allocated_requests(), 1);
        assert!((base.kv_usage() - 0.98).abs() < 1e-12);
        base.free(7);
        base.free(7); // a second free of the same request is harmless
        assert_eq!(base.kv.num_allocated_blocks(), 0);
        assert!(base.kv.check_invariants().is_ok());
    }
}
