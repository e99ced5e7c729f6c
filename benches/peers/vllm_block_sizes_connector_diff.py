"""A KV connector beside KV cache groups of different block sizes (Gemma 4 under P/D
disaggregation): the adapter against vLLM 0.33's own ``Scheduler`` and ``AsyncScheduler`` on
the streams of ``tests/test_integrations_vllm_block_sizes_connectors.py`` (a seeded
``SupportsHMA`` connector offering part of each request's tokens, synchronously or not), every
step compared. Each seed draws its layout (``gemma``: full attention in blocks of 32 beside a
64-token window in blocks of 16; ``three``: full attention in blocks of 64, windows of 48 in
blocks of 16 and of 100 in blocks of 32), scheduler (sync or async), prefix caching on or off,
a roomy or a tight cache (160, 40 or 24 blocks), whether the loads restore every group (a P/D
transfer) or the prefix-cacheable ones, and whether 30% of the loads fail (``failed_recving``
under ``kv_load_failure_policy="recompute"``). A stream both sides stall on alike counts as
agreeing, and is counted apart (``StreamStalled``: vLLM keeps a request whose load failed in
``_inflight_prefills``, its blocks reserved against every admission; where nothing runs the
core's stall breaker goes on instead, and the comparison stops there). Prints how many
streams agree on every step, the first difference of any that does not, and each side's
median time per step (``schedule()`` plus ``update_from_output``) with their ratio.

Run in the bench venv from the repository root:
``PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_block_sizes_connector_diff.py
[--streams 120]``.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benches" / "peers")]

import test_integrations_vllm_block_sizes_connectors as streams  # noqa: E402

LAYOUTS = {"gemma": streams.GEMMA, "three": streams.THREE}


def _timed(scheduler: Any, timings: list[float]) -> None:
    """Times ``scheduler``'s ``schedule`` and ``update_from_output`` into ``timings`` (one
    entry per step, the update added to its step's entry)."""
    schedule, update = scheduler.schedule, scheduler.update_from_output

    def timed_schedule() -> Any:
        start = time.perf_counter()
        out = schedule()
        timings.append(time.perf_counter() - start)
        return out

    def timed_update(out: Any, output: Any) -> Any:
        start = time.perf_counter()
        result = update(out, output)
        timings[-1] += time.perf_counter() - start
        return result

    scheduler.schedule, scheduler.update_from_output = timed_schedule, timed_update


def draw(seed: int) -> dict[str, Any]:
    """The stream options of ``seed`` (see the module doc)."""
    rng = random.Random(f"bszconn/{seed}")
    return {
        "layout": rng.choice(sorted(LAYOUTS)),
        "asynchronous": rng.random() < 0.5,
        "caching": rng.random() < 0.75,
        "num_blocks": rng.choice([24, 40, 160]),
        "loads_every_group": rng.random() < 0.25,
        "fail_share": rng.choice([0.0, 0.0, 0.3]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=120)
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    timings: list[list[float]] = [[], []]
    build = streams.build_pair

    def timed_build(*a: Any, **kw: Any) -> Any:
        pair, peer = build(*a, **kw)
        for scheduler, into in zip(pair, timings, strict=True):
            _timed(scheduler, into)
        return pair, peer

    streams.build_pair = timed_build
    agree = stalled = 0
    seen = {"loads": 0, "failed": 0, "hits": 0, "preemptions": 0, "external": 0}
    kinds = {"async": 0, "no caching": 0, "tight": 0, "every group": 0, "failing": 0}
    first: str | None = None
    seeds = range(args.first_seed, args.first_seed + args.streams)
    for seed in seeds:
        options = draw(seed)
        kinds["async"] += options["asynchronous"]
        kinds["no caching"] += not options["caching"]
        kinds["tight"] += options["num_blocks"] < 160
        kinds["every group"] += options["loads_every_group"]
        kinds["failing"] += options["fail_share"] > 0
        layout = LAYOUTS[options.pop("layout")]
        try:
            for key, n in streams.run_stream(layout, seed, **options).items():
                seen[key] += n
            agree += 1
        except streams.StreamStalled:
            # vLLM stuck after a failed load (kept in _inflight_prefills), every step alike
            # until then.
            agree += 1
            stalled += 1
        except Exception as err:  # a crash on either side is a difference
            if first is None:
                first = f"seed {seed} {options}: {type(err).__name__}: {str(err)[:300]}"
    print(
        f"{agree}/{len(seeds)} streams agree on every step "
        f"({', '.join(f'{n} {k}' for k, n in kinds.items())}; "
        f"{seen['loads']} asynchronous loads ({seen['failed']} failed), "
        f"{seen['external']} tokens offered by the "
        f"connector, {seen['hits']} admissions with computed tokens, "
        f"{seen['preemptions']} preemptions; {stalled} of the streams compared up to where "
        "vLLM stalls after a failed load)"
    )
    if first is not None:
        print(f"  first difference: {first}")
    vllm_us = statistics.median(timings[0]) * 1e6
    ours_us = statistics.median(timings[1]) * 1e6
    print(
        f"median per step ({len(timings[0])} steps): vLLM {vllm_us:.1f} us, adapter "
        f"{ours_us:.1f} us (vLLM / adapter {vllm_us / ours_us:.2f}x)"
    )
    return 0 if agree == len(seeds) else 1


if __name__ == "__main__":
    sys.exit(main())
