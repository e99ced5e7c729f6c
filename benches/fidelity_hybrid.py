"""Fidelity of the measured predictor on windowed, chunked, hybrid-linear and vision models
(issue 29).

Step times against aiconfigurator-core's own estimator (``EngineHandle``), on the grid and
with the statistics of ``predictor_quant_fidelity.py`` (the shared harness
``aic_steps.py``), for the layer kinds that report never measured:

- sliding window: openai/gpt-oss-120b (H100 TP 2, B200 TP 1; MXFP4 experts, window 128),
  google/gemma-4-26B-A4B (H100 TP 1; window 1024, wider global layers);
- chunked local attention: Llama-4-Scout-17B-16E-Instruct (H100 TP 4; chunk 8192);
- gated DeltaNet: Qwen/Qwen3.5-35B-A3B (H200 TP 2);
- Mamba2: nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 (H100 TP 1);
- a vision-language model: Qwen/Qwen3-VL-8B-Instruct (H100 TP 1), its text steps on the
  grid and its vision encoder per image.

Both sides as the other reports drive them: tokenyard through ``config_from_mapping`` ->
``choose_execution`` -> ``build_predictor`` (``replica.model``, ``device``,
``tensor_parallel_size``, ``kv_cache_dtype = "auto"``: bf16), aiconfigurator through
``EngineHandle.compile(model, system, "vllm", backend_version=<the tables' version>,
tp_size=TP, moe_tp_size=TP, moe_ep_size=1, kvcache_quant_mode="bfloat16")`` (the experts
tensor-parallel, as tokenyard reads them). vLLM tables, ``latest`` (0.24.0).

Beyond the grid, a "long" set of steps past the windows (decodes over 16k and 32k keys, a
chunk after 16k cached tokens) where the windowed kinds part from full attention; for
Llama 4 that is where the two tools price chunked attention differently (tokenyard the
chunk-local work vLLM runs, aiconfigurator a sliding window of the chunk).

The vision encoder: aiconfigurator's compiled engine leaves it out (``sdk/engine.py``,
``build_engine_spec_json``: "Vision encoder ops are intentionally NOT emitted"); its Python
backend prices it in ``BaseBackend._run_encoder_phase`` from the model's ``encoder_ops``
(``sdk/models/blocks/vit.py``), evaluated here the same way (``evaluate_ops_json``, the
ops grouped by the tokens they run: attention per image of ``P`` patches, the projector at
the ``P / 4`` merged tokens, the rest at ``P``), against tokenyard's ``encoder_cost`` at
the same patch count.

    .venv/bin/python benches/fidelity_hybrid.py --out benches/out/fidelity_hybrid.json
    .venv/bin/python benches/fidelity_hybrid.py --quick   # gpt-oss H100 and Llama 4 only
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aic_steps import (
    Aic,
    Step,
    contributions_line,
    error_stats,
    finish_report,
    group_contributions,
    our_ops_ms,
    pct_error,
    report_header,
    stats_cell,
    step_shapes,
)
from predictor_quant_fidelity import (
    DEVICE,
    Deployment,
    aic_handle,
    step_grid,
    tokenyard_predictor,
)

from tokenyard import catalog
from tokenyard.catalog import ModelSpec
from tokenyard.predictor.measured.data import package_root, resolve_source
from tokenyard.predictor.vision import encoder_cost

SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
VL = "Qwen/Qwen3-VL-8B-Instruct"
DEPLOYMENTS = (
    Deployment("openai/gpt-oss-120b", "openai/gpt-oss-120b", 2, ("h100_sxm",)),
    Deployment("openai/gpt-oss-120b", "openai/gpt-oss-120b", 1, ("b200_sxm",)),
    Deployment("Qwen/Qwen3.5-35B-A3B", "Qwen/Qwen3.5-35B-A3B", 2, ("h200_sxm",)),
    Deployment(NANO, NANO, 1, ("h100_sxm",), label="Nemotron-3-Nano-30B-A3B"),
    Deployment(SCOUT, SCOUT, 4, ("h100_sxm",), label="Llama-4-Scout"),
    Deployment("google/gemma-4-26B-A4B", "google/gemma-4-26B-A4B", 1, ("h100_sxm",)),
    Deployment(VL, VL, 1, ("h100_sxm",)),
)
QUICK = (("openai/gpt-oss-120b", "h100_sxm"), (SCOUT, "h100_sxm"))

#: Steps past every window (gpt-oss 128, Gemma 1024, Llama 4's chunk of 8192).
LONG = (
    Step("decode", (8, 16384)),
    Step("decode", (64, 16384)),
    Step("decode", (8, 32768)),
    Step("prefill", (1, 2048, 16384)),
    Step("prefill", (1, 16384, 0)),
)

#: Image sizes the encoder is compared at (height, width in pixels).
IMAGES = ((448, 448), (1024, 1024), (1080, 1920))

# --- operation groups ----------------------------------------------------------------------

#: (group, tokenyard op pattern, aiconfigurator op pattern): the first group whose pattern
#: matches takes the op. aiconfigurator names its layer types as prefixes (``swa_``,
#: ``global_``, ``gdn_``, ``full_``, ``mamba_``, ``attn_``, ``moe_``); tokenyard its mixer
#: kinds (``sliding_``, ``chunked_``, ``gdn_``, ``mamba2_``).
GROUPS = (
    ("embedding", r"embedding(_all_reduce)?", r"embedding(_ar)?"),
    ("norms", r"input_norm|post_attn_norm", r"add_norm_\d|(\w+_)?(attn|ffn|moe|mamba|gdn)_norm"),
    ("qkv_proj", r"(\w+_)?qkv_proj", r"(\w+_)?qkv_gemm"),
    ("rope + qk_norm + kv_store", r"(\w+_)?(rope|qk_norm|kv_store)", r"$^"),
    ("attention, prefill", r"(\w+_)?attn_prefill", r"context_attention"),
    ("attention, decode", r"(\w+_)?attn_decode", r"generation_attention"),
    ("o_proj", r"(sliding_|chunked_)?o_proj", r"(swa_|global_|full_)?proj_gemm"),
    (
        "linear in/out proj",
        r"(gdn|mamba2)_(in|out)_proj",
        r"(gdn|mamba)_(in_proj|in_proj_ba|out_proj)_gemm",
    ),
    (
        "linear conv + scan + norm",
        r"(gdn|mamba2)_(conv|scan)_(prefill|decode)|(gdn|mamba2)_gated_norm",
        r"(gdn|mamba)_(conv1d|recurrence|scan|ssm)",
    ),
    ("dense MLP", r"(dense_)?(gate_up_proj|act|down_proj)", r"gate_ffn1_gemm|act_gate|ffn2_gemm"),
    ("shared expert", r"shared_\w+", r"(\w+_)?shared_\w+"),
    ("router", r"router", r"(\w+_)?router_gemm"),
    ("MoE experts", r"moe_experts", r"(\w+_)?moe(_overlap)?"),
    (
        "all_reduce",
        r"all_reduce",
        r"ar_\d|(\w+_)?ar|(\w+_)?moe_(pre|post)_dispatch",
    ),
    ("lm_head", r"lm_head", r"logits_gemm"),
)


def _group_of(name: str, side: int) -> str:
    for group, *patterns in GROUPS:
        if re.fullmatch(patterns[side], name):
            return group
    return "other"


def hybrid_groups(
    ours: dict[str, float], theirs: dict[str, float], moe: bool
) -> dict[str, tuple[float, float]]:
    """Per group: (tokenyard ms, aiconfigurator ms). A MoE model's MLP ops (the calibrated
    fallback) count as its experts; aiconfigurator's decode ``*_moe_overlap`` (router,
    experts and shared expert overlapped) as its experts."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for side, ops in enumerate((ours, theirs)):
        for name, ms in ops.items():
            if name == "p2p":
                continue
            group = _group_of(name, side)
            if moe and side == 0 and group == "dense MLP" and not name.startswith("dense_"):
                group = "MoE experts"
            out[group][side] += ms
    return {g: (a, b) for g, (a, b) in out.items() if a or b}


# --- memory filter -------------------------------------------------------------------------


def _contexts(step: Step) -> list[int]:
    """Each request's tokens in KV at the step's end."""
    if step.kind == "decode":
        return [step.args[1] + 1] * step.args[0]
    if step.kind == "prefill":
        return [step.args[1] + step.args[2]] * step.args[0]
    _, decodes, prompt = step.args
    return [prompt] + [prompt + 2] * decodes


def fits_hybrid(model: ModelSpec, tp: int, step: Step, memory_gib: float) -> bool:
    """``aic_steps.fits`` for layer kinds: KV only in attention layers, a windowed layer's
    capped at its window per request (bf16 KV, the checkpoint's weight bytes, 90% usable)."""
    quant = model.quantization
    weights = model.num_parameters() * (quant.bytes_per_weight if quant else 2.0) / tp
    kv = 0.0
    for mixer in model.mixers():
        if mixer not in ("gqa", "sliding", "chunked"):
            continue
        heads, dim = model.kv_shape(mixer)
        window = model.window_of(mixer)
        tokens = sum(min(c, window) if window else c for c in _contexts(step))
        kv += 2 * math.ceil(heads / tp) * dim * 2.0 * tokens
    return weights + kv <= 0.9 * memory_gib * 2**30


# --- one deployment ------------------------------------------------------------------------


def _cells(points: list[dict[str, Any]]) -> dict[str, Any]:
    cells = {}
    for kind in ("decode", "prefill", "mixed", "long"):
        kept = [p for p in points if p["cell"] == kind and p["fits"]]
        cells[kind] = {
            "stats": error_stats([pct_error(p["ours_ms"], p["aic_ms"]) for p in kept]),
            "contributions": group_contributions(kept),
        }
    return cells


def run_deployment(dep: Deployment, system: str, steps: list[Step]) -> dict[str, Any]:
    model = catalog.model(dep.model)
    predictor, banner = tokenyard_predictor(dep, system, "auto")
    aic = aic_handle(dep, system, False)
    memory = catalog.device(DEVICE[system]).memory_gib
    points, failed = [], []
    for step in [*steps, *LONG]:
        try:
            theirs_ms = aic.step_ms(step)
            theirs = aic.ops_ms(step)
        except Exception as exc:  # aiconfigurator refuses the step: say so, go on
            failed.append(f"{step.label()}: {type(exc).__name__}: {exc}")
            continue
        ours = our_ops_ms(predictor, step_shapes(step))
        points.append(
            {
                "step": step.label(),
                "kind": step.kind,
                "cell": "long" if step in LONG else step.kind,
                "args": list(step.args),
                "fits": fits_hybrid(model, dep.tp, step, memory),
                "ours_ms": sum(ours.values()),
                "aic_ms": theirs_ms,
                "groups": hybrid_groups(ours, theirs, model.num_experts > 1),
            }
        )
    return {
        "model": dep.model,
        "name": dep.name,
        "tp": dep.tp,
        "system": system,
        "tokenyard": banner,
        "layers": {k: model.mixers().count(k) for k in dict.fromkeys(model.mixers())},
        "cells": _cells(points),
        "beyond_memory": error_stats(
            [pct_error(p["ours_ms"], p["aic_ms"]) for p in points if not p["fits"]]
        ),
        "aic_refused": failed,
        "points": points,
    }


# --- the vision encoder --------------------------------------------------------------------


def _aic_encoder_ms(aic: Aic, model_path: str, tp: int, patches: int) -> dict[str, float]:
    """aiconfigurator's encoder ops for one image of ``patches`` patches, per op (ms), as
    ``BaseBackend._run_encoder_phase`` evaluates them (encoder DP at TP 1 is one image)."""
    from aiconfigurator_core.sdk.config_builders import build_model_config
    from aiconfigurator_core.sdk.engine import build_ops_json
    from aiconfigurator_core.sdk.models import get_model

    config = build_model_config(
        tp_size=tp,
        pp_size=1,
        attention_dp_size=1,
        moe_tp_size=1,
        moe_ep_size=1,
        gemm_quant_mode=None,
        kvcache_quant_mode="bfloat16",
        fmha_quant_mode=None,
        moe_quant_mode=None,
        comm_quant_mode=None,
        forward_model=None,
        attention_backend=None,
    )
    model = get_model(model_path, config, "vllm")
    merged = patches // model.encoder_config.spatial_merge_size**2
    groups: dict[int, list[Any]] = defaultdict(list)
    for op in model.encoder_ops:
        post = "encoder_projector" in op._name or "all_gather" in op._name
        groups[merged if post else patches].append(op)
    out: dict[str, float] = defaultdict(float)
    images = -(-1 // (tp if model.config.enable_encoder_dp else 1))
    for s, ops in groups.items():
        entries = aic.h.evaluate_ops_json(
            build_ops_json(ops), is_context=True, batch_size=images, s=s, prefix=0, x=images * s
        )
        for name, ms, *_ in entries:
            out[name] += float(ms)
    return dict(out)


#: tokenyard encoder part -> aiconfigurator encoder ops.
ENCODER_GROUPS = (
    ("patch_embed", ("patch_embed",), ()),
    ("qkv", ("qkv",), ("encoder_qkv_gemm",)),
    ("attention", ("attention",), ("encoder_attention",)),
    ("proj", ("proj",), ("encoder_proj_gemm",)),
    ("mlp", ("mlp_up", "mlp_down"), ("encoder_ffn1_gemm", "encoder_ffn2_gemm")),
    (
        "mergers",
        ("merger_fc1", "merger_fc2"),
        ("encoder_projector_fc0_gemm", "encoder_projector_fc1_gemm"),
    ),
    ("norms", ("norms",), ("encoder_add_norm_1", "encoder_add_norm_2")),
    ("act", ("act", "merger_act"), ("encoder_act", "encoder_projector_fc0_act")),
    ("rope", ("rope",), ("encoder_rope_apply",)),
    ("all-reduce", (), ("encoder_ar_1", "encoder_ar_2", "encoder_projector_ar")),
)


def run_vision(dep: Deployment, system: str) -> dict[str, Any]:
    """Per image: tokenyard's ``encoder_cost`` and aiconfigurator's encoder ops at the same
    patch count (aiconfigurator's token math: each side rounded to the nearest multiple
    of patch x merge, no pixel bounds), and one prefill step with an image both ways."""
    model = catalog.model(dep.model)
    vision = model.vision
    if vision is None:
        raise RuntimeError(f"{dep.model} has no vision tower")
    source = resolve_source(package_root(), system, "vllm", "latest")
    device = catalog.device(DEVICE[system])
    aic = aic_handle(dep, system, False)
    predictor, _ = tokenyard_predictor(dep, system, "auto")
    stride = vision.patch_size * vision.spatial_merge_size
    rows = []
    for height, width in IMAGES:
        h_bar = max(stride, round(height / stride) * stride)
        w_bar = max(stride, round(width / stride) * stride)
        patches = (h_bar // vision.patch_size) * (w_bar // vision.patch_size)
        tokens = patches // vision.spatial_merge_size**2
        ours = encoder_cost(vision, device, patches, tensor_parallel_size=dep.tp, source=source)
        theirs = _aic_encoder_ms(aic, dep.aic_model, dep.tp, patches)
        parts = {
            group: (
                sum(ours.parts_s.get(p, 0.0) for p in mine) * 1e3,
                sum(theirs.get(p, 0.0) for p in their),
            )
            for group, mine, their in ENCODER_GROUPS
        }
        unmatched = set(theirs) - {p for _, _, their in ENCODER_GROUPS for p in their}
        if unmatched:
            parts["other"] = (0.0, sum(theirs[p] for p in unmatched))
        # One request: 512 text tokens and this image, prefilled in one step. tokenyard
        # spreads the encoder over prefill tokens at the workload's rate; for a workload of
        # such requests that rate times this step's tokens is the encoder's time.
        text = 512
        step = Step("prefill", (1, text + tokens, 0))
        ours_llm = sum(our_ops_ms(predictor, step_shapes(step)).values())
        aic_llm = aic.step_ms(step)
        rows.append(
            {
                "image": f"{height}x{width}",
                "patches": patches,
                "tokens": tokens,
                "ours_ms": ours.seconds * 1e3,
                "aic_ms": sum(theirs.values()),
                "source": ours.source,
                "parts": parts,
                "step": {
                    "label": f"prefill of {text} text + {tokens} image tokens, one image",
                    "ours_ms": ours_llm + ours.seconds * 1e3,
                    "aic_ms": aic_llm + sum(theirs.values()),
                    "encoder_share_aic": sum(theirs.values()) / (aic_llm + sum(theirs.values())),
                },
            }
        )
    return {"model": dep.model, "tp": dep.tp, "system": system, "images": rows}


# --- report --------------------------------------------------------------------------------


def print_report(runs: list[dict[str, Any]], vision: dict[str, Any] | None) -> None:
    print("\n## Step times vs aiconfigurator (GPU ms; median / p90 / signed |error| %)\n")
    print("| model | TP | system | layers | decode | prefill | mixed | long (past windows) |")
    print("|---|---:|---|---|---|---|---|---|")
    for r in runs:
        layers = ", ".join(f"{n} {k}" for k, n in r["layers"].items())
        c = r["cells"]
        print(
            f"| {r['name']} | {r['tp']} | {r['system']} | {layers} | "
            + " | ".join(stats_cell(c[k]["stats"]) for k in ("decode", "prefill", "mixed", "long"))
            + " |"
        )
    print("\n## Where the gaps come from: median signed contribution per group (% of aic step)\n")
    for r in runs:
        parts = contributions_line(r["cells"], ("decode", "prefill", "mixed", "long"))
        print(f"- {r['name']} TP{r['tp']} {r['system']}: {parts}")
        for line in r["aic_refused"]:
            print(f"  - aiconfigurator refused {line}")
    print("\nbanners:")
    for r in runs:
        print(f"- {r['name']} TP{r['tp']} {r['system']}: {r['tokenyard']}")
    if vision is None:
        return
    print(f"\n## Vision encoder per image, {vision['model']} TP{vision['tp']} {vision['system']}\n")
    print(
        "| image | patches | tokens | tokenyard ms | aic ms | error % | parts, tokenyard / aic ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in vision["images"]:
        parts = "; ".join(f"{g} {a:.2f} / {b:.2f}" for g, (a, b) in row["parts"].items())
        err = pct_error(row["ours_ms"], row["aic_ms"])
        print(
            f"| {row['image']} | {row['patches']} | {row['tokens']} | {row['ours_ms']:.2f} | "
            f"{row['aic_ms']:.2f} | {err:+.1f} | {parts} |"
        )
    print()
    for row in vision["images"]:
        s = row["step"]
        print(
            f"- {s['label']}: tokenyard {s['ours_ms']:.2f} ms, aic {s['aic_ms']:.2f} ms "
            f"({pct_error(s['ours_ms'], s['aic_ms']):+.1f}%; encoder "
            f"{100 * s['encoder_share_aic']:.0f}% of aic's step)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", help="write every figure to this JSON file")
    parser.add_argument("--quick", action="store_true", help="gpt-oss H100 and Llama 4 only")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # aiconfigurator logs every fallback it takes
    started = time.perf_counter()
    _, report = report_header()
    steps = step_grid()
    runs, skipped = [], []
    for dep in DEPLOYMENTS:
        for system in dep.systems:
            if args.quick and (dep.model, system) not in QUICK:
                continue
            try:
                run = run_deployment(dep, system, steps)
            except Exception as exc:  # report it (aiconfigurator's own words) and go on
                skipped.append(f"{dep.model} TP{dep.tp} {system}: {type(exc).__name__}: {exc}")
                continue
            print(f"  {run['name']} TP{dep.tp} {system}: {run['tokenyard']}")
            runs.append(run)
    for line in skipped:
        print(f"  skipped {line}")
    vision = None
    if not args.quick:
        dep = next(d for d in DEPLOYMENTS if d.model == VL)
        vision = run_vision(dep, dep.systems[0])
    print_report(runs, vision)
    report.update(runs=runs, vision=vision, skipped=skipped, grid=[s.label() for s in steps])
    report["long"] = [s.label() for s in LONG]
    finish_report(report, started, args.out)


if __name__ == "__main__":
    main()
