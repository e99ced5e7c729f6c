"""Hugging Face ``config.json`` files as catalog models, and the configs bundled with
``aiconfigurator-core`` (the ``tokenyard[measured]`` extra), found by repo id.

``config_path`` says which file a model name stands for; ``model_from_config`` reads one
into a ``ModelSpec``. Invariant: a config loads only if its architecture is one of
``SUPPORTED_ARCHITECTURES`` and its layers are of the kinds that family's reader knows
(``_Family``: full attention everywhere, or the sliding, chunked, linear-attention and
FFN layouts of the families that list their layers; routed experts only, except where the
family reads its shared experts and dense layers); anything else is a ConfigError naming
the file and the key that makes it a model tokenyard does not simulate (the architectures
of ``_REFUSED_ARCHITECTURES`` with their own reason, checked against vLLM 0.33's model
code). DeepSeek-V2/V3 (and Kimi-K2, which is a DeepSeek-V3) configs read their multi-head
latent attention, shared experts and leading dense layers into ``ModelSpec.mla`` and its
MoE layout fields, DeepSeek-V3.2 and GLM-5 also their DSA indexer (``ModelSpec.indexer``).
``context_length`` is ``max_position_embeddings`` scaled as vLLM 0.33 scales
``max_model_len`` (``_context_length``). A quantized checkpoint's ``quantization_config``
(or the ``hf_quant_config.json`` beside it) becomes ``ModelSpec.quantization``
(``quant.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

from tokenyard.catalog.layers import LinearAttention, MlaAttention, SparseIndexer
from tokenyard.catalog.quant import read_quantization
from tokenyard.catalog.specs import ModelSpec
from tokenyard.catalog.vision import VisionEncoder
from tokenyard.errors import ConfigError

__all__ = ["SUPPORTED_ARCHITECTURES", "bundled_model_names", "config_path", "model_from_config"]


class _Family(NamedTuple):
    """What one architecture's config does not say in keys."""

    model_type: str
    attention_bias: bool | None = None  # None: the config's attention_bias (default false)
    qk_norm: bool = False
    experts_key: str = ""  # the number of routed experts; "" for a dense model
    intermediate_key: str = "intermediate_size"  # per expert for a MoE
    deepseek: bool = False  # MLA, shared experts, first_k_dense_replace, moe_layer_freq
    #: How the config lays out its layers beyond full attention: "" none; "layer_types"
    #: (gpt-oss, Gemma, Qwen3-Next/3.5), "sliding" (Mistral's sliding_window on every
    #: layer), "llama4" (chunked local + NoPE global), "nemotron_h" (the pattern).
    layers: str = ""
    #: The vision tower under ``vision_config`` (``VisionEncoder.kind``); "" none read.
    vision: str = ""


#: Qwen's MoE configs: the routed experts under num_experts, each moe_intermediate_size wide.
_QWEN_MOE = _Family("", experts_key="num_experts", intermediate_key="moe_intermediate_size")
#: DeepSeek's (and the configs that follow it): n_routed_experts of moe_intermediate_size.
_DEEPSEEK = _Family(
    "", experts_key="n_routed_experts", intermediate_key="moe_intermediate_size", deepseek=True
)

_FAMILIES: dict[str, _Family] = {
    "LlamaForCausalLM": _Family("llama"),
    "MistralForCausalLM": _Family("mistral", layers="sliding"),
    "Qwen2ForCausalLM": _Family("qwen2", attention_bias=True),
    "Qwen3ForCausalLM": _Family("qwen3", qk_norm=True),
    "MixtralForCausalLM": _Family("mixtral", experts_key="num_local_experts"),
    # vLLM 0.33's minimax_m2.py: full GQA in every layer (a partial rotary_dim), a q/k
    # RMSNorm over all heads, num_local_experts experts of intermediate_size, no shared
    # expert (shared_intermediate_size 0, checked), the MTP modules not loaded.
    "MiniMaxM2ForCausalLM": _Family("minimax_m2", qk_norm=True, experts_key="num_local_experts"),
    # vLLM 0.33's mimo.py: a Qwen2ForCausalLM (q, k, v biases) whose mtp_layers it skips.
    "MiMoForCausalLM": _Family("mimo", attention_bias=True),
    "Qwen2MoeForCausalLM": _QWEN_MOE._replace(model_type="qwen2_moe", attention_bias=True),
    "Qwen3MoeForCausalLM": _QWEN_MOE._replace(model_type="qwen3_moe", qk_norm=True),
    "DeepseekV2ForCausalLM": _DEEPSEEK._replace(model_type="deepseek_v2"),
    "DeepseekV3ForCausalLM": _DEEPSEEK._replace(model_type="deepseek_v3"),
    # DeepSeek sparse attention (DSA): a DeepSeek-V3 with an indexer beside each MLA layer.
    "DeepseekV32ForCausalLM": _DEEPSEEK._replace(model_type="deepseek_v32"),
    "GlmMoeDsaForCausalLM": _DEEPSEEK._replace(model_type="glm_moe_dsa"),
    "GptOssForCausalLM": _Family("gpt_oss", experts_key="num_local_experts", layers="types"),
    "Gemma3ForCausalLM": _Family("gemma3_text", qk_norm=True, layers="types"),
    "Gemma4ForConditionalGeneration": _Family(
        "gemma4", qk_norm=True, experts_key="num_experts", layers="types"
    ),
    "Llama4ForConditionalGeneration": _Family(
        "llama4", experts_key="num_local_experts", layers="llama4"
    ),
    "Qwen3NextForCausalLM": _QWEN_MOE._replace(
        model_type="qwen3_next", qk_norm=True, layers="types"
    ),
    "Qwen3_5ForConditionalGeneration": _Family("qwen3_5", qk_norm=True, layers="types"),
    "Qwen3_5MoeForConditionalGeneration": _QWEN_MOE._replace(
        model_type="qwen3_5_moe", qk_norm=True, layers="types"
    ),
    # Vision-language models: the decoder under text_config (Qwen2.5-VL: at the top level),
    # the vision tower under vision_config.
    "Qwen2_5_VLForConditionalGeneration": _Family(
        "qwen2_5_vl", attention_bias=True, vision="qwen2_5_vl"
    ),
    "Qwen3VLForConditionalGeneration": _Family("qwen3_vl", qk_norm=True, vision="qwen3_vl"),
    "Qwen3VLMoeForConditionalGeneration": _QWEN_MOE._replace(
        model_type="qwen3_vl_moe", qk_norm=True, vision="qwen3_vl"
    ),
    "NemotronHForCausalLM": _Family(
        "nemotron_h",
        experts_key="n_routed_experts",
        intermediate_key="moe_intermediate_size",
        layers="nemotron_h",
    ),
}
_BY_MODEL_TYPE = {family.model_type: family for family in _FAMILIES.values()}
_BY_MODEL_TYPE["kimi_k2"] = _FAMILIES["DeepseekV3ForCausalLM"]
# Sparse attention (DeepSeek-V3.2's and GLM-5's DSA, DeepSeek-V4's): an indexer picks
# index_topk keys per query, with a cache of its own. Read for the DSA families above.
_DSA_KEYS = ("index_topk", "index_n_heads", "index_head_dim")
# DSA variants that are not what SparseIndexer models: the key and why.
_DSA_REFUSED = {
    "compress_ratios": (
        "DeepSeek-V4's attention (compressed sparse and heavily compressed KV per layer, "
        "a sliding window, hyper-connections) is not modelled"
    ),
    "index_topk_freq": (
        "an indexer shared across layers (GLM-5.2's index_topk_freq / "
        "index_skip_topk_offset / indexer_types: most layers reuse another layer's top-k) "
        "is not modelled, and vLLM 0.33's GlmMoeDsaForCausalLM reads none of those keys"
    ),
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_FAMILIES)
# Architectures of bundled configs that are not read, and why (checked against vLLM 0.33's
# model code): named before any other refusal, since the reason is the architecture's.
_REFUSED_ARCHITECTURES = {
    "KimiK25ForConditionalGeneration": (
        "the Kimi-K2.5 family's (K2.5, K2.6, K2.7) MoonViT vision tower (vision_config) is "
        "not modelled; its decoder (text_config) is a DeepSeek-V3, which a "
        "DeepseekV3ForCausalLM config loads"
    ),
    "KimiK3ForConditionalGeneration": (
        "Kimi-K3's decoder is Kimi Linear (KDA linear attention between MLA layers, "
        "KimiLinearForCausalLM) with a vision tower: neither is modelled"
    ),
    "DeciLMForCausalLM": (
        "Nemotron-NAS (Llama-3.3-Nemotron-Super): block_configs give each layer its own "
        "attention (some none or linear) and FFN width (ffn_mult); per-layer shapes are "
        "not modelled"
    ),
    "MiniMaxM3ForCausalLM": (
        "vLLM 0.33 registers no MiniMaxM3ForCausalLM (its minimax_m3 models are "
        "MiniMaxM3SparseForCausalLM and the vision-language one), and MiniMax-M3's "
        "block-sparse attention (use_sparse_attention: an index picks sparse_topk_blocks "
        "blocks per query) is not modelled"
    ),
    "MiniMaxM3SparseForConditionalGeneration": (
        "MiniMax-M3's block-sparse attention and vision tower are not modelled"
    ),
    "MiMoV2FlashForCausalLM": (
        "MiMo-V2-Flash's sliding layers have their own heads and head dims "
        "(swa_num_key_value_heads, swa_head_dim) and V heads narrower than K (v_head_dim "
        "128, head_dim 192): not modelled"
    ),
    "Step3p7FlashForCausalLM": (
        "vLLM 0.33 registers no Step3p7FlashForCausalLM (its step3p7.py is the "
        "vision-language Step3p7ForConditionalGeneration), and its sliding layers' own head "
        "counts and head-wise attention gate are not modelled"
    ),
}

_HYBRID_MODEL_TYPES = ("nemotron_h", "mamba", "qwen3_next", "qwen3_5")
# Layer-type names in configs -> the mixer tokenyard models.
_LAYER_TYPES = {
    "full_attention": "gqa",
    "sliding_attention": "sliding",
    "linear_attention": "gdn",
}
# Nemotron-H's hybrid_override_pattern: one layer per character, (mixer, FFN).
_NEMOTRON_H = {
    "M": ("mamba2", "none"),
    "*": ("gqa", "none"),
    "-": ("none", "dense"),
    "E": ("none", "moe"),
}
# Qwen2-MoE/Qwen3-MoE layout keys: the values that leave every layer with routed experts only.
_MOE_LAYOUT: dict[str, tuple[tuple[Any, ...], str]] = {
    "shared_expert_intermediate_size": ((None, 0), "shared experts are not modelled"),
    "shared_intermediate_size": ((None, 0), "shared experts are not modelled"),  # MiniMax
    "decoder_sparse_step": ((None, 1), "dense layers between MoE layers are not modelled"),
    "mlp_only_layers": ((None, []), "dense layers in a MoE are not modelled"),
}
# ModelSpec's field -> the config key, for the checks only ModelSpec makes.
_CONFIG_KEYS = {
    "num_kv_heads": "num_key_value_heads",
    "experts_per_token": "num_experts_per_tok",
    "num_dense_layers": "first_k_dense_replace",
    "num_shared_experts": "n_shared_experts",
}


def _bad(key: str, problem: str) -> ConfigError:
    """An error about one key; ``model_from_config`` adds the caller's field and the file."""
    return ConfigError(f"{key}: {problem}", field=key)


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_bytes())
    except ValueError as exc:
        raise ConfigError(f"not a JSON file ({exc})") from None
    except RecursionError:  # json recurses once per level of nesting
        raise ConfigError("not a config.json (nested too deep to read)") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"must be a JSON object (a config.json), got {type(raw).__name__}")
    return raw


def _attention_refusal(
    raw: dict[str, Any], cfg: dict[str, Any], family: _Family | None = None
) -> ConfigError | None:
    """Why the model's attention is not what tokenyard models, if it is not: full GQA or
    MLA, or for a family that lays out its layers (``_Family.layers``) the kinds it lists."""
    for key, why in _DSA_REFUSED.items():
        if cfg.get(key) not in (None, 1):
            return _bad(key, f"{why}, got {cfg[key]!r}")
    dsa = family is not None and family.model_type in ("deepseek_v32", "glm_moe_dsa")
    for key in () if dsa else _DSA_KEYS:
        if cfg.get(key) is not None:
            why = (
                "sparse attention (an indexer that picks the keys each query reads) is read "
                "for DeepseekV32ForCausalLM and GlmMoeDsaForCausalLM configs only"
            )
            return _bad(key, f"{why}, got {cfg[key]!r}")
    if family is not None and family.layers:
        return None  # _layers reads (or refuses) the layout
    for model_type in (str(raw.get("model_type", "")), str(cfg.get("model_type", ""))):
        if any(kind in model_type for kind in _HYBRID_MODEL_TYPES):
            why = (
                "linear-attention and Mamba hybrids are read for the Qwen3-Next, Qwen3.5 and "
                "NemotronH architectures only; this one is not modelled"
            )
            return _bad("model_type", f"{why}, got {model_type!r}")
    if "hybrid_override_pattern" in cfg:
        return _bad(
            "hybrid_override_pattern",
            "Mamba/attention hybrids are read for NemotronHForCausalLM configs only; "
            "not modelled here",
        )
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        listed = layer_types if isinstance(layer_types, list) else [layer_types]
        kinds = sorted({str(kind) for kind in listed} - {"full_attention"})
        if kinds:
            why = (
                "layers without full attention are read for the gpt-oss, Gemma 3/4, "
                "Qwen3-Next and Qwen3.5 architectures only; not modelled here"
            )
            return _bad("layer_types", f"{why}, got layers of kind {', '.join(kinds)}")
    if _window(cfg):
        why = (
            "sliding-window attention is read for Mistral (every layer) and the layer_types "
            "architectures only (Qwen2/3 keep every token's KV unless use_sliding_window)"
        )
        return _bad("sliding_window", f"{why}, got {cfg['sliding_window']!r}")
    return None


def _window(cfg: dict[str, Any]) -> int:
    """The sliding window a config applies, 0 if none (unset, ``use_sliding_window``
    false, or no shorter than ``max_position_embeddings``)."""
    window, context = cfg.get("sliding_window"), cfg.get("max_position_embeddings")
    covers_context = isinstance(window, int) and isinstance(context, int) and window >= context
    # Mistral applies sliding_window whenever it is set; Qwen2/3 only with use_sliding_window.
    if window is None or cfg.get("use_sliding_window") is False or covers_context:
        return 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise _bad("sliding_window", f"must be an integer >= 1 or null, got {window!r}")
    return window


def _moe_refusal(cfg: dict[str, Any]) -> ConfigError | None:
    """Why the model has layers other than routed experts, if it has."""
    for key, (harmless, why) in _MOE_LAYOUT.items():
        if cfg.get(key) not in harmless:
            return _bad(key, f"{why}, got {cfg[key]!r}")
    return None


def _family(raw: dict[str, Any]) -> _Family:
    supported = f"tokenyard reads {', '.join(_FAMILIES)}"
    architectures = raw.get("architectures")
    if architectures is None:  # older configs: the model_type says it
        family = _BY_MODEL_TYPE.get(str(raw.get("model_type")))
        if family is None:
            problem = f"no architectures key and an unsupported model_type; {supported}"
            raise _bad("model_type", f"{problem}, got {raw.get('model_type')!r}")
        return family
    if not isinstance(architectures, list) or not architectures:
        raise _bad("architectures", f"must be a non-empty list, got {architectures!r}")
    for architecture in architectures:
        if architecture not in _FAMILIES:
            raise _bad("architectures", f"unsupported {architecture!r}; {supported}")
    return _FAMILIES[architectures[0]]


def _count(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None and default is not None:
        return default
    if value is None:
        raise _bad(key, "missing (required)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(key, f"must be an integer >= 1, got {value!r}")
    return value


def _flag(cfg: dict[str, Any], key: str) -> bool:
    value = cfg.get(key, False)
    if not isinstance(value, bool):
        raise _bad(key, f"must be true or false, got {value!r}")
    return value


def _head_dim(cfg: dict[str, Any], hidden: int, heads: int) -> int:
    """The config's ``head_dim``, as it is (Qwen3, Gemma and Mistral-Nemo give one other
    than hidden_size / heads); without one, ``hidden_size / num_attention_heads``, which
    must then divide exactly."""
    if cfg.get("head_dim") is not None:
        return _count(cfg, "head_dim")
    if hidden % heads:
        problem = f"must be a multiple of num_attention_heads ({heads}) when no head_dim is given"
        raise _bad("hidden_size", f"{problem}, got {hidden}")
    return hidden // heads


# RoPE types whose factor vLLM 0.33 does not apply to max_position_embeddings (YaRN's and
# Llama 3's configs give the scaled length already; "default" has no factor).
_ROPE_UNSCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


# The other length keys vLLM 0.33 takes the smallest of with max_position_embeddings
# (ModelArchConfigConvertorBase.derive_max_model_len_and_key); model_max_length, where the
# config gives it, replaces them all.
_LENGTH_KEYS = (
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def _context_length(cfg: dict[str, Any], family: _Family) -> int:
    """The longest sequence, as vLLM 0.33's ``_get_and_verify_max_len``
    (``vllm/config/model.py``) derives it: the smallest of ``max_position_embeddings`` and
    the ``_LENGTH_KEYS`` the config gives (its ``model_max_length`` instead, if any), times
    the RoPE scaling factor of ``rope_scaling`` / ``rope_parameters`` (each layer type's
    where they are nested) for a type other than ``_ROPE_UNSCALED`` (``linear``,
    ``dynamic``); Gemma 3's length is already scaled. vLLM's cap by the tokenizer's
    ``model_max_length`` is not applied (tokenyard reads no tokenizer config)."""
    length = _count(cfg, "max_position_embeddings")
    for key in _LENGTH_KEYS:
        if cfg.get(key) is not None:
            length = min(length, _count(cfg, key))
    if cfg.get("model_max_length"):
        length = _count(cfg, "model_max_length")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if not isinstance(rope, dict) or family.model_type.startswith("gemma3"):
        return length
    nested = all(isinstance(v, dict) for v in rope.values())
    factor: Any = 1.0
    for params in rope.values() if nested else (rope,):
        kind = params.get("rope_type", params.get("type", "default"))
        if params and kind not in _ROPE_UNSCALED and "factor" in params:
            factor = params["factor"]
    if factor is None:  # vLLM warns and takes 1.0
        return length
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        key = "rope_parameters" if "rope_parameters" in cfg else "rope_scaling"
        raise _bad(f"{key}.factor", f"must be a number > 0, got {factor!r}")
    return int(length * factor)


def _mla(cfg: dict[str, Any]) -> MlaAttention:
    """The latent attention of a DeepSeek config; ``q_lora_rank`` null: no query
    compression (DeepSeek-V2-Lite)."""
    q_lora = cfg.get("q_lora_rank")
    return MlaAttention(
        q_lora_rank=0 if q_lora is None else _count(cfg, "q_lora_rank"),
        kv_lora_rank=_count(cfg, "kv_lora_rank"),
        qk_nope_head_dim=_count(cfg, "qk_nope_head_dim"),
        qk_rope_head_dim=_count(cfg, "qk_rope_head_dim"),
        v_head_dim=_count(cfg, "v_head_dim"),
    )


def _zero_or_count(cfg: dict[str, Any], key: str) -> int:
    """A count that may be 0 or absent (0)."""
    value = cfg.get(key)
    if value is None or value == 0:
        return 0
    return _count(cfg, key)


def _deepseek(cfg: dict[str, Any], heads: int) -> dict[str, Any]:
    """DeepSeek-V2/V3's keys: MLA in every layer; a MoE with ``n_shared_experts`` beside
    the routed ones, in the layers from ``first_k_dense_replace`` on whose index
    ``moe_layer_freq`` divides (dense ``intermediate_size`` FFNs elsewhere)."""
    mla = _mla(cfg)
    moe = cfg.get("n_routed_experts") is not None
    indexer = None
    if cfg.get("index_topk") is not None:
        indexer = SparseIndexer(
            num_heads=_count(cfg, "index_n_heads"),
            head_dim=_count(cfg, "index_head_dim"),
            topk=_count(cfg, "index_topk"),
        )
    return {
        "mla": mla,
        "indexer": indexer,
        # The attention's q and k width per head; the cache holds the latent instead.
        "head_dim": mla.qk_head_dim,
        "num_kv_heads": heads,
        "num_experts": _count(cfg, "n_routed_experts") if moe else 1,
        "experts_per_token": _count(cfg, "num_experts_per_tok") if moe else 1,
        "intermediate_size": _count(cfg, "moe_intermediate_size" if moe else "intermediate_size"),
        "num_shared_experts": _zero_or_count(cfg, "n_shared_experts") if moe else 0,
        "num_dense_layers": _zero_or_count(cfg, "first_k_dense_replace") if moe else 0,
        "dense_intermediate_size": _count(cfg, "intermediate_size") if moe else 0,
        "moe_layer_freq": _count(cfg, "moe_layer_freq", 1),
        "num_mtp_layers": _zero_or_count(cfg, "num_nextn_predict_layers"),
    }


def _ssm_dtype_bytes(cfg: dict[str, Any]) -> int:
    """Bytes per value of the recurrent state: the config's ``mamba_ssm_dtype`` (Qwen3.5)
    or ``mamba_ssm_cache_dtype`` (Nemotron-H), as vLLM reads them; ``auto`` or none: the
    model dtype (bf16), except Nemotron-H's float32 default."""
    for key in ("mamba_ssm_dtype", "mamba_ssm_cache_dtype"):
        value = cfg.get(key)
        if value is None or value == "auto":
            continue
        sizes = {"float32": 4, "float16": 2, "bfloat16": 2}
        if value not in sizes:
            raise _bad(key, f"must be one of {', '.join(sizes)} or auto, got {value!r}")
        return sizes[value]
    return 4 if cfg.get("model_type") == "nemotron_h" else 2


def _linear(cfg: dict[str, Any], kind: str) -> LinearAttention:
    if kind == "gdn":
        keys = (
            "linear_num_value_heads",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_key_head_dim",
            "linear_conv_kernel_dim",
        )
    else:
        keys = ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel")
    heads, head_dim, groups, group_dim, conv = (_count(cfg, key) for key in keys)
    return LinearAttention(
        kind=kind,
        num_heads=heads,
        head_dim=head_dim,
        num_groups=groups,
        group_dim=group_dim,
        conv_kernel=conv,
        state_dtype_bytes=_ssm_dtype_bytes(cfg),
    )


def _listed_types(cfg: dict[str, Any], layers: int) -> tuple[str, ...]:
    """``layer_types`` as mixers; else Gemma 3's ``sliding_window_pattern`` (every
    n-th layer global) or Qwen3-Next's ``full_attention_interval`` (every n-th full, the
    rest gated DeltaNet); else every layer full."""
    listed = cfg.get("layer_types")
    if listed is not None:
        if not isinstance(listed, list) or len(listed) != layers:
            raise _bad(
                "layer_types", f"must list num_hidden_layers ({layers}) kinds, got {listed!r}"
            )
        unknown = sorted({str(k) for k in listed} - set(_LAYER_TYPES))
        if unknown:
            known = ", ".join(_LAYER_TYPES)
            why = f"kinds {', '.join(unknown)} are not modelled (tokenyard reads {known})"
            raise _bad("layer_types", why)
        return tuple(_LAYER_TYPES[k] for k in listed)
    for key, every, other in (
        ("sliding_window_pattern", "gqa", "sliding"),
        ("full_attention_interval", "gqa", "gdn"),
    ):
        if cfg.get(key) is not None:
            n = _count(cfg, key)
            return tuple(every if (i + 1) % n == 0 else other for i in range(layers))
    return ()


def _layers(cfg: dict[str, Any], family: _Family, layers: int) -> dict[str, Any]:
    """The per-layer fields of a family that lays out its layers (``_Family.layers``)."""
    out: dict[str, Any] = {}
    if family.layers == "sliding":  # Mistral: the window on every layer, if any
        window = _window(cfg)
        if window:
            out.update(layer_types=("sliding",) * layers, sliding_window=window)
        return out
    if family.layers == "types":
        types = _listed_types(cfg, layers)
        if "sliding" in types:
            window = _window(cfg)
            if not window:
                raise _bad(
                    "sliding_window",
                    f"must be set for sliding_attention layers, got {cfg.get('sliding_window')!r}",
                )
            out["sliding_window"] = window
        if "gdn" in types:
            out["linear"] = _linear(cfg, "gdn")
        if set(types) - {"gqa"}:
            out["layer_types"] = types
        return out
    if family.layers == "llama4":
        # HF's Llama 4: a layer without RoPE (no_rope_layers[i] == 0; by default every
        # fourth) attends globally, the others within chunks of attention_chunk_size;
        # layer i has experts when (i + 1) % interleave_moe_layer_step == 0.
        rope = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
        if not isinstance(rope, list) or len(rope) != layers:
            raise _bad(
                "no_rope_layers", f"must list num_hidden_layers ({layers}) flags, got {rope!r}"
            )
        chunk = cfg.get("attention_chunk_size")
        if chunk is not None:
            out["attention_chunk_size"] = _count(cfg, "attention_chunk_size")
        out["layer_types"] = tuple("chunked" if r and chunk else "gqa" for r in rope)
        step = _count(cfg, "interleave_moe_layer_step", 1)
        out["ffn_types"] = tuple("moe" if (i + 1) % step == 0 else "dense" for i in range(layers))
        return out
    pattern = cfg.get("hybrid_override_pattern")  # nemotron_h
    if not isinstance(pattern, str) or len(pattern) != layers or set(pattern) - set(_NEMOTRON_H):
        why = f"must be a string of num_hidden_layers ({layers}) of {', '.join(_NEMOTRON_H)}"
        raise _bad("hybrid_override_pattern", f"{why}, got {pattern!r}")
    out["layer_types"] = tuple(_NEMOTRON_H[c][0] for c in pattern)
    out["ffn_types"] = tuple(_NEMOTRON_H[c][1] for c in pattern)
    if "M" in pattern:
        out["linear"] = _linear(cfg, "mamba2")
    return out


def _hybrid_fields(cfg: dict[str, Any], family: _Family) -> dict[str, Any]:
    """What the newer families add beside their layout: shared experts, Gemma 4's global
    attention shape and dense MLP beside the experts, Qwen's output gate, Nemotron-H's
    non-gated MLP, Llama 4's dense layers and shared expert."""
    out: dict[str, Any] = {}
    model_type = family.model_type
    if model_type in ("qwen3_next", "qwen3_5_moe"):
        shared = cfg.get("shared_expert_intermediate_size")
        if shared:
            out.update(
                num_shared_experts=1,
                shared_expert_intermediate_size=_count(cfg, "shared_expert_intermediate_size"),
                shared_expert_gate=True,  # vLLM 0.33 qwen3_next.py: shared_expert_gate
            )
    if model_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        out["num_mtp_layers"] = _zero_or_count(cfg, "mtp_num_hidden_layers")
        out["attention_output_gate"] = (
            _flag(cfg, "attn_output_gate") if "attn_output_gate" in cfg else True
        )
    if model_type == "gemma4":
        # vLLM 0.33's gemma4.py builds its MLP and experts without sequence parallelism.
        out["sequence_parallel_shared_experts"] = False
        # ... and runs the dense MLP before the experts on the main stream, not overlapped.
        out["shared_experts_overlap"] = False
        if cfg.get("num_global_key_value_heads") is not None:
            out["global_num_kv_heads"] = _count(cfg, "num_global_key_value_heads")
        if cfg.get("global_head_dim") is not None:
            out["global_head_dim"] = _count(cfg, "global_head_dim")
        out["attention_k_eq_v"] = _flag(cfg, "attention_k_eq_v")
        if cfg.get("num_experts"):
            # Every layer runs a dense MLP of intermediate_size beside its experts: a
            # shared expert of that size.
            out.update(
                intermediate_size=_count(cfg, "moe_intermediate_size"),
                experts_per_token=_count(cfg, "top_k_experts"),
                num_shared_experts=1,
                shared_expert_intermediate_size=_count(cfg, "intermediate_size"),
            )
    if model_type == "llama4":
        out.update(
            num_shared_experts=1,
            dense_intermediate_size=_count(cfg, "intermediate_size_mlp"),
            qk_norm=False,
        )
    if model_type == "nemotron_h":
        act = cfg.get("mlp_hidden_act", "relu2")
        if act != "relu2":
            raise _bad("mlp_hidden_act", f"only Nemotron-H's relu2 MLP is modelled, got {act!r}")
        out["gated_ffn"] = False
        if cfg.get("n_routed_experts"):
            shared = cfg.get("moe_shared_expert_intermediate_size")
            out["num_shared_experts"] = _zero_or_count(cfg, "n_shared_experts")
            if shared and out["num_shared_experts"]:
                out["shared_expert_intermediate_size"] = _count(
                    cfg, "moe_shared_expert_intermediate_size"
                )
            out["dense_intermediate_size"] = _count(cfg, "intermediate_size")
        else:
            out["intermediate_size"] = _count(cfg, "intermediate_size")
            out["num_experts"] = out["experts_per_token"] = 1
    return out


def _spec(
    cfg: dict[str, Any], family: _Family, name: str, source: str, quantization: Any = None
) -> ModelSpec:
    heads, hidden = _count(cfg, "num_attention_heads"), _count(cfg, "hidden_size")
    moe = bool(family.experts_key)
    bias = family.attention_bias
    if not family.deepseek:
        for key in ("kv_lora_rank", "q_lora_rank"):
            if cfg.get(key) is not None:
                why = (
                    "multi-head latent attention is read for DeepseekV2ForCausalLM and "
                    "DeepseekV3ForCausalLM configs only"
                )
                raise _bad(key, f"{why}, got {cfg[key]!r} in a {family.model_type} config")
    kwargs: dict[str, Any] = {
        "num_layers": _count(cfg, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": _count(cfg, "num_key_value_heads", heads),
        "intermediate_size": (
            _count(cfg, family.intermediate_key)
            if not family.deepseek and (cfg.get(family.experts_key) or not family.experts_key)
            else 1
        ),
        "vocab_size": _count(cfg, "vocab_size"),
        "context_length": _context_length(cfg, family),
        "tied_embeddings": _flag(cfg, "tie_word_embeddings"),
        "attention_bias": _flag(cfg, "attention_bias") if bias is None else bias,
        "qk_norm": family.qk_norm,
        "quantization": quantization,
    }
    if family.deepseek:
        kwargs.update(_deepseek(cfg, heads))
    else:
        kwargs["head_dim"] = _head_dim(cfg, hidden, heads)
        moe = moe and bool(cfg.get(family.experts_key))  # Qwen3.5-27B: dense
        if family.model_type == "gemma4" and moe:
            kwargs["experts_per_token"] = 1  # read below (top_k_experts)
        kwargs["num_experts"] = _count(cfg, family.experts_key) if moe else 1
        if family.model_type != "gemma4" or not moe:
            kwargs["experts_per_token"] = _count(cfg, "num_experts_per_tok") if moe else 1
        if not moe and family.experts_key and family.model_type != "nemotron_h":
            kwargs["intermediate_size"] = _count(cfg, "intermediate_size")
    if family.layers:
        kwargs.update(_layers(cfg, family, kwargs["num_layers"]))
        kwargs.update(_hybrid_fields(cfg, family))
    try:
        return ModelSpec(name=name, source=source, **kwargs)
    except ConfigError as exc:  # a check between keys, e.g. kv heads that divide no heads
        spec_field = (exc.field or "").rsplit(".", 1)[-1]
        problem = exc.message.removeprefix(f"{exc.field}: ")
        raise _bad(_CONFIG_KEYS.get(spec_field, spec_field), problem) from None


def _vision(raw: dict[str, Any], kind: str) -> VisionEncoder:
    """The ``vision_config`` of a vision-language config (``catalog/vision.py``); errors
    name ``vision_config.<key>``."""
    cfg = raw.get("vision_config")
    if not isinstance(cfg, dict):
        raise _bad("vision_config", f"must be a table (the vision tower), got {cfg!r}")

    def count(key: str, default: int | None = None) -> int:
        try:
            return _count(cfg, key, default)
        except ConfigError as exc:
            problem = exc.message.removeprefix(f"{key}: ")
            raise _bad(f"vision_config.{key}", problem) from None

    def indexes(key: str) -> tuple[int, ...]:
        listed = cfg.get(key) or []
        if not isinstance(listed, list):
            raise _bad(f"vision_config.{key}", f"must be a list of block indexes, got {listed!r}")
        return tuple(listed)

    try:
        return VisionEncoder(
            kind=kind,
            depth=count("depth"),
            hidden_size=count("hidden_size"),
            num_heads=count("num_heads"),
            intermediate_size=count("intermediate_size"),
            patch_size=count("patch_size"),
            spatial_merge_size=count("spatial_merge_size"),
            temporal_patch_size=count("temporal_patch_size"),
            out_hidden_size=count("out_hidden_size"),
            in_channels=count("in_channels" if "in_channels" in cfg else "in_chans", 3),
            num_position_embeddings=(count("num_position_embeddings") if kind == "qwen3_vl" else 0),
            deepstack_layers=indexes("deepstack_visual_indexes"),
            window_size=count("window_size") if kind == "qwen2_5_vl" else 0,
            fullatt_blocks=indexes("fullatt_block_indexes"),
        )
    except ConfigError as exc:
        problem = exc.message.removeprefix(f"{exc.field}: ")
        raise _bad(exc.field or "vision_config", problem) from None


@functools.lru_cache(maxsize=256)
def _load(path: Path, mtime_ns: int, name: str) -> ModelSpec:
    """``path`` parsed once per name and modification time (an edited file is re-read)."""
    raw = _read(path)
    listed = raw.get("architectures")
    for architecture in listed if isinstance(listed, list) else ():
        if architecture in _REFUSED_ARCHITECTURES:
            why = _REFUSED_ARCHITECTURES[architecture]
            raise _bad("architectures", f"{why}, got {architecture!r}")
    text = raw.get("text_config")
    cfg = {**raw, **text} if isinstance(text, dict) else raw  # vision-language wrappers
    try:
        known: _Family | None = _family(raw)
    except ConfigError:
        known = None  # refused below, after the attention (whose reason is the sharper)
    refusal = _attention_refusal(raw, cfg, known)
    if refusal is not None:
        raise refusal
    family = known or _family(raw)
    if family.layers == "nemotron_h" and cfg.get("moe_latent_size"):
        why = "latent MoE experts (Nemotron-3 Super and Ultra) are not modelled"
        raise _bad("moe_latent_size", f"{why}, got {cfg['moe_latent_size']!r}")
    refusal = (
        None
        if family.deepseek or (family.layers == "types" and "qwen3" in family.model_type)
        else _moe_refusal(cfg)
    )
    if refusal is not None:
        raise refusal
    spec = _spec(cfg, family, name, str(path), read_quantization(raw, cfg, path))
    if family.vision:
        spec = dataclasses.replace(spec, vision=_vision(raw, family.vision))
    return spec


def model_from_config(
    path: str | Path, *, name: str | None = None, field: str = "model"
) -> ModelSpec:
    """The ``ModelSpec`` of a Hugging Face ``config.json`` (or one nesting the decoder
    under ``text_config``).

    Args:
        path: the file; ``~`` is expanded and a relative path is from the working directory.
        name: the spec's name; default the absolute path. ``source`` is the absolute path.
        field: the caller's config key, for errors (e.g. ``replica.model``).

    Raises:
        ConfigError: unreadable or not JSON, an unsupported architecture, or an attention
            or MoE layout its family's reader does not know (e.g. DSA outside DeepSeek-V3.2
            and GLM-5, a sliding window outside Mistral and the layer_types families,
            Qwen2-MoE's shared experts), a quantization format it does not model
            (``catalog/quant.py``), or a missing or bad key; ``field`` is ``field`` and the
            message names the file and the key.
    """
    path = Path(path).expanduser().resolve()
    name = str(path) if name is None else name
    try:
        return _load(path, path.stat().st_mtime_ns, name)
    except OSError as exc:
        problem = f"cannot read ({exc.strerror})"
    except ConfigError as exc:
        problem = exc.message
    raise ConfigError(f"{field}: {path}: {problem}", field=field, value=repr(name))


def _bundled_dir() -> Path | None:
    try:
        import aiconfigurator_core
    except ImportError:
        return None
    directory = Path(aiconfigurator_core.__file__).parent / "model_configs"
    return directory if directory.is_dir() else None


@functools.lru_cache(maxsize=4)
def _bundled_index(directory: Path) -> dict[str, Path]:
    """Repo id -> file: ``meta-llama--Llama-3.1-8B_config.json`` is
    ``meta-llama/Llama-3.1-8B``. The ``*_hf_quant_config.json`` files are a checkpoint's
    quantisation settings, not a model."""
    return {
        path.name.removesuffix("_config.json").replace("--", "/", 1): path
        for path in sorted(directory.glob("*_config.json"))
        if not path.name.endswith("_hf_quant_config.json")
    }


def _bundled() -> dict[str, Path]:
    directory = _bundled_dir()
    return {} if directory is None else _bundled_index(directory)


def bundled_model_names() -> list[str]:
    """The Hugging Face repo ids whose ``config.json`` ``aiconfigurator-core`` bundles
    (``meta-llama/Meta-Llama-3.1-8B``, ...), sorted; empty without the package. Each is a
    model name for ``catalog.model``, though some are refused (see ``model_from_config``).
    """
    return sorted(_bundled())


def config_path(name: str) -> Path | None:
    """The config file the model name ``name`` stands for: ``name`` itself if it ends with
    ``.json`` or is a file, else the bundled config whose repo id it is; None if neither."""
    path = Path(name).expanduser()
    if name.endswith(".json") or path.is_file():
        return path
    return _bundled().get(name)
