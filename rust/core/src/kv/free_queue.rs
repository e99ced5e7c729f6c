//! The free-block queue of vLLM V1's block pool: a doubly linked list threaded through
//! block ids, so a cached block that gets a prefix hit leaves the middle of the queue in
//! O(1). Front = next to be handed out (least recently freed); back = most recently freed.
//!
//! Invariant: every block id is either linked exactly once or not at all; `len` counts the
//! linked ones.

/// What the block pool needs of its free queue (front = next handed out, evicted first):
/// vLLM's doubly linked list ([`FreeBlockQueue`]) or a queue of runs
/// ([`RunQueue`](super::RunQueue)), which give the same blocks in the same order.
pub trait FreeQueue: Clone + std::fmt::Debug {
    /// A queue holding every block of a pool of `num_blocks`, in id order.
    fn with_all_blocks(num_blocks: usize) -> crate::Result<Self>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn contains(&self, block: u32) -> bool;
    /// Takes the block at the front (the least recently freed one).
    fn pop_front(&mut self) -> Option<u32>;
    /// Unlinks `block`, which must be linked (a prefix hit on a free block).
    fn remove(&mut self, block: u32);
    /// Links `block`, which must not be linked, at the back.
    fn push_back(&mut self, block: u32);
    /// Links `block`, which must not be linked, at the front (handed out next).
    fn push_front(&mut self, block: u32);
    /// Links each of `blocks`, none linked, at the back in order ([`Self::push_back`]
    /// each).
    fn push_back_run(&mut self, blocks: &[u32]) {
        blocks.iter().for_each(|&b| self.push_back(b));
    }
    /// Block ids front to back. O(free blocks): for inspection.
    fn ids(&self) -> Vec<u32>;
    /// Takes `n` blocks from the front (there are that many) onto `out`, in order.
    fn pop_front_into(&mut self, n: usize, out: &mut Vec<u32>) {
        for _ in 0..n {
            out.push(
                self.pop_front()
                    .expect("allocation was checked against the free count"),
            );
        }
    }
}

const NOT_LINKED: u32 = u32::MAX;
const PREV: usize = 0;
const NEXT: usize = 1;

#[derive(Debug, Clone)]
pub struct FreeBlockQueue {
    // Index `sentinel()` is the list head/tail marker; ids 0..num_blocks are blocks.
    // `links[b] = [prev, next]`: one cache line per block touched, not two (a replay that
    // evicts constantly pays a cache miss per link it reads).
    links: Vec<[u32; 2]>,
    len: usize,
}

impl FreeBlockQueue {
    /// A queue holding every block, in id order.
    pub(crate) fn with_all_blocks(num_blocks: usize) -> crate::Result<Self> {
        let size = num_blocks as u32 + 1;
        let mut links = super::try_filled_vec(size as usize, [0; 2], "num_blocks")?;
        for (i, link) in (0..size).zip(links.iter_mut()) {
            *link = [(i + size - 1) % size, (i + 1) % size];
        }
        let queue = Self {
            links,
            len: num_blocks,
        };
        debug_assert_eq!(queue.links[num_blocks][NEXT], 0);
        Ok(queue)
    }

    fn sentinel(&self) -> u32 {
        (self.links.len() - 1) as u32
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, block: u32) -> bool {
        self.links[block as usize][NEXT] != NOT_LINKED
    }

    /// Takes the block at the front (the least recently freed one).
    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        let first = self.links[self.sentinel() as usize][NEXT];
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
        let [prev, next] = self.links[block as usize];
        self.links[prev as usize][NEXT] = next;
        self.links[next as usize][PREV] = prev;
        self.links[block as usize] = [NOT_LINKED; 2];
        self.len -= 1;
    }

    /// Links `block`, which must not be linked, at the back.
    pub(crate) fn push_back(&mut self, block: u32) {
        debug_assert!(!self.contains(block), "block {block} is already free");
        let sentinel = self.sentinel();
        let last = self.links[sentinel as usize][PREV];
        self.links[last as usize][NEXT] = block;
        self.links[block as usize] = [last, sentinel];
        self.links[sentinel as usize][PREV] = block;
        self.len += 1;
    }

    /// Links `block`, which must not be linked, at the front (handed out next).
    pub(crate) fn push_front(&mut self, block: u32) {
        debug_assert!(!self.contains(block), "block {block} is already free");
        let sentinel = self.sentinel();
        let first = self.links[sentinel as usize][NEXT];
        self.links[first as usize][PREV] = block;
        self.links[block as usize] = [sentinel, first];
        self.links[sentinel as usize][NEXT] = block;
        self.len += 1;
    }

    /// Block ids front to back.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let sentinel = self.sentinel();
        std::iter::successors(Some(self.links[sentinel as usize][NEXT]), move |&b| {
            Some(self.links[b as usize][NEXT])
        })
        .take_while(move |&b| b != sentinel)
    }
}

impl FreeQueue for FreeBlockQueue {
    fn with_all_blocks(num_blocks: usize) -> crate::Result<Self> {
        Self::with_all_blocks(num_blocks)
    }
    fn len(&self) -> usize {
        Self::len(self)
    }
    fn contains(&self, block: u32) -> bool {
        Self::contains(self, block)
    }
    fn pop_front(&mut self) -> Option<u32> {
        Self::pop_front(self)
    }
    fn remove(&mut self, block: u32) {
        Self::remove(self, block);
    }
    fn push_back(&mut self, block: u32) {
        Self::push_back(self, block);
    }
    fn push_front(&mut self, block: u32) {
        Self::push_front(self, block);
    }
    fn ids(&self) -> Vec<u32> {
        self.iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_in_id_order_and_removes_from_the_middle() {
        let mut queue = FreeBlockQueue::with_all_blocks(5).unwrap();
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
        let mut queue = FreeBlockQueue::with_all_blocks(2).unwrap();
        assert_eq!(queue.pop_front(), Some(0));
        assert_eq!(queue.pop_front(), Some(1));
        assert_eq!(queue.pop_front(), None);
        queue.push_back(1);
        queue.push_front(0);
        assert_eq!(queue.iter().collect::<Vec<_>>(), [0, 1]);
        assert_eq!(queue.pop_front(), Some(0));
    }
}
