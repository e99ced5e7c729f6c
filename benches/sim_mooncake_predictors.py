"""End to end under each execution model: the real Mooncake conversation trace (12,031
requests over ~59 min, mean prompt 12k tokens, 512-token hash blocks) on 4 x Llama-3.1-8B
on H100 SXM, vllm_v1 replicas with prefix caching, round-robin routing.

The same trace runs under ``measured`` (vLLM's H100 kernel tables), the calibrated roofline,
the datasheet roofline (constant efficiencies, the previous default) and ``linear`` (its
Llama-2-7B / A100 defaults, which ignore the model and GPU), and the script prints TTFT,
TPOT and end-to-end means and p99 side by side, with each run's ratio to ``measured``.

    .venv/bin/python benches/sim_mooncake_predictors.py [--limit N] [--json out.json]

Needs ``../shared/data/traces/mooncake/conversation_trace.jsonl`` and the
``tokenyard[measured]`` extra.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent.parent / "shared/data/traces/mooncake/conversation_trace.jsonl"

MODELS: dict[str, dict[str, Any]] = {
    "measured": {"model": "measured"},
    "calibrated roofline": {"model": "roofline"},
    "datasheet roofline": {"model": "roofline", "efficiency": {}},
    "linear": {"model": "linear"},
}


def config(execution: dict[str, Any], limit: int | None) -> dict[str, Any]:
    workload: dict[str, Any] = {"kind": "trace", "format": "mooncake", "path": str(TRACE)}
    if limit:
        workload["limit"] = limit
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
        "execution": execution,
        "workload": workload,
    }


def run(limit: int | None) -> list[dict[str, Any]]:
    from tokenyard.simulation import config_from_mapping, simulate

    rows = []
    for name, execution in MODELS.items():
        result = simulate(config_from_mapping(config(execution, limit)))
        s = result.summary
        row = {"model": name, "label": s["config"]["execution"]["label"]}
        for metric in ("ttft", "tpot", "e2e"):
            row[f"{metric}_mean_s"] = s["latency_s"][metric]["mean"]
            row[f"{metric}_p99_s"] = s["latency_s"][metric]["p99"]
        row["prefix_hit_rate"] = s["throughput"]["prefix_hit_rate"]
        row["num_requests"] = s["num_requests"]
        row["wall_s"] = s["wall_s"]
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    base = rows[0]
    metrics = [f"{m}_{s}_s" for m in ("ttft", "tpot", "e2e") for s in ("mean", "p99")]
    header = f"{'execution model':<22}" + "".join(f"{m[:-2]:>16}" for m in metrics)
    print(header)
    for row in rows:
        cells = "".join(
            f"{row[m]:>9.3f} ({row[m] / base[m]:.2f})" if base[m] else f"{row[m]:>16.3f}"
            for m in metrics
        )
        print(f"{row['model']:<22}{cells}")
    print("(seconds; in brackets the ratio to measured)")
    for row in rows:
        print(f"  {row['model']}: {row['label']}")
    hits = rows[0]["prefix_hit_rate"]
    print(f"{rows[0]['num_requests']:,} requests; prefix-cache hit rate {hits:.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="only the first N requests")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    if not TRACE.is_file():
        print(f"skipped: {TRACE} is absent (../shared/data)", file=sys.stderr)
        return 0
    rows = run(args.limit)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
