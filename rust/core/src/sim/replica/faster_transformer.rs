//! Vidur's FasterTransformer replica scheduler (seed 000 §9): static batching. A batch
//! keeps running (minus its completed requests) until every request in it has completed;
//! only then is the memory of all of them freed and a new batch formed. Each request
//! reserves the maximum blocks a sequence can need.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::vidur::{VidurBase, VidurLimits, delegate_to_vidur_base};
use super::{BatchPlan, ReplicaPolicy};
use crate::Result;
use crate::sim::arena::Requests;
use crate::sim::batch::Batch;
use crate::sim::request::ReqIdx;

#[derive(Debug)]
pub struct FasterTransformer {
    base: VidurBase,
    /// Static groups by id: every request admitted together, completed ones included.
    groups: FxHashMap<u64, Vec<ReqIdx>>,
    group_of: FxHashMap<ReqIdx, u64>,
    /// Groups between iterations, continued (in order) before a new one is formed.
    unfinished: VecDeque<u64>,
    next_group: u64,
}

impl FasterTransformer {
    pub fn new(limits: VidurLimits) -> Result<Self> {
        Ok(Self {
            base: VidurBase::new(limits)?,
            groups: FxHashMap::default(),
            group_of: FxHashMap::default(),
            unfinished: VecDeque::new(),
            next_group: 0,
        })
    }

    fn form_group(&mut self, requests: &Requests) -> Result<Option<BatchPlan>> {
        let limits = self.base.limits;
        let (mut batch, mut tokens): BatchPlan = (Vec::new(), Vec::new());
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
        if batch.is_empty() {
            return Ok(None);
        }
        let group = self.next_group;
        self.next_group += 1;
        for &idx in &batch {
            self.group_of.insert(idx, group);
        }
        self.groups.insert(group, batch.clone());
        Ok(Some((batch, tokens)))
    }
}

impl ReplicaPolicy for FasterTransformer {
    fn add_request(&mut self, _requests: &mut Requests, idx: ReqIdx) -> Result<()> {
        self.base.request_queue.push_back(idx);
        Ok(())
    }

    fn next_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        let Some(group) = self.unfinished.pop_front() else {
            return self.form_group(requests);
        };
        let live: Vec<ReqIdx> = self.groups[&group]
            .iter()
            .copied()
            .filter(|&idx| !requests.get(idx).completed)
            .collect();
        let tokens = live
            .iter()
            .map(|&idx| requests.get(idx).next_num_tokens())
            .collect();
        Ok(Some((live, tokens)))
    }

    fn on_batch_end(&mut self, requests: &mut Requests, batch: &Batch) -> Result<Vec<ReqIdx>> {
        let group = self.group_of[&batch.requests[0]];
        if !batch
            .requests
            .iter()
            .all(|&idx| requests.get(idx).completed)
        {
            self.unfinished.push_back(group);
            return Ok(Vec::new());
        }
        // The whole group is done: everyone's memory is freed at once.
        let members = self.groups.remove(&group).unwrap_or_default();
        for &idx in &members {
            self.base.free(idx);
            self.group_of.remove(&idx);
        }
        Ok(members)
    }

    delegate_to_vidur_base!();
}
