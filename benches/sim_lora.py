"""The LoRA experiment of docs/lora.md: on the default job (4 Llama-2-7B replicas on
A100-80GB, vLLM V1 scheduling, 10,000 requests at 20 QPS), how throughput and TTFT change
with the number of adapters (zipf popularity, exponent 1) and the GPU slots (`max_loras`).
Every adapter fits in the host cache (`max_cpu_loras = 64`), so each is read from disk
once per replica.

    .venv/bin/python benches/sim_lora.py [--requests N]
"""

from __future__ import annotations

import argparse
from typing import Any

from tokenyard.simulation import config_from_mapping, simulate
from tokenyard.simulation.config import default_workload

ADAPTERS = (1, 4, 16, 64)
SLOTS = (1, 4, 16)


def run(num_adapters: int | None, max_loras: int, num_requests: int) -> dict[str, Any]:
    workload = default_workload()
    workload["num_requests"] = num_requests
    mapping: dict[str, Any] = {"workload": workload}
    if num_adapters is not None:
        workload["lora"] = {"num_adapters": num_adapters, "popularity": "zipf"}
        mapping["replica"] = {"lora": {"max_loras": max_loras, "max_cpu_loras": 64}}
    summary = simulate(config_from_mapping(mapping)).summary
    lora = summary.get("lora", {})
    return {
        "decode_tok_s": summary["throughput"]["decode_tokens_per_s"],
        "ttft_p50": summary["latency_s"]["ttft"]["p50"],
        "ttft_p99": summary["latency_s"]["ttft"]["p99"],
        "tpot_p50": summary["latency_s"]["tpot"]["p50"],
        "loads": lora.get("adapter_loads", 0),
        "load_s": lora.get("load_time_s", 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args()
    print(
        "| adapters | max_loras | decode tok/s | TTFT p50 (s) | TTFT p99 (s) | TPOT p50 (s) "
        "| adapter loads | load time (s) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    cases: list[tuple[int | None, int]] = [(None, 0)]
    cases += [(a, s) for a in ADAPTERS for s in SLOTS if s <= max(a, 1) or s == 1]
    for adapters, slots in cases:
        r = run(adapters, slots, args.requests)
        label = "none (base)" if adapters is None else str(adapters)
        print(
            f"| {label} | {slots or '-'} | {r['decode_tok_s']:,.0f} | {r['ttft_p50']:.3f} | "
            f"{r['ttft_p99']:.2f} | {r['tpot_p50']:.4f} | {r['loads']:,} | {r['load_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
