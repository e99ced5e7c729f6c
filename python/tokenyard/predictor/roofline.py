"""The roofline predictor: every operation of a decoder layer, priced from the model's shape
and the GPU's datasheet (seed 000 §13's decomposition).

Each operation costs ``max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency))``
per TP worker. FLOPs and bytes are linear in the batch's features, so the whole model
compiles to coefficients that Rust evaluates (see ``compiled.py``). Per layer, with ``h`` the
hidden size, ``q = heads/TP x head_dim``, ``kv = ceil(kv_heads/TP) x head_dim`` and ``i =
intermediate/TP``, for ``T`` tokens:

======================  ==============================  ====================================
operation               FLOPs                           bytes moved
======================  ==============================  ====================================
``input_norm``          ``4hT``                         ``h w + 2hTa``
``qkv_proj``            ``2h(q + 2kv)T``                ``h(q + 2kv)w + (h + q + 2kv)Ta``
``rope``                ``3(q + kv)T``                  ``2(q + kv)Ta``
``kv_store``            0                               ``2kv T(a + c)``
``attn_prefill``        ``4 q P`` (P: causal pairs)     ``2(q + kv)T_p a``
``attn_decode``         ``4 q K`` (K: keys read)        ``2kv K c + 2q T_d a``
``o_proj``              ``2 q h T``                     ``q h w + (q + h)Ta``
``post_attn_norm``      as ``input_norm``
``gate_up_proj``        ``4h i T`` (x top-k for MoE)    ``2h i w`` (x experts) ``+ (h + 2i)Ta``
``act``                 ``3 i T``                       ``3 i T a``
``down_proj``           ``2 i h T``                     ``i h w + (i + h)Ta``
``residual_add`` (x2)   ``hT``                          ``3hTa``
``all_reduce`` (x2)     ring: ``2(n-1)/n x hTa`` over the interconnect, ``2(n-1)`` latencies
======================  ==============================  ====================================

``w``, ``a``, ``c``: bytes per weight, activation and KV value. Once per replica: the
``embedding`` (first stage; with TP, an all-reduce of its ``hTa`` bytes), ``lm_head``
(last stage: one row per request) and ``send_recv`` of ``hTa`` bytes between pipeline
stages. Prefill attention counts only the
chunk's own Q, K, V and output as traffic: it is compute-bound, and the cached prefix is
read once per query tile, which a roofline cannot see. A MoE layer reads the weights of
``min(experts, top-k x T)`` experts: not linear in ``T``, so its expert GEMMs compile to
a table of the exact formula on a fine token grid.

The decoder layers' projections (q, k, v, o, the MLP or experts) multiply in
``gemm_activations``: ``bf16`` (the default, and weight-only quantization, which dequantizes
to BF16) at the device's ``dense_bf16_tflops``; ``fp8`` or ``fp4`` (W8A8 FP8, NVFP4) at its
``dense_fp8_tflops`` / ``dense_fp4_tflops``, refused on a device without that tensor-core
precision. Attention, the router and the LM head stay at the BF16 peak. The calibrated
curves, fitted to BF16 GEMMs, are applied to the FP8 and FP4 peaks unchanged.
"""

from __future__ import annotations

import dataclasses
import math

from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.errors import ConfigError
from tokenyard.predictor import grids
from tokenyard.predictor.calibration import (
    Calibration,
    curve_value,
    decode_efficiency_rows,
    decode_roofline_s,
    prefill_roofline_s,
)
from tokenyard.predictor.compiled import CompiledOp, CompiledPredictor, RooflineCost
from tokenyard.predictor.efficiencies import Efficiencies
from tokenyard.predictor.roofline_builder import (
    _bmm,
    _Builder,
    _gemm,
    _norm,
    _Sizes,
    _sizes,
)
from tokenyard.predictor.roofline_moe import (
    _a2a_words,
    _all_to_all,
    _dp_gather,
    _experts,
    _mlp,
)

__all__ = ["CpuOverheads", "Efficiencies", "roofline_predictor"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CpuOverheads:
    """Host time per batch stage, added to the GPU time (seed 000 §13). Defaults: the
    scheduler step tokenyard measured (about 0.1 ms) and typical eager-mode costs."""

    schedule_s: float = 1e-4
    prepare_inputs_s: float = 5e-4
    sample_s: float = 2e-4
    process_outputs_s: float = 2e-4

    def check(self, where: str) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 1):
                raise ConfigError(
                    f"{where}.{field.name}: must be a number in [0, 1] (seconds), got {value!r}",
                    field=f"{where}.{field.name}",
                    value=repr(value),
                )

    @property
    def total_s(self) -> float:
        return self.schedule_s + self.prepare_inputs_s + self.sample_s + self.process_outputs_s


def _calibrated_attention(b: _Builder, c: Calibration, s: _Sizes) -> None:
    device = b.device

    def prefill(batch: float, seq: float, prefix: float) -> float:
        roofline = prefill_roofline_s(device, batch, seq, prefix, s.q, s.kv, s.c)
        return roofline / curve_value(c.prefill_seq_lens, c.prefill_efficiency, seq + prefix)

    kv_heads = s.kv / s.head_dim
    # The efficiency curves at each key count, computed once per column of the grid (the
    # same numbers decode_efficiency gives; half of a short run's predictor build).
    rows: dict[float, list[float]] = {}

    def decode(batch: float, keys: float) -> float:
        roofline = decode_roofline_s(device, batch, keys, s.q, s.kv, s.c)
        at = rows.get(keys)
        if at is None:
            at = rows[keys] = decode_efficiency_rows(c, keys)
        return roofline / curve_value(c.decode_parallelism, at, batch * kv_heads)

    b.table("attn_prefill", grids.prefill_attention_table(prefill), gate="num_prefill_tokens")
    b.table("attn_decode", grids.decode_attention_table(decode), gate="num_decode_tokens")


def _attention(b: _Builder, s: _Sizes) -> None:
    b.add("kv_store", flops={}, bytes={"num_tokens": 2.0 * s.kv * (s.a + s.c)})
    if b.calibration is not None:
        _calibrated_attention(b, b.calibration, s)
        return
    b.add(
        "attn_prefill",
        flops={"prefill_attention_pairs": 4.0 * s.q},
        bytes={"num_prefill_tokens": 2.0 * (s.q + s.kv) * s.a},
        attention=True,
        gate="num_prefill_tokens",
    )
    b.add(
        "attn_decode",
        flops={"decode_attention_keys": 4.0 * s.q},
        bytes={"decode_attention_keys": 2.0 * s.kv * s.c, "num_decode_tokens": 2.0 * s.q * s.a},
        attention=True,
        gate="num_decode_tokens",
    )


def window_pairs(seq: float, prefix: float, window: float, chunked: bool = False) -> float:
    """Query-key pairs of a chunk of ``seq`` tokens after ``prefix`` cached ones when a
    query reads at most ``window`` keys: the last ``window`` (sliding) or those of its own
    ``window``-token chunk (chunked local attention, Llama 4); ``window`` 0: all."""

    def upto(n: float) -> float:  # pairs of the first n positions
        if window <= 0:
            return n * (n + 1.0) / 2.0
        if chunked:
            whole, rest = divmod(n, window)
            return whole * window * (window + 1.0) / 2.0 + rest * (rest + 1.0) / 2.0
        if n <= window:
            return n * (n + 1.0) / 2.0
        return window * (window + 1.0) / 2.0 + (n - window) * window

    return max(upto(seq + prefix) - upto(prefix), 0.0)


def window_keys(keys: float, window: float, chunked: bool = False) -> float:
    """Keys a decode at ``keys`` cached tokens reads: at most ``window`` (sliding); within
    its chunk (chunked: on average half a chunk once past the first)."""
    if window <= 0 or keys <= window:
        return keys
    return (window + 1.0) / 2.0 if chunked else float(window)


def _windowed_attention(b: _Builder, s: _Sizes, window: int, chunked: bool, prefix: str) -> None:
    """Attention over a window (``prefix`` names the ops): the pairs and keys a window
    leaves, priced as full attention of that work (calibrated curves where there are)."""
    device, c = b.device, b.calibration
    b.add(f"{prefix}kv_store", flops={}, bytes={"num_tokens": 2.0 * s.kv * (s.a + s.c)})
    peak = device.dense_bf16_tflops * 1e12
    bandwidth = device.memory_bandwidth_gbps * 1e9

    def prefill(batch: float, seq: float, cached: float) -> float:
        pairs = window_pairs(seq, cached, window, chunked)
        keys = min(seq + cached, window) if window and not chunked else seq + cached
        flops = 4.0 * s.q * batch * pairs
        moved = batch * (4.0 * s.q * seq + s.c * 2.0 * s.kv * keys)
        if c is not None:
            roofline = max(flops / peak, moved / bandwidth)
            span = min(seq + cached, float(window)) if window else seq + cached
            return roofline / curve_value(c.prefill_seq_lens, c.prefill_efficiency, span)
        return max(flops / (peak * b.eff.attention), moved / (bandwidth * b.eff.memory))

    kv_heads = s.kv / s.head_dim

    def decode(batch: float, keys: float) -> float:
        read = window_keys(keys, window, chunked)
        roofline = decode_roofline_s(device, batch, read, s.q, s.kv, s.c)
        if c is not None:
            rows = decode_efficiency_rows(c, read)
            return roofline / curve_value(c.decode_parallelism, rows, batch * kv_heads)
        flops = 4.0 * s.q * batch * read
        moved = batch * (4.0 * s.q + s.c * 2.0 * s.kv * read)
        return max(flops / (peak * b.eff.attention), moved / (bandwidth * b.eff.memory))

    for name, table, gate in (
        ("attn_prefill", grids.prefill_attention_table(prefill), "num_prefill_tokens"),
        ("attn_decode", grids.decode_attention_table(decode), "num_decode_tokens"),
    ):
        source = "calibrated" if c is not None else "roofline"
        b.ops.append(CompiledOp(f"{prefix}{name}", "layer", gate, table, 1.0, source))


def _linear_attention(b: _Builder, model: ModelSpec, s: _Sizes, tp: int, prefix: str) -> None:
    """A gated DeltaNet or Mamba2 layer on one TP worker (``d = heads/TP x head_dim``
    values read out of a ``heads/TP x head_dim x group_dim`` state): the input
    projection(s), the depthwise causal conv over ``d + 2g`` channels (a prefill's over
    its chunk, a decode's one-step update: the same bytes and FLOPs a token, so one
    kernel or two differ by a launch; Mamba2 runs two, GDN one varlen conv over every
    token of a step with a prefill, ``measured/linear.py``), the
    chunked scan of a prefill (about ``6 x state`` FLOPs per token: decay, update and
    read-out) and the recurrent step of a decode (the state read and written once), the
    gated norm and ``out_proj``."""
    lin = model.linear
    if lin is None:
        return
    heads = lin.num_heads // tp
    inner = heads * lin.head_dim
    conv_dim = (lin.inner + 2 * lin.groups(tp) * lin.group_dim) // tp
    state = heads * lin.head_dim * lin.group_dim
    _gemm(b, f"{prefix}in_proj", s.h, lin.in_proj_width() // tp, s)
    for phase in ("prefill", "decode"):
        tokens = f"num_{phase}_tokens"
        b.add(
            f"{prefix}conv_{phase}",
            flops={tokens: 2.0 * conv_dim * lin.conv_kernel},
            bytes={tokens: 2.0 * conv_dim * s.a},
            gate=tokens,
        )
    b.add(
        f"{prefix}scan_prefill",
        flops={"num_prefill_tokens": 6.0 * state},
        bytes={"num_prefill_tokens": 4.0 * inner * s.a},
        attention=True,
        gate="num_prefill_tokens",
    )
    b.add(
        f"{prefix}scan_decode",
        flops={"num_decode_tokens": 6.0 * state},
        bytes={"num_decode_tokens": 2.0 * state * lin.state_dtype_bytes + 4.0 * inner * s.a},
        attention=True,
        gate="num_decode_tokens",
    )
    b.add(
        f"{prefix}gated_norm",
        flops={"num_tokens": 5.0 * inner},
        bytes={"num_tokens": 3.0 * inner * s.a},
    )
    _gemm(b, f"{prefix}out_proj", inner, s.h, s)


def _mixer_sizes(model: ModelSpec, s: _Sizes, tp: int, mixer: str) -> _Sizes:
    kv_heads, head_dim = model.kv_shape(mixer)
    return dataclasses.replace(
        s,
        q=model.num_heads // tp * head_dim,
        kv=math.ceil(kv_heads / tp) * head_dim,
        head_dim=head_dim,
    )


def _gqa_attention(
    b: _Builder,
    model: ModelSpec,
    s: _Sizes,
    prefix: str = "",
    window: int = 0,
    chunked: bool = False,
    mixer: str = "gqa",
) -> None:
    """A GQA layer's attention block (``prefix`` names a non-full kind's ops)."""
    gate = s.q if model.attention_output_gate else 0
    kv_proj = s.kv if mixer == "gqa" and model.attention_k_eq_v else 2 * s.kv
    _gemm(b, f"{prefix}qkv_proj", s.h, s.q + gate + kv_proj, s)
    b.add(
        f"{prefix}rope",
        flops={"num_tokens": 3.0 * (s.q + s.kv)},
        bytes={"num_tokens": 2.0 * (s.q + s.kv) * s.a},
    )
    if model.qk_norm:  # Qwen3: an RMSNorm over each query and key head
        b.add(
            f"{prefix}qk_norm",
            flops={"num_tokens": 4.0 * (s.q + s.kv)},
            bytes={"one": 2.0 * s.head_dim * s.w, "num_tokens": 2.0 * (s.q + s.kv) * s.a},
        )
    if window:
        _windowed_attention(b, s, window, chunked, prefix)
    else:
        _attention(b, s)
        if prefix:
            for i in range(len(b.ops) - 3, len(b.ops)):
                b.ops[i] = dataclasses.replace(b.ops[i], name=prefix + b.ops[i].name)
    _gemm(b, f"{prefix}o_proj", s.q, s.h, s)


def _mixers(b: _Builder, model: ModelSpec, s: _Sizes, tp: int) -> None:
    """Each kind of token mixer the model's layers have, its ops run ``count /
    num_layers`` times per layer (exact at PP 1). Full attention keeps the plain op
    names; a ``sliding``, ``chunked``, ``gdn`` or ``mamba2`` layer's ops are named with
    its kind (``sliding_attn_decode``)."""
    counts: dict[str, int] = {}
    for mixer in model.mixers():
        counts[mixer] = counts.get(mixer, 0) + 1
    for mixer, count in counts.items():
        start = len(b.ops)
        prefix = "" if mixer in ("gqa", "mla") else f"{mixer}_"
        if mixer == "mla":
            _mla_attention(b, model, s)
        elif mixer in ("gqa", "sliding", "chunked"):
            sizes = _mixer_sizes(model, s, tp, mixer)
            window = model.window_of(mixer)
            _gqa_attention(b, model, sizes, prefix, window, mixer == "chunked", mixer)
        elif mixer in ("gdn", "mamba2"):
            _linear_attention(b, model, s, tp, prefix)
        if count != model.num_layers:
            share = count / model.num_layers
            b.ops[start:] = [
                dataclasses.replace(op, count=op.count * share) for op in b.ops[start:]
            ]


def _mla_attention(b: _Builder, model: ModelSpec, s: _Sizes) -> None:
    """Multi-head latent attention on one TP worker (``n`` heads, ``r = qk_nope +
    qk_rope``): the a projections (replicated), the latent norms, ``q_b_proj``, RoPE on
    the rotary parts, the latent's store; prefill un-absorbed (``kv_b_proj`` up-projects
    the chunk's latents to per-head K and V, then attention of head dims ``r`` and ``v``);
    decode absorbed (``W_UK`` into the query, MQA over the cached latents, ``W_UV`` out);
    ``o_proj``. The up-projection of a cached prefix for a chunk is not counted."""
    mla = model.mla
    if mla is None:  # the caller checked
        return
    n, r, v, lat, kvr = s.heads, mla.qk_head_dim, mla.v_head_dim, mla.latent_dim, mla.kv_lora_rank
    nope, rope = mla.qk_nope_head_dim, mla.qk_rope_head_dim
    _gemm(b, "qkv_a_proj", s.h, mla.q_lora_rank + lat, s)
    norms = mla.q_lora_rank + kvr
    b.add("latent_norm", flops={"num_tokens": 4.0 * norms}, bytes={"num_tokens": 2.0 * norms * s.a})
    _gemm(b, "q_b_proj", mla.q_lora_rank or s.h, n * r, s)
    b.add(
        "rope",
        flops={"num_tokens": 3.0 * (n + 1) * rope},
        bytes={"num_tokens": 2.0 * (n + 1) * rope * s.a},
    )
    b.add("kv_store", flops={}, bytes={"num_tokens": lat * (s.a + s.c)})
    _gemm(b, "kv_b_proj", kvr, n * (nope + v), s, feature="num_prefill_tokens")
    _bmm(b, "mla_bmm_pre", n, nope, kvr, s, "num_decode_tokens")
    if model.indexer is not None:
        _sparse_mla_attention(b, model, s)
    elif b.calibration is not None:
        c, device = b.calibration, b.device
        # Un-absorbed prefill: q and k of width n r, v of n v (the roofline's q = kv = half
        # their sum gives its 2 n (r + v) FLOPs per pair); absorbed decode: n heads over
        # one latent (2 n (2 kv_lora + qk_rope) FLOPs per key, the latent read once).
        wide = n * (r + v) / 2.0
        narrow = n * (2 * kvr + rope) / 2.0

        def prefill(batch: float, seq: float, prefix: float) -> float:
            roofline = prefill_roofline_s(device, batch, seq, prefix, wide, wide, s.a)
            return roofline / curve_value(c.prefill_seq_lens, c.prefill_efficiency, seq + prefix)

        def decode(batch: float, keys: float) -> float:
            roofline = decode_roofline_s(device, batch, keys, narrow, lat / 2.0, s.c)
            rows = decode_efficiency_rows(c, keys)
            return roofline / curve_value(c.decode_parallelism, rows, batch)

        b.table("attn_prefill", grids.prefill_attention_table(prefill), gate="num_prefill_tokens")
        b.table("attn_decode", grids.decode_attention_table(decode), gate="num_decode_tokens")
    else:
        b.add(
            "attn_prefill",
            flops={"prefill_attention_pairs": 2.0 * n * (r + v)},
            bytes={"num_prefill_tokens": 2.0 * n * (r + v) * s.a},
            attention=True,
            gate="num_prefill_tokens",
        )
        b.add(
            "attn_decode",
            flops={"decode_attention_keys": 2.0 * n * (2 * kvr + rope)},
            bytes={"decode_attention_keys": lat * s.c, "num_decode_tokens": n * (lat + kvr) * s.a},
            attention=True,
            gate="num_decode_tokens",
        )
    _bmm(b, "mla_bmm_post", n, kvr, v, s, "num_decode_tokens")
    _gemm(b, "o_proj", n * v, s.h, s)


#: The indexer's per-key logits (fp32) written by the MQA-logits kernel and read by top-k.
_INDEXER_LOGIT_BYTES = 8.0


def _sparse_mla_attention(b: _Builder, model: ModelSpec, s: _Sizes) -> None:
    """DSA (DeepSeek-V3.2, GLM-5): the indexer, then MLA over at most ``index_topk`` keys.

    Indexer (replicated on every TP rank, vLLM's ``Indexer``): ``indexer_q_proj``
    (``wq_b``, ``q_lora x n_i d_i``), ``indexer_k_proj`` (``wk`` and ``weights_proj``
    fused, ``h x (d_i + n_i)``), its key's store (``d_i`` FP8 bytes + a scale per 128),
    and the scan (``indexer_prefill``, ``indexer_decode``): every query scores every
    cached key it may see, ``2 n_i d_i`` FLOPs a pair at the FP8 peak (the BF16 one on a
    device without FP8), reading each key's cached bytes and writing and re-reading a fp32
    logit per key for the top-k. The top-k selection's own compute is left out.

    Attention: the MLA prefill (un-absorbed) and decode (absorbed) of ``_mla_attention``
    at the pairs and keys the top-k leaves: a query at position ``p`` reads ``min(p,
    index_topk)`` keys (the count of a sliding window of ``index_topk``:
    ``window_pairs``, ``window_keys``), so a decode's attention stops growing past
    ``index_topk`` while the indexer's scan keeps growing with the context."""
    mla, indexer = model.mla, model.indexer
    if mla is None or indexer is None:  # the caller checked
        return
    device, c = b.device, b.calibration
    n, r, v, lat, kvr = s.heads, mla.qk_head_dim, mla.v_head_dim, mla.latent_dim, mla.kv_lora_rank
    ni, di, topk, cached = indexer.num_heads, indexer.head_dim, indexer.topk, indexer.cache_bytes
    _gemm(b, "indexer_q_proj", mla.q_lora_rank or s.h, ni * di, s)
    _gemm(b, "indexer_k_proj", s.h, di + ni, s)
    b.add("indexer_k_store", flops={}, bytes={"num_tokens": di * s.a + cached})
    peak = device.dense_bf16_tflops * 1e12
    fp8_peak = (device.dense_fp8_tflops or device.dense_bf16_tflops) * 1e12
    bandwidth = device.memory_bandwidth_gbps * 1e9
    memory = c.memory_efficiency if c is not None else b.eff.memory
    compute = 1.0 if c is not None else b.eff.attention
    per_key = cached + _INDEXER_LOGIT_BYTES

    def index_prefill(batch: float, seq: float, prefix: float) -> float:
        pairs = window_pairs(seq, prefix, 0)
        flops = 2.0 * ni * di * batch * pairs
        moved = batch * (seq * ni * di + (seq + prefix) * cached + pairs * _INDEXER_LOGIT_BYTES)
        return max(flops / (fp8_peak * compute), moved / (bandwidth * memory))

    def index_decode(batch: float, keys: float) -> float:
        flops = 2.0 * ni * di * batch * keys
        moved = batch * (ni * di + keys * per_key)
        return max(flops / (fp8_peak * compute), moved / (bandwidth * memory))

    wide = n * (r + v) / 2.0
    narrow = n * (2 * kvr + mla.qk_rope_head_dim) / 2.0

    def prefill(batch: float, seq: float, prefix: float) -> float:
        pairs = window_pairs(seq, prefix, topk)
        flops = 4.0 * wide * batch * pairs
        moved = batch * (2.0 * wide * seq + 2.0 * wide * (seq + prefix)) * s.a
        if c is not None:
            span = min(seq + prefix, float(topk))
            roofline = max(flops / peak, moved / bandwidth)
            return roofline / curve_value(c.prefill_seq_lens, c.prefill_efficiency, span)
        return max(flops / (peak * b.eff.attention), moved / (bandwidth * b.eff.memory))

    def decode(batch: float, keys: float) -> float:
        read = window_keys(keys, topk)
        roofline = decode_roofline_s(device, batch, read, narrow, lat / 2.0, s.c)
        if c is not None:
            rows = decode_efficiency_rows(c, read)
            return roofline / curve_value(c.decode_parallelism, rows, batch)
        flops = 4.0 * narrow * batch * read
        moved = batch * (4.0 * narrow + s.c * lat * read)
        return max(flops / (peak * b.eff.attention), moved / (bandwidth * b.eff.memory))

    source = "calibrated" if c is not None else "roofline"
    for name, fn, gate in (
        ("indexer_prefill", index_prefill, "num_prefill_tokens"),
        ("indexer_decode", index_decode, "num_decode_tokens"),
        ("attn_prefill", prefill, "num_prefill_tokens"),
        ("attn_decode", decode, "num_decode_tokens"),
    ):
        table = (
            grids.prefill_attention_table(fn)  # type: ignore[arg-type]
            if gate == "num_prefill_tokens"
            else grids.decode_attention_table(fn)  # type: ignore[arg-type]
        )
        b.ops.append(CompiledOp(name, "layer", gate, table, 1.0, source))


def _communication(b: _Builder, device: DeviceSpec, s: _Sizes, tp: int, pp: int) -> None:
    # The catalog gives bidirectional totals; a ring sends and receives at once, each way at
    # half of that.
    link = device.interconnect_gbps / 2 * 1e9 * b.eff.network
    latency = device.interconnect_latency_us * 1e-6
    if tp > 1:
        ring = 2.0 * (tp - 1) / tp
        ring_latency, ring_link = 2 * (tp - 1) * latency, link
        fitted = b.calibration.all_reduce(tp) if b.calibration is not None else None
        if fitted is not None:
            ring_latency = fitted[0]
            ring_link = device.interconnect_gbps / 2 * 1e9 * fitted[1]
        cost = RooflineCost(
            flops={},
            bytes={"num_tokens": ring * s.h * s.a},
            flops_per_s=b.flops_per_s,
            bytes_per_s=ring_link,
            latency_s=ring_latency,
        )
        source = "calibrated" if fitted is not None else "roofline"
        b.ops.append(CompiledOp("all_reduce", "layer", "num_tokens", cost, 2.0, source))
        # The vocabulary-parallel embedding sums its shards' rows once per step.
        b.ops.append(
            CompiledOp("embedding_all_reduce", "first_stage", "num_tokens", cost, 1.0, source)
        )
    if pp > 1:
        cost = RooflineCost(
            flops={},
            bytes={"num_tokens": s.h * s.a},
            flops_per_s=b.flops_per_s,
            bytes_per_s=link,
            latency_s=latency,
        )
        b.ops.append(CompiledOp("send_recv", "between_stages", "num_tokens", cost))


def _check_inputs(model: ModelSpec, tp: int, pp: int, weight_bytes: float, kv_bytes: float) -> None:
    model.check_layout(tp, pp)
    for field, size in (("weight_bytes", weight_bytes), ("kv_bytes", kv_bytes)):
        if not (isinstance(size, (int, float)) and math.isfinite(size) and size > 0):
            raise ConfigError(
                f"{field}: must be a finite number > 0, got {size!r}",
                field=field,
                value=repr(size),
            )


def roofline_predictor(
    model: ModelSpec,
    device: DeviceSpec,
    *,
    tensor_parallel_size: int = 1,
    num_pipeline_stages: int = 1,
    weight_bytes: float = 2.0,
    kv_bytes: float = 2.0,
    efficiencies: Efficiencies | None = None,
    cpu: CpuOverheads | None = None,
    calibration: Calibration | None = None,
    gemm_activations: str = "bf16",
    expert_parallel_size: int = 1,
    data_parallel_size: int = 1,
) -> CompiledPredictor:
    """The roofline model of ``model`` on ``device`` under TP x PP, compiled for Rust.

    With expert parallelism (``expert_parallel_size`` EP > 1: ``TP x DP``, as vLLM sets
    it) a GPU computes ``num_experts / EP`` whole experts; with attention data parallelism
    (``data_parallel_size`` DP > 1) the predictor prices one DP rank's step, its batch one
    of ``DP`` alike ones whose combined tokens the experts see, plus the expert
    all-to-all (``moe_dispatch``, ``moe_combine``). DP without EP (EP 1, vLLM's
    ``--data-parallel-size`` without ``--enable-expert-parallel``) runs the experts as one
    TP group of ``TP x DP`` GPUs on those combined tokens, all-gathered and
    reduce-scattered over the DP ranks (``moe_all_gather``, ``moe_reduce_scatter``).

    With a ``calibration`` (``calibration.builtin_calibration(device)``), GEMMs, attention,
    memory-bound kernels and all-reduces follow its fitted efficiency curves and
    ``efficiencies`` is not used; without one, the constant ``efficiencies`` apply.
    ``gemm_activations`` (``bf16``, ``fp8``, ``fp4``: a ``Quantization``'s activations) is
    the format the decoder layers' projections multiply in, at that tensor-core peak.

    Raises:
        ConfigError: a layout that does not divide the model's heads or layers, a bad
            efficiency, overhead or byte size (the field and the value), or ``fp8``/``fp4``
            GEMMs on a device without that precision (``replica.device``).
    """
    tp, pp = tensor_parallel_size, num_pipeline_stages
    ep, dp = expert_parallel_size, data_parallel_size
    efficiencies = efficiencies or Efficiencies()
    cpu = cpu or CpuOverheads()
    _check_inputs(model, tp, pp, weight_bytes, kv_bytes)
    model.check_expert_parallel(ep)
    if ep > 1 and ep != tp * dp:
        raise ConfigError(
            f"replica.expert_parallel_size: must be 1 or tensor_parallel_size x "
            f"data_parallel_size = {tp * dp}, got {ep}",
            field="replica.expert_parallel_size",
            value=str(ep),
        )
    efficiencies.check("execution.efficiency")
    cpu.check("execution.cpu")
    s = _sizes(model, tp, weight_bytes, kv_bytes)
    b = _Builder(device, efficiencies, calibration, gemm_activations)
    _norm(b, "input_norm", s)
    _mixers(b, model, s, tp)
    _norm(b, "post_attn_norm", s)
    if model.layer_types:  # a one-part layer (Nemotron-H) has one norm
        both = sum(
            1
            for m, f in zip(model.mixers(), model.ffns(), strict=True)
            if m != "none" and f != "none"
        )
        b.ops[-1] = dataclasses.replace(b.ops[-1], count=both / model.num_layers)
    sp = model.shared_experts_sequence_parallel(tp, ep, dp)
    _mlp(b, model, s, tp, _experts(model, tp, ep, dp), sp)
    if model.mtp_module:  # an MTP module (ModelSpec.mtp_drafter): enorm, hnorm, eh_proj
        _norm(b, "mtp_norms", s)
        b.ops[-1] = dataclasses.replace(b.ops[-1], count=2.0)
        _gemm(b, "eh_proj", 2 * s.h, s.h, s, layer_linear=False)  # bf16 in vLLM, whole
    if calibration is None:  # calibrated: fused into the norms
        b.add(
            "residual_add",
            flops={"num_tokens": float(s.h)},
            bytes={"num_tokens": 3.0 * s.h * s.a},
            count=2.0,
        )
    _communication(b, device, s, tp, pp)
    _all_to_all(b, model, s, tp, ep, dp)
    _dp_gather(b, model, s, tp, ep, dp)
    b.add("embedding", flops={}, bytes={"num_tokens": 2.0 * s.h * s.a}, scope="first_stage")
    if calibration is not None:
        _gemm(b, "lm_head", s.h, s.vocab, s, feature="num_requests", layer_linear=False)
    else:
        b.add(
            "lm_head",
            flops={"num_requests": 2.0 * s.h * s.vocab},
            bytes={"one": s.h * s.vocab * s.w, "num_requests": (s.h + s.vocab) * s.a},
            gate="num_requests",
            scope="last_stage",
        )
    return CompiledPredictor(
        ops=tuple(b.ops),
        num_layers=model.num_layers,
        cpu_overhead_s=cpu.total_s,
        description={
            "kind": "roofline",
            "model": model.name,
            "device": device.name,
            "tensor_parallel_size": tp,
            "num_pipeline_stages": pp,
            "expert_parallel_size": ep,
            "data_parallel_size": dp,
            "a2a": _a2a_words(b, ep, dp, tp),
            "efficiencies": dataclasses.asdict(efficiencies) if calibration is None else None,
            "calibration": calibration.source if calibration is not None else None,
            "gemm_activations": gemm_activations,
        },
    )
