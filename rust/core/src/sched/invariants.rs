//! The scheduler's invariant check (queues, statuses, the pool's computed tokens, who holds
//! blocks while waiting), for tests and the Python API's `check_invariants`.

use super::Scheduler;
use super::request::RequestStatus;
use crate::kv::RequestKey;

impl<R: RequestKey> Scheduler<R> {
    /// Describes the first broken invariant, if any.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.kv.check_invariants()?;
        self.check_encoder()?;
        self.check_host_pages()?;
        let waiting = self.waiting.ordered();
        if waiting.len() + self.running.len() != self.index.len() {
            return Err(format!(
                "{} waiting + {} running != {} unfinished",
                waiting.len(),
                self.running.len(),
                self.index.len()
            ));
        }
        for &slot in &self.parked {
            let r = self.req(slot);
            if r.status != RequestStatus::WaitingForStreamingInput || !waiting.contains(&slot) {
                return Err(format!(
                    "parked request {:?} is {:?}",
                    r.request_id, r.status
                ));
            }
        }
        for &slot in &self.running {
            let r = self.req(slot);
            if r.status != RequestStatus::Running || waiting.contains(&slot) {
                return Err(format!(
                    "running request {:?} has status {:?}",
                    r.request_id, r.status
                ));
            }
            // A chunk inside a hit's replayed tail leaves the pool's count (the adopted
            // hit) ahead of the request's, by at most the replay window.
            let pool = self.kv.num_computed_tokens(slot).unwrap_or(usize::MAX);
            let replaying = r.replay_start > 0
                && pool > r.num_computed_tokens
                && pool <= r.replay_start + self.config.prefix_replay_tokens();
            if pool != r.num_computed_tokens && !replaying {
                return Err(format!(
                    "request {:?}: pool and scheduler disagree on computed tokens",
                    r.request_id
                ));
            }
        }
        for &slot in &waiting {
            let r = self.req(slot);
            // Only a request whose KV is loading, or has landed, holds blocks while waiting
            // (a landed load may count no token as computed: see `take_landed_load`).
            // A parked or resumed session keeps its blocks too.
            let loads = r.status == RequestStatus::WaitingForRemoteKvs
                || (r.status == RequestStatus::WaitingForStreamingInput
                    && r.num_computed_tokens > 0)
                || (r.status == RequestStatus::Waiting
                    && (r.num_external_computed_tokens > 0
                        || (r.spec.resumable && r.num_computed_tokens > 0)));
            if r.status == RequestStatus::Running || self.kv.block_ids(slot).is_some() != loads {
                return Err(format!(
                    "waiting request {:?} is {:?} and {} blocks",
                    r.request_id,
                    r.status,
                    if loads { "holds no" } else { "holds" }
                ));
            }
        }
        self.check_block_frees()?;
        for (id, &(slot, _)) in &self.transfer_holds {
            if self.index.contains_key(id) || self.slots[slot as usize].is_some() {
                return Err(format!(
                    "request {id:?} is held for a transfer but still live"
                ));
            }
        }
        Ok(())
    }
}
