"""Wall time of a 50-point deployment search at 10,000 requests per simulation, on the local
cores (``tokenyard.search.deployment_search``, process pool), and the cost per simulation,
so a reader can scale it to a 10,000-point search.

The grid (``GRID`` below): Llama-2-7B, 2 GPU profiles (variants: A100-80GB with the default
linear coefficients, H100 with faster ones) x 5 replica counts (1-16) x 5 vLLM V1 step
budgets (``max_num_batched_tokens`` 512-8192) = 50 points; SLOs p99 TTFT <= 2 s and p99
TBT <= 200 ms with the p99 scheduling-delay guard at 2 s; lognormal requests (median 512
prompt and 128 output tokens), Poisson arrivals; bisection to 2%.

Reported: wall seconds; simulations (total and per point); per simulation, the mean and
p50/p90/max of its own wall time (``run_probe``: config, workload, Rust loop, summary);
CPU-seconds of simulation summed over workers and the parallel efficiency (CPU-seconds /
(wall x workers)); and the extrapolation ``points x simulations per point x seconds per
simulation / workers`` for 10,000 points.

    .venv/bin/python benches/search_grid.py --json benches/out/search_grid.json   # ~3 min
    .venv/bin/python benches/search_grid.py --requests 1000 --quick               # ~5 s
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_model, loadavg

from tokenyard.search import deployment_search, search_config_from_mapping

H100 = {
    "name": "h100",
    "replica.device": "h100-80gb",
    "execution.model": "linear",
    "execution.constant_s": 0.0045,
    "execution.per_prefill_token_s": 4.4e-5,
    "execution.per_decode_token_s": 1.9e-5,
    "execution.per_decode_context_token_s": 1.6e-7,
}


def grid(num_requests: int) -> dict[str, Any]:
    return {
        "simulation": {
            "seed": 0,
            "replica": {"model": "llama-2-7b", "scheduler": {"policy": "vllm_v1"}},
            "workload": {
                "kind": "synthetic",
                "num_requests": num_requests,
                "seed": 0,
                "arrival": {"kind": "poisson", "qps": 1.0},
                "prompt_tokens": {"kind": "lognormal", "median": 512, "sigma": 0.6},
                "output_tokens": {"kind": "lognormal", "median": 128, "sigma": 0.6},
            },
        },
        "slo": {"ttft_p99_s": 2.0, "tbt_p99_s": 0.2},
        "search": {"initial_qps": 8.0, "tolerance": 0.02, "max_scheduling_delay_p99_s": 2.0},
        "grid": {
            "cluster.num_replicas": [1, 2, 4, 8, 16],
            "replica.scheduler.max_num_batched_tokens": [512, 1024, 2048, 4096, 8192],
        },
        "variants": [{"name": "a100", "replica.device": "a100-80gb"}, H100],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="per simulation")
    parser.add_argument("--quick", action="store_true", help="4 points instead of 50")
    parser.add_argument("--workers", type=int, default=None, help="default: all cores")
    parser.add_argument("--ray", metavar="ADDRESS", help="run on Ray instead ('local', 'auto')")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args()

    doc = grid(args.requests)
    if args.quick:  # 4 points: A100, 1-2 replicas, two budgets
        doc["variants"] = doc["variants"][:1]
        doc["grid"] = {
            "cluster.num_replicas": [1, 2],
            "replica.scheduler.max_num_batched_tokens": [1024, 2048],
        }
    config = search_config_from_mapping(doc)
    workers = args.workers or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as out:  # empty: nothing is reused
        start = time.perf_counter()
        result = deployment_search(
            config,
            output_dir=out,
            executor="ray" if args.ray else "local",
            workers=workers,
            ray_address=args.ray,
            progress=True,
        )
        wall = time.perf_counter() - start
    sims = [p["wall_s"] for p in result.probes]
    points = len({r["point"] for r in result.rows if r["status"] == "ok"})
    per_point = len(sims) / points
    mean = statistics.fmean(sims)
    cpu = sum(sims)
    q = statistics.quantiles(sims, n=10)
    figures = {
        "points": points,
        "requests_per_simulation": args.requests,
        "workers": workers,
        "executor": "ray" if args.ray else "local process pool",
        "wall_s": wall,
        "simulations": len(sims),
        "simulations_per_point": per_point,
        "simulation_s": {"mean": mean, "p50": q[4], "p90": q[8], "max": max(sims)},
        "simulation_cpu_s": cpu,
        "parallel_efficiency": cpu / (wall * workers),
        "extrapolated_10k_points_s": 10_000 * per_point * mean / workers,
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "loadavg_after": loadavg(),
            "python": platform.python_version(),
        },
    }
    print(result.summary(top=5))
    print()
    print(
        f"{points} points x {args.requests:,} requests: {wall:.1f} s wall on {workers} "
        f"workers; {len(sims)} simulations ({per_point:.1f} per point), {mean:.3f} s each "
        f"(p50 {q[4]:.3f}, p90 {q[8]:.3f}, max {max(sims):.3f}); {cpu:.0f} CPU-s, "
        f"efficiency {figures['parallel_efficiency']:.0%}"
    )
    print(
        f"10,000 points at this cost: ~{figures['extrapolated_10k_points_s'] / 3600:.1f} h on "
        f"{workers} workers, ~{10_000 * per_point * mean / 3600:.0f} core-hours"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
