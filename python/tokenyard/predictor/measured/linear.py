"""Measured linear-attention layers (gated DeltaNet, Mamba2): the projections from the GEMM
rows, the causal conv and the scan from ``linear_attention/<kind>_perf`` where it measures
this layer shape, the rest on the calibrated roofline with the reason."""

from __future__ import annotations

import functools

from tokenyard.catalog import ModelSpec
from tokenyard.predictor import grids
from tokenyard.predictor.compiled import TableCost
from tokenyard.predictor.measured.data import MeasuredSource
from tokenyard.predictor.measured.lookup import Entry, gemm_table, present, read
from tokenyard.predictor.measured.ops import (
    GemmTimes,
    LinearMixerTimes,
    StaticFp8GemmTimes,
    layer_shapes,
)

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


def linear_ops(
    source: MeasuredSource,
    model: ModelSpec,
    tp: int,
    gemm: GemmTimes | StaticFp8GemmTimes,
    gemm_label: str,
) -> tuple[dict[str, Entry], str]:
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
    out: dict[str, Entry] = {}
    if kind == "gdn":  # in_proj_qkvz (q, k, v, z) and in_proj_ba (two scalars per head)
        qkvz = (2 * lin.inner + 2 * lin.num_groups * lin.group_dim) // tp
        ba = 2 * lin.num_heads // tp
        xs = tuple(float(m) for m in gemm.m_grid)
        values = tuple(gemm(m, qkvz, h) + gemm(m, ba, h) for m in xs)
        out[f"{kind}_in_proj"] = (TableCost(x="num_tokens", xs=xs, values=values), gemm_label, "")
    else:
        in_proj = gemm_table(gemm, lin.in_proj_width() // tp, h, "num_tokens")
        out[f"{kind}_in_proj"] = (in_proj, gemm_label, "")
    out[f"{kind}_out_proj"] = (gemm_table(gemm, h, inner, "num_tokens"), gemm_label, "")
    out[f"{kind}_gated_norm"] = (
        None,
        "calibrated",
        "the gated RMSNorm is not a kernel the linear_attention tables measure",
    )
    table = f"{kind}_perf.parquet"
    folder = source.folders.get("linear_attention")
    key, why = _linear_key(model, tp)
    rows = None
    if not why and (folder is None or not present(folder / table)):
        why = (
            f"no linear_attention/{table} for {source.system}/{source.framework} at or below "
            f"{source.version} ({_linear_tables_elsewhere(source, table)})"
        )
    elif not why and folder is not None:
        rows = read(source, folder / table)
    version = folder.name if folder is not None else ""
    measured = []
    timed: dict[str, LinearMixerTimes] = {}
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
        timed[op] = times
        label = f"measured:{kind}_perf {kernel} ({version})"
        if phase == "context":  # a chunk after cached tokens resumes from the state
            seconds = functools.partial(_linear_prefill, times)
            out[name] = (grids.prefill_attention_table(seconds), label, "")
        else:
            out[name] = (grids.token_table("num_decode_tokens", times, 2.0**17), label, "")
    if kind == "gdn" and "conv_prefill" in timed and "conv_decode" in timed:
        mixed = _one_varlen_conv(timed["conv_prefill"], timed["conv_decode"])
        out[f"{kind}_conv_decode"] = (mixed, out[f"{kind}_conv_decode"][1], "")
    if not measured:
        return out, "calibrated roofline"
    if len(measured) == len(_LINEAR_KERNELS):
        return out, f"measured:{kind}_perf (conv, scan; {version})"
    return out, f"measured:{kind}_perf {', '.join(measured)} ({version}), the rest calibrated"


def _one_varlen_conv(prefill: LinearMixerTimes, decode: LinearMixerTimes) -> TableCost:
    """The decodes' causal conv by (decode tokens, prefill tokens). vLLM 0.33's GDN layer
    (``layers/mamba/gdn/qwen_gdn_linear_attn.py``, ``_forward_core``) runs a step with a
    prefill as one varlen ``causal_conv1d_fn`` over every non-speculative token, the
    decodes' one-token sequences included (``causal_conv1d_update`` only in decode-only
    steps; the recurrence is split, ``split_non_spec``). So the decodes add, beside a
    prefill, what ``D`` more tokens add to that conv: the context rows at ``P + D``
    tokens less those at ``P`` (one sequence's shape: the rows measure no mix of prompts
    and one-token sequences; a depthwise conv's cost follows its tokens); alone, the
    ``causal_conv1d_update`` rows. The gate stays ``num_decode_tokens``, the prefill's
    own conv ``gdn_conv_prefill``. (Mamba2's mixer runs the two kernels separately.)"""
    ds = grids.geometric(2.0**17)
    ps = (0.0, *grids.geometric(2.0**20))
    values = tuple(
        decode(d) if p == 0.0 else max(0.0, prefill(1.0, p + d) - prefill(1.0, p))
        for d in ds
        for p in ps
    )
    return TableCost(x="num_decode_tokens", xs=ds, values=values, y="num_prefill_tokens", ys=ps)
