"""What every measured op family shares: a source's tables read once per file version, the
tokenyard-to-table dtype names, one TP worker's layer shapes, and measured times turned
into the ``TableCost`` grids the compiled predictor evaluates.

An ``Entry`` is one operation's ``(table, source label, reason it is absent)``; a ``None``
table keeps the calibrated roofline's cost (``build.measured_predictor``)."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from tokenyard.catalog import ModelSpec
from tokenyard.errors import ConfigError
from tokenyard.predictor.compiled import TableCost
from tokenyard.predictor.measured.data import MeasuredSource
from tokenyard.predictor.measured.ops import GemmTimes, StaticFp8GemmTimes
from tokenyard.predictor.measured.tables import Columns, read_table, table_error

#: An operation's (table, source label, reason it is absent); a None table keeps the roofline.
Entry: TypeAlias = tuple[TableCost | None, str, str]

#: tokenyard dtype -> the tables' name for it (GEMM, KV cache).
TABLE_DTYPES = {
    "auto": "bfloat16",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "fp8",
    "int8": "int8",
    "int4": "int4",
}


def read(source: MeasuredSource, path: Path) -> Columns:
    # Kept per file version: a table rewritten during a session is read again.
    try:
        stat = path.stat()
    except OSError as exc:  # missing, or a dangling or looping link
        reason = exc.strerror or str(exc)
        if path.is_symlink():
            reason += f"; it is a link to {os.readlink(path)}"
        raise table_error(source.field, path, None, f"cannot read the table ({reason})") from None
    return read_version(path, stat.st_size, stat.st_mtime_ns, source.field)


@functools.lru_cache(maxsize=16)
def read_version(path: Path, size: int, mtime_ns: int, field: str) -> Columns:
    return read_table(path, field=field)


def present(path: Path) -> bool:
    """A table file is there, perhaps as a broken link (which reading then reports)."""
    return path.is_file() or path.is_symlink()


def table_dtype(name: str, field: str, available: list[str]) -> str:
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
class Shapes:
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


def shapes(model: ModelSpec, tp: int) -> Shapes:
    return Shapes(
        h=model.hidden_size,
        q_heads=model.num_heads // tp,
        kv_heads=math.ceil(model.num_kv_heads / tp),
        head_dim=model.head_dim,
        i=model.intermediate_size // tp,
        vocab=math.ceil(model.vocab_size / tp),
    )


def gemm_table(
    gemm: GemmTimes | StaticFp8GemmTimes,
    n: int,
    k: int,
    feature: str,
    *,
    quantized_input: bool = False,
) -> TableCost:
    """A GEMM's seconds over the measured rows; ``quantized_input``: the op before it hands
    it quantized activations (``o_proj``, ``down_proj``; ``StaticFp8GemmTimes``)."""
    xs = tuple(float(m) for m in gemm.m_grid)
    values = tuple(gemm(m, n, k, quantized_input=quantized_input) for m in xs)
    return TableCost(x=feature, xs=xs, values=values)


def prefill_seconds(
    context: Callable[[float, float], float],
) -> Callable[[float, float, float], float]:
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
