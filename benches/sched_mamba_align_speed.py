"""What vLLM 0.33's Mamba ``align`` split (``SchedulerConfig.mamba_align_block_size``)
costs the step scheduler: one step (``schedule()`` + the fake model's
``update_from_output``) with R running decodes (the split returns at once past the
prompt), with the split on (blocks of 256) against off; and a prefill mix (256 requests of
1,000-3,000 tokens, a 2,048-token budget) run to completion, on against off: wall time
and steps (the split ends chunks on block boundaries, so the mix takes more steps).
Medians of 5 runs each, off and on interleaved.

    PYTHONPATH=python .venv/bin/python benches/sched_mamba_align_speed.py [--steps 300]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
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
        runs: dict[int, list[float]] = {0: [], BLOCK: []}
        for _ in range(5):
            for align in (0, BLOCK):
                runs[align].append(statistics.median(decode_steps(running, args.steps, align)))
        med = {a: statistics.median(r) for a, r in runs.items()}
        print(
            f"decode R={running}: off {med[0]:.1f} us/step, on {med[BLOCK]:.1f} us/step, "
            f"on/off {med[BLOCK] / med[0]:.3f}"
        )


if __name__ == "__main__":
    main()
