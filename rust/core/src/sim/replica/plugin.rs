//! A replica scheduler written elsewhere (a Python plugin): it decides who runs; this
//! adapter checks every answer against the replica's state and releases requests once they
//! complete, so a plugin can never corrupt the simulation, only be refused.
//!
//! The simulator asks for the next batch while earlier batches are still in flight on
//! later pipeline stages: a plugin must not offer a request that is in a running batch.

use rustc_hash::{FxHashMap, FxHashSet};

use super::{BatchPlan, ReplicaPolicy};
use crate::sim::arena::Requests;
use crate::sim::batch::Batch;
use crate::sim::request::{ReqIdx, SimRequest};
use crate::{Error, Result};

/// The calls a replica plugin answers; the binding implements it over a Python object.
pub trait ReplicaPluginHost: Send {
    /// A request routed to this replica.
    fn add_request(&mut self, request: &SimRequest) -> Result<()>;
    /// `(request id, tokens)` pairs of the next batch; `None` or empty: nothing to run.
    fn next_batch(&mut self) -> Result<Option<Vec<(u64, u32)>>>;
    /// The requests of a finished batch, as they are after it.
    fn on_batch_end(&mut self, batch: &[&SimRequest]) -> Result<()>;
    /// Fraction of the plugin's KV memory in use (0 when it does not say).
    fn kv_usage(&mut self) -> Result<f64>;
}

pub struct PluginReplica<H> {
    host: H,
    held: FxHashMap<u64, ReqIdx>,
    in_flight: FxHashSet<ReqIdx>,
    never_scheduled: FxHashSet<ReqIdx>,
    /// The plugin's answer after its last call: its state changes only when it is called.
    kv_usage: f64,
}

impl<H: ReplicaPluginHost> PluginReplica<H> {
    pub fn new(host: H) -> Self {
        Self {
            host,
            held: FxHashMap::default(),
            in_flight: FxHashSet::default(),
            never_scheduled: FxHashSet::default(),
            kv_usage: 0.0,
        }
    }

    fn refresh_kv_usage(&mut self) -> Result<()> {
        let usage = self.host.kv_usage()?;
        if !(usage.is_finite() && (0.0..=1.0).contains(&usage)) {
            return Err(Error::Plugin(format!(
                "kv_usage() returned {usage}; it must be a fraction in [0, 1]"
            )));
        }
        self.kv_usage = usage;
        Ok(())
    }

    fn check_plan(&self, requests: &Requests, answer: Vec<(u64, u32)>) -> Result<BatchPlan> {
        let mut plan: BatchPlan = (Vec::with_capacity(answer.len()), Vec::new());
        let mut seen = FxHashSet::default();
        for (id, n) in answer {
            let bad = |why: &str| Err(Error::Plugin(format!("next_batch: request {id} {why}")));
            let Some(&idx) = self.held.get(&id) else {
                return bad("is not held by this replica");
            };
            if self.in_flight.contains(&idx) {
                return bad(
                    "is in a batch still in flight (next_batch is called while earlier \
                     batches run on later pipeline stages; see docs/plugins.md)",
                );
            }
            if !seen.insert(idx) {
                return bad("appears twice in the batch");
            }
            let r = requests.get(idx);
            let limit = r.next_num_tokens();
            if r.completed || n == 0 || n > limit {
                return bad(&format!("cannot take {n} tokens (at most {limit})"));
            }
            plan.0.push(idx);
            plan.1.push(n);
        }
        Ok(plan)
    }
}

impl<H: ReplicaPluginHost> ReplicaPolicy for PluginReplica<H> {
    fn add_request(&mut self, requests: &mut Requests, idx: ReqIdx) -> Result<()> {
        let r = requests.get(idx);
        self.host.add_request(r)?;
        self.held.insert(r.id, idx);
        self.never_scheduled.insert(idx);
        self.refresh_kv_usage()
    }

    fn next_batch(&mut self, requests: &mut Requests) -> Result<Option<BatchPlan>> {
        let answer = self.host.next_batch()?;
        self.refresh_kv_usage()?;
        let Some(answer) = answer.filter(|a| !a.is_empty()) else {
            return Ok(None);
        };
        let plan = self.check_plan(requests, answer)?;
        for &idx in &plan.0 {
            self.in_flight.insert(idx);
            self.never_scheduled.remove(&idx);
        }
        Ok(Some(plan))
    }

    fn on_batch_end(&mut self, requests: &mut Requests, batch: &Batch) -> Result<Vec<ReqIdx>> {
        let views: Vec<&SimRequest> = batch.requests.iter().map(|&i| requests.get(i)).collect();
        self.host.on_batch_end(&views)?;
        self.refresh_kv_usage()?;
        let mut released = Vec::new();
        for &idx in &batch.requests {
            self.in_flight.remove(&idx);
            let r = requests.get(idx);
            if r.completed {
                self.held.remove(&r.id);
                released.push(idx);
            }
        }
        Ok(released)
    }

    fn num_pending(&self) -> usize {
        self.never_scheduled.len()
    }

    fn num_outstanding(&self) -> usize {
        self.held.len()
    }

    fn pending_prefill_tokens(&self, requests: &Requests) -> u64 {
        self.never_scheduled
            .iter()
            .map(|&idx| requests.get(idx).num_prefill_tokens as u64)
            .sum()
    }

    fn kv_usage(&self) -> f64 {
        self.kv_usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin that runs each request's whole remaining work, one request per batch.
    #[derive(Default)]
    struct OneAtATime {
        queue: Vec<(u64, u32)>,
        answer_twice: bool,
    }

    impl ReplicaPluginHost for OneAtATime {
        fn add_request(&mut self, request: &SimRequest) -> Result<()> {
            self.queue.push((request.id, request.num_prefill_tokens));
            Ok(())
        }
        fn next_batch(&mut self) -> Result<Option<Vec<(u64, u32)>>> {
            let head = self.queue.first().copied();
            Ok(head.map(|h| {
                if self.answer_twice {
                    vec![h, h]
                } else {
                    vec![h]
                }
            }))
        }
        fn on_batch_end(&mut self, _batch: &[&SimRequest]) -> Result<()> {
            Ok(())
        }
        fn kv_usage(&mut self) -> Result<f64> {
            Ok(0.25)
        }
    }

    fn one_request() -> (Requests, ReqIdx) {
        let mut requests = Requests::default();
        let idx = requests.insert(SimRequest::new(7, 0.0, 4, 2, Vec::new()));
        (requests, idx)
    }

    #[test]
    fn a_request_in_flight_is_refused_with_the_reason() {
        let (mut requests, idx) = one_request();
        let mut replica = PluginReplica::new(OneAtATime::default());
        replica.add_request(&mut requests, idx).unwrap();
        assert_eq!(replica.kv_usage(), 0.25);
        let plan = replica.next_batch(&mut requests).unwrap().unwrap();
        assert_eq!(plan, (vec![idx], vec![4]));
        let err = replica.next_batch(&mut requests).unwrap_err().to_string();
        assert!(
            err.contains("request 7 is in a batch still in flight"),
            "{err}"
        );
    }

    #[test]
    fn a_duplicate_in_one_batch_is_refused() {
        let (mut requests, idx) = one_request();
        let host = OneAtATime {
            answer_twice: true,
            ..OneAtATime::default()
        };
        let mut replica = PluginReplica::new(host);
        replica.add_request(&mut requests, idx).unwrap();
        let err = replica.next_batch(&mut requests).unwrap_err().to_string();
        assert!(err.contains("appears twice"), "{err}");
    }
}
