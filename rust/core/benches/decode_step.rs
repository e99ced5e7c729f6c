//! The core's bulk decode step at 1,024 running requests, without Python: what
//! `benches/sched_vllm.py --arrays --running 1024` times of the core (`schedule()` and
//! `update_from_output` with one sampled token per request), on the same scenario (128-token
//! distinct prompts, budget 8,192 tokens, `max_model_len` 1,024, 64 blocks a request,
//! vLLM 0.33's null block and whole-prompt admission), with and without prefix caching.
//!
//! Run with `cargo bench -p tokenyard-core --bench decode_step`. Each sample is a run of
//! steady decode steps; the scheduler is rebuilt (untimed) before its requests would reach
//! `max_tokens`. `schedule` times `schedule()` alone, `update` the update alone, `step`
//! both (the fake runner's output is built outside the clock in every case).
//!
//! On a shared machine, where criterion's means take in other processes' time,
//! `DECODE_STEP_MEDIANS=<steps>` prints per-step medians instead (and runs no criterion):
//! `DECODE_STEP_MEDIANS=2000 target/release/deps/decode_step-<hash>`; it is also the
//! loop to run under `perf record` or `valgrind --tool=callgrind`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group};
use tokenyard_core::sched::{RequestSpec, SampledOutput, Scheduler, SchedulerConfig};

const RUNNING: usize = 1024;
const PROMPT_LEN: usize = 128;
const MAX_MODEL_LEN: usize = 1024;
const BLOCK_SIZE: usize = 16;
const VOCAB: u64 = 32_000;
/// Decode steps a scheduler serves before it is rebuilt (its requests stop at
/// `MAX_MODEL_LEN - PROMPT_LEN` outputs).
const STEPS_PER_BUILD: usize = 800;

/// splitmix64, as in `benches/kv.rs`.
fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % VOCAB) as u32
        })
        .collect()
}

/// A scheduler with every request decoding (warmed up past the prefills).
struct Decode {
    s: Scheduler<u64>,
    outputs: Vec<SampledOutput<u64>>,
    steps: usize,
    prefix_caching: bool,
}

impl Decode {
    fn new(prefix_caching: bool) -> Self {
        let config = SchedulerConfig {
            max_num_seqs: RUNNING,
            max_num_batched_tokens: 8192,
            block_size: BLOCK_SIZE,
            num_blocks: RUNNING * (MAX_MODEL_LEN / BLOCK_SIZE),
            max_model_len: MAX_MODEL_LEN,
            enable_prefix_caching: prefix_caching,
            ..SchedulerConfig::default()
        };
        let mut s = Scheduler::new(config, false).expect("valid config");
        for id in 0..RUNNING as u64 {
            let spec = RequestSpec {
                prompt_token_ids: tokens(id + 1, PROMPT_LEN),
                max_tokens: MAX_MODEL_LEN - PROMPT_LEN,
                ..RequestSpec::default()
            };
            s.add_request(id, spec).expect("new id");
        }
        let mut d = Decode {
            s,
            outputs: Vec::new(),
            steps: 0,
            prefix_caching,
        };
        // Prefills (16 steps of 8,192 tokens), then a few decode steps.
        for _ in 0..24 {
            let out = d.s.schedule().expect("step");
            d.answer(&out.num_scheduled_tokens);
            d.s.update_from_output(&d.outputs).expect("update");
        }
        d
    }

    /// The fake runner: one token (7) for each request that caught up with its tokens.
    /// The outputs are overwritten in place, as the binding's bulk path does (no
    /// allocation per request).
    fn answer(&mut self, scheduled: &[(u64, usize)]) {
        let mut len = 0;
        for &(id, _) in scheduled {
            let r = self.s.get_request(&id).expect("scheduled request");
            if r.num_computed_tokens >= r.num_tokens() {
                match self.outputs.get_mut(len) {
                    Some(output) => {
                        output.request_id = id;
                        output.token_ids.clear();
                        output.token_ids.push(7);
                    }
                    None => self.outputs.push(SampledOutput {
                        request_id: id,
                        token_ids: vec![7],
                        ..SampledOutput::default()
                    }),
                }
                len += 1;
            }
        }
        self.outputs.truncate(len);
    }

    fn rebuild_if_spent(&mut self) {
        self.steps += 1;
        if self.steps >= STEPS_PER_BUILD {
            *self = Decode::new(self.prefix_caching);
        }
    }
}

#[derive(Clone, Copy)]
enum Part {
    Schedule,
    Update,
    Step,
}

/// One decode step: the time of `schedule()` and of the update.
fn step(d: &mut Decode) -> (Duration, Duration) {
    d.rebuild_if_spent();
    let t0 = Instant::now();
    let out = d.s.schedule().expect("step");
    let t1 = Instant::now();
    d.answer(&out.num_scheduled_tokens);
    let t2 = Instant::now();
    let finished = d.s.update_from_output(&d.outputs).expect("update");
    let t3 = Instant::now();
    assert_eq!(out.num_scheduled_tokens.len(), RUNNING);
    black_box((out, finished));
    (t1 - t0, t3 - t2)
}

fn run(d: &mut Decode, part: Part, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let (schedule, update) = step(d);
        total += match part {
            Part::Schedule => schedule,
            Part::Update => update,
            Part::Step => schedule + update,
        };
    }
    total
}

fn median(mut xs: Vec<Duration>) -> f64 {
    xs.sort_unstable();
    xs[xs.len() / 2].as_secs_f64() * 1e6
}

/// `DECODE_STEP_MEDIANS=<steps>`: per-step medians (µs) of each part, with and without
/// prefix caching.
fn print_medians(steps: usize) {
    for prefix_caching in [true, false] {
        let mut d = Decode::new(prefix_caching);
        let times: Vec<_> = (0..steps).map(|_| step(&mut d)).collect();
        let schedule = median(times.iter().map(|t| t.0).collect());
        let update = median(times.iter().map(|t| t.1).collect());
        let whole = median(times.iter().map(|t| t.0 + t.1).collect());
        println!(
            "prefix caching {}: step {whole:.1} µs (schedule {schedule:.1}, update {update:.1}), \
             median of {steps} steps at {RUNNING} running",
            if prefix_caching { "on" } else { "off" }
        );
    }
}

fn decode_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_step_1024");
    group.sample_size(30);
    for prefix_caching in [true, false] {
        let mut d = Decode::new(prefix_caching);
        let pc = if prefix_caching { "pc_on" } else { "pc_off" };
        for (name, part) in [
            ("schedule", Part::Schedule),
            ("update", Part::Update),
            ("step", Part::Step),
        ] {
            group.bench_function(BenchmarkId::new(name, pc), |b| {
                b.iter_custom(|iters| run(&mut d, part, iters))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, decode_step);

fn main() {
    match std::env::var("DECODE_STEP_MEDIANS") {
        Ok(steps) => print_medians(steps.parse().expect("DECODE_STEP_MEDIANS: a step count")),
        Err(_) => {
            benches();
            Criterion::default().configure_from_args().final_summary();
        }
    }
}
