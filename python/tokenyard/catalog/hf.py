"""Hugging Face ``config.json`` files as catalog models, and the configs bundled with
``aiconfigurator-core`` (the ``tokenyard[measured]`` extra), found by repo id.

``config_path`` says which file a model name stands for; ``model_from_config`` reads one
into a ``ModelSpec``. Invariant: a config loads only if its architecture is one of
``SUPPORTED_ARCHITECTURES`` and its layers are of the kinds that family's reader knows
(``_Family``: full attention everywhere, or the sliding, chunked, linear-attention and
FFN layouts of the families that list their layers; routed experts only, except where the
family reads its shared experts and dense layers); anything else is a ConfigError naming
the file and the key that makes it a model tokenyard does not simulate (which families
there are and every refusal: ``hf_families.py``). DeepSeek-V2/V3 (and Kimi-K2, which is
a DeepSeek-V3) configs read their multi-head latent attention, shared experts and leading
dense layers into ``ModelSpec.mla`` and its MoE layout fields, DeepSeek-V3.2 and GLM-5
also their DSA indexer (``ModelSpec.indexer``). ``context_length`` is
``max_position_embeddings`` scaled as vLLM 0.33 scales ``max_model_len``
(``_context_length``). A quantized checkpoint's ``quantization_config`` (or the
``hf_quant_config.json`` beside it) becomes ``ModelSpec.quantization`` (``quant.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from tokenyard.catalog.hf_families import (
    SUPPORTED_ARCHITECTURES,
    _bad,
    _Family,
    _window,
    read_family,
)
from tokenyard.catalog.layers import LinearAttention, MlaAttention, SparseIndexer
from tokenyard.catalog.quant import read_quantization
from tokenyard.catalog.specs import ModelSpec
from tokenyard.catalog.vision import VisionEncoder
from tokenyard.errors import ConfigError

__all__ = ["SUPPORTED_ARCHITECTURES", "bundled_model_names", "config_path", "model_from_config"]

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
# ModelSpec's field -> the config key, for the checks only ModelSpec makes.
_CONFIG_KEYS = {
    "num_kv_heads": "num_key_value_heads",
    "experts_per_token": "num_experts_per_tok",
    "num_dense_layers": "first_k_dense_replace",
    "num_shared_experts": "n_shared_experts",
}


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
    text = raw.get("text_config")
    cfg = {**raw, **text} if isinstance(text, dict) else raw  # vision-language wrappers
    family = read_family(raw, cfg)
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
