//! Coalesced decode steps: a run of steps in which every running request decodes one token
//! and nothing else can happen, applied lazily. The simulator uses it (`sim::replica::v1`);
//! what it skips is the per-step work of `schedule()` and `append_one_token_each` for every
//! request, not any decision.
//!
//! A window opens only when a step would schedule exactly the running requests, one decode
//! token each (not a prompt's last token), in running order: nothing waits, no request has
//! work in flight, drafts, stop tokens or a connector, the token budget covers them all,
//! and the pool is the block-hash one without a host tier or vLLM's coordinator over KV
//! groups (whose chunked local groups, if any, have chunks a whole number of blocks long).
//! A request leaves the window at the end of the step whose token finishes it
//! (`end_decode_step` finishes it then, freeing its blocks, as stepping does). The window
//! lasts until its last request finishes, or until a step whose new blocks the free ones
//! cannot cover (stepping would preempt there: `form_decode_step` declines it), or until
//! the caller cuts it. A new request does not have to end it: a window step may admit
//! waiting requests, and requests whose prefill sampled join it (`multistep_admit`); a
//! request that joined after step `start` computes, at step `j`, its token
//! `base + j - start - 1`.
//!
//! Within the window each request's tokens and computed count lag behind, and are caught up
//! only at the steps where the pool does something for it: a new block (which may evict a
//! cached one) and, with prefix caching, a block becoming full (hashed and cached). Both
//! recur every `block_size` steps, so the requests are bucketed by step modulo the block
//! size. Catch-ups run in step order and, within a step, in running order, so the pool makes
//! the same moves, in the same order, with the same cache events, as stepping one by one.
//! Invariant: after `form_decode_step` for step `j`, the pool's block counts (free blocks,
//! usage, events) are those of the stepped run once step `j` is scheduled; after
//! `catch_up_all`, every request's state is too.
//!
//! Several KV groups. A window group also frees, at a decode step, the blocks its next
//! token no longer attends to (`remove_skipped_blocks`, before the step's allocation): a
//! sliding window of `w` tokens drops one at the steps where `base + s - w` is a multiple
//! of the block size, a third bucket; a chunked local group drops its chunk's blocks when
//! the chunk ends, a step that allocates when the chunk is a whole number of blocks (other
//! chunk sizes open no window). The first step also acts for every request that has blocks
//! to drop then (a prefill drops nothing, so its first decode may drop many). Each catch-up
//! of several steps runs as two allocations: the lagging steps', in which the pool did
//! nothing, then the current step's, from the computed count stepping has there, so it
//! drops what stepping drops. A step is formed only if, in running order, each request's
//! new blocks (all groups) fit the free blocks plus those freed so far in the step,
//! counting as freed only blocks a request holds alone: a shared block may be freed by
//! another's drop first, which the count does not see, so a step stepping would run may end
//! the window (then stepped), while a step that would preempt never runs in one.

use super::Scheduler;
use super::request::{FinishReason, RequestStatus};
use crate::kv::{KvGroupSpec, RequestKey, TokenId};
use crate::{Error, Result};

/// A run of decode steps over the running requests (see the module doc). Requests are
/// numbered by their place in the running order when it opened.
#[derive(Debug, Clone, Default)]
pub struct DecodeWindow {
    pub(super) slots: Vec<u32>,
    /// Computed tokens when the request joined, after `start` steps of the window (0 for
    /// those it opened with); step `j > start` computes token `base + j - start - 1`.
    pub(super) base: Vec<usize>,
    pub(super) start: Vec<usize>,
    /// The step at whose end each request finishes.
    pub(super) last: Vec<usize>,
    /// The first step that needs a new block for it (then every `block_size` steps).
    pub(super) first_alloc: Vec<usize>,
    /// By step modulo the block size: the requests the pool acts for at such steps, in
    /// running order.
    pub(super) buckets: Vec<Vec<u32>>,
    /// Steps in the window, if it runs to its end.
    pub(super) num_steps: usize,
    /// Steps scheduled so far.
    pub(super) formed: usize,
    /// (last step, request) in that order; `next_finish` is the first not yet finished.
    pub(super) finishes: Vec<(u32, u32)>,
    pub(super) next_finish: usize,
    /// Requests finished by `end_decode_step`.
    pub(super) done: Vec<bool>,
    /// Over the KV groups' coordinator (see "Several KV groups" in the module doc).
    pub(super) hybrid: bool,
    /// The caller cut the window: no request joins it.
    pub(super) cut: bool,
    /// The requests the pool acts for in the step being formed (KV groups only).
    acting: Vec<u32>,
    /// The last `num_new_decode_blocks` answer, keyed by its step, the window's length and
    /// its finishes (what the answer reads): asked before a step is formed and again
    /// when it is.
    new_blocks_memo: std::cell::Cell<(usize, usize, usize, usize)>,
}

impl DecodeWindow {
    /// Empties the window for the requests `running`, keeping its buffers.
    fn reset(&mut self, running: &[u32], block_size: usize) {
        self.slots.clear();
        self.slots.extend_from_slice(running);
        self.base.clear();
        self.start.clear();
        self.last.clear();
        self.first_alloc.clear();
        self.buckets.resize_with(block_size, Vec::new);
        for bucket in &mut self.buckets {
            bucket.clear();
        }
        self.num_steps = 0;
        self.formed = 0;
        self.finishes.clear();
        self.next_finish = 0;
        self.done.clear();
        self.done.resize(running.len(), false);
        self.hybrid = false;
        self.cut = false;
        self.new_blocks_memo.set((0, 0, 0, 0));
    }

    pub fn num_steps(&self) -> usize {
        self.num_steps
    }

    /// Steps scheduled so far.
    pub fn num_formed(&self) -> usize {
        self.formed
    }

    /// Ends the window after the steps already scheduled.
    pub fn cut(&mut self) {
        self.num_steps = self.formed;
        self.cut = true;
    }

    /// Whether request `i` is in step `step`.
    pub fn runs_in(&self, i: usize, step: usize) -> bool {
        self.last[i] >= step
    }

    /// Whether request `i` joined the window after its latest step was scheduled (its
    /// token of that step was not the window's to give: `multistep_admit`).
    pub fn joined_after(&self, i: usize) -> bool {
        self.start[i] == self.formed && self.formed > 0
    }
}

impl<R: RequestKey> Scheduler<R> {
    /// A window of coalesced decode steps from the current state, or `None` if the next
    /// step is not one (see the module doc) or the window would be a single step. Changes
    /// nothing.
    pub fn open_decode_window(&self) -> Option<DecodeWindow> {
        let mut window = DecodeWindow::default();
        self.open_decode_window_in(&mut window).then_some(window)
    }

    /// [`Self::open_decode_window`] into `window`, reusing its buffers (a replica opens a
    /// window every few steps); `false`: none opens, and `window` holds nothing valid.
    pub fn open_decode_window_in(&self, window: &mut DecodeWindow) -> bool {
        let coalescible = self.plugin.is_none()
            && self.connector.is_none()
            && !self.async_scheduling
            && self.waiting.len() == 0
            && !self.running.is_empty()
            && self.running.len() <= self.config.step_token_cap()
            && self.config.num_lookahead_tokens == 0
            // A window charges each request one token and no draft slots.
            && self.config.num_draft_slots_per_request == 0
            && self.config.host_num_blocks == 0
            // HiSparse host pages are charged step by step (sched::hisparse).
            && self.host_pages.is_none()
            // The prefill cadence counts executed steps, which a window does not advance.
            && self.config.prefill_schedule_interval == 1
            && (self.kv.is_block_hash() || self.kv.hybrid_groups().is_some())
            && self.finished_in_flight.is_empty()
            && self.landed.is_empty()
            && self.failed_loads.is_empty();
        if !coalescible {
            return false;
        }
        let bs = self.config.block_size;
        window.reset(&self.running, bs);
        // Steps modulo the block size at which a window group may drop blocks, as
        // (window size or chunk size) residues: see the module doc.
        let mut windows = [0usize; 4];
        let mut num_windows = 0;
        if let Some(groups) = self.kv.hybrid_groups() {
            window.hybrid = true;
            for spec in groups {
                match *spec {
                    KvGroupSpec::SlidingWindow { sliding_window } => {
                        // Blocks leave a window `extra_retained_tokens` later.
                        let extra = self.config.kv_window_extra_retained_tokens;
                        let w = (sliding_window + extra) % bs;
                        if !windows[..num_windows].contains(&w) {
                            if num_windows == windows.len() {
                                return false;
                            }
                            windows[num_windows] = w;
                            num_windows += 1;
                        }
                    }
                    // Bounded replay rewinds admissions behind the coordinator's count.
                    KvGroupSpec::SlidingWindowReplay { .. } => return false,
                    // A slot per block frees the previous state the step after the one that
                    // opens a block: a step no bucket visits, so such requests are stepped.
                    KvGroupSpec::MambaPerBlock { .. } => return false,
                    // A chunk a whole number of blocks long ends at a step that allocates.
                    KvGroupSpec::ChunkedLocalAttention {
                        attention_chunk_size,
                    } if !attention_chunk_size.is_multiple_of(bs) => return false,
                    _ => {}
                }
            }
        }
        for (i, &slot) in self.running.iter().enumerate() {
            let Some(last) = self.window_steps_left(slot) else {
                return false;
            };
            let base = self.req(slot).num_computed_tokens;
            let held = self.kv.block_ids(slot).map_or(0, <[_]>::len);
            // Step s needs slots for base + s tokens: a new block at the step whose token
            // opens one. With caching, the step whose token fills a block caches it.
            let mut first_alloc = (held * bs + 1).saturating_sub(base).max(1);
            if window.hybrid {
                // Group 0 may be a one-block Mamba group: every other group takes a
                // block at the steps whose token opens one (`form_hybrid_decode_step`
                // counts them), so only the residue matters.
                first_alloc = (bs + 1 - base % bs) % bs;
            }
            window.buckets[first_alloc % bs].push(i as u32);
            let fills = (bs - base % bs) % bs;
            if self.config.enable_prefix_caching && fills != first_alloc % bs {
                window.buckets[fills].push(i as u32);
            }
            // Step s drops the window's blocks when base + s - w is a multiple of bs.
            for (k, &w) in windows[..num_windows].iter().enumerate() {
                let drops = (w + bs - base % bs) % bs;
                let seen = drops == first_alloc % bs
                    || (self.config.enable_prefix_caching && drops == fills)
                    || windows[..k]
                        .iter()
                        .any(|&v| (v + bs - base % bs) % bs == drops);
                if !seen {
                    window.buckets[drops].push(i as u32);
                }
            }
            window.base.push(base);
            window.start.push(0);
            window.last.push(last);
            window.first_alloc.push(first_alloc);
            window.num_steps = window.num_steps.max(last);
        }
        if window.num_steps < 2 {
            return false;
        }
        for bucket in &mut window.buckets {
            bucket.sort_unstable();
        }
        let finishes = (window.last.iter().enumerate()).map(|(i, &l)| (l as u32, i as u32));
        window.finishes.extend(finishes);
        window.finishes.sort_unstable();
        true
    }

    /// The window steps the request at `slot` decodes in if it joins one now (the step at
    /// whose end it finishes, counted from the next), or `None` if a step would not give it
    /// exactly one decode token and nothing else (see the module doc).
    pub(super) fn window_steps_left(&self, slot: u32) -> Option<usize> {
        let r = self.req(slot);
        // A prompt's last token is a one-token step too, but a prefill chunk's: with
        // `prioritize_prefill` it is scheduled first, and its flags differ.
        let decoding = r.status == RequestStatus::Running
            && !r.is_prefilling()
            && r.num_computed_tokens + 1 == r.num_tokens()
            && r.num_output_placeholders == 0
            && r.num_sampling_steps() == 0
            && r.spec_token_ids.is_empty()
            && r.spec.stop_token_ids.is_empty()
            && r.spec.repetition_detection.is_none()
            && (r.spec.ignore_eos || r.spec.eos_token_id.is_none());
        // Step s appends the request's (num_output + s)-th output: it finishes at the first
        // s reaching max_tokens or max_model_len (`stop_reason`); no step clamps it before
        // (its room under max_model_len stays >= 1 until then).
        decoding.then(|| {
            (r.spec.max_tokens - r.num_output_tokens())
                .min(self.config.max_model_len.saturating_sub(r.num_tokens()))
        })
    }

    /// Schedules the window's next step: the pool's moves of that step happen now (see the
    /// module doc). `token(id, position)` is the token a request sampled at `position`.
    /// Returns `false`, changing nothing, if the step's new blocks do not fit the free
    /// ones: stepping would preempt, so the window ends before it.
    pub fn form_decode_step(
        &mut self,
        window: &mut DecodeWindow,
        mut token: impl FnMut(&R, usize) -> TokenId,
    ) -> Result<bool> {
        if window.formed >= window.num_steps {
            return Err(Error::Internal(
                "a decode window ran past its last step".into(),
            ));
        }
        let step = window.formed + 1;
        let bs = self.config.block_size;
        if window.hybrid {
            return self.form_hybrid_decode_step(window, token);
        }
        if self.num_new_decode_blocks(window, step) > self.kv.num_free_blocks() {
            return Ok(false);
        }
        window.formed = step;
        self.num_steps += 1;
        self.num_executed_steps += 1;
        // A stepped schedule() reports these with its output; nobody reads them here.
        self.finished_since_last_step.clear();
        let window = &*window;
        for &i in &window.buckets[step % bs] {
            if !window.done[i as usize] && window.last[i as usize] >= step {
                self.catch_up(window, i as usize, &mut token)?;
            }
        }
        Ok(true)
    }

    /// New blocks the window's step `step` takes (one KV group).
    fn num_new_decode_blocks(&self, window: &DecodeWindow, step: usize) -> usize {
        let key = (step, window.slots.len(), window.next_finish);
        let (s, len, finished, count) = window.new_blocks_memo.get();
        if (s, len, finished) == key {
            return count;
        }
        let count = self.count_new_decode_blocks(window, step);
        window.new_blocks_memo.set((key.0, key.1, key.2, count));
        count
    }

    fn count_new_decode_blocks(&self, window: &DecodeWindow, step: usize) -> usize {
        let bs = self.config.block_size;
        let in_step = |i: usize| !window.done[i] && window.last[i] >= step;
        (window.buckets[step % bs].iter().map(|&i| i as usize))
            .filter(|&i| in_step(i) && step >= window.first_alloc[i])
            .filter(|&i| (step - window.first_alloc[i]).is_multiple_of(bs))
            .count()
    }

    /// Whether [`Self::form_decode_step`] would schedule the window's next step now (its
    /// new blocks fit the free ones). Over KV groups, whose check frees blocks as it goes,
    /// `false`: unsure.
    pub fn next_decode_step_fits(&self, window: &DecodeWindow) -> bool {
        let step = window.formed + 1;
        !window.hybrid
            && window.formed < window.num_steps
            && self.num_new_decode_blocks(window, step) <= self.kv.num_free_blocks()
    }

    /// [`Self::form_decode_step`] over the KV groups' coordinator. The first step acts for
    /// its bucket's requests and those whose groups drop blocks (a prefill allocates
    /// without dropping, so its first decode step may drop many), the later ones for their
    /// bucket's. In running order, each request first
    /// frees what its groups stop attending to, then takes its new blocks; the step is
    /// declined if one would not find them free, counting as freed only the blocks it holds
    /// alone (so a step stepping would run may be declined, one it would preempt never
    /// runs).
    fn form_hybrid_decode_step(
        &mut self,
        window: &mut DecodeWindow,
        mut token: impl FnMut(&R, usize) -> TokenId,
    ) -> Result<bool> {
        let step = window.formed + 1;
        let bs = self.config.block_size;
        let in_step = |i: usize| !window.done[i] && window.last[i] >= step;
        let mut acting = std::mem::take(&mut window.acting);
        acting.clear();
        let bucket = &window.buckets[step % bs];
        if step == 1 {
            // A request whose groups drop nothing at this step and which is not in its
            // bucket does nothing here either.
            let mut in_bucket = bucket.iter().copied().peekable();
            for i in 0..window.slots.len() as u32 {
                let listed = in_bucket.next_if_eq(&i).is_some();
                let (slot, computed) = (window.slots[i as usize], window.base[i as usize]);
                let acts = listed || self.kv.num_skipped_blocks(slot, computed).0 > 0;
                if acts && in_step(i as usize) {
                    acting.push(i);
                }
            }
        } else {
            acting.extend(bucket.iter().copied().filter(|&i| in_step(i as usize)));
        }
        let mut free = self.kv.num_free_blocks();
        let mut fits = true;
        for &i in &acting {
            let i = i as usize;
            let (slot, computed) = (window.slots[i], window.base[i] + step - 1 - window.start[i]);
            free += self.kv.num_skipped_blocks(slot, computed).1;
            let needed = self.kv.num_new_group_blocks(slot, computed + 1);
            if needed > free {
                fits = false;
                break;
            }
            free -= needed;
        }
        if fits {
            window.formed = step;
            self.num_steps += 1;
            self.num_executed_steps += 1;
            self.finished_since_last_step.clear();
            for &i in &acting {
                self.catch_up(window, i as usize, &mut token)?;
            }
        }
        window.acting = acting;
        Ok(fits)
    }

    /// Ends the window's latest step, one that is not its last: the requests whose final
    /// token it sampled finish, in running order, as stepping finishes them; the others'
    /// tokens stay lazy. Returns the finished requests.
    pub fn end_decode_step(
        &mut self,
        window: &mut DecodeWindow,
        mut token: impl FnMut(&R, usize) -> TokenId,
    ) -> Result<Vec<(R, FinishReason)>> {
        let step = window.formed as u32;
        let mut finished = Vec::new();
        while let Some(&(s, i)) = window.finishes.get(window.next_finish) {
            if s > step {
                break;
            }
            window.next_finish += 1;
            self.catch_up(window, i as usize, &mut token)?;
            let id = self.req(window.slots[i as usize]).request_id.clone();
            let done = self.append_one_token_each(std::slice::from_ref(&id), &mut token)?;
            if done.is_empty() {
                return Err(Error::Internal(
                    "a coalesced decode step's request did not finish when planned".into(),
                ));
            }
            finished.extend(done);
            window.done[i as usize] = true;
        }
        Ok(finished)
    }

    /// Brings every request still in the window to where stepping would have it with the
    /// latest step scheduled (and, if the caller ended it, its unfinished requests' tokens
    /// not yet appended). The window's later steps must not run.
    pub fn catch_up_all(
        &mut self,
        window: &mut DecodeWindow,
        mut token: impl FnMut(&R, usize) -> TokenId,
    ) -> Result<()> {
        for i in 0..window.slots.len() {
            if !window.done[i] {
                self.catch_up(window, i, &mut token)?;
            }
        }
        window.num_steps = window.formed;
        Ok(())
    }

    /// Request `i` of the window as stepping has it once step `formed` is scheduled: the
    /// outputs of the steps before it appended, the step's token computed, slots for it.
    fn catch_up(
        &mut self,
        window: &DecodeWindow,
        i: usize,
        token: &mut impl FnMut(&R, usize) -> TokenId,
    ) -> Result<()> {
        let slot = window.slots[i];
        let computed = window.base[i] + window.formed - window.start[i];
        let request = self.slots[slot as usize]
            .as_mut()
            .expect("a window's request is live");
        if request.num_computed_tokens == computed {
            return Ok(());
        }
        while request.num_tokens() < computed {
            let t = token(&request.request_id, request.num_tokens());
            request.all_token_ids.push(t);
        }
        let n = computed - request.num_computed_tokens;
        if !window.hybrid {
            // The pool takes the tokens past those it knows of the request.
            let token_ids = &request.all_token_ids[..computed];
            let allocated = (self.kv).allocate_after_known(slot, token_ids, n, 0, false, 0)?;
            if allocated.is_none() {
                return Err(Error::Internal(
                    "a coalesced decode step found no free block (the window was planned wrong)"
                        .into(),
                ));
            }
            self.caught_up(slot, computed, n);
            return Ok(());
        }
        let mut known = self.kv.num_tokens(slot).unwrap_or(0);
        if n > 1 {
            // The steps before this one, in which the pool did nothing for the request, in
            // one allocation; this step's own, from their computed count, drops what its
            // window groups no longer attend to as the stepped one does.
            let lagged = &request.all_token_ids[known..computed - 1];
            let allocated = (self.kv).allocate(slot, lagged, n - 1, 0, None, None, false)?;
            if allocated.is_none() {
                return Err(Error::Internal(
                    "a coalesced decode step's lagging tokens found no free block".into(),
                ));
            }
            known = computed - 1;
        }
        let new_tokens = &request.all_token_ids[known..computed];
        let last = n.min(1);
        let allocated = self
            .kv
            .allocate(slot, new_tokens, last, 0, None, None, false)?;
        if allocated.is_none() {
            return Err(Error::Internal(
                "a coalesced decode step found no free block (the window was planned wrong)".into(),
            ));
        }
        self.caught_up(slot, computed, n);
        Ok(())
    }

    /// The request's state once its `n` lagging tokens up to `computed` have slots.
    fn caught_up(&mut self, slot: u32, computed: usize, n: usize) {
        let request = self.req_mut(slot);
        request.num_computed_tokens = computed;
        request.in_flight_tokens.clear();
        let step = request.last_step;
        request.in_flight_tokens.push_back((step, n));
        request.last_num_spec_tokens = 0;
    }
}
