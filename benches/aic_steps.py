"""Step times against aiconfigurator-core's own estimator: the harness that
``predictor_measured.py`` (part b), ``predictor_quant_fidelity.py``, ``fidelity_mla_moe.py``
and ``fidelity_hybrid.py`` share.

A ``Step`` (decode, prefill or a mixed chunk), tokenyard's batch features for it and
aiconfigurator's ``EngineHandle`` calls for the same step (``Aic``), the operation groups
both tools' per-op times are compared in, the error statistics and per-group contributions
the reports print, and the report's JSON.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from machine import cpu_model, loadavg

from tokenyard.catalog import ModelSpec
from tokenyard.predictor import batch_features
from tokenyard.predictor.compiled import CompiledPredictor
from tokenyard.predictor.measured.data import package_root


def report_header() -> tuple[Path, dict[str, Any]]:
    """aiconfigurator-core's data root, and a report's date, machine and aiconfigurator-core
    version (printed). Exits where aiconfigurator-core is not installed."""
    root = package_root()
    if root is None:
        raise SystemExit("aiconfigurator-core is not installed: pip install aiconfigurator-core")
    header = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{cpu_model()}, load {loadavg()}",
        "aiconfigurator_core": version("aiconfigurator-core"),
    }
    print(f"aiconfigurator-core {header['aiconfigurator_core']}; {header['machine']}")
    return root, header


def finish_report(report: dict[str, Any], started: float, out: str | None) -> None:
    """Sets the report's ``wall_s`` (since ``started``, a ``time.perf_counter()``), prints
    it, and writes the report as JSON to ``out`` where given."""
    report["wall_s"] = time.perf_counter() - started
    print(f"\nwall {report['wall_s']:.0f} s")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=1, default=str))


def error_stats(signed: Sequence[float]) -> dict[str, float]:
    """Median and p90 of |error| and the signed median, in percent."""
    if not signed:
        return {"n": 0, "median": math.nan, "p90": math.nan, "signed": math.nan}
    values = np.asarray(signed, dtype=float)
    return {
        "n": len(values),
        "median": float(np.median(np.abs(values))),
        "p90": float(np.percentile(np.abs(values), 90)),
        "signed": float(np.median(values)),
    }


def pct_error(predicted: float, actual: float) -> float:
    return 100.0 * (predicted / actual - 1.0)


def stats_cell(s: dict[str, float]) -> str:
    """A table cell of ``error_stats``: median / p90 / signed, or ``-`` with no steps."""
    return f"{s['median']:.1f} / {s['p90']:.1f} / {s['signed']:+.1f}" if s["n"] else "-"


def group_contributions(kept: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per operation group (sorted), the median over the points holding it of
    (tokenyard - aiconfigurator) ms as a % of aiconfigurator's step (``aic_ms``)."""
    groups = sorted({g for p in kept for g in p["groups"]}, key=str)
    return {
        g: float(
            np.median(
                [
                    100 * (p["groups"][g][0] - p["groups"][g][1]) / p["aic_ms"]
                    for p in kept
                    if g in p["groups"]
                ]
            )
        )
        for g in groups
    }


def contributions_line(cells: dict[str, Any], kinds: Sequence[str]) -> str:
    """The report's line of contributions of at least 0.5% per cell kind, ``-`` for none."""
    parts = []
    for kind in kinds:
        contrib = cells[kind]["contributions"]
        big = [f"{g} {v:+.1f}" for g, v in contrib.items() if abs(v) >= 0.5]
        parts.append(f"{kind}: {', '.join(big) or '-'}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Step:
    kind: str  # decode | prefill | mixed
    args: tuple[int, ...]  # decode (b, ctx); prefill (b, chunk, prefix); mixed (C, G, I)

    def label(self) -> str:
        names = {
            "decode": ("b", "ctx"),
            "prefill": ("b", "chunk", "prefix"),
            "mixed": ("C", "G", "I"),
        }
        return f"{self.kind} " + " ".join(
            f"{n}={v}" for n, v in zip(names[self.kind], self.args, strict=True)
        )


def step_shapes(step: Step) -> list[dict[str, float]]:
    """tokenyard's batch features for a step (several for a mixed step: one per chunk)."""

    def features(chunks: Sequence[tuple[int, int]], decodes: int, context: int) -> dict[str, float]:
        return batch_features(
            num_requests=len(chunks) + decodes,
            num_prefill_tokens=sum(c for c, _ in chunks),
            num_decode_tokens=decodes,
            sum_decode_context=decodes * context,
            sum_prefill_context=sum(c * (p + c) for c, p in chunks),
            sum_prefill_squared=sum(c * c for c, _ in chunks),
            num_padding_rows=0,
        )

    if step.kind == "decode":
        b, ctx = step.args
        return [features((), b, ctx)]
    if step.kind == "prefill":
        b, c, p = step.args
        return [features([(c, p)] * b, 0, 0)]
    chunk, decodes, prompt = step.args
    return [features([(chunk, j * chunk)], decodes, prompt + 1) for j in range(prompt // chunk)]


def kv_tokens(step: Step) -> int:
    if step.kind == "decode":
        return step.args[0] * (step.args[1] + 1)
    if step.kind == "prefill":
        return step.args[0] * (step.args[1] + step.args[2])
    return step.args[2] + step.args[1] * (step.args[2] + 2)


def fits(model: ModelSpec, tp: int, step: Step, memory_gib: float) -> bool:
    """The step's KV cache (bf16) fits next to the weights (bf16, or the checkpoint's
    quantization) on one GPU, 90% of its memory usable."""
    quant = model.quantization
    weights = model.num_parameters() * (quant.bytes_per_weight if quant else 2.0) / tp
    per_token = 2 * math.ceil(model.num_kv_heads / tp) * model.head_dim * 2.0 * model.num_layers
    return weights + kv_tokens(step) * per_token <= 0.9 * memory_gib * 2**30


class Aic:
    """aiconfigurator's estimator for one deployment, and its per-op breakdowns (ms)."""

    def __init__(self, handle: Any):
        self.h = handle

    def step_ms(self, step: Step) -> float:
        if step.kind == "decode":
            return self.h.predict_decode_latency(*step.args, 2)
        if step.kind == "prefill":
            b, c, p = step.args
            return self.h.predict_prefill_latency(b, p + c, p)
        c, g, i = step.args
        return self.h.mixed_step_latency(c, g, i, 2, 0)

    def ops_ms(self, step: Step) -> dict[str, float]:
        if step.kind == "decode":
            b, ctx = step.args
            entries = self.h.decode_step_per_op(b, ctx - 1, 2)
        elif step.kind == "prefill":
            b, c, p = step.args
            entries = self.h.run_static_per_op(batch_size=b, isl=p + c, osl=2, prefix=p)[0]
        else:
            c, g, i = step.args
            entries = [
                e for part in self.h.mixed_step_breakdown_per_op(c, g, i, 2, 0) for e in part
            ]
        ops: dict[str, float] = defaultdict(float)
        for name, ms, *_ in entries:
            if name not in ("context_attention", "generation_attention"):
                name = name.removeprefix("context_").removeprefix("generation_")
            ops[name] += ms
        return dict(ops)


OP_GROUPS = (
    # (group, tokenyard ops, aiconfigurator ops without the context_/generation_ prefix)
    ("embedding", ("embedding",), ("embedding", "embedding_ar")),
    (
        "norms (+ residual add)",
        ("input_norm", "post_attn_norm", "residual_add"),
        ("add_norm_1", "add_norm_2"),
    ),
    ("qkv_proj", ("qkv_proj",), ("qkv_gemm",)),
    # aiconfigurator folds RoPE, the KV write and QK-norm into context attention
    # ("mixed" source) and leaves them out of generation steps.
    ("rope + qk_norm + kv_store", ("rope", "qk_norm", "kv_store"), ()),
    ("attention, prefill", ("attn_prefill",), ("context_attention",)),
    ("attention, decode", ("attn_decode",), ("generation_attention",)),
    ("o_proj", ("o_proj",), ("proj_gemm",)),
    ("gate_up_proj", ("gate_up_proj",), ("gate_ffn1_gemm",)),
    ("act", ("act",), ("act_gate",)),
    ("down_proj", ("down_proj",), ("ffn2_gemm",)),
    ("router", ("router",), ("router_gemm",)),
    ("MoE experts", ("moe_experts",), ("moe",)),
    ("all_reduce", ("all_reduce",), ("ar_1", "ar_2", "moe_pre_dispatch", "moe_post_dispatch")),
    ("lm_head", ("lm_head",), ("logits_gemm",)),
)


def op_groups(
    ours: dict[str, float],
    theirs: dict[str, float],
    moe: bool,
    table: Sequence[tuple[str, tuple[str, ...], tuple[str, ...]]] = OP_GROUPS,
) -> dict[str, tuple[float, float]]:
    """Per group of ``table`` (rows as ``OP_GROUPS``'s): (tokenyard ms, aiconfigurator ms),
    the ops of no group as ``other`` (aiconfigurator's ``p2p`` left out). Under ``moe`` a
    model's MLP ops (the calibrated fallback) count as its experts."""
    out: dict[str, tuple[float, float]] = {}
    seen_ours: set[str] = set()
    seen_theirs: set[str] = set()
    for group, our_ops, their_ops in table:
        ops = our_ops
        if moe and group == "MoE experts":
            ops = (*our_ops, "gate_up_proj", "act", "down_proj")
        elif moe and group in ("gate_up_proj", "act", "down_proj"):
            ops = ()
        a = sum(ours.get(o, 0.0) for o in ops)
        b = sum(theirs.get(o, 0.0) for o in their_ops)
        seen_ours.update(ops)
        seen_theirs.update(their_ops)
        if a or b:
            out[group] = (a, b)
    rest = (
        sum(v for k, v in ours.items() if k not in seen_ours),
        sum(v for k, v in theirs.items() if k not in seen_theirs and k != "p2p"),
    )
    if rest[0] or rest[1]:
        out["other"] = rest
    return out


def our_ops_ms(predictor: CompiledPredictor, shapes: list[dict[str, float]]) -> dict[str, float]:
    """Per-op ms, averaged over the shapes (a mixed step's chunk positions)."""
    total: dict[str, float] = defaultdict(float)
    for shape in shapes:
        for op, seconds in predictor.op_times(shape).items():
            total[op] += seconds * 1e3 / len(shapes)
    return dict(total)
