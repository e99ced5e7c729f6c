"""Gemma 4 in the simulator with vLLM 0.33's KV groups of different block sizes (its default:
``simulation/hybrid_kv_pages.plan_pages``) against the full-attention plan
(``replica.hybrid_kv_cache_manager = false``, vLLM's ``--disable-hybrid-kv-cache-manager``),
on one seeded workload where KV memory binds. Per run: the pool, the plan's concurrency
(vLLM's max concurrency at the longest request), the peak and mean batch, preemptions,
simulated throughput, TTFT p50/p99, the prefix hit rate, and the CPU seconds of
``simulate()`` (median of ``--repeats`` consecutive runs). ``--eagle`` gives the replica an
EAGLE drafter (3 drafts, acceptance 0.7) with prefix caching on, vLLM's look-ahead hashes,
or with ``--drop`` its trailing-block drop (the shared-prefix workload only: the drop
needs the requests' prefix identity): before branch ``bsztail`` the simulator planned
that job with every layer full attention (the ``false`` rows), now with the groups.
``--pd`` disaggregates it: one prefill and one decode H100 replica, the KV over NVLink
(vLLM's NixlConnector moving each group's blocks); before branch ``simpd`` the simulator
planned Gemma 4 under P/D with every layer full attention (the ``false`` rows), now with the
groups (the plan's columns are each pool's: both plan alike).

    PYTHONPATH=python .venv/bin/python benches/sim_gemma4_groups.py [--requests 1024] \
        [--eagle [--drop]] [--pd]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from tokenyard.simulation import simulate
from tokenyard.simulation.config import config_from_mapping
from tokenyard.simulation.run import plan_for

MODEL = "google/gemma-4-26B-A4B"


def lognormal(median: int, max_tokens: int) -> dict[str, Any]:
    return {"kind": "lognormal", "median": median, "sigma": 0.6, "max_tokens": max_tokens}


EAGLE = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.7}


def mapping(
    n: int, qps: float, hybrid: bool | None, shared: bool, eagle: str = "off", pd: bool = False
) -> dict[str, Any]:
    replica: dict[str, Any] = {
        "model": MODEL,
        "device": "h100-sxm",
        "memory_margin_fraction": 0.1,
        "scheduler": {"max_request_tokens": 18432},
    }
    if eagle != "off":
        replica["speculative"] = dict(EAGLE)
    if eagle == "drop":
        replica["scheduler"]["vllm_v1"] = {"eagle_block_drop": True}
    if hybrid is not None:
        replica["hybrid_kv_cache_manager"] = hybrid
    workload: dict[str, Any] = {
        "kind": "synthetic",
        "num_requests": n,
        "seed": 7,
        "arrival": {"kind": "poisson", "qps": qps},
        "prompt_tokens": lognormal(6000, 16000),
        "output_tokens": lognormal(1500, 2400),
    }
    if shared:  # 8 system prompts of 4,100 tokens: 256 hash blocks, 128 blocks of 32
        workload["shared_prefix"] = {"num_groups": 8, "prefix_tokens": 4100, "share_ratio": 1.0}
    cluster: dict[str, Any] = {"num_replicas": 1}
    if pd:
        cluster["decode"] = {"num_replicas": 1}
    return {"replica": replica, "cluster": cluster, "workload": workload}


def row(label: str, doc: dict[str, Any], repeats: int) -> tuple[str, dict[str, Any]]:
    config = config_from_mapping(doc)
    plan = plan_for(config)
    walls = []
    for _ in range(repeats):
        start = time.process_time()
        result = simulate(config)
        walls.append(time.process_time() - start)
    s = result.summary
    sizes = plan.kv_group_block_sizes
    pool = f"{plan.num_blocks:,} x {'/'.join(map(str, sorted(set(sizes)))) if sizes else 16}"
    ttft = s["latency_s"]["ttft"]
    line = (
        f"| {label} | {pool} | {plan.max_batch_size} | {s['replicas']['batch_size']['max']:.0f} "
        f"| {s['replicas']['batch_size']['mean']:.1f} "
        f"| {s['preemption']['num_restarts']} "
        f"| {s['throughput']['requests_per_s']:.3f} "
        f"| {s['throughput']['decode_tokens_per_s']:,.0f} | {ttft['p50']:.2f} "
        f"| {ttft['p99']:.2f} | {s['throughput']['prefix_hit_rate']:.3f} "
        f"| {statistics.median(walls):.2f} |"
    )
    if "disaggregation" in s:  # --pd: the KV link's mean transfer and its mean wait
        pd = s["disaggregation"]
        line += f" {pd['transfer_s']['mean'] * 1e3:.2f} | {pd['transfer_wait_s']['mean']:.2f} |"
    return line, s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eagle", action="store_true")
    parser.add_argument("--drop", action="store_true")
    parser.add_argument("--pd", action="store_true", help="one prefill + one decode replica")
    args = parser.parse_args()
    if args.drop and not args.eagle:
        parser.error("--drop needs --eagle")
    eagle = ("drop" if args.drop else "lookahead") if args.eagle else "off"
    extra = " KV transfer ms | transfer wait s |" if args.pd else ""
    print(
        "| run | blocks x tokens | plan concurrency | peak batch | mean batch | preemptions "
        f"| req/s | decode tok/s | TTFT p50 s | TTFT p99 s | prefix hit rate | CPU s |{extra}"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * (2 * args.pd))
    for qps, shared in ((1000.0, False), (1.0, False), (1.0, True)):
        if eagle == "drop" and not shared:
            continue  # the drop needs the requests' prefix identity (block-hash hits)
        words = (
            f"{'burst' if qps >= 1000 else f'{qps:g} req/s'}{', shared prefixes' if shared else ''}"
        )
        summaries = {}
        for hybrid, name in ((None, "groups (default)"), (False, "full attention (false)")):
            line, summaries[name] = row(
                f"{words}: {name}",
                mapping(args.requests, qps, hybrid, shared, eagle, args.pd),
                args.repeats,
            )
            print(line, flush=True)
        g, f = summaries["groups (default)"], summaries["full attention (false)"]
        print(
            f"| {words}: groups / full | | | | | "
            f"| {g['throughput']['requests_per_s'] / f['throughput']['requests_per_s']:.2f}x "
            f"| | {g['latency_s']['ttft']['p50'] / f['latency_s']['ttft']['p50']:.3g}x "
            f"| {g['latency_s']['ttft']['p99'] / f['latency_s']['ttft']['p99']:.3g}x | | |",
            flush=True,
        )


if __name__ == "__main__":
    main()
