"""What vLLM 0.33's KV cache events cost the adapter, and how often they agree with vLLM's.

Runs seeded text streams (prefix hits, evictions, preemptions) on vLLM's ``Scheduler`` and
on ``TokenyardScheduler``, each with ``KVEventsConfig(enable_kv_cache_events=True)`` and a
publisher that keeps the batches, and reports (1) how many published batches and events
are equal, field for field, and (2) the adapter's wall time per stream with events off and
on, as medians over rounds (the ratio is measured in the same run).

Run in the bench venv (vLLM 0.33):
    PYTHONPATH=python .venv-bench/bin/python benches/vllm_kv_events.py --streams 50
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

from vllm.config import KVEventsConfig
from vllm.v1.core.sched.scheduler import Scheduler
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


def _arrivals(seed: int) -> list[Any]:
    rng = random.Random(seed)
    return seeded_arrivals(rng, tail_max=60, max_tokens=40, count=16, arrive_by=12)


def agreement(num_streams: int) -> tuple[int, int, int, int]:
    """(streams equal, streams, events equal, events) over seeded streams."""
    same_streams = same_events = total_events = 0
    for seed in range(num_streams):
        peer = _peer((14, 24, 60)[seed % 3], events=True)
        config = peer.scheduler.kv_cache_config
        theirs, ours = (peer.build(cls, config) for cls in (Scheduler, TokenyardScheduler))
        captures = Capture(), Capture()
        theirs.kv_event_publisher, ours.kv_event_publisher = captures
        compare_stream(theirs, ours, _arrivals(seed), peer.make_request, max_steps=3000)
        vllms = [e for batch in captures[0].batches for e in batch]
        mine = [e for batch in captures[1].batches for e in batch]
        total_events += len(vllms)
        same_events += sum(a == b for a, b in zip(vllms, mine, strict=False))
        same_streams += captures[0].batches == captures[1].batches
    return same_streams, num_streams, same_events, total_events


def adapter_seconds(seed: int, events: bool) -> float:
    """The adapter's wall time for one stream (schedule + update_from_output)."""
    peer = _peer(24, events)
    ours = peer.build(TokenyardScheduler, peer.scheduler.kv_cache_config)
    if events:
        ours.kv_event_publisher = Capture()
    arrivals = _arrivals(seed)
    start = time.perf_counter()
    for step in range(3000):
        for at, rid, prompt, n in arrivals:
            if at == step:
                ours.add_request(peer.make_request(rid, prompt, n))
        out = ours.schedule()
        ours.update_from_output(out, runner_output(ours, out))
        if step > 12 and not ours.has_unfinished_requests():
            break
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
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
