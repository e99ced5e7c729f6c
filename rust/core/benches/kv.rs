//! Criterion benchmarks of the KV memory layer: the counting allocator, vLLM V1's block pool
//! and SGLang's radix cache, on a deterministic stream of requests that share system prompts.
//!
//! Run with `cargo bench -p tokenyard-core --bench kv` (about a minute and a half on a small
//! box). Setup (building the workload, warming the pools) is never timed; where a benchmark
//! changes state that must be restored, the restore happens outside the timer (`iter_custom`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokenyard_core::kv::{BlockPool, ComputedBlocks, CountingAllocator, RadixCache, TokenId};

/// Shared system prompts in the stream.
const NUM_PROMPTS: usize = 200;
/// Requests in the stream.
const NUM_SEQS: usize = 2048;
const PROMPT_LEN: (usize, usize) = (256, 1024);
const SEQ_LEN: (usize, usize) = (512, 4096);
const VOCAB: u64 = 128_000;
const SEED: u64 = 0x746f_6b65_6e79_6172;

/// vLLM's default block size.
const BLOCK_SIZE: usize = 16;
/// 1M token slots: the shared prompts (~8k blocks) stay cached while the suffixes churn.
const POOL_BLOCKS: usize = 1 << 16;
/// Requests holding blocks in the background of every block-pool benchmark.
const NUM_LIVE: usize = 32;
/// The request id the benchmarks allocate for (the live ones use 0..NUM_LIVE).
const BENCH_ID: u64 = u64::MAX;
/// Decode steps run on one request before it is freed and a new one admitted.
const DECODE_RUN: usize = 2048;
/// Tokens asked of `RadixCache::evict`.
const EVICT_TOKENS: usize = 4096;

/// splitmix64: a tiny, good-enough deterministic generator (no `rand` needed).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (the modulo bias is irrelevant here).
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    fn token(&mut self) -> TokenId {
        (self.next_u64() % VOCAB) as TokenId
    }

    fn tokens(&mut self, n: usize) -> Vec<TokenId> {
        (0..n).map(|_| self.token()).collect()
    }
}

/// ~200 system prompts and a stream of requests, each one prompt plus a unique suffix.
struct Workload {
    prompts: Vec<Vec<TokenId>>,
    seqs: Vec<Vec<TokenId>>,
    rng: SplitMix64,
}

impl Workload {
    fn new() -> Self {
        let mut rng = SplitMix64(SEED);
        let prompts: Vec<Vec<TokenId>> = (0..NUM_PROMPTS)
            .map(|_| {
                let len = rng.range(PROMPT_LEN.0, PROMPT_LEN.1);
                rng.tokens(len)
            })
            .collect();
        let mut workload = Self {
            prompts,
            seqs: Vec::new(),
            rng,
        };
        workload.seqs = (0..NUM_SEQS)
            .map(|_| {
                let prompt = workload.rng.range(0, NUM_PROMPTS - 1);
                let min_len = SEQ_LEN.0.max(workload.prompts[prompt].len() + BLOCK_SIZE);
                let len = workload.rng.range(min_len, SEQ_LEN.1);
                workload.request(prompt, len)
            })
            .collect();
        workload
    }

    /// A new request: prompt `prompt` followed by fresh tokens, `len` tokens in all.
    fn request(&mut self, prompt: usize, len: usize) -> Vec<TokenId> {
        let mut seq = self.prompts[prompt].clone();
        assert!(len > seq.len(), "a request extends its prompt");
        seq.extend(self.rng.tokens(len - seq.len()));
        seq
    }

    fn mean_seq_len(&self) -> u64 {
        (self.seqs.iter().map(Vec::len).sum::<usize>() / self.seqs.len()) as u64
    }
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_millis(2500))
}

fn bench_counting(c: &mut Criterion) {
    const REQUEST_BLOCKS: usize = 128;
    let mut group = c.benchmark_group("counting");
    let mut alloc = CountingAllocator::<u64>::new(1 << 20, 0.01).unwrap();
    // 1,000 live requests holding a quarter of the pool.
    for id in 0..1000 {
        alloc.allocate(id, 256).unwrap();
    }
    let mut next_id = 1_000_000u64;
    group.bench_function("allocate_free", |b| {
        b.iter(|| {
            let id = next_id;
            next_id += 1;
            let n = black_box(REQUEST_BLOCKS);
            assert!(alloc.can_admit(n));
            alloc.allocate(id, n).unwrap();
            alloc.free(&[id]).unwrap()
        })
    });
    group.finish();
}

/// Admits `seq` as `id` with whatever prefix is cached; panics if it does not fit.
fn admit(pool: &mut BlockPool<u64>, id: u64, seq: &[TokenId]) -> ComputedBlocks {
    let hit = pool.get_computed_blocks(seq, None);
    let num_new = seq.len() - hit.num_computed_tokens;
    pool.allocate_slots(&id, seq, num_new, 0, Some(&hit), None)
        .unwrap()
        .expect("the pool is large enough");
    hit
}

/// A pool that has served the whole stream once (when caching, the prompts are cached) and
/// holds `NUM_LIVE` running requests.
fn warm_pool(workload: &Workload, enable_caching: bool) -> BlockPool<u64> {
    let mut pool = BlockPool::new(POOL_BLOCKS, BLOCK_SIZE, enable_caching).unwrap();
    if enable_caching {
        for seq in &workload.seqs {
            admit(&mut pool, BENCH_ID, seq);
            pool.free(&BENCH_ID).unwrap();
        }
    }
    for (id, seq) in (0..NUM_LIVE as u64).zip(&workload.seqs) {
        admit(&mut pool, id, seq);
    }
    pool
}

fn bench_block_pool(c: &mut Criterion) {
    let mut workload = Workload::new();
    let mut group = c.benchmark_group("block_pool");

    let prompt_2048 = workload.request(0, 2048);
    group.throughput(Throughput::Elements(2048));
    {
        let mut pool = warm_pool(&workload, false);
        group.bench_function("alloc_free_no_cache", |b| {
            b.iter(|| {
                let blocks = pool
                    .allocate_slots(&BENCH_ID, black_box(&prompt_2048), 2048, 0, None, None)
                    .unwrap();
                black_box(blocks.expect("the pool is large enough"));
                pool.free(&BENCH_ID).unwrap();
            })
        });
    }

    let mut pool = warm_pool(&workload, true);
    {
        // Serve the sequence once, so all its full blocks but the last token's are cached.
        admit(&mut pool, BENCH_ID, &prompt_2048);
        pool.free(&BENCH_ID).unwrap();
        let hit = pool.get_computed_blocks(&prompt_2048, None);
        assert_eq!(hit.num_computed_tokens, 2047 / BLOCK_SIZE * BLOCK_SIZE);
        group.bench_function("lookup_hit", |b| {
            b.iter(|| pool.get_computed_blocks(black_box(&prompt_2048), None))
        });
    }

    // Throughput in tokens per request, averaged over the stream.
    group.throughput(Throughput::Elements(workload.mean_seq_len()));
    {
        let mut next = 0;
        group.bench_function("admit_with_hit_and_free", |b| {
            b.iter(|| {
                let seq = &workload.seqs[next % NUM_SEQS];
                next += 1;
                black_box(admit(&mut pool, BENCH_ID, black_box(seq)));
                pool.free(&BENCH_ID).unwrap();
            })
        });
    }

    group.throughput(Throughput::Elements(1));
    {
        // Runs of DECODE_RUN steps on a request admitted (untimed) from the stream, so block
        // boundaries (one new block and one newly cached block every 16 steps) come naturally.
        let mut next = 0;
        let mut rng = SplitMix64(SEED ^ 0xdec0de);
        group.bench_function("decode_step", |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let run = left.min(DECODE_RUN as u64);
                    admit(&mut pool, BENCH_ID, &workload.seqs[next % NUM_SEQS]);
                    next += 1;
                    let tokens = rng.tokens(run as usize);
                    let start = Instant::now();
                    for token in &tokens {
                        let blocks = pool
                            .allocate_slots(
                                &BENCH_ID,
                                std::slice::from_ref(token),
                                1,
                                0,
                                None,
                                None,
                            )
                            .unwrap();
                        black_box(blocks.expect("the pool is large enough"));
                    }
                    elapsed += start.elapsed();
                    pool.free(&BENCH_ID).unwrap();
                    left -= run;
                }
                elapsed
            })
        });
    }
    group.finish();
}

/// Token ids and KV slot values of a sequence. Each value names its sequence (the high 32
/// bits index `RadixWorkload::items`) and position, so evicted values tell what to reinsert.
struct Item {
    tokens: Vec<TokenId>,
    values: Vec<i64>,
}

impl Item {
    fn new(index: usize, tokens: &[TokenId]) -> Self {
        let values = (0..tokens.len())
            .map(|pos| ((index as i64) << 32) | pos as i64)
            .collect();
        Self {
            tokens: tokens.to_vec(),
            values,
        }
    }
}

fn owner(value: i64) -> usize {
    (value >> 32) as usize
}

/// The prompts (items `0..NUM_PROMPTS`) then the stream, and a cache holding the prompts.
struct RadixWorkload {
    items: Vec<Item>,
    with_prompts: RadixCache,
}

impl RadixWorkload {
    fn new(workload: &Workload) -> Self {
        let items: Vec<Item> = workload
            .prompts
            .iter()
            .chain(&workload.seqs)
            .enumerate()
            .map(|(i, tokens)| Item::new(i, tokens))
            .collect();
        // SGLang's default page size.
        let mut with_prompts = RadixCache::new(1).unwrap();
        for item in &items[..NUM_PROMPTS] {
            with_prompts.insert(&item.tokens, &item.values).unwrap();
        }
        Self {
            items,
            with_prompts,
        }
    }

    fn stream(&self) -> &[Item] {
        &self.items[NUM_PROMPTS..]
    }

    /// A cache holding the prompts and the whole stream (~2,000 sequences).
    fn full_cache(&self) -> RadixCache {
        let mut cache = self.with_prompts.clone();
        for item in self.stream() {
            cache.insert(&item.tokens, &item.values).unwrap();
        }
        cache
    }
}

fn bench_radix(c: &mut Criterion) {
    let mut workload = Workload::new();
    let radix = RadixWorkload::new(&workload);
    let mut group = c.benchmark_group("radix");

    // Throughput in tokens per sequence, averaged over the stream.
    group.throughput(Throughput::Elements(workload.mean_seq_len()));
    {
        // Inserts the stream in order into a cache warmed with the prompts; once the stream
        // is used up the cache is reset to the prompts alone (untimed).
        let mut cache = radix.with_prompts.clone();
        let mut pos = 0;
        let stream = radix.stream();
        group.bench_function("insert", |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    if pos == stream.len() {
                        cache = radix.with_prompts.clone();
                        pos = 0;
                    }
                    let run = left.min(stream.len() - pos);
                    let start = Instant::now();
                    for item in &stream[pos..pos + run] {
                        black_box(cache.insert(&item.tokens, &item.values).unwrap());
                    }
                    elapsed += start.elapsed();
                    pos += run;
                    left -= run;
                }
                elapsed
            })
        });
    }

    group.throughput(Throughput::Elements(2048));
    {
        let mut cache = radix.full_cache();
        let seq = workload.request(0, 2048);
        let item = Item::new(radix.items.len(), &seq);
        cache.insert(&item.tokens, &item.values).unwrap();
        assert_eq!(cache.match_prefix(&seq).matched_len, 2048);
        group.bench_function("match_full_hit", |b| {
            b.iter(|| cache.match_prefix(black_box(&seq)))
        });
    }

    group.throughput(Throughput::Elements(EVICT_TOKENS as u64));
    {
        // After each (timed) eviction the sequences that lost tokens are reinserted
        // (untimed), so every call sees the same ~2,000-sequence cache, LRU order rotating.
        let mut cache = radix.full_cache();
        let total = cache.total_size();
        let mut owners = Vec::new();
        group.bench_function("evict_4096", |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let freed = cache.evict(black_box(EVICT_TOKENS));
                    elapsed += start.elapsed();
                    assert!(freed.len() >= EVICT_TOKENS);
                    owners.clear();
                    owners.extend(freed.iter().map(|&v| owner(v)));
                    owners.sort_unstable();
                    owners.dedup();
                    for &i in &owners {
                        let item = &radix.items[i];
                        cache.insert(&item.tokens, &item.values).unwrap();
                    }
                    assert_eq!(cache.total_size(), total);
                }
                elapsed
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_counting, bench_block_pool, bench_radix
}
criterion_main!(benches);
