//! Vidur's Sarathi replica scheduler (seed 000 §6): chunked prefill under a per-batch token
//! budget (`chunk_size`), built in three phases — running decodes first (preemption by
//! restart), then running partial prefills, then new requests.
//!
//! The running list is kept as Vidur 0.0.26 keeps `_preempted_requests`
//! (`sarathi_replica_scheduler.py`): sorted by arrival at the end of `_get_next_batch`, and
//! each ended batch's requests appended in batch order by `on_batch_end`. Phase 1 walks it
//! as it stands, not sorted, and a victim is its last request (`pop(-1)`): with pipeline
//! stages, the last request of the most recently ended batch, not the latest arrival.

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

        // Phase 1: running decodes from the front of the list as it stands (last batch's
        // leftovers, then each batch ended since); victims from its back.
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

#[cfg(test)]
mod tests {
    use crate::sim::tests::{close, config, limits, linear, req, run, times};
    use crate::sim::{ReplicaPolicyConfig, RestartMode, VidurKind, VidurLimits};

    #[test]
    fn the_victim_is_the_last_request_of_the_latest_batch_not_the_latest_arrival() {
        // Two stages of 0.5 s, 4 blocks of 4 tokens, chunk 4, 2 requests a batch.
        // A (6, 2) at 0, B (4, 4) at 0.5, C (4, 4) at 1.
        //   0.0 [A:4]  0.5 [B:4]  1.0 [A:2, C:2]: all 4 blocks taken (A 2, B 1, C 1).
        //   1.5 B's first token; its next token needs a 2nd block: none, B restarts.
        //   2.0 [A:1, C:2]  3.0 A completes; [C:1, B:3]: B, back, takes 3 of its 5.
        //   4.0 that batch ends: the list is [C, B], every block taken. C, a decode, needs
        //       a free block; Vidur's victim is the list's last request, B (arrived 0.5),
        //       not the latest arrival C, which decodes on untouched: 5.0, 6.0.
        // Sorting the list by arrival first (B, C) parks B as a partial prefill and leaves
        // no victim for C, which then restarts itself.
        let tight = VidurLimits {
            num_blocks: 4,
            chunk_size: 4,
            batch_size_cap: 4,
            restart: RestartMode::Vidur,
            ..limits()
        };
        let out = run(
            config(
                ReplicaPolicyConfig::Vidur(VidurKind::Sarathi, tight),
                2,
                linear(1.0, 0.0, 0.0),
            ),
            vec![req(0.0, 6, 2), req(0.5, 4, 4), req(1.0, 4, 4)],
        );
        let mut restarts: Vec<_> = (0..out.requests.len())
            .map(|i| (out.requests.request_id[i], out.requests.num_restarts[i]))
            .collect();
        restarts.sort_unstable();
        assert_eq!(
            restarts,
            [(0, 0), (1, 2), (2, 0)],
            "B restarts at 1.5 and 4.0"
        );
        let c = times(&out)[2];
        assert!(close(c.1, 3.0) && close(c.2, 6.0), "C undisturbed: {c:?}");
    }
}
