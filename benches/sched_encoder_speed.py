"""What the encoder rules cost the step scheduler: one step (``schedule()`` + the fake
model's ``update_from_output``) with R running decodes whose prompts carry two images each
(encoded and passed: each step searches the items for its window and finds none), against
the same decodes with text-only prompts; and a multimodal prefill mix (256 requests of
1,000-3,000 tokens with one to three images of 256-832 tokens from a pool of 32, a
2,048-token budget, an encoder budget of 900 and a cache of 1,800) run to completion,
against the same mix without images (median of 5 runs each).

    PYTHONPATH=python .venv/bin/python benches/sched_encoder_speed.py [--steps 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from sched_steps import decode_step_times, run_step

from tokenyard.sched import MmFeature, Scheduler, SchedulerConfig


def decode_steps(running: int, steps: int, mm: bool) -> list[float]:
    s = Scheduler(
        SchedulerConfig(max_num_seqs=running, max_num_batched_tokens=65536, num_blocks=65536)
    )
    for i in range(running):
        items = [MmFeature(4, 40, f"img{i % 16}"), MmFeature(60, 40, f"img{(i + 1) % 16}")]
        s.add_request(
            i, [i * 1000 + t for t in range(128)], 100_000 - 1, mm_features=items if mm else None
        )
    return decode_step_times(s, running, steps)


def prefill_mix(mm: bool, seed: int = 0) -> tuple[float, int]:
    rng = random.Random(seed)
    s = Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=2048,
            num_blocks=40_000,
            max_model_len=8192,
            max_num_encoder_input_tokens=900,
            encoder_cache_size=1800,
        )
    )
    for i in range(256):
        n = rng.randrange(1000, 3001)
        items: list[Any] = []
        at = rng.randrange(0, 50)
        for _ in range(rng.randrange(1, 4)):
            k = rng.randrange(32)
            length = 256 + 64 * (k % 10)
            if at + length > n:
                break
            items.append(MmFeature(at, length, f"img{k}"))
            at += length + rng.randrange(0, 200)
        s.add_request(i, [i * 10_000 + t for t in range(n)], 16, mm_features=items if mm else None)
    t = time.perf_counter()
    steps = 0
    while s.has_unfinished_requests():
        run_step(s)
        steps += 1
    return time.perf_counter() - t, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    for running in (64, 256):
        text = statistics.median(decode_steps(running, args.steps, mm=False))
        mm = statistics.median(decode_steps(running, args.steps, mm=True))
        print(
            f"decode R={running}: text-only {text:.1f} us/step, two images per prompt "
            f"{mm:.1f} us/step, ratio {mm / text:.2f}"
        )
    runs = [(prefill_mix(False), prefill_mix(True)) for _ in range(5)]
    t_text = statistics.median(r[0][0] for r in runs)
    t_mm = statistics.median(r[1][0] for r in runs)
    n_text, n_mm = runs[0][0][1], runs[0][1][1]
    print(
        f"prefill mix: text-only {n_text} steps in {t_text:.2f} s "
        f"({t_text / n_text * 1e6:.0f} us/step); with images {n_mm} steps in {t_mm:.2f} s "
        f"({t_mm / n_mm * 1e6:.0f} us/step), per-step ratio "
        f"{(t_mm / n_mm) / (t_text / n_text):.2f}"
    )


if __name__ == "__main__":
    main()
