"""What vLLM 0.33's Mamba ``align`` split (``SchedulerConfig.mamba_align_block_size``)
costs the step scheduler: one step (``schedule()`` + the fake model's
``update_from_output``) with R running decodes (the split returns at once past the
prompt), with the split on (blocks of 256) against off; and a prefill mix (256 requests of
1,000-3,000 tokens, a 2,048-token budget) run to completion, on against off: wall time
and steps (the split ends chunks on block boundaries, so the mix takes more steps).
Medians of 5 runs each, off and on interleaved.

``--drafts K``: instead, CPU time of a stream with speculative decoding over full attention
beside a Mamba ``align`` group (256 requests of 200-1,200 tokens sharing prefixes, 64
outputs each, ``K`` drafts a step, every draft accepted), with the group's
``num_speculative_blocks`` 0 against ``K`` (vLLM 0.33's ``MambaSpec`` under speculation;
``K`` needs a build that has the field, 0 runs on any): CPU time per step, medians of 11.
Run with two builds' ``PYTHONPATH`` for a ratio.

    PYTHONPATH=python .venv/bin/python benches/sched_mamba_align_speed.py [--steps 300]
    PYTHONPATH=python .venv/bin/python benches/sched_mamba_align_speed.py --drafts 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from sched_steps import decode_step_times, run_step

from tokenyard.sched import Scheduler, SchedulerConfig

BLOCK = 256


def decode_steps(running: int, steps: int, align: int) -> list[float]:
    s = Scheduler(
        SchedulerConfig(
            max_num_seqs=running,
            max_num_batched_tokens=65536,
            num_blocks=65536,
            mamba_align_block_size=align,
        )
    )
    for i in range(running):
        s.add_request(i, [i * 1000 + t for t in range(128)], 100_000 - 1)
    return decode_step_times(s, running, steps)


def prefill_mix(align: int, seed: int = 0) -> tuple[float, int]:
    rng = random.Random(seed)
    s = Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=2048,
            num_blocks=40_000,
            mamba_align_block_size=align,
        )
    )
    for i in range(256):
        s.add_request(i, [rng.randrange(30_000) for _ in range(rng.randrange(1000, 3000))], 4)
    steps = 0
    t = time.perf_counter()
    while s.has_unfinished_requests():
        run_step(s)
        steps += 1
    return time.perf_counter() - t, steps


def draft_stream(k: int, spec_blocks: int, seed: int = 0) -> tuple[float, int]:
    """CPU seconds and steps of the speculative stream (see the module's ``--drafts``)."""
    from tokenyard.kv import FullAttentionSpec, MambaSpec

    mamba = MambaSpec(mamba_cache_mode="align")
    if spec_blocks:
        mamba = MambaSpec(mamba_cache_mode="align", num_speculative_blocks=spec_blocks)
    s = Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=2048,
            num_blocks=40_000,
            block_size=16,
            enable_prefix_caching=True,
            kv_groups=(FullAttentionSpec(), mamba),
            mamba_align_block_size=16,
            num_speculative_tokens=k,
        )
    )
    rng = random.Random(seed)
    prefixes = [[rng.randrange(30_000) for _ in range(160)] for _ in range(8)]
    for i in range(256):
        tail = [rng.randrange(30_000) for _ in range(rng.randrange(40, 1040))]
        s.add_request(i, rng.choice(prefixes) + tail, 64)
    steps = 0
    t = time.process_time()
    while s.has_unfinished_requests():
        out = s.schedule()
        sampled, drafts = {}, {}
        for rid in out.num_scheduled_tokens:
            if s.num_computed_tokens(rid) >= s.num_tokens(rid):
                given = len(out.scheduled_spec_decode_tokens.get(rid, ()))
                sampled[rid] = [7] * (given + 1)
                drafts[rid] = [7] * k
        s.update_from_output(sampled, spec_token_ids=drafts or None)
        steps += 1
    return time.process_time() - t, steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--drafts", type=int, default=None)
    args = parser.parse_args()
    if args.drafts is not None:
        k = args.drafts
        runs: dict[int, list[tuple[float, int]]] = {0: [], k: []}
        for _ in range(11):
            for blocks in list(runs):
                try:
                    runs[blocks].append(draft_stream(k, blocks))
                except TypeError:  # a build without MambaSpec.num_speculative_blocks
                    del runs[blocks]
        for blocks, got in runs.items():
            wall = statistics.median(r[0] for r in got)
            print(
                f"drafts {k}, num_speculative_blocks {blocks}: {wall * 1e3:.1f} ms / "
                f"{got[0][1]} steps, {wall / got[0][1] * 1e6:.1f} us/step"
            )
        return
    # Interleaved (off, on, off, on, ...) and before the decode runs: run in blocks after
    # them, the mix's second block measured 2.7x slower for no reason of its own.
    mix: dict[int, list[tuple[float, int]]] = {0: [], BLOCK: []}
    for _ in range(5):
        for align in (0, BLOCK):
            mix[align].append(prefill_mix(align))
    wall = {a: statistics.median(r[0] for r in runs) for a, runs in mix.items()}
    steps = {a: mix[a][0][1] for a in mix}
    print(
        f"prefill mix: off {wall[0] * 1e3:.1f} ms / {steps[0]} steps, on "
        f"{wall[BLOCK] * 1e3:.1f} ms / {steps[BLOCK]} steps, wall on/off "
        f"{wall[BLOCK] / wall[0]:.3f}, per step on/off "
        f"{(wall[BLOCK] / steps[BLOCK]) / (wall[0] / steps[0]):.3f}"
    )
    for running in (256, 1024):
        decode: dict[int, list[float]] = {0: [], BLOCK: []}
        for _ in range(5):
            for align in (0, BLOCK):
                decode[align].append(statistics.median(decode_steps(running, args.steps, align)))
        med = {a: statistics.median(r) for a, r in decode.items()}
        print(
            f"decode R={running}: off {med[0]:.1f} us/step, on {med[BLOCK]:.1f} us/step, "
            f"on/off {med[BLOCK] / med[0]:.3f}"
        )


if __name__ == "__main__":
    main()
