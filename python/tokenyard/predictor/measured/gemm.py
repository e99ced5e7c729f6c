"""Which measured GEMM kernels price a model: the layers' family (``replica.dtype``, or a
quantized checkpoint's scheme), the 16-bit one of the LM head and router, and static FP8
activations as the ``fp8`` rows less the ``quantize`` tables' costs."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from tokenyard.catalog import ModelSpec
from tokenyard.catalog.quant import Quantization
from tokenyard.errors import ConfigError
from tokenyard.predictor.measured.data import MeasuredSource
from tokenyard.predictor.measured.lookup import present, read, table_dtype
from tokenyard.predictor.measured.ops import (
    GemmTimes,
    NotMeasured,
    QuantizeTimes,
    StaticFp8GemmTimes,
)


def pick_gemms(
    source: MeasuredSource,
    model: ModelSpec,
    weight_dtype: str,
    quantization: Quantization | None,
) -> tuple[GemmTimes | StaticFp8GemmTimes, GemmTimes, str, dict[str, str]]:
    """The layers' GEMMs, the 16-bit ones (LM head, router, MTP ``eh_proj``), the experts'
    table dtype, and which family priced what (``gemm``, ``lm_head``, and ``gemm_note`` /
    ``gemm_why`` for static FP8).

    Raises:
        ConfigError: a dtype or quantization the GEMM (or MoE) table does not measure.
    """
    gemm_path = source.folders["gemm"] / "gemm_perf.parquet"
    gemm_rows = read(source, gemm_path)
    measured = gemm_rows.values("gemm_dtype")
    if quantization is None:
        dtype = table_dtype(weight_dtype, "replica.dtype", measured)
        moe_dtype, edge_dtype = dtype, dtype
    else:
        if quantization.experts_only:  # gpt-oss MXFP4: attention and dense GEMMs in bf16
            dtype = table_dtype("bf16", "replica.dtype", measured)
        else:
            dtype = _quantized_dtype(quantization, "gemm", gemm_path, measured)
        # The LM head and the router stay 16-bit in quantized checkpoints (vLLM 0.33 builds
        # DeepSeek-V2's gate with no quant config; Qwen3-MoE's follows the checkpoint's
        # config, taken here to leave it out), so they run the bf16 GEMM.
        edge_dtype = table_dtype("bf16", "replica.dtype", measured)
        moe_dtype = quantization.moe_dtype
        if model.num_experts > 1 and "moe" in source.folders:
            moe_path = source.folders["moe"] / "moe_perf.parquet"
            if present(moe_path):
                moe_measured = read(source, moe_path).values("moe_dtype")
                _quantized_dtype(quantization, "moe", moe_path, moe_measured)
    # Each dtype's GEMMs from its own rows, every kernel where it was measured (block FP8
    # included: its rows are priced as measured, as aiconfigurator prices them).
    base = GemmTimes(gemm_rows, dtype)
    edge = base if edge_dtype == dtype else GemmTimes(gemm_rows, edge_dtype)
    gemm: GemmTimes | StaticFp8GemmTimes = base
    kernels = {"gemm": dtype, "lm_head": edge_dtype}
    if quantization is not None and dtype == "fp8" and quantization.activation_scales == "static":
        gemm, kernels["gemm_note"], why = _static_fp8(source, base)
        if why:
            kernels["gemm_why"] = why
    return gemm, edge, moe_dtype, kernels


def _quantized_dtype(quant: Quantization, family: str, path: Path, available: list[str]) -> str:
    """The table dtype of ``quant``'s ``family`` (``gemm`` or ``moe``) kernels, or a
    ConfigError on ``replica.quantization`` listing what ``path`` measures."""
    dtype = quant.gemm_dtype if family == "gemm" else quant.moe_dtype
    if dtype not in available:
        raise ConfigError(
            f"replica.quantization: {quant.describe()} ({quant.source}) runs "
            f"{family}_dtype {dtype!r} kernels, which {path} does not measure; measured: "
            f"{', '.join(str(a) for a in available)}. Set replica.quantization to a measured "
            "scheme (or 'none'), other tables ([execution.measured]), or "
            'execution.model = "roofline"',
            field="replica.quantization",
            value=repr(quant.scheme),
        )
    return dtype


def _static_fp8(
    source: MeasuredSource, gemm: GemmTimes
) -> tuple[GemmTimes | StaticFp8GemmTimes, str, str]:
    """Per-tensor FP8 GEMMs with static activation scales: ``gemm`` (the dynamic ``fp8``
    rows) less the ``quantize`` tables' costs (``StaticFp8GemmTimes``); where those tables
    are missing, ``gemm`` itself, said so. Also the banner's note and the fallback's why."""
    folder = source.folders.get("quantize")
    names = ("computescale_perf.parquet", "scale_matrix_perf.parquet")
    why = f"no quantize tables ({', '.join(names)}) for {source.system}/{source.framework}"
    if folder is not None and all(present(folder / name) for name in names):
        try:
            compute_scale, scale_matrix = (QuantizeTimes(read(source, folder / n)) for n in names)
        except NotMeasured as exc:
            why = str(exc)
        else:
            note = (
                "static fp8 activations: fp8 rows less computescale, o_proj and down_proj "
                f"also less scale_matrix (quantize {folder.name})"
            )
            return StaticFp8GemmTimes(gemm, compute_scale, scale_matrix), note, ""
    note = "static fp8 activations priced at the dynamic fp8 rows"
    return gemm, note, f"static FP8 activations priced as dynamic: {why}"


#: The MLA projections a checkpoint may keep 16-bit (NVIDIA's ModelOpt NVFP4 DeepSeek and
#: Kimi releases list them in ``exclude_modules``; vLLM then builds them unquantized).
MLA_PROJECTIONS = ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj")
#: Modules a ModelOpt checkpoint may keep 16-bit (``exclude_modules``), each a kind of
#: layer and the linears vLLM builds there (leaf names under a decoder layer; a pattern
#: must cover all of one entry's leaves). MLA's module is priced whole, so any one of its
#: projections kept 16-bit counts (DeepSeek-V3.1-NVFP4 names each of them per layer).
KEPT_MODULES: dict[str, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = {
    "attention": (
        ("gqa", "sliding", "chunked"),
        (("self_attn.qkv_proj", "self_attn.o_proj"), ("self_attn.q_proj", "self_attn.o_proj")),
    ),
    "shared_experts": (
        ("moe",),
        (
            ("mlp.shared_expert.gate_up_proj", "mlp.shared_expert.down_proj"),
            ("mlp.shared_experts.gate_up_proj", "mlp.shared_experts.down_proj"),
            ("mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj"),
            ("mlp.gate_up_proj", "mlp.down_proj"),  # Gemma 4's dense MLP beside the experts
        ),
    ),
    "linear_attention": (
        ("gdn",),
        (("linear_attn.in_proj_qkvz", "linear_attn.out_proj"),),
    ),
    "mla": (("mla",), tuple((f"self_attn.{p}",) for p in MLA_PROJECTIONS)),
}

_LAYER = re.compile(r"^(.*?layers\.)(\d+)\.")


def modules_unquantized(quantization: Quantization | None, model: ModelSpec, module: str) -> bool:
    """Whether ``quantization``'s ``exclude_modules`` keep ``module`` (a ``KEPT_MODULES``
    key) 16-bit in at least half the layers that have it, as vLLM 0.33 then builds those
    linears unquantized (``modelopt.py``, ``ModelOptQuantConfigBase.is_layer_excluded``:
    the list is wildcards over the module's prefix). Patterns are matched with
    ``fnmatch`` against each layer's names under the pattern's own prefix
    (``model.language_model.layers.``, ``language_model.model.layers.``, ...), or
    ``model.layers.`` for a pattern naming no layer (``*.mlp.shared_expert.*``).

    Qwen3.5-*-NVFP4 keep ``self_attn*``, ``linear_attn*`` and ``shared_expert*`` of every
    layer; Kimi-K2.6-NVFP4 ``self_attn*`` and ``shared_experts*``; MiniMax-M2.x-NVFP4
    ``self_attn*``; DeepSeek-V3.1-NVFP4 each MLA projection of every layer."""
    if quantization is None or not quantization.unquantized_modules:
        return False
    kinds, entries = KEPT_MODULES[module]
    mixers, ffns = model.mixers(), model.ffns()
    kind_of = ffns if module == "shared_experts" else mixers
    layers = [i for i, kind in enumerate(kind_of) if kind in kinds]
    if module == "shared_experts" and not model.num_shared_experts:
        return False
    if not layers:
        return False
    kept = 0
    for i in layers:
        for pattern in quantization.unquantized_modules:
            found = _LAYER.match(pattern)
            prefix = found.group(1) if found else "model.layers."
            if any(
                all(fnmatch.fnmatchcase(f"{prefix}{i}.{leaf}", pattern) for leaf in leaves)
                for leaves in entries
            ):
                kept += 1
                break
    return 2 * kept >= len(layers)
