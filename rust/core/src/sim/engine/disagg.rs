//! Disaggregated serving in the event loop (`crate::sim::disagg`): a request released by a
//! prefill replica before it completed is handed to a decode replica; the loads that
//! replica starts are scheduled on the links; when the KV lands, the decode replica may run
//! the request and the prefill replica frees its blocks.

use super::{EventKind, Simulator};
use crate::Result;
use crate::sim::request::ReqIdx;
use crate::sim::tokens::synthesize_prompt;

impl Simulator<'_> {
    /// A request whose prompt and first token were computed on a prefill replica (which
    /// keeps its blocks) goes to the decode replica the decode router picks.
    pub(super) fn hand_over(&mut self, idx: ReqIdx) -> Result<()> {
        let router = self.decode_router.as_ref().expect("a disaggregated run");
        let queued_tokens = router.needs_queued_tokens();
        let loads = self.loads(self.num_prefill..self.replicas.len(), queued_tokens);
        let request = self.requests.get(idx);
        let hash_block_size = self.config.hash_block_size;
        let router = self.decode_router.as_mut().expect("a disaggregated run");
        let decode = router.route(&loads, request.lora_id, || {
            synthesize_prompt(
                request.id,
                request.num_prefill_tokens,
                &request.hash_ids,
                hash_block_size,
            )
        });
        let replica = self.num_prefill + decode;
        let request = self.requests.get_mut(idx);
        request.kv.held_by = Some(request.replica);
        request.kv.prefill_replica = Some(request.replica);
        request.replica = replica as u32;
        self.replicas[replica]
            .policy
            .add_request(&mut self.requests, idx)?;
        self.push(
            self.now,
            EventKind::ReplicaSchedule {
                replica: replica as u32,
            },
        );
        Ok(())
    }

    /// Schedules the transfers decode replica `r` asked for: each request's prompt KV,
    /// less what the replica's prefix cache held, from the prefill replica that holds it.
    /// A request that needed none lets the prefill replica free its blocks at once.
    pub(super) fn start_kv_loads(&mut self, r: usize) -> Result<()> {
        for load in self.replicas[r].policy.drain_kv_loads() {
            let idx = load.request_id;
            let request = self.requests.get_mut(idx);
            let Some(source) = request.kv.held_by else {
                continue;
            };
            if load.num_external_tokens == 0 {
                request.kv.held_by = None;
                self.release_prefill_blocks(source, idx)?;
                continue;
            }
            let links = self.links.as_mut().expect("a disaggregated run");
            let tokens = load.num_external_tokens as u64;
            let transfer = links.transfer(self.now, source, r as u32, tokens);
            request.kv.transfer_tokens = load.num_external_tokens as u32;
            request.kv.transfer_wait_s = transfer.start - self.now;
            request.kv.transfer_s = transfer.end - transfer.start;
            self.push(
                transfer.end,
                EventKind::KvLanded {
                    replica: r as u32,
                    source,
                    request: idx,
                },
            );
        }
        Ok(())
    }

    pub(super) fn on_kv_landed(&mut self, replica: u32, source: u32, idx: ReqIdx) -> Result<()> {
        self.requests.get_mut(idx).kv.held_by = None;
        self.replicas[replica as usize]
            .policy
            .finish_kv_transfer(idx, false)?;
        self.push(self.now, EventKind::ReplicaSchedule { replica });
        self.release_prefill_blocks(source, idx)
    }

    fn release_prefill_blocks(&mut self, source: u32, idx: ReqIdx) -> Result<()> {
        self.replicas[source as usize]
            .policy
            .finish_kv_transfer(idx, true)?;
        self.push(self.now, EventKind::ReplicaSchedule { replica: source });
        Ok(())
    }
}
