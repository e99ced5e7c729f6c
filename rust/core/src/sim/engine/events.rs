//! The event queue. Events pop by time, then class (arrivals, class 0, first: as in Vidur,
//! where every arrival event exists before the events it causes), then creation order.
//!
//! Most of a step's events (stage arrival, stage schedule, batch end, the next schedule)
//! are created for the current time, after every other event already due then. Those of
//! class 1 are in pop order as they come (one time, one class, rising creation order), so
//! a queue beside the heap holds them and each pop takes the earlier of the two fronts:
//! the same order as one heap, without its sifting.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

#[derive(Debug, Clone, Copy)]
pub(super) struct Event<K> {
    pub time: f64,
    pub class: u8,
    seq: u64,
    pub kind: K,
}

impl<K> PartialEq for Event<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<K> Eq for Event<K> {}
impl<K> PartialOrd for Event<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Event<K> {
    /// Reversed: the heap pops the greatest, which is the earliest time, then the lower
    /// class, then the earliest created.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time
            .total_cmp(&self.time)
            .then(other.class.cmp(&self.class))
            .then(other.seq.cmp(&self.seq))
    }
}

#[derive(Debug)]
pub(super) struct EventQueue<K> {
    heap: BinaryHeap<Event<K>>,
    /// Class-1 events created for the time they were created at (see the module doc).
    due_now: VecDeque<Event<K>>,
    seq: u64,
}

impl<K> Default for EventQueue<K> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            due_now: VecDeque::new(),
            seq: 0,
        }
    }
}

impl<K> EventQueue<K> {
    /// Queues `kind` at `time` (not before `now`, the time of the event being handled).
    // Inlined into the event loop: its codegen unit split left it out-of-line once (1.3%
    // more instructions on the built-in job, callgrind).
    #[inline]
    pub fn push(&mut self, now: f64, time: f64, class: u8, kind: K) {
        debug_assert!(time >= now, "an event at {time} created at {now}");
        self.seq += 1;
        let event = Event {
            time,
            class,
            seq: self.seq,
            kind,
        };
        // `time == now` exactly: a handler passes the current time itself for what follows
        // at once.
        if class == 1 && time == now {
            self.due_now.push_back(event);
        } else {
            self.heap.push(event);
        }
    }

    /// The next event: the earlier of the heap's and the due-now queue's.
    #[inline]
    pub fn pop(&mut self) -> Option<Event<K>> {
        match (self.heap.peek(), self.due_now.front()) {
            (Some(heap), Some(due)) if heap > due => self.heap.pop(),
            (_, Some(_)) => self.due_now.pop_front(),
            (_, None) => self.heap.pop(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random handlers: each popped event creates up to three more, at its time (often)
    /// or later, some of them at times already queued. The queue pops exactly as one heap
    /// of the same events does.
    #[test]
    fn pops_in_the_order_of_one_heap() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..200 {
            let mut queue = EventQueue::default();
            // One heap of the same events, numbered as the queue numbers them.
            let mut reference = EventQueue::default();
            let push = |queue: &mut EventQueue<u64>,
                        reference: &mut EventQueue<u64>,
                        now: f64,
                        time: f64,
                        class: u8,
                        id| {
                queue.push(now, time, class, id);
                reference.seq += 1;
                let seq = reference.seq;
                reference.heap.push(Event {
                    time,
                    class,
                    seq,
                    kind: id,
                });
            };
            let mut id = 0;
            for _ in 0..3 {
                push(
                    &mut queue,
                    &mut reference,
                    0.0,
                    next(4) as f64,
                    next(2) as u8,
                    id,
                );
                id += 1;
            }
            let mut popped = 0;
            while let Some(event) = queue.pop() {
                let expected = reference.heap.pop().expect("as many events");
                assert_eq!(
                    (event.time, event.class, event.kind),
                    (expected.time, expected.class, expected.kind)
                );
                popped += 1;
                if popped > 300 {
                    continue;
                }
                for _ in 0..next(4) {
                    // Equal times are common: the current one, or a coarse later one.
                    let time = match next(3) {
                        0 | 1 => event.time,
                        _ => event.time + next(3) as f64,
                    };
                    push(
                        &mut queue,
                        &mut reference,
                        event.time,
                        time,
                        next(2) as u8,
                        id,
                    );
                    id += 1;
                }
            }
            assert!(reference.heap.is_empty() && reference.due_now.is_empty());
        }
    }
}
