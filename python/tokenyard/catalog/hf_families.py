"""Which Hugging Face architectures tokenyard reads, and why it refuses the others.

``read_family`` maps a ``config.json`` to the ``_Family`` whose reader (``hf.py``) takes
its fields, or raises the ConfigError that names the key making it a model tokenyard does
not simulate: an architecture of ``_REFUSED_ARCHITECTURES`` (its own reason, checked
against vLLM 0.33's model code), then an attention (``_attention_refusal``: DSA outside
DeepSeek-V3.2 and GLM-5, hybrids, sliding windows or layer types outside the families that
list their layers), then an architecture not in ``SUPPORTED_ARCHITECTURES``, then a MoE
layout other than routed experts (``_moe_refusal``; Nemotron-3's latent experts).
Invariant: a family here is read by ``hf.py`` only for the layer kinds its ``_Family``
fields name.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tokenyard.errors import ConfigError


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
# Qwen2-MoE/Qwen3-MoE layout keys: the values that leave every layer with routed experts only.
_MOE_LAYOUT: dict[str, tuple[tuple[Any, ...], str]] = {
    "shared_expert_intermediate_size": ((None, 0), "shared experts are not modelled"),
    "shared_intermediate_size": ((None, 0), "shared experts are not modelled"),  # MiniMax
    "decoder_sparse_step": ((None, 1), "dense layers between MoE layers are not modelled"),
    "mlp_only_layers": ((None, []), "dense layers in a MoE are not modelled"),
}


def _bad(key: str, problem: str) -> ConfigError:
    """An error about one key; ``model_from_config`` adds the caller's field and the file."""
    return ConfigError(f"{key}: {problem}", field=key)


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


def read_family(raw: dict[str, Any], cfg: dict[str, Any]) -> _Family:
    """The family that reads ``raw`` (a ``config.json``; ``cfg`` its decoder's keys, under
    ``text_config`` for vision-language wrappers), or the refusal, in the order the module
    docstring gives.

    Raises:
        ConfigError: the model is not one tokenyard simulates; the message names the key.
    """
    listed = raw.get("architectures")
    for architecture in listed if isinstance(listed, list) else ():
        if architecture in _REFUSED_ARCHITECTURES:
            why = _REFUSED_ARCHITECTURES[architecture]
            raise _bad("architectures", f"{why}, got {architecture!r}")
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
    return family
