"""What vLLM 0.33's HiSparse host page pool (``Scheduler.set_hisparse_host_pages``,
``sched::hisparse``) costs the step scheduler and what it changes: one step
(``schedule()`` + the fake model's ``update_from_output``) with R running decodes, the pool
off against on (room for every page, so the decisions are the same); and a mix (256
requests of 200-1,200 tokens, 64 output tokens each) run to completion with a host pool of
a quarter of the device blocks against none: steps, preemptions and wall time. Medians of
5 runs each, off and on interleaved. With a build that has them (``--groups``), the same
decode step over vLLM 0.33's HiSparse layout (an indexer, a resident and a hot group, the
host pool's tables placed among the groups' block ids) with the pool off and on; with
``--caching``, that layout's step with the pool on and prefix caching off and on.

    PYTHONPATH=python .venv/bin/python benches/sched_hisparse_speed.py [--steps 300] [--groups]
        [--caching] [--decode-only]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from sched_steps import decode_step_times, run_step

from tokenyard.sched import Scheduler, SchedulerConfig


def config(num_blocks: int, running: int = 0, **options: Any) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_seqs=running,
        max_num_batched_tokens=8192 if running else 2048,
        num_blocks=num_blocks,
        scheduler_reserve_full_isl=True,
        **options,
    )


def group_decode_steps(running: int, steps: int, host: bool, caching: bool = False) -> list[float]:
    """``decode_steps`` over the HiSparse layout, prefix caching off or on (served since
    branch ``hisp``: the indexer caches its blocks, nothing hits)."""
    from tokenyard.kv import FullAttentionSpec, HiSparseHotSpec, HiSparseResidentSpec

    groups = (
        FullAttentionSpec(),
        HiSparseResidentSpec(max_admission_blocks=512),
        HiSparseHotSpec(blocks_per_request=2),
    )
    options = {"kv_groups": groups, "enable_prefix_caching": caching, "reserve_null_block": True}
    s = Scheduler(config(3 * 65536, running, **options))
    if host:
        s.set_hisparse_host_pages(65536 + 1, source_group=0)
    for i in range(running):
        s.add_request(i, [i * 1000 + t for t in range(128)], 100_000 - 1)
    return decode_step_times(s, running, steps)


def decode_steps(running: int, steps: int, host: bool) -> list[float]:
    s = Scheduler(config(65536, running))
    if host:
        s.set_hisparse_host_pages(65536 + 1)
    for i in range(running):
        s.add_request(i, [i * 1000 + t for t in range(128)], 100_000 - 1)
    return decode_step_times(s, running, steps)


def mix(host_blocks: int | None, seed: int = 0) -> tuple[float, int, int]:
    rng = random.Random(seed)
    s = Scheduler(config(4096))
    if host_blocks is not None:
        s.set_hisparse_host_pages(host_blocks)
    for i in range(256):
        s.add_request(i, [rng.randrange(30_000) for _ in range(rng.randrange(200, 1200))], 64)
    steps = 0
    t = time.perf_counter()
    while s.has_unfinished_requests():
        run_step(s)
        steps += 1
    return time.perf_counter() - t, steps, s.stats().num_preemptions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--groups", action="store_true", help="the HiSparse layout too")
    parser.add_argument("--decode-only", action="store_true", help="skip the mix")
    parser.add_argument(
        "--caching", action="store_true", help="the layout's step with prefix caching off and on"
    )
    args = parser.parse_args()
    runs: dict[int | None, list[tuple[float, int, int]]] = {None: [], 1024: []}
    for _ in range(0 if args.decode_only else 5):
        for host in runs:
            runs[host].append(mix(host))
    for host, rs in runs.items() if not args.decode_only else ():
        wall = statistics.median(r[0] for r in rs)
        print(
            f"mix, host pool {host or 'off'}: {wall * 1e3:.1f} ms, {rs[0][1]} steps, "
            f"{rs[0][2]} preemptions"
        )
    for running in (256, 1024):
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(5):
            for host in (False, True):
                times[host].append(statistics.median(decode_steps(running, args.steps, host)))
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"R={running}: off {off:.1f} us/step, on {on:.1f} us/step, on/off {on / off:.3f}")
    for running in (256, 1024) if args.groups else ():
        times = {False: [], True: []}
        for _ in range(5):
            for host in (False, True):
                steps = group_decode_steps(running, args.steps, host)
                times[host].append(statistics.median(steps))
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(
            f"HiSparse groups R={running}: host off {off:.1f} us/step, on {on:.1f} us/step, "
            f"on/off {on / off:.3f}"
        )
    for running in (256, 1024) if args.caching else ():
        times = {False: [], True: []}
        for _ in range(5):
            for caching in (False, True):
                steps = group_decode_steps(running, args.steps, True, caching)
                times[caching].append(statistics.median(steps))
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(
            f"HiSparse groups R={running}, host on: caching off {off:.1f} us/step, "
            f"on {on:.1f} us/step, on/off {on / off:.3f}"
        )


if __name__ == "__main__":
    main()
