//! Vidur's Orca replica scheduler (seed 000 §7): iteration-level batching; every running
//! request decodes each iteration, and a new request is admitted only if the maximum
//! blocks a sequence can need are free (reserved up front, so no preemption).

use super::vidur::{VidurBase, VidurLimits, delegate_to_vidur_base};
use super::{BatchPlan, ReplicaPolicy};
use crate::Result;
use crate::sim::arena::Requests;
use crate::sim::batch::Batch;
use crate::sim::request::ReqIdx;

#[derive(Debug)]
pub struct Orca {
    base: VidurBase,
}

impl Orca {
    pub fn new(limits: VidurLimits) -> Result<Self> {
        Ok(Self {
            base: VidurBase::new(limits)?,
        })
    }
}

impl ReplicaPolicy for Orca {
    fn add_request(&mut self, _requests: &mut Requests, idx: ReqIdx) -> Result<()> {
        self.base.request_queue.push_back(idx);
        Ok(())
    }

    fn next_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        let limits = self.base.limits;
        let (mut batch, mut tokens): BatchPlan = (Vec::new(), Vec::new());
        let mut running = std::mem::take(&mut self.base.running).into_iter();
        for idx in running.by_ref() {
            if batch.len() as u32 >= limits.max_batch_size {
                self.base.running.push(idx);
                break;
            }
            batch.push(idx);
            tokens.push(requests.get(idx).next_num_tokens());
        }
        self.base.running.extend(running);
        while let Some(&idx) = self.base.request_queue.front() {
            if batch.len() as u32 >= limits.max_batch_size
                || !self.base.can_allocate(limits.max_blocks_per_sequence)
            {
                break;
            }
            self.base.request_queue.pop_front();
            self.base.allocate(idx, limits.max_blocks_per_sequence)?;
            batch.push(idx);
            tokens.push(requests.get(idx).next_num_tokens());
        }
        Ok((!batch.is_empty()).then_some((batch, tokens)))
    }

    delegate_to_vidur_base!(release_completed);
}
