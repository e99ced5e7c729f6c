"""The vision encoder's cost: seconds per image of a vision-language model's tower
(``catalog/vision.py``), and the operation that charges it to the simulator's batches.

Per image of ``P`` patches (``N = P / merge^2`` LM tokens), on one TP rank (``h`` the
tower's width, ``i`` its MLP width; vLLM shards the tower's linears by TP):

==================  ========================================================
part                priced from
==================  ========================================================
``patch_embed``     GEMM ``m = P, n = h, k = channels x temporal x patch^2``
``qkv`` (x depth)   GEMM ``m = P, n = 3h/TP, k = h``
``attention``       ``encoder_attention/`` table: ``batch_size`` 1, ``isl = P``,
                    ``num_heads = heads/TP``, ``head_dim`` (Qwen2.5-VL's windowed
                    blocks: ``P / W`` windows of ``W`` patches as the batch)
``proj`` (x depth)  GEMM ``m = P, n = h, k = h/TP``
``mlp`` (x depth)   GEMMs ``m = P``: ``n = i/TP`` (SwiGLU ``2i/TP``), ``k = h``; ``n = h, k = i/TP``
``mergers``         GEMMs ``m = N``: ``n = k = 4h/TP``-ish (``merge^2 h``), ``n = out``
``norms`` (x depth) two fused residual-add + norms, ``2h`` values in, ``2h`` out per patch
``act`` (x depth)   the MLP's activation, ``i/TP`` (SwiGLU ``2i/TP`` in) values per patch
``rope`` (x depth)  the 2D rotary embedding over q and k, ``6h/TP`` in, ``6h/TP`` out
``merger_act``      the merger's GELU, ``merge^2 h / TP`` per merged token, per merger
==================  ========================================================

The element-wise parts (norms, activations, rotary) have no table anywhere: each is
memory-bound, its bf16 bytes at the device's calibrated bandwidth fraction plus its
calibrated launch latency (as the LLM's norms; ``Efficiencies().memory`` without one), with
the byte counts aiconfigurator 0.12 gives the same kernels (``sdk/models/blocks/vit.py``,
``_vit_transformer_ops`` and ``_projector_ops``: the rotary reads a full-width cos/sin
table beside q and k). They were left out until 2026-11-27, which put the tower 15-26%
under aiconfigurator's on Qwen3-VL-8B (``benches/fidelity_hybrid.py``). Position
interpolation and the TP all-reduces stay unpriced (one per block at TP > 1). Without the
tables (or a shape they lack) the GEMMs and attention are a roofline at the device's BF16
peak and HBM bandwidth times ``Efficiencies``' defaults (the element-wise parts as above),
and ``source`` says why.

How it reaches the simulator (no core hook yet): the core prices a batch by its shape and
cannot tell a vision token from a text token, so the encoder's seconds are spread over
*every* prefill token at the workload's mean rate (``encoder seconds per image x images /
prefill tokens``, measured on the workload's first 4,096 requests): an op
``vision_encoder`` on the first stage with cost ``rate x num_prefill_tokens``. Total encoder
time over a run is right (less the share of prefix-cache hits); which step pays it is not.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from tokenyard.catalog import DeviceSpec
from tokenyard.catalog.vision import VisionEncoder
from tokenyard.predictor.calibration import builtin_calibration
from tokenyard.predictor.compiled import CompiledOp, CompiledPredictor, RooflineCost
from tokenyard.predictor.measured.data import MeasuredSource
from tokenyard.predictor.measured.ops import GemmTimes, NotMeasured
from tokenyard.predictor.measured.tables import Columns, read_table
from tokenyard.predictor.roofline import Efficiencies

__all__ = ["EncoderCost", "encoder_cost", "with_vision_encoder"]

_ATTENTION_COLUMNS = ("batch_size", "isl", "num_heads", "head_dim", "latency")


@dataclasses.dataclass(frozen=True)
class EncoderCost:
    """Seconds one image costs, by part; ``source`` names the tables or the roofline and
    why."""

    patches: int
    parts_s: dict[str, float]
    source: str

    @property
    def seconds(self) -> float:
        return sum(self.parts_s.values())


def _encoder_folder(source: MeasuredSource) -> Path | None:
    """``<system>/encoder_attention/<framework>/<version>``: the source's version, else the
    newest below it."""
    from tokenyard.predictor.measured.data import _version_key

    base = source.root / source.system / "encoder_attention" / source.framework
    if not base.is_dir():
        return None
    versions = sorted(
        (p.name for p in base.iterdir() if (p / "encoder_attention_perf.parquet").is_file()),
        key=_version_key,
    )
    usable = [v for v in versions if _version_key(v) <= _version_key(source.version)]
    return base / usable[-1] if usable else None


class _EncoderAttention:
    """Encoder (bidirectional) attention seconds from ``encoder_attention_perf``, at one
    head layout: linear between measured ``isl`` (quadratic beyond the last), and over
    ``batch_size`` (linear beyond 64)."""

    def __init__(self, rows: Columns, heads: int, head_dim: int):
        picked = rows.where(num_heads=heads, head_dim=head_dim)
        if len(picked) == 0:
            raise NotMeasured(
                f"{rows.path}: no encoder_attention rows at {heads} heads, head_dim {head_dim}"
                f" (measured heads {rows.values('num_heads')}, head_dim {rows.values('head_dim')})"
            )
        self.rows = picked

    def _at_batch(self, batch: int, isl: float) -> float:
        rows = self.rows.where(batch_size=batch)
        points: dict[float, float] = {}
        for s, t in zip(rows.col("isl").tolist(), rows.col("latency_s").tolist(), strict=True):
            points.setdefault(float(s), t)
        xs = sorted(points)
        if isl >= xs[-1]:
            return points[xs[-1]] * (isl / xs[-1]) ** 2
        if isl <= xs[0]:
            return points[xs[0]]
        j = next(k for k, x in enumerate(xs) if x >= isl)
        a, b = xs[j - 1], xs[j]
        return points[a] + (points[b] - points[a]) * (isl - a) / (b - a)

    def __call__(self, batch: int, isl: float) -> float:
        batches = sorted(int(b) for b in self.rows.values("batch_size"))
        if batch <= batches[0]:
            return self._at_batch(batches[0], isl)
        if batch >= batches[-1]:
            return self._at_batch(batches[-1], isl) * batch / batches[-1]
        j = next(k for k, b in enumerate(batches) if b >= batch)
        a, b = batches[j - 1], batches[j]
        ta, tb = self._at_batch(a, isl), self._at_batch(b, isl)
        return ta + (tb - ta) * (batch - a) / (b - a)


def _gemm_shapes(v: VisionEncoder, patches: int, tp: int) -> dict[str, tuple[int, int, int, int]]:
    """Part -> (m, n, k, runs per image)."""
    h, i, tokens = v.hidden_size, v.intermediate_size, patches // v.spatial_merge_size**2
    m = v.merged_size
    mlp_n = 2 * i if v.gated_mlp else i
    return {
        "patch_embed": (patches, h, v.patch_values, 1),
        "qkv": (patches, 3 * h // tp, h, v.depth),
        "proj": (patches, h, h // tp, v.depth),
        "mlp_up": (patches, mlp_n // tp, h, v.depth),
        "mlp_down": (patches, h, i // tp, v.depth),
        "merger_fc1": (tokens, m // tp, m, v.num_mergers),
        "merger_fc2": (tokens, v.out_hidden_size, m // tp, v.num_mergers),
    }


def _elementwise_values(v: VisionEncoder, patches: int, tp: int) -> dict[str, tuple[int, int, int]]:
    """Part -> (values read, values written, runs per image) of the memory-bound parts."""
    h, i, tokens = v.hidden_size, v.intermediate_size, patches // v.spatial_merge_size**2
    act_in = (2 * i if v.gated_mlp else i) // tp
    return {
        "norms": (patches * 2 * h, patches * 2 * h, 2 * v.depth),
        "act": (patches * act_in, patches * (i // tp), v.depth),
        "rope": (patches * 6 * h // tp, patches * 6 * h // tp, v.depth),
        "merger_act": (tokens * v.merged_size // tp, tokens * v.merged_size // tp, v.num_mergers),
    }


def _elementwise(v: VisionEncoder, device: DeviceSpec, patches: int, tp: int) -> dict[str, float]:
    """The memory-bound parts as the LLM's norms are priced: the device's calibrated
    bandwidth fraction and launch latency (``calibration.builtin_calibration``), else
    ``Efficiencies().memory`` and no launch cost."""
    calibration = builtin_calibration(device)
    efficiency, launch_s = Efficiencies().memory, 0.0
    if calibration is not None:
        efficiency, launch_s = calibration.memory_efficiency, calibration.memory_latency_s
    bandwidth = device.memory_bandwidth_gbps * 1e9 * efficiency
    return {
        name: runs * (2.0 * (read + written) / bandwidth + launch_s)
        for name, (read, written, runs) in _elementwise_values(v, patches, tp).items()
    }


def _attention_batches(v: VisionEncoder, patches: int) -> list[tuple[int, int, int]]:
    """(batch, isl, blocks) of the tower's attention calls for one image."""
    if not v.window_size:
        return [(1, patches, v.depth)]
    window = (v.window_size // v.patch_size) ** 2
    windowed = v.depth - len(v.fullatt_blocks)
    out = [(1, patches, len(v.fullatt_blocks))] if v.fullatt_blocks else []
    if windowed:
        out.append((max(1, math.ceil(patches / window)), min(window, patches), windowed))
    return out


def _roofline(v: VisionEncoder, device: DeviceSpec, patches: int, tp: int, why: str) -> EncoderCost:
    eff = Efficiencies()
    peak, bandwidth = device.dense_bf16_tflops * 1e12, device.memory_bandwidth_gbps * 1e9
    parts: dict[str, float] = {}
    for name, (m, n, k, runs) in _gemm_shapes(v, patches, tp).items():
        compute = 2.0 * m * n * k / (peak * eff.gemm)
        memory = 2.0 * (m * k + k * n + m * n) / (bandwidth * eff.memory)
        parts[name] = runs * max(compute, memory)
    width = v.hidden_size // tp
    parts["attention"] = sum(
        blocks * 4.0 * batch * isl * isl * width / (peak * eff.attention)
        for batch, isl, blocks in _attention_batches(v, patches)
    )
    parts.update(_elementwise(v, device, patches, tp))
    return EncoderCost(patches, parts, f"roofline (datasheet x default efficiencies): {why}")


def encoder_cost(
    vision: VisionEncoder,
    device: DeviceSpec,
    patches: int,
    *,
    tensor_parallel_size: int = 1,
    source: MeasuredSource | None = None,
) -> EncoderCost:
    """Seconds the tower takes for one image of ``patches`` patches on one TP rank: from
    ``source``'s ``encoder_attention/`` and ``gemm/`` tables (bf16), else the roofline,
    with the reason in ``source``."""
    tp = tensor_parallel_size
    if source is None:
        return _roofline(vision, device, patches, tp, "no measured tables chosen")
    folder = _encoder_folder(source)
    if folder is None or "gemm" not in source.folders:
        why = f"no encoder_attention tables for {source.system}/{source.framework}"
        return _roofline(vision, device, patches, tp, why)
    try:
        rows = read_table(
            folder / "encoder_attention_perf.parquet", _ATTENTION_COLUMNS, field=source.field
        )
        attention = _EncoderAttention(rows, vision.num_heads // tp, vision.head_dim)
        gemm_rows = read_table(source.folders["gemm"] / "gemm_perf.parquet", field=source.field)
        gemm = GemmTimes(gemm_rows, "bfloat16")
    except NotMeasured as exc:
        return _roofline(vision, device, patches, tp, str(exc))
    parts = {
        name: runs * gemm(m, n, k)
        for name, (m, n, k, runs) in _gemm_shapes(vision, patches, tp).items()
    }
    parts["attention"] = sum(
        blocks * attention(batch, isl) for batch, isl, blocks in _attention_batches(vision, patches)
    )
    parts.update(_elementwise(vision, device, patches, tp))
    label = (
        f"measured: encoder_attention ({folder.parent.name} {folder.name}), "
        f"gemm bfloat16 ({source.folders['gemm'].name}); norms, activations and rotary "
        "at HBM bandwidth"
    )
    return EncoderCost(patches, parts, label)


def with_vision_encoder(
    predictor: CompiledPredictor, seconds_per_prefill_token: float, source: str
) -> CompiledPredictor:
    """``predictor`` with the ``vision_encoder`` op: ``seconds_per_prefill_token x
    num_prefill_tokens`` on the first stage (module docstring: the spread)."""
    cost = RooflineCost(
        flops={"num_prefill_tokens": seconds_per_prefill_token},
        bytes={},
        flops_per_s=1.0,
        bytes_per_s=1.0,
    )
    op = CompiledOp("vision_encoder", "first_stage", "num_prefill_tokens", cost, 1.0, source)
    return dataclasses.replace(predictor, ops=(*predictor.ops, op))
