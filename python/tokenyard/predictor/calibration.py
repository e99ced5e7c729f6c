"""Roofline efficiency curves fitted to measured kernel tables, per device.

A datasheet roofline with one efficiency constant per operation class is 10-25% off on
real GEMMs and cannot follow small-batch decode attention at all. A calibration replaces
each constant by a curve fitted to measured times (``aiconfigurator-core``'s tables):

- ``gemm``: achieved fraction of ``max(FLOPs / peak, bytes / bandwidth)`` by GEMM rows
  ``m`` (median over the measured ``n x k`` of model-sized GEMMs);
- ``memory``: a memory-bound kernel's bandwidth fraction and fixed launch latency, fitted
  (least squares) to the weight-bound GEMMs with at most 16 rows;
- ``prefill_attention``: fraction of the causal-attention roofline by prompt length (median
  over batch sizes and head layouts);
- ``decode_attention``: fraction of the decode-attention roofline by parallelism (decodes x
  KV heads per GPU, the kernel's independent work items) and keys per decode;
- ``all_reduce``: per GPU count, a fixed latency and the fraction of the link a ring reaches
  (least squares over the framework's custom all-reduce, else NCCL's);
- ``moe``: fraction of the expert GEMMs' roofline by rows per expert hit (median over the
  measured MoE blocks, under aiconfigurator's default skewed routing).

The built-in fits (``tokenyard/catalog/calibration.toml``) say where they came from;
``tokenyard predictor calibrate`` refits them from an installed ``aiconfigurator-core``.
Devices without tables borrow the curves of a named proxy device (the fractions, not the
times: each device keeps its own datasheet peaks).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from tokenyard.catalog import DeviceSpec
from tokenyard.errors import ConfigError

__all__ = ["Calibration", "builtin_calibration", "curve_value", "fit_calibration"]

#: Above 1 where a GPU's cache serves what the roofline charges to DRAM (an L40S's 96 MB
#: L2 holds a decode batch's keys of a few thousand tokens); 4 bounds a fit gone wrong.
MAX_EFFICIENCY = 4.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Calibration:
    """Fitted efficiencies of one device (fractions of its datasheet peaks)."""

    device: str
    source: str
    gemm_tokens: tuple[float, ...]
    gemm_efficiency: tuple[float, ...]
    memory_efficiency: float
    memory_latency_s: float
    prefill_seq_lens: tuple[float, ...]
    prefill_efficiency: tuple[float, ...]
    #: Decodes x KV heads per GPU: efficiency follows it, not the batch or the heads alone.
    decode_parallelism: tuple[float, ...]
    decode_kv_lens: tuple[float, ...]
    #: Row-major: ``decode_efficiency[ib * len(decode_kv_lens) + ik]``.
    decode_efficiency: tuple[float, ...]
    all_reduce_gpus: tuple[int, ...] = ()
    all_reduce_latency_s: tuple[float, ...] = ()
    all_reduce_efficiency: tuple[float, ...] = ()
    #: MoE expert GEMMs (fused MoE kernels, measured with skewed routing): efficiency by
    #: rows per expert hit; empty where no MoE table was fitted (the GEMM curve stands in).
    moe_rows_per_expert: tuple[float, ...] = ()
    moe_efficiency: tuple[float, ...] = ()
    #: The device whose tables were fitted, when it is not ``device`` itself.
    proxy_for: str = ""

    def check(self, where: str) -> None:
        """Raises ConfigError naming the first bad field."""
        curves = (
            ("gemm", self.gemm_tokens, self.gemm_efficiency, 1),
            ("prefill", self.prefill_seq_lens, self.prefill_efficiency, 1),
            ("decode", self.decode_parallelism, self.decode_efficiency, len(self.decode_kv_lens)),
        )
        for name, axis, values, per in curves:
            ok = len(axis) >= 1 and list(axis) == sorted(set(axis)) and axis[0] > 0
            ok = ok and len(values) == len(axis) * per
            ok = ok and all(math.isfinite(v) and 0 < v <= MAX_EFFICIENCY for v in values)
            if not ok:
                raise ConfigError(
                    f"{where}.{name}: a calibration curve needs increasing positive sizes and "
                    f"one efficiency in (0, {MAX_EFFICIENCY}] per size, got {list(axis)} / "
                    f"{list(values)}",
                    field=f"{where}.{name}",
                    value=repr(list(values)),
                )
        moe = (self.moe_rows_per_expert, self.moe_efficiency)
        if len(moe[0]) != len(moe[1]) or not all(0 < v <= MAX_EFFICIENCY for v in moe[1]):
            raise ConfigError(
                f"{where}.moe: one efficiency in (0, {MAX_EFFICIENCY}] per size, got "
                f"{list(moe[0])} / {list(moe[1])}",
                field=f"{where}.moe",
                value=repr(list(moe[1])),
            )
        if not (0 < self.memory_efficiency <= 1.5 and 0 <= self.memory_latency_s < 1e-3):
            raise ConfigError(
                f"{where}.memory: efficiency must be in (0, 1.5] and latency in [0, 1 ms), got "
                f"{self.memory_efficiency}, {self.memory_latency_s}",
                field=f"{where}.memory",
                value=repr((self.memory_efficiency, self.memory_latency_s)),
            )

    def all_reduce(self, num_gpus: int) -> tuple[float, float] | None:
        """``(latency_s, link efficiency)`` for ``num_gpus`` (the nearest fitted count)."""
        if not self.all_reduce_gpus:
            return None
        nearest = min(
            range(len(self.all_reduce_gpus)),
            key=lambda i: abs(math.log(self.all_reduce_gpus[i] / num_gpus)),
        )
        return self.all_reduce_latency_s[nearest], self.all_reduce_efficiency[nearest]

    def to_mapping(self) -> dict[str, Any]:
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> Calibration:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ConfigError(
                f"{where}.{unknown[0]}: unknown calibration key; expected {', '.join(fields)}",
                field=f"{where}.{unknown[0]}",
                value=repr(data[unknown[0]]),
            )
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        values.setdefault("device", where.rsplit(".", 1)[-1])
        try:
            calibration = cls(**values)  # type: ignore[arg-type]  # checked below
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}", field=where, value=repr(dict(data))) from None
        calibration.check(where)
        return calibration


def curve_value(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear in ``log x``; the edge values outside."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect.bisect_left(xs, x)  # np.searchsorted's answer, without the array copy
    w = (math.log(x) - math.log(xs[j - 1])) / (math.log(xs[j]) - math.log(xs[j - 1]))
    return ys[j - 1] + (ys[j] - ys[j - 1]) * w


def decode_efficiency(calibration: Calibration, parallelism: float, kv_len: float) -> float:
    """The decode-attention efficiency of ``parallelism`` (decodes x KV heads per GPU)
    queries over ``kv_len`` keys each."""
    rows = decode_efficiency_rows(calibration, kv_len)
    return curve_value(calibration.decode_parallelism, rows, parallelism)


def decode_efficiency_rows(calibration: Calibration, kv_len: float) -> list[float]:
    """The decode efficiency at ``kv_len`` keys for each of ``decode_parallelism``."""
    nk = len(calibration.decode_kv_lens)
    return [
        curve_value(
            calibration.decode_kv_lens,
            calibration.decode_efficiency[i * nk : (i + 1) * nk],
            kv_len,
        )
        for i in range(len(calibration.decode_parallelism))
    ]


# ---- built-in fits ------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _builtin_file() -> dict[str, Any]:
    # Parsed once per process: every simulation's execution choice reads it, and parsing
    # its arrays costs ~30 ms (most of a short capacity probe's set-up). Read only.
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    text = resources.files("tokenyard.catalog").joinpath("calibration.toml").read_text()
    return dict(tomllib.loads(text))


def builtin_calibration(device: DeviceSpec) -> Calibration | None:
    """The shipped calibration of ``device`` (its own fit, or its proxy's), or None."""
    data = _builtin_file()
    devices = data.get("devices", {})
    entry = devices.get(device.name)
    if entry is None:
        proxy = data.get("proxies", {}).get(device.name)
        if proxy is None or proxy not in devices:
            return None
        base = Calibration.from_mapping(devices[proxy], f"calibration.devices.{proxy}")
        return dataclasses.replace(base, device=device.name, proxy_for=proxy)
    return Calibration.from_mapping(entry, f"calibration.devices.{device.name}")


# ---- fitting ------------------------------------------------------------------------------


def _gemm_roofline_s(device: DeviceSpec, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    flops = 2.0 * m * n * k
    moved = 2.0 * (m * k + k * n + m * n)
    peak, bandwidth = device.dense_bf16_tflops * 1e12, device.memory_bandwidth_gbps * 1e9
    seconds: np.ndarray = np.maximum(flops / peak, moved / bandwidth)
    return seconds


def fit_gemm(rows: Any, device: DeviceSpec) -> tuple[list[float], list[float], float, float]:
    """GEMM and memory-bound curves from the measured GEMMs.

    The launch latency is the median time of the tiny GEMMs (at most 16 x 256 x 256: no
    work to speak of, so what is left is a kernel's fixed cost); the memory efficiency,
    the median bandwidth fraction of the weight-bound GEMMs (at most 16 rows, model-sized
    ``n x k``) once that latency is taken off. The GEMM curve is, per measured ``m``, the
    median over model-sized ``n x k`` of roofline / (measured - latency), so a GEMM costs
    ``roofline / efficiency(m) + latency``.
    """
    m, n, k, t = (rows.col(c) for c in ("m", "n", "k", "latency_s"))
    sized = (n >= 1024) & (k >= 1024) & (n <= 32768) & (k <= 32768)
    tiny = (m <= 16) & (n <= 256) & (k <= 256)
    moved = 2.0 * (m * k + k * n + m * n)
    if tiny.any():
        latency = float(median(t[tiny]))
    else:  # no tiny shapes: the intercept of time against bytes for the weight-bound ones
        small = sized & (m <= 16)
        latency = max(0.0, float(np.polyfit(moved[small], t[small], 1)[1]))
    busy = np.maximum(t - latency, 0.05 * t)
    weight_bound = sized & (m <= 16)
    bandwidth = device.memory_bandwidth_gbps * 1e9
    memory_efficiency = float(median(moved[weight_bound] / bandwidth / busy[weight_bound]))
    efficiency = _gemm_roofline_s(device, m, n, k) / busy
    powers = {float(2**i) for i in range(16)}
    grid = sorted(powers & set(m[sized].tolist()))
    effs = [float(median(efficiency[sized & (m == g)])) for g in grid]
    return grid, effs, memory_efficiency, latency


def prefill_roofline_s(
    device: DeviceSpec,
    batch: float,
    seq: float,
    prefix: float,
    q: float,
    kv: float,
    kv_bytes: float,
) -> float:
    """Causal attention of ``batch`` chunks of ``seq`` tokens over ``prefix`` cached keys, per
    GPU (``q``/``kv``: query and KV widths, heads x head_dim)."""
    full = seq + prefix
    flops = 4.0 * q * batch * (full * full - prefix * prefix) / 2.0
    moved = batch * (2.0 * 2.0 * q * seq + kv_bytes * 2.0 * kv * full)
    return max(
        flops / (device.dense_bf16_tflops * 1e12), moved / (device.memory_bandwidth_gbps * 1e9)
    )


def decode_roofline_s(
    device: DeviceSpec, batch: float, kv_len: float, q: float, kv: float, kv_bytes: float
) -> float:
    """``batch`` single-token queries over ``kv_len`` keys each, per GPU."""
    flops = 4.0 * q * batch * kv_len
    moved = batch * (2.0 * 2.0 * q + kv_bytes * 2.0 * kv * kv_len)
    return max(
        flops / (device.dense_bf16_tflops * 1e12), moved / (device.memory_bandwidth_gbps * 1e9)
    )


def _attention_rows(rows: Any) -> Any:
    rows = rows.where(kv_cache_dtype="bfloat16", window_size=0, beam_width=1)
    if rows.has("attn_dtype"):
        rows = rows.where(attn_dtype="bfloat16")
    return rows.where(head_dim=128)


def fit_prefill(rows: Any, device: DeviceSpec) -> tuple[list[float], list[float]]:
    rows = _attention_rows(rows)
    b, s, h, kvh, t = (
        rows.col(c) for c in ("batch_size", "isl", "num_heads", "num_key_value_heads", "latency_s")
    )
    eff = (
        np.array(
            [
                prefill_roofline_s(device, bi, si, 0.0, hi * 128, ki * 128, 2.0)
                for bi, si, hi, ki in zip(b, s, h, kvh, strict=True)
            ]
        )
        / t
    )
    keep = h >= 8  # model-sized head counts per GPU
    grid = sorted(set(s[keep].tolist()))
    return [float(g) for g in grid], [float(median(eff[keep & (s == g)])) for g in grid]


def fit_decode(rows: Any, device: DeviceSpec) -> tuple[list[float], list[float], list[float]]:
    """Efficiency by (decodes x KV heads, keys): across head layouts, decode attention's
    efficiency follows the number of (sequence, KV head) work items, not the batch."""
    rows = _attention_rows(rows)
    b, isl, step, h, kvh, t = (
        rows.col(c)
        for c in ("batch_size", "isl", "step", "num_heads", "num_key_value_heads", "latency_s")
    )
    s = isl + step
    eff = (
        np.array(
            [
                decode_roofline_s(device, bi, si, hi * 128, ki * 128, 2.0)
                for bi, si, hi, ki in zip(b, s, h, kvh, strict=True)
            ]
        )
        / t
    )
    work = b * kvh
    levels = sorted({2.0**i for i in range(16)} & set(work.tolist()))
    kv_lens = sorted(set(s.tolist()))
    values: list[float] = []
    for level in levels:
        row = [eff[(work == level) & (s == si)] for si in kv_lens]
        known = [(si, float(median(r))) for si, r in zip(kv_lens, row, strict=True) if len(r)]
        for si in kv_lens:  # holes take the nearest measured context of the same level
            values.append(min(known, key=lambda p: abs(math.log(p[0] / si)))[1])
    return levels, [float(x) for x in kv_lens], values


def fit_all_reduce(
    rows: Any, device: DeviceSpec, *, dtype_column: str, dtype: str
) -> tuple[list[int], list[float], list[float]]:
    """Per GPU count, ``time = latency + ring bytes / (link x efficiency)`` by least squares
    (relative) over an all-reduce table: the framework's custom all-reduce (its CUDA-graph
    rows, how serving steps run) or NCCL's."""
    from tokenyard.predictor.measured.ops import all_reduce_rows

    rows = all_reduce_rows(rows, dtype_column=dtype_column, dtype=dtype)
    link = device.interconnect_gbps / 2 * 1e9
    gpus_out, latency_out, eff_out = [], [], []
    for gpus in rows.values("num_gpus"):
        sub = rows.where(num_gpus=gpus)
        moved = 2.0 * (gpus - 1) / gpus * sub.col("message_size") * 2.0
        seconds = sub.col("latency_s")
        # Weighted for relative error: sizes span six decades, and small messages (the
        # decode steps') must not be lost to the large ones' absolute residuals.
        slope, intercept = np.polyfit(moved, seconds, 1, w=1.0 / seconds)
        gpus_out.append(int(gpus))
        latency_out.append(max(0.0, float(intercept)))
        eff_out.append(min(MAX_EFFICIENCY, 1.0 / (float(slope) * link)))
    return gpus_out, latency_out, eff_out


def moe_roofline_s(
    device: DeviceSpec, tokens: float, hidden: float, inter: float, topk: float, experts: float
) -> tuple[float, float]:
    """``(seconds, rows per expert hit)`` of a layer's expert GEMMs (gate, up, down) at the
    roofline, per GPU (``inter`` already divided by TP)."""
    rows = topk * tokens
    hit = min(experts, rows)
    flops = 2.0 * rows * hidden * inter * 3.0
    moved = 2.0 * (hit * 3.0 * hidden * inter + rows * (2.0 * hidden + 3.0 * inter))
    peak, bandwidth = device.dense_bf16_tflops * 1e12, device.memory_bandwidth_gbps * 1e9
    return max(flops / peak, moved / bandwidth), rows / hit


def fit_moe(rows: Any, device: DeviceSpec, latency: float) -> tuple[list[float], list[float]]:
    """Efficiency of bf16 MoE blocks (EP 1, ``power_law_1.2`` routing, else ``balanced``;
    experts of at least 2048 columns per GPU) by rows per expert, on powers of two."""
    rows = rows.where(moe_dtype="bfloat16", moe_ep_size=1)
    for routing in ("power_law_1.2", "balanced"):
        if routing in rows.values("distribution"):
            rows = rows.where(distribution=routing)
            break
    if len(rows) == 0:
        return [], []
    columns = ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size")
    t = rows.col("latency_s")
    roofline, per_expert = (
        np.array(values)
        for values in zip(
            *(
                moe_roofline_s(device, tokens, h, inter / tp, k, e)
                for tokens, h, inter, k, e, tp in zip(*(rows.col(c) for c in columns), strict=True)
            ),
            strict=True,
        )
    )
    efficiency = roofline / np.maximum(t - latency, 0.05 * t)
    level = 2.0 ** np.round(np.log2(per_expert))
    # Model-sized experts only (at least 2048 columns per GPU): the many-small-expert
    # shapes of fine-grained MoEs run far below their roofline and would drag the curve.
    sized = rows.col("inter_size") / rows.col("moe_tp_size") >= 2048
    grid = sorted(set(level[sized].tolist()))
    return grid, [float(median(efficiency[sized & (level == g)])) for g in grid]


def _fit_collectives(source: Any, device: DeviceSpec) -> tuple[list[int], list[float], list[float]]:
    from tokenyard.predictor.measured.tables import read_table

    custom = source.folders.get("comm")
    if custom is not None and (custom / "custom_allreduce_perf.parquet").is_file():
        rows = read_table(custom / "custom_allreduce_perf.parquet", field=source.field)
        return fit_all_reduce(rows, device, dtype_column="allreduce_dtype", dtype="bfloat16")
    if "nccl" in source.folders:
        rows = read_table(source.folders["nccl"] / "nccl_perf.parquet", field=source.field)
        return fit_all_reduce(rows, device, dtype_column="nccl_dtype", dtype="half")
    return [], [], []


def fit_calibration(source: Any, device: DeviceSpec, *, note: str = "") -> Calibration:
    """Fits every curve to the tables of ``source`` (a ``MeasuredSource``) for ``device``."""
    from tokenyard.predictor.measured.tables import read_table

    def read(path: Path) -> Any:
        return read_table(path, field=source.field)

    gemm = read(source.folders["gemm"] / "gemm_perf.parquet").where(gemm_dtype="bfloat16")
    tokens, gemm_eff, memory_eff, memory_latency = fit_gemm(gemm, device)
    attention = source.folders["attention"]
    seq_lens, prefill_eff = fit_prefill(read(attention / "context_attention_perf.parquet"), device)
    parallelism, kv_lens, decode_eff = fit_decode(
        read(attention / "generation_attention_perf.parquet"), device
    )
    collective = _fit_collectives(source, device)
    moe: tuple[list[float], list[float]] = ([], [])
    if "moe" in source.folders and (source.folders["moe"] / "moe_perf.parquet").is_file():
        moe_rows = read(source.folders["moe"] / "moe_perf.parquet")
        moe = fit_moe(moe_rows, device, memory_latency)
    return Calibration(
        device=device.name,
        source=f"fitted to {source.describe()} tables{note}",
        gemm_tokens=tuple(tokens),
        gemm_efficiency=tuple(round(v, 4) for v in gemm_eff),
        memory_efficiency=round(memory_eff, 4),
        memory_latency_s=round(memory_latency, 9),
        prefill_seq_lens=tuple(seq_lens),
        prefill_efficiency=tuple(round(v, 4) for v in prefill_eff),
        decode_parallelism=tuple(parallelism),
        decode_kv_lens=tuple(kv_lens),
        decode_efficiency=tuple(round(v, 4) for v in decode_eff),
        all_reduce_gpus=tuple(collective[0]),
        all_reduce_latency_s=tuple(round(v, 9) for v in collective[1]),
        all_reduce_efficiency=tuple(round(v, 4) for v in collective[2]),
        moe_rows_per_expert=tuple(moe[0]),
        moe_efficiency=tuple(round(v, 4) for v in moe[1]),
    )


#: Devices without tables of their own -> the device whose fitted fractions they borrow.
PROXIES = {
    "a100-40gb": "a100-80gb",  # the same chip; its own (lower) bandwidth stays in the roofline
    "a100-pcie": "a100-80gb",  # the same chip at a lower power limit and bandwidth
    "a30": "a100-80gb",  # the same architecture (GA100), a cut-down die
    "h100-pcie": "h100-sxm",  # the same architecture at lower clocks and bandwidth
    "a10g": "l40s",  # GDDR parts of consecutive generations
    "l4": "l40s",  # the same architecture (Ada), a smaller GDDR part
    "mi300x": "h100-sxm",  # no AMD tables exist: the nearest HBM part in class
}


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def calibration_toml(calibrations: Sequence[Calibration], header: str) -> str:
    """The text of a calibration file: ``[devices.<name>]`` tables and ``[proxies]``."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for calibration in calibrations:
        lines += ["", f'[devices."{calibration.device}"]']
        for key, value in calibration.to_mapping().items():
            if key not in ("device", "proxy_for") and value not in ("", []):
                lines.append(f"{key} = {_toml_value(value)}")
    lines += ["", "[proxies]"]
    lines += [f'"{device}" = "{proxy}"' for device, proxy in PROXIES.items()]
    return "\n".join(lines) + "\n"
