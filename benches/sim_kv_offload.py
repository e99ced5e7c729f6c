"""What a host-memory KV tier buys on the real Mooncake conversation trace (12,031 requests
over ~59 min, mean prompt 12k tokens, 512-token hash blocks): 4 x Llama-3.1-8B on H100 SXM,
vllm_v1 replicas with prefix caching, priced by the measured kernel tables; the host tier
per replica from none to a few hundred GB, under round-robin and prefix-affinity routing.

Prints, per run: the prefix-hit rate split into GPU and host hits, GB offloaded and loaded
back, the loads' median time, TTFT mean / p50 / p99, TPOT p50, and the replay's wall time.

    .venv/bin/python benches/sim_kv_offload.py [--limit N] [--sizes 0,100,400] [--json out]
                                               [--repeat 3]

``--repeat N`` runs every configuration N times, interleaved, and reports the median wall
time (the replay cost of the tier against none, measured in one process).

Needs ``../shared/data/traces/mooncake/conversation_trace.jsonl`` (docs/disaggregation.md
shows a run of it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent.parent / "shared/data/traces/mooncake/conversation_trace.jsonl"
ROUTERS = ("round_robin", "prefix_affinity")


def config(host_memory_gb: float, routing: str, limit: int | None) -> dict[str, Any]:
    workload: dict[str, Any] = {"kind": "trace", "format": "mooncake", "path": str(TRACE)}
    if limit:
        workload["limit"] = limit
    replica: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "device": "h100-sxm",
        "scheduler": {
            "policy": "vllm_v1",
            "enable_prefix_caching": True,
            "max_request_tokens": 131072,
        },
    }
    if host_memory_gb:
        replica["kv_offload"] = {"host_memory_gb": host_memory_gb}
    return {
        "cluster": {"num_replicas": 4, "global_scheduler": {"policy": routing}},
        "replica": replica,
        "workload": workload,
    }


def run_one(host_memory_gb: float, routing: str, limit: int | None) -> dict[str, Any]:
    from tokenyard.simulation import config_from_mapping, simulate

    s = simulate(config_from_mapping(config(host_memory_gb, routing, limit))).summary
    offload = s.get("kv_offload") or {}
    hit = s["throughput"]["prefix_hit_rate"]
    ttft = s["latency_s"]["ttft"]
    return {
        "routing": routing,
        "host_memory_gb": host_memory_gb,
        "gpu_hit_rate": offload.get("gpu_hit_rate", hit),
        "host_hit_rate": offload.get("host_hit_rate", 0.0),
        "offloaded_gb": offload.get("offloaded_gb", 0.0),
        "loaded_gb": offload.get("loaded_gb", 0.0),
        "load_p50_ms": offload.get("load_s", {}).get("p50", 0.0) * 1e3,
        "ttft_mean_s": ttft["mean"],
        "ttft_p50_s": ttft["p50"],
        "ttft_p99_s": ttft["p99"],
        "tpot_p50_ms": s["latency_s"]["tpot"]["p50"] * 1e3,
        "num_restarts": s["preemption"]["num_restarts"],
        "wall_s": s["wall_s"],
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'routing':<16}{'host GB':>8}{'GPU hit':>9}{'host hit':>9}{'loaded GB':>10}"
        f"{'load p50':>9}{'TTFT mean':>10}{'p50':>7}{'p99':>7}{'TPOT p50':>9}{'wall s':>7}"
    )
    for r in rows:
        print(
            f"{r['routing']:<16}{r['host_memory_gb']:>8.0f}{r['gpu_hit_rate']:>9.1%}"
            f"{r['host_hit_rate']:>9.1%}{r['loaded_gb']:>10,.0f}{r['load_p50_ms']:>7.1f}ms"
            f"{r['ttft_mean_s']:>10.3f}{r['ttft_p50_s']:>7.3f}{r['ttft_p99_s']:>7.2f}"
            f"{r['tpot_p50_ms']:>7.1f}ms{r['wall_s']:>7.1f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="first N requests only")
    parser.add_argument("--sizes", default="0,100,200,400", help="host GB per replica")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=1, help="interleaved runs per config")
    args = parser.parse_args()
    if not TRACE.exists():
        print(f"needs {TRACE}", file=sys.stderr)
        return 2
    sizes = [float(x) for x in args.sizes.split(",")]
    grid = [(gb, routing) for routing in ROUTERS for gb in sizes]
    rounds = [
        [run_one(gb, routing, args.limit) for gb, routing in grid] for _ in range(args.repeat)
    ]
    rows = rounds[0]
    for i, row in enumerate(rows):
        row["wall_s"] = statistics.median(r[i]["wall_s"] for r in rounds)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
