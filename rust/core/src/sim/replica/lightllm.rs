//! Vidur's LightLLM replica scheduler (seed 000 §8): token-level memory (block_size 1, one
//! pipeline stage), prefill and decode in separate batches. A new request is admitted only
//! if the worst-case peak of the tokens every admitted request may still need fits:
//! sorting requests by remaining tokens (descending), the peak is
//! max_i(remaining_i × (i + 1) + Σ_{j<=i} held_j), with Vidur's own counts of held and
//! remaining tokens (see `footprint`). Decode batches run while requests are
//! running; a waiting prefill gets its turn after `max_waiting_iters` decode batches.

use super::vidur::{VidurBase, VidurLimits, delegate_to_vidur_base};
use super::{BatchPlan, ReplicaPolicy};
use crate::kv::KvCapacity;
use crate::sim::arena::Requests;
use crate::sim::batch::Batch;
use crate::sim::request::{ReqIdx, SimRequest};
use crate::{Error, Result};

#[derive(Debug)]
pub struct LightLlm {
    base: VidurBase,
    num_waiting_iters: u32,
}

impl LightLlm {
    pub fn new(limits: VidurLimits) -> Result<Self> {
        if limits.block_size != 1 {
            return Err(Error::config(
                "block_size",
                limits.block_size,
                "the lightllm replica scheduler manages memory per token: block_size must be 1",
            ));
        }
        Ok(Self {
            base: VidurBase::new(limits)?,
            num_waiting_iters: 0,
        })
    }

    /// Vidur's `_get_tuple_tokens`: (tokens held now, tokens it may still add) for the
    /// peak-memory check. Vidur counts one token fewer than the request can still add: an
    /// admitted request (processed p of prompt P + decode D) may add D - (p - P) - 1, a new
    /// one holds P + 1 after its prefill and may add D - 2; both at least 0.
    fn footprint(request: &SimRequest, admitted: bool) -> (u64, u64) {
        let prefill = request.num_prefill_tokens as u64;
        let decode = request.num_decode_tokens as u64;
        if admitted {
            let processed = request.num_processed_tokens as u64;
            let decoded = processed.saturating_sub(prefill);
            (processed, decode.saturating_sub(decoded + 1))
        } else {
            (prefill + 1, decode.saturating_sub(2))
        }
    }

    fn peak_fits(&self, mut footprints: Vec<(u64, u64)>) -> bool {
        footprints.sort_by_key(|f| std::cmp::Reverse(f.1));
        let mut held_so_far = 0;
        let mut peak = 0;
        for (i, &(held, remaining)) in footprints.iter().enumerate() {
            held_so_far += held;
            peak = peak.max(remaining * (i as u64 + 1) + held_so_far);
        }
        peak < self.base.limits.num_blocks as u64
    }

    fn prefill_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        let limits = self.base.limits;
        let mut footprints: Vec<(u64, u64)> = self
            .base
            .running
            .iter()
            .map(|&idx| Self::footprint(requests.get(idx), true))
            .collect();
        let (mut batch, mut tokens): BatchPlan = (Vec::new(), Vec::new());
        let mut num_batch_tokens = 0u64;
        while let Some(&idx) = self.base.request_queue.front() {
            let request = requests.get(idx);
            let next = request.next_num_tokens();
            if num_batch_tokens + next as u64 > limits.max_tokens_in_batch as u64
                || self.base.num_allocated_requests() >= limits.batch_size_cap
                || batch.len() as u32 >= limits.max_micro_batch_size()
            {
                break;
            }
            footprints.push(Self::footprint(request, false));
            if !self.peak_fits(footprints.clone()) {
                break;
            }
            self.base.request_queue.pop_front();
            self.base.allocate(idx, request.num_prefill_tokens)?;
            num_batch_tokens += next as u64;
            batch.push(idx);
            tokens.push(next);
        }
        Ok((!batch.is_empty()).then_some((batch, tokens)))
    }

    fn decode_batch(&mut self, requests: &mut Requests) -> Result<BatchPlan> {
        let batch = std::mem::take(&mut self.base.running);
        let mut tokens = Vec::with_capacity(batch.len());
        for &idx in &batch {
            self.base.allocate(idx, 1)?;
            tokens.push(requests.get(idx).next_num_tokens());
        }
        Ok((batch, tokens))
    }
}

impl ReplicaPolicy for LightLlm {
    fn add_request(&mut self, _requests: &mut Requests, idx: ReqIdx) -> Result<()> {
        self.base.request_queue.push_back(idx);
        Ok(())
    }

    fn next_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        if self.base.running.is_empty() {
            let batch = self.prefill_batch(requests)?;
            if batch.is_some() {
                self.num_waiting_iters = 0;
            }
            return Ok(batch);
        }
        if self.num_waiting_iters >= self.base.limits.max_waiting_iters {
            self.num_waiting_iters = 0;
            if let Some(batch) = self.prefill_batch(requests)? {
                return Ok(Some(batch));
            }
        }
        let needed = self.base.running.len() as u32;
        if !self.base.can_allocate(needed) {
            // Vidur raises here; the peak check at admission is meant to make it unreachable.
            return Err(Error::Capacity {
                what: "lightllm decode tokens",
                requested: needed as usize,
                available: self.base.kv.num_free_blocks(),
            });
        }
        self.num_waiting_iters += 1;
        Ok(Some(self.decode_batch(requests)?))
    }

    delegate_to_vidur_base!(release_completed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footprints_are_vidurs_get_tuple_tokens() {
        // Admitted: prompt 10, output 10, 12 processed (prompt, first token, one decode):
        // holds 12, may add 10 - 2 - 1 = 7. New: holds 10 + 1, may add 10 - 2 = 8.
        let mut running = SimRequest::new(0, 0.0, 10, 10, vec![]);
        running.on_batch_end(1.0, 10);
        running.on_batch_end(2.0, 1);
        assert_eq!(LightLlm::footprint(&running, true), (12, 7));
        let new = SimRequest::new(1, 1.5, 10, 10, vec![]);
        assert_eq!(LightLlm::footprint(&new, false), (11, 8));
        // Short outputs never go negative.
        let tiny = SimRequest::new(2, 0.0, 4, 1, vec![]);
        assert_eq!(LightLlm::footprint(&tiny, false), (5, 0));
    }

    #[test]
    fn the_peak_must_stay_strictly_below_the_token_slots() {
        // Sorted by what they may add: (11, 8) then (12, 7): max(8·1 + 11, 7·2 + 23) = 37.
        let limits = |num_blocks| VidurLimits {
            num_blocks,
            block_size: 1,
            watermark_blocks: 0,
            batch_size_cap: 8,
            max_batch_size: 8,
            num_stages: 1,
            max_blocks_per_sequence: 64,
            max_tokens_in_batch: 4096,
            chunk_size: 512,
            max_waiting_iters: 1,
            restart: Default::default(),
        };
        let footprints = vec![(12, 7), (11, 8)];
        assert!(
            LightLlm::new(limits(38))
                .unwrap()
                .peak_fits(footprints.clone())
        );
        assert!(!LightLlm::new(limits(37)).unwrap().peak_fits(footprints));
    }
}
