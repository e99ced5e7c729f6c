"""Measured MoE layers: the routed experts from ``moe_perf`` (at TP; at EP over the
combined tokens of the DP ranks; or, DP without EP, at ``moe_tp_size = TP x DP`` over
them) and, under attention DP, the expert all-to-all from ``comm/moe_a2a_perf`` (with EP)
or NCCL's all-gather and reduce-scatter over the DP ranks (without)."""

from __future__ import annotations

import math
from pathlib import Path

from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.errors import ConfigError
from tokenyard.predictor import grids
from tokenyard.predictor.compiled import TableCost
from tokenyard.predictor.measured.data import MeasuredSource
from tokenyard.predictor.measured.lookup import Entry, present, read
from tokenyard.predictor.measured.ops import (
    A2aTimes,
    CollectiveTimes,
    MoeShape,
    MoeTimes,
    NotMeasured,
)
from tokenyard.predictor.measured.wide_ep import WideEp, wide_ep
from tokenyard.predictor.roofline_moe import A2A_OPS, GATHER_OPS, network_a2a_seconds


def moe_op(
    source: MeasuredSource,
    model: ModelSpec,
    tp: int,
    dtype: str,
    distribution: str,
    ep: int = 1,
    dp: int = 1,
) -> Entry:
    """The routed experts from the MoE table: at ``moe_tp_size = TP x DP`` without expert
    parallelism (DP 1: plain TP; DP > 1: vLLM 0.33 flattens the experts' TP over the DP
    ranks, ``FusedMoEParallelConfig.make`` with ``use_ep`` false), else at ``moe_tp_size
    = 1, moe_ep_size = EP``; either way a row's ``num_tokens`` are the tokens entering the
    layer across the group: a DP rank's tokens times DP (each rank's batch taken as one of
    DP alike ones)."""
    path = source.folders.get("moe")
    if path is None or not present(path / "moe_perf.parquet"):
        return None, "calibrated", "no MoE table"
    rows = read(source, path / "moe_perf.parquet")
    shape = MoeShape(
        dtype=dtype,
        hidden_size=model.hidden_size,
        inter_size=model.intermediate_size,
        topk=model.experts_per_token,
        num_experts=model.num_experts,
        tensor_parallel_size=tp * dp if ep == 1 else 1,
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
#: GPUs per node for the tables' ``node_num`` where the device does not say
#: (``DeviceSpec.nvlink_domain``: 8 on HGX and DGX nodes, 72 on GB200/GB300 NVL72).
GPUS_PER_NODE = 8


def a2a_ops(
    source: MeasuredSource,
    model: ModelSpec,
    tp: int,
    ep: int,
    device: DeviceSpec | None = None,
) -> tuple[dict[str, Entry], str]:
    """The expert all-to-all under attention DP (``moe_dispatch``, ``moe_combine``) from
    the framework's ``comm/moe_a2a_perf`` table, at ``ep_size = EP`` over
    ``ceil(EP / nvlink_domain)`` nodes and the model's hidden size, top-k and expert
    count, by the tokens each GPU sends (the DP rank's tokens / TP, as aiconfigurator keys
    it). A step of at most as many tokens per GPU as the low-latency kernels are measured
    at (decode-sized steps) takes ``deepep_ll``, a larger one (prefill chunks)
    ``deepep_ht``; with one mode measured, that one. Rows missing over several nodes:
    DeepEP's inter-node tables (``wide_ep.py``); else the calibrated roofline, with the
    reason. Also the banner's words."""
    path = source.folders.get("comm", Path()) / "moe_a2a_perf.parquet"
    domain = device.nvlink_domain if device is not None else GPUS_PER_NODE
    nodes = -(-ep // domain)  # an NVL72 rack is one node of 72
    if "comm" not in source.folders or not present(path):
        why = f"no moe_a2a_perf table for {source.system}/{source.framework} {source.version}"
        return _wide_or_calibrated(source, model, tp, ep, nodes, device, why)
    rows = read(source, path)
    out: dict[str, Entry] = {}
    used: set[str] = set()
    whys = []
    lows: list[float] = []
    ll_ops: set[str] = set()
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
        if low is not None:
            lows.append(low.max_tokens)
            ll_ops.add(op)

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
        return _wide_or_calibrated(source, model, tp, ep, nodes, device, whys[-1])
    limit = ""
    if len(used) == 2:  # the low-latency limit of a phase that measures it
        limit = f" up to {max(lows):g} tokens per GPU, deepep_ht above"
        if len(lows) < len(A2A_OPS):  # a phase without low-latency rows: said
            ll_phases = sorted(op for op in out if out[op][0] is not None and op in ll_ops)
            only = " and ".join(op.removeprefix("moe_") for op in ll_phases)
            limit = f" ({only} only){limit}"
    first = "deepep_ll" if "deepep_ll" in used else "deepep_ht"
    return out, f"{first}{limit} (EP {ep}, moe_a2a {path.parent.name})"


def _wide_or_calibrated(
    source: MeasuredSource,
    model: ModelSpec,
    tp: int,
    ep: int,
    nodes: int,
    device: DeviceSpec | None,
    why: str,
) -> tuple[dict[str, Entry], str]:
    """An EP group over several ``nodes`` that the framework's table lacks: DeepEP's
    inter-node tables (``wide_ep.py``), else the roofline's network rule
    (``roofline_moe.network_a2a_seconds``) where the catalog knows the NIC, else the
    calibrated roofline (which prices the link as NVLink) with the reasons. The network
    case keeps the calibrated roofline's all-to-all (``None`` tables labelled
    ``roofline:network``): the longer of the off-node share over the NIC and the rest
    over NVLink, one rule for both predictors."""
    if nodes > 1:
        wide, why_wide = wide_ep(source, model, nodes)
        if wide is not None:
            label = "measured:wideep_deepep"
            out: dict[str, Entry] = {}
            for op in A2A_OPS:
                phase = op.removeprefix("moe_")

                def seconds(tokens: float, phase: str = phase, w: WideEp = wide) -> float:
                    return w.seconds(phase, tokens / tp)

                out[op] = (grids.token_table("num_tokens", seconds, 2.0**17), label, "")
            return out, wide.words
        why = f"{why}; {why_wide}"
        if device is not None and network_a2a_seconds(model, device, tp, ep) is not None:
            # The roofline's own rule, not a second one: its all-to-all (kept, a None
            # table) takes the longer of the off-node share over the NIC and the rest
            # over NVLink (roofline_moe._all_to_all); only the label says so.
            domain = device.nvlink_domain
            words = (
                f"roofline over the network ({1 - domain / ep:.0%} of each GPU's tokens x "
                f"hidden x top-k leaving the {domain}-GPU NVLink domain at "
                f"{device.network_gbps:g} GB/s, the rest over NVLink, the longer of the "
                f"two) ({why})"
            )
            return {op: (None, "roofline:network", "") for op in A2A_OPS}, words
    return {op: (None, "calibrated", why) for op in A2A_OPS}, "calibrated"


def gather_ops(
    source: MeasuredSource,
    model: ModelSpec,
    tp: int,
    dp: int,
    device: DeviceSpec | None = None,
) -> tuple[dict[str, Entry], str]:
    """DP without EP's collectives over the ``DP`` ranks (``moe_all_gather``,
    ``moe_reduce_scatter``: vLLM 0.33's ``AgRsAll2AllManager.dispatch_router_logits`` and
    ``combine``) from NCCL's ``all_gather`` / ``reduce_scatter`` rows at ``num_gpus = DP``,
    by a rank's ``tokens x hidden`` 16-bit values (each rank's share, as the table keys
    it). The tables measure one node: a replica of ``TP x DP`` GPUs past the device's
    NVLink domain, or a DP the rows lack, keeps the calibrated roofline with the reason.
    Also the banner's words."""
    domain = device.nvlink_domain if device is not None else GPUS_PER_NODE
    why = ""
    if "nccl" not in source.folders:
        why = f"no NCCL table for {source.system}"
    elif tp * dp > domain:
        why = (
            f"the DP group spans {-(-tp * dp // domain)} NVLink domains of {domain} GPUs; "
            "the NCCL table measures one"
        )
    out: dict[str, Entry] = {}
    if not why:
        path = source.folders["nccl"] / "nccl_perf.parquet"
        rows = read(source, path)
        label = f"measured:nccl ({path.parent.name})"
        for op, nccl in zip(GATHER_OPS, ("all_gather", "reduce_scatter"), strict=True):
            try:
                times = CollectiveTimes(rows, dp, dtype_column="nccl_dtype", dtype="half", op=nccl)
            except NotMeasured as exc:
                why = str(exc)
                break

            def seconds(tokens: float, t: CollectiveTimes = times) -> float:
                return t(tokens * model.hidden_size)

            out[op] = (grids.token_table("num_tokens", seconds, 2.0**17), label, "")
    if why:
        return {op: (None, "calibrated", why) for op in GATHER_OPS}, "calibrated"
    return out, f"measured, NCCL all_gather / reduce_scatter over {dp} GPUs ({path.parent.name})"


#: vLLM 0.33 runs a MoE layer's shared experts on an auxiliary CUDA stream beside the
#: routed path (router, experts) when the layer sees at most this many tokens
#: (``fused_moe/runner/shared_experts.py``, ``_determine_shared_experts_order``:
#: ``VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD``, 256 by default); above it they run after.
SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD = 256
#: The routed path's operations and the shared experts' measured GEMMs.
ROUTED_OPS = ("router", "moe_experts")
SHARED_OPS = ("shared_gate_up_proj", "shared_down_proj")
#: The shared branch's other kernels, the calibrated roofline's: the activation between
#: its GEMMs and, where the model has it, Qwen's sigmoid gate
#: (``roofline_moe._shared_gate_and_merge``), all inside the branch, so hidden with it. The
#: merge after the join (``shared_merge``) is never hidden.
SHARED_BRANCH_OPS = ("shared_act", "shared_expert_gate", "shared_gate_mul")


def overlap_shared_experts(out: dict[str, Entry]) -> str:
    """Price the shared experts as vLLM overlaps them, rewriting ``out``'s shared GEMM
    entries in place so that each keeps only its share of what the shared path outlasts
    the path beside it by; returns the banner's words ("" where nothing was rewritten).

    - Without an all-to-all: beside the router and the experts, at up to
      ``SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`` tokens (the auxiliary stream); above it,
      in full.
    - With DeepEP's all-to-all (attention DP): vLLM's modular kernel overlaps them itself
      (``MK_INTERNAL_OVERLAPPED``, chosen first: DeepEP's prepare/finalize
      ``supports_async``), running them while the combine is in flight
      (``modular_kernel.py``, ``finalize_async`` then ``_maybe_apply_shared_experts``): beside
      ``moe_combine`` only, at every token count. An all-to-all the tables do not measure
      leaves them in full.
    """
    tables = [t for op in SHARED_OPS if op in out and (t := out[op][0]) is not None]
    if len(tables) < len(SHARED_OPS) or "moe_experts" not in out or out["moe_experts"][0] is None:
        return ""
    branch = [op for op in SHARED_BRANCH_OPS if op in out and out[op][0] is not None]
    names = (*SHARED_OPS, *branch)
    tables += [t for op in branch if (t := out[op][0]) is not None]
    if "moe_combine" in out:
        combine = out["moe_combine"][0]
        if combine is None:
            return ""
        beside, limit = [combine], math.inf
        words = "shared experts beside the all-to-all's combine"
    else:
        beside = [t for op in ROUTED_OPS if op in out and (t := out[op][0]) is not None]
        limit = float(SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD)
        words = f"shared experts beside the routed ones up to {limit:g} tokens"
    if any(t.x != "num_tokens" or t.y is not None for t in (*tables, *beside)):
        return ""
    xs = sorted({x for t in tables for x in t.xs} | ({limit, limit + 1.0} - {math.inf}))

    def at(table: TableCost, tokens: float) -> float:
        return float(table.time({"num_tokens": tokens}))

    def factor(tokens: float) -> float:
        if tokens > limit:
            return 1.0
        s = sum(at(t, tokens) for t in tables)
        r = sum(at(t, tokens) for t in beside)
        return max(0.0, s - r) / s if s > 0 else 1.0

    for op, table in zip(names, tables, strict=True):
        values = tuple(at(table, x) * factor(x) for x in xs)
        label = out[op][1]
        out[op] = (TableCost(x="num_tokens", xs=tuple(xs), values=values), label, "")
    return words
