"""The calibrated roofline's building blocks: one TP worker's sizes (``_Sizes``), the
builder that turns FLOPs and bytes into compiled operations (``_Builder``: at the
efficiencies, or memory-bound kernels at the calibration's bandwidth and launch latency),
and the GEMM, batched-GEMM and norm operations every layer kind uses. ``roofline.py``
joins the layer kinds; ``roofline_moe.py`` holds the MoE FFN and the all-to-all."""

from __future__ import annotations

import dataclasses
import math

from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.errors import ConfigError
from tokenyard.predictor import grids
from tokenyard.predictor.calibration import (
    Calibration,
    curve_value,
)
from tokenyard.predictor.compiled import CompiledOp, RooflineCost, TableCost
from tokenyard.predictor.efficiencies import Efficiencies


@dataclasses.dataclass(frozen=True)
class _Sizes:
    """Per-TP-worker sizes of one layer and the bytes per value."""

    h: int
    q: int
    kv: int
    i: int
    vocab: int
    head_dim: int
    w: float  # bytes per weight
    a: float  # bytes per activation
    c: float  # bytes per KV value
    heads: int = 0  # attention heads on one TP worker


def _sizes(model: ModelSpec, tp: int, weight_bytes: float, kv_bytes: float) -> _Sizes:
    return _Sizes(
        h=model.hidden_size,
        q=model.num_heads // tp * model.head_dim,
        kv=math.ceil(model.num_kv_heads / tp) * model.head_dim,
        i=model.intermediate_size // tp,
        vocab=math.ceil(model.vocab_size / tp),
        head_dim=model.head_dim,
        w=weight_bytes,
        a=2.0,  # activations stay in 16 bits even with 8- or 4-bit weights
        c=kv_bytes,
        heads=model.num_heads // tp,
    )


#: GEMM input formats -> the catalog field with their tensor-core peak.
GEMM_ACTIVATIONS = {
    "bf16": "dense_bf16_tflops",
    "fp8": "dense_fp8_tflops",
    "fp4": "dense_fp4_tflops",
}


def gemm_peak_tflops(device: DeviceSpec, activations: str = "bf16") -> float:
    """The dense tensor-core peak ``device`` multiplies ``activations`` inputs at.

    Raises:
        ConfigError: an unknown format, or ``fp8``/``fp4`` on a device whose catalog entry
            has no such peak (0: its tensor cores lack that precision); ``field`` is
            ``replica.device``.
    """
    field = GEMM_ACTIVATIONS.get(activations)
    if field is None:
        raise ConfigError(
            f"gemm_activations: must be one of {', '.join(GEMM_ACTIVATIONS)}, got {activations!r}",
            field="gemm_activations",
            value=repr(activations),
        )
    peak = float(getattr(device, field))
    if peak <= 0:
        raise ConfigError(
            f"replica.device: {device.name} has no {activations.upper()} tensor cores "
            f"(devices.{device.name}.{field} is 0), so it cannot run {activations} GEMMs; "
            "use a weight-only scheme (bf16 activations) or another device",
            field="replica.device",
            value=repr(device.name),
        )
    return peak


class _Builder:
    def __init__(
        self,
        device: DeviceSpec,
        efficiencies: Efficiencies,
        calibration: Calibration | None,
        gemm_activations: str = "bf16",
    ):
        self.device = device
        self.flops_per_s = device.dense_bf16_tflops * 1e12
        #: The decoder layers' projections: at the peak of their input format.
        self.gemm_flops_per_s = gemm_peak_tflops(device, gemm_activations) * 1e12
        self.bytes_per_s = device.memory_bandwidth_gbps * 1e9
        self.eff = efficiencies
        self.calibration = calibration
        self.ops: list[CompiledOp] = []

    def add(
        self,
        name: str,
        *,
        flops: dict[str, float],
        bytes: dict[str, float],
        attention: bool = False,
        gate: str = "num_tokens",
        scope: str = "layer",
        count: float = 1.0,
        flops_per_s: float | None = None,
    ) -> None:
        compute = self.eff.attention if attention else self.eff.gemm
        memory, latency = self.eff.memory, 0.0
        if self.calibration is not None:  # a memory-bound kernel: fitted bandwidth and launch
            memory, latency = self.calibration.memory_efficiency, self.calibration.memory_latency_s
        cost = RooflineCost(
            flops={k: v for k, v in flops.items() if v},
            bytes={k: v for k, v in bytes.items() if v},
            flops_per_s=(flops_per_s or self.flops_per_s) * compute,
            bytes_per_s=self.bytes_per_s * memory,
            latency_s=latency,
        )
        source = "calibrated" if self.calibration is not None else "roofline"
        self.ops.append(CompiledOp(name, scope, gate, cost, count, source))  # type: ignore[arg-type]

    def table(self, name: str, cost: TableCost, *, gate: str, scope: str = "layer") -> None:
        self.ops.append(CompiledOp(name, scope, gate, cost, source="calibrated"))  # type: ignore[arg-type]


def _gemm(
    b: _Builder,
    name: str,
    k: int,
    n: int,
    s: _Sizes,
    feature: str = "num_tokens",
    *,
    layer_linear: bool = True,
    rows: float = 1.0,
) -> None:
    """A ``[T, k] x [k, n]`` projection (``T``: the ``feature``, times ``rows``: 1/TP for
    the shared experts under sequence-parallel MoE, each GPU on its share of the tokens);
    ``layer_linear``: one of the decoder layers' projections, at ``b.gemm_flops_per_s``
    (else the BF16 peak)."""
    peak = b.gemm_flops_per_s if layer_linear else b.flops_per_s
    scope = "last_stage" if feature == "num_requests" else "layer"
    if b.calibration is not None:
        c = b.calibration

        def seconds(tokens: float) -> float:
            m = tokens * rows
            flops = 2.0 * m * k * n
            moved = k * n * s.w + m * (k + n) * s.a
            roofline = max(flops / peak, moved / b.bytes_per_s)
            efficiency = curve_value(c.gemm_tokens, c.gemm_efficiency, m)
            return roofline / efficiency + c.memory_latency_s

        table = grids.token_table(feature, seconds, 2.0**17, c.gemm_tokens)
        b.table(name, table, gate=feature, scope=scope)
        return
    b.add(
        name,
        flops={feature: 2.0 * k * n * rows},
        bytes={"one": k * n * s.w, feature: (k + n) * s.a * rows},
        flops_per_s=peak,
        gate=feature,
        scope=scope,
    )


def _bmm(b: _Builder, name: str, heads: int, k: int, n: int, s: _Sizes, feature: str) -> None:
    """``heads`` batched ``[T, k] x [k, n]`` products in BF16 (MLA's absorbed ``W_UK`` and
    ``W_UV``, which vLLM keeps in 16 bits whatever the checkpoint's format)."""
    weights, per_row = heads * k * n * s.a, heads * (k + n) * s.a
    if b.calibration is not None:
        c = b.calibration

        def seconds(m: float) -> float:
            roofline = max(
                2.0 * m * heads * k * n / b.flops_per_s, (weights + m * per_row) / b.bytes_per_s
            )
            return roofline / curve_value(c.gemm_tokens, c.gemm_efficiency, m) + c.memory_latency_s

        b.table(name, grids.token_table(feature, seconds, 2.0**17, c.gemm_tokens), gate=feature)
        return
    b.add(
        name,
        flops={feature: 2.0 * heads * k * n},
        bytes={"one": weights, feature: per_row},
        gate=feature,
    )


def _norm(b: _Builder, name: str, s: _Sizes) -> None:
    # Calibrated: serving engines fuse the residual add into the norm (read both, write both).
    per_token = 4.0 if b.calibration is not None else 2.0
    b.add(
        name,
        flops={"num_tokens": 4.0 * s.h},
        bytes={"one": s.h * s.w, "num_tokens": per_token * s.h * s.a},
    )
