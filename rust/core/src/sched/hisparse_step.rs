//! vLLM 0.33's HiSparse connector run by the step (prefix caching off): with it on, the
//! host page pool of `sched::hisparse` is a [`HiSparseConnectorKv`] over the hybrid KV's
//! coordinator (its HiSparse pins on), and the scheduler makes the connector's calls in
//! vLLM's order (docs/integrations.md, "vLLM 0.33's scheduler-side HiSparse rule"):
//!
//! - the fits check, the charge after each allocation, the source group's new blocks in the
//!   outputs and the free (finish, preemption, deferred frees) go through the host pool
//!   (`sched::hisparse`);
//! - once the step's allocations are done and its output is formed, `advance_scheduled`
//!   for each scheduled request in `num_scheduled_tokens` order, with the tokens computed
//!   once the step lands (capped at its known tokens) less `num_reprefillable_tokens`
//!   (vLLM's `HiSparseConnectorScheduler.build_connector_meta`, which runs after
//!   `schedule()` has allocated);
//! - the workers' counts ([`Scheduler::hisparse_acknowledge`], vLLM's `update_spills`),
//!   which the caller passes after the step's update freed the finished requests, as
//!   vLLM's `update_from_output` runs `update_connector_output` after them;
//! - a running request's allocation finding no room asks the connector's pending
//!   reclamation (vLLM's `has_pending_block_frees`) instead of the step hook.
//!
//! The caller reads the step's write-backs ([`Scheduler::take_hisparse_transfers`]) and
//! the tables ([`Scheduler::hisparse_tables`]) to build vLLM's
//! `HiSparseConnectorMetadata`.

use super::Scheduler;
use super::hisparse::HostPages;
use super::kv::Kv;
use crate::kv::{DeviceTables, DeviceTransfer, HiSparseConnectorKv, RequestKey};
use crate::{Error, Result};

fn connector_off() -> Error {
    Error::config(
        "hisparse_connector",
        "None",
        "needs the HiSparse connector on (set_hisparse_connector)",
    )
}

impl<R: RequestKey> Scheduler<R> {
    /// Turns vLLM 0.33's HiSparse connector on, with at most `max_spill_pages` write-backs
    /// planned per step (vLLM: `max_model_len // block_size`), before any request holds
    /// blocks; the host pool (`set_hisparse_host_pages`) is taken over by it.
    ///
    /// Errors (`Error::Config`): no host pool or no KV groups; requests holding blocks;
    /// prefix caching on, or groups other than one resident and one hot group beside the
    /// full-attention ones (`HiSparseConnectorKv::new`).
    pub fn set_hisparse_connector(&mut self, max_spill_pages: usize) -> Result<()> {
        let Some(host) = self.host_pages.as_ref() else {
            return Err(Error::config(
                "hisparse_connector",
                max_spill_pages,
                "needs the HiSparse host pool (set_hisparse_host_pages) first",
            ));
        };
        let num_blocks = host.num_blocks();
        if (0..self.slots.len() as u32).any(|slot| self.kv.block_ids(slot).is_some()) {
            return Err(Error::config(
                "hisparse_connector",
                max_spill_pages,
                "set while requests hold KV blocks (set it before the first step)",
            ));
        }
        let coord = self.kv.hybrid_pool_mut("the HiSparse connector")?;
        let connector = HiSparseConnectorKv::new(coord, num_blocks, max_spill_pages)?;
        let host = self.host_pages.as_mut().expect("checked above");
        host.connector = Some(Box::new(connector));
        Ok(())
    }

    /// Whether the HiSparse connector is on.
    pub fn hisparse_connector(&self) -> bool {
        self.connector_ref().is_some()
    }

    fn connector_ref(&self) -> Option<&HiSparseConnectorKv<u32>> {
        self.host_pages.as_ref()?.connector.as_deref()
    }

    /// The connector and the coordinator, both mutable (`None` without the connector).
    fn connector_parts(
        &mut self,
    ) -> Option<(
        &mut HiSparseConnectorKv<u32>,
        &mut crate::kv::KvCoordinator<u32>,
    )> {
        let connector = self.host_pages.as_mut()?.connector.as_deref_mut()?;
        match &mut self.kv {
            Kv::Hybrid(kv) => Some((connector, &mut kv.pool)),
            _ => None,
        }
    }

    /// vLLM's `advance_scheduled` for the step's scheduled requests, in their order
    /// (`scheduled`: slot and tokens, after the output raised their computed counts);
    /// nothing without the connector.
    pub(super) fn advance_hisparse(&mut self, scheduled: &[(u32, usize)]) -> Result<()> {
        if self.connector_ref().is_none() {
            return Ok(());
        }
        let reprefillable = self.config.num_prefill_lookahead.saturating_sub(1);
        for &(slot, _) in scheduled {
            let request = self.req(slot);
            let landed = request.num_computed_tokens.min(request.num_tokens());
            let computed = landed.saturating_sub(reprefillable);
            let (connector, coord) = self.connector_parts().expect("checked above");
            connector.advance_scheduled(coord, &slot, computed)?;
        }
        Ok(())
    }

    /// The write-backs the steps planned since the last call (vLLM's
    /// `build_offload_command`), each `(transfer id, host block, resident block)`.
    pub fn take_hisparse_transfers(&mut self) -> Result<Vec<DeviceTransfer>> {
        let (connector, _) = self.connector_parts().ok_or_else(connector_off)?;
        Ok(connector.take_transfers())
    }

    /// The request's blocks as the connector sees them: host, indexer (the first group),
    /// the resident row (lost pages null) and the hot group; `None` when it holds none.
    pub fn hisparse_tables(&self, request_id: &R) -> Option<DeviceTables> {
        let connector = self.connector_ref()?;
        let slot = *self.index.get(request_id)?;
        let Kv::Hybrid(kv) = &self.kv else {
            return None;
        };
        let tables = kv.pool.block_ids(&slot)?;
        Some((
            connector.host_table(&slot).unwrap_or_default().to_vec(),
            tables[0].to_vec(),
            kv.pool.hisparse_resident_row(&slot)?,
            tables[connector.hot_group()].to_vec(),
        ))
    }

    /// The workers' `enqueued` and `completed` counts by transfer id (vLLM's
    /// `update_spills`, from `HiSparseConnectorWorkerMetadata`); call it after the step's
    /// update, as vLLM's `update_from_output` hands them over after freeing the finished
    /// requests.
    ///
    /// Errors: the connector off; `Error::Internal` for a reference released twice.
    pub fn hisparse_acknowledge(
        &mut self,
        enqueued: &[(u64, u32)],
        completed: &[(u64, u32)],
    ) -> Result<()> {
        let (connector, coord) = self.connector_parts().ok_or_else(connector_off)?;
        connector.acknowledge(coord, enqueued, completed)
    }

    /// The pages lost to block reuse since the last call, `(request, page)` in the order
    /// their blocks were handed out (requests gone since left out).
    pub fn take_hisparse_lost_pages(&mut self) -> Vec<(R, usize)> {
        let Some((_, coord)) = self.connector_parts() else {
            return Vec::new();
        };
        let lost = coord.take_hisparse_lost_pages();
        (lost.into_iter())
            .filter_map(|(slot, page)| {
                let request = self.slots.get(slot as usize)?.as_ref()?;
                Some((request.request_id.clone(), page))
            })
            .collect()
    }

    /// vLLM's `has_pending_reclamation` (the connector's `has_pending_block_frees`); false
    /// without the connector.
    pub fn hisparse_pending_reclamation(&self) -> bool {
        match (self.connector_ref(), &self.kv) {
            (Some(c), Kv::Hybrid(kv)) => c.has_pending_reclamation(&kv.pool),
            _ => false,
        }
    }

    /// Write-backs planned and not yet acknowledged (vLLM's `pending_spills`); 0 without
    /// the connector.
    pub fn hisparse_num_pending_transfers(&self) -> usize {
        self.connector_ref()
            .map_or(0, |c| c.num_pending_transfers())
    }

    /// vLLM's `has_pending_work` (the connector's `has_pending_push_work`); false without
    /// the connector.
    pub fn hisparse_pending_work(&self) -> bool {
        self.connector_ref().is_some_and(|c| c.has_pending_work())
    }

    /// The connector's host references, and each request's host table as long as its
    /// first group's.
    pub(super) fn check_connector_pages(
        &self,
        host: &HostPages,
    ) -> std::result::Result<(), String> {
        let Some(connector) = host.connector.as_deref() else {
            return Ok(());
        };
        connector.check()?;
        for slot in 0..self.slots.len() as u32 {
            let blocks = self.kv.block_ids(slot).map_or(0, <[_]>::len);
            let held = connector.host_table(&slot).map_or(0, <[_]>::len);
            if held != blocks && !(held == 0 && blocks == 0) {
                return Err(format!(
                    "host pages: slot {slot} holds {held} for {blocks} device blocks"
                ));
            }
        }
        Ok(())
    }
}
