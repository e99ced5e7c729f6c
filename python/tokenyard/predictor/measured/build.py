"""The measured predictor: a model's operations priced from measured GPU kernel tables.

Each operation of a decoder layer maps to the table that measured it, at the shape one TP
worker runs (``h`` hidden, ``q = heads/TP x head_dim``, ``kv = ceil(kv_heads/TP) x
head_dim``, ``i = intermediate/TP``):

===================  ===============================================================
operation            table, shape
===================  ===============================================================
``qkv_proj``         GEMM ``m = tokens, n = q + 2kv, k = h``
``attn_prefill``     context attention, chunks x cached prefix (``grids.py``)
``attn_decode``      generation attention, decodes x keys
``o_proj``           GEMM ``n = h, k = q``
``gate_up_proj``     GEMM ``n = 2i, k = h`` (dense)
``down_proj``        GEMM ``n = h, k = i`` (dense)
``moe_experts``      MoE block at TP (MoE models; the router is a GEMM)
``all_reduce`` x2    the framework's all-reduce (else NCCL's) of ``tokens x h`` values
``lm_head``          GEMM ``m = requests, n = vocab/TP, k = h``
===================  ===============================================================

Everything else (norms, RoPE, the KV store, the activation, embedding, pipeline sends, and
any operation whose slice the tables lack) keeps the calibrated roofline's cost, and
``CompiledOp.source`` says which is which (``measured:<table>`` or ``calibrated``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.errors import ConfigError
from tokenyard.predictor import grids
from tokenyard.predictor.calibration import Calibration, builtin_calibration, fit_calibration
from tokenyard.predictor.compiled import CompiledOp, CompiledPredictor, TableCost
from tokenyard.predictor.measured.data import MeasuredSource
from tokenyard.predictor.measured.ops import (
    AttentionTimes,
    CollectiveTimes,
    GemmTimes,
    MoeTimes,
    NotMeasured,
    moe_rows,
)
from tokenyard.predictor.measured.tables import Columns, read_table, table_error
from tokenyard.predictor.roofline import CpuOverheads, roofline_predictor

__all__ = ["TABLE_DTYPES", "measured_predictor"]

#: tokenyard dtype -> the tables' name for it (GEMM, KV cache).
TABLE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "fp8", "int8": "int8", "int4": "int4"}


def _read(source: MeasuredSource, path: Path) -> Columns:
    # Kept per file version: a table rewritten during a session is read again.
    try:
        stat = path.stat()
    except OSError as exc:  # missing, or a dangling or looping link
        reason = exc.strerror or str(exc)
        if path.is_symlink():
            reason += f"; it is a link to {os.readlink(path)}"
        raise table_error(source.field, path, None, f"cannot read the table ({reason})") from None
    return _read_version(path, stat.st_size, stat.st_mtime_ns, source.field)


@functools.lru_cache(maxsize=16)
def _read_version(path: Path, size: int, mtime_ns: int, field: str) -> Columns:
    return read_table(path, field=field)


def _table_dtype(name: str, field: str, available: list[str]) -> str:
    dtype = TABLE_DTYPES.get(name, name)
    if dtype not in available:
        raise ConfigError(
            f"{field}: {name!r} is not measured in these tables; measured: "
            f"{', '.join(str(a) for a in available)}",
            field=field,
            value=repr(name),
        )
    return dtype


@dataclasses.dataclass(frozen=True)
class _Shapes:
    h: int
    q_heads: int
    kv_heads: int
    head_dim: int
    i: int
    vocab: int

    @property
    def q(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim


def _shapes(model: ModelSpec, tp: int) -> _Shapes:
    return _Shapes(
        h=model.hidden_size,
        q_heads=model.num_heads // tp,
        kv_heads=math.ceil(model.num_kv_heads / tp),
        head_dim=model.head_dim,
        i=model.intermediate_size // tp,
        vocab=math.ceil(model.vocab_size / tp),
    )


def _present(path: Path) -> bool:
    """A table file is there, perhaps as a broken link (which reading then reports)."""
    return path.is_file() or path.is_symlink()


def _gemm_table(gemm: GemmTimes, n: int, k: int, feature: str) -> TableCost:
    xs = tuple(float(m) for m in gemm.m_grid)
    return TableCost(x=feature, xs=xs, values=tuple(gemm(m, n, k) for m in xs))


def _prefill_seconds(context: AttentionTimes) -> Callable[[float, float, float], float]:
    def seconds(batch: float, seq: float, prefix: float) -> float:
        alone = context(batch, seq)
        if prefix <= 0.0:
            return alone
        # A chunk over a cached prefix: the whole sequence's causal attention, less the
        # prefix's share of the query-key pairs; never less than the chunk alone (a short
        # chunk is launch-bound, and more keys do not make it faster).
        full = seq + prefix
        return max(alone, context(batch, full) * (full * full - prefix * prefix) / (full * full))

    return seconds


def _measured_ops(
    source: MeasuredSource,
    model: ModelSpec,
    s: _Shapes,
    tp: int,
    weight_dtype: str,
    kv_dtype: str,
    moe_distribution: str,
) -> dict[str, tuple[TableCost | None, str, str]]:
    """Operation name -> (table, source label, reason it is absent); ``None`` tables keep
    the roofline."""
    gemm_rows = _read(source, source.folders["gemm"] / "gemm_perf.parquet")
    dtype = _table_dtype(weight_dtype, "replica.dtype", gemm_rows.values("gemm_dtype"))
    gemm = GemmTimes(gemm_rows, dtype)
    label = f"measured:gemm ({source.folders['gemm'].name})"
    out: dict[str, tuple[TableCost | None, str, str]] = {
        "qkv_proj": (_gemm_table(gemm, s.q + 2 * s.kv, s.h, "num_tokens"), label, ""),
        "o_proj": (_gemm_table(gemm, s.h, s.q, "num_tokens"), label, ""),
        "lm_head": (_gemm_table(gemm, s.vocab, s.h, "num_requests"), label, ""),
    }
    if model.num_experts == 1:
        out["gate_up_proj"] = (_gemm_table(gemm, 2 * s.i, s.h, "num_tokens"), label, "")
        out["down_proj"] = (_gemm_table(gemm, s.h, s.i, "num_tokens"), label, "")
    else:
        out["router"] = (_gemm_table(gemm, model.num_experts, s.h, "num_tokens"), label, "")
        out["moe_experts"] = _moe_op(source, model, tp, dtype, moe_distribution)
    out.update(_attention_ops(source, s, kv_dtype))
    if tp > 1:
        out["all_reduce"] = out["embedding_all_reduce"] = _all_reduce_op(source, s, tp)
    return out


def _attention_ops(
    source: MeasuredSource, s: _Shapes, kv_dtype: str
) -> dict[str, tuple[TableCost | None, str, str]]:
    folder = source.folders["attention"]
    context_rows = _read(source, folder / "context_attention_perf.parquet")
    generation_rows = _read(source, folder / "generation_attention_perf.parquet")
    kv_name = _table_dtype(
        kv_dtype, "replica.kv_cache_dtype", context_rows.values("kv_cache_dtype")
    )
    layout = dict(
        num_heads=s.q_heads, num_kv_heads=s.kv_heads, head_dim=s.head_dim, kv_cache_dtype=kv_name
    )
    try:
        context = AttentionTimes(context_rows, generation=False, **layout)  # type: ignore[arg-type]
        generation = AttentionTimes(generation_rows, generation=True, **layout)  # type: ignore[arg-type]
    except NotMeasured as exc:
        raise ConfigError(
            f"replica.model: the measured attention tables do not cover its layout per GPU "
            f"({s.q_heads} heads, {s.kv_heads} KV heads, head_dim {s.head_dim}): {exc}",
            field="replica.model",
            value=repr((s.q_heads, s.kv_heads, s.head_dim)),
        ) from None
    label = f"measured:attention ({folder.name})"
    return {
        "attn_prefill": (grids.prefill_attention_table(_prefill_seconds(context)), label, ""),
        "attn_decode": (grids.decode_attention_table(generation), label, ""),
    }


def _all_reduce_op(
    source: MeasuredSource, s: _Shapes, tp: int
) -> tuple[TableCost | None, str, str]:
    tables = []
    if "comm" in source.folders and _present(
        source.folders["comm"] / "custom_allreduce_perf.parquet"
    ):
        path = source.folders["comm"] / "custom_allreduce_perf.parquet"
        tables.append(
            (path, "allreduce_dtype", "bfloat16", f"measured:custom_allreduce ({path.parent.name})")
        )
    if "nccl" in source.folders:
        path = source.folders["nccl"] / "nccl_perf.parquet"
        tables.append((path, "nccl_dtype", "half", f"measured:nccl ({path.parent.name})"))
    for path, column, dtype, label in tables:
        rows = _read(source, path)
        try:
            times = CollectiveTimes(rows, tp, dtype_column=column, dtype=dtype)
        except NotMeasured:
            continue  # this table lacks the GPU count: try the next
        return _all_reduce_table(times, s.h), label, ""
    return None, "calibrated", f"no all-reduce measured over {tp} GPUs"


def _all_reduce_table(times: CollectiveTimes, hidden: int) -> TableCost:
    return grids.token_table("num_tokens", lambda tokens: times(tokens * hidden), 2.0**17)


def _moe_op(
    source: MeasuredSource, model: ModelSpec, tp: int, dtype: str, distribution: str
) -> tuple[TableCost | None, str, str]:
    path = source.folders.get("moe")
    if path is None or not _present(path / "moe_perf.parquet"):
        return None, "calibrated", "no MoE table"
    rows = _read(source, path / "moe_perf.parquet")
    shape: dict[str, Any] = {
        "dtype": dtype,
        "hidden_size": model.hidden_size,
        "inter_size": model.intermediate_size,
        "topk": model.experts_per_token,
        "num_experts": model.num_experts,
        "tensor_parallel_size": tp,
    }
    routings = moe_rows(rows, **shape).values("distribution")
    if routings and distribution not in routings:
        # The shape is measured, not under this routing: refused, not priced another way.
        raise ConfigError(
            f"execution.measured.moe_distribution: {rows.path} measures {model.name}'s "
            f"experts under {', '.join(routings)}, got {distribution!r}",
            field="execution.measured.moe_distribution",
            value=repr(distribution),
        )
    try:
        times = MoeTimes(rows, **shape, distribution=distribution)
    except NotMeasured as exc:
        return None, "calibrated", str(exc)
    table = grids.token_table("num_tokens", times, 2.0**17)
    return table, f"measured:moe ({path.name})", ""


def measured_predictor(
    model: ModelSpec,
    device: DeviceSpec,
    source: MeasuredSource,
    *,
    tensor_parallel_size: int = 1,
    num_pipeline_stages: int = 1,
    weight_dtype: str = "bf16",
    kv_cache_dtype: str = "bf16",
    weight_bytes: float = 2.0,
    kv_bytes: float = 2.0,
    cpu: CpuOverheads | None = None,
    calibration: Calibration | None = None,
    moe_distribution: str = "power_law_1.2",
) -> CompiledPredictor:
    """``model`` on ``device`` priced from ``source``'s tables, compiled for Rust.

    Operations the tables lack keep the calibrated roofline (``calibration``, else the
    device's built-in one, else curves fitted to ``source`` itself).

    Raises:
        ConfigError: a dtype, attention layout or MoE routing the tables do not measure
            (the key and what is measured), or a bad layout.
        ProfileError: a table that is unreadable, malformed or too sparse to interpolate
            (``field`` is ``source.field``; the message names the file and column).
    """
    tp = tensor_parallel_size
    model.check_layout(tp, num_pipeline_stages)
    calibration = calibration or builtin_calibration(device) or fit_calibration(source, device)
    base = roofline_predictor(
        model,
        device,
        tensor_parallel_size=tp,
        num_pipeline_stages=num_pipeline_stages,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        cpu=cpu,
        calibration=calibration,
    )
    measured = _measured_ops(
        source, model, _shapes(model, tp), tp, weight_dtype, kv_cache_dtype, moe_distribution
    )
    ops: list[CompiledOp] = []
    notes: dict[str, str] = {}
    for op in base.ops:
        if model.num_experts > 1 and op.name in ("gate_up_proj", "act", "down_proj"):
            table, label, why = measured["moe_experts"]
            if table is None:
                ops.append(op)
                notes[op.name] = why
            elif op.name == "gate_up_proj":  # one measured block stands for all three
                ops.append(CompiledOp("moe_experts", "layer", "num_tokens", table, 1.0, label))
            continue
        entry = measured.get(op.name)
        if entry is None or entry[0] is None:
            ops.append(op)
            if entry is not None:
                notes[op.name] = entry[2]
            continue
        ops.append(dataclasses.replace(op, cost=entry[0], source=entry[1]))
    description = {
        **base.description,
        "kind": "measured",
        "measured": source.describe(),
        "calibration": calibration.source,
        "fallbacks": notes,
    }
    return dataclasses.replace(base, ops=tuple(ops), description=description)
