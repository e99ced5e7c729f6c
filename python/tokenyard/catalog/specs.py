"""The two catalog records, ``ModelSpec`` and ``DeviceSpec``, and their validation (the
layer-kind records a ``ModelSpec`` holds are in ``layers.py``).

A spec is valid once built: its constructor checks every field's type and range and raises
a ``ConfigError`` whose ``field`` is ``models.<name>.<field>`` (or ``devices.…``), the key
the value has in a catalog file.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from tokenyard._checks import check_key_int
from tokenyard.catalog.layers import (
    ATTENTION_MIXERS,
    FFNS,
    LINEAR_MIXERS,
    MIXERS,
    LayerKind,
    LinearAttention,
    MlaAttention,
    SparseIndexer,
    _fail,
    check_count,
)
from tokenyard.catalog.quant import Quantization
from tokenyard.catalog.vision import VisionEncoder
from tokenyard.errors import ConfigError

#: The most GPUs one parallel dimension of a replica spans.
MAX_PARALLELISM = 512

__all__ = [
    # The layer-kind names the planner takes from here (defined in ``layers.py``).
    "ATTENTION_MIXERS",
    "DEVICE_FIELDS",
    "LINEAR_MIXERS",
    "MODEL_FIELDS",
    "DeviceSpec",
    "LayerKind",
    "ModelSpec",
]

#: Field name -> kind, for the catalog-file fields of a model (``name`` is the table key).
MODEL_FIELDS: dict[str, str] = {
    "num_layers": "int",
    "hidden_size": "int",
    "num_heads": "int",
    "num_kv_heads": "int",
    "head_dim": "int",
    "intermediate_size": "int",
    "vocab_size": "int",
    "context_length": "int",
    "tied_embeddings": "bool",
    "attention_bias": "bool",
    "qk_norm": "bool",
    "num_experts": "int",
    "experts_per_token": "int",
    "source": "str",
}

#: Field name -> kind, for the catalog-file fields of a device (``name`` is the table key).
DEVICE_FIELDS: dict[str, str] = {
    "memory_gib": "float",
    "dense_bf16_tflops": "float",
    "dense_fp8_tflops": "float",
    "dense_fp4_tflops": "float",
    "memory_bandwidth_gbps": "float",
    "interconnect_gbps": "float",
    "interconnect_latency_us": "float",
    "host_link_gbps": "float",
    "network_gbps": "float",
    "network_latency_us": "float",
    "price_per_hour": "float",
    "price_source": "str",
    "power_w": "float",
    "idle_power_w": "float",
    "nvlink_domain": "int",
    "source": "str",
    "aliases": "str_list",
}


def _check_types(obj: Any, kinds: dict[str, str], where: str) -> None:
    for field, kind in kinds.items():
        value = getattr(obj, field)
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
            problem = "must be an integer"
        elif kind == "bool":
            ok = isinstance(value, bool)
            problem = "must be true or false"
        elif kind == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and math.isfinite(value)
            problem = "must be a finite number"
        elif kind == "str":
            ok = isinstance(value, str)
            problem = "must be a string"
        else:  # str_list
            ok = isinstance(value, tuple) and all(isinstance(v, str) and v for v in value)
            problem = "must be a list of non-empty strings"
        if not ok:
            raise _fail(where, field, problem, value)


def _check_at_least(obj: Any, fields: tuple[str, ...], minimum: int, noun: str, where: str) -> None:
    for field in fields:
        value = getattr(obj, field)
        if value < minimum:
            raise _fail(where, field, f"must be {noun} >= {minimum}", value)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The shape of a Llama-style decoder (RMSNorm, rotary attention, SwiGLU MLP), as in the
    model's Hugging Face ``config.json``.

    ``intermediate_size`` is per expert for a mixture of experts (``num_experts > 1``);
    ``attention_bias`` means the q, k and v projections carry a bias (Qwen2 style);
    ``qk_norm`` that queries and keys each pass an RMSNorm (Qwen3 style); its
    ``2 * head_dim`` weights per layer are left out of the parameter counts, as out of the
    memory planner's (16 384 of Qwen3-32B's 32.8 billion).

    Raises:
        ConfigError: a field has the wrong type or an impossible value; ``field`` is
            ``models.<name>.<field>``.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    #: The longest sequence (prompt + output) the model takes: its config's
    #: ``max_position_embeddings``. The default ``max_model_len`` of a deployment.
    context_length: int
    tied_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 1
    experts_per_token: int = 1
    source: str = ""
    #: The checkpoint's quantization (its ``quantization_config``; ``catalog/quant.py``),
    #: None for 16-bit weights. Read from Hugging Face configs, not from catalog files.
    quantization: Quantization | None = None
    #: Multi-head latent attention in every layer (DeepSeek-V2/V3, Kimi-K2); None: GQA.
    #: ``num_kv_heads`` and ``head_dim`` then only record the config (the latent is what
    #: is cached). Read from Hugging Face configs, as are the four fields below.
    mla: MlaAttention | None = None
    #: MoE layers' shared experts (DeepSeek's ``n_shared_experts``), each of
    #: ``intermediate_size``, run by every token beside the routed ones.
    num_shared_experts: int = 0
    #: The first layers with a dense FFN instead of experts (``first_k_dense_replace``),
    #: of ``dense_intermediate_size``; after them a layer ``i`` is MoE when ``i %
    #: moe_layer_freq == 0`` (HF's DeepSeek rule), dense otherwise.
    num_dense_layers: int = 0
    dense_intermediate_size: int = 0
    moe_layer_freq: int = 1
    #: DSA's indexer beside every MLA layer (DeepSeek-V3.2, GLM-5); None: dense MLA.
    indexer: SparseIndexer | None = None
    #: Multi-token-prediction layers the checkpoint ships (``num_nextn_predict_layers``,
    #: Qwen's ``mtp_num_hidden_layers``): not counted in the sizes (the published ones
    #: leave them out); vLLM loads them only as the ``mtp`` speculative drafter
    #: (``mtp_drafter()``).
    num_mtp_layers: int = 0
    #: This spec is an MTP module (``mtp_drafter()``): its one layer also concatenates the
    #: token's embedding with the previous hidden state (two RMSNorms, ``h`` each) and
    #: projects them back (``eh_proj``, ``2h x h``).
    mtp_module: bool = False
    #: Each layer's token mixer (one of ``MIXERS``), from the config's ``layer_types``,
    #: ``hybrid_override_pattern`` or ``no_rope_layers``; empty: every layer ``gqa`` (or
    #: ``mla``). Read from Hugging Face configs, as are the fields below.
    layer_types: tuple[str, ...] = ()
    #: Each layer's FFN (one of ``FFNS``) where the config lists them (Nemotron-H's
    #: pattern, Llama 4's ``interleave_moe_layer_step``); empty: the DeepSeek rule above.
    ffn_types: tuple[str, ...] = ()
    #: The window of ``sliding`` layers and the chunk of ``chunked`` ones, in tokens.
    sliding_window: int = 0
    attention_chunk_size: int = 0
    #: The ``gqa`` (global) layers' KV heads and head dim where they differ from the
    #: sliding ones (Gemma 4: ``num_global_key_value_heads``, ``global_head_dim``), 0:
    #: the same; ``attention_k_eq_v``: those layers have no ``v_proj`` (V is K).
    global_num_kv_heads: int = 0
    global_head_dim: int = 0
    attention_k_eq_v: bool = False
    #: ``q_proj`` also produces a per-head output gate (Qwen3-Next, Qwen3.5).
    attention_output_gate: bool = False
    #: The linear-attention layers' shape (``gdn`` or ``mamba2`` layers).
    linear: LinearAttention | None = None
    #: The shared experts' intermediate size in all (Qwen's
    #: ``shared_expert_intermediate_size``, Nemotron-H's
    #: ``moe_shared_expert_intermediate_size``); 0: ``num_shared_experts x
    #: intermediate_size``.
    shared_expert_intermediate_size: int = 0
    #: The shared experts are loaded whole on every GPU under vLLM 0.33's sequence-parallel
    #: MoE (``ParallelConfig.use_sequence_parallel_moe``: expert parallelism with TP > 1
    #: and DP > 1), each GPU running them on its 1/TP of the tokens: DeepSeek-V2/V3's,
    #: Qwen3-Next/3.5's, Llama 4's and Nemotron-H's shared-expert MLPs take
    #: ``disable_tp=is_sequence_parallel``. False: split by TP there too (Gemma 4's dense
    #: MLP beside its experts, which vLLM builds without sequence parallelism).
    sequence_parallel_shared_experts: bool = True
    #: The shared experts are handed to vLLM 0.33's ``FusedMoE`` (``shared_experts=``),
    #: which runs them on an auxiliary stream beside the routed path; False: a dense MLP
    #: the layer runs on the main stream before its experts, added in full (Gemma 4's
    #: ``self.mlp`` in ``Gemma4DecoderLayer.forward``; the model sets no shared experts).
    shared_experts_overlap: bool = True
    #: The shared expert's output is scaled by ``sigmoid(x W)``, ``W`` a 16-bit ``h x 1``
    #: ``ReplicatedLinear`` (Qwen2-MoE, Qwen3-Next and Qwen3.5's ``shared_expert_gate``,
    #: vLLM's ``Qwen2MoeMLP.expert_gate``).
    shared_expert_gate: bool = False
    #: SwiGLU (gate, up, down) FFNs; false: an MLP of up and down only (Nemotron-H's relu2).
    gated_ffn: bool = True
    #: A vision-language model's vision tower (its ``vision_config``; Qwen2.5-VL, Qwen3-VL),
    #: counted in the parameters and the weights; None: a text-only model.
    vision: VisionEncoder | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise _fail("models", "name", "must be a non-empty string", self.name)
        where = f"models.{self.name}"
        _check_types(self, MODEL_FIELDS, where)
        positive = tuple(f for f, kind in MODEL_FIELDS.items() if kind == "int")
        _check_at_least(self, positive, 1, "an integer", where)
        if self.num_heads % self.num_kv_heads:
            raise _fail(
                where,
                "num_kv_heads",
                f"must divide num_heads ({self.num_heads})",
                self.num_kv_heads,
            )
        if self.experts_per_token > self.num_experts:
            raise _fail(
                where,
                "experts_per_token",
                f"must be <= num_experts ({self.num_experts})",
                self.experts_per_token,
            )
        if self.mla is not None and not isinstance(self.mla, MlaAttention):
            raise _fail(where, "mla", "must be an MlaAttention or None", self.mla)
        if self.vision is not None and not isinstance(self.vision, VisionEncoder):
            raise _fail(where, "vision", "must be a VisionEncoder or None", self.vision)
        if self.indexer is not None and (
            not isinstance(self.indexer, SparseIndexer) or self.mla is None
        ):
            raise _fail(where, "indexer", "must be a SparseIndexer beside MLA", self.indexer)
        for field, low in (
            ("num_shared_experts", 0),
            ("num_dense_layers", 0),
            ("dense_intermediate_size", 0),
            ("moe_layer_freq", 1),
            ("num_mtp_layers", 0),
        ):
            check_count(where, field, getattr(self, field), low)
        if self.num_dense_layers > self.num_layers:
            raise _fail(
                where,
                "num_dense_layers",
                f"must be <= num_layers ({self.num_layers})",
                self.num_dense_layers,
            )
        self._check_layers(where)
        if self.num_experts == 1 and (self.num_shared_experts or self.num_dense_layers):
            raise _fail(
                where,
                "num_shared_experts" if self.num_shared_experts else "num_dense_layers",
                "needs routed experts (num_experts > 1)",
                self.num_shared_experts or self.num_dense_layers,
            )

    def _check_layers(self, where: str) -> None:
        for field, choices in (("layer_types", MIXERS), ("ffn_types", FFNS)):
            listed = getattr(self, field)
            if not isinstance(listed, tuple) or (listed and len(listed) != self.num_layers):
                raise _fail(where, field, f"must list num_layers ({self.num_layers}) kinds", listed)
            bad = sorted({k for k in listed if k not in choices}, key=str)
            if bad:
                raise _fail(where, field, f"kinds must be among {', '.join(choices)}", bad)
        for field in ("sliding_window", "attention_chunk_size", "global_num_kv_heads"):
            check_count(where, field, getattr(self, field), 0)
        mixers = set(self.mixers())
        for kind, field in (("sliding", "sliding_window"), ("chunked", "attention_chunk_size")):
            if kind in mixers and getattr(self, field) < 1:
                raise _fail(where, field, f"must be >= 1 with {kind} layers", getattr(self, field))
        if mixers & set(LINEAR_MIXERS) and (
            not isinstance(self.linear, LinearAttention) or self.linear.kind not in mixers
        ):
            raise _fail(where, "linear", "must give the linear layers' shape", self.linear)

    def mixers(self) -> tuple[str, ...]:
        """Each layer's token mixer (``MIXERS``)."""
        if self.layer_types:
            return self.layer_types
        return ("mla" if self.mla is not None else "gqa",) * self.num_layers

    def ffns(self) -> tuple[str, ...]:
        """Each layer's FFN (``FFNS``): as listed, else none with experts for a dense
        model; else MoE from ``num_dense_layers`` on where ``moe_layer_freq`` divides."""
        if self.ffn_types:
            return self.ffn_types
        if self.num_experts == 1:
            return ("dense",) * self.num_layers
        first = self.num_dense_layers
        return tuple(
            "moe" if i >= first and i % self.moe_layer_freq == 0 else "dense"
            for i in range(self.num_layers)
        )

    @property
    def num_moe_layers(self) -> int:
        """Layers with experts: none for a dense model; else those from
        ``num_dense_layers`` on whose index ``moe_layer_freq`` divides (or as listed)."""
        return self.ffns().count("moe")

    def window_of(self, mixer: str) -> int:
        """The keys a query of a ``mixer`` layer reads at most (0: every one)."""
        return {"sliding": self.sliding_window, "chunked": self.attention_chunk_size}.get(mixer, 0)

    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """The model as a sequence of layer kinds, each with its count, in the order of
        their first layer (DeepSeek's dense FFN layers first)."""
        counts: dict[tuple[str, str, int], int] = {}
        dense_inter = self.dense_intermediate_size or self.intermediate_size
        for mixer, ffn in zip(self.mixers(), self.ffns(), strict=True):
            inter = {"dense": dense_inter, "moe": self.intermediate_size}.get(ffn, 0)
            if ffn == "dense" and self.num_experts == 1:
                inter = self.intermediate_size
            key = (mixer, ffn, inter)
            counts[key] = counts.get(key, 0) + 1
        return tuple(
            LayerKind(mixer, ffn, inter, count, self.window_of(mixer))
            for (mixer, ffn, inter), count in counts.items()
        )

    def kv_shape(self, mixer: str) -> tuple[int, int]:
        """(KV heads, head dim) of an attention mixer's layers: the ``gqa`` (global)
        layers' own where the config gives them (Gemma 4)."""
        if mixer == "gqa":
            return (
                self.global_num_kv_heads or self.num_kv_heads,
                self.global_head_dim or self.head_dim,
            )
        return self.num_kv_heads, self.head_dim

    def _attention_parameters(self, mixer: str = "gqa") -> int:
        h = self.hidden_size
        if mixer == "none":
            return 0
        if mixer in LINEAR_MIXERS and self.linear is not None:
            return sum(self.linear.parameters(h))
        if self.mla is not None:
            indexer = self.indexer.parameters(h, self.mla.q_lora_rank) if self.indexer else ()
            return sum(self.mla.split_parameters(h, self.num_heads)) + sum(indexer)
        kv_heads, head_dim = self.kv_shape(mixer)
        q, kv = self.num_heads * head_dim, kv_heads * head_dim
        kv_proj = kv if mixer == "gqa" and self.attention_k_eq_v else 2 * kv
        gate = q if self.attention_output_gate else 0
        attention = h * (q + gate + kv_proj) + q * h  # q (and its gate), k, v, then o
        if self.attention_bias:
            attention += q + kv_proj
        return attention

    @property
    def shared_intermediate(self) -> int:
        """All shared experts' intermediate size together (0 without any)."""
        if not self.num_shared_experts:
            return 0
        return self.shared_expert_intermediate_size or (
            self.num_shared_experts * self.intermediate_size
        )

    def shared_experts_sequence_parallel(self, tp: int, ep: int, dp: int) -> int:
        """How many ways the tokens of a MoE layer's shared experts are split: ``tp``
        under vLLM 0.33's sequence-parallel MoE (``use_sequence_parallel_moe``: expert
        parallelism with TP > 1 and DP > 1) for a model whose shared experts take it
        (``sequence_parallel_shared_experts``), each GPU running them whole on its 1/TP of
        the tokens; else 1, the experts' width split by TP instead."""
        if ep > 1 and dp > 1 and self.sequence_parallel_shared_experts:
            return tp
        return 1

    def _ffn_parameters(self, kind: LayerKind, experts: int) -> int:
        h = self.hidden_size
        matrices = 3 if self.gated_ffn else 2
        if kind.ffn == "none":
            return 0
        if kind.ffn == "dense":
            return matrices * h * kind.intermediate_size
        mlp = matrices * h * (kind.intermediate_size * experts + self.shared_intermediate)
        return mlp + h * self.num_experts  # gate, up, down per expert; the router

    def _edge_parameters(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return embeddings + self.hidden_size  # input embeddings, lm_head, final norm

    def check_layout(self, tensor_parallel_size: int, num_pipeline_stages: int) -> None:
        """Raises ConfigError (field ``replica.tensor_parallel_size`` or
        ``replica.num_pipeline_stages``) unless TP divides the attention heads and PP the
        layers, both integers >= 1."""
        for field, value, parts, noun in (
            ("tensor_parallel_size", tensor_parallel_size, self.num_heads, "attention heads"),
            ("num_pipeline_stages", num_pipeline_stages, self.num_layers, "layers"),
        ):
            check_key_int(f"replica.{field}", value, low=1, high=MAX_PARALLELISM)
            if parts % value:
                raise ConfigError(
                    f"replica.{field}: {value} does not divide the {parts} {noun} of {self.name}",
                    field=f"replica.{field}",
                    value=str(value),
                )

    def check_expert_parallel(self, expert_parallel_size: int) -> None:
        """Raises ConfigError (field ``replica.expert_parallel_size``) unless EP is 1, or
        the model has routed experts (``num_experts > 1``) and EP divides them: each EP
        rank holds ``num_experts / EP`` whole experts (vLLM's ``FusedMoE`` under
        ``--enable-expert-parallel`` without redundant experts)."""
        field = "replica.expert_parallel_size"
        ep = expert_parallel_size
        check_key_int(field, ep, low=1, high=MAX_PARALLELISM)
        if ep == 1:
            return
        if self.num_experts == 1:
            raise ConfigError(
                f"{field}: expert parallelism needs a mixture-of-experts model; {self.name} is "
                f"dense (num_experts 1), got {ep}",
                field=field,
                value=str(ep),
            )
        if self.num_experts % ep:
            raise ConfigError(
                f"{field}: {ep} does not divide the {self.num_experts} routed experts of "
                f"{self.name} (each EP rank holds num_experts / EP whole experts)",
                field=field,
                value=str(ep),
            )

    def mtp_drafter(self) -> ModelSpec:
        """The model's MTP module as a one-layer model (vLLM's ``DeepSeekMTP`` /
        ``Qwen3NextMTP``): a decoder layer of the main model's last layer's kind (MLA and
        experts for DeepSeek-V3), ``eh_proj`` and its norms (``mtp_module``), sharing the
        main model's embedding and LM head. vLLM runs it ``k`` times per step for ``k``
        drafts (``num_speculative_tokens`` above ``num_mtp_layers`` reuses the layer).

        Raises:
            ConfigError: the model has no MTP layers (field ``replica.speculative.method``).
        """
        if not self.num_mtp_layers:
            raise ConfigError(
                f"replica.speculative.method: 'mtp' needs a model with multi-token-prediction "
                f"layers (num_nextn_predict_layers or mtp_num_hidden_layers in its config); "
                f"{self.name} has none, got 'mtp'",
                field="replica.speculative.method",
                value="'mtp'",
            )
        mixer = "gqa" if "gqa" in self.mixers() else self.mixers()[-1]
        ffn = self.ffns()[-1]
        return dataclasses.replace(
            self,
            name=f"{self.name}:mtp",
            num_layers=1,
            num_dense_layers=0 if ffn == "moe" else min(self.num_dense_layers, 1),
            moe_layer_freq=1,
            layer_types=(mixer,) if self.layer_types else (),
            ffn_types=(ffn,) if self.ffn_types else (),
            num_mtp_layers=0,
            mtp_module=True,
        )

    def _parameters(self, experts: int) -> int:
        total = self._edge_parameters()
        if self.vision is not None:  # the vision tower runs for every image
            total += self.vision.parameters()
        for kind in self.layer_kinds():
            # An RMSNorm before the mixer and before the FFN (one for a one-part layer).
            norms = (kind.attention != "none") + (kind.ffn != "none")
            layer = self._attention_parameters(kind.attention) + norms * self.hidden_size
            total += kind.count * (layer + self._ffn_parameters(kind, experts))
        return total

    def num_parameters(self) -> int:
        """All weights: every layer with all its experts, the embeddings and the final norm,
        the vision tower if any (not the MTP layers, which published sizes leave out)."""
        return self._parameters(self.num_experts)

    def num_active_parameters(self) -> int:
        """Weights one token passes through: ``experts_per_token`` routed experts (and the
        shared ones) per MoE layer (equal to ``num_parameters()`` for a dense model). The
        router and the embeddings count in full."""
        return self._parameters(self.experts_per_token)


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One accelerator, from its vendor's datasheet.

    ``memory_gib`` is the marketed capacity (80 for an "80 GB" GPU), used as GiB by the
    memory planner; ``dense_bf16_tflops`` is without sparsity, as are
    ``dense_fp8_tflops`` and ``dense_fp4_tflops`` (0: the tensor cores have no such
    precision, or it is not known; the roofline then computes at BF16); the two bandwidths are in
    GB/s (10^9 bytes per second); ``interconnect_gbps`` is one GPU's GPU-to-GPU bandwidth as
    the vendor quotes it (both directions together), used by the all-reduce ring model.
    ``price_per_hour`` is USD per GPU-hour (0 = unknown), illustrative: set your own.

    Raises:
        ConfigError: a field has the wrong type or an impossible value; ``field`` is
            ``devices.<name>.<field>``.
    """

    name: str
    memory_gib: float
    dense_bf16_tflops: float
    memory_bandwidth_gbps: float
    interconnect_gbps: float
    #: FP8 and FP4 tensor-core peaks without sparsity; 0 = no such tensor cores (FP8 before
    #: Hopper and Ada, FP4 before Blackwell) or unknown.
    dense_fp8_tflops: float = 0.0
    dense_fp4_tflops: float = 0.0
    interconnect_latency_us: float = 10.0
    #: Host-to-GPU link (PCIe) in GB/s, one direction; 0 = unknown.
    host_link_gbps: float = 0.0
    #: One GPU's share of its node's network (its NIC) in GB/s, one direction, as clusters
    #: of this GPU are usually built; 0 = unknown. KV transfers between nodes use it.
    network_gbps: float = 0.0
    network_latency_us: float = 0.0
    price_per_hour: float = 0.0
    price_source: str = ""
    #: Board power (TDP) in W, drawn busy at the most; 0 = unknown. ``idle_power_w``: the
    #: draw with a model loaded and nothing running; 0 = modelled from ``power_w``
    #: (``tokenyard.recommend.cost``).
    power_w: float = 0.0
    idle_power_w: float = 0.0
    #: GPUs one NVLink (NVSwitch) domain joins, which an expert-parallel all-to-all spans
    #: without the network: 8 on HGX/DGX boards, 72 on a GB200/GB300 NVL72 rack. An EP
    #: group over more GPUs spans ``ceil(EP / nvlink_domain)`` nodes (the ``node_num`` of
    #: the measured all-to-all tables).
    nvlink_domain: int = 8
    source: str = ""
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise _fail("devices", "name", "must be a non-empty string", self.name)
        where = f"devices.{self.name}"
        _check_types(self, DEVICE_FIELDS, where)
        positive = ("memory_gib", "dense_bf16_tflops", "memory_bandwidth_gbps", "interconnect_gbps")
        for field in positive:
            if getattr(self, field) <= 0:
                raise _fail(where, field, "must be a number > 0", getattr(self, field))
        _check_at_least(
            self,
            (
                "dense_fp8_tflops",
                "dense_fp4_tflops",
                "interconnect_latency_us",
                "host_link_gbps",
                "network_gbps",
                "network_latency_us",
                "price_per_hour",
                "power_w",
                "idle_power_w",
            ),
            0,
            "a number",
            where,
        )
        if self.nvlink_domain < 1:
            raise _fail(where, "nvlink_domain", "must be an integer >= 1", self.nvlink_domain)
        if self.power_w and self.idle_power_w > self.power_w:
            raise _fail(
                where,
                "idle_power_w",
                f"must be at most power_w ({self.power_w} W), the most the GPU draws",
                self.idle_power_w,
            )


def required_fields(spec: type[ModelSpec] | type[DeviceSpec]) -> tuple[str, ...]:
    """The fields a catalog-file entry must set (``name`` comes from the table key)."""
    return tuple(
        f.name
        for f in dataclasses.fields(spec)
        if f.name != "name"
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
