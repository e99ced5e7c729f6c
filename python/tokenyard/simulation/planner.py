"""The memory planner (seed 000 §12): how much KV cache a replica has once its share of the
weights is loaded, and so how many requests it can hold.

A replica is ``TP x PP`` devices: ``PP`` pipeline stages of ``num_layers / PP`` layers, each
stage split over ``TP`` tensor-parallel workers. Per worker (``h`` hidden size, ``d`` head
dim, ``kv = ceil(num_kv_heads / TP)``: KV heads are replicated once ``TP > num_kv_heads``):

    layer   = h*(heads/TP)*d*2 [q, o] + h*kv*d*2 [k, v] (+ (heads/TP + 2 kv)*d biases)
              + 3*h*ceil(inter/TP)*experts [SwiGLU] + h*experts [router, MoE only] + 2*h

A model of several layer kinds (``ModelSpec.layer_kinds()``: DeepSeek's dense FFN layers
before its MoE ones) sums each kind's layer over its count; a MoE layer's experts are its
routed ones plus ``num_shared_experts``, each split by TP. Under expert parallelism
(``expert_parallel_size`` EP > 1, vLLM's ``--enable-expert-parallel``) a GPU holds instead
``num_experts / EP`` routed experts whole (``3*h*inter`` each) and the shared experts at
``shared_inter // TP`` (whole with TP > 1 and DP > 1: vLLM's sequence-parallel MoE,
``ModelSpec.shared_experts_sequence_parallel``, as the predictors price them); attention,
dense layers, embeddings and the router as under TP. With attention data parallelism
(EP = TP x DP) the plan is one DP rank's. DP without EP (EP 1, DP > 1: vLLM 0.33's
``FusedMoEParallelConfig.make`` with ``use_ep`` false) splits every routed expert's
intermediate over all ``TP x DP`` GPUs of the replica, ``ceil(inter/(TP x DP))`` each;
the shared experts stay split by the attention TP. Multi-head
latent attention (``ModelSpec.mla``, ``n = heads/TP``, ``r = qk_nope + qk_rope``):

    attention = h*q_lora + h*(kv_lora + qk_rope) [a projections, on every rank]
                + q_lora*n*r [q_b; h*n*r as q_proj without q_lora]
                + kv_lora*n*(qk_nope + v) [kv_b] + n*v*h [o] + q_lora + kv_lora [norms]
    first   = ceil(vocab/TP)*h                          [input embeddings, first stage]
    last    = ceil(vocab/TP)*h + h                      [lm_head and final norm, last stage]
    params  = layers/PP * layer + (first + last if PP == 1 else max(first, last))

(with tied embeddings and ``PP == 1`` the lm_head is the embedding, counted once). Then

    weight bytes per device = params x bytes(weight_dtype)     [the worst stage]
    usable                  = memory_gib x 2^30 x (1 - memory_margin_fraction)
    available KV bytes      = usable - weight bytes per device - reserved bytes
                              [reserved: LoRA slots, docs/lora.md]
    KV bytes per token      = 2 [K and V] x bytes(kv_cache_dtype) x d x kv x layers / PP
                              [MLA: (kv_lora + qk_rope) x bytes x layers / PP, the same
                              on every TP rank: one latent head, not split; with DSA's
                              indexer (DeepSeek-V3.2, GLM-5) plus its key per layer,
                              index_head_dim FP8 bytes + 4 per 128 (fp32 scales),
                              whatever the KV dtype: vLLM's DeepseekV32IndexerCache]
    max_batch_size          = available // (KV bytes per token x max_request_tokens)
    num_blocks              = available // (KV bytes per token x block_size)

Every device of a replica holds the same tokens' KV for its own layers and heads, so the
device's pool is the replica's. Bytes per value: fp32 4, fp16/bf16 2, fp8 (e4m3, e5m2) 1,
int8 1, int4 0.5 (a plain ``weight_dtype`` takes every weight at that size, scales not
counted; ``auto`` is bf16). A ``quantization`` (a quantized checkpoint's, or
``replica.quantization``; ``catalog/quant.py``) prices the decoder layers' linear weights
(q, k, v, o, the MLP or experts) at its ``bytes_per_weight``, scales included (FP8 1,
block FP8 1 + 4/16384, NVFP4 0.5 + 1/16, MXFP4 0.5 + 1/32, AWQ/GPTQ int4 0.5 + 2.5/128),
and the rest (embeddings, LM head, norms, biases, router) at bf16's 2, as vLLM loads them.
Activations, CUDA graphs and the allocator's slack are what ``memory_margin_fraction`` is
for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenyard._checks import check_key_int
from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.catalog.quant import Quantization
from tokenyard.catalog.specs import ATTENTION_MIXERS, LINEAR_MIXERS, LayerKind
from tokenyard.errors import ConfigError

__all__ = [
    "DTYPE_BYTES",
    "KV_CACHE_DTYPES",
    "KvGroup",
    "MemoryPlan",
    "dtype_bytes",
    "hybrid_kv_words",
    "indexer_bytes_per_token_layer",
    "kv_groups",
    "kv_values_per_token_layer",
    "parameters_per_device",
    "plan_memory",
]

#: Bytes per value of each weight dtype.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "int4": 0.5,
}

#: The KV cache dtypes: every weight dtype but int4, and ``auto`` (the compute dtype).
KV_CACHE_DTYPES = ("auto", *(d for d in DTYPE_BYTES if d != "int4"))


@dataclass(frozen=True)
class MemoryPlan:
    """One device's memory (every device of the replica has the same).

    ``max_request_slots`` is ``num_blocks``: requests resident at once if each held only
    its first block, the upper bound for a scheduler's ``max_num_seqs``.
    """

    #: Weights on the fullest device (the stage with the embeddings or the lm_head).
    parameter_bytes_per_device: int
    kv_bytes_per_token: int
    available_kv_bytes: int
    #: Requests that fit at once if each grows to ``max_request_tokens``.
    max_batch_size: int
    num_blocks: int
    #: One copy of all the weights (the whole replica without TP/PP duplicates).
    parameter_bytes_total: int = 0
    #: ``num_blocks x block_size``.
    max_kv_tokens: int = 0
    max_request_slots: int = 0
    #: The layers by KV group (``kv_groups``), and the linear-attention state held for
    #: ``max_num_seqs`` requests out of the KV memory (vLLM 0.33 takes it from the shared
    #: block pool as requests run; the simulator's pool holds no per-request state).
    groups: tuple[KvGroup, ...] = ()
    state_bytes_per_request: int = 0
    reserved_state_bytes: int = 0
    #: vLLM's hybrid allocator's KV cache groups when the plan uses them
    #: (``hybrid_kv.plan_hybrid``; ``num_blocks`` is then its pool), with the banner's words
    #: on them; empty: one group, every attention layer as full attention.
    kv_cache_groups: tuple[KvGroup, ...] = ()
    kv_groups_note: str = ""
    #: Tokens per block of ``kv_cache_groups``: vLLM's attention block aligned to the Mamba
    #: page where the groups hold linear-attention state (``hybrid_kv.aligned_block_size``);
    #: 0: the scheduler's ``block_size``. With ``kv_group_block_sizes`` it is vLLM's hash
    #: block size (their gcd), the step scheduler's ``block_size``.
    kv_block_size: int = 0
    #: Each of ``kv_cache_groups``' block size where they differ (Gemma 4's: vLLM 0.33's
    #: ``unify_kv_cache_spec_page_size`` grows the smaller pages' block,
    #: ``hybrid_kv_pages.plan_pages``); empty: every group's is ``kv_block_size``.
    kv_group_block_sizes: tuple[int, ...] = ()


def _dtype_bytes(dtype: str, choices: tuple[str, ...], field: str) -> float:
    if dtype not in choices:
        raise ConfigError(
            f"{field}: unknown dtype {dtype!r}; expected one of {', '.join(choices)}",
            field=field,
            value=repr(dtype),
        )
    return DTYPE_BYTES[dtype]


def dtype_bytes(weight_dtype: str, kv_cache_dtype: str = "auto") -> tuple[float, int]:
    """Bytes per weight and per KV value. ``auto`` weights are bf16 (a quantized
    checkpoint's are its ``Quantization``'s, which the caller resolves). ``auto`` KV is the
    model's compute dtype, as in vLLM: the weight dtype for fp32, fp16 and bf16 weights,
    bf16 for quantised ones.

    Raises:
        ConfigError: an unknown dtype (field ``replica.dtype`` or ``replica.kv_cache_dtype``).
    """
    weight_dtype = "bf16" if weight_dtype == "auto" else weight_dtype
    weight_bytes = _dtype_bytes(weight_dtype, ("auto", *DTYPE_BYTES), "replica.dtype")
    kv_cache_dtype = _resolve_kv_dtype(weight_dtype, kv_cache_dtype)
    kv_bytes = int(_dtype_bytes(kv_cache_dtype, KV_CACHE_DTYPES[1:], "replica.kv_cache_dtype"))
    return weight_bytes, kv_bytes


def _resolve_kv_dtype(weight_dtype: str, kv_cache_dtype: str) -> str:
    if kv_cache_dtype != "auto":
        return kv_cache_dtype
    return weight_dtype if weight_dtype in ("fp32", "fp16", "bf16") else "bf16"


def parameters_per_device(
    model: ModelSpec, tp: int, pp: int, ep: int = 1, dp: int | None = None
) -> int:
    """Weights (a count, not bytes) on the fullest device of a ``TP x PP`` replica (its
    experts split over ``ep`` GPUs under expert parallelism, or by ``TP x dp`` under
    attention DP without it). ``dp`` unset: ``ep / TP`` under expert parallelism (vLLM's
    EP = TP x DP), else 1."""
    if dp is None:
        dp = ep // tp if ep > tp else 1
    return sum(_parameter_split(model, tp, pp, ep, dp))


def _attention_split(model: ModelSpec, tp: int, mixer: str = "gqa") -> tuple[int, int]:
    """(linear weights, other weights) of one layer's token mixer on one TP rank: its
    attention (a ``gqa`` layer at the global shape where the config gives one), or its
    linear-attention projections (split by heads) and conv, per-head and norm weights."""
    h = model.hidden_size
    if mixer == "none":
        return 0, 0
    if mixer in LINEAR_MIXERS and model.linear is not None:
        linear, other = model.linear.parameters(h)
        return math.ceil(linear / tp), math.ceil(other / tp)
    if model.mla is not None:  # the a projections replicated, the rest split by heads
        replicated, split, norms = model.mla.split_parameters(h, model.num_heads // tp)
        if model.indexer is not None:  # DSA's indexer: replicated on every rank
            indexer, indexer_norm = model.indexer.parameters(h, model.mla.q_lora_rank)
            replicated, norms = replicated + indexer, norms + indexer_norm
        return replicated + split, norms
    kv_heads, d = model.kv_shape(mixer)
    q = model.num_heads // tp * d
    kv = math.ceil(kv_heads / tp) * d
    kv_proj = kv if mixer == "gqa" and model.attention_k_eq_v else 2 * kv
    gate = q if model.attention_output_gate else 0
    bias = (q + kv_proj) if model.attention_bias else 0
    return h * (2 * q + gate) + h * kv_proj, bias


def _ffn_split(
    model: ModelSpec, kind: LayerKind, tp: int, ep: int = 1, dp: int = 1
) -> tuple[int, int]:
    """(linear weights, other weights) of one layer's FFN on one GPU. Without expert
    parallelism (``ep`` 1) every expert's (routed and shared) intermediate is split by TP,
    the routed ones by ``TP x dp`` under attention DP (vLLM flattens their TP over the DP
    ranks);
    with it, the GPU holds ``num_experts / ep`` routed experts whole, and the shared
    experts split by the attention TP, replicated across DP ranks, as vLLM 0.33 does with
    TP or DP 1. With TP > 1 and DP > 1 (``ep = TP x DP``) vLLM's sequence-parallel MoE
    (``ParallelConfig.use_sequence_parallel_moe``, on with its default all2all backend)
    builds them whole on every GPU (``DeepseekV2MLP(disable_tp=is_sequence_parallel)``;
    Qwen2MoeMLP, Llama 4's and Nemotron-H's alike), unless the model keeps them split
    (``ModelSpec.sequence_parallel_shared_experts``: Gemma 4). The router is whole on
    every GPU."""
    h, inter = model.hidden_size, math.ceil(kind.intermediate_size / tp)
    m = 3 if model.gated_ffn else 2  # gate, up, down (Nemotron-H: up, down)
    if kind.ffn == "none":
        return 0, 0
    if kind.ffn == "dense":
        return m * h * inter, 0
    # Split by TP, or whole under sequence-parallel MoE: the predictors' rule and rounding
    # (ModelSpec.shared_experts_sequence_parallel; a width TP does not divide, floored).
    sp = model.shared_experts_sequence_parallel(tp, ep, dp)
    shared = m * h * (model.shared_intermediate // (tp // sp))
    if ep == 1:
        routed_inter = math.ceil(kind.intermediate_size / (tp * dp))
        return m * h * routed_inter * model.num_experts + shared, h * model.num_experts
    routed = m * h * kind.intermediate_size * (model.num_experts // ep)
    return routed + shared, h * model.num_experts


def _parameter_split(
    model: ModelSpec, tp: int, pp: int, ep: int = 1, dp: int = 1
) -> tuple[int, int]:
    """(decoder-layer linear weights, every other weight) on the fullest device: the
    first is what a quantized checkpoint quantizes (a vision tower is among the others:
    its linears split by TP, on the first stage, in 16 bits). With layers of several kinds (dense
    FFN layers before MoE ones) the stages' layers are taken as the model's mix, ``1/PP``
    of each kind (exact at PP 1)."""
    model.check_layout(tp, pp)
    model.check_expert_parallel(ep)
    if dp > 1 and model.num_experts == 1:
        raise ConfigError(
            f"replica.data_parallel_size: attention data parallelism shares a MoE model's "
            f"experts between its ranks; {model.name} is dense (num_experts 1), where DP ranks "
            f"are independent engines: set cluster.num_replicas instead, got {dp}",
            field="replica.data_parallel_size",
            value=str(dp),
        )
    h = model.hidden_size
    linear = other = 0
    for kind in model.layer_kinds():
        attention_linear, attention_other = _attention_split(model, tp, kind.attention)
        ffn_linear, ffn_other = _ffn_split(model, kind, tp, ep, dp)
        norms = ((kind.attention != "none") + (kind.ffn != "none")) * h
        linear += kind.count * (attention_linear + ffn_linear)
        other += kind.count * (attention_other + ffn_other + norms)
    vocab_shard = math.ceil(model.vocab_size / tp) * h
    first = vocab_shard
    if model.vision is not None:  # the vision tower, on the first stage, in 16 bits
        first += sum(model.vision.parameter_split(tp))
    last = h + (0 if model.tied_embeddings and pp == 1 else vocab_shard)
    edge = first + last if pp == 1 else max(first, last)
    return math.ceil(linear / pp), math.ceil(other / pp) + edge


def kv_values_per_token_layer(model: ModelSpec, tp: int, mixer: str = "gqa") -> int:
    """KV values one TP rank caches per token and layer: K and V of its
    ``ceil(kv_heads / TP)`` heads (a ``gqa`` layer's at the global shape where the config
    gives one: Gemma 4), or for MLA the whole latent (``kv_lora_rank + qk_rope_head_dim``,
    one head every rank keeps: vLLM's ``MLAAttentionSpec``); none for linear-attention
    and FFN-only layers."""
    if mixer not in ATTENTION_MIXERS:
        return 0
    if model.mla is not None:
        return model.mla.latent_dim
    kv_heads, head_dim = model.kv_shape(mixer)
    return 2 * head_dim * math.ceil(kv_heads / tp)


def indexer_bytes_per_token_layer(model: ModelSpec, mixer: str = "mla") -> int:
    """Bytes DSA's indexer caches per token in one ``mla`` layer, on every TP rank (its
    key is replicated, like the latent); 0 without an indexer."""
    if mixer != "mla" or model.indexer is None:
        return 0
    return model.indexer.cache_bytes


@dataclass(frozen=True)
class KvGroup:
    """One of vLLM's KV cache groups (its hybrid allocator keeps one per attention kind):
    ``layers`` layers of ``mixer`` (``gqa``/``mla`` full, ``sliding``, ``chunked``,
    ``gdn``/``mamba2`` state) on one device, the KV bytes they cache per token, the
    tokens a request keeps in them at most (``window``; 0: all), and for a linear group
    the state bytes per request instead."""

    mixer: str
    layers: int
    bytes_per_token: int
    window: int = 0
    state_bytes_per_request: int = 0


def kv_groups(model: ModelSpec, tp: int, pp: int, kv_bytes: int) -> tuple[KvGroup, ...]:
    """The model's layers on one device (``1/PP`` of each kind) grouped by mixer."""
    counts: dict[str, int] = {}
    for mixer in model.mixers():
        counts[mixer] = counts.get(mixer, 0) + 1
    groups = []
    for mixer, count in counts.items():
        layers = count // pp if count % pp == 0 else math.ceil(count / pp)
        if mixer in ATTENTION_MIXERS:
            per_layer = kv_bytes * kv_values_per_token_layer(model, tp, mixer)
            per_layer += indexer_bytes_per_token_layer(model, mixer)
            groups.append(KvGroup(mixer, layers, per_layer * layers, model.window_of(mixer)))
        elif mixer in LINEAR_MIXERS and model.linear is not None:
            state = model.linear.state_bytes(tp) * layers
            groups.append(KvGroup(mixer, layers, 0, state_bytes_per_request=state))
    return tuple(groups)


def hybrid_kv_words(groups: tuple[KvGroup, ...], request_tokens: int, block_size: int) -> str:
    """What vLLM's hybrid allocator (without ``--disable-hybrid-kv-cache-manager``) would
    hold per request of ``request_tokens`` against what the plan holds (every attention
    layer a full one): a window group keeps at most its window plus a block."""
    parts, full, hybrid = [], 0, 0
    for g in groups:
        if g.state_bytes_per_request:
            parts.append(f"{g.mixer} {g.layers} layers {g.state_bytes_per_request:,} B/request")
            full += g.state_bytes_per_request
            hybrid += g.state_bytes_per_request
            continue
        kept = min(request_tokens, g.window + block_size) if g.window else request_tokens
        window = f" (window {g.window})" if g.window else ""
        parts.append(f"{g.mixer} {g.layers} layers{window} {g.bytes_per_token:,} B/token")
        full += g.bytes_per_token * request_tokens
        hybrid += g.bytes_per_token * kept
    return (
        f"KV groups: {'; '.join(parts)}. A {request_tokens:,}-token request holds "
        f"{full / 2**20:,.1f} MiB as planned (sliding/chunked layers allocated as full "
        f"attention, vLLM --disable-hybrid-kv-cache-manager), {hybrid / 2**20:,.1f} MiB under "
        "vLLM's hybrid allocator"
    )


def _weight_bytes(
    model: ModelSpec,
    tp: int,
    pp: int,
    weight_bytes: float,
    quantization: Quantization | None,
    ep: int = 1,
    dp: int = 1,
) -> int:
    linear, other = _parameter_split(model, tp, pp, ep, dp)
    if quantization is None:
        return math.ceil((linear + other) * weight_bytes)
    if quantization.experts_only:  # gpt-oss MXFP4: only the routed experts quantized
        experts = _routed_expert_weights(model, tp, pp, ep, dp)
        return math.ceil(experts * quantization.bytes_per_weight + (linear - experts + other) * 2)
    return math.ceil(linear * quantization.bytes_per_weight + other * DTYPE_BYTES["bf16"])


def _routed_expert_weights(model: ModelSpec, tp: int, pp: int, ep: int, dp: int = 1) -> int:
    """The routed experts' linear weights on the fullest device."""
    m = 3 if model.gated_ffn else 2
    total = 0
    for kind in model.layer_kinds():
        if kind.ffn == "moe":
            if ep == 1:
                per = m * model.hidden_size * math.ceil(kind.intermediate_size / (tp * dp))
                total += kind.count * per * model.num_experts
            else:
                per = m * model.hidden_size * kind.intermediate_size
                total += kind.count * per * (model.num_experts // ep)
    return math.ceil(total / pp)


def _check_block_split(
    model: ModelSpec, tp: int, ep: int, dp: int, quantization: Quantization | None
) -> None:
    """DP without EP splits each routed expert's intermediate over ``TP x DP`` GPUs; a
    block-quantized FP8 checkpoint needs every share a whole number of blocks, as vLLM
    0.33 requires (``fp8_utils.validate_fp8_block_shape_moe``, a ValueError at load; the
    blocks square, ``group_size = block_n x block_k``). Plain TP's split is not checked
    here (unchanged behaviour)."""
    if dp == 1 or ep > 1 or model.num_experts == 1 or quantization is None:
        return
    if quantization.scheme != "fp8_block" or not quantization.group_size:
        return
    block = math.isqrt(quantization.group_size)
    for kind in model.layer_kinds():
        share = kind.intermediate_size // (tp * dp)
        if kind.ffn == "moe" and (kind.intermediate_size % (tp * dp) or share % block):
            raise ConfigError(
                f"replica.data_parallel_size: without expert parallelism each of "
                f"{model.name}'s experts ({kind.intermediate_size} intermediate) is split over "
                f"TP x DP = {tp * dp} GPUs, {kind.intermediate_size / (tp * dp):g} each, not a "
                f"multiple of the checkpoint's {block}-wide FP8 blocks (vLLM refuses it: "
                f"validate_fp8_block_shape_moe); set expert_parallel_size = {tp * dp} or a "
                f"smaller layout, got {dp}",
                field="replica.data_parallel_size",
                value=str(dp),
            )


def plan_memory(
    model: ModelSpec,
    device: DeviceSpec,
    *,
    tensor_parallel_size: int,
    num_pipeline_stages: int,
    memory_margin_fraction: float,
    max_request_tokens: int,
    block_size: int,
    weight_dtype: str = "bf16",
    kv_cache_dtype: str = "auto",
    reserved_bytes: int = 0,
    quantization: Quantization | None = None,
    expert_parallel_size: int = 1,
    max_num_seqs: int = 0,
    data_parallel_size: int = 1,
) -> MemoryPlan:
    """Sizes one replica's KV pool (formulas in the module docstring).

    Args:
        model, device: catalog entries (``tokenyard.catalog.model``/``device``).
        tensor_parallel_size, num_pipeline_stages: the replica's layout (``TP``, ``PP``).
        memory_margin_fraction: the share of device memory kept free of weights and KV.
        max_request_tokens: the longest request (prompt + output), for ``max_batch_size``.
        block_size: tokens per KV block.
        weight_dtype: one of ``DTYPE_BYTES``, or ``auto`` (bf16, or ``quantization``'s).
            With a ``quantization`` it is not read: resolve the two first
            (``catalog.quant.resolve_quantization``).
        kv_cache_dtype: one of ``KV_CACHE_DTYPES``; ``auto`` is the compute dtype: the
            weight dtype for fp32, fp16 and bf16, else bf16.
        reserved_bytes: other memory per device held before the KV cache (LoRA slots).
        quantization: the weights' quantization: the decoder layers' linear weights at its
            ``bytes_per_weight``, the rest at bf16.
        expert_parallel_size: EP: a MoE model's routed experts split over this many GPUs,
            ``num_experts / EP`` whole experts on each (1: split by TP). With attention
            data parallelism (EP = TP x DP) the plan is one DP rank's: its TP GPUs hold
            its own requests' KV.
        data_parallel_size: DP, attention data parallelism. Without expert parallelism
            (EP 1) the routed experts' intermediate is split over all ``TP x DP`` GPUs.

    Raises:
        ConfigError: a layout that does not divide the model (field
            ``replica.num_pipeline_stages``, ``replica.tensor_parallel_size`` or
            ``replica.expert_parallel_size``), an unknown
            dtype (``replica.dtype``, ``replica.kv_cache_dtype``), a bad size, or a model
            that leaves no room for one request (``replica.device``).
    """
    tp, pp, ep = tensor_parallel_size, num_pipeline_stages, expert_parallel_size
    dp = data_parallel_size
    check_key_int("replica.data_parallel_size", dp, low=1, high=512)
    weight_bytes, kv_bytes = dtype_bytes(weight_dtype, kv_cache_dtype)
    kv_cache_dtype = _resolve_kv_dtype(weight_dtype, kv_cache_dtype)
    if not 0 <= memory_margin_fraction < 1:
        raise ConfigError(
            f"replica.memory_margin_fraction: must be in [0, 1), got {memory_margin_fraction!r}",
            field="replica.memory_margin_fraction",
            value=repr(memory_margin_fraction),
        )
    check_key_int("replica.scheduler.max_request_tokens", max_request_tokens, low=1, high=2**24)
    check_key_int("replica.scheduler.block_size", block_size, low=1, high=2**16)

    _check_block_split(model, tp, ep, dp, quantization)
    parameter_bytes = _weight_bytes(model, tp, pp, weight_bytes, quantization, ep, dp)
    weight_name = quantization.scheme if quantization else weight_dtype
    groups = kv_groups(model, tp, pp, kv_bytes)
    if model.layer_types:
        # Every attention layer as a full one (vLLM --disable-hybrid-kv-cache-manager:
        # sliding and chunked specs promoted to full attention).
        kv_per_token = sum(g.bytes_per_token for g in groups)
    else:
        per_layer = kv_bytes * kv_values_per_token_layer(model, tp)
        per_layer += indexer_bytes_per_token_layer(model, model.mixers()[0])
        kv_per_token = per_layer * (model.num_layers // pp)
    state = sum(g.state_bytes_per_request for g in groups)
    reserved_state = state * max(max_num_seqs, 1) if state else 0
    total = int(device.memory_gib * 1024**3 * (1 - memory_margin_fraction))
    available = total - parameter_bytes - reserved_bytes - reserved_state
    max_batch_size = available // (kv_per_token * max_request_tokens) if available > 0 else 0
    if max_batch_size < 1:
        raise ConfigError(
            f"{model.name} on {device.name} (TP {tp}, PP {pp}{f', EP {ep}' if ep > 1 else ''}"
            f"{f', DP {dp}' if dp > 1 else ''}, "
            f"{weight_name} weights, "
            f"{kv_cache_dtype} KV): {parameter_bytes / 1024**3:.1f} GiB of weights per device "
            f"leave {max(available, 0) / 1024**3:.1f} GiB of the {total / 1024**3:.1f} GiB "
            f"usable, not enough for one request of {max_request_tokens} tokens "
            f"({kv_per_token * max_request_tokens / 1024**3:.2f} GiB of KV)",
            field="replica.device",
            value=device.name,
        )
    num_blocks = available // (kv_per_token * block_size)
    return MemoryPlan(
        parameter_bytes_per_device=parameter_bytes,
        kv_bytes_per_token=kv_per_token,
        available_kv_bytes=available,
        max_batch_size=max_batch_size,
        num_blocks=num_blocks,
        parameter_bytes_total=_weight_bytes(model, 1, 1, weight_bytes, quantization),
        max_kv_tokens=num_blocks * block_size,
        max_request_slots=num_blocks,
        groups=groups,
        state_bytes_per_request=state,
        reserved_state_bytes=reserved_state,
    )
