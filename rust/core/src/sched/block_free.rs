//! Deferred block frees (vLLM 0.33's `Scheduler.defer_block_free`). With several steps in
//! flight (async scheduling, pipeline parallelism), a request that finishes or is preempted
//! may still have its blocks written by a step that has not landed; a KV connector's load
//! into those blocks, reallocated, is not ordered against that write. With the flag on, the
//! steps that schedule any token are numbered (`sched_step_seq`), each stamps the requests
//! it serves (`Request::last_sched_seq`), and the engine reports each processed
//! (`step_processed`: `processed_step_seq`). A request whose last step is not processed
//! gives its blocks up at once (a preempted one resumes with fresh ones) but they return to
//! the pool only once the newest step scheduled at that moment has been processed (its
//! fence), in the order they were deferred. The allocation loop does not preempt such a
//! request: its blocks would not help this step.
//!
//! With `defer_async_loads` too (vLLM 0.33 sets it for HiSparse, which keeps reading a
//! released page until it is reused), an asynchronous KV load admitted while a step is in
//! flight is handed to the connector (`update_state_after_alloc`) only once that step is
//! processed; aborted before, it never started, so its blocks are freed (past the fence)
//! rather than held for a load that will not report.
//!
//! Block copies (vLLM 0.33's `SchedulerOutput.kv_cache_block_copies`, which its Mamba
//! manager queues for a copy-on-write): a copy queued with [`Scheduler::queue_block_copies`]
//! rides the next step's output, and its endpoints keep the references it was queued with
//! (blocks held outside any request, `kv::loose_blocks`) until that step is processed: with
//! the flag on they wait for the fence `sched_step_seq + 1` (the first step at or after it
//! that schedules any token), otherwise they are released as the step is formed (vLLM's
//! `_free_cow_retained_blocks`). Released earlier, an endpoint could be handed to a request
//! whose KV load overwrites it before the copy has run.
//!
//! Invariant: a slot in `queue` holds no live request and is not free; its blocks stay in
//! the pool's bookkeeping under that slot until it is drained. A copy's retained endpoints
//! hold loose references, at most one fence past the newest step.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::Scheduler;
use super::kv::Kv;
use crate::kv::{BlockId, RequestKey};
use crate::{Error, Result};

/// The fence counters and the blocks waiting for them.
#[derive(Debug, Default)]
pub(super) struct BlockFrees {
    pub(super) enabled: bool,
    /// Steps that scheduled any token since the flag was on (vLLM's `sched_step_seq`).
    pub(super) sched_step_seq: u64,
    /// Of those, steps the engine reported processed (vLLM's `processed_step_seq`).
    pub(super) processed_step_seq: u64,
    /// (fence step, what waits for it), oldest first (vLLM's `deferred_frees`).
    pub(super) queue: VecDeque<(u64, Deferred)>,
    /// Copies queued for the next step's output (vLLM's `_pending_cow_copies`, drained by
    /// `take_kv_cache_block_copies`): (source, destination), each endpoint retained.
    pub(super) copies: Vec<(BlockId, BlockId)>,
    /// vLLM's `defer_async_loads`.
    pub(super) defer_loads: bool,
    /// Loads not yet handed to the connector: (fence step, slot, external tokens), oldest
    /// first (vLLM's `deferred_loads`).
    pub(super) loads: Vec<(u64, u32, usize)>,
}

/// What a deferred free returns to the pool once its fence step is processed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Deferred {
    /// The blocks a gone request left under its slot, and the slot.
    Slot(u32),
    /// The retained endpoints of block copies, in the order queued, which is the order
    /// they are released (vLLM lists them reversed in `deferred_frees` and frees that
    /// list reversed).
    Retained(Vec<BlockId>),
}

impl<R: RequestKey> Scheduler<R> {
    /// Turns deferred block frees on or off (vLLM 0.33's `defer_block_free`, which its
    /// scheduler sets for a KV-consumer connector with several batches in flight, and its
    /// tests set by hand). Blocks already deferred keep waiting for their fence.
    pub fn set_defer_block_free(&mut self, defer: bool) {
        self.block_frees.enabled = defer;
    }

    pub fn defer_block_free(&self) -> bool {
        self.block_frees.enabled
    }

    /// Defers asynchronous KV loads admitted while a step is in flight until that step is
    /// processed (vLLM 0.33's `defer_async_loads`; it takes effect with `defer_block_free`,
    /// which numbers the steps).
    pub fn set_defer_async_loads(&mut self, defer: bool) {
        self.block_frees.defer_loads = defer;
    }

    pub fn defer_async_loads(&self) -> bool {
        self.block_frees.defer_loads
    }

    /// Requests whose asynchronous load waits for a step in flight before it starts.
    pub fn deferred_load_ids(&self) -> Vec<R> {
        let loads = &self.block_frees.loads;
        loads
            .iter()
            .map(|&(_, slot, _)| self.req(slot).request_id.clone())
            .collect()
    }

    /// Steps that scheduled any token while frees were deferred (vLLM's `sched_step_seq`).
    pub fn sched_step_seq(&self) -> u64 {
        self.block_frees.sched_step_seq
    }

    /// Of those, the steps reported processed (vLLM's `processed_step_seq`).
    pub fn processed_step_seq(&self) -> u64 {
        self.block_frees.processed_step_seq
    }

    /// The engine processed the output of the oldest step in flight that scheduled any
    /// token (vLLM 0.33 counts it at the top of `update_from_output`, while
    /// `defer_block_free` is on): every write of that step and the earlier ones is done,
    /// so the blocks whose fence it reaches return to the pool, oldest first. Call it before
    /// that step's `update_from_output`, as vLLM does: a request the update finishes is
    /// then freed at once if this was its last step.
    pub fn step_processed(&mut self) -> Result<()> {
        let frees = &mut self.block_frees;
        frees.processed_step_seq += 1;
        // vLLM's _drain_deferred_loads: in admission order, up to the first fence not reached.
        let processed = frees.processed_step_seq;
        let ready = frees.loads.iter().take_while(|l| l.0 <= processed).count();
        let started: Vec<_> = frees.loads.drain(..ready).collect();
        for (_, slot, num_external_tokens) in started {
            self.notify_allocation(slot, num_external_tokens)?;
        }
        // Fences are appended in order (each is the newest step when it is deferred), so
        // the first one not reached ends the drain.
        while let Some(&(fence, _)) = self.block_frees.queue.front() {
            if fence > self.block_frees.processed_step_seq {
                break;
            }
            match self.block_frees.queue.pop_front().expect("front checked").1 {
                Deferred::Slot(slot) => {
                    // vLLM frees the popped blocks of all groups in one call, last first.
                    self.free_kv_popped(slot)?;
                    self.free_slots.push(slot);
                }
                // Stored in the order queued, which is the order vLLM's drain frees them.
                Deferred::Retained(blocks) => self.kv.release_loose_blocks(&blocks)?,
            }
        }
        Ok(())
    }

    /// The deferred frees, oldest first: each fence step and the block ids waiting for it
    /// (with several KV groups, the first group's).
    pub fn deferred_frees(&self) -> Vec<(u64, Vec<BlockId>)> {
        let blocks = |deferred: &Deferred| match deferred {
            Deferred::Slot(slot) => self.kv.block_ids(*slot).unwrap_or_default().to_vec(),
            // vLLM lists a copy's retained endpoints reversed (`_free_cow_retained_blocks`).
            Deferred::Retained(blocks) => blocks.iter().rev().copied().collect(),
        };
        let queue = &self.block_frees.queue;
        queue.iter().map(|(fence, d)| (*fence, blocks(d))).collect()
    }

    /// vLLM 0.33's `BlockPool.get_new_blocks(num_blocks)` called directly: that many free
    /// blocks, each held once outside any request (to queue a copy between, or to keep
    /// from the requests) until [`Self::free_loose_blocks`] or a copy's release.
    ///
    /// Errors: `ConfigError` (`prefix_cache`) over the radix pool, whose pages carry no
    /// per-block state; `InputError` (`num_blocks`) when fewer are free.
    pub fn take_loose_blocks(&mut self, num_blocks: usize) -> Result<Vec<BlockId>> {
        self.kv.take_loose_blocks(num_blocks)
    }

    /// vLLM 0.33's `BlockPool.free_blocks` on blocks taken by [`Self::take_loose_blocks`]:
    /// drops one reference from each (first evicted first).
    ///
    /// Errors: `InputError` (`block_ids`) for a block without a reference left that no
    /// queued copy retains; nothing changes then.
    pub fn free_loose_blocks(&mut self, block_ids: &[BlockId]) -> Result<()> {
        self.check_unretained(block_ids, "block_ids")?;
        self.kv.release_loose_blocks(block_ids)
    }

    /// vLLM 0.33's `BlockPool.touch` called by a KV connector's scheduler side on blocks
    /// named by id (`SimpleCPUOffloadScheduler` keeps the GPU blocks it copies): one
    /// reference more on each, held outside any request until [`Self::free_loose_blocks`];
    /// a free block leaves the free queue with its cached hash, so it is not evicted
    /// meanwhile (a request freeing it leaves it held).
    ///
    /// Errors: `ConfigError` (`prefix_cache`) over the radix pool; `InputError`
    /// (`block_ids`) for an id that is not a block of the pool; nothing changes then.
    pub fn touch_loose_blocks(&mut self, block_ids: &[BlockId]) -> Result<()> {
        self.kv.touch_loose_blocks(block_ids)
    }

    /// Queues copies of block `src` into block `dst` for the next step's output
    /// (`SchedulerOutput::kv_cache_block_copies`; vLLM 0.33's managers append them to
    /// `_pending_cow_copies`). Each endpoint must hold a reference taken outside any
    /// request ([`Self::take_loose_blocks`]) that no queued copy retains yet: the copy
    /// keeps it until the step that carries it is processed.
    ///
    /// Errors: `InputError` (`kv_cache_block_copies`) naming an endpoint without such a
    /// reference, or a copy of a block onto itself; nothing is queued then.
    pub fn queue_block_copies(&mut self, copies: &[(BlockId, BlockId)]) -> Result<()> {
        if let Some(&(src, _)) = copies.iter().find(|(src, dst)| src == dst) {
            return Err(Error::input(
                "kv_cache_block_copies",
                src,
                "copies a block onto itself",
            ));
        }
        let endpoints: Vec<BlockId> = copies.iter().flat_map(|&(s, d)| [s, d]).collect();
        self.check_unretained(&endpoints, "kv_cache_block_copies")?;
        self.block_frees.copies.extend_from_slice(copies);
        Ok(())
    }

    /// The copies queued and not yet carried by a step.
    pub fn pending_block_copies(&self) -> &[(BlockId, BlockId)] {
        &self.block_frees.copies
    }

    /// Hands the queued copies to a step formed without `schedule()` (vLLM 0.33's paused
    /// scheduler still drains them into its empty output), releasing their endpoints as
    /// that step's would be: at once, or under deferred frees at the fence of the next
    /// step that schedules any token.
    #[inline]
    pub fn take_pending_block_copies(&mut self) -> Vec<(BlockId, BlockId)> {
        if self.block_frees.copies.is_empty() {
            return Vec::new();
        }
        self.take_block_copies()
    }

    /// `InputError` (`field`) unless each of `blocks` (counted with repeats) holds loose
    /// references beyond those queued or deferred copies retain.
    fn check_unretained(&self, blocks: &[BlockId], field: &'static str) -> Result<()> {
        let frees = &self.block_frees;
        let pending = frees.copies.iter().flat_map(|&(s, d)| [s, d]);
        let deferred = frees.queue.iter().flat_map(|(_, d)| match d {
            Deferred::Retained(blocks) => blocks.as_slice(),
            Deferred::Slot(_) => &[],
        });
        // References each block needs: those retained already, then each of `blocks`.
        let mut needed: FxHashMap<BlockId, u32> = FxHashMap::default();
        for block in pending.chain(deferred.copied()) {
            *needed.entry(block).or_default() += 1;
        }
        for &block in blocks {
            let count = needed.entry(block).or_default();
            *count += 1;
            if *count > self.kv.loose_refs(block) {
                return Err(Error::input(
                    field,
                    block,
                    "holds no reference taken outside a request (take_loose_blocks) that a \
                     queued copy does not already retain",
                ));
            }
        }
        Ok(())
    }

    /// The copies the step being formed carries (vLLM 0.33's `take_kv_cache_block_copies`
    /// and `_free_cow_retained_blocks`): their endpoints are released now, or with
    /// deferred frees on, once the first step at or after this one that schedules any
    /// token is processed (`sched_step_seq + 1`; `stamp_step` numbers it after).
    #[cold]
    #[inline(never)]
    pub(super) fn take_block_copies(&mut self) -> Vec<(BlockId, BlockId)> {
        let copies = std::mem::take(&mut self.block_frees.copies);
        let retained: Vec<BlockId> = copies.iter().flat_map(|&(s, d)| [s, d]).collect();
        let frees = &mut self.block_frees;
        let fence = frees.sched_step_seq + 1;
        if frees.enabled && fence > frees.processed_step_seq {
            frees.queue.push_back((fence, Deferred::Retained(retained)));
        } else if let Err(err) = self.kv.release_loose_blocks(&retained) {
            // Queued only with the references checked, and released once: our bug.
            debug_assert!(false, "{err}");
        }
        copies
    }

    /// Whether the asynchronous load being admitted for `slot` waits for the step in flight;
    /// if so it is queued (and the request stamped with the newest step, as vLLM does).
    pub(super) fn defer_load(&mut self, slot: u32, num_external_tokens: usize) -> bool {
        let frees = &self.block_frees;
        if !frees.defer_loads || frees.sched_step_seq <= frees.processed_step_seq {
            return false;
        }
        let fence = frees.sched_step_seq;
        self.req_mut(slot).last_sched_seq = fence;
        self.block_frees
            .loads
            .push((fence, slot, num_external_tokens));
        true
    }

    /// Drops the deferred load of `slot`, if any: it never started. Returns whether there
    /// was one.
    pub(super) fn drop_deferred_load(&mut self, slot: u32) -> bool {
        let loads = &mut self.block_frees.loads;
        let before = loads.len();
        loads.retain(|&(_, s, _)| s != slot);
        loads.len() != before
    }

    /// A request last scheduled in step `last_sched_seq` may give its blocks back now
    /// (vLLM's `_request_blocks_can_be_freed`).
    pub(super) fn blocks_can_be_freed(&self, last_sched_seq: u64) -> bool {
        !self.block_frees.enabled || last_sched_seq <= self.block_frees.processed_step_seq
    }

    /// Numbers a step that scheduled `scheduled` (non-empty) and stamps its requests (the
    /// end of vLLM 0.33's `schedule()` and its `_update_after_schedule`).
    pub(super) fn stamp_step(&mut self, scheduled: &[(u32, usize)]) {
        if !self.block_frees.enabled || scheduled.is_empty() {
            return;
        }
        self.block_frees.sched_step_seq += 1;
        let seq = self.block_frees.sched_step_seq;
        for &(slot, _) in scheduled {
            self.req_mut(slot).last_sched_seq = seq;
        }
    }

    /// Frees the blocks of `slot`, whose request is gone (finished; its `slots` entry
    /// taken), and the slot itself, or defers both to the newest step's fence when the
    /// request was last scheduled in a step not yet processed (vLLM's
    /// `_free_request_blocks`).
    pub(super) fn free_or_defer(&mut self, slot: u32, last_sched_seq: u64) -> Result<()> {
        let holds_blocks = self.kv.block_ids(slot).is_some();
        if holds_blocks && !self.blocks_can_be_freed(last_sched_seq) {
            let fence = self.block_frees.sched_step_seq;
            self.block_frees
                .queue
                .push_back((fence, Deferred::Slot(slot)));
            return Ok(());
        }
        if holds_blocks {
            self.free_kv(slot)?;
        }
        self.free_slots.push(slot);
        Ok(())
    }

    /// Preempting the request at `slot`: frees its blocks, or, when a step not processed
    /// may still write them, leaves them under `slot` until its fence and moves the request
    /// to a fresh slot (vLLM pops the request's blocks from its manager and queues them).
    /// Returns the slot the request lives at now.
    pub(super) fn free_preempted(&mut self, slot: u32) -> Result<u32> {
        let last = self.req(slot).last_sched_seq;
        if self.blocks_can_be_freed(last) || self.kv.block_ids(slot).is_none() {
            if self.kv.block_ids(slot).is_some() {
                self.free_kv(slot)?;
            }
            return Ok(slot);
        }
        let request = self.slots[slot as usize]
            .take()
            .expect("preempted slot is live");
        let id = request.request_id.clone();
        self.settle_kv_cache_calls();
        let fresh = match self.free_slots.pop() {
            Some(fresh) => {
                self.slots[fresh as usize] = Some(request);
                fresh
            }
            None => {
                self.slots.push(Some(request));
                (self.slots.len() - 1) as u32
            }
        };
        self.own_kv_slot(fresh, &id);
        self.index.insert(id, fresh);
        let fence = self.block_frees.sched_step_seq;
        self.block_frees
            .queue
            .push_back((fence, Deferred::Slot(slot)));
        Ok(fresh)
    }

    /// Describes a broken invariant of the deferred frees, if any.
    pub(super) fn check_block_frees(&self) -> std::result::Result<(), String> {
        let mut last_fence = 0;
        let mut last_copy_fence = 0;
        let newest = self.block_frees.sched_step_seq;
        for (fence, deferred) in &self.block_frees.queue {
            let fence = *fence;
            let slot = match deferred {
                Deferred::Slot(slot) => *slot,
                // A copy's fence may lead the slots' by one step (vLLM's note in
                // `_drain_deferred_frees`).
                Deferred::Retained(blocks) => {
                    if fence < last_copy_fence || fence > newest + 1 {
                        return Err(format!("retained copy endpoints have fence {fence}"));
                    }
                    if let Some(b) = blocks.iter().find(|&&b| self.kv.loose_refs(b) == 0) {
                        return Err(format!("retained copy endpoint {b} holds no reference"));
                    }
                    last_copy_fence = fence;
                    continue;
                }
            };
            if self.slots[slot as usize].is_some() || self.free_slots.contains(&slot) {
                return Err(format!(
                    "slot {slot} waits for its fence but is live or free"
                ));
            }
            if fence < last_fence || fence > newest {
                return Err(format!(
                    "deferred free of slot {slot} has fence {fence} out of order"
                ));
            }
            last_fence = fence;
        }
        for &(_, slot, _) in &self.block_frees.loads {
            let loading = self.slots[slot as usize]
                .as_ref()
                .is_some_and(|r| r.status == super::RequestStatus::WaitingForRemoteKvs);
            if !loading {
                return Err(format!(
                    "slot {slot} has a deferred load but is not loading"
                ));
            }
        }
        Ok(())
    }
}

/// The pool's blocks held outside any request, whichever pool it is.
impl Kv {
    fn take_loose_blocks(&mut self, num_blocks: usize) -> Result<Vec<BlockId>> {
        match self {
            Kv::BlockHash(p) => p.take_loose_blocks(num_blocks),
            Kv::Radix(_) => Err(radix_blocks()),
            Kv::Hybrid(h) => h.pool.take_loose_blocks(num_blocks),
        }
    }

    fn touch_loose_blocks(&mut self, block_ids: &[BlockId]) -> Result<()> {
        match self {
            Kv::BlockHash(p) => p.touch_loose_blocks(block_ids),
            Kv::Radix(_) => Err(radix_blocks()),
            Kv::Hybrid(h) => h.pool.touch_loose_blocks(block_ids),
        }
    }

    fn release_loose_blocks(&mut self, ordered: &[BlockId]) -> Result<()> {
        match self {
            Kv::BlockHash(p) => p.release_loose_blocks(ordered),
            Kv::Radix(_) => Err(radix_blocks()),
            Kv::Hybrid(h) => h.pool.release_loose_blocks(ordered),
        }
    }

    /// The references on `block` held outside any request (0 over the radix pool).
    fn loose_refs(&self, block: BlockId) -> u32 {
        match self {
            Kv::BlockHash(p) => p.loose_refs(block),
            Kv::Radix(_) => 0,
            Kv::Hybrid(h) => h.pool.loose_refs(block),
        }
    }
}

fn radix_blocks() -> Error {
    Error::config(
        "prefix_cache",
        "radix",
        "blocks held outside a request need the block-hash pool (the radix pool's pages \
         carry no per-block state)",
    )
}
