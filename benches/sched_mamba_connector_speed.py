"""What a KV connector's ``supports_divergent_local_hybrid_hits`` costs the step scheduler
with a Mamba ``align`` group beside full attention (vLLM 0.33's
``get_computed_blocks_for_connector``: each group looked up alone, then full attention's hit
or the reconciled one): a stream of requests sharing prefixes run to completion with a
connector that has the property against one without (the reconciled lookup, as before),
and full attention alone with the same connector for scale. Medians of 5 runs each, the
layouts interleaved.

    PYTHONPATH=python .venv/bin/python benches/sched_mamba_connector_speed.py [--requests 512]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from sched_steps import run_step

from tokenyard.kv import FullAttentionSpec, MambaSpec
from tokenyard.sched import Scheduler, SchedulerConfig

BLOCK = 16


class Connector:
    """Loads nothing (every lookup also asks it), with or without the property."""

    def __init__(self, divergent: bool) -> None:
        self.supports_divergent_local_hybrid_hits = divergent

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return 0, False

    def update_state_after_alloc(self, request: Any, block_ids: Any, num_external: int) -> None:
        pass

    def request_finished(self, request: Any, block_ids: Any) -> bool:
        return False


def run(layout: str, num_requests: int, seed: int = 0) -> tuple[float, int, int]:
    """Wall seconds, steps and prefix-hit tokens of the stream on one layout."""
    mamba = layout != "full"
    groups = (FullAttentionSpec(), MambaSpec(mamba_cache_mode="align")) if mamba else ()
    config = SchedulerConfig(
        max_num_batched_tokens=2048,
        num_blocks=20_000,
        block_size=BLOCK,
        enable_prefix_caching=True,
        kv_groups=groups,
        mamba_align_block_size=BLOCK if mamba else 0,
    )
    s = Scheduler(config, connector=Connector(layout == "mamba+divergent"))
    rng = random.Random(seed)
    prefixes = [[rng.randrange(30_000) for _ in range(256)] for _ in range(8)]
    for i in range(num_requests):
        tail = [rng.randrange(30_000) for _ in range(rng.randrange(16, 256))]
        s.add_request(i, prefixes[i % 8] + tail, 16)
    steps = 0
    t = time.perf_counter()
    while s.has_unfinished_requests():
        run_step(s)
        steps += 1
    return time.perf_counter() - t, steps, s.stats().prefix_cache_hits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=512)
    args = parser.parse_args()
    layouts = ("full", "mamba", "mamba+divergent")
    runs: dict[str, list[tuple[float, int, int]]] = {k: [] for k in layouts}
    for _ in range(5):
        for layout in layouts:
            runs[layout].append(run(layout, args.requests))
    base = statistics.median(r[0] for r in runs["mamba"])
    for layout in layouts:
        wall = statistics.median(r[0] for r in runs[layout])
        _, steps, hits = runs[layout][0]
        print(
            f"{layout:16s} {wall * 1e3:8.1f} ms  {steps} steps  {hits} hit tokens  "
            f"/ mamba (reconciled lookup) {wall / base:.3f}"
        )


if __name__ == "__main__":
    main()
