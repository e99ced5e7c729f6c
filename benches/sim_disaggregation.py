"""Aggregated vs disaggregated serving on the same GPUs (docs/disaggregation.md).

Llama-3.1-8B on H100-SXM (measured kernel tables), a long-prompt workload (lognormal
prompts, median 4,000 tokens; outputs median 250), Poisson arrivals. For each GPU count,
the aggregated cluster and the P/D splits of the same GPUs; TTFT, TPOT, the transfer and
each pool's busy fraction. Also the replay cost per request of P/D against aggregated on
the same trace (wall time, medians of 3 runs each, interleaved).

    .venv/bin/python benches/sim_disaggregation.py [--qps 6] [--requests 3000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from tokenyard.simulation import simulate
from tokenyard.simulation.config import config_from_mapping

SPLITS = [
    ("aggregated x2", 2, None),
    ("1P1D", 1, 1),
    ("aggregated x3", 3, None),
    ("2P1D", 2, 1),
    ("1P2D", 1, 2),
    ("aggregated x4", 4, None),
    ("2P2D", 2, 2),
    ("3P1D", 3, 1),
]


def lognormal(median: int, max_tokens: int) -> dict[str, Any]:
    return {"kind": "lognormal", "median": median, "sigma": 0.6, "max_tokens": max_tokens}


def mapping(num_prefill: int, num_decode: int | None, qps: float, n: int) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "num_replicas": num_prefill,
        "global_scheduler": {"policy": "least_kv_load"},
    }
    if num_decode is not None:
        cluster["decode"] = {"num_replicas": num_decode}
    return {
        "replica": {"model": "llama-3.1-8b", "device": "h100-sxm"},
        "cluster": cluster,
        "workload": {
            "kind": "synthetic",
            "num_requests": n,
            "seed": 7,
            "arrival": {"kind": "poisson", "qps": qps},
            "prompt_tokens": lognormal(4000, 7000),
            "output_tokens": lognormal(250, 1000),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--qps", type=float, default=6.0)
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    names = ("TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99")
    header = f"{'cluster':15} " + " ".join(f"{n:>9}" for n in names)
    header += f" {'xfer ms':>8} {'P busy':>7} {'D busy':>7}"
    print(f"llama-3.1-8b on h100-sxm, {args.requests} requests at {args.qps} QPS")
    print(header)
    for name, p, d in SPLITS:
        s = simulate(config_from_mapping(mapping(p, d, args.qps, args.requests))).summary
        lat = s["latency_s"]
        pd = s.get("disaggregation")
        busy = s["replicas"]["mean_busy_fraction"]
        print(
            f"{name:15} {lat['ttft']['p50']:9.3f} {lat['ttft']['p99']:9.3f} "
            f"{lat['tpot']['p50'] * 1e3:8.1f}m {lat['tpot']['p99'] * 1e3:8.1f}m "
            f"{(pd['transfer_s']['mean'] * 1e3 if pd else 0):8.2f} "
            f"{(pd['prefill_busy_fraction'] if pd else busy):7.2f} "
            f"{(pd['decode_busy_fraction'] if pd else busy):7.2f}"
        )
    # Replay cost: the same trace, 4 GPUs, aggregated vs 2P2D, interleaved.
    walls: dict[str, list[float]] = {"aggregated x4": [], "2P2D": []}
    for _ in range(3):
        for name, p, d in (("aggregated x4", 4, None), ("2P2D", 2, 2)):
            config = config_from_mapping(mapping(p, d, args.qps, args.requests))
            start = time.perf_counter()
            simulate(config)
            walls[name].append(time.perf_counter() - start)
    agg, pd_ = (statistics.median(walls[k]) for k in ("aggregated x4", "2P2D"))
    print(
        f"replay cost per request, 2P2D / aggregated x4: {pd_ / agg:.2f} "
        f"(medians {pd_:.3f} s / {agg:.3f} s of 3 runs each, whole simulate())"
    )


if __name__ == "__main__":
    main()
