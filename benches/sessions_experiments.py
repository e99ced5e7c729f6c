"""The experiments of docs/workloads.md (Sessions, Closed-loop load): prefix caching and
prefix-aware routing on a multi-turn workload, and a closed-loop throughput-latency curve.

    .venv/bin/python benches/sessions_experiments.py [--quick]

Prints markdown tables. Simulated numbers only (the default model and GPU of
``tokenyard simulate``, measured execution times): they are deterministic, so a rerun gives
the same tables.
"""

from __future__ import annotations

import argparse
from typing import Any

from tokenyard.simulation import config_from_mapping, simulate


def chat_sessions(num_sessions: int) -> dict[str, Any]:
    """Chats: 2-12 turns, a 1.5k-token first prompt, ~150 new tokens and ~250 output per
    turn, 5 s mean think time, new sessions at 0.5/s (about 4 turns/s in all)."""
    return {
        "kind": "sessions",
        "num_sessions": num_sessions,
        "seed": 7,
        "turns": {"kind": "uniform", "low": 2, "high": 12},
        "first_prompt_tokens": {"kind": "lognormal", "median": 1500, "sigma": 0.5},
        "input_tokens": {"kind": "lognormal", "median": 150, "sigma": 0.8},
        "output_tokens": {"kind": "lognormal", "median": 250, "sigma": 0.6},
        "think_time": {"kind": "exponential", "mean_s": 5.0},
        "arrival": {"kind": "poisson", "qps": 0.5},
        "max_context_tokens": 8192,
    }


def run(workload: dict[str, Any], router: str, caching: bool = True) -> dict[str, Any]:
    mapping: dict[str, Any] = {
        "cluster": {"num_replicas": 4, "global_scheduler": {"policy": router}},
        "workload": workload,
    }
    if not caching:
        mapping["replica"] = {"scheduler": {"vllm_v1": {"enable_prefix_caching": False}}}
    return simulate(config_from_mapping(mapping)).summary


def prefix_experiment(num_sessions: int) -> None:
    workload = chat_sessions(num_sessions)
    print(
        "| routing | prefix cache | hit rate | TTFT turn 1 | turn 2 | turn 4 | turn 9+ "
        "| TTFT p99 | session time mean |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    cases = [
        ("round_robin", False),
        ("round_robin", True),
        ("least_kv_load", True),
        ("prefix_affinity", True),
    ]
    for router, caching in cases:
        s = run(workload, router, caching)
        turns = s["sessions"]["per_turn"]
        ttft = [turns[k]["ttft_mean"] * 1e3 for k in ("0", "1", "3", "8+") if k in turns]
        cells = " | ".join(f"{t:.0f} ms" for t in ttft)
        print(
            f"| {router} | {'on' if caching else 'off'} | "
            f"{s['throughput']['prefix_hit_rate']:.1%} | {cells} | "
            f"{s['latency_s']['ttft']['p99'] * 1e3:.0f} ms | "
            f"{s['sessions']['session_time_s']['mean']:.1f} s |"
        )


def closed_loop_experiment(num_requests: int) -> None:
    print("| users | requests/s | output tok/s | TTFT p50 | TTFT p99 | TPOT mean | e2e p50 |")
    print("|---|---|---|---|---|---|---|")
    for users in (1, 4, 16, 64, 128, 256, 512):
        workload = {
            "kind": "synthetic",
            "num_requests": num_requests,
            "seed": 3,
            "arrival": {"kind": "poisson", "qps": 1e6},
            "prompt_tokens": {
                "kind": "lognormal",
                "median": 1000,
                "sigma": 0.6,
                "max_tokens": 6000,
            },
            "output_tokens": {"kind": "lognormal", "median": 250, "sigma": 0.6, "max_tokens": 2000},
            "closed_loop": {"concurrency": users},
        }
        s = run(workload, "round_robin")
        t, lat = s["throughput"], s["latency_s"]
        print(
            f"| {users} | {t['requests_per_s']:.2f} | {t['decode_tokens_per_s']:,.0f} | "
            f"{lat['ttft']['p50'] * 1e3:.0f} ms | {lat['ttft']['p99'] * 1e3:.0f} ms | "
            f"{lat['tpot']['mean'] * 1e3:.1f} ms | {lat['e2e']['p50']:.2f} s |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    args = parser.parse_args()
    print("## Multi-turn chats on 4 replicas\n")
    prefix_experiment(150 if args.quick else 600)
    print("\n## Closed-loop load on 4 replicas\n")
    closed_loop_experiment(1000 if args.quick else 4000)


if __name__ == "__main__":
    main()
