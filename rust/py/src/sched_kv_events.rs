//! `tokenyard.sched.Scheduler`'s detailed KV events: each cache call's request and blocks
//! beside the prefix-cache events (what an adapter needs to publish vLLM 0.33's
//! `BlockStored` per cache call). Conversions only; the core's side is `sched::kv_events`.

use pyo3::prelude::*;

use super::PyScheduler;
use super::args::kv_event;

/// A cache call as `drain_kv_events_detailed` gives it:
/// `(at, request_id, group, first_block, end_block, skipped, reused, partial)`.
type CallTuple = (usize, Py<PyAny>, u32, usize, usize, Vec<usize>, bool, bool);

/// What `drain_kv_events_detailed` returns: the events and the cache calls.
type Detailed = (Vec<(&'static str, u128)>, Vec<CallTuple>);

#[pymethods]
impl PyScheduler {
    /// Starts recording each cache call and lookup hit beside the prefix-cache events
    /// (which it turns on too). ConfigError for the radix pool and for what the coordinator
    /// does not record as vLLM publishes it (`KvCoordinator::enable_cache_calls`).
    fn enable_kv_cache_calls(&mut self, py: Python<'_>) -> PyResult<()> {
        self.inner
            .enable_kv_cache_calls()
            .map_err(|err| self.raise(py, err))
    }

    /// The prefix-cache events since the last drain (as `drain_kv_events` gives them) and
    /// the cache calls: `(at, request_id, group, first_block, end_block, skipped,
    /// reused, partial)`, the call's `Stored` events being `events[at:at + end_block -
    /// first_block - len(skipped)]` (the request's blocks `first_block..end_block` but
    /// `skipped`); a `reused` call is a lookup's hit of blocks `0..end_block`, with no
    /// events; a `partial` one the hash at the end of hash block `end_block - 1`
    /// registered on a block, one event.
    fn drain_kv_events_detailed(&mut self, py: Python<'_>) -> PyResult<Detailed> {
        let (events, calls) = self.inner.drain_kv_events_detailed();
        let calls = calls
            .into_iter()
            .map(|c| {
                let id = c.request.into_py(py)?;
                Ok((
                    c.at,
                    id,
                    c.group,
                    c.first_block,
                    c.end_block,
                    c.skipped,
                    c.reused,
                    c.partial,
                ))
            })
            .collect::<PyResult<_>>()?;
        Ok((events.into_iter().map(kv_event).collect(), calls))
    }
}
