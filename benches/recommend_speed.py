"""Wall time of one ``tokenyard recommend`` run, per phase, on issue 31's first question:
Llama-3.1-70B on 16 x H200 (vLLM), ISL 4000 / OSL 500 (fixed), TTFT p90 <= 1 s, TPOT p90
<= 50 ms, aggregated and disaggregated, 10% margin, 4,000 synthetic requests verified.

The command line is run as a user would (a fresh ``tokenyard`` process: start-up, measured
tables, the process pool), ``--repeat`` times; the phases come from its ``recommend.json``.
Reported: the median wall time and each run's; per phase (estimate, simulate, verify);
candidates, simulations; the best aggregated and disaggregated points with tokens/s/GPU.

    .venv/bin/python benches/recommend_speed.py --json benches/out/recommend_speed.json
    .venv/bin/python benches/recommend_speed.py --repeat 1 --workers 2

``--case qwen32b`` asks the second question of benches/recommend_vs_aiconfigurator.py
instead (Qwen3-32B on 8 x H100, mean TTFT <= 1 s and TPOT <= 50 ms, 3,000 requests).
``--aiconfigurator`` times ``aiconfigurator cli default`` on the same question too, its
runs alternating with recommend's. ``--serial`` runs every simulation in the one process
and reports its CPU seconds too.
``--compare DIR`` times another copy of the package too (``DIR`` put first on
``PYTHONPATH``: a checkout's ``python/`` folder), its runs alternating with this tree's, and
says whether both gave the same answers:

    .venv/bin/python benches/recommend_speed.py --compare /tmp/base/python --repeat 3
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


QWEN = [
    "recommend",
    "--model",
    "Qwen/Qwen3-32B",
    "--system",
    "h100-sxm",
    "--gpus",
    "8",
    "--isl",
    "4000",
    "--osl",
    "500",
    "--ttft",
    "1",
    "--tpot",
    "0.05",
    "--percentile",
    "mean",
    "--framework",
    "vllm",
    "--requests",
    "3000",
]
CASES = {"llama70b": COMMAND, "qwen32b": QWEN}
#: ``--aiconfigurator``: the same question to ``aiconfigurator cli default`` (its venv from
#: benches/peers/aic_setup.sh), agg and disagg in one run, as recommend_vs_aiconfigurator.py
#: asks it.
AIC_CASES = {
    "llama70b": ["meta-llama/Meta-Llama-3.1-70B", "h200_sxm", "16"],
    "qwen32b": ["Qwen/Qwen3-32B", "h100_sxm", "8"],
}


def run_aiconfigurator(case: str, save_dir: Path) -> float:
    model, system, gpus = AIC_CASES[case]
    venv = Path(os.environ.get("AIC_VENV", Path(__file__).parents[1] / ".venv-aic"))
    argv = [str(venv / "bin" / "aiconfigurator"), "cli", "default", "--model-path", model]
    argv += ["--system", system, "--total-gpus", gpus, "--backend", "vllm", "--isl", "4000"]
    argv += ["--osl", "500", "--ttft", "1000", "--tpot", "50", "--save-dir", str(save_dir)]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"aiconfigurator failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


#: ``--serial``: the same command in one process, every simulation in it (the ``serial``
#: executor), its CPU seconds written beside the output: the work done, which other jobs
#: on the machine inflate far less than the wall time.
SERIAL = """
import json, sys, time
import tokenyard.recommend.recommend as r
from tokenyard.cli import main
plain = r.recommend
r.recommend = lambda ask, **kw: plain(ask, executor="serial")
cpu = time.process_time()
code = main(sys.argv[2:])
cpu = time.process_time() - cpu
open(sys.argv[1], "w").write(json.dumps({"cpu_s": cpu, "code": code}))
"""


def run_once(
    workers: int | None,
    out: Path,
    command: list[str] = COMMAND,
    path: str | None = None,
    serial: bool = False,
) -> dict[str, Any]:
    exe = Path(sys.executable).with_name("tokenyard")
    argv = [str(exe), *command, "--out", str(out)]
    if serial:
        argv = [sys.executable, "-c", SERIAL, str(out) + ".cpu.json", *command, "--out", str(out)]
    elif workers:
        argv += ["--workers", str(workers)]
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
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
    answers = [
        (r["kind"], r["deployment"], r["device"], r["recommended"], r.get("capacity_qps"))
        for r in summary["rows"]
    ]
    cpu = out.with_name(out.name + ".cpu.json")
    return {
        "wall_s": wall,
        "cpu_s": json.loads(cpu.read_text())["cpu_s"] if serial else None,
        "answers": answers,
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
    parser.add_argument("--case", choices=sorted(CASES), default="llama70b")
    parser.add_argument("--compare", metavar="DIR", help="also time this package copy")
    parser.add_argument(
        "--serial", action="store_true", help="one process, no pool; report its CPU seconds"
    )
    parser.add_argument(
        "--aiconfigurator", action="store_true", help="also time aiconfigurator cli default"
    )
    args = parser.parse_args()
    command = CASES[args.case]
    runs = []
    other: list[dict[str, Any]] = []
    aic: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            if args.compare:
                out = Path(tmp) / f"other{i}"
                other.append(run_once(args.workers, out, command, args.compare, args.serial))
            if args.aiconfigurator:
                aic.append(run_aiconfigurator(args.case, Path(tmp) / f"aic{i}"))
            runs.append(run_once(args.workers, Path(tmp) / f"run{i}", command, None, args.serial))
    if other:
        walls = [r["wall_s"] for r in other]
        same = all(r["answers"] == runs[0]["answers"] for r in (*runs, *other))
        print(
            f"{args.compare}: median {statistics.median(walls):.1f} s "
            f"({', '.join(f'{w:.1f}' for w in walls)}); phases (median): "
            + ", ".join(
                f"{k} {statistics.median(r['phases_s'][k] for r in other):.1f} s"
                for k in other[0]["phases_s"]
            )
            + f"; {other[0]['num_simulations']} simulations; same answers as this tree: {same}"
        )
        if args.serial:
            cpus = [r["cpu_s"] for r in other]
            print(f"  CPU s (serial): median {statistics.median(cpus):.1f} ({cpus})")
        if not same:
            print(f"  {args.compare}: {other[0]['answers']}\n  this tree: {runs[0]['answers']}")
    walls = [r["wall_s"] for r in runs]
    if aic:
        print(
            f"aiconfigurator cli default: median {statistics.median(aic):.1f} s "
            f"({', '.join(f'{w:.1f}' for w in aic)}); recommend / aiconfigurator: "
            f"{statistics.median(walls) / statistics.median(aic):.2f}"
        )
    result = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "loadavg": loadavg()},
        "median_wall_s": statistics.median(walls),
        "runs": runs,
        "compared": {"path": args.compare, "runs": other} if other else None,
        "aiconfigurator_wall_s": aic or None,
    }
    first = runs[0]
    print(f"command: tokenyard {' '.join(command)}" + (" (serial)" if args.serial else ""))
    print(f"wall: median {result['median_wall_s']:.1f} s ({', '.join(f'{w:.1f}' for w in walls)})")
    phases = {k: statistics.median(r["phases_s"][k] for r in runs) for k in first["phases_s"]}
    print("phases (median): " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
    if args.serial:
        cpus = [r["cpu_s"] for r in runs]
        print(f"CPU s (serial): median {statistics.median(cpus):.1f} ({cpus})")
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
