"""vLLM's hybrid KV groups in the simulator for linear-attention models and P/D
(docs/catalog.md, "Mamba groups" and "P/D with groups"): the same workload on the plan with
groups (vLLM 0.33's default) and on the plan without them (every attention layer full,
linear state reserved for 256 requests: what the simulator planned before; reached here
through prefix_affinity routing, a no-op router for one replica) or, for gpt-oss under P/D,
``hybrid_kv_cache_manager = false``. Per run: the pool (blocks x tokens), the plan's
concurrency (requests of the longest length), the peak and mean batch (both pools'
replicas under P/D), simulated throughput and latency, the mean KV transfer, and the CPU
seconds of ``simulate()`` (median of ``--repeats`` consecutive runs).

``--align`` instead runs vLLM 0.33's default Mamba prefix caching (``mamba_cache_mode
"align"``) against ``enable_prefix_caching = false`` (``"none"``) on the same seeded workload
whose prompts open with one of 8 shared prefixes of 4,224 tokens (Qwen3.5: 4 aligned blocks
of 1,056; Nemotron-3-Nano: 2 of 2,096 and part of a third), adding the prefix hit rate and
TTFT p90.

    PYTHONPATH=python .venv/bin/python benches/sim_hybrid_groups.py [--requests 1024] [--align]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from tokenyard.simulation import simulate
from tokenyard.simulation.config import config_from_mapping
from tokenyard.simulation.run import plan_for

#: (model, device, TP, memory_margin_fraction): KV memory that binds a burst of long requests.
QWEN = ("Qwen/Qwen3.5-35B-A3B", "h200", 2, 0.65)
NEMOTRON = ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "h200", 1, 0.45)
GPT_OSS = ("openai/gpt-oss-20b", "h100-sxm", 1, 0.5)
NO_GROUPS = {"global_scheduler": {"policy": "prefix_affinity"}}


def lognormal(median: int, max_tokens: int) -> dict[str, Any]:
    return {"kind": "lognormal", "median": median, "sigma": 0.6, "max_tokens": max_tokens}


def mapping(
    model: tuple[str, str, int, float],
    n: int,
    qps: float,
    cluster: dict[str, Any],
    **replica: Any,
) -> dict[str, Any]:
    name, device, tp, margin = model
    return {
        "replica": {
            "model": name,
            "device": device,
            "tensor_parallel_size": tp,
            "memory_margin_fraction": margin,
            "scheduler": {"max_request_tokens": 18432},
            **replica,
        },
        "cluster": {"num_replicas": 1, **cluster},
        "workload": {
            "kind": "synthetic",
            "num_requests": n,
            "seed": 7,
            "arrival": {"kind": "poisson", "qps": qps},
            "prompt_tokens": lognormal(6000, 16000),
            "output_tokens": lognormal(1500, 2400),
        },
    }


#: The --align workload's shared prefixes (every prompt opens with one).
SHARED = {"num_groups": 8, "prefix_tokens": 4224, "share_ratio": 1.0}


def run(doc: dict[str, Any], repeats: int) -> tuple[dict[str, Any], Any, float]:
    config = config_from_mapping(doc)
    plan = plan_for(config)
    walls = []
    for _ in range(repeats):
        start = time.process_time()
        result = simulate(config)
        walls.append(time.process_time() - start)
    return {"plan": plan}, result, statistics.median(walls)


def row(label: str, doc: dict[str, Any], repeats: int) -> str:
    info, result, cpu = run(doc, repeats)
    plan = info["plan"]
    s = result.summary
    block = plan.kv_block_size or 16
    moved = result.columns["kv_transfer_tokens"] > 0
    transfer = float(np.mean(result.columns["kv_transfer_s"][moved])) if moved.any() else 0.0
    decode = s["config"].get("decode")
    pool = f"{plan.num_blocks:,} x {block}"
    if decode:
        pool += f" (decode {decode['num_blocks']:,})"
    return (
        f"| {label} | {pool} | {plan.max_batch_size} | {s['replicas']['batch_size']['max']:.0f} "
        f"| {s['replicas']['batch_size']['mean']:.1f} | {s['throughput']['requests_per_s']:.2f} "
        f"| {s['throughput']['decode_tokens_per_s']:,.0f} | {s['latency_s']['ttft']['p50']:.2f} "
        f"| {transfer * 1e3:.2f} | {cpu:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--qps", type=float, default=1000.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--align", action="store_true", help="align against none")
    args = parser.parse_args()
    n, qps, k = args.requests, args.qps, args.repeats
    if args.align:
        align_table(n, qps, k)
        return
    pd = {"decode": {"num_replicas": 1}}
    cases = [
        ("Qwen3.5-35B-A3B, groups", mapping(QWEN, n, qps, {})),
        ("Qwen3.5-35B-A3B, state reserved", mapping(QWEN, n, qps, NO_GROUPS)),
        ("Nemotron-3-Nano, groups", mapping(NEMOTRON, n, qps, {})),
        ("Nemotron-3-Nano, state reserved", mapping(NEMOTRON, n, qps, NO_GROUPS)),
        ("gpt-oss-20b 1P1D, groups", mapping(GPT_OSS, n, qps, pd)),
        (
            "gpt-oss-20b 1P1D, false",
            mapping(GPT_OSS, n, qps, pd, hybrid_kv_cache_manager=False),
        ),
        ("Qwen3.5-35B-A3B 1P1D, groups", mapping(QWEN, n, qps, pd)),
    ]
    print(
        "| run | blocks x tokens | plan concurrency | peak batch | mean batch | req/s "
        "| decode tok/s | TTFT p50 s | transfer ms | CPU s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, doc in cases:
        print(row(label, doc, k), flush=True)


def align_table(n: int, qps: float, repeats: int) -> None:
    print(
        "| run | mamba_cache_mode | prefix hit rate | req/s | decode tok/s | TTFT p50 s "
        "| TTFT p90 s | peak batch | CPU s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, model in (("Qwen3.5-35B-A3B", QWEN), ("Nemotron-3-Nano", NEMOTRON)):
        for caching in (True, False):
            doc = mapping(model, n, qps, {})
            doc["workload"]["shared_prefix"] = SHARED
            doc["replica"]["scheduler"]["vllm_v1"] = {"enable_prefix_caching": caching}
            _, result, cpu = run(doc, repeats)
            s = result.summary
            ttft = s["latency_s"]["ttft"]
            print(
                f"| {label} | {'align' if caching else 'none'} "
                f"| {s['throughput']['prefix_hit_rate']:.3f} "
                f"| {s['throughput']['requests_per_s']:.2f} "
                f"| {s['throughput']['decode_tokens_per_s']:,.0f} | {ttft['p50']:.2f} "
                f"| {ttft['p90']:.2f} | {s['replicas']['batch_size']['max']:.0f} | {cpu:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
