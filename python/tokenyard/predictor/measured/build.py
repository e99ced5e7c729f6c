"""The measured predictor: a model's operations priced from measured GPU kernel tables.

Each operation of a decoder layer maps to the table that measured it, at the shape one TP
worker runs (``h`` hidden, ``q = heads/TP x head_dim``, ``kv = ceil(kv_heads/TP) x
head_dim``, ``i = intermediate/TP``):

===================  ===============================================================
operation            table, shape
===================  ===============================================================
``qkv_proj``         GEMM ``m = tokens, n = q + 2kv, k = h``
``attn_prefill``     context attention, chunks x cached prefix (``grids.py``)
``attn_decode``      generation attention, decodes x keys
``o_proj``           GEMM ``n = h, k = q``
``gate_up_proj``     GEMM ``n = 2i, k = h`` (dense)
``down_proj``        GEMM ``n = h, k = i`` (dense)
``moe_experts``      MoE block at TP (MoE models; the router is a GEMM)
``all_reduce`` x2    the framework's all-reduce (else NCCL's) of ``tokens x h`` values
``lm_head``          GEMM ``m = requests, n = vocab/TP, k = h``
===================  ===============================================================

Everything else (norms, RoPE, the KV store, the activation, embedding, pipeline sends, and
any operation whose slice the tables lack) keeps the calibrated roofline's cost, and
``CompiledOp.source`` says which is which (``measured:<table>`` or ``calibrated``).

Kernel families: the tables measure one GEMM and one MoE kernel per weight format
(``gemm_dtype``, ``moe_dtype``). A quantized model (``catalog/quant.py``) prices its layers'
GEMMs and experts with its scheme's family (block FP8: ``fp8_block``; per-tensor FP8:
``fp8``; NVFP4: ``nvfp4``; MXFP4 experts: ``w4a16_mxfp4``; int4: ``int4_wo``) and the LM
head and router, which stay 16-bit, with ``bfloat16``. Per-tensor FP8 with static
activation scales (ModelOpt) takes the ``fp8`` rows less the ``quantize`` tables' costs
(``ops.StaticFp8GemmTimes``), as aiconfigurator's ``fp8_static``. A family the tables lack is a
ConfigError on ``replica.quantization`` listing what they measure. A plain
``replica.dtype`` prices every GEMM and the experts at that dtype (``fp8``: per-tensor).
``description["kernels"]`` says which family priced what.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.catalog.quant import Quantization
from tokenyard.errors import ConfigError
from tokenyard.predictor import grids
from tokenyard.predictor.calibration import Calibration, builtin_calibration, fit_calibration
from tokenyard.predictor.compiled import CompiledOp, CompiledPredictor, TableCost
from tokenyard.predictor.measured.data import MeasuredSource
from tokenyard.predictor.measured.ops import (
    A2aTimes,
    AttentionTimes,
    CollectiveTimes,
    GemmTimes,
    LinearMixerTimes,
    MlaBmmTimes,
    MlaModuleTimes,
    MoeShape,
    MoeTimes,
    NotMeasured,
    QuantizeTimes,
    StaticFp8GemmTimes,
    layer_shapes,
)
from tokenyard.predictor.measured.tables import Columns, read_table, table_error
from tokenyard.predictor.roofline import A2A_OPS, CpuOverheads, roofline_predictor

__all__ = ["TABLE_DTYPES", "measured_predictor"]

#: tokenyard dtype -> the tables' name for it (GEMM, KV cache).
TABLE_DTYPES = {
    "auto": "bfloat16",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "fp8",
    "int8": "int8",
    "int4": "int4",
}


def _read(source: MeasuredSource, path: Path) -> Columns:
    # Kept per file version: a table rewritten during a session is read again.
    try:
        stat = path.stat()
    except OSError as exc:  # missing, or a dangling or looping link
        reason = exc.strerror or str(exc)
        if path.is_symlink():
            reason += f"; it is a link to {os.readlink(path)}"
        raise table_error(source.field, path, None, f"cannot read the table ({reason})") from None
    return _read_version(path, stat.st_size, stat.st_mtime_ns, source.field)


@functools.lru_cache(maxsize=16)
def _read_version(path: Path, size: int, mtime_ns: int, field: str) -> Columns:
    return read_table(path, field=field)


def _table_dtype(name: str, field: str, available: list[str]) -> str:
    dtype = TABLE_DTYPES.get(name, name)
    if dtype not in available:
        raise ConfigError(
            f"{field}: {name!r} is not measured in these tables; measured: "
            f"{', '.join(str(a) for a in available)}",
            field=field,
            value=repr(name),
        )
    return dtype


@dataclasses.dataclass(frozen=True)
class _Shapes:
    h: int
    q_heads: int
    kv_heads: int
    head_dim: int
    i: int
    vocab: int

    @property
    def q(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim


def _shapes(model: ModelSpec, tp: int) -> _Shapes:
    return _Shapes(
        h=model.hidden_size,
        q_heads=model.num_heads // tp,
        kv_heads=math.ceil(model.num_kv_heads / tp),
        head_dim=model.head_dim,
        i=model.intermediate_size // tp,
        vocab=math.ceil(model.vocab_size / tp),
    )


def _present(path: Path) -> bool:
    """A table file is there, perhaps as a broken link (which reading then reports)."""
    return path.is_file() or path.is_symlink()


def _gemm_table(
    gemm: GemmTimes | StaticFp8GemmTimes,
    n: int,
    k: int,
    feature: str,
    *,
    quantized_input: bool = False,
) -> TableCost:
    """A GEMM's seconds over the measured rows; ``quantized_input``: the op before it hands
    it quantized activations (``o_proj``, ``down_proj``; ``StaticFp8GemmTimes``)."""
    xs = tuple(float(m) for m in gemm.m_grid)
    values = tuple(gemm(m, n, k, quantized_input=quantized_input) for m in xs)
    return TableCost(x=feature, xs=xs, values=values)


def _prefill_seconds(
    context: Callable[[float, float], float],
) -> Callable[[float, float, float], float]:
    def seconds(batch: float, seq: float, prefix: float) -> float:
        alone = context(batch, seq)
        if prefix <= 0.0:
            return alone
        # A chunk over a cached prefix: the whole sequence's causal attention, less the
        # prefix's share of the query-key pairs; never less than the chunk alone (a short
        # chunk is launch-bound, and more keys do not make it faster).
        full = seq + prefix
        return max(alone, context(batch, full) * (full * full - prefix * prefix) / (full * full))

    return seconds


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


def _measured_ops(
    source: MeasuredSource,
    model: ModelSpec,
    s: _Shapes,
    tp: int,
    weight_dtype: str,
    kv_dtype: str,
    moe_distribution: str,
    quantization: Quantization | None = None,
    ep: int = 1,
    dp: int = 1,
) -> tuple[dict[str, tuple[TableCost | None, str, str]], dict[str, str]]:
    """Operation name -> (table, source label, reason it is absent); ``None`` tables keep
    the roofline. Also which kernel family priced what (``gemm``, ``moe``, ``lm_head``)."""
    gemm_path = source.folders["gemm"] / "gemm_perf.parquet"
    gemm_rows = _read(source, gemm_path)
    measured = gemm_rows.values("gemm_dtype")
    if quantization is None:
        dtype = _table_dtype(weight_dtype, "replica.dtype", measured)
        moe_dtype, edge_dtype = dtype, dtype
    else:
        if quantization.experts_only:  # gpt-oss MXFP4: attention and dense GEMMs in bf16
            dtype = _table_dtype("bf16", "replica.dtype", measured)
        else:
            dtype = _quantized_dtype(quantization, "gemm", gemm_path, measured)
        # The LM head and the router stay 16-bit in quantized checkpoints (vLLM loads them
        # unquantized), so they run the bf16 GEMM.
        edge_dtype = _table_dtype("bf16", "replica.dtype", measured)
        moe_dtype = quantization.moe_dtype
        if model.num_experts > 1 and "moe" in source.folders:
            moe_path = source.folders["moe"] / "moe_perf.parquet"
            if _present(moe_path):
                moe_measured = _read(source, moe_path).values("moe_dtype")
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
    label = f"measured:gemm ({source.folders['gemm'].name})"
    out: dict[str, tuple[TableCost | None, str, str]] = {
        "lm_head": (_gemm_table(edge, s.vocab, s.h, "num_requests"), label, ""),
    }
    if quantization is not None and quantization.experts_only:
        gemm = edge  # gpt-oss: attention and dense projections in bf16
        kernels["gemm"] = edge_dtype
    if model.mla is None:
        for mixer in dict.fromkeys(model.mixers()):
            if mixer not in ("gqa", "sliding", "chunked"):
                continue
            prefix = "" if mixer == "gqa" else f"{mixer}_"
            kv_heads, head_dim = model.kv_shape(mixer)
            m = dataclasses.replace(s, kv_heads=math.ceil(kv_heads / tp), head_dim=head_dim)
            gate = m.q if model.attention_output_gate else 0
            kv_proj = m.kv if mixer == "gqa" and model.attention_k_eq_v else 2 * m.kv
            qkv = _gemm_table(gemm, m.q + gate + kv_proj, m.h, "num_tokens")
            out[f"{prefix}qkv_proj"] = (qkv, label, "")
            o_proj = _gemm_table(gemm, m.h, m.q, "num_tokens", quantized_input=True)
            out[f"{prefix}o_proj"] = (o_proj, label, "")
            window = model.window_of(mixer)
            ops = _attention_ops(source, m, kv_dtype, window, mixer == "chunked")
            out.update({prefix + name: entry for name, entry in ops.items()})
            if window:
                kernels[f"{mixer}_attention"] = next(iter(ops.values()))[1]
    else:
        module_gemm = "bfloat16" if quantization is None else quantization.gemm_dtype
        mla, kernels["mla"] = _mla_ops(source, model, tp, kv_dtype, module_gemm, gemm, label)
        out.update(mla)
    for kind in model.layer_kinds():
        if kind.ffn == "dense":
            i = kind.intermediate_size // tp
            prefix = "dense_" if model.num_experts > 1 else ""
            out[f"{prefix}gate_up_proj"] = (_gemm_table(gemm, 2 * i, s.h, "num_tokens"), label, "")
            down = _gemm_table(gemm, s.h, i, "num_tokens", quantized_input=True)
            out[f"{prefix}down_proj"] = (down, label, "")
            continue
        out["router"] = (_gemm_table(edge, model.num_experts, s.h, "num_tokens"), label, "")
        out["moe_experts"] = _moe_op(source, model, tp, moe_dtype, moe_distribution, ep, dp)
        kernels["moe"] = moe_dtype if out["moe_experts"][0] is not None else "calibrated"
        if model.num_shared_experts:
            i = model.num_shared_experts * kind.intermediate_size // tp
            out["shared_gate_up_proj"] = (_gemm_table(gemm, 2 * i, s.h, "num_tokens"), label, "")
            down = _gemm_table(gemm, s.h, i, "num_tokens", quantized_input=True)
            out["shared_down_proj"] = (down, label, "")
    if model.mtp_module:  # [embedding; hidden] -> h: a whole bf16 nn.Linear in vLLM's MTP
        out["eh_proj"] = (_gemm_table(edge, s.h, 2 * s.h, "num_tokens"), label, "")
    if tp > 1:
        out["all_reduce"] = out["embedding_all_reduce"] = _all_reduce_op(source, s, tp)
    if model.linear is not None:
        linear, kernels[model.linear.kind] = _linear_ops(source, model, tp, gemm, label)
        out.update(linear)
    if dp > 1 and model.num_moe_layers:
        a2a, kernels["a2a"] = _a2a_ops(source, model, tp, ep)
        out.update(a2a)
    return out, kernels


#: The kernels of a linear-attention layer's tables, by op: (phase, conv kernel or not).
_LINEAR_KERNELS = {
    "conv_prefill": ("context", True),
    "scan_prefill": ("context", False),
    "conv_decode": ("generation", True),
    "scan_decode": ("generation", False),
}


def _linear_key(model: ModelSpec, tp: int) -> tuple[dict[str, int], str]:
    """The structural key of the model's linear layer in its table (GDN: heads per TP
    rank, as aiconfigurator keys them; Mamba2: the whole layer's, measured at TP 1), or
    ``({}, why)`` where the table cannot hold this layout."""
    lin = model.linear
    if lin is None:
        return {}, ""
    if lin.kind == "gdn":
        key = {
            "d_model": model.hidden_size,
            "num_k_heads": lin.num_groups // tp,
            "head_k_dim": lin.group_dim,
            "num_v_heads": lin.num_heads // tp,
            "head_v_dim": lin.head_dim,
            "d_conv": lin.conv_kernel,
        }
        return key, ""
    if tp > 1:
        return {}, (
            f"mamba2_perf rows are whole layers (all {lin.num_heads} heads, as aiconfigurator "
            f"looks them up), not one of TP {tp} ranks' share"
        )
    key = {
        "d_model": model.hidden_size,
        "nheads": lin.num_heads,
        "head_dim": lin.head_dim,
        "d_state": lin.group_dim,
        "n_groups": lin.num_groups,
        "d_conv": lin.conv_kernel,
    }
    return key, ""


def _linear_prefill(times: LinearMixerTimes, batch: float, seq: float, prefix: float) -> float:
    """A prefill of ``batch`` chunks of ``seq`` tokens: the rows' prompts of ``seq``
    tokens, whatever the cached prefix (a chunk resumes from the state the prefix left,
    the same work per token as from a zero state)."""
    return times(batch, seq)


def _linear_tables_elsewhere(source: MeasuredSource, table: str) -> str:
    """Where else under the data root ``table`` is measured for this system."""
    found = sorted(
        f"{path.parent.parent.name} {path.parent.name}"
        for path in (source.root / source.system / "linear_attention").glob(f"*/*/{table}")
    )
    return f"measured for {source.system} under {', '.join(found)}" if found else "none"


def _linear_ops(
    source: MeasuredSource,
    model: ModelSpec,
    tp: int,
    gemm: GemmTimes | StaticFp8GemmTimes,
    gemm_label: str,
) -> tuple[dict[str, tuple[TableCost | None, str, str]], str]:
    """A gated DeltaNet or Mamba2 layer: its projections from the GEMM table (GDN's
    ``in_proj_qkvz`` and ``in_proj_ba`` are two GEMMs), the causal conv and the scan from
    ``linear_attention/<kind>_perf`` (one row: one kernel of one layer, ``context`` for
    ``batch_size`` prompts of ``seq_len`` tokens, ``generation`` for ``batch_size``
    one-token decodes) where the table measures this layer shape, each phase's own kernel
    (vLLM runs a step's prefills and decodes through separate kernels); the gated norm,
    and any kernel without rows, from the calibrated roofline with the reason. Also the
    banner's words."""
    lin = model.linear
    if lin is None:
        return {}, ""
    kind, h = lin.kind, model.hidden_size
    inner = lin.num_heads // tp * lin.head_dim
    out: dict[str, tuple[TableCost | None, str, str]] = {}
    if kind == "gdn":  # in_proj_qkvz (q, k, v, z) and in_proj_ba (two scalars per head)
        qkvz = (2 * lin.inner + 2 * lin.num_groups * lin.group_dim) // tp
        ba = 2 * lin.num_heads // tp
        xs = tuple(float(m) for m in gemm.m_grid)
        values = tuple(gemm(m, qkvz, h) + gemm(m, ba, h) for m in xs)
        out[f"{kind}_in_proj"] = (TableCost(x="num_tokens", xs=xs, values=values), gemm_label, "")
    else:
        in_proj = _gemm_table(gemm, lin.in_proj_width() // tp, h, "num_tokens")
        out[f"{kind}_in_proj"] = (in_proj, gemm_label, "")
    out[f"{kind}_out_proj"] = (_gemm_table(gemm, h, inner, "num_tokens"), gemm_label, "")
    out[f"{kind}_gated_norm"] = (
        None,
        "calibrated",
        "the gated RMSNorm is not a kernel the linear_attention tables measure",
    )
    table = f"{kind}_perf.parquet"
    folder = source.folders.get("linear_attention")
    key, why = _linear_key(model, tp)
    rows = None
    if not why and (folder is None or not _present(folder / table)):
        why = (
            f"no linear_attention/{table} for {source.system}/{source.framework} at or below "
            f"{source.version} ({_linear_tables_elsewhere(source, table)})"
        )
    elif not why and folder is not None:
        rows = _read(source, folder / table)
    version = folder.name if folder is not None else ""
    measured = []
    for op, (phase, conv) in _LINEAR_KERNELS.items():
        name = f"{kind}_{op}"
        times, reason, kernel = None, why, ""
        if rows is not None:
            in_phase = rows.where(phase=phase, **key)
            kernels = in_phase.values("kernel_source")
            mine = [k for k in kernels if ("conv1d" in str(k)) == conv]
            if mine:  # the kernel with the most rows for this phase and shape
                sources = in_phase.col("kernel_source").tolist()
                kernel = str(max(sorted(mine), key=sources.count))
                times = LinearMixerTimes(rows, kernel_source=kernel, phase=phase, key=key)
            elif kernels:
                reason = (
                    f"{rows.path} measures only {', '.join(map(str, kernels))} for {phase} "
                    f"at this layer shape, no {'conv1d' if conv else 'scan'} kernel"
                )
            else:
                shape = ", ".join(f"{k} {v}" for k, v in key.items())
                reason = (
                    f"{rows.path} has no {phase} rows for {model.name}'s layer ({shape}); "
                    f"it measures {layer_shapes(rows, key)}"
                )
        if times is None:
            out[name] = (None, "calibrated", f"{name} by the calibrated roofline: {reason}")
            continue
        measured.append(op)
        label = f"measured:{kind}_perf {kernel} ({version})"
        if phase == "context":  # a chunk after cached tokens resumes from the state
            seconds = functools.partial(_linear_prefill, times)
            out[name] = (grids.prefill_attention_table(seconds), label, "")
        else:
            out[name] = (grids.token_table("num_decode_tokens", times, 2.0**17), label, "")
    if not measured:
        return out, "calibrated roofline"
    if len(measured) == len(_LINEAR_KERNELS):
        return out, f"measured:{kind}_perf (conv, scan; {version})"
    return out, f"measured:{kind}_perf {', '.join(measured)} ({version}), the rest calibrated"


def _static_fp8(
    source: MeasuredSource, gemm: GemmTimes
) -> tuple[GemmTimes | StaticFp8GemmTimes, str, str]:
    """Per-tensor FP8 GEMMs with static activation scales: ``gemm`` (the dynamic ``fp8``
    rows) less the ``quantize`` tables' costs (``StaticFp8GemmTimes``); where those tables
    are missing, ``gemm`` itself, said so. Also the banner's note and the fallback's why."""
    folder = source.folders.get("quantize")
    names = ("computescale_perf.parquet", "scale_matrix_perf.parquet")
    why = f"no quantize tables ({', '.join(names)}) for {source.system}/{source.framework}"
    if folder is not None and all(_present(folder / name) for name in names):
        try:
            compute_scale, scale_matrix = (QuantizeTimes(_read(source, folder / n)) for n in names)
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


def _kernels_text(kernels: dict[str, str], quantization: Quantization | None) -> str:
    """The banner's words: ``GEMM fp8_block (LM head bfloat16), MoE fp8_block``."""
    text = f"GEMM {kernels['gemm']}"
    if kernels["lm_head"] != kernels["gemm"]:
        text += f" (LM head{', router' if 'moe' in kernels else ''} {kernels['lm_head']})"
    if "moe" in kernels:
        text += f", MoE {kernels['moe']}"
    if "mla" in kernels:
        text += f", MLA {kernels['mla']}"
    if "a2a" in kernels:
        text += f", all-to-all {kernels['a2a']}"
    for mixer in ("gdn", "mamba2"):
        if mixer in kernels:
            text += f", {mixer} {kernels[mixer]}"
    for mixer in ("sliding", "chunked"):
        if f"{mixer}_attention" in kernels:
            text += f", {mixer} attention {kernels[f'{mixer}_attention']}"
    if quantization is not None:
        text += f"; {quantization.scheme} from {quantization.source}"
        if "gemm_note" in kernels:
            text += f"; {kernels['gemm_note']}"
    elif kernels["gemm"] == "fp8":
        text += "; per-tensor fp8 from replica.dtype"
    return text


#: Operations of the roofline's MLA attention that one measured MLA module row includes.
MLA_MODULE_OPS = (
    "qkv_a_proj",
    "latent_norm",
    "q_b_proj",
    "rope",
    "kv_store",
    "kv_b_proj",
    "mla_bmm_pre",
    "mla_bmm_post",
    "o_proj",
)
#: The MLA dims vLLM's MLA BMM collector measures (DeepSeek-V3's: qk_nope, kv_lora, v).
_MLA_BMM_DIMS = (128, 512, 128)


def _mla_gemm_shapes(model: ModelSpec, tp: int) -> dict[str, tuple[int, int, str]]:
    """The MLA projections on one TP rank: op -> (n, k, the feature of its rows)."""
    mla = model.mla
    if mla is None:
        return {}
    h, n = model.hidden_size, model.num_heads // tp
    return {
        "qkv_a_proj": (mla.q_lora_rank + mla.latent_dim, h, "num_tokens"),
        "q_b_proj": (n * mla.qk_head_dim, mla.q_lora_rank or h, "num_tokens"),
        "kv_b_proj": (
            n * (mla.qk_nope_head_dim + mla.v_head_dim),
            mla.kv_lora_rank,
            "num_prefill_tokens",
        ),
        "o_proj": (h, n * mla.v_head_dim, "num_tokens"),
        **(
            {
                "indexer_q_proj": (
                    model.indexer.num_heads * model.indexer.head_dim,
                    mla.q_lora_rank or h,
                    "num_tokens",
                ),
                "indexer_k_proj": (
                    model.indexer.head_dim + model.indexer.num_heads,
                    h,
                    "num_tokens",
                ),
            }
            if model.indexer is not None
            else {}
        ),
    }


def _module_model(rows: Columns, model: ModelSpec) -> tuple[str, str]:
    """The ``model`` of the MLA module rows whose config has ``model``'s shape (hidden
    size and MLA dims; the head count is a column), or ("", why none has)."""
    from tokenyard import catalog

    mine = (model.hidden_size, model.mla, model.indexer)
    seen = []
    for name in rows.values("model"):
        try:
            measured = catalog.model(str(name), field="execution.measured")
        except ConfigError:
            seen.append(f"{name} (its config is not known here)")
            continue
        if (measured.hidden_size, measured.mla, measured.indexer) == mine:
            return str(name), ""
        seen.append(f"{name} (hidden {measured.hidden_size}, {measured.mla})")
    return "", (
        f"{rows.path} measures the MLA module of {', '.join(seen)}, not {model.name}'s shape "
        f"(hidden {model.hidden_size}, {model.mla})"
    )


def _mla_ops(
    source: MeasuredSource,
    model: ModelSpec,
    tp: int,
    kv_dtype: str,
    gemm_type: str,
    gemm: GemmTimes | StaticFp8GemmTimes,
    gemm_label: str,
) -> tuple[dict[str, tuple[TableCost | None, str, str]], str]:
    """MLA attention: the measured module (one row = one layer's whole attention at one
    TP rank's heads) for prefill chunks and for decodes, where the tables measure this
    model's shape, GEMM family and KV dtype; else the projections from the GEMM table,
    the absorbed-decode BMMs from ``mla_bmm`` (at DeepSeek-V3's dims) and the attention
    itself from the calibrated roofline, each with its reason. Also the banner's words."""
    heads = model.num_heads // tp
    why = _mla_module_why(source, model)
    dsa = _dsa_folder(source) if model.indexer is not None else None
    table = "dsa" if model.indexer is not None else "mla"
    if not why:
        folder = dsa or source.folders["mla"]
        context_rows = _read(source, folder / f"{table}_context_module_perf.parquet")
        generation_rows = _read(source, folder / f"{table}_generation_module_perf.parquet")
        name, why = _module_model(context_rows, model)
    if not why:
        kv_name = TABLE_DTYPES.get(kv_dtype, kv_dtype)
        layout = dict(num_heads=heads, kv_cache_dtype=kv_name, gemm_type=gemm_type)
        try:
            context = MlaModuleTimes(context_rows.where(model=name), generation=False, **layout)  # type: ignore[arg-type]
            generation = MlaModuleTimes(
                generation_rows.where(model=name),
                generation=True,
                **layout,  # type: ignore[arg-type]
            )
        except NotMeasured as exc:
            why = str(exc)
    if not why:
        label = f"measured:{table}_module ({(dsa or source.folders['mla']).name})"
        out: dict[str, tuple[TableCost | None, str, str]] = {
            "attn_prefill": (grids.prefill_attention_table(_prefill_seconds(context)), label, ""),
            "attn_decode": (grids.decode_attention_table(generation), label, ""),
        }
        inside = f"in the measured {table.upper()} module ({label})"
        for op in MLA_MODULE_OPS + (DSA_MODULE_OPS if dsa else ()):
            out[op] = (None, "dropped", inside)
        kind = "DSA module" if dsa else "module"
        return out, f"{kind} ({gemm_type}, KV {kv_name}, {heads} heads per GPU)"
    out = {
        op: (_gemm_table(gemm, n, k, feature, quantized_input=op == "o_proj"), gemm_label, "")
        for op, (n, k, feature) in _mla_gemm_shapes(model, tp).items()
    }
    out["attn_prefill"] = (None, "calibrated", why)
    out["attn_decode"] = (None, "calibrated", why)
    if model.indexer is not None:
        for op in ("indexer_prefill", "indexer_decode", "indexer_k_store"):
            out[op] = (None, "calibrated", why)
    bmm = "calibrated"
    mla = model.mla
    dims = (mla.qk_nope_head_dim, mla.kv_lora_rank, mla.v_head_dim) if mla else ()
    bmm_path = source.folders.get("mla_bmm", Path()) / "mla_bmm_perf.parquet"
    if dims == _MLA_BMM_DIMS and "mla_bmm" in source.folders and _present(bmm_path):
        rows = _read(source, bmm_path)
        label = f"measured:mla_bmm ({bmm_path.parent.name})"
        for op, name in (("mla_bmm_pre", "mla_gen_pre"), ("mla_bmm_post", "mla_gen_post")):
            try:
                times = MlaBmmTimes(rows, op_name=name, num_heads=heads)
            except NotMeasured as exc:
                out[op] = (None, "calibrated", str(exc))
                continue
            out[op] = (grids.token_table("num_decode_tokens", times, 2.0**17), label, "")
            bmm = "mla_bmm"
    else:
        for op in ("mla_bmm_pre", "mla_bmm_post"):
            out[op] = (None, "calibrated", f"no MLA BMM table measures dims {dims}")
    return out, f"GEMMs + {bmm} BMMs + calibrated attention"


#: The indexer's operations, inside a measured DSA module row (aiconfigurator's
#: ``ContextDSAModule`` / ``GenerationDSAModule``: wq_b, weights_proj, FP8 MQA logits,
#: top-k, then the sparse MLA).
DSA_MODULE_OPS = (
    "indexer_q_proj",
    "indexer_k_proj",
    "indexer_k_store",
    "indexer_prefill",
    "indexer_decode",
)


def _dsa_folder(source: MeasuredSource) -> Path | None:
    """The ``sparse_attention`` tables beside ``source``'s (the newest version at or
    below its own), None if its framework has none."""
    from tokenyard.predictor.measured.data import _version_key, _versions

    found = [
        v
        for v in _versions(source.root, source.system, "sparse_attention", source.framework)
        if _version_key(v) <= _version_key(source.version)
    ]
    if not found:
        return None
    return source.root / source.system / "sparse_attention" / source.framework / found[-1]


def _mla_module_why(source: MeasuredSource, model: ModelSpec) -> str:
    if model.indexer is not None:
        folder = _dsa_folder(source)
        names = ("dsa_context_module_perf.parquet", "dsa_generation_module_perf.parquet")
        if folder is None or not all(_present(folder / n) for n in names):
            return (
                f"no sparse_attention (DSA module) tables for {source.system}/"
                f"{source.framework} at or below {source.version}; sparse MLA and the indexer "
                "priced by the calibrated roofline"
            )
        return ""
    folder = source.folders.get("mla")
    names = ("mla_context_module_perf.parquet", "mla_generation_module_perf.parquet")
    if folder is None or not all(_present(folder / n) for n in names):
        return f"no MLA module tables for {source.system}/{source.framework}"
    return ""


def _attention_ops(
    source: MeasuredSource, s: _Shapes, kv_dtype: str, window: int = 0, chunked: bool = False
) -> dict[str, tuple[TableCost | None, str, str]]:
    """Prefill and decode attention. A windowed layer (``window`` > 0) takes the rows
    measured at ``window_size = window`` for its layout (gpt-oss's 128, Gemma's 1024,
    Llama 4's chunk of 8192, which aiconfigurator maps to ``sliding_window_size``); where
    the tables lack that window, the full-attention rows at the work the window leaves
    (keys capped, pairs scaled: ``roofline.window_pairs``), said so in the label."""
    if window:
        return _windowed_attention_ops(source, s, kv_dtype, window, chunked)
    return _full_attention_ops(source, s, kv_dtype)


def _windowed_attention_ops(
    source: MeasuredSource, s: _Shapes, kv_dtype: str, window: int, chunked: bool
) -> dict[str, tuple[TableCost | None, str, str]]:
    from tokenyard.predictor.roofline import window_keys, window_pairs

    folder = source.folders["attention"]
    try:
        context, generation = _attention_times(source, s, kv_dtype, window)
        label = f"measured:attention window_size {window} ({folder.name})"
        return _attention_tables(_prefill_seconds(context), generation, label)
    except NotMeasured:
        pass
    context, generation = _full_attention_times(source, s, kv_dtype)

    def prefill(batch: float, seq: float, prefix: float) -> float:
        whole = _prefill_seconds(context)(batch, seq, prefix)
        full_pairs = window_pairs(seq, prefix, 0)
        return whole * window_pairs(seq, prefix, window, chunked) / max(full_pairs, 1.0)

    def decode(batch: float, keys: float) -> float:
        return float(generation(batch, window_keys(keys, window, chunked)))

    label = (
        f"measured:attention ({folder.name}) full-attention rows at the work of a "
        f"{window}-token window (window_size {window} not measured for this layout)"
    )
    return _attention_tables(prefill, decode, label)


def _full_attention_ops(
    source: MeasuredSource, s: _Shapes, kv_dtype: str
) -> dict[str, tuple[TableCost | None, str, str]]:
    context, generation = _full_attention_times(source, s, kv_dtype)
    label = f"measured:attention ({source.folders['attention'].name})"
    return _attention_tables(_prefill_seconds(context), generation, label)


def _full_attention_times(
    source: MeasuredSource, s: _Shapes, kv_dtype: str
) -> tuple[AttentionTimes, AttentionTimes]:
    """The full-attention rows of the layout, refused where the tables lack it."""
    try:
        return _attention_times(source, s, kv_dtype)
    except NotMeasured as exc:
        raise ConfigError(
            f"replica.model: the measured attention tables do not cover its layout per GPU "
            f"({s.q_heads} heads, {s.kv_heads} KV heads, head_dim {s.head_dim}): {exc}",
            field="replica.model",
            value=repr((s.q_heads, s.kv_heads, s.head_dim)),
        ) from None


def _attention_times(
    source: MeasuredSource, s: _Shapes, kv_dtype: str, window: int = 0
) -> tuple[AttentionTimes, AttentionTimes]:
    """(context, generation) attention at the layout per GPU and ``window_size``.

    Raises:
        NotMeasured: a table lacks the layout or the window.
    """
    folder = source.folders["attention"]
    context_rows = _read(source, folder / "context_attention_perf.parquet")
    generation_rows = _read(source, folder / "generation_attention_perf.parquet")
    kv_name = _table_dtype(
        kv_dtype, "replica.kv_cache_dtype", context_rows.values("kv_cache_dtype")
    )
    layout: dict[str, Any] = dict(
        num_heads=s.q_heads,
        num_kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        kv_cache_dtype=kv_name,
        window_size=window,
    )
    context = AttentionTimes(context_rows, generation=False, **layout)
    generation = AttentionTimes(generation_rows, generation=True, **layout)
    return context, generation


def _attention_tables(
    prefill: Callable[[float, float, float], float],
    decode: Callable[[float, float], float],
    label: str,
) -> dict[str, tuple[TableCost | None, str, str]]:
    return {
        "attn_prefill": (grids.prefill_attention_table(prefill), label, ""),
        "attn_decode": (grids.decode_attention_table(decode), label, ""),
    }


def _all_reduce_op(
    source: MeasuredSource, s: _Shapes, tp: int
) -> tuple[TableCost | None, str, str]:
    tables = []
    if "comm" in source.folders and _present(
        source.folders["comm"] / "custom_allreduce_perf.parquet"
    ):
        path = source.folders["comm"] / "custom_allreduce_perf.parquet"
        tables.append(
            (path, "allreduce_dtype", "bfloat16", f"measured:custom_allreduce ({path.parent.name})")
        )
    if "nccl" in source.folders:
        path = source.folders["nccl"] / "nccl_perf.parquet"
        tables.append((path, "nccl_dtype", "half", f"measured:nccl ({path.parent.name})"))
    for path, column, dtype, label in tables:
        rows = _read(source, path)
        try:
            times = CollectiveTimes(rows, tp, dtype_column=column, dtype=dtype)
        except NotMeasured:
            continue  # this table lacks the GPU count: try the next
        return _all_reduce_table(times, s.h), label, ""
    return None, "calibrated", f"no all-reduce measured over {tp} GPUs"


def _all_reduce_table(times: CollectiveTimes, hidden: int) -> TableCost:
    return grids.token_table("num_tokens", lambda tokens: times(tokens * hidden), 2.0**17)


def _moe_op(
    source: MeasuredSource,
    model: ModelSpec,
    tp: int,
    dtype: str,
    distribution: str,
    ep: int = 1,
    dp: int = 1,
) -> tuple[TableCost | None, str, str]:
    """The routed experts from the MoE table: at ``moe_tp_size = TP`` without expert
    parallelism, else at ``moe_tp_size = 1, moe_ep_size = EP``, where a row's
    ``num_tokens`` are the tokens entering the layer across the EP group: a DP rank's
    tokens times DP (each rank's batch taken as one of DP alike ones)."""
    path = source.folders.get("moe")
    if path is None or not _present(path / "moe_perf.parquet"):
        return None, "calibrated", "no MoE table"
    rows = _read(source, path / "moe_perf.parquet")
    shape = MoeShape(
        dtype=dtype,
        hidden_size=model.hidden_size,
        inter_size=model.intermediate_size,
        topk=model.experts_per_token,
        num_experts=model.num_experts,
        tensor_parallel_size=tp if ep == 1 else 1,
        expert_parallel_size=ep,
    )
    routings = shape.rows(rows).values("distribution")
    if routings and distribution not in routings:
        # The shape is measured, not under this routing: refused, not priced another way.
        raise ConfigError(
            f"execution.measured.moe_distribution: {rows.path} measures {model.name}'s "
            f"experts under {', '.join(routings)}, got {distribution!r}",
            field="execution.measured.moe_distribution",
            value=repr(distribution),
        )
    try:
        times = MoeTimes(rows, shape, distribution=distribution)
    except NotMeasured as exc:
        return None, "calibrated", str(exc)
    table = grids.token_table("num_tokens", lambda tokens: times(tokens * dp), 2.0**17)
    return table, f"measured:moe ({path.name})", ""


#: DeepEP's two modes in the ``moe_a2a`` tables: low latency (decode, CUDA graphs) and
#: high throughput (prefill), as vLLM's ``--all2all-backend deepep_low_latency`` /
#: ``deepep_high_throughput`` and SGLang's ``--deepep-mode`` name them.
A2A_BACKENDS = ("deepep_ll", "deepep_ht")
#: GPUs per node for the tables' ``node_num`` (HGX and DGX nodes: 8).
GPUS_PER_NODE = 8


def _a2a_ops(
    source: MeasuredSource, model: ModelSpec, tp: int, ep: int
) -> tuple[dict[str, tuple[TableCost | None, str, str]], str]:
    """The expert all-to-all under attention DP (``moe_dispatch``, ``moe_combine``) from
    the framework's ``comm/moe_a2a_perf`` table, at ``ep_size = EP`` over ``ceil(EP / 8)``
    nodes and the model's hidden size, top-k and expert count, by the tokens each GPU
    sends (the DP rank's tokens / TP, as aiconfigurator keys it). A step of at most as
    many tokens per GPU as the low-latency kernels are measured at (decode-sized steps)
    takes ``deepep_ll``, a larger one (prefill chunks) ``deepep_ht``; with one mode
    measured, that one. Missing rows keep the calibrated roofline, with the reason. Also
    the banner's words."""
    path = source.folders.get("comm", Path()) / "moe_a2a_perf.parquet"
    if "comm" not in source.folders or not _present(path):
        why = f"no moe_a2a_perf table for {source.system}/{source.framework} {source.version}"
        return {op: (None, "calibrated", why) for op in A2A_OPS}, "calibrated"
    rows = _read(source, path)
    nodes = -(-ep // GPUS_PER_NODE)
    out: dict[str, tuple[TableCost | None, str, str]] = {}
    used: set[str] = set()
    whys = []
    for op in A2A_OPS:
        phase = op.removeprefix("moe_")
        modes = {}
        for backend in A2A_BACKENDS:
            try:
                modes[backend] = A2aTimes(
                    rows,
                    comm_backend=backend,
                    phase=phase,
                    ep_size=ep,
                    node_num=nodes,
                    hidden_size=model.hidden_size,
                    topk=model.experts_per_token,
                    num_experts=model.num_experts,
                )
            except NotMeasured as exc:
                whys.append(str(exc))
        if not modes:
            out[op] = (None, "calibrated", whys[-1])
            continue
        used.update(modes)
        low, high = modes.get("deepep_ll"), modes.get("deepep_ht")

        def seconds(
            tokens: float, low: A2aTimes | None = low, high: A2aTimes | None = high
        ) -> float:
            per_gpu = tokens / tp
            if low is not None and (high is None or per_gpu <= low.max_tokens):
                return low(per_gpu)
            return high(per_gpu) if high is not None else 0.0

        table = grids.token_table("num_tokens", seconds, 2.0**17)
        out[op] = (table, f"measured:moe_a2a ({path.parent.name})", "")
    if not used:
        return out, "calibrated"
    limit = ""
    if len(used) == 2:
        ll = A2aTimes(
            rows,
            comm_backend="deepep_ll",
            phase="dispatch",
            ep_size=ep,
            node_num=nodes,
            hidden_size=model.hidden_size,
            topk=model.experts_per_token,
            num_experts=model.num_experts,
        )
        limit = f" up to {ll.max_tokens:g} tokens per GPU, deepep_ht above"
    first = "deepep_ll" if "deepep_ll" in used else "deepep_ht"
    return out, f"{first}{limit} (EP {ep}, moe_a2a {path.parent.name})"


def measured_predictor(
    model: ModelSpec,
    device: DeviceSpec,
    source: MeasuredSource,
    *,
    tensor_parallel_size: int = 1,
    num_pipeline_stages: int = 1,
    weight_dtype: str = "bf16",
    kv_cache_dtype: str = "bf16",
    weight_bytes: float = 2.0,
    kv_bytes: float = 2.0,
    cpu: CpuOverheads | None = None,
    calibration: Calibration | None = None,
    moe_distribution: str = "power_law_1.2",
    quantization: Quantization | None = None,
    expert_parallel_size: int = 1,
    data_parallel_size: int = 1,
) -> CompiledPredictor:
    """``model`` on ``device`` priced from ``source``'s tables, compiled for Rust.

    ``expert_parallel_size`` (EP = TP x DP, or 1) and ``data_parallel_size`` (attention
    DP) price one DP rank's step: the experts from the MoE table at ``moe_ep_size = EP``
    at the combined tokens, and with DP the expert all-to-all from ``moe_a2a_perf``
    (``roofline_predictor`` says what the layout means).

    Operations the tables lack keep the calibrated roofline (``calibration``, else the
    device's built-in one, else curves fitted to ``source`` itself). ``quantization`` (the
    resolved one: ``catalog.quant.resolve_quantization``) picks the GEMM and MoE kernel
    families; without one, ``weight_dtype`` does.

    Raises:
        ConfigError: a dtype, quantization, attention layout or MoE routing the tables do
            not measure (the key and what is measured), or a bad layout.
        ProfileError: a table that is unreadable, malformed or too sparse to interpolate
            (``field`` is ``source.field``; the message names the file and column).
    """
    tp = tensor_parallel_size
    model.check_layout(tp, num_pipeline_stages)
    calibration = calibration or builtin_calibration(device) or fit_calibration(source, device)
    base = roofline_predictor(
        model,
        device,
        tensor_parallel_size=tp,
        num_pipeline_stages=num_pipeline_stages,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        cpu=cpu,
        calibration=calibration,
        expert_parallel_size=expert_parallel_size,
        data_parallel_size=data_parallel_size,
    )
    measured, kernels = _measured_ops(
        source,
        model,
        _shapes(model, tp),
        tp,
        weight_dtype,
        kv_cache_dtype,
        moe_distribution,
        quantization,
        expert_parallel_size,
        data_parallel_size,
    )
    ops: list[CompiledOp] = []
    notes: dict[str, str] = {}
    for op in base.ops:
        if model.num_experts > 1 and op.name in ("gate_up_proj", "act", "down_proj"):
            table, label, why = measured["moe_experts"]
            if table is None:
                ops.append(op)
                notes[op.name] = why
            elif op.name == "gate_up_proj":  # one measured block stands for all three
                ops.append(CompiledOp("moe_experts", "layer", "num_tokens", table, op.count, label))
            continue
        entry = measured.get(op.name)
        if entry is not None and entry[1] == "dropped":
            continue  # priced inside a measured block (the MLA module)
        if entry is None or entry[0] is None:
            ops.append(op)
            if entry is not None:
                notes[op.name] = entry[2]
            continue
        ops.append(dataclasses.replace(op, cost=entry[0], source=entry[1]))
    description = {
        **base.description,
        "kind": "measured",
        "measured": source.describe(),
        "calibration": calibration.source,
        "fallbacks": notes,
        "kernels": _kernels_text(kernels, quantization),
    }
    if kernels.get("a2a") == "calibrated":
        description["a2a"] = f"{base.description['a2a']}; not measured: {notes['moe_dispatch']}"
    elif "a2a" in kernels:
        description["a2a"] = f"measured: {kernels['a2a']}"
    if "gemm_why" in kernels:
        notes["gemm"] = kernels["gemm_why"]
    return dataclasses.replace(base, ops=tuple(ops), description=description)
