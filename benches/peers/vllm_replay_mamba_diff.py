"""Differential fuzz of tokenyard's vLLM adapter against vLLM 0.33's ``Scheduler`` with SWA
bounded replay beside a Mamba ``align`` group: full attention, a
``SlidingWindowMLASpec(bounded_replay=True)`` group of a 32-token window (DeepSeek-V4.1's
layout, ``vllm_peer.bounded_replay_groups``) and a ``MambaSpec(mamba_cache_mode="align")``
group, the split on (``cache_config.mamba_cache_mode = "align"``). Seeded streams of prompts
sharing prefixes shorter and longer than the window; every step's scheduled tokens, computed
tokens, ``replay_start``, new and cached blocks per group, preemptions, KV usage and block
tables compared (``tests/vllm_compare.compare_stream``).

What it probes: a hit no longer than the replayed window is dropped (vLLM's ``schedule()``:
``0 < num_computed_tokens <= prefix_replay_tokens``), and vLLM keeps the request's
``shared_prefix_boundary`` from the lookup, so the Mamba split still stops at the junction
(``_mamba_block_aligned_split``). Prints how many streams agree, how many exercised a
replay-window drop with a junction kept (``junction kept``), and each differing stream's
first differing step.

    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_replay_mamba_diff.py [--streams 60]
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benches" / "peers")]

WINDOW = 32
BLOCK = 16


def groups() -> list[Any]:
    """FA + SWA bounded replay (window 32) + Mamba ``align``, blocks of 16."""
    import torch
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec
    from vllm_peer import bounded_replay_groups

    mamba = MambaSpec(
        block_size=BLOCK, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"
    )
    return [*bounded_replay_groups(WINDOW, block_size=BLOCK), KVCacheGroupSpec(["mamba"], mamba)]


def build(num_blocks: int, budget: int) -> tuple[Any, Any, Any]:
    """vLLM's Scheduler and TokenyardScheduler over :func:`groups`, the split on."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm_peer import VllmSchedulerPeer

    from tokenyard.integrations.vllm import TokenyardScheduler

    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_num_seqs=4,
        max_model_len=512,
        max_num_batched_tokens=budget,
        block_size=BLOCK,
    )
    peer.vllm_config.cache_config.mamba_cache_mode = "align"
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups())
    theirs, ours = (peer.build(cls, config) for cls in (Scheduler, TokenyardScheduler))
    assert theirs.need_mamba_block_aligned_split
    assert ours.need_mamba_block_aligned_split
    assert theirs.prefix_replay_tokens == ours.prefix_replay_tokens == WINDOW
    return theirs, ours, peer


def run(seed: int) -> dict[str, int]:
    """One seeded stream compared step by step. Returns what it exercised: replays,
    preemptions, and admissions whose hit vLLM dropped for the window while keeping a
    shared-prefix boundary (``junction kept``)."""
    from vllm_compare import block_digest, compare_stream, seeded_arrivals

    rng = random.Random(seed)
    num_blocks = [60, 120, 240][seed % 3]
    budget = [32, 64, 128][seed % 3 if seed % 2 else (seed // 2) % 3]
    theirs, ours, peer = build(num_blocks, budget)
    arrivals = seeded_arrivals(
        rng,
        count=10,
        prefix_tokens=160,
        shared=(0, 16, 24, 32, 40, 48, 64, 100, 160),
        tail_max=100,
        arrive_by=12,
        max_tokens=30,
        lowest_token=1,
        max_prompt=400,
    )
    seen = {"replays": 0, "junction kept": 0}

    def observe(outs: list[Any]) -> None:
        for new in outs[0].scheduled_new_reqs:
            seen["replays"] += new.replay_start > 0
            request = theirs.requests[new.req_id]
            if request.shared_prefix_boundary and new.num_computed_tokens == 0:
                seen["junction kept"] += 1

    stream = compare_stream(
        theirs,
        ours,
        arrivals,
        peer.make_request,
        digest=lambda out: block_digest(out, replay=True, finished=False),
        settle_steps=12,
        on_scheduled=observe,
    )
    return {**seen, "preemptions": len(stream.preempted)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=60)
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    agreed, totals = 0, {"replays": 0, "junction kept": 0, "preemptions": 0}
    for seed in range(args.first_seed, args.first_seed + args.streams):
        try:
            seen = run(seed)
        except AssertionError as err:
            print(f"seed {seed}: differs at {err}")
            continue
        agreed += 1
        for key, value in seen.items():
            totals[key] += value
    print(f"{agreed}/{args.streams} streams agree; over them: {totals}")
    return 0 if agreed == args.streams else 1


if __name__ == "__main__":
    sys.exit(main())
