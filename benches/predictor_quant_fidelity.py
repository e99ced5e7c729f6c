"""Fidelity of the measured predictor on quantized checkpoints and Blackwell systems (issue 29).

Extends ``predictor_measured.py`` part b (step times against aiconfigurator-core's own
estimator, ``EngineHandle``) to what tokenyard now prices:

- **Quantized checkpoints** on H100 and H200: Qwen3-32B-FP8 and Qwen3-30B-A3B-FP8 (block
  FP8), nvidia/Llama-3.1-70B-Instruct-FP8 (per-tensor FP8, ModelOpt), each beside its BF16
  model at the same TP, and on B200 the NVFP4 checkpoint that loads,
  nvidia/Qwen3-235B-A22B-NVFP4, beside Qwen3-235B-A22B-FP8 and BF16 (TP 4).
- **Blackwell systems**: Llama-3.1-8B (TP 1) and Llama-3.1-70B (TP 4) on ``b200_sxm``,
  ``gb200`` and ``b300_sxm`` (catalog devices ``b200``, ``gb200``, ``b300``), and
  Llama-3.1-70B-Instruct-FP8 on ``b200_sxm``.

vLLM tables (``version = "latest"``: 0.24.0 on every system here), aiconfigurator compiled
for the same system, framework and version. tokenyard is driven the way the simulator
drives it (``config_from_mapping`` -> ``choose_execution`` -> ``build_predictor``), so the
checkpoint's quantization is resolved as a run resolves it, and its GPU time per step
(sum of ``op_times``) is compared with aiconfigurator's step estimate. The step mapping
(decode, prefill, mixed) is ``predictor_measured.py``'s, and its mapping checks hold.

KV cache: tokenyard's ``replica.kv_cache_dtype = "auto"`` is the compute dtype (bf16),
as vLLM's ``--kv-cache-dtype auto``; aiconfigurator infers an FP8 KV cache for every
FP8/NVFP4 checkpoint (``_infer_quant_modes_from_raw_config``: an FP8 FMHA forces it).
The main comparison passes ``kvcache_quant_mode="bfloat16"`` to aiconfigurator so both
price the same cache; ``--fp8-kv`` prices an FP8 cache on both sides (tokenyard
``kv_cache_dtype = "fp8"``, aiconfigurator ``kvcache_quant_mode="fp8"``, its own default
for these checkpoints).

Per deployment: median / p90 |error| per step kind, the per-operation-group signed
contributions to the gap (``aic_steps.OP_GROUPS``), and the quantized/BF16 (and
NVFP4/FP8) step-time ratios of both tools at the same steps. For block FP8 it also prices
tokenyard's layer GEMMs at the ``fp8_block`` rows themselves ("tokenyard, fp8_block
rows"). Until 2026-11-27 tokenyard priced them with the per-tensor ``fp8`` rows, and this
column showed what the stand-in hid; it now prices the ``fp8_block`` rows itself, every
kernel where it was measured, so the column equals the main one (kept as a check).

    .venv/bin/python benches/predictor_quant_fidelity.py \\
        --out benches/out/predictor_quant_fidelity.json
    .venv/bin/python benches/predictor_quant_fidelity.py --quick   # H100, two pairs, ~5 s
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aic_steps import (
    Aic,
    Step,
    contributions_line,
    error_stats,
    finish_report,
    fits,
    group_contributions,
    op_groups,
    our_ops_ms,
    pct_error,
    report_header,
    stats_cell,
    step_shapes,
)

from tokenyard import catalog
from tokenyard.predictor.compiled import CompiledPredictor
from tokenyard.predictor.measured.data import package_root, resolve_source
from tokenyard.predictor.measured.ops import GemmTimes
from tokenyard.predictor.measured.tables import read_table
from tokenyard.simulation import config_from_mapping
from tokenyard.simulation.execution import build_predictor, choose_execution

DEVICE = {  # measured system -> catalog device
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "gb200": "gb200",
    "b300_sxm": "b300",
}


@dataclass(frozen=True)
class Deployment:
    model: str  # tokenyard replica.model (a catalog name or a bundled repo id)
    aic_model: str  # aiconfigurator's model id (its bundled configs)
    tp: int
    systems: tuple[str, ...]
    baselines: tuple[str, ...] = ()  # models whose step times this one's are divided by
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.model.split("/")[-1]


HOPPER = ("h100_sxm", "h200_sxm")
BLACKWELL = ("b200_sxm", "gb200", "b300_sxm")
LLAMA70 = "meta-llama/Meta-Llama-3.1-70B"
DEPLOYMENTS = (
    Deployment("Qwen/Qwen3-32B", "Qwen/Qwen3-32B", 2, HOPPER),
    Deployment("Qwen/Qwen3-32B-FP8", "Qwen/Qwen3-32B-FP8", 2, HOPPER, ("Qwen/Qwen3-32B",)),
    Deployment("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", 1, HOPPER),
    Deployment(
        "Qwen/Qwen3-30B-A3B-FP8", "Qwen/Qwen3-30B-A3B-FP8", 1, HOPPER, ("Qwen/Qwen3-30B-A3B",)
    ),
    Deployment("llama-3.1-70b", LLAMA70, 4, HOPPER + BLACKWELL, label="Llama-3.1-70B"),
    Deployment(
        "nvidia/Llama-3.1-70B-Instruct-FP8",
        "nvidia/Llama-3.1-70B-Instruct-FP8",
        4,
        (*HOPPER, "b200_sxm"),
        ("llama-3.1-70b",),
    ),
    Deployment("llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B", 1, BLACKWELL, label="Llama-3.1-8B"),
    Deployment("Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B", 4, ("b200_sxm",)),
    Deployment(
        "Qwen/Qwen3-235B-A22B-FP8",
        "Qwen/Qwen3-235B-A22B-FP8",
        4,
        ("b200_sxm",),
        ("Qwen/Qwen3-235B-A22B",),
    ),
    Deployment(
        "nvidia/Qwen3-235B-A22B-NVFP4",
        "nvidia/Qwen3-235B-A22B-NVFP4",
        4,
        ("b200_sxm",),
        ("Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-235B-A22B"),
    ),
)
QUICK = (
    "Qwen/Qwen3-32B",
    "Qwen/Qwen3-32B-FP8",
    "llama-3.1-70b",
    "nvidia/Llama-3.1-70B-Instruct-FP8",
)

#: Steps whose ratios are printed one by one (the rest are summarised per kind).
SHOWCASE = (
    Step("decode", (8, 1024)),
    Step("decode", (128, 2048)),
    Step("prefill", (1, 2048, 0)),
    Step("mixed", (512, 32, 2048)),
)


def step_grid() -> list[Step]:
    steps = [Step("decode", (b, c)) for b in (1, 8, 32, 128, 512) for c in (512, 2048, 8192)]
    steps += [Step("decode", s.args) for s in SHOWCASE if s.kind == "decode"]
    steps += [Step("prefill", (1, c, 0)) for c in (128, 512, 2048, 8192)]
    steps += [Step("prefill", (4, 512, 0)), Step("prefill", (1, 512, 4096))]
    steps += [Step("mixed", m) for m in ((512, 32, 2048), (2048, 128, 8192), (256, 256, 2048))]
    steps += [Step("mixed", (512, 8, 8192))]
    seen: set[Step] = set()
    return [s for s in steps if not (s in seen or seen.add(s))]


# --- the two sides ------------------------------------------------------------------------


def tokenyard_predictor(dep: Deployment, system: str, kv: str) -> tuple[CompiledPredictor, str]:
    """The predictor a simulation of ``dep`` on ``system`` would build, and its banner."""
    config = config_from_mapping(
        {
            "replica": {
                "model": dep.model,
                "device": DEVICE[system],
                "tensor_parallel_size": dep.tp,
                "kv_cache_dtype": kv,
            },
            "execution": {"model": "measured"},
        }
    )
    choice = choose_execution(config)
    predictor = build_predictor(config, choice)
    if predictor is None:
        raise RuntimeError(f"{dep.model} on {system}: no compiled predictor")
    return predictor, choice.label()


def aic_handle(dep: Deployment, system: str, fp8_kv: bool) -> Aic:
    from aiconfigurator_core.sdk.engine import EngineHandle

    source = resolve_source(package_root(), system, "vllm", "latest")
    spec = catalog.model(dep.model)
    kwargs: dict[str, Any] = {"tp_size": dep.tp}
    if spec.num_experts > 1:  # pure tensor parallelism for the experts, as tokenyard reads them
        kwargs.update(moe_tp_size=dep.tp, moe_ep_size=1)
    kwargs["kvcache_quant_mode"] = "fp8" if fp8_kv else "bfloat16"
    handle = EngineHandle.compile(
        dep.aic_model, system, "vllm", backend_version=source.version, **kwargs
    )
    return Aic(handle)


def _layer_gemms(model: Any, tp: int) -> list[tuple[str, int, int]]:
    """(op, n, k) of one TP worker's layer GEMMs (``predictor/measured/build.py``'s shapes)."""
    h, d = model.hidden_size, model.head_dim
    q, kv = model.num_heads // tp * d, math.ceil(model.num_kv_heads / tp) * d
    out = [("qkv_proj", q + 2 * kv, h), ("o_proj", h, q)]
    if model.num_experts == 1:
        i = model.intermediate_size // tp
        out += [("gate_up_proj", 2 * i, h), ("down_proj", h, i)]
    return out


def _rows_of(step: Step) -> int:
    """GEMM rows of a step, as both tools run them."""
    if step.kind == "decode":
        return step.args[0]
    if step.kind == "prefill":
        return step.args[0] * step.args[1]
    return step.args[0] + step.args[1]


# --- one deployment ------------------------------------------------------------------------


def run_deployment(dep: Deployment, system: str, steps: list[Step], fp8_kv: bool) -> dict[str, Any]:
    model = catalog.model(dep.model)
    kv = "fp8" if fp8_kv else "auto"
    predictor, banner = tokenyard_predictor(dep, system, kv)
    aic = aic_handle(dep, system, fp8_kv)
    block = model.quantization is not None and model.quantization.scheme == "fp8_block"
    block_gemm = None
    if block:
        source = resolve_source(package_root(), system, "vllm", "latest")
        rows = read_table(source.folders["gemm"] / "gemm_perf.parquet")
        block_gemm = GemmTimes(rows, "fp8_block")
    memory = catalog.device(DEVICE[system]).memory_gib
    points = []
    for step in steps:
        ours = our_ops_ms(predictor, step_shapes(step))
        theirs_ms = aic.step_ms(step)
        point = {
            "step": step.label(),
            "kind": step.kind,
            "args": list(step.args),
            "fits": fits(model, dep.tp, step, memory),
            "ours_ms": sum(ours.values()),
            "aic_ms": theirs_ms,
            "groups": op_groups(ours, aic.ops_ms(step), model.num_experts > 1),
        }
        if block_gemm is not None:
            m = _rows_of(step)
            swap = sum(
                block_gemm(m, n, k) * 1e3 * model.num_layers - ours[op]
                for op, n, k in _layer_gemms(model, dep.tp)
            )
            point["ours_block_rows_ms"] = point["ours_ms"] + swap
        points.append(point)
    cells = {}
    for kind in ("decode", "prefill", "mixed"):
        kept = [p for p in points if p["kind"] == kind and p["fits"]]
        cell = {"stats": error_stats([pct_error(p["ours_ms"], p["aic_ms"]) for p in kept])}
        if block:
            cell["block_rows"] = error_stats(
                [pct_error(p["ours_block_rows_ms"], p["aic_ms"]) for p in kept]
            )
        cell["contributions"] = group_contributions(kept)
        cells[kind] = cell
    beyond = [p for p in points if not p["fits"]]
    return {
        "model": dep.model,
        "name": dep.name,
        "tp": dep.tp,
        "system": system,
        "baselines": list(dep.baselines),
        "tokenyard": banner,
        "quantization": model.quantization.describe() if model.quantization else "none",
        "cells": cells,
        "beyond_memory": error_stats([pct_error(p["ours_ms"], p["aic_ms"]) for p in beyond]),
        "points": points,
    }


# --- ratios --------------------------------------------------------------------------------


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Quantized / baseline step time, both tools, at the steps both fit."""
    by_key = {(r["model"], r["system"]): r for r in runs}
    out = []
    for r, baseline in ((run, b) for run in runs for b in run["baselines"]):
        base = by_key.get((baseline, r["system"]))
        if base is None:
            continue
        base_points = {p["step"]: p for p in base["points"]}
        row: dict[str, Any] = {
            "model": r["name"],
            "baseline": base["name"],
            "system": r["system"],
            "tp": r["tp"],
            "kinds": {},
            "steps": {},
        }
        pairs = [
            (p, base_points[p["step"]])
            for p in r["points"]
            if p["step"] in base_points and p["fits"] and base_points[p["step"]]["fits"]
        ]
        for kind in ("decode", "prefill", "mixed"):
            sel = [(a, b) for a, b in pairs if a["kind"] == kind]
            if not sel:
                continue
            ours = [a["ours_ms"] / b["ours_ms"] for a, b in sel]
            theirs = [a["aic_ms"] / b["aic_ms"] for a, b in sel]
            entry = {
                "n": len(sel),
                "ours_median": float(np.median(ours)),
                "aic_median": float(np.median(theirs)),
                "ours_range": (min(ours), max(ours)),
                "aic_range": (min(theirs), max(theirs)),
                "sign_agrees": sum((o < 1) == (t < 1) for o, t in zip(ours, theirs, strict=True)),
            }
            if "ours_block_rows_ms" in sel[0][0]:
                block = [a["ours_block_rows_ms"] / b["ours_ms"] for a, b in sel]
                entry["block_rows_median"] = float(np.median(block))
                entry["block_rows_sign_agrees"] = sum(
                    (o < 1) == (t < 1) for o, t in zip(block, theirs, strict=True)
                )
            row["kinds"][kind] = entry
        for a, b in pairs:
            if any(a["step"] == s.label() for s in SHOWCASE):
                row["steps"][a["step"]] = {
                    "ours": a["ours_ms"] / b["ours_ms"],
                    "aic": a["aic_ms"] / b["aic_ms"],
                    **(
                        {"block_rows": a["ours_block_rows_ms"] / b["ours_ms"]}
                        if "ours_block_rows_ms" in a
                        else {}
                    ),
                }
        out.append(row)
    return out


# --- report --------------------------------------------------------------------------------


def print_report(runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    print("\n## Step times vs aiconfigurator (GPU ms; median / p90 / signed |error| %)\n")
    print("| model | TP | system | tokenyard kernels | decode | prefill | mixed | beyond memory |")
    print("|---|---:|---|---|---|---|---|---|")
    for r in runs:
        kernels = r["tokenyard"].split("; ", 1)[1] if "; " in r["tokenyard"] else r["tokenyard"]
        kernels = (
            kernels.split("; fp8_block from")[0].split("; fp8 from")[0].split("; nvfp4 from")[0]
        )
        c = r["cells"]
        print(
            f"| {r['name']} | {r['tp']} | {r['system']} | {kernels} | "
            + " | ".join(stats_cell(c[kind]["stats"]) for kind in ("decode", "prefill", "mixed"))
            + f" | {stats_cell(r['beyond_memory'])} |"
        )
    block = [r for r in runs if "block_rows" in r["cells"]["decode"]]
    if block:
        print("\nblock FP8, tokenyard's layer GEMMs at the fp8_block rows (stand-in undone):\n")
        print("| model | system | decode | prefill | mixed |")
        print("|---|---|---|---|---|")
        for r in block:
            c = r["cells"]
            print(
                f"| {r['name']} | {r['system']} | {stats_cell(c['decode']['block_rows'])} | "
                f"{stats_cell(c['prefill']['block_rows'])} | "
                f"{stats_cell(c['mixed']['block_rows'])} |"
            )
    print("\n## Where the gaps come from: median signed contribution per group (% of aic step)\n")
    for r in runs:
        parts = contributions_line(r["cells"], ("decode", "prefill", "mixed"))
        print(f"- {r['name']} TP{r['tp']} {r['system']}: {parts}")
    print("\n## Step-time ratios, quantized / baseline (median over the steps; tokenyard vs aic)\n")
    print(
        "| model / baseline | system | decode tokenyard / aic (sign agrees) | prefill | mixed | "
        "decode, fp8_block rows |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        cells = []
        for kind in ("decode", "prefill", "mixed"):
            e = row["kinds"].get(kind)
            cells.append(
                f"{e['ours_median']:.2f} / {e['aic_median']:.2f} ({e['sign_agrees']}/{e['n']})"
                if e
                else "-"
            )
        e = row["kinds"].get("decode", {})
        block = (
            f"{e['block_rows_median']:.2f} ({e['block_rows_sign_agrees']}/{e['n']})"
            if "block_rows_median" in e
            else ""
        )
        pair = f"{row['model']} / {row['baseline']}"
        print(f"| {pair} | {row['system']} | {' | '.join(cells)} | {block} |")
    print("\nratios at single steps (tokenyard / aic [/ tokenyard at fp8_block rows]):\n")
    for row in rows:
        text = "; ".join(
            f"{step}: {v['ours']:.2f} / {v['aic']:.2f}"
            + (f" / {v['block_rows']:.2f}" if "block_rows" in v else "")
            for step, v in row["steps"].items()
        )
        print(f"- {row['model']} / {row['baseline']} {row['system']}: {text}")


# --- two gaps isolated ---------------------------------------------------------------------


def diagnostics() -> dict[str, Any]:
    """The two GEMM gaps of the runs above, per layer on H100 (vLLM 0.24.0 tables)."""
    import pyarrow.parquet as pq

    source = resolve_source(package_root(), "h100_sxm", "vllm", "latest")
    rows = read_table(source.folders["gemm"] / "gemm_perf.parquet")
    out: dict[str, Any] = {}

    # 1. fp8_block: the table's three kernels partition the grid (FlashInfer m <= 17,
    # DeepGEMM m >= 32, CUTLASS the n or k below 128); tokenyard's GemmTimes kept only the
    # kernel with the most rows until 2026-11-27, and now reads them all, as aiconfigurator.
    qwen = catalog.model("Qwen/Qwen3-32B-FP8")
    dep = next(d for d in DEPLOYMENTS if d.model == "Qwen/Qwen3-32B-FP8")
    aic = aic_handle(dep, "h100_sxm", False)
    block = GemmTimes(rows, "fp8_block")
    flashinfer = rows.where(gemm_dtype="fp8_block").where(
        kernel_source="FlashInferFp8BlockScaledMMKernel"
    )
    small = GemmTimes(flashinfer, "fp8_block")
    n, k = _layer_gemms(qwen, dep.tp)[0][1:]
    print(f"\nQwen3-32B-FP8 TP2 qkv_proj ({n} x {k}), fp8_block, us per layer, H100 vLLM:\n")
    print("| rows | tokenyard GemmTimes (every kernel) | FlashInfer rows | aiconfigurator |")
    print("|---:|---:|---:|---:|")
    out["fp8_block_kernels"] = []
    for m in (1, 8, 16, 128):
        theirs = aic.ops_ms(Step("decode", (m, 1024)))["qkv_gemm"] * 1e3 / qwen.num_layers
        row = (m, block(m, n, k) * 1e6, small(min(m, 17), n, k) * 1e6 if m <= 17 else None, theirs)
        out["fp8_block_kernels"].append(row)
        fi = f"{row[2]:.1f}" if row[2] is not None else "-"
        print(f"| {m} | {row[1]:.1f} | {fi} | {row[3]:.1f} |")

    # 2. Static per-tensor FP8 (ModelOpt): aiconfigurator's fp8_static GEMM is the table's
    # dynamic fp8 row less the dynamic-quant surcharge (computescale table) and, for
    # o_proj and down_proj, less the static input quant too (scale_matrix table);
    # tokenyard's predictor takes the same off since 2026-11-27 (last column).
    llama = catalog.model("nvidia/Llama-3.1-70B-Instruct-FP8")
    dep = next(d for d in DEPLOYMENTS if d.model == "nvidia/Llama-3.1-70B-Instruct-FP8")
    aic = aic_handle(dep, "h100_sxm", False)
    fp8 = GemmTimes(rows, "fp8")
    predictor, _ = tokenyard_predictor(dep, "h100_sxm", "auto")
    quantize = source.folders["gemm"].parents[2] / "quantize" / "vllm" / source.version
    tables = {}
    for name in ("computescale", "scale_matrix"):
        t = pq.read_table(quantize / f"{name}_perf.parquet").to_pydict()
        tables[name] = {(m, kk): v for m, kk, v in zip(t["m"], t["k"], t["latency"], strict=True)}
    names = {"qkv_proj": "qkv_gemm", "o_proj": "proj_gemm", "gate_up_proj": "gate_ffn1_gemm"}
    names["down_proj"] = "ffn2_gemm"
    print("\nLlama-3.1-70B-Instruct-FP8 TP4 (ModelOpt static FP8), us per layer, H100 vLLM:\n")
    print(
        "| op | rows | fp8 row (dynamic) | aiconfigurator fp8_static | computescale | "
        "scale_matrix | fp8 - computescale - scale_matrix | tokenyard |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    out["fp8_static"] = []
    for m in (8, 128):
        their_ops = aic.ops_ms(Step("decode", (m, 1024)))
        mine = our_ops_ms(predictor, step_shapes(Step("decode", (m, 1024))))
        for op, n, k in _layer_gemms(llama, dep.tp):
            ours = fp8(m, n, k) * 1e6
            theirs = their_ops[names[op]] * 1e3 / llama.num_layers
            cs = tables["computescale"].get((m, k), math.nan) * 1e3
            sm = tables["scale_matrix"].get((m, k), math.nan) * 1e3
            now = mine[op] * 1e3 / llama.num_layers
            out["fp8_static"].append((op, m, ours, theirs, cs, sm, now))
            low = op in ("o_proj", "down_proj")
            print(
                f"| {op} | {m} | {ours:.2f} | {theirs:.2f} | {cs:.2f} | {sm:.2f} | "
                f"{ours - cs - (sm if low else 0.0):.2f} | {now:.2f} |"
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", help="write every figure to this JSON file")
    parser.add_argument("--quick", action="store_true", help="H100 Qwen3-32B and Llama-70B only")
    parser.add_argument(
        "--fp8-kv",
        action="store_true",
        help="an FP8 KV cache on both sides (aiconfigurator's default for quantized "
        "checkpoints) instead of bf16",
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # aiconfigurator logs every fallback it takes
    started = time.perf_counter()
    _, report = report_header()
    report["fp8_kv"] = args.fp8_kv
    steps = step_grid()
    runs, skipped = [], []
    for dep in DEPLOYMENTS:
        if args.quick and dep.model not in QUICK:
            continue
        for system in ("h100_sxm",) if args.quick else dep.systems:
            if system not in dep.systems:
                continue
            try:
                run = run_deployment(dep, system, steps, args.fp8_kv)
            except Exception as exc:  # report it and go on
                skipped.append(f"{dep.model} TP{dep.tp} {system}: {type(exc).__name__}: {exc}")
                continue
            print(f"  {dep.name} TP{dep.tp} {system}: {run['tokenyard']}")
            runs.append(run)
    for line in skipped:
        print(f"  skipped {line}")
    rows = ratios(runs)
    print_report(runs, rows)
    report.update(runs=runs, ratios=rows, skipped=skipped, grid=[s.label() for s in steps])
    if not args.quick:
        report["diagnostics"] = diagnostics()
    finish_report(report, started, args.out)


if __name__ == "__main__":
    main()
