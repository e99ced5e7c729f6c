"""What the Mooncake store and UMBP connectors' scheduler halves cost, vLLM 0.33.0's own
``Scheduler`` against ``tokenyard.integrations.vllm.TokenyardScheduler``: the seeded
three-wave streams of ``tests/test_integrations_vllm_mooncake_store.py`` (24 requests
sharing prefixes, a second wave evicting the first's blocks from a 40-block GPU pool, a
third asking the first's prompts again, loaded from the modelled store), the workers'
reports synthesized as there, run to completion on each scheduler alone. Timed: every
``schedule()`` + ``update_from_output()`` of the stream (``perf_counter_ns``), the sides
alternating; each figure is the median of ``--rounds`` runs, and the ratio is vLLM's
median over tokenyard's. Without a connector (the same stream) for scale.

    PYTHONPATH=python .venv-bench/bin/python benches/sched_store_connectors_speed.py
        [--rounds 5] [--seeds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).parent / "peers"))

import test_integrations_vllm_mooncake_store as mooncake
import test_integrations_vllm_umbp as umbp
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import (
    scheduler as mooncake_scheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime.factory import (
    UMBPRuntimeFactory,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_compare import runner_output
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import TokenyardScheduler

NUM_BLOCKS = 40


def _stream(kind: str, cls: type, seed: int) -> tuple[int, int]:
    """Nanoseconds in the scheduler's calls over the whole stream, and its steps."""
    if kind == "mooncake":
        peer = mooncake._peer(mooncake._mooncake(), NUM_BLOCKS, False)
    elif kind == "umbp":
        peer = mooncake._peer(umbp._umbp(), NUM_BLOCKS, False)
    else:
        peer = VllmSchedulerPeer(
            num_blocks=NUM_BLOCKS, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512
        )
    scheduler = peer.build(cls, mooncake._kv_cache_config(NUM_BLOCKS))
    worker: Any = None
    if kind == "mooncake":
        worker = mooncake._Worker(scheduler.connector.connector_scheduler.client, True)
    elif kind == "umbp":
        worker = umbp._Worker(scheduler.connector.connector_scheduler.runtime)
    rng = random.Random(seed * 7 + 3)
    arrivals = mooncake._waves(seed)
    spent = 0
    for step in range(800):
        for at, *args in arrivals:
            if at == step:
                scheduler.add_request(peer.make_request(*args))
        start = time.perf_counter_ns()
        out = scheduler.schedule()
        spent += time.perf_counter_ns() - start
        delays = (rng.randrange(3), rng.randrange(3))
        output = runner_output(scheduler, out)
        if worker is not None:
            worker.submit(out, step, delays)
            output.kv_connector_output = worker.report(step)
        start = time.perf_counter_ns()
        scheduler.update_from_output(out, output)
        spent += time.perf_counter_ns() - start
        if step > 150 and not scheduler.has_unfinished_requests():
            return spent, step + 1
    raise AssertionError("the stream did not drain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    mooncake_scheduler.LookupKeyClient = lambda vllm_config: mooncake._Store()  # type: ignore[assignment,misc]
    UMBPRuntimeFactory._builders["embedded"] = umbp._Runtime  # type: ignore[assignment]
    print(f"{'connector':<10} {'vLLM ms':>9} {'tokenyard ms':>13} {'ratio':>7} {'steps':>6}")
    for kind in ("none", "mooncake", "umbp"):
        times: dict[type, list[float]] = {Scheduler: [], TokenyardScheduler: []}
        steps = {}
        for _ in range(args.rounds):
            for cls in (Scheduler, TokenyardScheduler):
                total, n = 0, 0
                for seed in range(args.seeds):
                    spent, count = _stream(kind, cls, seed)
                    total += spent
                    n += count
                times[cls].append(total / 1e6)
                steps[cls] = n
        assert steps[Scheduler] == steps[TokenyardScheduler], steps
        theirs = statistics.median(times[Scheduler])
        ours = statistics.median(times[TokenyardScheduler])
        print(
            f"{kind:<10} {theirs:>9.1f} {ours:>13.1f} {theirs / ours:>6.2f}x {steps[Scheduler]:>6}"
        )


if __name__ == "__main__":
    main()
