"""Wall time of one ``tokenyard recommend`` run, per phase, on issue 31's first question:
Llama-3.1-70B on 16 x H200 (vLLM), ISL 4000 / OSL 500 (fixed), TTFT p90 <= 1 s, TPOT p90
<= 50 ms, aggregated and disaggregated, 10% margin, 4,000 synthetic requests verified.

The command line is run as a user would (a fresh ``tokenyard`` process: start-up, measured
tables, the process pool), ``--repeat`` times; the phases come from its ``recommend.json``.
Reported: the median wall time and each run's; per phase (estimate, simulate, verify);
candidates, simulations; the best aggregated and disaggregated points with tokens/s/GPU.

    .venv/bin/python benches/recommend_speed.py --json benches/out/recommend_speed.json
    .venv/bin/python benches/recommend_speed.py --repeat 1 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_model, loadavg

COMMAND = [
    "recommend",
    "--model",
    "llama-3.1-70b",
    "--system",
    "h200_sxm",
    "--gpus",
    "16",
    "--isl",
    "4000",
    "--osl",
    "500",
    "--ttft",
    "1.0",
    "--tpot",
    "0.05",
    "--framework",
    "vllm",
]


def run_once(workers: int | None, out: Path) -> dict[str, Any]:
    exe = Path(sys.executable).with_name("tokenyard")
    argv = [str(exe), *COMMAND, "--out", str(out)]
    if workers:
        argv += ["--workers", str(workers)]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"recommend failed ({done.returncode}):\n{done.stderr[-2000:]}")
    summary = json.loads((out / "recommend.json").read_text())
    best = {}
    for row in summary["rows"]:
        if row["recommended"] and row["kind"] not in best:
            best[row["kind"]] = {
                "deployment": row["deployment"],
                "target_qps": row["target_qps"],
                "tokens_per_s_per_gpu": row["tokens_per_s_per_gpu"],
                "tokens_per_s_per_user": row["tokens_per_s_per_user"],
                "binding": row["binding"],
                "headroom": row[f"headroom_{row['binding']}"],
            }
    return {
        "wall_s": wall,
        "phases_s": summary["wall_s"],
        "num_candidates": summary["num_candidates"],
        "num_simulations": summary["num_simulations"],
        "best": best,
        "argv": ["tokenyard", *argv[1:]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, help="default: all cores")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            runs.append(run_once(args.workers, Path(tmp) / f"run{i}"))
    walls = [r["wall_s"] for r in runs]
    result = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "loadavg": loadavg()},
        "median_wall_s": statistics.median(walls),
        "runs": runs,
    }
    first = runs[0]
    print(f"command: {' '.join(first['argv'][:-2])}")
    print(f"wall: median {result['median_wall_s']:.1f} s ({', '.join(f'{w:.1f}' for w in walls)})")
    phases = {k: statistics.median(r["phases_s"][k] for r in runs) for k in first["phases_s"]}
    print("phases (median): " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
    print(f"{first['num_candidates']} candidates, {first['num_simulations']} simulations")
    for kind, best in first["best"].items():
        print(
            f"best {kind}: {best['deployment']} at {best['target_qps']:.3g} QPS, "
            f"{best['tokens_per_s_per_gpu']:.0f} tok/s/GPU, "
            f"{best['tokens_per_s_per_user']:.1f} tok/s/user, {best['binding']} "
            f"{best['headroom']:.1%} headroom"
        )
    print(f"machine: {result['machine']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
