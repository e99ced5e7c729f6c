"""Quantized checkpoints: what a Hugging Face ``quantization_config`` says, as a
``Quantization``, and the measured kernel family each format runs on.

A checkpoint's weights format decides its memory (bytes per weight, scales included) and
which measured kernels price it: block-wise FP8 (Qwen3-FP8, DeepSeek-V3) runs block-scaled
GEMMs and MoE kernels, which are faster than per-tensor FP8's and than BF16's, and pricing
it with the wrong family reverses the comparison (issue 29). Invariant: every format read
here maps to exactly one scheme of ``SCHEMES``; anything else is refused, never read as
BF16.

Read (``read_quantization``): ``quantization_config`` in ``config.json`` (or its
``text_config``), else ``hf_quant_config.json`` beside it (NVIDIA ModelOpt's file;
``<repo>_hf_quant_config.json`` beside the configs ``aiconfigurator-core`` bundles).

Per-tensor FP8 also records how its activations are scaled (``activation_scales``):
``static`` scales calibrated into the checkpoint (ModelOpt FP8, ``activation_scheme:
static``, compressed-tensors ``input_activations.dynamic: false``) or ``dynamic`` ones
computed per token at run time (``activation_scheme: dynamic``, compressed-tensors
``dynamic: true``, and vLLM's online ``--quantization fp8``). vLLM's measured ``fp8``
GEMM rows are dynamic; static checkpoints skip that quantization's extra cost
(``predictor/measured/ops.py``'s ``StaticFp8GemmTimes``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tokenyard.errors import ConfigError

__all__ = [
    "QUANTIZATION_CHOICES",
    "SCHEMES",
    "Quantization",
    "read_quantization",
    "resolve_quantization",
    "scheme",
]


@dataclasses.dataclass(frozen=True)
class Quantization:
    """How a checkpoint's decoder-layer linear weights (attention projections, MLP or
    experts) are stored and computed. Embeddings, the LM head, norms and the MoE router
    stay in the compute dtype (bf16), as vLLM loads them.

    ``scheme`` is a key of ``SCHEMES`` (the kernel family); ``weights`` and
    ``activations`` the formats (``fp8``, ``fp4``, ``int4``, ``bf16``); ``group_size``
    the weights per scale (0: one scale per tensor or channel); ``kv_cache_dtype`` the KV
    cache format the checkpoint was calibrated for (``fp8``), or ``""``; ``method`` and
    ``source`` what said so. ``activation_scales`` is how FP8 activations are scaled:
    ``static`` (calibrated scales in the checkpoint) or ``dynamic`` (computed at run time:
    per token for per-tensor ``fp8``, per 128-value group for ``fp8_block``); ``""`` for
    the other schemes.
    """

    scheme: str
    weights: str
    activations: str
    group_size: int = 0
    bytes_per_weight: float = 1.0
    kv_cache_dtype: str = ""
    method: str = ""
    source: str = ""
    activation_scales: str = ""
    #: Only the routed experts are quantized; attention and dense projections stay bf16
    #: (gpt-oss's MXFP4: ``modules_to_not_convert`` lists ``self_attn``).
    experts_only: bool = False
    #: Module names the checkpoint keeps 16-bit, as it writes them (ModelOpt's
    #: ``exclude_modules`` / ``ignore``: ``model.layers.3.self_attn.q_a_proj``,
    #: ``model.layers.*.self_attn*``); the measured predictor reads them
    #: (``predictor/measured/gemm.py``, ``modules_unquantized``). Not compared: two
    #: checkpoints of one scheme are the same quantization.
    unquantized_modules: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    @property
    def gemm_dtype(self) -> str:
        """The measured GEMM tables' ``gemm_dtype`` for these linear layers."""
        return SCHEMES[self.scheme][1]

    @property
    def moe_dtype(self) -> str:
        """The measured MoE tables' ``moe_dtype`` for these experts."""
        return SCHEMES[self.scheme][2]

    def describe(self) -> str:
        """``fp8_block (fp8 weights, 128 x 128 blocks; fp8 activations, dynamic scales)``."""
        group = (
            f", {self.group_size} per scale"
            if self.group_size and self.scheme != "fp8_block"
            else ", 128 x 128 blocks"
            if self.scheme == "fp8_block"
            else ""
        )
        scales = f", {self.activation_scales} scales" if self.activation_scales else ""
        return (
            f"{self.scheme} ({self.weights} weights{group}; {self.activations} activations{scales})"
        )


#: scheme -> (what it is, GEMM table dtype, MoE table dtype). The table names are
#: aiconfigurator-core's (``gemm_dtype``, ``moe_dtype`` columns); a GEMM family no table
#: measures (int4 and MXFP4 on vLLM) makes the measured predictor refuse the combination.
SCHEMES: dict[str, tuple[str, str, str]] = {
    "fp8": ("FP8 weights and activations, one scale per tensor", "fp8", "fp8"),
    "fp8_block": (
        "FP8 weights in 128 x 128 blocks, FP8 activations per 128-value group",
        "fp8_block",
        "fp8_block",
    ),
    "nvfp4": ("NVFP4: FP4 weights and activations, an FP8 scale per 16", "nvfp4", "nvfp4"),
    # vLLM 0.33 runs these on its W4A16 NVFP4 kernels (Marlin and others:
    # init_nvfp4_linear_kernel(use_a16=True)); aiconfigurator-core 0.12.0 measures none, so
    # the measured predictor refuses them with the list of what is measured.
    "nvfp4_a16": (
        "NVFP4A16: FP4 weights (an FP8 scale per 16), BF16 activations",
        "nvfp4_w4a16",
        "nvfp4_w4a16",
    ),
    "mxfp4": ("MXFP4 weights (an E8M0 scale per 32), BF16 activations", "mxfp4", "w4a16_mxfp4"),
    "int4_awq": ("AWQ: int4 weights per group, BF16 activations", "int4_wo", "int4_wo"),
    "int4_gptq": ("GPTQ: int4 weights per group, BF16 activations", "int4_wo", "int4_wo"),
    "int4": ("int4 weights per group (compressed-tensors W4A16)", "int4_wo", "int4_wo"),
}

#: The values ``replica.quantization`` takes.
QUANTIZATION_CHOICES = ("auto", "none", *SCHEMES)

_DEFAULT_GROUP = {
    "nvfp4": 16,
    "nvfp4_a16": 16,
    "mxfp4": 32,
    "int4_awq": 128,
    "int4_gptq": 128,
    "int4": 128,
}


def _bytes_per_weight(key: str, group: int) -> float:
    """Bytes per weight with the scales: FP8 blocks carry an fp32 scale per block, NVFP4 an
    E4M3 byte per 16 values, MXFP4 an E8M0 byte per 32, AWQ and GPTQ an fp16 scale and a
    4-bit zero point per group, compressed-tensors' symmetric int4 an fp16 scale."""
    if key == "fp8":
        return 1.0
    if key == "fp8_block":
        return 1.0 + 4.0 / group
    if key in ("nvfp4", "nvfp4_a16", "mxfp4"):
        return 0.5 + 1.0 / group
    if key == "int4":
        return 0.5 + 2.0 / group
    return 0.5 + 2.5 / group  # int4_awq, int4_gptq


#: Activation scales a scheme takes unless its config says otherwise: per-tensor FP8 is
#: dynamic unless the checkpoint carries static scales (vLLM's online ``--quantization
#: fp8`` and ``Fp8Config``'s default); block FP8 is always dynamic (per 128-value group;
#: vLLM refuses static block FP8).
_ACTIVATION_SCALES = {"fp8": "dynamic", "fp8_block": "dynamic"}


def scheme(
    key: str,
    *,
    group_size: int = 0,
    kv_cache_dtype: str = "",
    method: str = "",
    source: str = "",
    activation_scales: str = "",
) -> Quantization:
    """The ``Quantization`` of scheme ``key`` (``group_size`` 0: the format's usual;
    ``activation_scales`` "": the scheme's default, ``_ACTIVATION_SCALES``)."""
    fp4 = ("nvfp4", "nvfp4_a16", "mxfp4")
    weights = "fp8" if key in ("fp8", "fp8_block") else "fp4" if key in fp4 else "int4"
    activations = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4"}.get(key, "bf16")
    group = group_size or (128 * 128 if key == "fp8_block" else _DEFAULT_GROUP.get(key, 0))
    return Quantization(
        scheme=key,
        weights=weights,
        activations=activations,
        group_size=group,
        bytes_per_weight=_bytes_per_weight(key, group),
        kv_cache_dtype=kv_cache_dtype,
        method=method or key,
        source=source,
        activation_scales=activation_scales or _ACTIVATION_SCALES.get(key, ""),
    )


def _bad(key: str, problem: str) -> ConfigError:
    return ConfigError(f"{key}: {problem}", field=key)


def _kv(qc: dict[str, Any]) -> str:
    """``fp8`` where the config says its KV cache is FP8 (ModelOpt's ``kv_cache_quant_algo``,
    compressed-tensors' ``kv_cache_scheme``)."""
    algo = qc.get("kv_cache_quant_algo")
    if isinstance(algo, str) and algo.upper() == "FP8":
        return "fp8"
    kv = qc.get("kv_cache_scheme")
    if kv == "FP8" or (
        isinstance(kv, dict) and kv.get("num_bits") == 8 and kv.get("type") == "float"
    ):
        return "fp8"
    return ""


def _group(value: Any, key: str) -> int:
    if value is None or value == -1:  # GPTQ's -1: one group per channel
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(key, f"must be an integer >= 1, got {value!r}")
    return value


def _dynamic_inputs(qc: dict[str, Any]) -> bool | None:
    """compressed-tensors' ``config_groups.*.input_activations.dynamic`` (True if any group
    says so), or None where no group says."""
    groups = qc.get("config_groups")
    found = [
        bool(group["input_activations"]["dynamic"])
        for group in (groups.values() if isinstance(groups, dict) else ())
        if isinstance(group, dict)
        and isinstance(group.get("input_activations"), dict)
        and "dynamic" in group["input_activations"]
    ]
    return any(found) if found else None


def _modelopt(qc: dict[str, Any], where: str, source: str) -> Quantization:
    quant = _modelopt_scheme(qc, where, source)
    kept = qc.get("exclude_modules") or qc.get("ignore") or ()
    if isinstance(kept, (list, tuple)):
        quant = dataclasses.replace(quant, unquantized_modules=tuple(str(m) for m in kept))
    return quant


def _modelopt_scheme(qc: dict[str, Any], where: str, source: str) -> Quantization:
    algo = qc.get("quant_algo")
    kv = _kv(qc)
    if algo == "FP8":
        # ModelOpt FP8 calibrates static input scales (``input_scale`` per linear layer),
        # unless a compressed-tensors style group in the same config says dynamic.
        scales = "dynamic" if _dynamic_inputs(qc) else "static"
        return scheme(
            "fp8",
            kv_cache_dtype=kv,
            method="modelopt FP8",
            source=source,
            activation_scales=scales,
        )
    if algo in ("NVFP4", "W4A16_NVFP4"):
        group = _group(qc.get("group_size"), f"{where}.group_size") or 16
        # vLLM 0.33's ModelOptNvFp4Config.from_config: W4A16_NVFP4, or NVFP4 whose every
        # config group has null input_activations, runs the weight-only (A16) kernels.
        groups = qc.get("config_groups")
        weight_only = algo == "W4A16_NVFP4" or (
            isinstance(groups, dict)
            and bool(groups)
            and all(
                isinstance(g, dict) and g.get("input_activations") is None for g in groups.values()
            )
        )
        key = "nvfp4_a16" if weight_only else "nvfp4"
        method = f"modelopt {'W4A16_NVFP4' if weight_only else 'NVFP4'}"
        return scheme(key, group_size=group, kv_cache_dtype=kv, method=method, source=source)
    raise _bad(
        f"{where}.quant_algo",
        f"ModelOpt {algo!r} is not modelled (mixed precision and other algorithms); "
        "tokenyard reads FP8, NVFP4 and W4A16_NVFP4",
    )


def _compressed_tensors(qc: dict[str, Any], where: str, source: str) -> Quantization:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _bad(f"{where}.config_groups", f"must be a non-empty object, got {groups!r}")
    found = set()
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        acts = group.get("input_activations") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise _bad(f"{where}.config_groups.{name}.weights", f"not read, got {weights!r}")
        bits, kind = weights.get("num_bits"), weights.get("type")
        act_bits = acts.get("num_bits") if isinstance(acts, dict) else None
        size = _group(weights.get("group_size"), f"{where}.config_groups.{name}.group_size")
        if bits == 8 and kind == "float" and act_bits == 8:
            block = weights.get("block_structure") or (
                [128, 128] if weights.get("strategy") == "block" else None
            )
            # compressed-tensors' QuantizationArgs default to static (``dynamic: false``).
            found.add(("fp8_block", 128 * 128) if block else ("fp8", 0))
        elif bits == 4 and kind == "float" and act_bits == 4:
            found.add(("nvfp4", size or 16))
        elif bits == 4 and kind == "float" and act_bits is None and size in (16, 32):
            # vLLM 0.33's CompressedTensorsConfig._get_scheme_from_parts: FP4 weights in
            # groups of 16 are NVFP4 (CompressedTensorsW4A4Fp4(use_a16=True) without input
            # activations: NVFP4A16), in groups of 32 MXFP4 (W4A16 via Marlin off SM100).
            found.add(("nvfp4_a16", 16) if size == 16 else ("mxfp4", 32))
        elif bits == 4 and kind == "int" and act_bits is None:
            found.add(("int4", size or 128))
        else:
            raise _bad(
                f"{where}.config_groups.{name}",
                f"{bits}-bit {kind} weights (group size {size or 'none'}) with "
                f"{act_bits or 16}-bit activations are not modelled; tokenyard reads FP8, "
                "NVFP4, NVFP4A16 (4-bit float weights in groups of 16), MXFP4 (groups of 32) "
                "and int4 weight-only",
            )
    if len(found) > 1:
        raise _bad(f"{where}.config_groups", f"mixed formats are not modelled: {sorted(found)}")
    key, size = found.pop()
    scales = ""
    if key == "fp8":
        scales = "dynamic" if _dynamic_inputs(qc) else "static"
    return scheme(
        key,
        group_size=size,
        kv_cache_dtype=_kv(qc),
        method="compressed-tensors",
        source=source,
        activation_scales=scales,
    )


def _from_config(qc: Any, where: str, source: str) -> Quantization:
    if not isinstance(qc, dict):
        raise _bad(where, f"must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method is None and "quant_algo" in qc:  # ModelOpt's keys without a quant_method
        method = "modelopt"
    if method == "fp8":
        if qc.get("quant_algo") == "MIXED_PRECISION" or qc.get("moe_quant_algo"):
            raise _bad(f"{where}.moe_quant_algo", "mixed-precision checkpoints are not modelled")
        block = qc.get("weight_block_size")
        # vLLM 0.33's Fp8Config.from_config reads activation_scheme with get_from_keys,
        # which raises when it is missing ("Cannot find any of ['activation_scheme']"):
        # only the online --quantization fp8 defaults to dynamic. Block FP8 takes only
        # dynamic.
        if "activation_scheme" not in qc:
            raise _bad(
                f"{where}.activation_scheme",
                "missing; a quant_method fp8 checkpoint must say 'static' or 'dynamic' "
                "(vLLM 0.33's Fp8Config.from_config refuses it without one), got no key",
            )
        activation = qc["activation_scheme"]
        if activation not in ("static", "dynamic") or (
            block is not None and activation != "dynamic"
        ):
            allowed = "'dynamic'" if block is not None else "'static' or 'dynamic'"
            raise _bad(
                f"{where}.activation_scheme",
                f"must be {allowed}{' with weight_block_size' if block is not None else ''}, "
                f"got {activation!r}",
            )
        if block is None:
            return scheme(
                "fp8",
                kv_cache_dtype=_kv(qc),
                method=f"fp8, activation_scheme {activation}",
                source=source,
                activation_scales=activation,
            )
        if (
            not isinstance(block, list)
            or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
        ):
            raise _bad(f"{where}.weight_block_size", f"must be two integers > 0, got {block!r}")
        return scheme(
            "fp8_block",
            group_size=block[0] * block[1],
            kv_cache_dtype=_kv(qc),
            method=f"fp8, weight_block_size {block}",
            source=source,
        )
    if method == "modelopt":
        return _modelopt(qc, where, source)
    if method == "mxfp4":
        kept = qc.get("modules_to_not_convert") or []
        experts_only = any("self_attn" in str(m) for m in kept)
        quant = scheme("mxfp4", method="mxfp4", source=source)
        return dataclasses.replace(quant, experts_only=experts_only)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin"):
        bits = qc.get("bits", qc.get("w_bit"))
        if bits != 4:
            raise _bad(f"{where}.bits", f"only 4-bit {method} is modelled, got {bits!r}")
        size = _group(qc.get("group_size", qc.get("q_group_size")), f"{where}.group_size")
        key = "int4_awq" if method.startswith("awq") else "int4_gptq"
        return scheme(key, group_size=size or 128, method=method, source=source)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, where, source)
    raise _bad(
        f"{where}.quant_method",
        f"{method!r} is not modelled; tokenyard reads fp8 (per-tensor or weight_block_size), "
        "modelopt (FP8, NVFP4, W4A16_NVFP4), mxfp4, awq, gptq and compressed-tensors (FP8, "
        "NVFP4, NVFP4A16, MXFP4, int4); a quantized checkpoint is never read as BF16",
    )


def _quant_file(path: Path) -> Path:
    """``hf_quant_config.json`` beside ``config.json``; ``X_hf_quant_config.json`` beside
    a bundled ``X_config.json``."""
    return path.with_name(path.name.removesuffix("config.json") + "hf_quant_config.json")


def read_quantization(raw: dict[str, Any], cfg: dict[str, Any], path: Path) -> Quantization | None:
    """The checkpoint's quantization, from ``config.json`` (``raw``, its decoder ``cfg``) at
    ``path`` or the ModelOpt file beside it; None for an unquantized checkpoint.

    Raises:
        ConfigError: a format tokenyard does not model; ``field`` is the config key.
    """
    for where, qc in (
        ("quantization_config", raw.get("quantization_config")),
        ("text_config.quantization_config", cfg.get("quantization_config")),
    ):
        if qc is not None:
            return _from_config(qc, where, f"{path.name} {where}")
    side = _quant_file(path)
    if side == path or not side.is_file():
        return None
    try:
        data = json.loads(side.read_bytes())
    except (OSError, ValueError) as exc:
        raise _bad(side.name, f"cannot read ({exc})") from None
    qc = data.get("quantization") if isinstance(data, dict) else None
    return _modelopt(qc if isinstance(qc, dict) else {}, f"{side.name}: quantization", side.name)


def resolve_quantization(
    checkpoint: Quantization | None, dtype: str, override: str
) -> Quantization | None:
    """The weights a replica runs: ``replica.quantization`` (``override``) names a scheme,
    ``none`` or ``auto`` (the checkpoint's); ``replica.dtype`` (``dtype``) must agree.

    ``auto`` dtype takes the quantization's weights (bf16 without one). A dtype other than
    the quantization's weights is refused: pricing an FP8 checkpoint's weights at 2 bytes
    would be the silent BF16 this module exists to end. ``replica.quantization = "none"``
    prices the model unquantized at ``replica.dtype``.

    Raises:
        ConfigError: an unknown ``replica.quantization``, or a ``replica.dtype`` that
            contradicts the quantization (naming both and where it was read).
    """
    if override not in QUANTIZATION_CHOICES:
        raise ConfigError(
            f"replica.quantization: must be one of {', '.join(QUANTIZATION_CHOICES)}, "
            f"got {override!r}",
            field="replica.quantization",
            value=repr(override),
        )
    if override == "none":
        return None
    if override == "auto":
        quant = checkpoint
    else:
        kv = checkpoint.kv_cache_dtype if checkpoint else ""
        # The checkpoint's own scheme named again keeps its activation scales (a static
        # FP8 checkpoint stays static); another scheme is an online quantization.
        same = checkpoint is not None and checkpoint.scheme == override
        scales = checkpoint.activation_scales if same and checkpoint else ""
        quant = scheme(
            override, kv_cache_dtype=kv, source="replica.quantization", activation_scales=scales
        )
    if quant is None or dtype == "auto":
        return quant
    weights = {"fp8": ("fp8", "fp8_e4m3"), "int4": ("int4",), "fp4": ()}[quant.weights]
    if dtype not in weights:
        raise ConfigError(
            f"replica.dtype: {dtype!r} contradicts the {quant.describe()} weights "
            f"({quant.source}); leave replica.dtype at 'auto', or set "
            "replica.quantization = 'none' to price the model unquantized",
            field="replica.dtype",
            value=repr(dtype),
        )
    return quant
