"""The layer-kind records of a ``ModelSpec``: the token mixers and FFNs a layer may have,
and the shapes of the attention variants that are more than a head count (latent
attention, DSA's indexer, linear attention), each with its weights and cache bytes.

A record is valid once built: its constructor checks every count and raises a
``ConfigError`` whose ``field`` is ``<record>.<field>`` (``mla.kv_lora_rank``, ...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tokenyard.errors import ConfigError

__all__ = [
    "ATTENTION_MIXERS",
    "FFNS",
    "LINEAR_MIXERS",
    "MIXERS",
    "LayerKind",
    "LinearAttention",
    "MlaAttention",
    "SparseIndexer",
]

#: A layer's token mixer: attention that caches every token's K and V (``gqa``, or
#: ``mla`` for latent attention), a ``sliding`` window of the last ``sliding_window``
#: tokens, ``chunked`` local attention within blocks of ``attention_chunk_size`` tokens
#: (Llama 4), a linear-attention state (``gdn``: gated DeltaNet; ``mamba2``), or ``none``
#: (a Nemotron-H layer that is an FFN only).
ATTENTION_MIXERS = ("gqa", "mla", "sliding", "chunked")
LINEAR_MIXERS = ("gdn", "mamba2")
MIXERS = (*ATTENTION_MIXERS, *LINEAR_MIXERS, "none")
#: A layer's FFN: SwiGLU (or a non-gated MLP, ``gated_ffn`` false), experts, or none
#: (a Nemotron-H mixer-only layer).
FFNS = ("dense", "moe", "none")


def _fail(where: str, field: str, problem: str, value: Any) -> ConfigError:
    return ConfigError(
        f"{where}.{field}: {problem}, got {value!r}", field=f"{where}.{field}", value=repr(value)
    )


def check_count(where: str, field: str, value: Any, low: int) -> None:
    """Raises ConfigError (field ``<where>.<field>``) unless ``value`` is an int, not a
    bool, ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _fail(where, field, f"must be an integer >= {low}", value)


@dataclass(frozen=True, kw_only=True)
class MlaAttention:
    """Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi-K2), as its ``config.json``
    says it. Per layer (``h`` hidden, ``n`` heads):

    - ``q_a_proj`` ``h x q_lora_rank`` and its RMSNorm, then ``q_b_proj`` ``q_lora_rank x
      n(qk_nope + qk_rope)``; with ``q_lora_rank`` 0 (``null``: DeepSeek-V2-Lite) one
      ``q_proj`` ``h x n(qk_nope + qk_rope)``;
    - ``kv_a_proj_with_mqa`` ``h x (kv_lora_rank + qk_rope)`` and an RMSNorm over the
      latent, ``kv_b_proj`` ``kv_lora_rank x n(qk_nope + v_head_dim)``;
    - ``o_proj`` ``n v_head_dim x h``.

    The KV cache holds one latent per token and layer: ``kv_lora_rank + qk_rope_head_dim``
    values (``latent_dim``), one "head" that every tensor-parallel rank keeps whole
    (vLLM's ``MLAAttentionSpec``: ``num_kv_heads = 1``, ``head_size = kv_lora_rank +
    qk_rope_head_dim``). Under TP the ``a`` projections are replicated (vLLM's
    ``ReplicatedLinear``), the ``b`` projections and ``o_proj`` split by heads.
    """

    q_lora_rank: int  # 0: no query compression
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            low = 0 if field.name == "q_lora_rank" else 1
            check_count("mla", field.name, getattr(self, field.name), low)

    @property
    def qk_head_dim(self) -> int:
        """Query and key width per head: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values cached per token and layer: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def split_parameters(self, hidden: int, heads: int) -> tuple[int, int, int]:
        """(linear weights every TP rank holds whole, linear weights split by heads, norm
        weights) of one layer, for ``heads`` heads (the model's, or one rank's share)."""
        n = heads
        q_a = hidden * self.q_lora_rank
        q_b = (self.q_lora_rank or hidden) * n * self.qk_head_dim
        kv_a = hidden * self.latent_dim
        kv_b = self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
        o = n * self.v_head_dim * hidden
        return q_a + kv_a, q_b + kv_b + o, self.q_lora_rank + self.kv_lora_rank


@dataclass(frozen=True, kw_only=True)
class SparseIndexer:
    """DeepSeek sparse attention's (DSA: DeepSeek-V3.2, GLM-5) lightning indexer, beside
    an MLA layer: ``index_n_heads`` heads of ``index_head_dim`` score every cached token
    for each query (FP8 MQA logits) and the MLA attention then reads only the
    ``index_topk`` best. Per layer (vLLM 0.33's ``Indexer``, replicated on every TP
    rank): ``wq_b`` ``q_lora_rank x n d``, ``wk`` ``h x d`` and ``weights_proj`` ``h x
    n`` (one fused GEMM), the key's LayerNorm (``2 d``). It caches one key per token and
    layer: ``d`` FP8 values and one float32 scale per 128 (vLLM's
    ``DeepseekV32IndexerCache``: ``head_dim + head_dim // 128 * 4`` bytes, whatever the
    KV cache dtype)."""

    num_heads: int
    head_dim: int
    topk: int

    #: vLLM's indexer quantizes its keys in blocks of 128 values, one fp32 scale each.
    QUANT_BLOCK = 128

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check_count("indexer", field.name, getattr(self, field.name), 1)

    @property
    def cache_bytes(self) -> int:
        """Bytes the indexer caches per token and layer (on every TP rank)."""
        return self.head_dim + self.head_dim // self.QUANT_BLOCK * 4

    def parameters(self, hidden: int, q_lora_rank: int) -> tuple[int, int]:
        """(linear weights, norm weights) of one layer's indexer."""
        n, d = self.num_heads, self.head_dim
        return (q_lora_rank or hidden) * n * d + hidden * (d + n), 2 * d


@dataclass(frozen=True, kw_only=True)
class LinearAttention:
    """A linear-attention layer's shape: gated DeltaNet (``gdn``: Qwen3-Next, Qwen3.5) or
    Mamba2 (``mamba2``: Nemotron-H), in one vocabulary, vLLM's
    (``MambaStateShapeCalculator``):

    ==============  ==============================  ==============================
    field           gdn (config key)                mamba2 (config key)
    ==============  ==============================  ==============================
    ``num_heads``   ``linear_num_value_heads``      ``mamba_num_heads``
    ``head_dim``    ``linear_value_head_dim``       ``mamba_head_dim``
    ``num_groups``  ``linear_num_key_heads``        ``n_groups``
    ``group_dim``   ``linear_key_head_dim``         ``ssm_state_size``
    ``conv_kernel`` ``linear_conv_kernel_dim``      ``conv_kernel``
    ==============  ==============================  ==============================

    With ``d = num_heads x head_dim`` and ``g = num_groups x group_dim``, both cache per
    request and layer a convolution window, ``(d + 2g) x (conv_kernel - 1)`` values in the
    model dtype, and a recurrent state, ``num_heads x head_dim x group_dim`` values in
    ``state_dtype_bytes`` (the config's ``mamba_ssm_dtype`` / ``mamba_ssm_cache_dtype``,
    float32 in the bundled configs; bf16 without one, vLLM's ``auto``). Under TP the
    heads and groups split (Mamba2's groups are replicated up to TP when TP does not
    divide them, vLLM's ``extra_groups_for_head_shards``).
    """

    kind: str
    num_heads: int
    head_dim: int
    num_groups: int
    group_dim: int
    conv_kernel: int
    state_dtype_bytes: int = 2

    def __post_init__(self) -> None:
        if self.kind not in LINEAR_MIXERS:
            raise _fail("linear", "kind", f"must be one of {', '.join(LINEAR_MIXERS)}", self.kind)
        for field in dataclasses.fields(self):
            if field.name != "kind":
                check_count("linear", field.name, getattr(self, field.name), 1)

    @property
    def inner(self) -> int:
        """``num_heads x head_dim``: the values the state is read out to."""
        return self.num_heads * self.head_dim

    def groups(self, tp: int) -> int:
        """The groups one TP rank holds x TP (Mamba2 replicates them up to TP)."""
        if self.kind == "mamba2" and self.num_groups % tp:
            return tp  # vLLM: num_groups + (tp - num_groups)
        return self.num_groups

    def state_bytes(self, tp: int, conv_bytes: int = 2) -> int:
        """Bytes of one request's state in one layer on one TP rank: the convolution
        window (``conv_bytes`` per value, the model dtype) and the recurrent state."""
        conv_dim = self.inner + 2 * self.groups(tp) * self.group_dim
        conv = conv_dim // tp * (self.conv_kernel - 1) * conv_bytes
        ssm = self.num_heads // tp * self.head_dim * self.group_dim * self.state_dtype_bytes
        return conv + ssm

    def in_proj_width(self) -> int:
        """Output width of the input projection(s): GDN's ``in_proj_qkvz`` (q, k, v, z)
        and ``in_proj_ba`` (two scalars per value head); Mamba2's ``in_proj`` (z, x, B, C
        and one dt per head)."""
        g = self.num_groups * self.group_dim
        extra = 2 * self.num_heads if self.kind == "gdn" else self.num_heads
        return 2 * self.inner + 2 * g + extra

    def parameters(self, hidden: int) -> tuple[int, int]:
        """(linear weights, other weights) of one layer: the projections; the depthwise
        convolution, per-head A, dt bias (and Mamba2's D), the gated norm."""
        conv_dim = self.inner + 2 * self.num_groups * self.group_dim
        linear = hidden * self.in_proj_width() + self.inner * hidden
        per_head = 3 if self.kind == "mamba2" else 2
        norm = self.inner if self.kind == "mamba2" else self.head_dim
        return linear, conv_dim * self.conv_kernel + per_head * self.num_heads + norm


@dataclass(frozen=True)
class LayerKind:
    """One kind of decoder layer and how many of the model's layers are of it: its token
    mixer (``attention``, one of ``MIXERS``: ``gqa`` grouped-query, every token's K and
    V; ``mla`` latent; ``sliding`` and ``chunked`` with ``window`` tokens; ``gdn`` and
    ``mamba2`` linear state; ``none``), FFN ``dense`` (SwiGLU of ``intermediate_size``),
    ``moe`` (routed experts plus shared ones) or ``none``."""

    attention: str
    ffn: str
    intermediate_size: int
    count: int
    window: int = 0
