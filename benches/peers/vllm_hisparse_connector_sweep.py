"""A wider sweep of ``tests/test_integrations_vllm_hisparse_connector.py``'s replay: vLLM
0.33's ``Scheduler``/``AsyncScheduler`` with the real ``HiSparseConnector`` beside the core's
``kv::DeviceResidency`` and the metadata built from it, over more seeds and layouts.

Run from the repository root in the bench venv:
``PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_hisparse_connector_sweep.py
[--seeds 100:120] [--max-num-seqs 6] [--max-num-batched-tokens 64]``. Prints, per mode,
the streams that agreed and what they exercised."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benches" / "peers")]

import test_integrations_vllm_hisparse_connector as replay  # noqa: E402

LAYOUTS = [*replay.LAYOUTS, (40, 40), (200, 100)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="100:120", help="first:last (exclusive)")
    parser.add_argument("--max-num-seqs", type=int, default=6)
    parser.add_argument("--max-num-batched-tokens", type=int, default=64)
    args = parser.parse_args()
    first, last = map(int, args.seeds.split(":"))
    failed = 0
    for async_scheduling in (False, True):
        agreed, totals, start = 0, {}, time.perf_counter()
        for seed in range(first, last):
            for num_blocks, host_num_blocks in LAYOUTS:
                try:
                    seen = replay.run_stream(
                        seed,
                        num_blocks,
                        host_num_blocks,
                        async_scheduling=async_scheduling,
                        workers=1 + seed % 2,
                        max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                    )
                except AssertionError as err:
                    failed += 1
                    print(f"differs: seed {seed} {num_blocks}/{host_num_blocks}: {err}")
                    continue
                agreed += 1
                for key, value in seen.items():
                    totals[key] = totals.get(key, 0) + value
        streams = (last - first) * len(LAYOUTS)
        mode = "async" if async_scheduling else "sync"
        print(f"{mode}: {agreed}/{streams} agree ({time.perf_counter() - start:.0f} s) {totals}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
