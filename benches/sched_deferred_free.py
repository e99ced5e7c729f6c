"""What deferred block frees (vLLM 0.33's ``defer_block_free``) cost per step: vLLM's own
``Scheduler`` and ``TokenyardScheduler``, each with the flag off and on, at R running
decodes, in one process (``benches/sched_vllm_adapter.py``'s scenario and fake runner:
128-token prompts, nobody finishes, warmed up until every request decodes). With the flag
on, each non-empty step is numbered and stamps its requests (vLLM's ``last_sched_seq``; the
core's ``stamp_step``) and each update reports it processed. The four sides run in rounds,
in a new (seeded) order each round; the report gives each side's median step and the
ratios of medians.

    .venv-bench/bin/python benches/sched_deferred_free.py [--running 1024] [--steps 30]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sched_vllm_adapter import decoding, step


def run_side(kind: str, defer: bool, running: int, steps: int) -> list[int]:
    from vllm.v1.outputs import ModelRunnerOutput

    scheduler = decoding(kind, running, prefix_caching=True)
    scheduler.defer_block_free = defer  # type: ignore[attr-defined]
    times = []
    gc.collect()
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        step(scheduler, ModelRunnerOutput)
        times.append(time.perf_counter_ns() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sides = [(kind, defer) for kind in ("vllm", "tokenyard") for defer in (False, True)]
    times: dict[tuple[str, bool], list[int]] = {side: [] for side in sides}
    order = random.Random(0)
    for _ in range(args.rounds):
        # A new order each round: machine noise and warm caches favour no side.
        for kind, defer in order.sample(sides, len(sides)):
            times[(kind, defer)] += run_side(kind, defer, args.running, args.steps)
    median = {side: statistics.median(t) / 1000 for side, t in times.items()}
    print(f"running={args.running} steps={args.steps} rounds={args.rounds}")
    for (kind, defer), us in median.items():
        print(f"  {kind:9s} defer_block_free={defer!s:5s}  median step {us:9.1f} us")
    for defer in (False, True):
        ratio = median[("vllm", defer)] / median[("tokenyard", defer)]
        print(f"  vLLM / tokenyard, defer_block_free={defer}: {ratio:.2f}x")
    for kind in ("vllm", "tokenyard"):
        cost = median[(kind, True)] / median[(kind, False)]
        print(f"  {kind}: on / off {cost:.3f}")


if __name__ == "__main__":
    main()
