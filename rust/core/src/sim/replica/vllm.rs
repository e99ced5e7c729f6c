//! Vidur's vLLM replica scheduler (seed 000 §5): whole prompts, admitted first while
//! memory (above the watermark), the padded token limit and the batch caps allow; otherwise
//! one decode for every running request in arrival order, preempting the latest arrivals
//! (LIFO) by restart when a block cannot be found.

use super::vidur::{VidurBase, VidurLimits, delegate_to_vidur_base};
use super::{BatchPlan, ReplicaPolicy};
use crate::Result;
use crate::sim::arena::Requests;
use crate::sim::batch::Batch;
use crate::sim::request::ReqIdx;

#[derive(Debug)]
pub struct Vllm {
    base: VidurBase,
}

impl Vllm {
    pub fn new(limits: VidurLimits) -> Result<Self> {
        Ok(Self {
            base: VidurBase::new(limits)?,
        })
    }

    fn admit_prefills(&mut self, requests: &mut Requests) -> Result<BatchPlan> {
        let limits = self.base.limits;
        let (mut batch, mut tokens): BatchPlan = (Vec::new(), Vec::new());
        let mut max_tokens = 0;
        while let Some(&idx) = self.base.request_queue.front() {
            let request = requests.get(idx);
            let next = request.next_num_tokens();
            if !self.base.vllm_can_allocate(request, idx) {
                break;
            }
            // Prefills are padded to the longest one: the batch costs len × max tokens.
            let padded = (batch.len() as u64 + 1) * max_tokens.max(next) as u64;
            if padded > limits.max_tokens_in_batch as u64
                || self.base.num_allocated_requests() >= limits.batch_size_cap
                || batch.len() as u32 >= limits.max_micro_batch_size()
            {
                break;
            }
            self.base.request_queue.pop_front();
            self.base.vllm_allocate(requests.get(idx), idx)?;
            max_tokens = max_tokens.max(next);
            batch.push(idx);
            tokens.push(next);
        }
        Ok((batch, tokens))
    }

    fn decode_running(&mut self, requests: &mut Requests) -> Result<BatchPlan> {
        let limits = self.base.limits;
        let (mut batch, mut tokens): BatchPlan = (Vec::new(), Vec::new());
        self.base.sort_running_by_arrival(requests);
        let mut queue = std::mem::take(&mut self.base.running);
        queue.reverse(); // pop() takes the earliest arrival; remove(0) takes the latest
        while let Some(idx) = queue.pop() {
            if batch.len() as u32 >= limits.max_micro_batch_size() {
                queue.push(idx);
                break;
            }
            if self.base.allocate_evicting(requests, idx, &mut queue)? {
                batch.push(idx);
                tokens.push(requests.get(idx).next_num_tokens());
            }
        }
        queue.reverse();
        self.base.running = queue;
        Ok((batch, tokens))
    }
}

impl ReplicaPolicy for Vllm {
    fn add_request(&mut self, _requests: &mut Requests, idx: ReqIdx) -> Result<()> {
        self.base.request_queue.push_back(idx);
        Ok(())
    }

    fn next_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        let prefills = self.admit_prefills(requests)?;
        if !prefills.0.is_empty() {
            return Ok(Some(prefills));
        }
        let decodes = self.decode_running(requests)?;
        Ok((!decodes.0.is_empty()).then_some(decodes))
    }

    delegate_to_vidur_base!(release_completed);
}
