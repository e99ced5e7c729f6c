"""Profile readers: per-operation timings from CSV files, as training samples.

Owns the operation names and their features, the contract between the profiler
(``tokenyard profile``), Vidur's profiling CSVs and the predictors. Invariant: every
:class:`OpSamples` has ``features.shape == (n, len(FEATURES[op]))``, ``time_s.shape == (n,)``,
``n >= 1``, all values finite and non-negative, times in seconds.

Formats, detected from each file's header (see ``docs/profiling.md``):

- tokenyard profile format v1 (``OUR_COLUMNS``), written by :mod:`tokenyard.profiler`;
- Vidur's (microsoft/vidur ``data/profiling/``) compute ``mlp.csv`` and ``attention.csv``
  and network ``all_reduce.csv`` and ``send_recv.csv``; times in milliseconds in
  ``time_stats.<op>.median``; the network ``size`` column is bytes (Vidur's collective
  profiler records ``num_elements * 2`` for its fp16 buffer).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import lzma
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from tokenyard.errors import InputError

__all__ = [
    "FEATURES",
    "OPS",
    "OUR_COLUMNS",
    "OpSamples",
    "ProfileError",
    "ProfileSet",
    "read_profiles",
]

LAYER_OPS = (
    "input_norm",
    "qkv_proj",
    "rope",
    "kv_store",
    "attn_prefill",
    "attn_decode",
    "o_proj",
    "post_attn_norm",
    "gate_up_proj",
    "act",
    "down_proj",
    "residual_add",
)
MODEL_OPS = ("embedding", "lm_head")
COMM_OPS = ("all_reduce", "send_recv")
OPS: tuple[str, ...] = (*LAYER_OPS, *MODEL_OPS, *COMM_OPS)

FEATURES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        op: (
            ("num_tokens", "mean_context")
            if op == "attn_prefill"
            else ("batch_size", "mean_context")
            if op == "attn_decode"
            else ("num_bytes",)
            if op in COMM_OPS
            else ("num_tokens",)
        )
        for op in OPS
    }
)

OUR_COLUMNS: tuple[str, ...] = (
    "op",
    "num_tokens",
    "batch_size",
    "chunk_size",
    "context_len",
    "num_bytes",
    "num_workers",
    "time_ms",
    "time_ms_p90",
    "repeats",
    "device",
    "device_name",
    "dtype",
    "backend",
    "model",
    "tensor_parallel_size",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "torch_version",
    "created_at",
)

# Vidur mlp.csv operation -> ours. Vidur's own predictor treats the norms and the add as
# optional (older files lack them); "emb" is optional here too.
VIDUR_MLP_OPS = {
    "attn_pre_proj": "qkv_proj",
    "attn_rope": "rope",
    "attn_post_proj": "o_proj",
    "mlp_up_proj": "gate_up_proj",
    "mlp_act": "act",
    "mlp_down_proj": "down_proj",
    "emb": "embedding",
    "input_layernorm": "input_norm",
    "post_attention_layernorm": "post_attn_norm",
    "add": "residual_add",
}
VIDUR_MLP_OPTIONAL = frozenset({"emb", "input_layernorm", "post_attention_layernorm", "add"})
UNKNOWN_DEVICE = "vidur"


class ProfileError(InputError):
    """A profile file or measured table is unreadable, malformed, or leaves nothing after
    filtering.

    For a profile file ``field`` is ``"FILE:LINE:COLUMN"`` (line 1 is the header) or
    ``"FILE"`` / ``"FILE:COLUMN"`` where no line applies. For a measured table
    (``tokenyard.predictor.measured``) ``field`` is the config key that names the tables
    (``execution.measured.data_dir``, or ``execution.measured`` for the installed
    package's) and ``path`` the file; the message names both, and the column. ``value``
    is the offending value.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        value: str | None = None,
        path: str | None = None,
    ):
        super().__init__(message, field=field, value=value)
        self.path = path


@dataclass(frozen=True)
class OpSamples:
    """Timings of one operation: ``features[i]`` (named ``feature_names``) took ``time_s[i]``."""

    op: str
    feature_names: tuple[str, ...]
    features: npt.NDArray[np.float64]
    time_s: npt.NDArray[np.float64]

    def __len__(self) -> int:
        return int(self.time_s.shape[0])


@dataclass(frozen=True)
class ProfileSet:
    """Samples per operation read from one or more profile files."""

    device: str
    model: str | None
    tensor_parallel_size: int
    ops: Mapping[str, OpSamples]
    sources: tuple[str, ...]

    def digest(self) -> str:
        """SHA-256 (hex) of the samples, independent of file and row order.

        Covers each op's name, feature names and its rows sorted, as little-endian float64;
        equal for equal samples on every platform. The training cache key.
        """
        h = hashlib.sha256()
        for op in sorted(self.ops):
            s = self.ops[op]
            table = np.column_stack([s.features, s.time_s]).astype("<f8") + 0.0  # -0.0 -> 0.0
            table = table[np.lexsort(table.T[::-1])]
            h.update(f"{op}|{','.join(s.feature_names)}|{table.shape[0]}\n".encode())
            h.update(np.ascontiguousarray(table).tobytes())
        return h.hexdigest()


def read_profiles(
    paths: Sequence[str | os.PathLike[str]],
    *,
    model: str | None = None,
    tensor_parallel_size: int = 1,
) -> ProfileSet:
    """Read profile files (ours or Vidur's) into samples per operation.

    Args:
        paths: files (``.csv``, ``.csv.gz``, ``.csv.xz``) or directories (every such file in
            it, not recursive; files of other Vidur kinds, e.g. ``cpu_overheads.csv``, are
            skipped there).
        model: keep only our rows of this model (Vidur files carry no model name and are
            not filtered).
        tensor_parallel_size: keep compute rows profiled at this TP degree and all-reduce
            rows over this many workers; send/recv rows are all kept.

    Raises:
        ProfileError: unreadable file, unknown format, missing column, bad value, unknown
            op, files from several devices or (after filtering) models, or no samples left.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if isinstance(tensor_parallel_size, bool) or tensor_parallel_size < 1:
        raise ProfileError(
            f"tensor_parallel_size must be at least 1, got {tensor_parallel_size!r}",
            field="tensor_parallel_size",
            value=repr(tensor_parallel_size),
        )
    files = _expand(paths)
    acc = _Accumulator(model, tensor_parallel_size)
    sources: list[str] = []
    for path, explicit in files:
        reader = csv.reader(io.StringIO(_read_text(path), newline=""))
        try:
            header = next(reader, None)
        except csv.Error as exc:
            raise ProfileError(f"{path}:1: {exc}", field=f"{path}:1") from exc
        if header is None:
            raise ProfileError(f"{path}: empty file, no header", field=str(path))
        header = [h.strip() for h in header]
        kind = _detect(header)
        if kind is None:
            if explicit:
                raise ProfileError(
                    f"{path}: unknown profile format; the header is neither tokenyard's "
                    "(op,...,time_ms,...) nor a Vidur mlp/attention/all_reduce/send_recv "
                    f"CSV: {','.join(header)[:200]}",
                    field=str(path),
                    value=",".join(header)[:200],
                )
            continue
        table = _Table(str(path), header, reader)
        if kind == "ours":
            acc.read_ours(table)
        else:
            device = _vidur_device(path)
            acc.note_device(device, str(path))
            if kind == "mlp":
                acc.read_vidur_mlp(table)
            elif kind == "attention":
                acc.read_vidur_attention(table)
            else:
                acc.read_vidur_network(table, kind)
        sources.append(str(path))
    if not sources:
        raise ProfileError(
            f"no profile files found in {', '.join(str(p) for p in paths)}",
            field="paths",
            value=repr([str(p) for p in paths]),
        )
    return acc.finish(tuple(sources))


# --- files -------------------------------------------------------------------------------

_SUFFIXES = (".csv", ".csv.gz", ".csv.xz")


def _expand(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[Path, bool]]:
    out: list[tuple[Path, bool]] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(c for c in path.iterdir() if c.is_file() and c.name.endswith(_SUFFIXES))
            out.extend((c, False) for c in found)
        elif path.exists():
            out.append((path, True))
        else:
            raise ProfileError(f"{path}: no such file or directory", field=str(path))
    return out


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
        if path.name.endswith(".xz"):
            data = lzma.decompress(data)
        elif path.name.endswith(".gz"):
            data = gzip.decompress(data)
        return data.decode("utf-8-sig")
    except (OSError, lzma.LZMAError, EOFError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read: {exc}", field=str(path)) from exc


def _detect(header: list[str]) -> str | None:
    cols = set(header)
    if "op" in cols and "time_ms" in cols:
        return "ours"
    if "n_expanded_embd" in cols or "time_stats.mlp_up_proj.median" in cols:
        return "mlp"
    if "kv_cache_size" in cols and "prefill_chunk_size" in cols:
        return "attention"
    for op in COMM_OPS:
        if f"time_stats.{op}.median" in cols:
            return op
    return None


def _vidur_device(path: Path) -> str:
    """The device a Vidur file was profiled on, from its directory (``vidur`` if unknown).

    ``data/profiling/compute/h100/<org>/<model>/mlp.csv`` -> ``h100``;
    ``data/profiling/network/h100_dgx/all_reduce.csv`` -> ``h100`` (the node type's GPU);
    ``data/profiling/a100/attention.csv`` -> ``a100``.
    """
    parts = path.resolve().parts
    for marker in ("compute", "network", "profiling"):
        if marker in parts[:-2]:
            i = len(parts) - 1 - parts[::-1].index(marker)
            name = parts[i + 1]
            return name.split("_")[0] if marker == "network" else name
    return UNKNOWN_DEVICE


# --- rows --------------------------------------------------------------------------------


class _Table:
    """A CSV body with its header; values parsed with file:line:column errors."""

    def __init__(self, path: str, header: list[str], reader: Iterator[list[str]]) -> None:
        self.path = path
        self.header = header
        self.index = {name: i for i, name in enumerate(header)}
        self.reader = reader

    def require(self, *columns: str) -> None:
        for c in columns:
            if c not in self.index:
                raise ProfileError(
                    f"{self.path}: missing column {c!r}", field=f"{self.path}:{c}", value=c
                )

    def rows(self) -> Iterator[tuple[int, list[str]]]:
        line = 1
        try:
            for row in self.reader:
                line = getattr(self.reader, "line_num", line + 1)
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(self.header):
                    raise ProfileError(
                        f"{self.path}:{line}: {len(row)} cells, the header has {len(self.header)}",
                        field=f"{self.path}:{line}",
                        value=str(len(row)),
                    )
                yield line, row
        except csv.Error as exc:
            raise ProfileError(
                f"{self.path}:{line + 1}: {exc}", field=f"{self.path}:{line + 1}"
            ) from exc

    def cell(self, row: list[str], line: int, column: str) -> str:
        return row[self.index[column]].strip() if column in self.index else ""

    def error(self, line: int, column: str, value: str, why: str) -> ProfileError:
        return ProfileError(
            f"{self.path}:{line}:{column}: {why}, got {value!r}",
            field=f"{self.path}:{line}:{column}",
            value=value,
        )

    def number(self, row: list[str], line: int, column: str) -> float:
        text = self.cell(row, line, column)
        if not text:
            raise self.error(line, column, text, "empty cell where a number is needed")
        try:
            value = float(text)
        except ValueError:
            raise self.error(line, column, text, "not a number") from None
        if not math.isfinite(value) or value < 0:
            raise self.error(line, column, text, "expected a finite non-negative number")
        return value

    def optional_number(self, row: list[str], line: int, column: str) -> float | None:
        return self.number(row, line, column) if self.cell(row, line, column) else None

    def flag(self, row: list[str], line: int, column: str) -> bool:
        text = self.cell(row, line, column).lower()
        if text in ("true", "1", "1.0"):
            return True
        if text in ("false", "0", "0.0"):
            return False
        raise self.error(line, column, self.cell(row, line, column), "expected True or False")


class _Accumulator:
    def __init__(self, model: str | None, tensor_parallel_size: int) -> None:
        self.model = model
        self.tp = tensor_parallel_size
        self.samples: dict[str, tuple[list[tuple[float, ...]], list[float]]] = {}
        self.devices: dict[str, str] = {}  # device -> first source
        self.models: dict[str, str] = {}  # model (kept rows) -> first source
        self.seen_models: set[str] = set()
        self.seen_tp: set[int] = set()
        self.num_rows = 0

    def add(self, op: str, features: tuple[float, ...], time_s: float) -> None:
        feats, times = self.samples.setdefault(op, ([], []))
        feats.append(features)
        times.append(time_s)

    def note_device(self, device: str, source: str) -> None:
        if device == UNKNOWN_DEVICE:
            return
        self.devices.setdefault(device, source)
        if len(self.devices) > 1:
            listed = "; ".join(f"{d!r} ({s})" for d, s in self.devices.items())
            raise ProfileError(
                f"profiles from several devices: {listed}; read one device at a time",
                field=source,
                value=device,
            )

    def read_ours(self, t: _Table) -> None:
        t.require(*OUR_COLUMNS)
        for line, row in t.rows():
            self.num_rows += 1
            op = t.cell(row, line, "op")
            if op not in FEATURES:
                raise t.error(line, "op", op, f"unknown op; expected one of {', '.join(OPS)}")
            device = t.cell(row, line, "device")
            if not device:
                raise t.error(line, "device", device, "empty device")
            self.note_device(device, f"{t.path}:{line}")
            row_model = t.cell(row, line, "model")
            tp = t.number(row, line, "tensor_parallel_size")
            self.seen_models.add(row_model)
            self.seen_tp.add(int(tp))
            if self.model is not None and row_model != self.model:
                continue
            time_s = t.number(row, line, "time_ms") / 1e3
            if op in COMM_OPS:
                workers = t.number(row, line, "num_workers")
                if op == "all_reduce" and workers != self.tp:
                    continue
                feats: tuple[float, ...] = (t.number(row, line, "num_bytes"),)
            elif tp != self.tp:
                continue
            elif op == "attn_prefill":
                batch = t.number(row, line, "batch_size")
                chunk = t.number(row, line, "chunk_size")
                context = t.number(row, line, "context_len")
                feats = (batch * chunk, context + (chunk + 1) / 2)
            elif op == "attn_decode":
                feats = (t.number(row, line, "batch_size"), t.number(row, line, "context_len"))
            else:
                feats = (t.number(row, line, "num_tokens"),)
            self.models.setdefault(row_model, f"{t.path}:{line}")
            self.add(op, feats, time_s)

    def _vidur_tp(self, t: _Table, row: list[str], line: int) -> bool:
        tp = t.number(row, line, "num_tensor_parallel_workers")
        self.seen_tp.add(int(tp))
        return tp == self.tp

    def read_vidur_mlp(self, t: _Table) -> None:
        t.require("num_tokens", "num_tensor_parallel_workers")
        t.require(*(f"time_stats.{v}.median" for v in VIDUR_MLP_OPS if v not in VIDUR_MLP_OPTIONAL))
        present = [v for v in VIDUR_MLP_OPS if f"time_stats.{v}.median" in t.index]
        for line, row in t.rows():
            self.num_rows += 1
            if not self._vidur_tp(t, row, line):
                continue
            n = t.number(row, line, "num_tokens")
            for v in present:
                column = f"time_stats.{v}.median"
                ms = (
                    t.optional_number(row, line, column)
                    if v in VIDUR_MLP_OPTIONAL
                    else t.number(row, line, column)
                )
                if ms is not None:
                    self.add(VIDUR_MLP_OPS[v], (n,), ms / 1e3)

    def read_vidur_attention(self, t: _Table) -> None:
        t.require("batch_size", "prefill_chunk_size", "kv_cache_size")
        t.require("num_tensor_parallel_workers")
        t.require("time_stats.attn_prefill.median", "time_stats.attn_decode.median")
        has_flag = "is_prefill" in t.index
        for line, row in t.rows():
            self.num_rows += 1
            if not self._vidur_tp(t, row, line):
                continue
            batch = t.number(row, line, "batch_size")
            chunk = t.number(row, line, "prefill_chunk_size")
            kv = t.number(row, line, "kv_cache_size")
            # Vidur's predictor tells decode rows by prefill_chunk_size == 0.
            prefill = t.flag(row, line, "is_prefill") if has_flag else chunk > 0
            if prefill:
                ms = t.number(row, line, "time_stats.attn_prefill.median")
                self.add("attn_prefill", (batch * chunk, kv + (chunk + 1) / 2), ms / 1e3)
                store_tokens = batch * chunk
            else:
                ms = t.number(row, line, "time_stats.attn_decode.median")
                self.add("attn_decode", (batch, kv), ms / 1e3)
                store_tokens = batch
            store = t.optional_number(row, line, "time_stats.attn_kv_cache_save.median")
            if store is not None:
                self.add("kv_store", (store_tokens,), store / 1e3)

    def read_vidur_network(self, t: _Table, op: str) -> None:
        column = f"time_stats.{op}.median"
        t.require("size", "num_workers", column)
        for line, row in t.rows():
            self.num_rows += 1
            if "collective" in t.index and t.cell(row, line, "collective") != op:
                continue
            workers = t.number(row, line, "num_workers")
            if op == "all_reduce":
                # As Vidur's predictor: TP all-reduce within one node.
                per_node = t.optional_number(row, line, "devices_per_node")
                if workers != self.tp or (per_node is not None and per_node != workers):
                    continue
            # ``size`` is bytes: Vidur records num_elements * 2 for its fp16 buffer.
            self.add(op, (t.number(row, line, "size"),), t.number(row, line, column) / 1e3)

    def finish(self, sources: tuple[str, ...]) -> ProfileSet:
        if len(self.models) > 1 and self.model is None:
            listed = "; ".join(f"{m!r} ({s})" for m, s in self.models.items())
            raise ProfileError(
                f"profiles of several models: {listed}; pass model= to choose one",
                field="model",
                value=", ".join(sorted(self.models)),
            )
        if not self.samples:
            present_models = ", ".join(sorted(repr(m) for m in self.seen_models)) or "none named"
            present_tp = ", ".join(str(t) for t in sorted(self.seen_tp)) or "none"
            raise ProfileError(
                f"no samples left after filtering by model={self.model!r}, "
                f"tensor_parallel_size={self.tp} in {', '.join(sources)} "
                f"({self.num_rows} rows; models present: {present_models}; "
                f"tensor-parallel sizes present: {present_tp})",
                field="tensor_parallel_size" if self.model is None else "model",
                value=str(self.tp) if self.model is None else self.model,
            )
        ops = {}
        for op in OPS:
            if op in self.samples:
                feats, times = self.samples[op]
                ops[op] = OpSamples(
                    op=op,
                    feature_names=FEATURES[op],
                    features=np.asarray(feats, dtype=np.float64).reshape(len(times), -1),
                    time_s=np.asarray(times, dtype=np.float64),
                )
        device = next(iter(self.devices), UNKNOWN_DEVICE)
        model = self.model if self.model is not None else next(iter(self.models), None)
        return ProfileSet(
            device=device,
            model=model or None,
            tensor_parallel_size=self.tp,
            ops=MappingProxyType(ops),
            sources=sources,
        )
