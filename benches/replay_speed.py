"""Replay speed of ``vllm_v1`` with prefix caching on Mooncake-style traces, under an older
build and this one, interleaved, each run in a fresh interpreter pinned to core 1 (issue 18):

(a) a 100k-request synthetic Mooncake-style trace defined here (``synthetic_trace``):
    512-token hash blocks, prompts that open with one of a few hundred shared prefixes
    (zipf-popular system prompts / documents) followed by the request's own blocks;
(b) the real Mooncake conversation trace (12k requests, 12k-token prompts), skipped
    when ``../shared/data/traces/mooncake/conversation_trace.jsonl`` is absent;
(c) the built-in job, ``simulate(config_from_mapping({"workload": {**default_workload(),
    "num_requests": N}}))`` (``--builtin-requests N``, 200k by default), its workload made
    in the child by each side's own ``default_workload()``.

(a) and (b) run on 4 x Llama-3.1-8B / H100 SXM, vllm_v1 replicas with prefix caching, round-robin
routing, the default execution model. The script builds nothing: OLD is a
``pip install --no-deps --target`` folder of a wheel built from git, e.g.

    maturin build --release -o /tmp/kv-old-wheel           # in a worktree of the old commit
    pip install --no-deps --target /tmp/kv-old /tmp/kv-old-wheel/*.whl
    .venv/bin/python benches/replay_speed.py [--repeat 3] [--old /tmp/kv-old]

For each workload it prints the median of requests per wall second of ``simulate()``'s
Rust loop (``summary["wall_s"]``) for each side, the ratio new/old (and of the child's CPU
seconds in ``simulate()``, the steadier figure on a shared machine), whether the two
sides' outputs are bit-identical (a hash of every per-request column), and each side's
peak RSS (the whole child process).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REAL_TRACE = HERE.parent.parent / "shared/data/traces/mooncake/conversation_trace.jsonl"
BLOCK = 512


def synthetic_trace(path: Path, num_requests: int = 100_000, seed: int = 18) -> None:
    """A Mooncake-format trace (timestamps in ms) with shared prefixes: 400 prefixes of
    1-16 blocks, chosen zipf-popular, then 0-6 blocks of the request's own; the prompt
    ends part way into its last block. Poisson arrivals at 60 requests/s over the 4
    replicas; outputs 16-512 tokens."""
    rng = np.random.default_rng(seed)
    num_prefixes = 400
    prefix_len = rng.integers(1, 17, num_prefixes)
    starts = np.concatenate([[0], np.cumsum(prefix_len)])
    next_id = int(starts[-1])
    weights = 1.0 / np.arange(1, num_prefixes + 1) ** 0.9
    weights /= weights.sum()
    which = rng.choice(num_prefixes, num_requests, p=weights)
    own = rng.integers(0, 7, num_requests)
    tail = rng.integers(1, BLOCK + 1, num_requests)
    outputs = rng.integers(16, 513, num_requests)
    times = np.cumsum(rng.exponential(1000.0 / 60.0, num_requests))
    with path.open("w") as f:
        for i in range(num_requests):
            p = int(which[i])
            ids = list(range(int(starts[p]), int(starts[p + 1])))
            ids += range(next_id, next_id + int(own[i]))
            next_id += int(own[i])
            length = (len(ids) - 1) * BLOCK + int(tail[i])
            row = {
                "timestamp": int(times[i]),
                "input_length": length,
                "output_length": int(outputs[i]),
                "hash_ids": ids,
            }
            f.write(json.dumps(row) + "\n")


def job(trace: Path) -> dict[str, object]:
    return {
        "cluster": {"num_replicas": 4},
        "replica": {
            "model": "llama-3.1-8b",
            "device": "h100-sxm",
            "scheduler": {
                "policy": "vllm_v1",
                "enable_prefix_caching": True,
                "max_request_tokens": 131072,
            },
        },
        "workload": {"kind": "trace", "format": "mooncake", "path": str(trace)},
    }


# Run in the child: simulate, then hash every per-request column (name, dtype, bytes).
CHILD = """
import hashlib, json, resource, sys, time
from tokenyard.simulation import config_from_mapping, simulate
config = json.loads(sys.argv[1])
if "builtin_requests" in config:
    from tokenyard.simulation.config import default_workload
    config = {"workload": {**default_workload(), "num_requests": config["builtin_requests"]}}
cpu = time.process_time()
r = simulate(config_from_mapping(config))
cpu = time.process_time() - cpu
h = hashlib.sha256()
for name in sorted(r.columns):
    col = r.columns[name]
    h.update(name.encode()); h.update(str(col.dtype).encode()); h.update(col.tobytes())
print(json.dumps({"wall_s": r.summary["wall_s"], "n": r.summary["num_requests"], "cpu_s": cpu,
                  "hash": h.hexdigest(), "hit": r.summary["throughput"]["prefix_hit_rate"],
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_side(old: str | None, config: dict[str, object]) -> dict[str, object]:
    env = dict(os.environ)
    if old is not None:
        env["PYTHONPATH"] = old
    res = subprocess.run(
        ["taskset", "-c", "1", sys.executable, "-c", CHILD, json.dumps(config)],
        env=env,
        capture_output=True,
        text=True,
        cwd="/tmp",
        check=True,
    )
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def compare(name: str, config: dict[str, object], old: str, repeat: int) -> None:
    runs: dict[str, list[dict[str, object]]] = {"old": [], "new": []}
    for _ in range(repeat):
        runs["old"].append(run_side(old, config))
        runs["new"].append(run_side(None, config))
    rate: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for side, rs in runs.items():
        walls = [float(str(r["wall_s"])) for r in rs]
        peak_mb = max(float(str(r["maxrss_mb"])) for r in rs)
        rate[side] = int(str(rs[0]["n"])) / statistics.median(walls)
        cpus = [float(str(r["cpu_s"])) for r in rs]
        cpu[side] = statistics.median(cpus)
        print(
            f"{name} {side}: {rate[side]:,.0f} requests/wall s "
            f"(median of {len(walls)}: {statistics.median(walls):.3f} s; runs "
            f"{[round(w, 3) for w in walls]}; CPU {cpu[side]:.3f} s) "
            f"prefix hit rate {rs[0]['hit']:.4f}, peak RSS {peak_mb:,.0f} MB"
        )
    hashes = {str(r["hash"]) for rs in runs.values() for r in rs}
    # Each side's hashes, so a difference says which side is which (and a side that is
    # not deterministic shows two).
    side_hashes = {side: sorted({str(r["hash"])[:16] for r in rs}) for side, rs in runs.items()}
    print(f"{name} ratio new/old (requests per wall s): {rate['new'] / rate['old']:.2f}")
    # On a shared machine the process's CPU time is the steadier figure.
    print(f"{name} ratio old/new (CPU s in simulate): {cpu['old'] / cpu['new']:.2f}")
    print(
        f"{name} outputs identical: {len(hashes) == 1} "
        f"(old {', '.join(side_hashes['old'])}; new {', '.join(side_hashes['new'])})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="/tmp/kv-old", help="pip --target dir of the old build")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--builtin-requests", type=int, default=200_000)
    parser.add_argument("--only", choices=("synthetic", "mooncake", "builtin"))
    args = parser.parse_args()
    if args.only in (None, "synthetic"):
        trace = Path(f"/tmp/replay_speed_synthetic_{args.requests}.jsonl")
        if not trace.is_file():
            synthetic_trace(trace, args.requests)
        compare("synthetic", job(trace), args.old, args.repeat)
    if args.only in (None, "mooncake"):
        if REAL_TRACE.is_file():
            compare("mooncake", job(REAL_TRACE), args.old, args.repeat)
        else:
            print(f"mooncake: skipped, {REAL_TRACE} is absent")
    if args.only in (None, "builtin"):
        builtin = {"builtin_requests": args.builtin_requests}
        compare(f"builtin {args.builtin_requests}", builtin, args.old, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
