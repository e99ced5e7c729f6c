//! What tests read of a simulation besides its output: the window steps ended lazily
//! (`lazy`) and each batch end's KV cache events (the coalescing judge compares when
//! blocks were cached and evicted, `sim::coalesce_tests`).

use crate::kv::KvEvent;

/// Window steps this thread's simulations ended lazily (`lazy`).
#[cfg(test)]
pub(crate) fn lazy_steps() -> u64 {
    super::lazy::LAZY_STEPS.with(std::cell::Cell::get)
}

#[cfg(test)]
thread_local! {
    /// Each batch end's KV cache events on this thread, with the replica and the batch
    /// (tests compare when each block was cached and evicted, not only what it led to).
    static KV_EVENT_LOG: std::cell::RefCell<Vec<String>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

/// Takes the KV event log of this thread's simulations (`KV_EVENT_LOG`).
#[cfg(test)]
pub(crate) fn take_kv_event_log() -> Vec<String> {
    KV_EVENT_LOG.with(|log| std::mem::take(&mut *log.borrow_mut()))
}

/// Logs replica `r`'s KV cache events drained at the end of batch `batch_id`.
pub(super) fn log_kv_events(r: usize, batch_id: u64, events: &[KvEvent]) {
    if !events.is_empty() {
        let entry = format!("{r} {batch_id} {events:?}");
        KV_EVENT_LOG.with(|log| log.borrow_mut().push(entry));
    }
}
