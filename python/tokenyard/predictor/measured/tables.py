"""Reading measured operation tables (``aiconfigurator-core``'s Parquet schema) into columns.

Each reader checks that the columns it needs are there and hold numbers where numbers are
expected, converts latencies from milliseconds to seconds, and returns the rows as numpy
columns. A bad file is a :class:`~tokenyard.predictor.ProfileError` whose ``field`` is the
config key that names the tables (``execution.measured.data_dir``, or ``execution.measured``
for the package's) and whose ``path`` is the file; the message names both and the column.
Never a raw OS, pyarrow or numpy error.

Schemas (one row per measured shape; ``latency`` in ms):

- GEMM ``gemm_perf.parquet``: ``m, n, k, gemm_dtype, kernel_source, latency``
- attention ``context_attention_perf.parquet`` / ``generation_attention_perf.parquet``:
  ``batch_size, isl, num_heads, num_key_value_heads, head_dim, kv_cache_dtype, step,
  window_size, latency`` (optional ``attn_dtype, beam_width, kernel_source``). A context
  row is ``batch_size`` prompts of ``isl`` tokens with no cached prefix; a generation row is
  ``batch_size`` decodes whose keys number ``isl + step``.
- all-reduce ``custom_allreduce_perf.parquet`` and NCCL ``nccl_perf.parquet``: ``num_gpus,
  message_size`` (elements of 16 bits), ``latency`` (NCCL's also ``op_name``).
- MoE ``moe_perf.parquet``: ``num_tokens, hidden_size, inter_size, topk, num_experts,
  moe_tp_size, moe_ep_size, moe_dtype, distribution, latency``.
- MLA module ``mla_context_module_perf.parquet`` / ``mla_generation_module_perf.parquet``:
  ``model, num_heads, batch_size, isl, step, tp_size, mla_dtype, kv_cache_dtype,
  gemm_type, latency``. One row is one layer's whole ``DeepseekV2MLAAttention`` forward in
  vLLM (the ``a`` projections and their norms, ``q_b_proj``, RoPE, the latent's store,
  the attention, ``o_proj``) for the config of ``model`` at ``num_heads`` heads (one TP
  rank's share; ``tp_size`` is 1); context: ``batch_size`` prompts of ``isl`` tokens (no
  prefix, ``step`` 0); generation: ``batch_size`` decodes over ``step`` keys (``isl`` 1).
- expert all-to-all ``moe_a2a_perf.parquet`` (under ``comm/``): ``op_name`` (``moe_a2a``),
  ``comm_backend`` (``deepep_ll``, ``deepep_ht``, ...), ``phase`` (``dispatch``,
  ``combine``), ``ep_size, node_num, hidden_size, topk, num_experts, num_tokens`` (tokens
  each GPU sends), ``latency``: **in microseconds** (``transmit_us + notify_us``), so its
  ``latency_s`` here is a thousand times the seconds (``ops.A2aTimes`` converts).
- MLA BMM ``mla_bmm_perf.parquet``: ``op_name`` (``mla_gen_pre``, ``mla_gen_post``),
  ``num_tokens, num_heads, latency`` (DeepSeek-V3's dims, BF16).
- activation quantization ``computescale_perf.parquet`` / ``scale_matrix_perf.parquet``
  (under ``quantize/``): ``m, k, quant_dtype, latency``: the extra cost of vLLM's dynamic
  per-token FP8 quantization over the static one (``>= 0``, zero where they tie), and the
  static quantization itself, of ``m`` rows of ``k`` values (``ops.QuantizeTimes``).
- linear attention ``gdn_perf.parquet`` / ``mamba2_perf.parquet`` (under
  ``linear_attention/``): ``kernel_source, phase, batch_size, seq_len, latency`` and the
  layer's structural key (GDN: ``d_model, num_k_heads, head_k_dim, num_v_heads,
  head_v_dim, d_conv``, heads per TP rank; Mamba2: ``d_model, nheads, head_dim, d_state,
  n_groups, d_conv, chunk_size``, the whole layer's). One row is one kernel of one layer:
  ``phase`` ``context``, ``batch_size`` prompts of ``seq_len`` tokens each (the causal
  conv, ``causal_conv1d_fn``, or the chunked scan, ``chunk_gated_delta_rule*``);
  ``generation``, ``batch_size`` decodes of one token (``causal_conv1d_update``, or the
  recurrent step, ``fused_recurrent_gated_delta_rule*``). ``model_name`` names the config
  measured (``ops.LinearMixerTimes``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenyard.predictor.profiles import ProfileError

__all__ = ["TABLES_FIELD", "Columns", "read_table", "table_error"]

#: The config key a table's errors name when the caller gives none.
TABLES_FIELD = "execution.measured"

_NUMERIC = {
    "m",
    "n",
    "k",
    "batch_size",
    "isl",
    "num_heads",
    "num_key_value_heads",
    "head_dim",
    "step",
    "window_size",
    "beam_width",
    "num_gpus",
    "message_size",
    "num_tokens",
    "hidden_size",
    "inter_size",
    "topk",
    "num_experts",
    "moe_tp_size",
    "moe_ep_size",
    "tp_size",
    "ep_size",
    "node_num",
    "seq_len",
    "d_model",
    "d_conv",
    "num_k_heads",
    "head_k_dim",
    "num_v_heads",
    "head_v_dim",
    "nheads",
    "d_state",
    "n_groups",
    "chunk_size",
    "latency",
}

_LINEAR = ("kernel_source", "phase", "batch_size", "seq_len", "d_model", "d_conv")
_ATTENTION = ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype")
#: The columns of both MLA module tables (context and generation).
_MLA_MODULE = (
    "model",
    "num_heads",
    "batch_size",
    "isl",
    "step",
    "kv_cache_dtype",
    "gemm_type",
    "latency",
)

#: Table file -> the columns it must have.
REQUIRED: Mapping[str, tuple[str, ...]] = {
    "gemm_perf.parquet": ("m", "n", "k", "gemm_dtype", "latency"),
    "context_attention_perf.parquet": (*_ATTENTION, "latency"),
    "generation_attention_perf.parquet": (*_ATTENTION, "step", "latency"),
    "custom_allreduce_perf.parquet": ("num_gpus", "message_size", "latency"),
    "nccl_perf.parquet": ("op_name", "num_gpus", "message_size", "latency"),
    "mla_context_module_perf.parquet": _MLA_MODULE,
    "mla_generation_module_perf.parquet": _MLA_MODULE,
    "mla_bmm_perf.parquet": ("op_name", "num_tokens", "num_heads", "latency"),
    "moe_a2a_perf.parquet": (
        "op_name",
        "comm_backend",
        "phase",
        "ep_size",
        "node_num",
        "hidden_size",
        "topk",
        "num_experts",
        "num_tokens",
        "latency",
    ),
    "moe_perf.parquet": (
        "num_tokens",
        "hidden_size",
        "inter_size",
        "topk",
        "num_experts",
        "moe_tp_size",
        "moe_ep_size",
        "moe_dtype",
        "latency",
    ),
    "gdn_perf.parquet": (
        *_LINEAR,
        "num_k_heads",
        "head_k_dim",
        "num_v_heads",
        "head_v_dim",
        "latency",
    ),
    "mamba2_perf.parquet": (
        *_LINEAR,
        "nheads",
        "head_dim",
        "d_state",
        "n_groups",
        "chunk_size",
        "latency",
    ),
    "computescale_perf.parquet": ("m", "k", "latency"),
    "scale_matrix_perf.parquet": ("m", "k", "latency"),
}

#: Tables whose latency is a difference of two kernels, so zero where they tie: vLLM's
#: ``computescale`` (dynamic per-token FP8 quantization less the static one).
ZERO_LATENCY_OK = frozenset({"computescale_perf.parquet"})


@dataclasses.dataclass(frozen=True)
class Columns:
    """A table's rows as columns; ``latency_s`` in seconds. ``path`` names the file and
    ``field`` the config key that named its tables (both for errors)."""

    path: Path
    data: Mapping[str, np.ndarray]
    field: str = TABLES_FIELD

    def __len__(self) -> int:
        return len(self.data["latency_s"])

    def col(self, name: str) -> np.ndarray:
        return self.data[name]

    def has(self, name: str) -> bool:
        return name in self.data

    def where(self, **equal: Any) -> Columns:
        """The rows whose columns equal the given values (columns absent are not checked)."""
        mask = np.ones(len(self), dtype=bool)
        for name, value in equal.items():
            if name in self.data:
                mask &= self.data[name] == value
        return self.with_data({k: v[mask] for k, v in self.data.items()})

    def with_data(self, data: Mapping[str, np.ndarray]) -> Columns:
        """These columns replaced by ``data`` (the same file and config key)."""
        return dataclasses.replace(self, data=data)

    def values(self, name: str) -> list[Any]:
        """The distinct values of a column, sorted."""
        return sorted(set(self.data[name].tolist())) if name in self.data else []

    def error(self, column: str | None, message: str, value: object = None) -> ProfileError:
        """The error about this table (and ``column``, if one applies)."""
        return table_error(self.field, self.path, column, message, value)


def table_error(
    field: str, path: Path, column: str | None, message: str, value: object = None
) -> ProfileError:
    """``FIELD: FILE[:COLUMN]: message``, with ``field`` the config key and ``path`` the
    file."""
    where = f"{path}:{column}" if column else str(path)
    return ProfileError(
        f"{field}: {where}: {message}", field=field, value=repr(value), path=str(path)
    )


def read_table(
    path: Path, required: Sequence[str] | None = None, *, field: str = TABLES_FIELD
) -> Columns:
    """The rows of one measured table.

    Args:
        path: the Parquet file.
        required: the columns it must have (default: ``REQUIRED`` for its name).
        field: the config key that named the tables, for errors.

    Raises:
        ProfileError: unreadable (missing, a dangling or looping link, not Parquet), a
            required column missing, a non-numeric or negative number, or no rows
            (``field`` is ``field``; ``path`` and the message name the file and column).
    """

    def fail(column: str | None, message: str, value: object = None) -> ProfileError:
        return table_error(field, path, column, message, value)

    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    required = tuple(required if required is not None else REQUIRED.get(path.name, ("latency",)))
    try:
        # ParquetFile, not pq.read_table: read_table imports pyarrow.dataset, and through
        # it pandas (0.7 s of a 10-request run's start-up).
        table = pq.ParquetFile(path).read()
    except (OSError, pa.ArrowException) as exc:
        raise fail(None, f"cannot read the table ({exc})") from None
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise fail(
            missing[0],
            f"missing column(s) {', '.join(missing)}; the file has {', '.join(table.column_names)}",
        )
    if table.num_rows == 0:
        raise fail(None, "the table has no rows (an empty grid)")
    data: dict[str, np.ndarray] = {}
    for name in table.column_names:
        column = table.column(name)
        if name in _NUMERIC:
            data[name] = _numeric(fail, name, column, path.name in ZERO_LATENCY_OK)
        else:
            data[name] = np.asarray(column.to_pylist(), dtype=object)
    data["latency_s"] = data.pop("latency") * 1e-3
    return Columns(path, data, field)


def _to_numpy(array: Any) -> np.ndarray:
    """A numeric Arrow array as numpy. Without nulls, a view of its data buffer: pyarrow's
    ``to_numpy`` imports pandas, a third of a short run's start-up."""
    import pyarrow as pa

    kind = "f" if pa.types.is_floating(array.type) else "i"
    if pa.types.is_unsigned_integer(array.type):
        kind = "u"
    if array.null_count or array.type.bit_width % 8:
        return np.asarray(array.to_numpy(zero_copy_only=False))
    dtype = np.dtype(f"{kind}{array.type.bit_width // 8}")
    return np.frombuffer(
        array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize
    )


def _numeric(
    fail: Callable[..., ProfileError], name: str, column: Any, zero_ok: bool = False
) -> np.ndarray:
    import pyarrow as pa

    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise fail(name, f"must hold numbers, holds {column.type}")
    values = np.asarray(_to_numpy(column.combine_chunks()), dtype=float)
    bad = ~np.isfinite(values) | (values < 0)
    if name == "latency" and not zero_ok:
        bad |= values <= 0
    if bad.any():
        raise fail(
            name,
            f"row {int(np.argmax(bad))}: must be a finite number "
            f"{'> 0' if name == 'latency' and not zero_ok else '>= 0'}",
            float(values[bad][0]),
        )
    return values
