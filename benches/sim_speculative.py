"""The speculative-decoding experiment of docs/speculative.md: mean TPOT against the
acceptance rate alpha (i.i.d. per draft) and the number of drafts k, on the built-in job
(`tokenyard simulate` with no config: 4 Llama-2-7B replicas on A100-80GB, vLLM V1
scheduling, 10,000 requests at 20 QPS), with an EAGLE head (one target layer per draft
pass) or n-gram drafts (free).

    .venv/bin/python benches/sim_speculative.py [--method eagle] [--requests N]

Prints a Markdown table: TPOT without speculation, then per (alpha, k) the mean TPOT and
its ratio to the baseline, and the mean tokens per verify step.
"""

from __future__ import annotations

import argparse
from typing import Any

from tokenyard.simulation import SimulationConfig, config_from_mapping, simulate
from tokenyard.simulation.config import config_document

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
KS = (1, 2, 3, 4, 5)


def run(num_requests: int, speculative: dict[str, Any] | None) -> dict[str, Any]:
    document = config_document(SimulationConfig())
    document["workload"]["num_requests"] = num_requests
    if speculative is not None:
        document["replica"]["speculative"] = speculative
    return simulate(config_from_mapping(document)).summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--method", default="eagle", choices=("eagle", "mtp", "ngram"))
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args()
    base = run(args.requests, None)["latency_s"]["tpot"]["mean"]
    print(f"method {args.method}; TPOT without speculation: {base * 1e3:.2f} ms\n")
    print("| alpha | " + " | ".join(f"k = {k}" for k in KS) + " |")
    print("|---|" + "---|" * len(KS))
    for alpha in ALPHAS:
        cells = []
        for k in KS:
            spec = {"method": args.method, "num_speculative_tokens": k, "acceptance_rate": alpha}
            s = run(args.requests, spec)
            tpot = s["latency_s"]["tpot"]["mean"]
            per_step = s["speculative"]["mean_tokens_per_step"]
            cells.append(f"{tpot * 1e3:.2f} ms ({tpot / base:.2f}x, {per_step:.2f} tok/step)")
        print(f"| {alpha} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
