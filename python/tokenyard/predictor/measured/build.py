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
``moe_experts``      MoE block at TP (MoE models; the router is a GEMM), at TP x DP
                     under attention DP without EP, at EP with it
``moe_all_gather``   DP without EP: NCCL all-gather, then ``moe_reduce_scatter``
``all_reduce`` x2    the framework's all-reduce (else NCCL's) of ``tokens x h`` values
``lm_head``          GEMM ``m = requests, n = vocab/TP, k = h``
===================  ===============================================================

Everything else (norms, RoPE, the KV store, the activation, embedding, pipeline sends, and
any operation whose slice the tables lack) keeps the calibrated roofline's cost, and
``CompiledOp.source`` says which is which (``measured:<table>`` or ``calibrated``).

Each family of operations has its module beside this one: ``gemm.py`` (which GEMM
kernels), ``attention.py`` (GQA, full or windowed), ``mla.py`` (MLA and DSA),
``moe.py`` (experts and the all-to-all), ``linear.py`` (gated DeltaNet, Mamba2), over
``lookup.py`` (reading tables, shapes, grids); this module joins them into the roofline.

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
import math

from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.catalog.quant import Quantization
from tokenyard.predictor import grids
from tokenyard.predictor.calibration import Calibration, builtin_calibration, fit_calibration
from tokenyard.predictor.compiled import FEATURES, CompiledOp, CompiledPredictor, Cost, TableCost
from tokenyard.predictor.measured import lookup
from tokenyard.predictor.measured.attention import attention_ops
from tokenyard.predictor.measured.data import MeasuredSource
from tokenyard.predictor.measured.gemm import KEPT_MODULES, modules_unquantized, pick_gemms
from tokenyard.predictor.measured.linear import linear_ops
from tokenyard.predictor.measured.lookup import (
    TABLE_DTYPES,
    Entry,
    Shapes,
    gemm_table,
    present,
    read,
    shapes,
)
from tokenyard.predictor.measured.mla import MLA_MODULE_OPS, mla_ops
from tokenyard.predictor.measured.moe import (
    SHARED_BRANCH_OPS,
    a2a_ops,
    gather_ops,
    moe_op,
    overlap_shared_experts,
)
from tokenyard.predictor.measured.ops import CollectiveTimes, NotMeasured
from tokenyard.predictor.roofline import CpuOverheads, roofline_predictor
from tokenyard.predictor.roofline_moe import dp_without_ep_words

__all__ = ["MLA_MODULE_OPS", "TABLE_DTYPES", "measured_predictor"]

#: The cached table reader, under the name the tests clear it by.
_read_version = lookup.read_version


def _measured_ops(
    source: MeasuredSource,
    model: ModelSpec,
    s: Shapes,
    tp: int,
    weight_dtype: str,
    kv_dtype: str,
    moe_distribution: str,
    quantization: Quantization | None = None,
    ep: int = 1,
    dp: int = 1,
    device: DeviceSpec | None = None,
    branch: dict[str, Cost] | None = None,
) -> tuple[dict[str, Entry], dict[str, str]]:
    """Operation name -> (table, source label, reason it is absent); ``None`` tables keep
    the roofline. Also which kernel family priced what (``gemm``, ``moe``, ``lm_head``).
    ``branch``: the roofline's costs of the shared branch's unmeasured kernels
    (``moe.SHARED_BRANCH_OPS``), hidden with the shared GEMMs where vLLM overlaps them."""
    gemm, edge, moe_dtype, kernels = pick_gemms(source, model, weight_dtype, quantization)
    label = f"measured:gemm ({source.folders['gemm'].name})"
    out: dict[str, Entry] = {
        "lm_head": (gemm_table(edge, s.vocab, s.h, "num_requests"), label, ""),
    }
    # What the checkpoint keeps 16-bit (ModelOpt exclude_modules), priced at the 16-bit
    # rows as vLLM builds those linears unquantized (gemm.modules_unquantized). MLA's
    # module says so in its own words (below); the other linears switch rows only where
    # the layers' family is not the 16-bit one already.
    kept = [m for m in KEPT_MODULES if modules_unquantized(quantization, model, m)]
    kept16 = [m for m in kept if m != "mla"] if edge is not gemm else []
    if kept16:
        kernels["kept"] = f"{', '.join(m.replace('_', ' ') for m in kept16)} 16-bit"
    if model.mla is None:
        attention_gemm = edge if "attention" in kept16 else gemm
        for mixer in dict.fromkeys(model.mixers()):
            if mixer not in ("gqa", "sliding", "chunked"):
                continue
            prefix = "" if mixer == "gqa" else f"{mixer}_"
            kv_heads, head_dim = model.kv_shape(mixer)
            m = dataclasses.replace(s, kv_heads=math.ceil(kv_heads / tp), head_dim=head_dim)
            gate = m.q if model.attention_output_gate else 0
            kv_proj = m.kv if mixer == "gqa" and model.attention_k_eq_v else 2 * m.kv
            qkv = gemm_table(attention_gemm, m.q + gate + kv_proj, m.h, "num_tokens")
            out[f"{prefix}qkv_proj"] = (qkv, label, "")
            o_proj = gemm_table(attention_gemm, m.h, m.q, "num_tokens", quantized_input=True)
            out[f"{prefix}o_proj"] = (o_proj, label, "")
            window = model.window_of(mixer)
            ops = attention_ops(source, m, kv_dtype, window, mixer == "chunked")
            out.update({prefix + name: entry for name, entry in ops.items()})
            if window:
                kernels[f"{mixer}_attention"] = next(iter(ops.values()))[1]
    else:
        # The module rows of the layers' own GEMM family: replica.dtype's, or the
        # checkpoint's scheme (a family the module tables lack prices the projections from
        # the GEMM rows, with the reason); 16-bit where the checkpoint keeps the
        # projections so (ModelOpt NVFP4 DeepSeek: exclude_modules), as vLLM runs them.
        module_gemm, module_rows = kernels["gemm"], gemm
        if "mla" in kept:
            module_gemm, module_rows = kernels["lm_head"], edge
        mla, kernels["mla"] = mla_ops(source, model, tp, kv_dtype, module_gemm, module_rows, label)
        if "mla" in kept:
            kernels["mla"] += " (projections 16-bit in the checkpoint)"
        out.update(mla)
    for kind in model.layer_kinds():
        if kind.ffn == "dense":
            i = kind.intermediate_size // tp
            prefix = "dense_" if model.num_experts > 1 else ""
            out[f"{prefix}gate_up_proj"] = (gemm_table(gemm, 2 * i, s.h, "num_tokens"), label, "")
            down = gemm_table(gemm, s.h, i, "num_tokens", quantized_input=True)
            out[f"{prefix}down_proj"] = (down, label, "")
            continue
        out["router"] = (gemm_table(edge, model.num_experts, s.h, "num_tokens"), label, "")
        out["moe_experts"] = moe_op(source, model, tp, moe_dtype, moe_distribution, ep, dp)
        kernels["moe"] = moe_dtype if out["moe_experts"][0] is not None else "calibrated"
        if model.num_shared_experts:
            # Their own width (Gemma 4's dense MLP, Nemotron-H's non-gated one). Under vLLM
            # 0.33's sequence-parallel MoE (EP with TP > 1 and DP > 1) they are whole on
            # every GPU, each running its 1/TP of the layer's tokens.
            sp = model.shared_experts_sequence_parallel(tp, ep, dp)
            i = model.shared_intermediate // (tp // sp)
            shared = edge if "shared_experts" in kept16 else gemm
            up = gemm_table(shared, (2 if model.gated_ffn else 1) * i, s.h, "num_tokens")
            down = gemm_table(shared, s.h, i, "num_tokens", quantized_input=True)
            for op, table in (("shared_gate_up_proj", up), ("shared_down_proj", down)):
                xs = tuple(x * sp for x in table.xs)  # the layer's tokens, 1/sp per GPU
                out[op] = (dataclasses.replace(table, xs=xs), label, "")
    if model.mtp_module:  # [embedding; hidden] -> h: a whole bf16 nn.Linear in vLLM's MTP
        out["eh_proj"] = (gemm_table(edge, s.h, 2 * s.h, "num_tokens"), label, "")
    if tp > 1:
        out["all_reduce"] = out["embedding_all_reduce"] = _all_reduce_op(source, s, tp)
    if model.linear is not None:
        linear_gemm = edge if "linear_attention" in kept16 else gemm
        linear, kernels[model.linear.kind] = linear_ops(source, model, tp, linear_gemm, label)
        out.update(linear)
    if dp > 1 and model.num_moe_layers and ep > 1:
        a2a, kernels["a2a"] = a2a_ops(source, model, tp, ep, device)
        out.update(a2a)
    elif dp > 1 and model.num_moe_layers:  # DP without EP: all-gather, reduce-scatter
        gather, kernels["gather"] = gather_ops(source, model, tp, dp, device)
        out.update(gather)
    if model.num_shared_experts and model.shared_experts_overlap:
        for op, cost in (branch or {}).items():  # the calibrated gate, hidden with its branch
            out[op] = (_tabulated(cost), "calibrated", "")
        overlap = overlap_shared_experts(out)
        if overlap:
            kernels["shared"] = overlap
    elif model.num_shared_experts:  # Gemma 4's dense MLP: before the experts, in full
        kernels["shared"] = "dense MLP before the experts (not overlapped)"
    return out, kernels


def _tabulated(cost: Cost) -> TableCost:
    """A one-feature (``num_tokens``) cost as a table on the token grid."""
    if isinstance(cost, TableCost):
        return cost
    base = dict.fromkeys(FEATURES, 0.0) | {"one": 1.0}
    return grids.token_table("num_tokens", lambda t: cost.time(base | {"num_tokens": t}), 2.0**17)


def _all_reduce_op(source: MeasuredSource, s: Shapes, tp: int) -> Entry:
    tables = []
    if "comm" in source.folders and present(
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
        rows = read(source, path)
        try:
            times = CollectiveTimes(rows, tp, dtype_column=column, dtype=dtype)
        except NotMeasured:
            continue  # this table lacks the GPU count: try the next
        return _all_reduce_table(times, s.h), label, ""
    return None, "calibrated", f"no all-reduce measured over {tp} GPUs"


def _all_reduce_table(times: CollectiveTimes, hidden: int) -> TableCost:
    return grids.token_table("num_tokens", lambda tokens: times(tokens * hidden), 2.0**17)


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
    if "shared" in kernels:
        text += f", {kernels['shared']}"
    for mixer in ("gdn", "mamba2"):
        if mixer in kernels:
            text += f", {mixer} {kernels[mixer]}"
    for mixer in ("sliding", "chunked"):
        if f"{mixer}_attention" in kernels:
            text += f", {mixer} attention {kernels[f'{mixer}_attention']}"
    if quantization is not None:
        text += f"; {quantization.scheme} from {quantization.source}"
        if "kept" in kernels:
            text += f" ({kernels['kept']} in the checkpoint, {kernels['lm_head']} rows)"
        if "gemm_note" in kernels:
            text += f"; {kernels['gemm_note']}"
    elif kernels["gemm"] == "fp8":
        text += "; per-tensor fp8 from replica.dtype"
    return text


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
    (or, EP 1, ``moe_tp_size = TP x DP``) at the combined tokens, and with DP the expert
    all-to-all from ``moe_a2a_perf`` (with EP) or NCCL's all-gather and reduce-scatter
    over the DP ranks (without; ``roofline_predictor`` says what the layout means).

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
        shapes(model, tp),
        tp,
        weight_dtype,
        kv_cache_dtype,
        moe_distribution,
        quantization,
        expert_parallel_size,
        data_parallel_size,
        device,
        {op.name: op.cost for op in base.ops if op.name in SHARED_BRANCH_OPS},
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
            if entry is not None and entry[1] not in ("calibrated", "dropped"):
                ops.append(dataclasses.replace(op, source=entry[1]))  # roofline:network
            else:
                ops.append(op)
            if entry is not None and entry[1] != "roofline:network":
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
    if kernels.get("gather") == "calibrated":
        description["a2a"] = f"{base.description['a2a']}; not measured: {notes['moe_all_gather']}"
    elif "gather" in kernels:
        description["a2a"] = dp_without_ep_words(
            tensor_parallel_size, data_parallel_size, kernels["gather"]
        )
    if kernels.get("a2a") == "calibrated":
        description["a2a"] = f"{base.description['a2a']}; not measured: {notes['moe_dispatch']}"
    elif "a2a" in kernels and kernels["a2a"].startswith("roofline"):  # over the network
        description["a2a"] = kernels["a2a"]
    elif "a2a" in kernels:
        description["a2a"] = f"measured: {kernels['a2a']}"
    if "gemm_why" in kernels:
        notes["gemm"] = kernels["gemm_why"]
    return dataclasses.replace(base, ops=tuple(ops), description=description)
