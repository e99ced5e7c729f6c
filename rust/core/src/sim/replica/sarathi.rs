//! Vidur's Sarathi replica scheduler (seed 000 §6): chunked prefill under a per-batch token
//! budget (`chunk_size`), built in three phases — running decodes first (LIFO preemption by
//! restart, as vLLM), then running partial prefills, then new requests.

use super::vidur::{VidurBase, VidurLimits, delegate_to_vidur_base};
use super::{BatchPlan, ReplicaPolicy};
use crate::Result;
use crate::sim::arena::Requests;
use crate::sim::batch::Batch;
use crate::sim::request::{ReqIdx, SimRequest};

#[derive(Debug)]
pub struct Sarathi {
    base: VidurBase,
}

impl Sarathi {
    pub fn new(limits: VidurLimits) -> Result<Self> {
        Ok(Self {
            base: VidurBase::new(limits)?,
        })
    }

    /// A decode takes 1 token; a prefill takes what is left of it, within the budget.
    fn next_num_tokens(&self, request: &SimRequest, num_batch_tokens: u32) -> u32 {
        if request.is_prefill_complete {
            return 1;
        }
        let remaining = request.num_prefill_tokens - request.num_processed_tokens;
        remaining.min(self.base.limits.chunk_size.saturating_sub(num_batch_tokens))
    }
}

impl ReplicaPolicy for Sarathi {
    fn add_request(&mut self, _requests: &mut Requests, idx: ReqIdx) -> Result<()> {
        self.base.request_queue.push_back(idx);
        Ok(())
    }

    fn next_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        let limits = self.base.limits;
        let (mut batch, mut tokens): BatchPlan = (Vec::new(), Vec::new());
        let mut num_batch_tokens = 0;
        let mut skipped = Vec::new();
        let mut running_prefills = Vec::new();

        // Phase 1: running decodes, earliest arrival first; victims from the back.
        self.base.sort_running_by_arrival(requests);
        let mut queue = std::mem::take(&mut self.base.running);
        queue.reverse();
        while let Some(idx) = queue.pop() {
            if batch.len() as u32 >= limits.max_micro_batch_size() {
                queue.push(idx);
                break;
            }
            let request = requests.get(idx);
            if !request.is_prefill_complete {
                running_prefills.push(idx);
                continue;
            }
            let next = self.next_num_tokens(request, num_batch_tokens);
            if next == 0 {
                skipped.push(idx);
                continue;
            }
            if self.base.allocate_evicting(requests, idx, &mut queue)? {
                num_batch_tokens += next;
                batch.push(idx);
                tokens.push(next);
            }
        }
        queue.reverse();

        // Phase 2: partial prefills continue within the budget left.
        for idx in running_prefills {
            let next = self.next_num_tokens(requests.get(idx), num_batch_tokens);
            if next == 0 {
                skipped.push(idx);
                continue;
            }
            num_batch_tokens += next;
            batch.push(idx);
            tokens.push(next);
        }
        skipped.extend(queue);
        self.base.running = skipped;
        self.base.sort_running_by_arrival(requests);

        // Phase 3: new requests take the rest of the budget.
        while let Some(&idx) = self.base.request_queue.front() {
            if self.base.num_allocated_requests() >= limits.batch_size_cap
                || batch.len() as u32 >= limits.max_micro_batch_size()
                || !self.base.vllm_can_allocate(requests.get(idx), idx)
            {
                break;
            }
            let next = self.next_num_tokens(requests.get(idx), num_batch_tokens);
            if next == 0 {
                break;
            }
            self.base.request_queue.pop_front();
            self.base.vllm_allocate(requests.get(idx), idx)?;
            num_batch_tokens += next;
            batch.push(idx);
            tokens.push(next);
        }
        Ok((!batch.is_empty()).then_some((batch, tokens)))
    }

    delegate_to_vidur_base!(release_completed);
}
