"""Part a of ``predictor_measured.py``: the held-out error of the measured interpolation.

For each operation family of the vLLM tables (GEMM, context and generation attention,
all-reduce, MoE), a share of the *interior* measured points is held out, the family's
``*Times`` object is rebuilt from the rest and scored on them (``predictor_measured.py``'s
docstring, part a, says what interior means). Run through ``predictor_measured.py``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from aic_steps import error_stats, pct_error

from tokenyard.predictor.measured.data import MeasuredSource, package_root, resolve_source
from tokenyard.predictor.measured.ops import (
    AttentionTimes,
    CollectiveTimes,
    GemmTimes,
    MoeShape,
    MoeTimes,
    all_reduce_rows,
    main_kernel,
)
from tokenyard.predictor.measured.tables import Columns, read_table

SYSTEMS = {"h100_sxm": "h100-sxm", "a100_sxm": "a100-80gb"}  # measured system -> catalog
HOLDOUT = 0.2
KV_HEADS = (1, 2, 4, 8)  # per GPU: what Llama-3.x, Qwen3 and Mixtral run at TP 1-8
HEAD_DIM = 128


# --- statistics ----------------------------------------------------------------------------


def _subset(rows: Columns, mask: np.ndarray) -> Columns:
    return Columns(rows.path, {c: v[mask] for c, v in rows.data.items()})


# --- a. held-out error of the interpolation --------------------------------------------------


@dataclass(frozen=True)
class Slice:
    """The rows one ``*Times`` object reads, how its points are keyed, and how to rebuild it."""

    family: str
    label: str
    rows: Columns
    keys: tuple[str, ...]  # columns naming one point
    #: (axis, the columns of the curve it lies on): interior means strictly inside that range
    axes: tuple[tuple[str, tuple[str, ...]], ...]
    predict: Callable[[Columns, list[tuple[float, ...]]], list[float]]


def _interior(points: list[tuple[float, ...]], s: Slice) -> list[bool]:
    index = {name: i for i, name in enumerate(s.keys)}
    ok = [True] * len(points)
    for axis, group in s.axes:
        spans: dict[tuple[float, ...], list[float]] = defaultdict(list)
        for p in points:
            spans[tuple(p[index[g]] for g in group)].append(p[index[axis]])
        bounds = {g: (min(v), max(v)) for g, v in spans.items()}
        for i, p in enumerate(points):
            low, high = bounds[tuple(p[index[g]] for g in group)]
            ok[i] = ok[i] and low < p[index[axis]] < high
    return ok


def _holdout(s: Slice, rng: np.random.Generator) -> dict[str, Any]:
    columns = [s.rows.col(k).tolist() for k in s.keys]
    rows_of: dict[tuple[float, ...], list[int]] = defaultdict(list)
    for i, key in enumerate(zip(*columns, strict=True)):
        rows_of[key].append(i)
    points = sorted(rows_of)
    interior = [p for p, ok in zip(points, _interior(points, s), strict=True) if ok]
    count = min(round(HOLDOUT * len(points)), len(interior))
    if count == 0:
        return {"family": s.family, "slice": s.label, "points": len(points), "held": 0}
    held = [interior[i] for i in sorted(rng.choice(len(interior), size=count, replace=False))]
    mask = np.ones(len(s.rows), dtype=bool)
    for p in held:
        mask[rows_of[p]] = False
    latency = s.rows.col("latency_s")
    actual = [float(np.median(latency[rows_of[p]])) for p in held]
    predicted = s.predict(_subset(s.rows, mask), held)
    errors = [pct_error(p, a) for p, a in zip(predicted, actual, strict=True)]
    return {
        "family": s.family,
        "slice": s.label,
        "points": len(points),
        "interior": len(interior),
        "held": count,
        "errors": errors,
        "spans": _spans(s, points, held),
    }


def _spans(s: Slice, points: list[tuple[float, ...]], held: list[tuple[float, ...]]) -> list[float]:
    """For each held-out point, the ratio of the kept neighbours that bracket it on the
    innermost axis: how far the rebuilt curve had to bridge."""
    axis, group = s.axes[0]
    index = {name: i for i, name in enumerate(s.keys)}
    gone = set(held)
    kept: dict[tuple[float, ...], list[float]] = defaultdict(list)
    for p in points:
        if p not in gone:
            kept[tuple(p[index[g]] for g in group)].append(p[index[axis]])
    spans = []
    for p in held:
        x = p[index[axis]]
        values = kept[tuple(p[index[g]] for g in group)]
        spans.append(min(v for v in values if v > x) / max(v for v in values if v < x))
    return spans


def _gemm_slices(source: MeasuredSource) -> list[Slice]:
    rows = read_table(source.folders["gemm"] / "gemm_perf.parquet")
    rows = main_kernel(rows.where(gemm_dtype="bfloat16"))

    def predict(train: Columns, held: list[tuple[float, ...]]) -> list[float]:
        times = GemmTimes(train, "bfloat16")
        return [times(m, n, k) for n, k, m in held]

    axes = (("m", ("n", "k")), ("k", ("n",)), ("n", ()))
    return [Slice("GEMM", "bf16", rows, ("n", "k", "m"), axes, predict)]


def gemm_pair_roughness(rows: Columns) -> dict[str, float]:
    """The tables' own roughness: |t(m + 1) / t(m) - 1| where the GEMM table measured both
    ``m`` and ``m + 1`` rows (H100 probes each tile edge so), ``m >= 32``. One more row is
    almost no work, so this is tile quantisation plus measurement noise."""
    latency = {
        (n, k, m): t
        for n, k, m, t in zip(
            rows.col("n").tolist(),
            rows.col("k").tolist(),
            rows.col("m").tolist(),
            rows.col("latency_s").tolist(),
            strict=True,
        )
    }
    ratios = [
        abs(latency[(n, k, m + 1)] / t - 1.0) * 100
        for (n, k, m), t in latency.items()
        if m >= 32 and (n, k, m + 1) in latency
    ]
    return {"pairs": len(ratios), **(error_stats(ratios) if ratios else {})}


def _attention_slices(source: MeasuredSource, generation: bool) -> list[Slice]:
    name = "generation" if generation else "context"
    table = read_table(source.folders["attention"] / f"{name}_attention_perf.parquet")
    picked = table.where(
        head_dim=HEAD_DIM, kv_cache_dtype="bfloat16", window_size=0, beam_width=1
    ).where(attn_dtype="bfloat16")
    slices = []
    for kv in KV_HEADS:
        rows = main_kernel(_subset(picked, picked.col("num_key_value_heads") == kv))
        if len(rows) == 0:
            continue
        s = rows.col("isl") + (rows.col("step") if generation else 0.0)
        rows = Columns(rows.path, {**rows.data, "s": s})

        def predict(train: Columns, held: list[tuple[float, ...]], kv: int = kv) -> list[float]:
            by_heads: dict[float, AttentionTimes] = {}
            out = []
            for heads, keys, batch in held:
                if heads not in by_heads:
                    by_heads[heads] = AttentionTimes(
                        train,
                        generation=generation,
                        num_heads=int(heads),
                        num_kv_heads=kv,
                        head_dim=HEAD_DIM,
                        kv_cache_dtype="bfloat16",
                    )
                out.append(by_heads[heads](batch, keys))
            return out

        axes = (("batch_size", ("num_heads", "s")), ("s", ("num_heads",)), ("num_heads", ()))
        family = "generation attention" if generation else "context attention"
        slices.append(
            Slice(family, f"{kv} KV heads", rows, ("num_heads", "s", "batch_size"), axes, predict)
        )
    return slices


def _collective_rows(rows: Columns, num_gpus: float, column: str, dtype: str) -> Columns:
    """The rows ``CollectiveTimes`` reads (captured-graph rows where there are some)."""
    return all_reduce_rows(rows, dtype_column=column, dtype=dtype).where(num_gpus=num_gpus)


def _collective_slices(source: MeasuredSource) -> list[Slice]:
    tables = []
    if "comm" in source.folders:
        path = source.folders["comm"] / "custom_allreduce_perf.parquet"
        if path.is_file():
            tables.append(("custom all-reduce", path, "allreduce_dtype", "bfloat16"))
    if "nccl" in source.folders:
        tables.append(
            ("NCCL all-reduce", source.folders["nccl"] / "nccl_perf.parquet", "nccl_dtype", "half")
        )
    slices = []
    for family, path, column, dtype in tables:
        table = read_table(path)
        for gpus in table.values("num_gpus"):
            rows = _collective_rows(table, gpus, column, dtype)
            if len(rows) == 0:
                continue

            def predict(
                train: Columns,
                held: list[tuple[float, ...]],
                gpus: int = int(gpus),
                column: str = column,
                dtype: str = dtype,
            ) -> list[float]:
                times = CollectiveTimes(train, gpus, dtype_column=column, dtype=dtype)
                return [times(size) for (size,) in held]

            slices.append(
                Slice(
                    family,
                    f"{int(gpus)} GPUs",
                    rows,
                    ("message_size",),
                    (("message_size", ()),),
                    predict,
                )
            )
    return slices


MOE_SHAPE = ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size")


def _moe_slices(source: MeasuredSource) -> list[Slice]:
    if "moe" not in source.folders:
        return []
    table = read_table(source.folders["moe"] / "moe_perf.parquet")
    table = table.where(moe_dtype="bfloat16", moe_ep_size=1)
    # tokenyard reads balanced routing; a table without it (A100 vLLM) is scored on the
    # power-law rows aiconfigurator prices Mixtral with, to test the interpolation alone.
    distribution = "balanced" if "balanced" in table.values("distribution") else "power_law_1.2"
    table = table.where(distribution=distribution)
    data = {k: v for k, v in table.data.items() if k != "distribution"}
    table = Columns(table.path, data)
    shapes = sorted(set(zip(*(table.col(c).tolist() for c in MOE_SHAPE), strict=True)))
    slices = []
    for shape in shapes:
        rows = main_kernel(table.where(**dict(zip(MOE_SHAPE, shape, strict=True))))
        hidden, inter, topk, experts, tp = (int(v) for v in shape)

        def predict(
            train: Columns,
            held: list[tuple[float, ...]],
            args: tuple[int, ...] = (hidden, inter, topk, experts, tp),
        ) -> list[float]:
            moe_shape = MoeShape(
                dtype="bfloat16",
                hidden_size=args[0],
                inter_size=args[1],
                topk=args[2],
                num_experts=args[3],
                tensor_parallel_size=args[4],
            )
            times = MoeTimes(train, moe_shape)
            return [times(tokens) for (tokens,) in held]

        label = f"{experts}x top-{topk} {hidden}x{inter} TP{tp} ({distribution})"
        slices.append(Slice("MoE", label, rows, ("num_tokens",), (("num_tokens", ()),), predict))
    return slices


def _median_n(stats: dict[str, float]) -> str:
    return f"{stats['median']:.2f}% ({stats['n']})" if stats["n"] else "-"


def holdout_section(seed: int, draws: int) -> dict[str, Any]:
    root = package_root()
    out: dict[str, Any] = {}
    print(
        f"\n## a. Held-out error of the measured interpolation (vllm tables; {draws} seeded "
        f"draws of {HOLDOUT:.0%}, pooled)\n"
    )
    print(
        "| system | family | tables | points | interior | held out per draw | median |err| | p90 | "
        "median, neighbours <= 2x apart (n) | median, wider (n) |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for system in SYSTEMS:
        source = resolve_source(root, system, "vllm", "latest")
        rng = np.random.default_rng(seed)
        slices = [
            *_gemm_slices(source),
            *_attention_slices(source, generation=False),
            *_attention_slices(source, generation=True),
            *_collective_slices(source),
            *_moe_slices(source),
        ]
        results = [_holdout(s, rng) for _ in range(draws) for s in slices]
        parts_rows = {s.family: s.rows for s in slices}
        families: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in results:
            families[r["family"]].append(r)
        out[system] = {"source": source.describe(), "families": {}}
        for family, parts in families.items():
            errors = [e for r in parts for e in r.get("errors", [])]
            spans = [x for r in parts for x in r.get("spans", [])]
            narrow = [e for e, x in zip(errors, spans, strict=True) if x <= 2.0 + 1e-9]
            wide = [e for e, x in zip(errors, spans, strict=True) if x > 2.0 + 1e-9]
            folder = next(s.rows.path.parent for s in slices if s.family == family)
            summary = {
                **error_stats(errors),
                "points": sum(r["points"] for r in parts) // draws,
                "interior": sum(r.get("interior", 0) for r in parts) // draws,
                "held": sum(r["held"] for r in parts) // draws,
                "tables": f"{folder.parent.name} {folder.name}",
                "bridge_2x": error_stats(narrow),
                "bridge_wider": error_stats(wide),
                "slices": [
                    {k: v for k, v in r.items() if k not in ("errors", "spans")} for r in parts
                ],
                "worst_slices": sorted(
                    (
                        (r["slice"], float(np.median(np.abs(r["errors"]))))
                        for r in parts
                        if r.get("errors")
                    ),
                    key=lambda x: -x[1],
                )[:3],
            }
            if family == "GEMM":
                summary["m_plus_one_roughness"] = gemm_pair_roughness(parts_rows[family])
            out[system]["families"][family] = summary
            print(
                f"| {system} | {family} | {summary['tables']} | {summary['points']} | "
                f"{summary['interior']} | {summary['held']} | {summary['median']:.2f}% | "
                f"{summary['p90']:.2f}% | {_median_n(summary['bridge_2x'])} | "
                f"{_median_n(summary['bridge_wider'])} |"
            )
    for system, result in out.items():
        rough = result["families"]["GEMM"]["m_plus_one_roughness"]
        if rough["pairs"]:
            print(
                f"\n{system} GEMM table's own roughness, |t(m + 1) / t(m) - 1| over "
                f"{rough['pairs']} pairs: median {rough['median']:.2f}%, p90 {rough['p90']:.2f}%"
            )
    return out
