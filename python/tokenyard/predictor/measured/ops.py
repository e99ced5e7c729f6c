"""Measured operation times as functions of their sizes, from the tables of one source.

Each class takes a table's rows (``tables.Columns``), keeps the slice a model needs (its
dtype, head layout, TP degree) and answers "how long does this shape take" by nested
log-log interpolation (``interpolate.py``) over the measured grid:

- :class:`GemmTimes`: ``[m, k] x [k, n]``: a curve over ``m`` per measured ``(n, k)``, then
  ``k`` and ``n`` between their neighbours (above them time scales with ``n`` and ``k``;
  below them, launch-bound, it holds).
- :class:`StaticFp8GemmTimes`: per-tensor FP8 with static activation scales: the (dynamic)
  ``fp8`` GEMM rows less the quantization costs static scales do not pay
  (:class:`QuantizeTimes`, the ``quantize`` tables), as aiconfigurator prices it.
- :class:`AttentionTimes`: context (``batch_size`` prompts of ``s`` tokens, causal, no
  prefix) or generation (``batch_size`` queries over ``s`` keys each): a curve over the
  batch per ``s`` per head count, then ``s``, then heads. Beyond the longest context, time
  grows with the work: ``s**2`` for context, ``s`` for generation.
- :class:`CollectiveTimes`: an all-reduce over ``num_gpus`` by message size (elements).
- :class:`MoeTimes`: a whole MoE block (the experts of one layer) by tokens.
- :class:`MlaModuleTimes`: a whole MLA attention module (vLLM's
  ``DeepseekV2MLAAttention`` forward: every projection, RoPE, the latent's store, the
  attention and ``o_proj``) for ``batch_size`` prompts of ``isl`` tokens (context) or
  ``batch_size`` decodes over ``step`` keys (generation), at a head count per GPU.
- :class:`MlaBmmTimes`: vLLM's absorbed-decode BMMs (``W_UK`` before, ``W_UV`` after the
  latent attention) by decode tokens, at a head count per GPU.
- :class:`LinearMixerTimes`: one kernel of a gated DeltaNet or Mamba2 layer (the causal
  conv or the scan) for ``batch_size`` prompts of ``seq_len`` tokens (context: a curve over
  the batch per ``seq_len``, then ``seq_len``; beyond the longest, time grows with the
  tokens) or ``batch_size`` single-token decodes (generation), at one layer shape.

Where several kernels were measured for one slice (FlashAttention 3 and 4, say), the one
with the most rows in the slice is used: the framework's default path is the one the
collection covers best. GEMMs are the exception (:func:`gemm_kernels`): vLLM dispatches
one GEMM dtype to several kernels by shape (block FP8 on an H100: FlashInfer up to 17 rows,
DeepGEMM from 32, CUTLASS where ``n`` or ``k`` is below 128), so each measured point keeps
the kernel that measured it, and only a point measured by several takes the one with the
most rows.

Coverage: a slice with no rows is :class:`NotMeasured` (the caller may price the operation
another way). A slice that has rows must give each axis it is interpolated along at least
two distinct values, all > 0 (:func:`_check_axis`), else the table is refused: one point
has no range, so every other size would be that one reading scaled by the extrapolation
rule (a GEMM table cut to one launch-bound row prices every GEMM from it). Two exceptions,
both seen in the package's own tables: head counts may be one (many layouts are measured
at one head count, and the model's count is fixed), and an MoE shape measured at one token
count is a collection that stopped early, so it counts as not measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from statistics import median

import numpy as np

from tokenyard.predictor.measured.interpolate import Curve, between
from tokenyard.predictor.measured.tables import Columns
from tokenyard.predictor.profiles import ProfileError

__all__ = [
    "A2aTimes",
    "AttentionTimes",
    "CollectiveTimes",
    "GemmTimes",
    "LinearMixerTimes",
    "MlaBmmTimes",
    "MlaModuleTimes",
    "MoeShape",
    "MoeTimes",
    "NotMeasured",
    "QuantizeTimes",
    "StaticFp8GemmTimes",
    "all_reduce_rows",
    "gemm_kernels",
    "layer_shapes",
    "main_kernel",
]


class NotMeasured(ProfileError):
    """The table holds no rows for the slice asked for (a dtype, layout, GPU count or MoE
    shape); a table with rows that are too sparse or malformed is a plain ProfileError."""


def main_kernel(rows: Columns) -> Columns:
    """The rows of the kernel with the most rows (all rows if there is no kernel column)."""
    if not rows.has("kernel_source") or len(rows) == 0:
        return rows
    sources = rows.col("kernel_source").tolist()
    best = max(sorted(set(sources)), key=sources.count)
    return rows.where(kernel_source=best)


def gemm_kernels(rows: Columns) -> Columns:
    """The GEMM rows of one dtype, one kernel per measured ``(m, n, k)``: the kernel that
    measured it, or where several did, the one with the most rows (ties: by name).

    vLLM splits a GEMM dtype between kernels by shape, without overlap: block FP8 on an
    H100 or H200 runs FlashInfer up to 17 rows, DeepGEMM from 32 and CUTLASS where ``n`` or
    ``k`` is below 128 (vLLM 0.24.0 tables), so every kernel's rows are priced where they
    were measured. aiconfigurator reads a GEMM table the same way: its GEMM lookup is keyed
    by dtype and ``(m, n, k)`` only, over every row whatever its ``kernel_source``.
    """
    if not rows.has("kernel_source") or len(rows) == 0:
        return rows
    sources = rows.col("kernel_source").tolist()
    counts = {name: sources.count(name) for name in set(sources)}
    if len(counts) == 1:
        return rows
    order = sorted(counts, key=lambda name: (-counts[name], str(name)))
    position = {name: i for i, name in enumerate(order)}
    rank = np.array([position[name] for name in sources])
    points = np.stack([rows.col("m"), rows.col("n"), rows.col("k")], axis=1)
    _, point = np.unique(points, axis=0, return_inverse=True)
    point = point.reshape(-1)
    best = np.full(point.max() + 1, len(order))
    np.minimum.at(best, point, rank)
    keep = rank == best[point]
    return rows.with_data({name: column[keep] for name, column in rows.data.items()})


def _curves(
    rows: Columns, outer: str, x: str, *, above_power: float, below_power: float = 0.0
) -> dict[float, Curve]:
    """A curve of ``latency_s`` over column ``x`` for each value of column ``outer``;
    repeated points keep their median."""
    out: dict[float, Curve] = {}
    keys, xs, ys = rows.col(outer), rows.col(x), rows.col("latency_s")
    for key in sorted(set(keys.tolist())):
        mask = keys == key
        points: dict[float, list[float]] = {}
        for xi, yi in zip(xs[mask].tolist(), ys[mask].tolist(), strict=True):
            points.setdefault(xi, []).append(yi)
        grid = sorted(points)
        out[key] = Curve(
            grid,
            [median(points[g]) for g in grid],
            above_power=above_power,
            below_power=below_power,
        )
    return out


def _no_rows(rows: Columns, what: str, available: str) -> NotMeasured:
    return NotMeasured(
        f"{rows.field}: {rows.path}: no rows for {what}; the table has {available}",
        field=rows.field,
        path=str(rows.path),
    )


def _check_axis(
    rows: Columns, what: str, name: str, values: np.ndarray, *, two: bool = True
) -> None:
    """Refuses an axis ``values`` (column ``name`` of ``rows``, the slice ``what``) that the
    interpolation cannot use: a value <= 0 (curves and the outer axes work in log space), or,
    with ``two``, fewer than two distinct values."""
    distinct = np.unique(values)
    if distinct[0] <= 0:
        raise rows.error(name, f"{what}: must be > 0 to interpolate along", float(distinct[0]))
    if two and len(distinct) < 2:
        raise rows.error(
            name,
            f"too sparse: {what} has one measured {name} ({distinct[0]:g}); each axis "
            "interpolated along needs at least two distinct values",
            float(distinct[0]),
        )


class GemmTimes:
    """GEMM seconds for ``(m, n, k)`` in one dtype, over every kernel measured for it
    (:func:`gemm_kernels`). ``quantized_input`` (the op before the GEMM hands it FP8
    activations) changes nothing here: see :class:`StaticFp8GemmTimes`."""

    def __init__(self, rows: Columns, dtype: str):
        selected = gemm_kernels(rows.where(gemm_dtype=dtype))
        if len(selected) == 0:
            raise _no_rows(rows, f"gemm_dtype {dtype!r}", f"{rows.values('gemm_dtype')}")
        for axis in ("m", "n", "k"):
            _check_axis(rows, f"gemm_dtype {dtype!r}", axis, selected.col(axis))
        self.path = rows.path
        self.m_grid = selected.values("m")
        pair = selected.col("n") * 1e6 + selected.col("k")  # one key per (n, k)
        keyed = selected.with_data({**selected.data, "pair": pair})
        curves = _curves(keyed, "pair", "m", above_power=1.0)
        self._by_n: dict[float, dict[float, Curve]] = {}
        for key, curve in curves.items():
            n, k = divmod(key, 1e6)
            self._by_n.setdefault(n, {})[k] = curve
        self._n_axis = sorted(self._by_n)

    def __call__(self, m: float, n: float, k: float, *, quantized_input: bool = False) -> float:
        def at_n(ni: float) -> float:
            by_k = self._by_n[ni]
            return between(sorted(by_k), k, lambda kj: by_k[kj](m), below_power=0.0)

        # Below the smallest measured n or k a GEMM is launch-bound: the edge time holds.
        return between(self._n_axis, n, at_n, below_power=0.0)


class QuantizeTimes:
    """Seconds of an activation-quantization cost for ``m`` rows of width ``k`` (vLLM's
    ``quantize`` tables, ``computescale_perf`` or ``scale_matrix_perf``: ``m, k, latency``).

    ``computescale`` is a difference, vLLM's dynamic per-token FP8 quantization less the
    static one (``kernel_source`` says so), zero where they tie; ``scale_matrix`` is the
    static quantization itself. A curve over ``m`` per measured ``k`` (piecewise linear),
    then linear in ``k`` between its neighbours (a difference may be zero, so not log-log).
    Beyond the largest ``m`` or ``k`` the cost grows with it (the kernels stream ``m x k``
    values); below the smallest it holds.
    """

    def __init__(self, rows: Columns):
        picked = rows.where(quant_dtype="fp8")
        if len(picked) == 0:
            raise _no_rows(rows, "quant_dtype 'fp8'", f"{rows.values('quant_dtype')}")
        for axis in ("m", "k"):
            _check_axis(rows, "quant_dtype 'fp8'", axis, picked.col(axis))
        self.path = rows.path
        ms, ks, ys = picked.col("m"), picked.col("k"), picked.col("latency_s")
        self._k_axis = [float(k) for k in sorted(set(ks.tolist()))]
        self._by_k: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        for k in self._k_axis:
            mask = ks == k
            points: dict[float, list[float]] = {}
            for mi, yi in zip(ms[mask].tolist(), ys[mask].tolist(), strict=True):
                points.setdefault(mi, []).append(yi)
            grid = sorted(points)
            self._by_k[k] = (np.array(grid), np.array([median(points[g]) for g in grid]))

    def _at_k(self, k: float, m: float) -> float:
        xs, ys = self._by_k[k]
        if m > xs[-1]:
            return float(ys[-1]) * m / float(xs[-1])
        return float(np.interp(m, xs, ys))

    def __call__(self, m: float, k: float) -> float:
        axis = self._k_axis
        if k <= axis[0]:
            return self._at_k(axis[0], m)
        if k >= axis[-1]:
            return self._at_k(axis[-1], m) * k / axis[-1]
        j = int(np.searchsorted(axis, k))
        if axis[j] == k:
            return self._at_k(k, m)
        low, high = axis[j - 1], axis[j]
        w = (k - low) / (high - low)
        return (1 - w) * self._at_k(low, m) + w * self._at_k(high, m)


class StaticFp8GemmTimes:
    """Per-tensor FP8 GEMM seconds with static activation scales (ModelOpt FP8 checkpoints,
    ``activation_scheme: static``), as aiconfigurator 0.12.0 prices its ``fp8_static``:
    vLLM's ``fp8`` GEMM rows are measured with dynamic per-token activation quantization,
    so the extra cost of dynamic over static quantization (``compute_scale``) comes off
    every GEMM, and where the op before hands the GEMM FP8 activations already
    (``quantized_input``: vLLM fuses the static quantization into the attention output
    and the activation function, before ``o_proj`` and ``down_proj``) the static
    quantization (``scale_matrix``) comes off too, unclamped as aiconfigurator takes it:
    up to half a small GEMM (4096 x 1024 at tens of rows: 46-50% on B200 and GB200). Only
    a guard remains, never below a tenth of the dynamic row, which no shape of the vLLM
    0.24.0 tables comes near."""

    def __init__(self, gemm: GemmTimes, compute_scale: QuantizeTimes, scale_matrix: QuantizeTimes):
        self.gemm = gemm
        self.compute_scale = compute_scale
        self.scale_matrix = scale_matrix
        self.path = gemm.path
        self.m_grid = gemm.m_grid

    def __call__(self, m: float, n: float, k: float, *, quantized_input: bool = False) -> float:
        dynamic = self.gemm(m, n, k)
        less = self.compute_scale(m, k)
        if quantized_input:
            less += self.scale_matrix(m, k)
        return max(dynamic - less, 0.1 * dynamic)


class AttentionTimes:
    """Attention seconds for ``batch_size`` rows of ``s`` tokens (context) or keys
    (generation), for one head layout.

    Args:
        rows: a context or generation attention table.
        generation: the table is generation attention (``s = isl + step``).
        num_heads, num_kv_heads: per GPU (after tensor parallelism).
    """

    def __init__(
        self,
        rows: Columns,
        *,
        generation: bool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        kv_cache_dtype: str,
        window_size: int = 0,
    ):
        picked = rows.where(
            head_dim=head_dim, kv_cache_dtype=kv_cache_dtype, window_size=window_size, beam_width=1
        )
        if picked.has("attn_dtype"):
            picked = picked.where(attn_dtype="bfloat16")
        heads = picked.col("num_heads")
        kv = picked.col("num_key_value_heads")
        # Multi-head attention is measured with as many KV heads as heads; grouped-query
        # attention at the model's KV head count, over several head counts.
        mask = kv == heads if num_kv_heads == num_heads else kv == num_kv_heads
        picked = main_kernel(picked.with_data({c: v[mask] for c, v in picked.data.items()}))
        what = f"head_dim {head_dim}, {num_kv_heads} KV heads, kv_cache_dtype {kv_cache_dtype!r}"
        if window_size:
            what += f", window_size {window_size}"
        if len(picked) == 0:
            raise _no_rows(
                rows,
                what,
                f"head_dim {rows.values('head_dim')}, KV heads "
                f"{rows.values('num_key_value_heads')}, kv_cache_dtype "
                f"{rows.values('kv_cache_dtype')}",
            )
        self.path = rows.path
        self.num_heads = num_heads
        s = picked.col("isl") + (picked.col("step") if generation else 0.0)
        data = {**picked.data, "s": s}
        _check_axis(rows, what, "batch_size", picked.col("batch_size"))
        _check_axis(rows, what, "num_heads", picked.col("num_heads"), two=False)
        # Context work grows with the square of the prompt, generation work with the keys.
        s_power = 1.0 if generation else 2.0
        self._by_heads: dict[float, tuple[list[float], dict[float, Curve]]] = {}
        for n in picked.values("num_heads"):
            mask = picked.col("num_heads") == n
            sub = picked.with_data({c: v[mask] for c, v in data.items()})
            s_name = "isl + step" if generation else "isl"
            _check_axis(rows, f"{what}, {n:g} heads", s_name, sub.col("s"))
            by_s = _curves(sub, "s", "batch_size", above_power=1.0, below_power=1.0)
            self._by_heads[n] = (sorted(by_s), by_s)
        self._heads_axis = sorted(self._by_heads)
        self._s_power = s_power

    def __call__(self, batch_size: float, s: float) -> float:
        def at_heads(n: float) -> float:
            s_axis, by_s = self._by_heads[n]
            return between(s_axis, s, lambda sj: by_s[sj](batch_size), above_power=self._s_power)

        return between(self._heads_axis, self.num_heads, at_heads, below_power=0.0)

    @property
    def s_range(self) -> tuple[float, float]:
        axes = [axis for axis, _ in self._by_heads.values()]
        return min(a[0] for a in axes), max(a[-1] for a in axes)


def all_reduce_rows(
    rows: Columns, *, dtype_column: str, dtype: str, op: str = "all_reduce"
) -> Columns:
    """The all-reduce rows (or ``op``'s: NCCL's ``all_gather``, ``reduce_scatter``) of a
    collective table in one dtype. vLLM measures its custom all-reduce eager and under
    CUDA graphs; serving steps run captured, so the graph rows are the ones that apply
    where there are some."""
    picked = rows.where(**{dtype_column: dtype})
    if picked.has("op_name"):
        picked = picked.where(op_name=op)
    if picked.has("kernel_source"):
        graph = [s for s in picked.values("kernel_source") if "graph" in str(s)]
        picked = picked.where(kernel_source=graph[0]) if graph else main_kernel(picked)
    return picked


class CollectiveTimes:
    """All-reduce (or ``op``'s) seconds over ``num_gpus`` GPUs by message size in 16-bit
    elements (NCCL's all-gather and reduce-scatter rows: each rank's share, as
    aiconfigurator keys them, ``operations/afd_transfer.py``'s ``per_rank_elements``)."""

    def __init__(
        self,
        rows: Columns,
        num_gpus: int,
        *,
        dtype_column: str,
        dtype: str,
        op: str = "all_reduce",
    ):
        picked = all_reduce_rows(rows, dtype_column=dtype_column, dtype=dtype, op=op)
        picked = picked.where(num_gpus=num_gpus)
        what = f"{op} over {num_gpus} GPUs"
        if len(picked) == 0:
            raise _no_rows(rows, what, f"num_gpus {rows.values('num_gpus')}")
        _check_axis(rows, what, "message_size", picked.col("message_size"))
        self.path = rows.path
        keyed = picked.with_data({**picked.data, "one": np.zeros(len(picked))})
        self._curve = _curves(keyed, "one", "message_size", above_power=1.0)[0.0]

    def __call__(self, elements: float) -> float:
        return self._curve(elements)


@dataclasses.dataclass(frozen=True)
class MoeShape:
    """One layer's experts as the MoE table keys them: ``moe_dtype``, the sizes, and the
    layout (``moe_tp_size`` TP, ``moe_ep_size`` EP)."""

    dtype: str
    hidden_size: int
    inter_size: int
    topk: int
    num_experts: int
    tensor_parallel_size: int
    expert_parallel_size: int = 1

    def rows(self, table: Columns) -> Columns:
        """The table's rows of this shape, under every routing."""
        return table.where(
            moe_dtype=self.dtype,
            hidden_size=self.hidden_size,
            inter_size=self.inter_size,
            topk=self.topk,
            num_experts=self.num_experts,
            moe_tp_size=self.tensor_parallel_size,
            moe_ep_size=self.expert_parallel_size,
        )

    @property
    def description(self) -> str:
        ep = self.expert_parallel_size
        return (
            f"{self.num_experts} experts (top-{self.topk}) of hidden {self.hidden_size} x "
            f"{self.inter_size} at TP {self.tensor_parallel_size}"
            + (f", EP {ep}" if ep > 1 else "")
        )


class MoeTimes:
    """One layer's MoE experts (``moe_perf``) by the number of tokens routed in, under one
    measured routing: ``balanced`` experts, or a ``power_law_<alpha>`` skew (real traffic
    loads experts unevenly; aiconfigurator's default is ``power_law_1.2``). Under expert
    parallelism (``moe_ep_size`` > 1, ``moe_tp_size`` 1) a row is one GPU's time for its
    ``num_experts / EP`` experts when ``num_tokens`` tokens enter the layer across the EP
    group (aiconfigurator queries it at the rank's tokens x attention DP)."""

    def __init__(self, rows: Columns, shape: MoeShape, *, distribution: str = "power_law_1.2"):
        picked = shape.rows(rows)
        measured = picked.values("distribution")
        if measured and distribution not in measured:
            raise _no_rows(rows, f"the {distribution!r} routing", f"routings {measured}")
        picked = main_kernel(picked.where(distribution=distribution))
        what = shape.description
        if len(picked) == 0:
            raise _no_rows(rows, what, "other shapes")
        _check_axis(rows, what, "num_tokens", picked.col("num_tokens"), two=False)
        tokens = picked.values("num_tokens")
        if len(tokens) < 2:
            raise _no_rows(
                rows, f"{what} beyond {tokens[0]:g} tokens", "one point, too few to interpolate"
            )
        self.path = rows.path
        keyed = picked.with_data({**picked.data, "one": np.zeros(len(picked))})
        self._curve = _curves(keyed, "one", "num_tokens", above_power=1.0)[0.0]

    def __call__(self, tokens: float) -> float:
        return self._curve(tokens)


class A2aTimes:
    """One half (``phase``: ``dispatch`` or ``combine``) of the expert all-to-all by the
    tokens each GPU sends (``moe_a2a_perf``: aiconfigurator's comm ops see per-rank token
    counts), for one comm backend (DeepEP ``deepep_ll``, low latency, or ``deepep_ht``,
    high throughput), EP size, node count and MoE shape. ``latency`` is in microseconds.
    ``max_tokens`` is the largest count measured."""

    def __init__(
        self,
        rows: Columns,
        *,
        comm_backend: str,
        phase: str,
        ep_size: int,
        node_num: int,
        hidden_size: int,
        topk: int,
        num_experts: int,
    ):
        picked = rows.where(
            op_name="moe_a2a",
            comm_backend=comm_backend,
            phase=phase,
            ep_size=ep_size,
            node_num=node_num,
            hidden_size=hidden_size,
            topk=topk,
            num_experts=num_experts,
        )
        what = (
            f"{comm_backend} {phase} over EP {ep_size} ({node_num} node(s)), hidden "
            f"{hidden_size}, top-{topk} of {num_experts} experts"
        )
        if len(picked) == 0:
            raise _no_rows(
                rows,
                what,
                f"backends {rows.values('comm_backend')}, EP {rows.values('ep_size')}, nodes "
                f"{rows.values('node_num')}, hidden {rows.values('hidden_size')}, top-k "
                f"{rows.values('topk')}, experts {rows.values('num_experts')}",
            )
        picked = main_kernel(picked)
        _check_axis(rows, what, "num_tokens", picked.col("num_tokens"))
        self.path = rows.path
        self.max_tokens = float(picked.col("num_tokens").max())
        # The table's latency is in microseconds, not the milliseconds read_table assumes.
        seconds = picked.col("latency_s") * 1e-3
        keyed = picked.with_data(
            {**picked.data, "one": np.zeros(len(picked)), "latency_s": seconds}
        )
        self._curve = _curves(keyed, "one", "num_tokens", above_power=1.0)[0.0]

    def __call__(self, tokens: float) -> float:
        return self._curve(tokens)


class MlaModuleTimes:
    """Seconds of one layer's MLA attention module for ``batch_size`` rows of ``s`` tokens
    (context: prompts of ``isl`` tokens, no cached prefix) or keys (generation: decodes of
    ``step`` keys, the cache holding ``step - 1`` and the new token), at ``num_heads`` heads
    per GPU (the module is measured at TP 1 with the head count overridden, which is one TP
    rank's share: its ``a`` projections whole, the rest at those heads).

    Every row of the slice is kept, whatever its ``kernel_source``: the collector records the
    backend vLLM chose for that very shape (FlashMLA for the shortest prompts, which vLLM
    runs as decodes; FlashAttention above), one row per shape.
    """

    def __init__(
        self,
        rows: Columns,
        *,
        generation: bool,
        num_heads: int,
        kv_cache_dtype: str,
        gemm_type: str,
    ):
        picked = rows.where(
            kv_cache_dtype=kv_cache_dtype, gemm_type=gemm_type, mla_dtype="bfloat16", tp_size=1
        )
        what = f"kv_cache_dtype {kv_cache_dtype!r}, gemm_type {gemm_type!r}"
        if len(picked) == 0:
            raise _no_rows(
                rows,
                what,
                f"kv_cache_dtype {rows.values('kv_cache_dtype')}, gemm_type "
                f"{rows.values('gemm_type')}",
            )
        s_name = "step" if generation else "isl"
        _check_axis(rows, what, "batch_size", picked.col("batch_size"))
        _check_axis(rows, what, "num_heads", picked.col("num_heads"), two=False)
        self.path = rows.path
        self.num_heads = num_heads
        data = {**picked.data, "s": picked.col(s_name).astype(float)}
        self._by_heads: dict[float, tuple[list[float], dict[float, Curve]]] = {}
        for n in picked.values("num_heads"):
            mask = picked.col("num_heads") == n
            sub = picked.with_data({c: v[mask] for c, v in data.items()})
            _check_axis(rows, f"{what}, {n:g} heads", s_name, sub.col("s"))
            by_s = _curves(sub, "s", "batch_size", above_power=1.0, below_power=1.0)
            self._by_heads[n] = (sorted(by_s), by_s)
        self._heads_axis = sorted(self._by_heads)
        self._s_power = 1.0 if generation else 2.0

    def __call__(self, batch_size: float, s: float) -> float:
        def at_heads(n: float) -> float:
            s_axis, by_s = self._by_heads[n]
            return between(s_axis, s, lambda sj: by_s[sj](batch_size), above_power=self._s_power)

        return between(self._heads_axis, self.num_heads, at_heads, below_power=0.0)


class MlaBmmTimes:
    """vLLM's MLA decode BMM (``op_name`` ``mla_gen_pre``: ``q_nope x W_UK``, or
    ``mla_gen_post``: ``latent out x W_UV``) seconds by decode tokens, at ``num_heads``
    heads per GPU; BF16 (vLLM has no quantized kernel for them on NVIDIA GPUs). The
    collector's shapes are DeepSeek-V3's (``qk_nope_head_dim`` 128, ``kv_lora_rank`` 512,
    ``v_head_dim`` 128): the caller checks the model has them."""

    def __init__(self, rows: Columns, *, op_name: str, num_heads: int):
        picked = rows.where(op_name=op_name)
        if len(picked) == 0:
            raise _no_rows(rows, f"op_name {op_name!r}", f"op_name {rows.values('op_name')}")
        heads = picked.values("num_heads")
        if num_heads not in heads:
            raise _no_rows(rows, f"{op_name} at {num_heads} heads", f"heads {heads}")
        picked = picked.where(num_heads=num_heads)
        _check_axis(rows, f"{op_name}, {num_heads} heads", "num_tokens", picked.col("num_tokens"))
        self.path = rows.path
        keyed = picked.with_data({**picked.data, "one": np.zeros(len(picked))})
        self._curve = _curves(keyed, "one", "num_tokens", above_power=1.0)[0.0]

    def __call__(self, tokens: float) -> float:
        return self._curve(tokens)


class LinearMixerTimes:
    """One linear-attention kernel's seconds per layer (``linear_attention/gdn_perf`` or
    ``mamba2_perf``): ``kernel_source`` in ``phase`` at the layer shape ``key`` (column ->
    value: the structural columns of the table, heads as the table keys them).

    Context rows are ``batch_size`` prompts of ``seq_len`` tokens, no state carried in;
    generation rows ``batch_size`` decodes of one token. Context time is a curve over the
    batch per ``seq_len``, then log-log between ``seq_len`` values; past the longest prompt
    or the largest batch it grows with the tokens (the conv and the chunked scan are linear
    in them), below the smallest it holds (launch-bound). Generation time is a curve over
    the batch.
    """

    def __init__(self, rows: Columns, *, kernel_source: str, phase: str, key: dict[str, int]):
        picked = rows.where(kernel_source=kernel_source, phase=phase, **key)
        what = f"{kernel_source} ({phase}) at " + ", ".join(f"{k} {v}" for k, v in key.items())
        if len(picked) == 0:
            raise _no_rows(rows, what, layer_shapes(rows, key))
        self.path = rows.path
        self.generation = phase != "context"
        _check_axis(rows, what, "batch_size", picked.col("batch_size"))
        if self.generation:
            keyed = picked.with_data({**picked.data, "one": np.zeros(len(picked))})
            self._by_seq = {1.0: _curves(keyed, "one", "batch_size", above_power=1.0)[0.0]}
            self._seq_axis = [1.0]
            return
        _check_axis(rows, what, "seq_len", picked.col("seq_len"))
        self._by_seq = _curves(picked, "seq_len", "batch_size", above_power=1.0)
        self._seq_axis = sorted(self._by_seq)

    def __call__(self, batch_size: float, seq_len: float = 1.0) -> float:
        """Seconds for ``batch_size`` prompts of ``seq_len`` tokens (context) or
        ``batch_size`` decodes (generation; ``seq_len`` is not read)."""
        if self.generation:
            return self._by_seq[1.0](batch_size)
        return between(
            self._seq_axis, seq_len, lambda s: self._by_seq[s](batch_size), above_power=1.0
        )


def layer_shapes(rows: Columns, key: dict[str, int]) -> str:
    """The layer shapes a linear-attention table measures, in ``key``'s columns."""
    names = [k for k in key if rows.has(k)]
    shapes = sorted({tuple(int(rows.col(k)[i]) for k in names) for i in range(len(rows))})
    models = rows.values("model_name")
    text = f"({', '.join(names)}) in {shapes}"
    return text + (f" (configs of {', '.join(str(m) for m in models)})" if models else "")


TimeOf = Callable[[float], float]
