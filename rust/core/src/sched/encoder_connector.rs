//! Encoder-cache connectors, scheduler side (vLLM 0.33's `ECConnectorBase`,
//! `vllm/distributed/ec_transfer/ec_connector/base.py`): an object that moves encoder
//! outputs between instances (disaggregated encode: an encoder instance publishes them, a
//! prefill or decode instance loads them). While a step is formed the scheduler asks it,
//! for each multimodal item that needs its encoder output and fits the encoder cache,
//! whether it holds that output (`has_cache_item`): an item it holds takes room in the
//! encoder cache but no encoder budget and is not encoded (a consumer loads it; a producer
//! published it already). Each item given cache room is reported (`update_state_after_alloc`).
//! Invariant: without a connector, encoder scheduling is as before.

use super::request::Request;
use super::scheduler::Scheduler;
use crate::Result;
use crate::kv::RequestKey;

/// The two calls vLLM 0.33's `Scheduler` makes to its encoder-cache connector while it forms
/// a step (`_try_schedule_encoder_inputs`, `_allocate_encoder_inputs`).
pub trait EncoderConnector<R>: Send + Sync {
    /// Whether the connector holds the encoder output of the item `identifier` (vLLM's
    /// `mm_hash`).
    fn has_cache_item(&mut self, identifier: &str) -> Result<bool>;

    /// The item `input_id` of `request` was given room in the encoder cache (encoded this
    /// step, or held by the connector).
    fn update_state_after_alloc(&mut self, request: &Request<R>, input_id: usize) -> Result<()>;
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
}
