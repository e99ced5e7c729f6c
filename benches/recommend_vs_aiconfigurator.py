"""Side by side with NVIDIA's ``aiconfigurator cli default`` (0.12.0, in its own venv:
``bash benches/peers/aic_setup.sh``) on the same question: model, GPU system, GPU count,
fixed ISL/OSL, TTFT/TPOT bounds, backend vLLM (issue 31, "Measured").

For each case:

1. ``aiconfigurator cli default`` (timed, wall seconds): its best aggregated and
   disaggregated configs (rank 1 of ``agg/`` and ``disagg/best_config_topn.csv``), their
   predicted tokens/s/GPU and tokens/s/user; the scheduler caps its generated launch
   scripts pass (``top1/run_*.sh``: ``--max-num-seqs``, ``--max-num-batched-tokens``,
   ``--max-model-len``). Its ``bs`` column is requests in flight per worker (the
   concurrency its steady state assumes), not a batch cap: the scripts pass
   ``--max-num-seqs 512`` to aggregated and decode workers.
2. tokenyard simulates each pick (the layout from the CSV, the caps from the scripts):
   Poisson arrivals of fixed ISL/OSL requests, a capacity search (bisection to 2%) at the
   SLOs as means (``ttft_mean_s``, ``tpot_mean_s``: aiconfigurator's figures are
   steady-state averages), on the measured vLLM tables. Its figure is output tokens/s/GPU
   at capacity (``capacity_qps x OSL / GPUs used``), beside the simulated decode tokens/s
   over the whole run (ramp-up and drain included).
3. ``tokenyard recommend`` on the same question (timed), where ``tokenyard recommend``
   exists: its best aggregated and disaggregated points (``--json``).

    bash benches/peers/aic_setup.sh
    .venv/bin/python benches/recommend_vs_aiconfigurator.py --json benches/out/recommend_vs_aic.json
    .venv/bin/python benches/recommend_vs_aiconfigurator.py --cases llama70b --no-recommend
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_model, loadavg

from tokenyard.errors import TokenyardError
from tokenyard.search import capacity_search

REPO = Path(__file__).resolve().parents[1]
AIC = Path(os.environ.get("AIC_VENV", REPO / ".venv-aic")) / "bin" / "aiconfigurator"
TOKENYARD = REPO / ".venv" / "bin" / "tokenyard"


@dataclasses.dataclass(frozen=True)
class Case:
    model: str  # an HF id both tools know (aiconfigurator bundles its config.json)
    system: str  # aiconfigurator's system name
    device: str  # tokenyard's catalog device
    gpus: int
    isl: int = 4000
    osl: int = 500
    ttft_ms: float = 1000.0
    tpot_ms: float = 50.0


CASES = {
    "llama70b": Case("meta-llama/Meta-Llama-3.1-70B", "h200_sxm", "h200", 16),
    "qwen32b": Case("Qwen/Qwen3-32B", "h100_sxm", "h100-sxm", 8),
    "dsv3": Case("deepseek-ai/DeepSeek-V3", "h200_sxm", "h200", 16),
    "gptoss": Case("openai/gpt-oss-120b", "b200_sxm", "b200", 8),
}


# ---- aiconfigurator ---------------------------------------------------------------------


def run_aiconfigurator(case: Case, save_dir: Path) -> dict[str, Any]:
    """One ``aiconfigurator cli default`` run: wall time, rank-1 agg and disagg rows, and
    the worker flags of their launch scripts."""
    cmd = [
        str(AIC),
        "cli",
        "default",
        "--model-path",
        case.model,
        "--system",
        case.system,
        "--total-gpus",
        str(case.gpus),
        "--backend",
        "vllm",
        "--isl",
        str(case.isl),
        "--osl",
        str(case.osl),
        "--ttft",
        f"{case.ttft_ms:g}",
        "--tpot",
        f"{case.tpot_ms:g}",
        "--save-dir",
        str(save_dir),
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    wall = time.perf_counter() - start
    found: dict[str, Any] = {
        "command": " ".join(["aiconfigurator", *cmd[1:-2]]),
        "wall_s": wall,
        "returncode": done.returncode,
    }
    if done.returncode != 0:
        found["error"] = (done.stderr or done.stdout)[-2000:]
        return found
    runs = sorted(save_dir.rglob("best_config_topn.csv"))
    for kind in ("agg", "disagg"):
        table = next((p for p in runs if p.parent.name == kind), None)
        if table is None:
            found[kind] = None
            continue
        with table.open() as f:
            rows = list(csv.DictReader(f))
        if not rows:
            found[kind] = None
            continue
        flags = _script_flags(table.parent / "top1")
        found[kind] = {"row": rows[0], "flags": flags}
    return found


_FLAG = re.compile(r'(--[a-z0-9-]+)(?:[ =]"?([^"\s]+)"?)?')


def _script_flags(folder: Path) -> dict[str, dict[str, str]]:
    """The vLLM flags of each worker role in aiconfigurator's generated ``run_*.sh``:
    ``agg``, ``prefill`` or ``decode`` -> flag -> value."""
    roles: dict[str, dict[str, str]] = {}
    for script in sorted(folder.glob("run_*.sh")):
        for line in script.read_text().splitlines():
            if "--tensor-parallel-size" not in line:
                continue
            mode = re.search(r"--disaggregation-mode (prefill|decode)", line)
            role = mode.group(1) if mode else "agg"
            flags = {m.group(1): m.group(2) or "" for m in _FLAG.finditer(line)}
            roles.setdefault(role, flags)
    return roles


# ---- tokenyard simulating aiconfigurator's pick -----------------------------------------


def _workload(case: Case, requests: int) -> dict[str, Any]:
    return {
        "kind": "synthetic",
        "num_requests": requests,
        "arrival": {"kind": "poisson", "qps": 1.0},
        "prompt_tokens": {"kind": "fixed", "value": case.isl},
        "output_tokens": {"kind": "fixed", "value": case.osl},
    }


def _layout(row: dict[str, str], prefix: str = "") -> dict[str, int]:
    """TP, PP, attention DP and EP of one worker, as tokenyard's replica keys. A MoE
    worker is ``moe_tp x moe_ep = tp x dp`` GPUs; tokenyard's EP is all of them or none.
    Attention DP with MoE TP over all ``tp x dp`` GPUs (aiconfigurator's script passes no
    ``--enable-expert-parallel``) is vLLM's DP without EP, the experts one TP group of
    ``tp x dp``: tokenyard simulates it as such (EP 1, docs/simulate.md)."""
    tp, pp, dp = (int(row[f"{prefix}{k}"]) for k in ("tp", "pp", "dp"))
    moe_tp, moe_ep = int(row[f"{prefix}moe_tp"]), int(row[f"{prefix}moe_ep"])
    if moe_ep > 1 and moe_tp > 1:
        raise TokenyardError(
            f"{prefix}moe_tp {moe_tp} x moe_ep {moe_ep}: experts split by both TP and EP are "
            "not simulated (tokenyard's EP is every GPU of the replica or none)"
        )
    ep = moe_ep if moe_ep > 1 else 1
    return {
        "tensor_parallel_size": tp,
        "num_pipeline_stages": pp,
        "data_parallel_size": dp,
        "expert_parallel_size": ep,
    }


def _scheduler(flags: dict[str, str]) -> dict[str, Any]:
    section: dict[str, Any] = {
        "max_num_seqs": int(flags["--max-num-seqs"]),
        "max_num_batched_tokens": int(flags["--max-num-batched-tokens"]),
    }
    if "--max-model-len" in flags:
        section["max_model_len"] = int(flags["--max-model-len"])
    return {"policy": "vllm_v1", "vllm_v1": section}


def _kv_dtype(flags: dict[str, str]) -> str:
    value = flags.get("--kv-cache-dtype", "auto")
    return {"auto": "auto", "fp8": "fp8", "bfloat16": "bf16", "float16": "fp16"}.get(value, value)


def aic_pick_simulation(
    case: Case, kind: str, pick: dict[str, Any], requests: int
) -> dict[str, Any]:
    """The tokenyard simulation config of aiconfigurator's ``kind`` pick, and its GPUs."""
    row, flags = pick["row"], pick["flags"]
    if kind == "agg":
        layout = _layout(row)
        per_worker = (
            layout["tensor_parallel_size"]
            * layout["num_pipeline_stages"]
            * layout["data_parallel_size"]
        )
        replicas = case.gpus // per_worker
        simulation = {
            "cluster": {"num_replicas": replicas},
            "replica": {
                "model": case.model,
                "device": case.device,
                **layout,
                "kv_cache_dtype": _kv_dtype(flags["agg"]),
                "scheduler": _scheduler(flags["agg"]),
            },
        }
        return {"simulation": simulation, "gpus": replicas * per_worker}
    prefill, decode = _layout(row, "(p)"), _layout(row, "(d)")
    p_gpus = (
        prefill["tensor_parallel_size"]
        * prefill["num_pipeline_stages"]
        * prefill["data_parallel_size"]
    )
    d_gpus = (
        decode["tensor_parallel_size"]
        * decode["num_pipeline_stages"]
        * decode["data_parallel_size"]
    )
    p_workers, d_workers = int(row["(p)workers"]), int(row["(d)workers"])
    per_replica = p_workers * p_gpus + d_workers * d_gpus
    copies = case.gpus // per_replica
    simulation = {
        "cluster": {
            "num_replicas": p_workers * copies,
            "decode": {
                "num_replicas": d_workers * copies,
                "tensor_parallel_size": decode["tensor_parallel_size"],
                "num_pipeline_stages": decode["num_pipeline_stages"],
                "data_parallel_size": decode["data_parallel_size"],
                "expert_parallel_size": decode["expert_parallel_size"],
                "scheduler": _scheduler(flags["decode"]),
            },
        },
        "replica": {
            "model": case.model,
            "device": case.device,
            **prefill,
            "kv_cache_dtype": _kv_dtype(flags["prefill"]),
            "scheduler": _scheduler(flags["prefill"]),
        },
    }
    return {"simulation": simulation, "gpus": copies * per_replica}


def simulate_capacity(
    case: Case, built: dict[str, Any], requests: int, first_qps: float
) -> dict[str, Any]:
    """Capacity at the SLOs (means) and the tokens/s/GPU it gives."""
    simulation = {"seed": 0, **built["simulation"], "workload": _workload(case, requests)}
    slo = {"ttft_mean_s": case.ttft_ms / 1e3, "tpot_mean_s": case.tpot_ms / 1e3}
    start = time.perf_counter()
    report = capacity_search(
        simulation, slo, search={"initial_qps": max(first_qps, 0.05), "tolerance": 0.02}
    )
    wall = time.perf_counter() - start
    result = next(iter(report.results.values()))
    metrics = result.metrics or {}
    qps = result.capacity_qps
    gpus = built["gpus"]
    return {
        "gpus": gpus,
        "capacity_qps": qps,
        "tokens_per_s_per_gpu": qps * case.osl / gpus,
        "simulated_decode_tokens_per_s_per_gpu": metrics.get("decode_tokens_per_s", 0.0) / gpus,
        "tokens_per_s_per_user": 1.0 / metrics["tpot_mean_s"]
        if metrics.get("tpot_mean_s")
        else None,
        "ttft_mean_ms": 1e3 * metrics.get("ttft_mean_s", float("nan")),
        "tpot_mean_ms": 1e3 * metrics.get("tpot_mean_s", float("nan")),
        "binding": list(result.binding),
        "simulations": len(report.probes),
        "wall_s": wall,
        "stop": result.stop,
    }


# ---- tokenyard recommend ----------------------------------------------------------------


def run_recommend(case: Case, requests: int, out: Path) -> dict[str, Any]:
    cmd = [
        str(TOKENYARD),
        "recommend",
        "--model",
        case.model,
        "--system",
        case.device,
        "--gpus",
        str(case.gpus),
        "--isl",
        str(case.isl),
        "--osl",
        str(case.osl),
        "--ttft",
        f"{case.ttft_ms / 1e3:g}",
        "--tpot",
        f"{case.tpot_ms / 1e3:g}",
        "--percentile",
        "mean",
        "--framework",
        "vllm",
        "--requests",
        str(requests),
        "--out",
        str(out),
        "--json",
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    wall = time.perf_counter() - start
    found: dict[str, Any] = {
        "command": " ".join(["tokenyard", *cmd[1:-3], "--json"]),
        "wall_s": wall,
        "returncode": done.returncode,
    }
    if done.returncode != 0:
        found["error"] = (done.stderr or done.stdout)[-3000:]
        return found
    try:
        found["rows"] = json.loads(done.stdout)
    except json.JSONDecodeError:
        found["stdout"] = done.stdout[-6000:]
    return found


# ---- report ------------------------------------------------------------------------------


def _aic_summary(kind: str, pick: dict[str, Any] | None) -> dict[str, Any] | None:
    if pick is None:
        return None
    row = pick["row"]
    if kind == "agg":
        layout = row["parallel"]
    else:
        prefill = f"{row['(p)workers']}x({row['(p)parallel']})"
        layout = f"{prefill} + {row['(d)workers']}x({row['(d)parallel']})"
    return {
        "layout": layout,
        "tokens_per_s_per_gpu": float(row["tokens/s/gpu"]),
        "tokens_per_s_per_user": float(row["tokens/s/user"]),
        "request_rate": float(row.get("request_rate") or row.get("seq/s") or 0.0),
        "concurrency": row.get("concurrency"),
        "bs": row.get("bs") or f"(p){row.get('(p)bs')} (d){row.get('(d)bs')}",
        "flags": pick["flags"],
        "row": row,
    }


def run_case(name: str, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    print(f"== {name}: {case.model} on {case.gpus} x {case.system}", flush=True)
    found: dict[str, Any] = {"case": dataclasses.asdict(case)}
    with tempfile.TemporaryDirectory() as tmp:
        aic = run_aiconfigurator(case, Path(tmp) / "aic")
    found["aiconfigurator"] = {k: v for k, v in aic.items() if k not in ("agg", "disagg")} | {
        kind: _aic_summary(kind, aic.get(kind)) for kind in ("agg", "disagg")
    }
    print(f"   aiconfigurator: {aic['wall_s']:.1f} s, rc {aic['returncode']}", flush=True)
    sims: dict[str, Any] = {}
    for kind in ("agg", "disagg"):
        pick = aic.get(kind)
        if pick is None:
            continue
        try:
            built = aic_pick_simulation(case, kind, pick, args.requests)
            rate = (
                float(pick["row"].get("request_rate") or 1.0)
                * case.gpus
                / max(int(pick["row"]["num_total_gpus"]), 1)
            )
            sims[kind] = {
                "config": built["simulation"],
                **simulate_capacity(case, built, args.requests, rate),
            }
        except TokenyardError as error:
            sims[kind] = {"error": f"{type(error).__name__}: {error}"}
        shown = {k: v for k, v in sims[kind].items() if k != "config"}
        print(f"   tokenyard on aic's {kind}: {json.dumps(shown)[:300]}", flush=True)
    found["tokenyard_on_aic_picks"] = sims
    if args.recommend and TOKENYARD.exists():
        with tempfile.TemporaryDirectory() as tmp:
            found["tokenyard_recommend"] = run_recommend(case, args.requests, Path(tmp) / "out")
        rec = found["tokenyard_recommend"]
        print(f"   tokenyard recommend: {rec['wall_s']:.1f} s, rc {rec['returncode']}", flush=True)
    return found


def _version(python: Path, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def _fmt(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    """The side-by-side table of a ``--json`` file: per case and kind (agg, disagg),
    aiconfigurator's pick with its predicted tokens/s/GPU, tokenyard's simulated capacity
    of that pick, ``tokenyard recommend``'s pick and its simulated capacity (both in output
    tokens/s/GPU at capacity; recommend's verified rate is 10% below), and wall times."""
    lines = [
        "| case | kind | aiconfigurator pick | aic predicted tok/s/GPU | tokenyard on aic's pick: "
        "tok/s/GPU at capacity | recommend pick | recommend: tok/s/GPU at capacity (at "
        "target) | wall s: aic / recommend |",
        "| --- | --- | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for name, case in results["cases"].items():
        osl = case["case"]["osl"]
        aic = case["aiconfigurator"]
        rec = case.get("tokenyard_recommend") or {}
        rows = rec.get("rows") or []
        for kind, label in (("agg", "aggregated"), ("disagg", "disaggregated")):
            pick = aic.get(kind)
            sim = case["tokenyard_on_aic_picks"].get(kind) or {}
            if "error" in sim:
                simulated = "not simulated: " + sim["error"].split(": ", 1)[-1][:90]
            else:
                simulated = _fmt(sim.get("tokens_per_s_per_gpu"), 1)
                if sim.get("approximated"):  # --json files written before 0dbfc4d
                    simulated += " (approx.: " + sim["approximated"][:60] + ")"
            best = next((r for r in rows if r.get("kind") == label), None)
            if best is not None:
                at_capacity = best["capacity_qps"] * osl / best["gpus"]
                rec_pick = f"{best['deployment']} (seqs {best['max_num_seqs']})"
                rec_figure = f"{at_capacity:,.1f} ({best['tokens_per_s_per_gpu']:,.1f})"
            else:
                rec_pick, rec_figure = ("-", "-")
            walls = f"{aic['wall_s']:.1f} / {_fmt(rec.get('wall_s'), 1)}"
            aic_pick = f"{pick['layout']} (bs {pick['bs']})" if pick else "-"
            lines.append(
                f"| {name} | {kind} | {aic_pick} "
                f"| {_fmt(pick['tokens_per_s_per_gpu'] if pick else None, 1)} | {simulated} "
                f"| {rec_pick} | {rec_figure} | {walls} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    parser.add_argument("--requests", type=int, default=3000, help="per simulation")
    parser.add_argument("--no-recommend", dest="recommend", action="store_false")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--report", metavar="PATH", help="print a --json file's table, run nothing")
    args = parser.parse_args()
    if args.report:
        print(markdown(json.loads(Path(args.report).read_text())))
        return 0
    if not AIC.exists():
        print(f"{AIC} not found: run bash benches/peers/aic_setup.sh", file=sys.stderr)
        return 2
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "versions": {
            "aiconfigurator": _version(AIC.parent / "python", "aiconfigurator"),
            "aiconfigurator-core": _version(Path(sys.executable), "aiconfigurator-core"),
            "tokenyard_commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=REPO,
                check=False,
            ).stdout.strip(),
        },
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        "cases": {},
    }
    for name in args.cases.split(","):
        results["cases"][name] = run_case(name, CASES[name], args)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    results["machine"]["loadavg_after"] = loadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
