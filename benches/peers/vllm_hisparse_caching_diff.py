"""vLLM 0.33's HiSparse layout with prefix caching on: the adapter against vLLM's own
``Scheduler`` on the streams of ``tests/test_integrations_vllm_hisparse_caching.py`` (shared
prefixes, synthesized worker acknowledgements), every step compared; prints how many
streams agree, the first differing step of any that does not, and each side's median time
per step (``schedule()`` plus ``update_from_output``) with their ratio.

Run in the bench venv from the repository root:
``PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_hisparse_caching_diff.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benches" / "peers")]

import test_integrations_vllm_hisparse_caching as streams  # noqa: E402

SHAPES = [(80, 40, 1), (48, 60, 1), (120, 24, 1), (100, 40, 3)]


def _timed(scheduler: Any, timings: list[float]) -> Any:
    """``scheduler`` with ``schedule`` and ``update_from_output`` timed into ``timings``."""
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
    return scheduler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    agree, total, steps = 0, 0, 0
    theirs_s: list[float] = []
    ours_s: list[float] = []
    for num_blocks, host_num_blocks, groups in SHAPES:
        for seed in range(args.seeds):
            total += 1
            theirs, ours, peer = streams._pair(num_blocks, host_num_blocks, groups)
            _timed(theirs, theirs_s)
            _timed(ours, ours_s)
            try:
                streams._stream(theirs, ours, peer, seed)
                agree += 1
            except AssertionError as err:
                print(f"shape {num_blocks}/{host_num_blocks}/{groups} seed {seed}: {err}")
    steps = len(theirs_s)
    vllm_us = statistics.median(theirs_s) * 1e6
    ours_us = statistics.median(ours_s) * 1e6
    print(f"{agree}/{total} streams agree on every step ({steps} steps)")
    print(
        f"median per step: vLLM Scheduler {vllm_us:.1f} us, adapter {ours_us:.1f} us "
        f"(vLLM / adapter {vllm_us / ours_us:.2f}x)"
    )


if __name__ == "__main__":
    main()
