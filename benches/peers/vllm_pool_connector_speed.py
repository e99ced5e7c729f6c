"""Wall time of one seeded SimpleCPUOffloadConnector stream (the differential test's, tests/
test_integrations_vllm_pool_connectors.py) on vLLM 0.33's ``Scheduler`` and through
tokenyard's adapter, each alone, the worker's reports synthesized the same way: the median
of ``--repeat`` runs of each, and their ratio. Run in the bench venv:

    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_pool_connector_speed.py

``--clock cpu`` times the thread's CPU time instead of the wall clock: on a shared machine
a run's wall time is mostly its waits for a core, which land on either scheduler alike.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))

import test_integrations_vllm_pool_connectors as stream
import test_integrations_vllm_simple_offload_kinds as kinds
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_compare import runner_output

from tokenyard.integrations.vllm import TokenyardScheduler

LAYOUTS = {"mamba": kinds.MAMBA, "chunked": kinds.CHUNKED, "sizes": kinds.TWO_SIZES}


def _one(
    cls: type,
    seed: int,
    num_blocks: int,
    lazy: bool,
    window: int | None = None,
    layout: str | None = None,
    clock: Any = time.perf_counter,
) -> tuple[float, int]:
    """Seconds and steps of the stream on one scheduler, building it excluded; a sliding
    window of ``window`` tokens beside full attention if given, or ``layout``'s groups
    (``LAYOUTS``: test_integrations_vllm_simple_offload_kinds.py's)."""
    peer = stream._peer(stream._simple_cpu(400, lazy), num_blocks, events=False)
    scheduler: Any
    if layout is None:
        scheduler = peer.build(cls, stream._kv_cache_config(num_blocks, window=window))
    else:
        groups = LAYOUTS[layout]
        scheduler = groups.build(peer, cls, groups.prepare(peer, num_blocks))
    worker = stream._Worker()
    rng = random.Random(seed * 7 + 3)
    arrivals = stream._waves(seed)
    start = clock()
    for step in range(800):
        for at, *args in arrivals:
            if at == step:
                scheduler.add_request(peer.make_request(*args))
        out = scheduler.schedule()
        worker.submit(out, step, (rng.randrange(3), rng.randrange(3)))
        output = runner_output(scheduler, out)
        output.kv_connector_output = worker.report(step)
        scheduler.update_from_output(out, output)
        if step > 150 and not scheduler.has_unfinished_requests() and not worker.stores:
            return clock() - start, step + 1
    raise AssertionError("the stream did not drain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-blocks", type=int, default=40)
    parser.add_argument("--lazy", action="store_true")
    parser.add_argument(
        "--window", type=int, default=None, help="a sliding-window group of this many tokens"
    )
    parser.add_argument(
        "--layout",
        choices=sorted(LAYOUTS),
        default=None,
        help="full attention beside a Mamba align group, chunked local attention, or a "
        "16-token window beside 32-token full attention blocks",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: time.perf_counter; cpu: time.thread_time (this thread's CPU time)",
    )
    args = parser.parse_args()
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    times: dict[str, list[float]] = {"vllm": [], "tokenyard": []}
    steps = 0
    for _ in range(args.repeat):
        for name, cls in (("vllm", Scheduler), ("tokenyard", TokenyardScheduler)):
            seconds, steps = _one(
                cls, args.seed, args.num_blocks, args.lazy, args.window, args.layout, clock
            )
            times[name].append(seconds)
    vllm_s, ours_s = (statistics.median(times[n]) for n in ("vllm", "tokenyard"))
    mode = "lazy" if args.lazy else "eager"
    if args.window is not None:
        mode += f", full attention + {args.window}-token sliding window"
    if args.layout is not None:
        mode += f", layout {args.layout}"
    if args.clock == "cpu":
        mode += ", CPU time"
    print(
        f"SimpleCPUOffloadConnector ({mode}), seed {args.seed}, {args.num_blocks} GPU blocks, "
        f"{steps} steps: vLLM {vllm_s * 1e3:.1f} ms, tokenyard {ours_s * 1e3:.1f} ms "
        f"(medians of {args.repeat}); vLLM / tokenyard = {vllm_s / ours_s:.2f}"
    )


if __name__ == "__main__":
    main()
