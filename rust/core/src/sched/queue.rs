//! The waiting queue: a deque in arrival order (FCFS) or a heap on
//! `(priority, arrival_time, request id, arrival order)` (priority; vLLM 0.33's
//! `Request.__lt__` breaks ties by request id). Preempted requests go back to the front
//! under FCFS; under priority their key already places them.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::Policy;

/// Heap key: smaller priority value first, then earlier arrival, then the smaller request
/// id, then earlier sequence.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PriorityKey<R> {
    pub priority: i64,
    pub arrival_time: f64,
    pub request_id: R,
    /// Whether ties go by `request_id` (vLLM) or straight to `arrival_seq`.
    pub by_id: bool,
    pub arrival_seq: u64,
}

impl<R: Ord> Eq for PriorityKey<R> {}

impl<R: Ord> Ord for PriorityKey<R> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.priority
            .cmp(&other.priority)
            .then(self.arrival_time.total_cmp(&other.arrival_time))
            .then_with(|| match self.by_id {
                true => self.request_id.cmp(&other.request_id),
                false => std::cmp::Ordering::Equal,
            })
            .then(self.arrival_seq.cmp(&other.arrival_seq))
    }
}

impl<R: Ord> PartialOrd for PriorityKey<R> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug, Clone)]
pub(crate) enum WaitingQueue<R> {
    Fcfs(VecDeque<u32>),
    Priority(BinaryHeap<Reverse<(PriorityKey<R>, u32)>>),
}

impl<R: Ord> WaitingQueue<R> {
    pub fn new(policy: Policy) -> Self {
        match policy {
            Policy::Fcfs => WaitingQueue::Fcfs(VecDeque::new()),
            Policy::Priority => WaitingQueue::Priority(BinaryHeap::new()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            WaitingQueue::Fcfs(q) => q.len(),
            WaitingQueue::Priority(h) => h.len(),
        }
    }

    pub fn push_back(&mut self, slot: u32, key: PriorityKey<R>) {
        match self {
            WaitingQueue::Fcfs(q) => q.push_back(slot),
            WaitingQueue::Priority(h) => h.push(Reverse((key, slot))),
        }
    }

    /// Puts a request first in line (a preempted or skipped one keeps its turn).
    pub fn push_front(&mut self, slot: u32, key: PriorityKey<R>) {
        match self {
            WaitingQueue::Fcfs(q) => q.push_front(slot),
            WaitingQueue::Priority(h) => h.push(Reverse((key, slot))),
        }
    }

    pub fn peek(&self) -> Option<u32> {
        match self {
            WaitingQueue::Fcfs(q) => q.front().copied(),
            WaitingQueue::Priority(h) => h.peek().map(|Reverse((_, slot))| *slot),
        }
    }

    pub fn pop(&mut self) -> Option<u32> {
        match self {
            WaitingQueue::Fcfs(q) => q.pop_front(),
            WaitingQueue::Priority(h) => h.pop().map(|Reverse((_, slot))| slot),
        }
    }

    /// Removes a request from anywhere in the queue (abort). O(n).
    pub fn remove(&mut self, slot: u32) -> bool {
        let before = self.len();
        match self {
            WaitingQueue::Fcfs(q) => q.retain(|&s| s != slot),
            WaitingQueue::Priority(h) => h.retain(|Reverse((_, s))| *s != slot),
        }
        self.len() != before
    }

    /// Slots in scheduling order. O(n log n) for the heap: for inspection, not the step.
    pub fn ordered(&self) -> Vec<u32> {
        match self {
            WaitingQueue::Fcfs(q) => q.iter().copied().collect(),
            WaitingQueue::Priority(h) => {
                let mut items: Vec<_> = h.iter().map(|Reverse(item)| item).collect();
                items.sort_by(|a, b| a.0.cmp(&b.0));
                items.into_iter().map(|(_, slot)| *slot).collect()
            }
        }
    }
}

/// The waiting requests in two parts, each in policy order: those holding KV blocks (an
/// asynchronous load began: it is in flight, landed or failed) are served before the rest.
/// vLLM 0.33's `kv_holding_waiting`: a block holder must never wait behind a request whose
/// failed allocation stops admission, or the memory it holds is never used or freed.
#[derive(Debug, Clone)]
pub(crate) struct Waiting<R> {
    holding: WaitingQueue<R>,
    rest: WaitingQueue<R>,
}

impl<R: Ord> Waiting<R> {
    pub fn new(policy: Policy) -> Self {
        Self {
            holding: WaitingQueue::new(policy),
            rest: WaitingQueue::new(policy),
        }
    }

    pub fn len(&self) -> usize {
        self.holding.len() + self.rest.len()
    }

    /// A new request: it holds nothing yet.
    pub fn push_back(&mut self, slot: u32, key: PriorityKey<R>) {
        self.rest.push_back(slot, key);
    }

    /// A request that holds blocks when `holds_kv` (a resumed session: vLLM 0.33's
    /// `kv_holding_waiting.add_request`), last in line in its part.
    pub fn push_back_in_part(&mut self, slot: u32, key: PriorityKey<R>, holds_kv: bool) {
        let part = if holds_kv {
            &mut self.holding
        } else {
            &mut self.rest
        };
        part.push_back(slot, key);
    }

    /// Puts a request first in line in its part (a preempted or skipped one keeps its turn).
    pub fn push_front(&mut self, slot: u32, key: PriorityKey<R>, holds_kv: bool) {
        let part = if holds_kv {
            &mut self.holding
        } else {
            &mut self.rest
        };
        part.push_front(slot, key);
    }

    /// The next request to consider: the first block holder, else the first of the rest.
    pub fn peek(&self) -> Option<u32> {
        self.holding.peek().or_else(|| self.rest.peek())
    }

    pub fn pop(&mut self) -> Option<u32> {
        self.holding.pop().or_else(|| self.rest.pop())
    }

    /// Removes a request from anywhere (abort, a holder that let its blocks go). O(n).
    pub fn remove(&mut self, slot: u32) -> bool {
        self.holding.remove(slot) || self.rest.remove(slot)
    }

    /// The block holders' slots in scheduling order (vLLM 0.33's `kv_holding_waiting`).
    pub fn holding_ordered(&self) -> Vec<u32> {
        self.holding.ordered()
    }

    /// Slots in scheduling order: the holders, then the rest.
    pub fn ordered(&self) -> Vec<u32> {
        let mut slots = self.holding.ordered();
        slots.extend(self.rest.ordered());
        slots
    }

    /// The same requests in the order given (a policy plugin's), holders still first.
    pub fn reordered(
        &self,
        order: &[u32],
        key: impl Fn(u32) -> PriorityKey<R>,
        holds_kv: impl Fn(u32) -> bool,
    ) -> Self {
        let mut out = Self::new(Policy::Fcfs);
        for &slot in order {
            let part = if holds_kv(slot) {
                &mut out.holding
            } else {
                &mut out.rest
            };
            part.push_back(slot, key(slot));
        }
        out
    }
}
