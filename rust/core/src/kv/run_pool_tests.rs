//! The differential test of the block pool as the simulator runs it ([`RunBlockPool`]: a
//! free queue of runs, and trace blocks' KV blocks indexed per trace block, `named_cache`)
//! against vLLM's linked-list pool with a map slot per cached block ([`BlockPool`] with
//! `with_per_block_map`): seeded random streams of what a replay does to a pool, applied
//! to both, comparing after every operation the block ids each returns, the hit tokens
//! (GPU and host), the free blocks in eviction order, every block's ref count and hash,
//! the cache events and the stats.
//!
//! A stream's requests have prompts made of trace blocks, named by id as the simulator
//! names them (`kv::hash_block_id`), and a tail hashed from tokens, drawn from few families
//! so that prefixes repeat (hits, copies of a hash computed twice). Operations: admit (a
//! lookup, then the first allocation of a prefill chunk, or a KV connector's load of the
//! rest), prefill chunks, decode steps with lookahead and speculative tokens rewound and
//! accepted (`cache_blocks`), finish (vLLM's reverse-order free), preempt (free, retry with
//! the prompt's names kept), loads landing, reset of the prefix cache, the admission gate
//! (`full_sequence_fits`). Pools are small, so allocations evict and fail; some streams
//! have a host tier, some record events, LoRA keys vary per request.
//!
//! CI runs `DEFAULT_SEEDS` streams; `TOKENYARD_RUN_POOL_SEEDS=N` runs N.

use super::block_hash::{BlockHash, LOOKALIKE_TOKEN, LOOKALIKES_MADE, content_block, hash_content};
use super::cache_map::{PLANTED_RUN_PAST_KEY, PLANTED_RUN_TAIL_KEPT};
use super::named_cache::{PLANTED_RUN_READ_PAST, PLANTED_WRONG_SLOT};
use super::run_queue::PLANTED_SWAP;
use super::{BlockPool, BlockPoolStats, ComputedBlocks, KvCapacity, RunBlockPool, TokenId};

const DEFAULT_SEEDS: u64 = 1500;
const OPS_PER_STREAM: usize = 160;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: seeded, enough for choosing operations.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// One stream's pool shape.
struct Shape {
    num_blocks: usize,
    block_size: usize,
    /// KV blocks per trace block.
    per_trace: usize,
    host_blocks: usize,
    events: bool,
    caching: bool,
}

#[derive(Clone)]
struct Req {
    id: u32,
    /// Known token ids: the prompt, then outputs.
    tokens: Vec<TokenId>,
    /// Names of the KV blocks inside the prompt's trace blocks (the simulator's
    /// `Request::prompt_block_hashes`, kept across preemption).
    named: Vec<BlockHash>,
    lora: Option<u64>,
    num_computed: usize,
    /// A KV connector's load whose blocks have not landed.
    loading: bool,
}

/// The two pools, stepped together.
struct Twin {
    linked: BlockPool<u32>,
    runs: RunBlockPool<u32>,
    shape: Shape,
}

/// Runs `$call` on both pools (`$p` bound to each) and returns the answer, or an `Err`
/// naming the operation when they differ.
macro_rules! both {
    ($twin:expr, $what:expr, $p:ident => $call:expr) => {{
        let a = {
            let $p = &mut $twin.linked;
            $call
        };
        let b = {
            let $p = &mut $twin.runs;
            $call
        };
        if a != b {
            return Err(format!("{}: linked {:?}, runs {:?}", $what, a, b));
        }
        a
    }};
    // With `$x` bound to each pool's own value of a pair (its hit).
    ($twin:expr, $what:expr, ($p:ident, $x:ident) in $pair:expr => $call:expr) => {{
        let a = {
            let ($p, $x) = (&mut $twin.linked, &$pair.0);
            $call
        };
        let b = {
            let ($p, $x) = (&mut $twin.runs, &$pair.1);
            $call
        };
        if a != b {
            return Err(format!("{}: linked {:?}, runs {:?}", $what, a, b));
        }
        a
    }};
}

/// What a hit says, comparable across pools.
fn hit_view(hit: &ComputedBlocks) -> (Vec<u32>, usize, usize) {
    (
        hit.block_ids.clone(),
        hit.num_computed_tokens,
        hit.num_host_blocks,
    )
}

impl Twin {
    fn new(shape: Shape) -> Self {
        let build = |host: usize| {
            let pool = BlockPool::new(shape.num_blocks, shape.block_size, shape.caching).unwrap();
            let mut pool = match host {
                0 => pool,
                n => pool.with_host_tier(n).unwrap(),
            };
            if shape.events {
                pool.enable_events();
            }
            pool
        };
        let linked = build(shape.host_blocks).with_per_block_map();
        let runs = {
            let pool =
                RunBlockPool::over_runs(shape.num_blocks, shape.block_size, shape.caching).unwrap();
            let mut pool = match shape.host_blocks {
                0 => pool,
                n => pool.with_host_tier(n).unwrap(),
            };
            if shape.events {
                pool.enable_events();
            }
            pool
        };
        Self {
            linked,
            runs,
            shape,
        }
    }

    /// Everything observable after an operation.
    fn compare_state(&mut self) -> Result<(), String> {
        both!(self, "free blocks", p => p.free_block_ids());
        both!(self, "free count", p => p.num_free_blocks());
        let n = self.shape.num_blocks as u32;
        both!(self, "block states", p => (0..n)
            .map(|b| (p.ref_count(b), p.block_hash(b)))
            .collect::<Vec<_>>());
        both!(self, "events", p => p.drain_events());
        both!(self, "stats", p => p.stats());
        self.runs.check_invariants()
    }
}

/// A request's prompt: `num_trace` trace blocks from `family`'s sequence (so prompts of a
/// family share prefixes) and a tail of tokens, also from the family, whose length is not
/// a whole number of blocks.
fn make_request(rng: &mut Rng, shape: &Shape, id: u32) -> Req {
    let family = rng.below(3) as u64;
    let lora = [None, None, Some(7), Some(9)][rng.below(4)];
    let trace_tokens = shape.per_trace * shape.block_size;
    let num_trace = rng.below(4);
    // Ids from the family's sequence, sometimes one of another family's at the end.
    let mut ids: Vec<u64> = (0..num_trace as u64).map(|k| family * 100 + k).collect();
    if num_trace > 0 && rng.chance(20) {
        ids[num_trace - 1] = 1000 + rng.below(3) as u64;
    }
    let mut named = Vec::new();
    for &trace_id in &ids {
        let seed = hash_content(named.last().copied(), trace_id, lora);
        named.extend((0..shape.per_trace as u32).map(|o| content_block(seed, o)));
    }
    // The named blocks' tokens are read by no one (the simulator leaves them 0).
    let mut tokens = vec![0; num_trace * trace_tokens];
    let tail_family = if rng.chance(70) {
        family
    } else {
        10 + id as u64
    };
    let tail_len = 1 + rng.below(3 * shape.block_size);
    tokens.extend((0..tail_len as u32).map(|i| 1 + tail_family as u32 * 1000 + i));
    Req {
        id,
        tokens,
        named,
        lora,
        num_computed: 0,
        loading: false,
    }
}

/// One random stream; the linked pool's stats at its end, or `Err` describing the first
/// difference.
fn run_stream(seed: u64) -> Result<BlockPoolStats, String> {
    let result = run_stream_planted(seed);
    LOOKALIKE_TOKEN.set(None);
    result
}

/// [`run_stream`], which then unplants the look-alike token hash.
fn run_stream_planted(seed: u64) -> Result<BlockPoolStats, String> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let block_size = [1, 2, 4][rng.below(3)];
    let num_blocks = 6 + rng.below(40);
    // Trace blocks of one KV block keep named hashes in the per-block map; longer ones
    // turn the named index on; 33 places take a chunk of 64 slots.
    let per_trace = [1, 1, 2, 3, 4, 8, 33][rng.below(7)];
    // Some streams hash the first block of a family's tail to a look-alike of a named
    // hash: a token hash carrying the named mark.
    LOOKALIKE_TOKEN.set(rng.chance(30).then(|| 1 + 1000 * rng.below(3) as u32));
    let shape = Shape {
        // Room for a few trace blocks of 33.
        num_blocks: if per_trace > 8 {
            num_blocks + 2 * per_trace
        } else {
            num_blocks
        },
        block_size,
        per_trace,
        host_blocks: if rng.chance(30) { 1 + rng.below(12) } else { 0 },
        events: rng.chance(50),
        caching: rng.chance(95),
    };
    let shape = Shape {
        host_blocks: if shape.caching { shape.host_blocks } else { 0 },
        ..shape
    };
    let mut twin = Twin::new(shape);
    let mut waiting: Vec<Req> = Vec::new();
    let mut running: Vec<Req> = Vec::new();
    let mut next_id = 0u32;
    for op in 0..OPS_PER_STREAM {
        let what = |name: &str| format!("seed {seed}, op {op} ({name})");
        match rng.below(100) {
            0..=19 => {
                waiting.push(make_request(&mut rng, &twin.shape, next_id));
                next_id += 1;
            }
            20..=39 if !waiting.is_empty() => {
                let at = if rng.chance(70) {
                    0
                } else {
                    rng.below(waiting.len())
                };
                let mut req = waiting.remove(at);
                let hits = (
                    twin.linked.get_computed_blocks_from(
                        &req.tokens,
                        req.lora,
                        req.named.clone(),
                        usize::MAX,
                    ),
                    twin.runs.get_computed_blocks_from(
                        &req.tokens,
                        req.lora,
                        req.named.clone(),
                        usize::MAX,
                    ),
                );
                if hit_view(&hits.0) != hit_view(&hits.1) {
                    return Err(format!(
                        "{}: hits {:?} / {:?}",
                        what("lookup"),
                        hit_view(&hits.0),
                        hit_view(&hits.1)
                    ));
                }
                let num_hit = hits.0.num_computed_tokens + hits.0.num_host_tokens();
                let len = req.tokens.len();
                both!(twin, what("fits"), (p, hit) in hits =>
                    p.full_sequence_fits(&req.id, len, Some(hit)));
                let external = twin.shape.caching && rng.chance(15) && num_hit + 1 < len;
                let admitted = if external {
                    let num_ext = 1 + rng.below(len - num_hit - 1);
                    let got = both!(twin, what("allocate external"), (p, hit) in hits => p
                        .allocate_slots_external(&req.id, &req.tokens, num_ext, Some(hit), req.lora)
                        .map_err(|e| e.to_string()));
                    req.num_computed = num_hit + num_ext;
                    req.loading = true;
                    got?.is_some()
                } else {
                    let chunk = 1 + rng.below(len - num_hit);
                    let lookahead = rng.below(2);
                    let got = both!(twin, what("admit"), (p, hit) in hits => p
                        .allocate_slots(&req.id, &req.tokens, chunk, lookahead, Some(hit), req.lora)
                        .map_err(|e| e.to_string()));
                    req.num_computed = num_hit + chunk;
                    got?.is_some()
                };
                if admitted {
                    running.push(req);
                } else {
                    req.num_computed = 0;
                    req.loading = false;
                    waiting.insert(at, req);
                }
            }
            40..=69 if !running.is_empty() => {
                let at = rng.below(running.len());
                let req = &mut running[at];
                let len = req.tokens.len();
                if req.loading {
                    both!(twin, what("loads land"), p => p.cache_loaded_blocks(&req.id)
                        .map_err(|e| e.to_string()))?;
                    req.loading = false;
                    continue;
                }
                let (new_ids, num_new, num_draft) = if req.num_computed < len {
                    (Vec::new(), 1 + rng.below(len - req.num_computed), 0)
                } else {
                    // A decode step: the token sampled last step becomes known; a few
                    // speculative tokens ride along.
                    let token = 1 + (req.id % 3) * 1000 + 500 + (len as u32 % 7);
                    let drafts = if rng.chance(25) { 1 + rng.below(3) } else { 0 };
                    (vec![token], 1 + drafts, drafts)
                };
                let lookahead = rng.below(2);
                let got = both!(twin, what("step"), p => p
                    .allocate_slots(&req.id, &new_ids, num_new, lookahead, None, req.lora)
                    .map_err(|e| e.to_string()));
                if got?.is_none() {
                    // Preempted under pressure: freed, retried later from its prompt's names.
                    let mut req = running.remove(at);
                    both!(twin, what("preempt"), p => p.free(&req.id).map_err(|e| e.to_string()))?;
                    req.num_computed = 0;
                    waiting.insert(0, req);
                } else {
                    req.tokens.extend_from_slice(&new_ids);
                    req.num_computed += num_new;
                    if num_draft > 0 {
                        let rejected = rng.below(num_draft + 1);
                        both!(twin, what("rewind"), p => p
                            .rewind_computed_tokens(&req.id, rejected)
                            .map_err(|e| e.to_string()))?;
                        req.num_computed -= rejected;
                        let accepted: Vec<TokenId> = (0..(num_draft - rejected) as u32)
                            .map(|i| 2 + (req.id % 3) * 1000 + 600 + i)
                            .collect();
                        both!(twin, what("accept"), p => p
                            .cache_blocks(&req.id, &accepted)
                            .map_err(|e| e.to_string()))?;
                        req.tokens.extend_from_slice(&accepted);
                    }
                }
            }
            70..=84 if !running.is_empty() => {
                let req = running.remove(rng.below(running.len()));
                both!(twin, what("finish"), p => p.free(&req.id).map_err(|e| e.to_string()))?;
            }
            85..=92 if !running.is_empty() => {
                let mut req = running.remove(rng.below(running.len()));
                both!(twin, what("preempt"), p => p.free(&req.id).map_err(|e| e.to_string()))?;
                req.num_computed = 0;
                req.loading = false;
                waiting.push(req);
            }
            93..=95 => {
                both!(twin, what("reset"), p => p.reset_prefix_cache());
            }
            _ => {}
        }
        twin.compare_state()
            .map_err(|e| format!("{}: {e}", what("state")))?;
    }
    Ok(twin.linked.stats())
}

fn num_seeds() -> u64 {
    std::env::var("TOKENYARD_RUN_POOL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEEDS)
}

#[test]
fn the_pool_over_runs_answers_as_the_linked_pool_on_random_streams() {
    for seed in 0..num_seeds() {
        if let Err(difference) = run_stream(seed) {
            panic!("{difference}");
        }
    }
}

#[test]
fn a_swap_planted_in_the_run_queues_eviction_order_is_caught() {
    PLANTED_SWAP.set(true);
    let caught = (0..200).filter(|&seed| run_stream(seed).is_err()).count();
    PLANTED_SWAP.set(false);
    assert!(caught > 0, "no stream noticed the swapped eviction order");
    // And not by chance of a few streams: most streams evict.
    assert!(caught > 50, "only {caught} of 200 streams noticed");
}

#[test]
fn a_mis_addressed_eviction_in_the_named_index_is_caught() {
    PLANTED_WRONG_SLOT.set(true);
    let caught = (0..200).filter(|&seed| run_stream(seed).is_err()).count();
    PLANTED_WRONG_SLOT.set(false);
    assert!(caught > 50, "only {caught} of 200 streams noticed");
}

/// Streams among the first 200 that notice `fault` (a difference, or a broken invariant's
/// panic), planted while they run.
fn streams_catching(fault: &'static std::thread::LocalKey<std::cell::Cell<bool>>) -> usize {
    (0..200)
        .filter(|&seed| {
            fault.set(true);
            let result = std::panic::catch_unwind(|| run_stream(seed));
            fault.set(false);
            LOOKALIKE_TOKEN.set(None);
            !matches!(result, Ok(Ok(_)))
        })
        .count()
}

#[test]
fn an_eviction_run_that_keeps_its_last_place_in_the_named_index_is_caught() {
    let caught = streams_catching(&PLANTED_RUN_TAIL_KEPT);
    assert!(caught > 50, "only {caught} of 200 streams noticed");
}

#[test]
fn a_caching_run_that_runs_past_its_trace_block_is_caught() {
    let caught = streams_catching(&PLANTED_RUN_PAST_KEY);
    assert!(caught > 50, "only {caught} of 200 streams noticed");
}

#[test]
fn a_lookup_run_that_reads_past_an_uncached_place_is_caught() {
    let caught = streams_catching(&PLANTED_RUN_READ_PAST);
    assert!(caught > 50, "only {caught} of 200 streams noticed");
}

#[test]
fn streams_exercise_hits_the_host_tier_and_evictions() {
    // The streams are only worth what they reach: count it on the linked pool.
    let (mut hit_tokens, mut host_hit_tokens, mut offloads) = (0, 0, 0);
    for seed in 0..200 {
        let stats = run_stream(seed).unwrap();
        hit_tokens += stats.num_hit_tokens;
        host_hit_tokens += stats.num_host_hit_tokens;
        offloads += stats.num_offloaded_blocks;
    }
    assert!(hit_tokens > 1000, "{hit_tokens} hit tokens");
    assert!(host_hit_tokens > 50, "{host_hit_tokens} host hit tokens");
    assert!(offloads > 100, "{offloads} offloads");
    assert!(
        LOOKALIKES_MADE.get() > 100,
        "{} look-alikes",
        LOOKALIKES_MADE.get()
    );
}
