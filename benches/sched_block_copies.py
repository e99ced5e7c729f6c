"""What a block copy (vLLM 0.33's ``SchedulerOutput.kv_cache_block_copies``) costs per step:
vLLM's own ``Scheduler`` and ``TokenyardScheduler`` with deferred block frees on, at R
running decodes (``benches/sched_vllm_adapter.py``'s scenario and fake runner), each step
either plain or with two blocks taken by ``block_pool.get_new_blocks`` and one copy between
them appended to the first manager's ``_pending_cow_copies`` (the step carries it; its
endpoints return to the pool when the step is processed). The four sides run in rounds, in
a new (seeded) order each round; the report gives each side's median step (the take and the
append included) and the ratios of medians.

    .venv-bench/bin/python benches/sched_block_copies.py [--running 1024] [--steps 30]
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


def run_side(kind: str, copy: bool, running: int, steps: int) -> list[int]:
    from vllm.v1.outputs import ModelRunnerOutput

    scheduler: object = decoding(kind, running, prefix_caching=True)
    scheduler.defer_block_free = True  # type: ignore[attr-defined]
    manager = scheduler.kv_cache_manager  # type: ignore[attr-defined]
    pool = manager.block_pool
    group = manager.coordinator.single_type_managers[0]
    times = []
    taken: list[object] = []
    gc.collect()
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        if copy:
            taken = pool.get_new_blocks(2)
            # Read each time: draining rebinds the list, as vLLM's does.
            group._pending_cow_copies.append(tuple(taken))
        out = step(scheduler, ModelRunnerOutput)
        times.append(time.perf_counter_ns() - t0)
        if len(out) != running:
            raise RuntimeError(f"{kind}: {len(out)} of {running} requests scheduled")
    # Each step was processed: its copy's endpoints are back in the pool.
    if scheduler.deferred_frees or any(b.ref_cnt for b in taken):  # type: ignore[attr-defined]
        raise RuntimeError(f"{kind}: a copy's endpoints did not return to the pool")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sides = [(kind, copy) for kind in ("vllm", "tokenyard") for copy in (False, True)]
    times: dict[tuple[str, bool], list[int]] = {side: [] for side in sides}
    order = random.Random(0)
    for _ in range(args.rounds):
        # A new order each round: machine noise and warm caches favour no side.
        for kind, copy in order.sample(sides, len(sides)):
            times[(kind, copy)] += run_side(kind, copy, args.running, args.steps)
    median = {side: statistics.median(t) / 1000 for side, t in times.items()}
    print(f"running={args.running} steps={args.steps} rounds={args.rounds}")
    for (kind, copy), us in median.items():
        print(f"  {kind:9s} copy each step={copy!s:5s}  median step {us:9.1f} us")
    for copy in (False, True):
        ratio = median[("vllm", copy)] / median[("tokenyard", copy)]
        print(f"  vLLM / tokenyard, copy each step={copy}: {ratio:.2f}x")
    for kind in ("vllm", "tokenyard"):
        cost = median[(kind, True)] / median[(kind, False)]
        print(f"  {kind}: with a copy / without {cost:.3f}")


if __name__ == "__main__":
    main()
