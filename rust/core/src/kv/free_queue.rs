//! The free-block queue of vLLM V1's block pool: a doubly linked list threaded through
//! block ids, so a cached block that gets a prefix hit leaves the middle of the queue in
//! O(1). Front = next to be handed out (least recently freed); back = most recently freed.
//!
//! Invariant: every block id is either linked exactly once or not at all; `len` counts the
//! linked ones.

const NOT_LINKED: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub(crate) struct FreeBlockQueue {
    // Index `sentinel()` is the list head/tail marker; ids 0..num_blocks are blocks.
    prev: Vec<u32>,
    next: Vec<u32>,
    len: usize,
}

impl FreeBlockQueue {
    /// A queue holding every block, in id order.
    pub(crate) fn with_all_blocks(num_blocks: usize) -> Self {
        let sentinel = num_blocks as u32;
        let size = num_blocks + 1;
        let next = (0..size as u32).map(|i| (i + 1) % size as u32).collect();
        let prev = (0..size as u32)
            .map(|i| (i + size as u32 - 1) % size as u32)
            .collect();
        let queue = Self {
            prev,
            next,
            len: num_blocks,
        };
        debug_assert_eq!(queue.next[sentinel as usize], 0);
        queue
    }

    fn sentinel(&self) -> u32 {
        (self.next.len() - 1) as u32
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, block: u32) -> bool {
        self.next[block as usize] != NOT_LINKED
    }

    /// Takes the block at the front (the least recently freed one).
    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        let first = self.next[self.sentinel() as usize];
        if first == self.sentinel() {
            return None;
        }
        self.remove(first);
        Some(first)
    }

    /// Unlinks `block`, which must be linked.
    pub(crate) fn remove(&mut self, block: u32) {
        debug_assert!(
            self.contains(block),
            "block {block} is not in the free queue"
        );
        let (prev, next) = (self.prev[block as usize], self.next[block as usize]);
        self.next[prev as usize] = next;
        self.prev[next as usize] = prev;
        self.prev[block as usize] = NOT_LINKED;
        self.next[block as usize] = NOT_LINKED;
        self.len -= 1;
    }

    /// Links `block`, which must not be linked, at the back.
    pub(crate) fn push_back(&mut self, block: u32) {
        debug_assert!(!self.contains(block), "block {block} is already free");
        let sentinel = self.sentinel();
        let last = self.prev[sentinel as usize];
        self.next[last as usize] = block;
        self.prev[block as usize] = last;
        self.next[block as usize] = sentinel;
        self.prev[sentinel as usize] = block;
        self.len += 1;
    }

    /// Links `block`, which must not be linked, at the front (handed out next).
    pub(crate) fn push_front(&mut self, block: u32) {
        debug_assert!(!self.contains(block), "block {block} is already free");
        let sentinel = self.sentinel();
        let first = self.next[sentinel as usize];
        self.prev[first as usize] = block;
        self.next[block as usize] = first;
        self.prev[block as usize] = sentinel;
        self.next[sentinel as usize] = block;
        self.len += 1;
    }

    /// Block ids front to back.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let sentinel = self.sentinel();
        std::iter::successors(Some(self.next[sentinel as usize]), move |&b| {
            Some(self.next[b as usize])
        })
        .take_while(move |&b| b != sentinel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_in_id_order_and_removes_from_the_middle() {
        let mut queue = FreeBlockQueue::with_all_blocks(5);
        assert_eq!(queue.iter().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        queue.remove(2);
        assert!(!queue.contains(2));
        queue.push_back(2);
        assert_eq!(queue.pop_front(), Some(0));
        assert_eq!(queue.iter().collect::<Vec<_>>(), [1, 3, 4, 2]);
        assert_eq!(queue.len(), 4);
    }

    #[test]
    fn empties_and_refills() {
        let mut queue = FreeBlockQueue::with_all_blocks(2);
        assert_eq!(queue.pop_front(), Some(0));
        assert_eq!(queue.pop_front(), Some(1));
        assert_eq!(queue.pop_front(), None);
        queue.push_back(1);
        queue.push_front(0);
        assert_eq!(queue.iter().collect::<Vec<_>>(), [0, 1]);
        assert_eq!(queue.pop_front(), Some(0));
    }
}
