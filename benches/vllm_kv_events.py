"""What vLLM 0.33's KV cache events cost the adapter, and how often they agree with vLLM's.

Runs seeded text streams (prefix hits, evictions, preemptions) on vLLM's ``Scheduler`` and
on ``TokenyardScheduler``, each with ``KVEventsConfig(enable_kv_cache_events=True)`` and a
publisher that keeps the batches, and reports (1) how many published batches and events
are equal, field for field, and (2) the adapter's wall time per stream with events off and
on, as medians over rounds (the ratio is measured in the same run).

``--groups window`` runs a full-attention group beside a sliding-window group (window 40),
``--report full`` has every request ask for ``kv_cache_report_mode="full"``.

Run in the bench venv (vLLM 0.33):
    PYTHONPATH=python .venv-bench/bin/python benches/vllm_kv_events.py --streams 50
        [--groups one|window] [--report incremental|full]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent / "peers"))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

import torch
from vllm.config import KVEventsConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request
from vllm_compare import BLOCK_SIZE, compare_stream, seeded_arrivals
from vllm_peer import VllmSchedulerPeer, runner_output

from tokenyard.integrations.vllm import TokenyardScheduler


class Capture:
    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def publish(self, batch: Any) -> None:
        self.batches.append(list(batch.events))

    def shutdown(self) -> None:
        pass


def _peer(num_blocks: int, events: bool) -> VllmSchedulerPeer:
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        max_model_len=1024,
        max_num_seqs=8,
        max_num_batched_tokens=128,
    )
    if events:
        peer.vllm_config.kv_events_config = KVEventsConfig(
            enable_kv_cache_events=True, publisher="null"
        )
    return peer


GROUPS = "one"
REPORT = "incremental"


def _config(peer: VllmSchedulerPeer, num_blocks: int) -> Any:
    """The peer's one group, or full attention beside a window (``--groups window``)."""
    if GROUPS == "one":
        return peer.scheduler.kv_cache_config
    common = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    groups = [
        KVCacheGroupSpec(["layers.0"], FullAttentionSpec(**common)),
        KVCacheGroupSpec(["layers.1"], SlidingWindowSpec(sliding_window=40, **common)),
    ]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def _request(peer: VllmSchedulerPeer, request_id: str, prompt: list[int], n: int) -> Request:
    extra = {"kv_cache_report_mode": "full"} if REPORT == "full" else None
    params = SamplingParams(max_tokens=n, extra_args=extra)
    return Request(request_id, prompt, params, None, block_hasher=peer._block_hasher)


def _arrivals(seed: int) -> list[Any]:
    rng = random.Random(seed)
    return seeded_arrivals(rng, tail_max=60, max_tokens=40, count=16, arrive_by=12)


def agreement(num_streams: int) -> tuple[int, int, int, int]:
    """(streams equal, streams, events equal, events) over seeded streams."""
    same_streams = same_events = total_events = 0
    for seed in range(num_streams):
        num_blocks = (14, 24, 60)[seed % 3] * (1 if GROUPS == "one" else 2)
        peer = _peer(num_blocks, events=True)
        config = _config(peer, num_blocks)
        theirs, ours = (peer.build(cls, config) for cls in (Scheduler, TokenyardScheduler))
        captures = Capture(), Capture()
        theirs.kv_event_publisher, ours.kv_event_publisher = captures

        def make(rid: str, prompt: list[int], n: int, peer: Any = peer) -> Request:
            return _request(peer, rid, prompt, n)

        compare_stream(theirs, ours, _arrivals(seed), make, max_steps=3000)
        vllms = [e for batch in captures[0].batches for e in batch]
        mine = [e for batch in captures[1].batches for e in batch]
        total_events += len(vllms)
        same_events += sum(a == b for a, b in zip(vllms, mine, strict=False))
        same_streams += captures[0].batches == captures[1].batches
    return same_streams, num_streams, same_events, total_events


def adapter_seconds(seed: int, events: bool) -> float:
    """The adapter's wall time for one stream (schedule + update_from_output)."""
    num_blocks = 24 if GROUPS == "one" else 48
    peer = _peer(num_blocks, events)
    ours = peer.build(TokenyardScheduler, _config(peer, num_blocks))
    if events:
        ours.kv_event_publisher = Capture()
    arrivals = _arrivals(seed)
    start = time.perf_counter()
    for step in range(3000):
        for at, rid, prompt, n in arrivals:
            if at == step:
                ours.add_request(_request(peer, rid, prompt, n))
        out = ours.schedule()
        ours.update_from_output(out, runner_output(ours, out))
        if step > 12 and not ours.has_unfinished_requests():
            break
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--groups", choices=("one", "window"), default="one")
    parser.add_argument("--report", choices=("incremental", "full"), default="incremental")
    args = parser.parse_args()
    global GROUPS, REPORT
    GROUPS, REPORT = args.groups, args.report
    same, n, same_events, total = agreement(args.streams)
    print(f"agreement: {same}/{n} streams, {same_events}/{total} events equal")
    off, on = [], []
    for _ in range(args.rounds):
        off.append(sum(adapter_seconds(s, False) for s in range(10)))
        on.append(sum(adapter_seconds(s, True) for s in range(10)))
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(
        f"adapter, 10 streams: events off {m_off * 1e3:.1f} ms, on {m_on * 1e3:.1f} ms "
        f"(median of {args.rounds}; on/off {m_on / m_off:.2f}x)"
    )


if __name__ == "__main__":
    main()
