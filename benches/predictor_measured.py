"""Fidelity of the measured predictor (issue 13), in four parts.

a. **Interpolation held-out error.** For each operation family of the vLLM tables on
   H100 and A100 (GEMM, context attention, generation attention, custom all-reduce and
   NCCL all-reduce, MoE), 20% of the measured points are held out (``--draws`` seeded
   draws, pooled), the family's ``*Times`` object is rebuilt from the other 80%, and it is
   scored on the held-out points.
   Held-out points are drawn only among *interior* points: a point is interior when, on
   every axis of the nested interpolation, its value lies strictly inside the range that
   its neighbours span (GEMM: ``m`` inside its ``(n, k)`` curve, ``k`` inside its ``n``,
   ``n`` inside the table; attention: batch inside its ``(heads, s)`` curve, ``s`` inside
   its head count, heads inside the slice; all-reduce and MoE: the size or token count
   inside its curve). Each held-out point is then an interpolation between measured
   neighbours, never an extrapolation. A point is one distinct shape, scored against the
   median of its repeated rows, as the ``*Times`` objects read it.
b. **Step times against aiconfigurator's own estimator** (``aiconfigurator_core``'s
   ``EngineHandle``, same model, system, framework and table version), for three tokenyard
   predictors: ``measured``, the calibrated roofline and the datasheet roofline (constant
   efficiencies). aiconfigurator leaves out host overheads, so tokenyard's GPU time
   (``stage_time(...)[1]``) is compared. The mapping, established by probing (and
   re-checked on every run, see ``mapping checks``):

   - decode ``(b, ctx)``: ``predict_decode_latency(b, ctx, 2)`` equals the sum of
     ``decode_step_per_op(b, ctx - 1, 2)``, whose docstring puts the step at ``s = isl +
     osl // 2 + 1`` keys: ``ctx + 1`` keys, i.e. ``ctx`` tokens already cached and the new
     one (tokenyard: ``sum_decode_context = b * ctx``). The LM head runs on ``b`` rows.
   - prefill ``(b, chunk c, cached prefix p)``: ``predict_prefill_latency(b, p + c, p)``:
     its ``isl`` counts the cached prefix (GEMMs run ``b * c`` rows), as
     ``run_static_per_op(batch_size=b, isl=p + c, prefix=p)`` shows.
   - mixed ``(C prefill tokens, G decodes, prompt I)``: ``mixed_step_latency(C, G, I, 2,
     0)`` runs the GEMMs on ``C + G`` rows, the LM head on one row, the decodes at ``s = I +
     2`` keys (context ``I + 1``) and charges the context attention of the *whole* prompt
     divided by ``ceil(I / C)``, as its docstring says, i.e. the mean over the prompt's
     chunks. tokenyard is priced the same way: the mean of its step time over the
     ``I / C`` chunk positions (chunk ``C`` over ``j * C`` cached tokens), ``I`` a multiple
     of ``C``. With a cached prefix, aiconfigurator still divides by ``ceil(I / C)``, not by
     the ``ceil((I - p) / C)`` chunks the new tokens need, so mixed steps here use ``p = 0``.

   Steps count where their KV cache fits the GPU next to the weights (80 GB, 90% usable):
   past that, the tables have no measurements (their collectors ran out of memory there)
   and both tools extrapolate; those points are summarised in a "beyond memory" row. The
   "aiconfigurator's accounting" column drops the decode tokens' RoPE, QK-norm and KV store
   from the measured step, which aiconfigurator charges in context attention only.
c. **Systematic gaps**: per operation group, the median signed contribution of each group
   to the step gap (``(tokenyard op - aiconfigurator op) / aiconfigurator step``), and the
   per-operation breakdown of the worst cells' worst points, then three checks that
   isolate gaps (MoE routing rows, the router GEMM below the GEMM grid, a chunk over a
   cached prefix).
d. **Vidur's measured MLP-side operations** (``../shared/data/profiling/vidur``, measured
   with Vidur's own PyTorch profiler on A100/H100) against tokenyard's per-operation
   predictions, per layer. Skipped when ``../shared/data`` is absent.

    .venv/bin/python benches/predictor_measured.py --out benches/out/predictor_measured.json
    .venv/bin/python benches/predictor_measured.py --quick --out /tmp/pm.json   # ~15 s
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import logging
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aic_steps import (
    OP_GROUPS,
    Aic,
    Step,
    error_stats,
    fits,
    op_groups,
    our_ops_ms,
    pct_error,
    report_header,
    step_shapes,
)
from measured_holdout import SYSTEMS, holdout_section
from measured_vidur import vidur_section

from tokenyard import catalog
from tokenyard.predictor.calibration import builtin_calibration
from tokenyard.predictor.compiled import CompiledPredictor
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import MeasuredSource, package_root, resolve_source
from tokenyard.predictor.measured.ops import (
    GemmTimes,
    MoeShape,
    MoeTimes,
)
from tokenyard.predictor.measured.tables import Columns, read_table
from tokenyard.predictor.roofline import roofline_predictor

FRAMEWORKS = ("vllm", "sglang")
PREDICTORS = ("measured", "calibrated", "datasheet")


@dataclass(frozen=True)
class Deployment:
    model: str  # tokenyard catalog name
    aic_model: str  # aiconfigurator model id (its bundled model_configs name, -- -> /)
    tp: int


DEPLOYMENTS = (
    Deployment("llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B", 1),
    Deployment("llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", 4),
    Deployment("llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", 8),
    Deployment("Qwen/Qwen3-32B", "Qwen/Qwen3-32B", 2),
    Deployment("Qwen/Qwen3-32B", "Qwen/Qwen3-32B", 4),
    Deployment("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", 2),
    Deployment("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", 4),
)
QUICK_DEPLOYMENTS = (DEPLOYMENTS[0], DEPLOYMENTS[1], DEPLOYMENTS[5])


# --- b. step times against aiconfigurator ----------------------------------------------------


def step_grid(quick: bool) -> list[Step]:
    if quick:
        batches, contexts = (1, 16, 128, 512), (128, 2048, 32768)
        prefill = [(1, c, 0) for c in (128, 2048, 8192)] + [(4, 512, 0)]
        prefill += [(1, c, p) for c in (512, 2048) for p in (1024, 16384)]
        mixed = [(512, 32, 2048), (2048, 128, 8192), (256, 256, 2048)]
    else:
        batches = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
        contexts = (128, 512, 2048, 8192, 32768)
        prefill = [(1, c, 0) for c in (128, 256, 512, 1024, 2048, 4096, 8192)]
        prefill += [(b, c, 0) for b in (2, 4, 8) for c in (128, 512, 2048)]
        prefill += [(1, c, p) for c in (128, 512, 2048, 8192) for p in (1024, 4096, 16384)]
        mixed = [
            (c, g, i) for c in (256, 512, 2048) for g in (4, 32, 128, 256) for i in (2048, 8192)
        ]
    steps = [Step("decode", (b, ctx)) for b in batches for ctx in contexts]
    steps += [Step("prefill", p) for p in prefill]
    steps += [Step("mixed", m) for m in mixed]
    return steps


@functools.cache
def _config_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="aic-configs-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _aic_handle(dep: Deployment, system: str, source: MeasuredSource) -> Any:
    """Compiles aiconfigurator's engine. Models outside its cached list (Mixtral) are
    compiled from their bundled config, copied to a folder as ``config.json``."""
    import aiconfigurator_core
    from aiconfigurator_core.sdk.common import DefaultHFModels
    from aiconfigurator_core.sdk.engine import EngineHandle

    path = dep.aic_model
    if path not in DefaultHFModels:
        bundled = Path(aiconfigurator_core.__file__).parent / "model_configs"
        config = bundled / f"{path.replace('/', '--')}_config.json"
        folder = _config_dir() / path.replace("/", "--")
        folder.mkdir(exist_ok=True)
        shutil.copy(config, folder / "config.json")
        path = str(folder)
    spec = catalog.model(dep.model)
    # Pure tensor parallelism for the experts too, as tokenyard's MoE tables are read.
    moe = {"moe_tp_size": dep.tp, "moe_ep_size": 1} if spec.num_experts > 1 else {}
    return EngineHandle.compile(
        path, system, source.framework, backend_version=source.version, tp_size=dep.tp, **moe
    )


def _predictors(
    dep: Deployment, system: str, source: MeasuredSource, cache: dict
) -> dict[str, CompiledPredictor]:
    model, device = catalog.model(dep.model), catalog.device(SYSTEMS[system])
    key = (dep.model, dep.tp, system)
    if key not in cache:
        cache[key] = {
            "calibrated": roofline_predictor(
                model, device, tensor_parallel_size=dep.tp, calibration=builtin_calibration(device)
            ),
            "datasheet": roofline_predictor(model, device, tensor_parallel_size=dep.tp),
        }
    measured = measured_predictor(model, device, source, tensor_parallel_size=dep.tp)
    return {"measured": measured, **cache[key]}


def _aligned(ops_ms: dict[str, float], step: Step) -> float:
    """The measured step in aiconfigurator's accounting: it charges RoPE, QK-norm and the
    KV write inside context attention only, so the decode tokens' share of them is dropped."""
    decode_share = {"decode": 1.0, "prefill": 0.0}.get(step.kind)
    if decode_share is None:
        decode_share = step.args[1] / (step.args[0] + step.args[1])
    extra = sum(ops_ms.get(op, 0.0) for op in ("rope", "qk_norm", "kv_store"))
    return sum(ops_ms.values()) - decode_share * extra


def _mapping_checks(aic: Aic) -> dict[str, float]:
    """Re-checks the argument mapping on one deployment (relative differences)."""
    checks = {}
    diffs = []
    for b, isl in ((1, 1000), (16, 2000), (64, 4096), (256, 1024)):
        total = aic.h.predict_decode_latency(b, isl, 2)
        per_op = sum(ms for _, ms, *_ in aic.h.decode_step_per_op(b, isl - 1, 2))
        diffs.append(abs(per_op / total - 1))
    checks["decode: predict_decode(b, isl) vs sum of decode_step_per_op(b, isl - 1)"] = max(diffs)
    diffs = []
    for b, c, p in ((1, 2048, 0), (2, 1024, 0), (1, 1024, 4096)):
        total = aic.h.predict_prefill_latency(b, p + c, p)
        per_op = sum(
            ms for _, ms, *_ in aic.h.run_static_per_op(batch_size=b, isl=p + c, osl=2, prefix=p)[0]
        )
        diffs.append(abs(per_op / total - 1))
    checks["prefill: predict_prefill(b, p + c, p) vs sum of run_static_per_op context"] = max(diffs)

    def context_attention(c: int, g: int, i: int, p: int) -> float:
        return sum(ms for _, ms, *_ in aic.h.mixed_step_breakdown_per_op(c, g, i, 2, p)[1])

    def whole(i: int, p: int) -> float:
        ops = aic.ops_ms(Step("prefill", (1, i - p, p)))
        return ops["context_attention"]

    diffs = [
        abs(context_attention(c, 16, i, 0) / (whole(i, 0) / math.ceil(i / c)) - 1)
        for c, i in ((512, 2048), (1000, 2048), (2048, 8192))
    ]
    checks["mixed: context attention = whole prompt's / ceil(I / C), p = 0"] = max(diffs)
    diffs = [
        abs(context_attention(c, 16, i, p) / (whole(i, p) / math.ceil(i / c)) - 1)
        for c, i, p in ((1024, 3072, 2048), (512, 3072, 1024))
    ]
    checks["mixed: with a prefix p, still / ceil(I / C), not / ceil((I - p) / C)"] = max(diffs)
    diffs = []
    for g, i in ((16, 2048), (64, 4096)):
        mixed = sum(ms for _, ms, *_ in aic.h.mixed_step_breakdown_per_op(512, g, i, 2, 0)[2])
        decode = aic.ops_ms(Step("decode", (g, i + 1)))["generation_attention"]
        diffs.append(abs(mixed / decode - 1))
    checks["mixed: decode attention = decode step at context I + 1"] = max(diffs)
    return checks


def step_section(quick: bool) -> dict[str, Any]:
    logging.disable(logging.WARNING)  # aiconfigurator logs every fallback it takes
    root = package_root()
    steps = step_grid(quick)
    deployments = QUICK_DEPLOYMENTS if quick else DEPLOYMENTS
    systems = ("h100_sxm",) if quick else tuple(SYSTEMS)
    frameworks = ("vllm",) if quick else FRAMEWORKS
    cells: list[dict[str, Any]] = []
    skipped: list[str] = []
    checks: dict[str, float] = {}
    predictor_cache: dict = {}
    for system in systems:
        for framework in frameworks:
            source = resolve_source(root, system, framework, "latest")
            for dep in deployments:
                name = f"{dep.model} TP{dep.tp} {system} {framework}"
                try:
                    aic = Aic(_aic_handle(dep, system, source))
                except Exception as exc:  # any failure: report it and skip the deployment
                    skipped.append(f"{name}: aiconfigurator cannot compile it ({exc})")
                    continue
                if not checks:
                    checks = _mapping_checks(aic)
                predictors = _predictors(dep, system, source, predictor_cache)
                model = catalog.model(dep.model)
                memory = catalog.device(SYSTEMS[system]).memory_gib
                points = []
                for step in steps:
                    shapes = step_shapes(step)
                    theirs_ms = aic.step_ms(step)
                    theirs_ops = aic.ops_ms(step)
                    ours = {p: our_ops_ms(pred, shapes) for p, pred in predictors.items()}
                    points.append(
                        {
                            "step": step.label(),
                            "kind": step.kind,
                            "args": list(step.args),
                            "fits": fits(model, dep.tp, step, memory),
                            "aic_ms": theirs_ms,
                            "ms": {p: sum(v.values()) for p, v in ours.items()},
                            "measured_aligned_ms": _aligned(ours["measured"], step),
                            "groups": {
                                pr: op_groups(ours[pr], theirs_ops, model.num_experts > 1)
                                for pr in ("measured", "calibrated")
                            },
                        }
                    )
                for kind in ("decode", "prefill", "mixed"):
                    kept = [p for p in points if p["kind"] == kind and p["fits"]]
                    cells.append(
                        {
                            "model": dep.model,
                            "tp": dep.tp,
                            "system": system,
                            "framework": framework,
                            "source": source.describe(),
                            "kind": kind,
                            "stats": {
                                **{
                                    pr: error_stats(
                                        [pct_error(p["ms"][pr], p["aic_ms"]) for p in kept]
                                    )
                                    for pr in PREDICTORS
                                },
                                "aligned": error_stats(
                                    [pct_error(p["measured_aligned_ms"], p["aic_ms"]) for p in kept]
                                ),
                            },
                            "points": kept,
                        }
                    )
                beyond = [p for p in points if not p["fits"]]
                if beyond:
                    cells.append(
                        {
                            "model": dep.model,
                            "tp": dep.tp,
                            "system": system,
                            "framework": framework,
                            "kind": "beyond memory",
                            "stats": {
                                pr: error_stats(
                                    [pct_error(p["ms"][pr], p["aic_ms"]) for p in beyond]
                                )
                                for pr in PREDICTORS
                            },
                            "points": beyond,
                        }
                    )
    _print_steps(cells, skipped, checks)
    return {"cells": cells, "skipped": skipped, "mapping_checks": checks, "grid": len(steps)}


def _print_steps(cells: list[dict[str, Any]], skipped: list[str], checks: dict[str, float]) -> None:
    print("\n## b. Step times vs aiconfigurator's estimator (GPU time)\n")
    print("mapping checks (max relative difference):")
    for text, diff in checks.items():
        print(f"  {text}: {100 * diff:.3f}%")
    for line in skipped:
        print(f"  skipped {line}")
    print(
        "\n| model | TP | system | framework | step | n | measured median / p90 / signed | "
        "measured, aic accounting | calibrated median / p90 / signed | "
        "datasheet median / p90 / signed |"
    )
    print("|---|---:|---|---|---|---:|---|---|---|---|")
    for c in cells:
        if c["kind"] == "beyond memory":
            continue
        row = " | ".join(
            f"{s['median']:.1f} / {s['p90']:.1f} / {s['signed']:+.1f}"
            for s in (c["stats"][p] for p in ("measured", "aligned", "calibrated", "datasheet"))
        )
        print(
            f"| {c['model']} | {c['tp']} | {c['system']} | {c['framework']} | {c['kind']} | "
            f"{c['stats']['measured']['n']} | {row} |"
        )
    print("\nall deployments together, by step kind (median / p90 / signed, %):\n")
    print(
        "| step | n | measured | measured, aiconfigurator's accounting | calibrated | datasheet |"
    )
    print("|---|---:|---|---|---|---|")
    for kind in ("decode", "prefill", "mixed", "beyond memory"):
        pts = [p for c in cells if c["kind"] == kind for p in c["points"]]
        if not pts:
            continue
        row = []
        for pr in ("measured", "aligned", "calibrated", "datasheet"):
            s = error_stats(
                [
                    pct_error(
                        p["measured_aligned_ms"] if pr == "aligned" else p["ms"][pr], p["aic_ms"]
                    )
                    for p in pts
                ]
            )
            row.append(f"{s['median']:.1f} / {s['p90']:.1f} / {s['signed']:+.1f}")
        print(f"| {kind} | {len(pts)} | {' | '.join(row)} |")


def gaps_section(steps: dict[str, Any], worst: int) -> dict[str, Any]:
    """c. Where the measured predictor's step gap comes from."""
    cells = [c for c in steps["cells"] if c["kind"] != "beyond memory" and c["points"]]
    print("\n## c. Systematic gaps: median signed contribution per operation group\n")
    print("(tokenyard op - aiconfigurator op) / aiconfigurator step, %, all points\n")
    out: dict[str, Any] = {"contributions": {}, "worst": []}
    kinds = ("decode", "prefill", "mixed")
    groups = [g for g, *_ in OP_GROUPS] + ["other"]
    predictors = ("measured", "calibrated")
    print("| op group | " + " | ".join(f"{pr} {k}" for pr in predictors for k in kinds) + " |")
    print("|---|" + "---:|" * len(kinds) * len(predictors))
    for group in groups:
        row = []
        for pr in predictors:
            for kind in kinds:
                values = [
                    100 * (p["groups"][pr][group][0] - p["groups"][pr][group][1]) / p["aic_ms"]
                    for c in cells
                    if c["kind"] == kind
                    for p in c["points"]
                    if group in p["groups"][pr]
                ]
                median = float(np.median(values)) if values else None
                out["contributions"].setdefault(pr, {}).setdefault(group, {})[kind] = median
                row.append(f"{median:+.2f}" if values else "")
        if any(row):
            print(f"| {group} | " + " | ".join(row) + " |")
    ranked = sorted(cells, key=lambda c: -c["stats"]["measured"]["median"])[:worst]
    for c in ranked:
        point = max(c["points"], key=lambda p: abs(pct_error(p["ms"]["measured"], p["aic_ms"])))
        head = (
            f"{c['model']} TP{c['tp']} {c['system']} {c['framework']}, {c['kind']} "
            f"(cell median {c['stats']['measured']['median']:.1f}%); worst point {point['step']}: "
            f"tokenyard {point['ms']['measured']:.3f} ms vs aiconfigurator "
            f"{point['aic_ms']:.3f} ms "
            f"({pct_error(point['ms']['measured'], point['aic_ms']):+.1f}%)"
        )
        print(f"\n{head}\n")
        print("| op group | tokenyard ms | aiconfigurator ms | difference ms |")
        print("|---|---:|---:|---:|")
        for group, (a, b) in point["groups"]["measured"].items():
            print(f"| {group} | {a:.3f} | {b:.3f} | {a - b:+.3f} |")
        out["worst"].append({"cell": head, "groups": point["groups"]["measured"]})
    return out


def diagnostics() -> dict[str, Any]:
    """Three checks that isolate gaps found in part c, on H100 vLLM tables."""
    logging.disable(logging.WARNING)
    root = package_root()
    source = resolve_source(root, "h100_sxm", "vllm", "latest")
    out: dict[str, Any] = {}
    mixtral = DEPLOYMENTS[5]
    spec = catalog.model(mixtral.model)
    aic = Aic(_aic_handle(mixtral, "h100_sxm", source))

    def aic_per_layer(op: str, tokens: int) -> float:
        step = Step("decode", (tokens, 128)) if tokens <= 512 else Step("prefill", (1, tokens, 0))
        return aic.ops_ms(step)[op] * 1e3 / spec.num_layers

    # MoE: tokenyard reads balanced routing, aiconfigurator prices Mixtral with a power law.
    table = read_table(source.folders["moe"] / "moe_perf.parquet")
    mixtral_moe = MoeShape(
        dtype="bfloat16",
        hidden_size=spec.hidden_size,
        inter_size=spec.intermediate_size,
        topk=spec.experts_per_token,
        num_experts=spec.num_experts,
        tensor_parallel_size=mixtral.tp,
    )
    moe = {}
    for distribution in ("balanced", "power_law_1.2"):
        rows = table.where(distribution=distribution)
        rows = Columns(rows.path, {k: v for k, v in rows.data.items() if k != "distribution"})
        moe[distribution] = MoeTimes(rows, mixtral_moe)
    print("\nMixtral-8x7B TP2 MoE block per layer (µs), H100 vLLM: routing assumption\n")
    print("| tokens | aiconfigurator | tokenyard, balanced rows | tokenyard, power_law_1.2 rows |")
    print("|---:|---:|---:|---:|")
    out["moe"] = []
    for tokens in (1, 4, 16, 64, 256, 1024, 4096, 8192):
        row = (
            tokens,
            aic_per_layer("moe", tokens),
            moe["balanced"](tokens) * 1e6,
            moe["power_law_1.2"](tokens) * 1e6,
        )
        out["moe"].append(row)
        print(f"| {row[0]} | {row[1]:.1f} | {row[2]:.1f} | {row[3]:.1f} |")

    # Router: a GEMM with n = 8 experts, below the tables' smallest n (32).
    gemm = GemmTimes(read_table(source.folders["gemm"] / "gemm_perf.parquet"), "bfloat16")
    print("\nMixtral router GEMM per layer (µs): n = 8 lies below the measured n >= 32\n")
    print("| tokens | aiconfigurator | tokenyard n=8 | tokenyard at n=32 (smallest measured) |")
    print("|---:|---:|---:|---:|")
    out["router"] = []
    for tokens in (1, 16, 128, 1024, 8192):
        row = (
            tokens,
            aic_per_layer("router_gemm", tokens),
            gemm(tokens, spec.num_experts, spec.hidden_size) * 1e6,
            gemm(tokens, 32, spec.hidden_size) * 1e6,
        )
        out["router"].append(row)
        print(f"| {row[0]} | {row[1]:.2f} | {row[2]:.2f} | {row[3]:.2f} |")

    # A chunk over a cached prefix: the whole prompt's time times its share of the pairs.
    llama = DEPLOYMENTS[0]
    model = catalog.model(llama.model)
    aic = Aic(_aic_handle(llama, "h100_sxm", source))
    measured = measured_predictor(model, catalog.device("h100-sxm"), source)
    print("\nLlama-3.1-8B prefill attention per layer (µs), chunk of 128 over a cached prefix\n")
    print("| prefix | tokenyard attn_prefill | aiconfigurator context attention |")
    print("|---:|---:|---:|")
    out["prefix"] = []
    for prefix in (0, 1024, 4096, 16384):
        (shape,) = step_shapes(Step("prefill", (1, 128, prefix)))
        ours = measured.op_times(shape)["attn_prefill"] * 1e6 / model.num_layers
        theirs = aic.ops_ms(Step("prefill", (1, 128, prefix)))["context_attention"]
        out["prefix"].append((prefix, ours, theirs * 1e3 / model.num_layers))
        print(f"| {prefix} | {ours:.1f} | {theirs * 1e3 / model.num_layers:.1f} |")
    return out


# --- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", help="write every figure to this JSON file")
    parser.add_argument("--quick", action="store_true", help="a small grid on H100 vLLM only")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out draws")
    parser.add_argument("--draws", type=int, default=5, help="held-out draws per slice")
    parser.add_argument("--worst", type=int, default=6, help="worst cells broken down by op")
    parser.add_argument(
        "--parts", default="abcd", help="which parts to run (c needs b): a, b, c, d"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    root, report = report_header()
    report.update(
        quick=args.quick,
        seed=args.seed,
        tables={
            f"{s} {fw}": resolve_source(root, s, fw, "latest").describe()
            for s in SYSTEMS
            for fw in FRAMEWORKS
        },
    )
    for key, text in report["tables"].items():
        print(f"  tables {key}: {text}")
    timings = {}
    if "a" in args.parts:
        t = time.perf_counter()
        report["holdout"] = holdout_section(args.seed, 2 if args.quick else args.draws)
        timings["a"] = time.perf_counter() - t
    if "b" in args.parts:
        t = time.perf_counter()
        report["steps"] = step_section(args.quick)
        timings["b"] = time.perf_counter() - t
        if "c" in args.parts:
            report["gaps"] = gaps_section(report["steps"], args.worst)
            report["gaps"]["diagnostics"] = diagnostics()
    if "d" in args.parts:
        t = time.perf_counter()
        report["vidur"] = vidur_section(SYSTEMS, PREDICTORS)
        timings["d"] = time.perf_counter() - t
    report["wall_s"] = time.perf_counter() - started
    report["part_s"] = timings
    parts = ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
    print(f"\nwall {report['wall_s']:.0f} s ({parts})")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
