//! The block pool's free queue as runs of entries in one ring buffer, for a replay that
//! frees a whole request's blocks at a time and hands them out again in that order.
//!
//! vLLM's queue ([`FreeBlockQueue`](super::FreeBlockQueue)) is a doubly linked list through
//! block ids: each pop and push writes the links of the block and of its neighbours, three
//! records spread over the pool. Here the queue is a `VecDeque` of entries, (stamp, block):
//! a request's freed blocks become one run of adjacent entries, and allocation takes from
//! the front run in order, reading entries one cache line after another. A block leaves
//! the middle (a prefix hit on a free block) by having its stamp cleared: its entry goes
//! *stale* where it lies and is skipped when the front reaches it.
//!
//! Invariant: block `b` is free exactly when `stamps[b] != 0`, and then exactly one entry,
//! the live one, carries `(stamps[b], b)`; every other entry of `b` is stale. Entries are
//! in queue order, so the live ones, front to back, are vLLM's queue. Stale entries are
//! dropped when they outnumber the free blocks (amortized O(1) per removal).

use std::collections::VecDeque;

use super::free_queue::FreeQueue;

#[derive(Debug, Clone)]
pub struct RunQueue {
    /// `(stamp << 32) | block`, front first.
    entries: VecDeque<u64>,
    /// Per block, the stamp of its live entry; 0 when the block is not free.
    stamps: Vec<u32>,
    /// The stamp the next pushed entry gets (never 0).
    next_stamp: u32,
    len: usize,
}

fn entry(stamp: u32, block: u32) -> u64 {
    (u64::from(stamp) << 32) | u64::from(block)
}

fn block_of(entry: u64) -> u32 {
    entry as u32
}

#[cfg(test)]
thread_local! {
    /// A planted fault for the differential test (`run_pool_tests`): each push to the back
    /// lands before the entry at the back instead of after it.
    pub(crate) static PLANTED_SWAP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl RunQueue {
    fn is_live(&self, entry: u64) -> bool {
        self.stamps[block_of(entry) as usize] == (entry >> 32) as u32
    }

    /// A fresh stamp for `block`'s new live entry.
    #[inline]
    fn stamp(&mut self, block: u32) -> u32 {
        if self.next_stamp == u32::MAX {
            self.renumber();
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.stamps[block as usize] = stamp;
        stamp
    }

    /// Drops the stale entries and gives the live ones stamps from 1 again (when stamps
    /// run out, once per four billion pushes).
    fn renumber(&mut self) {
        self.compact();
        for (i, e) in self.entries.iter_mut().enumerate() {
            let (stamp, block) = (i as u32 + 1, block_of(*e));
            self.stamps[block as usize] = stamp;
            *e = entry(stamp, block);
        }
        self.next_stamp = self.entries.len() as u32 + 1;
    }

    fn compact(&mut self) {
        let stamps = &self.stamps;
        (self.entries).retain(|&e| stamps[block_of(e) as usize] == (e >> 32) as u32);
        debug_assert_eq!(self.entries.len(), self.len);
    }
}

impl FreeQueue for RunQueue {
    fn with_all_blocks(num_blocks: usize) -> crate::Result<Self> {
        let mut entries = VecDeque::new();
        if entries.try_reserve_exact(num_blocks).is_err() {
            return Err(crate::Error::config(
                "num_blocks",
                num_blocks,
                "the machine cannot allocate the free queue",
            ));
        }
        entries.extend((0..num_blocks as u32).map(|b| entry(b + 1, b)));
        let stamps = super::try_filled_vec(num_blocks, 0u32, "num_blocks")?;
        let mut queue = Self {
            entries,
            stamps,
            next_stamp: num_blocks as u32 + 1,
            len: num_blocks,
        };
        (queue.stamps.iter_mut().zip(1..)).for_each(|(s, stamp)| *s = stamp);
        Ok(queue)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn contains(&self, block: u32) -> bool {
        self.stamps[block as usize] != 0
    }

    fn pop_front(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        loop {
            let first = self.entries.pop_front().expect("a free block has an entry");
            if self.is_live(first) {
                let block = block_of(first);
                self.stamps[block as usize] = 0;
                self.len -= 1;
                return Some(block);
            }
        }
    }

    fn pop_front_into(&mut self, n: usize, out: &mut Vec<u32>) {
        // The entries are read in order, a contiguous part of the ring at a time; each
        // block's stamp is an independent load. A decode step's block or two are popped
        // one by one (the slices cost more than they save there).
        if n < 4 {
            for _ in 0..n {
                let block = self.pop_front().expect("a free block has an entry");
                out.push(block);
            }
            return;
        }
        out.reserve(n);
        let mut taken = 0;
        while taken < n {
            let (front, _) = self.entries.as_slices();
            let mut consumed = 0;
            for &e in front {
                consumed += 1;
                let block = block_of(e);
                if self.stamps[block as usize] == (e >> 32) as u32 {
                    self.stamps[block as usize] = 0;
                    out.push(block);
                    taken += 1;
                    if taken == n {
                        break;
                    }
                }
            }
            self.entries.drain(..consumed);
        }
        self.len -= n;
    }

    fn remove(&mut self, block: u32) {
        debug_assert!(
            self.contains(block),
            "block {block} is not in the free queue"
        );
        self.stamps[block as usize] = 0;
        self.len -= 1;
        if self.entries.len() > 2 * self.len + 64 {
            self.compact();
        }
    }

    fn push_back(&mut self, block: u32) {
        debug_assert!(!self.contains(block), "block {block} is already free");
        let stamp = self.stamp(block);
        self.entries.push_back(entry(stamp, block));
        self.len += 1;
        #[cfg(test)]
        if PLANTED_SWAP.get() && self.entries.len() >= 2 {
            let n = self.entries.len();
            self.entries.swap(n - 1, n - 2);
        }
    }

    fn push_back_run(&mut self, blocks: &[u32]) {
        #[cfg(test)]
        if PLANTED_SWAP.get() {
            return blocks.iter().for_each(|&b| self.push_back(b));
        }
        // Stamps for the whole run at once: renumbered first if they would run out.
        if (self.next_stamp as usize).saturating_add(blocks.len()) >= u32::MAX as usize {
            self.renumber();
        }
        let Self {
            entries,
            stamps,
            next_stamp,
            len,
        } = self;
        let first = *next_stamp;
        entries.extend(blocks.iter().zip(first..).map(|(&block, stamp)| {
            debug_assert!(stamps[block as usize] == 0, "block {block} is already free");
            stamps[block as usize] = stamp;
            entry(stamp, block)
        }));
        *next_stamp = first + blocks.len() as u32;
        *len += blocks.len();
    }

    fn push_front(&mut self, block: u32) {
        debug_assert!(!self.contains(block), "block {block} is already free");
        let stamp = self.stamp(block);
        self.entries.push_front(entry(stamp, block));
        self.len += 1;
    }

    fn ids(&self) -> Vec<u32> {
        (self.entries.iter())
            .filter(|&&e| self.is_live(e))
            .map(|&e| block_of(e))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::free_queue::FreeBlockQueue;

    #[test]
    fn stale_entries_are_skipped_and_a_re_freed_block_keeps_only_its_new_place() {
        let mut queue = RunQueue::with_all_blocks(5).unwrap();
        queue.remove(1);
        queue.push_back(1);
        assert_eq!(queue.ids(), [0, 2, 3, 4, 1]);
        assert_eq!(queue.pop_front(), Some(0));
        assert_eq!(queue.pop_front(), Some(2), "block 1's old entry is stale");
        queue.push_front(0);
        assert_eq!(queue.ids(), [0, 3, 4, 1]);
        assert_eq!(queue.len(), 4);
    }

    #[test]
    fn agrees_with_the_linked_list_through_compactions_and_renumbering() {
        const N: u32 = 37;
        let mut runs = RunQueue::with_all_blocks(N as usize).unwrap();
        let mut list = FreeBlockQueue::with_all_blocks(N as usize).unwrap();
        let mut held: Vec<u32> = Vec::new();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for step in 0..40_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if step == 20_000 {
                runs.next_stamp = u32::MAX - 3;
            }
            let free: Vec<u32> = FreeQueue::ids(&list);
            match state % 4 {
                0 if !free.is_empty() => {
                    let b = free[(state >> 8) as usize % free.len()];
                    FreeQueue::remove(&mut runs, b);
                    list.remove(b);
                    held.push(b);
                }
                1 => {
                    let a = FreeQueue::pop_front(&mut runs);
                    assert_eq!(a, list.pop_front());
                    held.extend(a);
                }
                _ if !held.is_empty() => {
                    let b = held.swap_remove((state >> 8) as usize % held.len());
                    if state & 3 << 20 == 1 << 20 && !held.is_empty() {
                        // A run: this block and up to two more.
                        let mut run = vec![b];
                        while run.len() < 3 && !held.is_empty() {
                            run.push(held.swap_remove(0));
                        }
                        FreeQueue::push_back_run(&mut runs, &run);
                        run.iter().for_each(|&b| list.push_back(b));
                    } else if state & 1 << 20 == 0 {
                        FreeQueue::push_back(&mut runs, b);
                        list.push_back(b);
                    } else {
                        FreeQueue::push_front(&mut runs, b);
                        list.push_front(b);
                    }
                }
                _ => {}
            }
            assert_eq!(FreeQueue::ids(&runs), FreeQueue::ids(&list), "step {step}");
            assert_eq!(FreeQueue::len(&runs), list.len());
            assert!(runs.entries.len() <= 2 * FreeQueue::len(&runs) + 65);
        }
    }
}
