//! Encoder-cache connectors, scheduler side (vLLM 0.33's `ECConnectorBase`,
//! `vllm/distributed/ec_transfer/ec_connector/base.py`): an object that moves encoder
//! outputs between instances (disaggregated encode: an encoder instance publishes them, a
//! prefill or decode instance loads them). While a step is formed the scheduler asks it,
//! for each multimodal item that needs its encoder output and fits the encoder cache,
//! whether it holds that output (`has_cache_item`): an item it holds takes room in the
//! encoder cache but no encoder budget and is not encoded (a consumer loads it; a producer
//! published it already). Each item given cache room is reported (`update_state_after_alloc`).
//! Before a request with items is given tokens the connector is asked whether the outputs
//! it needs are at hand (`ensure_cache_available`); one still in transit skips the request
//! for the step, running or waiting. An update that lets a request's passed item go (vLLM's
//! `_free_encoder_input`, from `_free_encoder_inputs` in `update_from_output` only: not when
//! a request finishes or is preempted) reports it (`update_state_after_free`). A request
//! that finishes is reported (`request_finished`, vLLM's `_free_request`): a delay-free
//! `true` keeps its KV blocks, as a KV connector's send does, until `finish_kv_transfers`
//! lists it in `finished_sending` (its encoder-cache entries are freed at once).
//! Invariant: without a connector, encoder scheduling is as before.

use super::request::Request;
use super::scheduler::Scheduler;
use crate::Result;
use crate::kv::RequestKey;

/// The calls vLLM 0.33's `Scheduler` makes to its encoder-cache connector while it forms a
/// step (`_try_schedule_encoder_inputs`, `_allocate_encoder_inputs`, `_ec_transfer_pending`)
/// and while it applies an update (`_free_encoder_input`).
pub trait EncoderConnector<R>: Send + Sync {
    /// Whether the connector holds the encoder output of the item `identifier` (vLLM's
    /// `mm_hash`).
    fn has_cache_item(&mut self, identifier: &str) -> Result<bool>;

    /// The item `input_id` of `request` was given room in the encoder cache (encoded this
    /// step, or held by the connector).
    fn update_state_after_alloc(&mut self, request: &Request<R>, input_id: usize) -> Result<()>;

    /// vLLM 0.33's `ensure_cache_available(request, num_computed_tokens)`: whether the
    /// encoder outputs `request` needs from `num_computed_tokens` on are at hand (a
    /// connector may start fetching them when asked). A request with one still in transit
    /// is not scheduled this step: a running one stays running, a waiting one keeps its
    /// place (`Scheduler::_ec_transfer_pending`). vLLM's base connector answers true.
    fn ensure_cache_available(
        &mut self,
        _request: &Request<R>,
        _num_computed_tokens: usize,
    ) -> Result<bool> {
        Ok(true)
    }

    /// vLLM 0.33's `update_state_after_free(request, input_id)`, made in
    /// `Scheduler._free_encoder_input`: an update let `request` go of its item `input_id`
    /// (its range lies before the tokens computed for sure; under `is_encoder_decoder`,
    /// each of its items once a token is computed, at every such update, as vLLM does).
    /// Called in vLLM's order: the update's requests in batch order, each one's items in
    /// ascending order. Not called when a request finishes or is preempted (vLLM frees
    /// its encoder cache there without telling the connector). vLLM's base connector does
    /// nothing.
    fn update_state_after_free(&mut self, _request: &Request<R>, _input_id: usize) -> Result<()> {
        Ok(())
    }

    /// vLLM 0.33's `request_finished(request)`, asked in `Scheduler._free_request` after the
    /// KV connector's, for every request that finishes: `true` (delay-free) keeps the
    /// request's KV blocks until `finish_kv_transfers` reports it in `finished_sending`
    /// (vLLM ORs the answer into the KV connector's). vLLM's connectors answer false.
    fn request_finished(&mut self, _request: &Request<R>) -> Result<bool> {
        Ok(false)
    }
}

impl<R: RequestKey> Scheduler<R> {
    /// Sets (or with `None` removes) the encoder-cache connector asked while steps are
    /// formed. An error it returns stops asking it for the rest of the step; the step is
    /// completed (its items not held) and kept, `schedule` returns the error and the next
    /// call the step, as for a KV connector's error at admission.
    pub fn set_encoder_connector(&mut self, connector: Option<Box<dyn EncoderConnector<R>>>) {
        self.ec_connector = connector;
    }

    /// Whether an encoder-cache connector is set.
    pub fn has_encoder_connector(&self) -> bool {
        self.ec_connector.is_some()
    }

    /// The connector's `request_finished` for the finishing request at `slot`: whether it
    /// keeps the request's KV blocks (false without a connector).
    pub(super) fn ec_request_finished(&mut self, slot: u32) -> Result<bool> {
        let Some(connector) = self.ec_connector.as_mut() else {
            return Ok(false);
        };
        let request = self.slots[slot as usize].as_ref().expect("live slot");
        connector.request_finished(request)
    }

    /// vLLM 0.33's `_ec_transfer_pending`: whether the request at `slot`, which has
    /// multimodal items, waits for an encoder output in transit from `num_computed_tokens`
    /// on. Never without a connector or items; an error stops asking for the rest of the
    /// step (as for `has_cache_item`) and counts as nothing in transit.
    pub(super) fn ec_transfer_pending(&mut self, slot: u32, num_computed_tokens: usize) -> bool {
        if self.encoder.connector_error.is_some() {
            return false;
        }
        let Some(connector) = self.ec_connector.as_mut() else {
            return false;
        };
        let request = self.slots[slot as usize].as_ref().expect("live slot");
        if request.spec.mm_features.is_empty() {
            return false;
        }
        match connector.ensure_cache_available(request, num_computed_tokens) {
            Ok(available) => !available,
            Err(err) => {
                self.encoder.connector_error = Some(err);
                false
            }
        }
    }
}
