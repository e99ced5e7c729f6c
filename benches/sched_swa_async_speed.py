"""Async scheduling on a window layout: vLLM 0.33's ``AsyncScheduler`` against
``AsyncTokenyardScheduler``, both on one ``VllmConfig`` (``async_scheduling`` on) over a
full-attention group and a sliding-window group (window 128, block 16).

R running decodes (64-token prompts, ``max_tokens`` beyond the run), warmed up until
every request decodes, then ``--steps`` timed steps, two in flight (a step is scheduled
before the one before it lands), as vLLM's batch queue runs them. One step is
``schedule()`` + the runner output + ``update_from_output()`` of the step before,
timed with ``perf_counter_ns``. The sides alternate in rounds; the report gives each
side's median step and the ratio, after checking both scheduled the same tokens in every
timed step and hold as many live blocks per request and group at the end (a weak check of
the window frees: tests/test_integrations_vllm_swa_async.py compares every step).

    PYTHONPATH=python .venv-bench/bin/python benches/sched_swa_async_speed.py
        [--running 512] [--steps 50] [--rounds 5] [--no-block-check]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))

import torch
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm_peer import VllmSchedulerPeer, runner_output

from tokenyard.integrations.vllm import AsyncTokenyardScheduler

BLOCK_SIZE = 16
PROMPT_TOKENS = 64


def build(cls: type, running: int, steps: int) -> Any:
    """A scheduler of ``cls`` holding ``running`` decodes, warmed up past their prefill."""
    common = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    groups = [
        KVCacheGroupSpec(["layers.0.attn"], FullAttentionSpec(**common)),
        KVCacheGroupSpec(["layers.1.attn"], SlidingWindowSpec(**common, sliding_window=128)),
    ]
    max_len = PROMPT_TOKENS + 4 * steps + 64
    num_blocks = 2 * running * (max_len // BLOCK_SIZE + 2) + 64
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_model_len=max_len,
        max_num_seqs=running,
        max_num_batched_tokens=8192,
        block_size=BLOCK_SIZE,
    )
    peer.vllm_config.scheduler_config.async_scheduling = True
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    scheduler = peer.build(cls, config)
    for i in range(running):
        prompt = [(i * 7919 + t) % 30000 + 1 for t in range(PROMPT_TOKENS)]
        scheduler.add_request(peer.make_request(f"r{i}", prompt, max_len - PROMPT_TOKENS))
    return scheduler


def run(cls: type, running: int, steps: int) -> tuple[list[int], list[Any]]:
    """Step times (ns) of ``steps`` timed steps and what each scheduled, then the tables."""
    scheduler = build(cls, running, steps)
    pending: list[Any] = []
    times, scheduled = [], []

    def step() -> Any:
        out = scheduler.schedule()
        pending.append(out)
        if len(pending) == 2:
            old = pending.pop(0)
            scheduler.update_from_output(old, runner_output(scheduler, old))
        return out

    for _ in range(2 * steps):
        warm = all(r.num_computed_tokens >= r.num_prompt_tokens for r in scheduler.running)
        if warm and len(scheduler.running) == running:
            break
        step()
    gc.collect()
    gc.disable()
    for _ in range(steps):
        start = time.perf_counter_ns()
        out = step()
        times.append(time.perf_counter_ns() - start)
        scheduled.append(dict(out.num_scheduled_tokens))
    gc.enable()
    tables = [scheduler.kv_cache_manager.get_block_ids(f"r{i}") for i in range(running)]
    return times, [scheduled, tables]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--running", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--no-block-check",
        action="store_true",
        help="time a build whose window frees differ from vLLM's (the core before the fix)",
    )
    args = parser.parse_args()
    medians: dict[str, list[float]] = {"vllm": [], "tokenyard": []}
    for _ in range(args.rounds):
        t_v, seen_v = run(AsyncScheduler, args.running, args.steps)
        t_t, seen_t = run(AsyncTokenyardScheduler, args.running, args.steps)
        if seen_v[0] != seen_t[0]:
            raise SystemExit("the two sides scheduled different tokens")
        if not args.no_block_check and [[len(g) - g.count(0) for g in t] for t in seen_v[1]] != [
            [len(g) - g.count(0) for g in t] for t in seen_t[1]
        ]:
            raise SystemExit("the two sides hold different numbers of blocks")
        medians["vllm"].append(statistics.median(t_v) / 1e6)
        medians["tokenyard"].append(statistics.median(t_t) / 1e6)
    v, t = statistics.median(medians["vllm"]), statistics.median(medians["tokenyard"])
    print(f"running {args.running}, {args.steps} steps x {args.rounds} rounds")
    print(f"vLLM AsyncScheduler      median step {v:.3f} ms")
    print(f"AsyncTokenyardScheduler  median step {t:.3f} ms")
    print(f"ratio {v / t:.2f}x")


if __name__ == "__main__":
    main()
