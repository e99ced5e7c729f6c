//! KV moving in the event loop. Disaggregated serving (`crate::sim::disagg`): a request
//! released by a prefill replica before it completed is handed to a decode replica; the
//! loads that replica starts are scheduled on the links; when the KV lands, the decode
//! replica may run the request and the prefill replica frees its blocks. Host-memory tiers
//! (`crate::sim::host_tier`): any replica's loads from its tier, over its host link.

use super::{EventKind, Simulator};
use crate::Result;
use crate::sim::request::ReqIdx;
use crate::sim::tokens::prompt_block_hashes;

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
        let decode = router.route_hashed(&loads, |block_size| {
            prompt_block_hashes(
                request.id,
                request.num_prefill_tokens,
                request.original_prefill_tokens,
                &request.hash_ids,
                hash_block_size,
                block_size,
                request.lora_id,
            )
        });
        let replica = self.num_prefill + decode;
        let request = self.requests.get_mut(idx);
        request.kv.held_by = Some(request.replica);
        request.kv.prefill_replica = Some(request.replica);
        request.kv.restarts_at_handover = request.num_restarts;
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

    /// Schedules the loads replica `r` began: a decode replica's transfers (each request's
    /// prompt KV, less what its prefix cache held, from the prefill replica that holds it)
    /// and any replica's host-tier loads (over its host link). A load lands when both of its
    /// parts have; a decode request that needs nothing from its prefill replica lets that
    /// replica free its blocks at once.
    pub(super) fn start_kv_loads(&mut self, r: usize) -> Result<()> {
        for load in self.replicas[r].policy.drain_kv_loads() {
            let idx = load.request_id;
            let mut lands_at = None;
            if load.num_host_tokens > 0 {
                let ports = self
                    .host_ports
                    .as_mut()
                    .expect("a replica with a host tier");
                let tokens = load.num_host_tokens as u64;
                let transfer = ports.load(self.now, r, tokens)?;
                let kv = &mut self.requests.get_mut(idx).kv;
                kv.host_load_tokens += load.num_host_tokens as u32;
                kv.host_load_wait_s += transfer.start - self.now;
                kv.host_load_s += transfer.end - transfer.start;
                lands_at = Some(transfer.end);
            }
            let request = self.requests.get_mut(idx);
            let mut source = None;
            match request.kv.held_by {
                Some(held_by) if load.num_external_tokens > 0 => {
                    let links = self.links.as_mut().expect("a disaggregated run");
                    let tokens = load.num_external_tokens as u64;
                    let transfer = links.transfer(self.now, held_by, r as u32, tokens);
                    request.kv.transfer_tokens = load.num_external_tokens as u32;
                    request.kv.transfer_wait_s = transfer.start - self.now;
                    request.kv.transfer_s = transfer.end - transfer.start;
                    lands_at = Some(lands_at.map_or(transfer.end, |t: f64| t.max(transfer.end)));
                    source = Some(held_by);
                }
                Some(held_by) => {
                    request.kv.held_by = None;
                    self.release_prefill_blocks(held_by, idx)?;
                }
                None => {}
            }
            if let Some(time) = lands_at {
                let kind = EventKind::KvLanded {
                    replica: r as u32,
                    source,
                    request: idx,
                };
                self.push(time, kind);
            }
        }
        Ok(())
    }

    pub(super) fn on_kv_landed(
        &mut self,
        replica: u32,
        source: Option<u32>,
        idx: ReqIdx,
    ) -> Result<()> {
        self.replicas[replica as usize]
            .policy
            .finish_kv_transfer(idx, false)?;
        self.push(self.now, EventKind::ReplicaSchedule { replica });
        match source {
            Some(source) => {
                self.requests.get_mut(idx).kv.held_by = None;
                self.release_prefill_blocks(source, idx)
            }
            None => Ok(()),
        }
    }

    fn release_prefill_blocks(&mut self, source: u32, idx: ReqIdx) -> Result<()> {
        self.replicas[source as usize]
            .policy
            .finish_kv_transfer(idx, true)?;
        self.push(self.now, EventKind::ReplicaSchedule { replica: source });
        Ok(())
    }
}
