"""Scheduler time on vLLM 0.33's SWA bounded-replay layout (a full-attention group beside
``SlidingWindowMLASpec(bounded_replay=True)``): vLLM's own ``Scheduler`` against
``TokenyardScheduler`` on one seeded stream of requests sharing long prefixes, so most
admissions replay a hit's last window. Both are driven through vLLM's interface (schedule,
a one-token model output per sampling request, update_from_output); the outputs are checked
equal step by step first, then each side is timed alone. Prints the median over
``--repeats`` runs of each side's total time and the ratio.

    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_replay_speed.py

``--streams N`` instead runs N random streams of tests/test_integrations_vllm_replay.py's
step-by-step comparison (a third each: roomy cache, a chunk cap below the window, a tight
cache that preempts) and prints how many agree.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm_peer import VllmSchedulerPeer, bounded_replay_groups, runner_output

from tokenyard.integrations.vllm import TokenyardScheduler

BLOCK_SIZE = 16
WINDOW = 128


def build(cls: Any, peer: Any, num_blocks: int) -> Any:
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=bounded_replay_groups(WINDOW, block_size=BLOCK_SIZE),
    )
    return peer.build(cls, config, log_stats=False)


def stream(seed: int, num_requests: int) -> list[tuple[str, list[int], int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 30000) for _ in range(1024)] for _ in range(8)]
    out = []
    for i in range(num_requests):
        prefix = rng.choice(prefixes)[: rng.choice((256, 512, 1024))]
        tail = [rng.randrange(1, 30000) for _ in range(rng.randrange(16, 256))]
        out.append((f"r{i}", prefix + tail, rng.randrange(16, 128)))
    return out


def run(cls: Any, args: Any, record: list[Any] | None = None) -> float:
    peer = VllmSchedulerPeer(
        num_blocks=args.num_blocks,
        max_model_len=2048,
        block_size=BLOCK_SIZE,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
    )
    scheduler = build(cls, peer, args.num_blocks)
    requests = [peer.make_request(i, p, m) for i, p, m in stream(args.seed, args.requests)]
    elapsed = 0.0
    for request in requests:
        scheduler.add_request(request)
    while scheduler.has_unfinished_requests():
        start = time.perf_counter()
        out = scheduler.schedule()
        scheduler.update_from_output(out, runner_output(scheduler, out))
        elapsed += time.perf_counter() - start
        if record is not None:
            record.append(
                (
                    dict(out.num_scheduled_tokens),
                    sorted((r.req_id, r.replay_start) for r in out.scheduled_new_reqs),
                )
            )
    return elapsed


def agreement(num_streams: int) -> None:
    sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))
    import test_integrations_vllm_replay as replay

    options = [
        {"num_blocks": 200},
        {"num_blocks": 200, "long_prefill_token_threshold": 16},
        {"num_blocks": 40, "max_tokens": 150, "max_num_seqs": 8},
    ]
    agree = replays = preemptions = 0
    start = time.perf_counter()
    for i in range(num_streams):
        try:
            seen = replay._run(seed=1000 + i, **options[i % 3])
        except AssertionError as error:
            print(f"seed {1000 + i} {options[i % 3]}: {str(error)[:300]}")
            continue
        agree += 1
        replays += seen["replays"]
        preemptions += seen["preemptions"]
    print(
        f"{agree} / {num_streams} streams agree; replaying admissions {replays}, "
        f"preemptions {preemptions}; {time.perf_counter() - start:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--num-blocks", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--streams", type=int, default=0)
    args = parser.parse_args()
    if args.streams:
        agreement(args.streams)
        return
    theirs: list[Any] = []
    ours: list[Any] = []
    run(Scheduler, args, theirs)
    run(TokenyardScheduler, args, ours)
    assert ours == theirs, "the two schedulers' steps differ"
    replays = sum(start > 0 for _, new in theirs for _, start in new)
    times = {"vllm": [], "tokenyard": []}
    for _ in range(args.repeats):
        times["vllm"].append(run(Scheduler, args))
        times["tokenyard"].append(run(TokenyardScheduler, args))
    vllm_s = statistics.median(times["vllm"])
    ours_s = statistics.median(times["tokenyard"])
    print(
        f"steps {len(theirs)} (equal on both), replaying admissions {replays}; "
        f"median of {args.repeats}: vLLM {vllm_s * 1e3:.1f} ms, tokenyard {ours_s * 1e3:.1f} ms, "
        f"ratio {vllm_s / ours_s:.2f}x"
    )


if __name__ == "__main__":
    main()
