"""The calibrated roofline's MoE pieces: the routed experts (at TP; at EP over the
combined tokens of the DP ranks; or, DP without EP, at TP x DP over those tokens), the
dense and shared MLPs beside them with what vLLM 0.33 runs around the shared branch
(Qwen's gate, the merge), the expert all-to-all under attention DP with EP, over NVLink
or, past the device's NVLink domain, the NIC, and DP without EP's all-gather and
reduce-scatter over the DP ranks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.predictor import grids
from tokenyard.predictor.calibration import (
    curve_value,
)
from tokenyard.predictor.compiled import CompiledOp, RooflineCost, TableCost
from tokenyard.predictor.roofline_builder import _Builder, _gemm, _Sizes


@dataclasses.dataclass(frozen=True)
class _Experts:
    """What one GPU computes of a MoE layer: ``rows_per_token`` expert rows per token of
    its own batch (top-k under TP; ``top-k x DP / EP`` under expert parallelism, the
    combined batch's rows spread evenly over the EP ranks; ``top-k x DP`` under DP without
    EP, every GPU running the gathered batch), over ``local`` experts of ``inter``
    intermediate values each (all experts at ``intermediate / TP`` under TP, at
    ``intermediate / (TP x DP)`` under DP without EP: vLLM 0.33's
    ``FusedMoEParallelConfig.make`` with ``use_ep`` false flattens the experts' TP over
    the DP ranks; ``num_experts / EP`` whole ones under EP)."""

    rows_per_token: float
    local: int
    inter: int


def _experts(model: ModelSpec, tp: int, ep: int, dp: int) -> _Experts:
    if ep == 1:  # dp 1: plain TP; dp > 1: one TP group of TP x DP on the gathered tokens
        return _Experts(
            model.experts_per_token * dp, model.num_experts, model.intermediate_size // (tp * dp)
        )
    return _Experts(
        model.experts_per_token * dp / ep, model.num_experts // ep, model.intermediate_size
    )


def _expert_gemm(
    b: _Builder, model: ModelSpec, s: _Sizes, name: str, k: int, n: int, e: _Experts
) -> None:
    """An MLP projection. For MoE: ``rows_per_token x T`` rows over the ``min(local
    experts, rows)`` experts they hit, tabulated on a fine token grid (not linear in T)."""
    if model.num_experts == 1:
        _gemm(b, name, k, n, s)
        return
    top_k, experts = e.rows_per_token, e.local
    if b.calibration is not None:
        c = b.calibration

        def calibrated(tokens: float) -> float:
            rows = top_k * tokens
            hit = min(experts, rows)
            flops = 2.0 * k * n * rows
            moved = hit * k * n * s.w + rows * (k + n) * s.a
            roofline = max(flops / b.gemm_flops_per_s, moved / b.bytes_per_s)
            # Each expert runs its own GEMM of rows / hit rows; the fused MoE kernels'
            # own curve where one was fitted.
            if c.moe_rows_per_expert:
                efficiency = curve_value(c.moe_rows_per_expert, c.moe_efficiency, rows / hit)
            else:
                efficiency = curve_value(c.gemm_tokens, c.gemm_efficiency, rows / hit)
            return roofline / efficiency + c.memory_latency_s

        b.table(name, grids.token_table("num_tokens", calibrated, 2.0**17), gate="num_tokens")
        return
    compute_rate = b.gemm_flops_per_s * b.eff.gemm
    memory_rate = b.bytes_per_s * b.eff.memory

    def seconds(tokens: float) -> float:
        rows = top_k * tokens
        flops = 2.0 * k * n * rows
        moved = min(experts, rows) * k * n * s.w + rows * (k + n) * s.a
        return max(flops / compute_rate, moved / memory_rate)

    # Piecewise linear in T with bends where every expert is hit (T = E / k) and where
    # compute overtakes memory on either side of it: put those on the grid, so linear
    # interpolation between points is exact.
    per_row_compute = 2.0 * k * n / compute_rate
    bends = [experts / top_k]
    for weight_rows, fixed in ((1.0, 0.0), (0.0, experts)):  # below / above E / k
        per_row_memory = (weight_rows * k * n * s.w + (k + n) * s.a) / memory_rate
        gap = per_row_compute - per_row_memory
        if gap > 0:
            bends.append(fixed * k * n * s.w / memory_rate / gap / top_k)
    grid = {float(round(2 ** (e / 4))) for e in range(4 * 17 + 1)}
    xs = sorted(grid | {t for t in bends if t >= 1.0})

    cost = TableCost(x="num_tokens", xs=tuple(xs), values=tuple(seconds(t) for t in xs))
    b.ops.append(CompiledOp(name, "layer", "num_tokens", cost))


def _dense_mlp(
    b: _Builder, s: _Sizes, i: int, prefix: str = "", gated: bool = True, rows: float = 1.0
) -> None:
    """A SwiGLU MLP of ``i`` (per TP worker) intermediate values (``gated`` false: up
    and down only, Nemotron-H's relu2), on ``rows`` rows per token (``_gemm``)."""
    _gemm(b, f"{prefix}gate_up_proj", s.h, (2 if gated else 1) * i, s, rows=rows)
    act = 3.0 * i * rows
    b.add(f"{prefix}act", flops={"num_tokens": act}, bytes={"num_tokens": act * s.a})
    _gemm(b, f"{prefix}down_proj", i, s.h, s, rows=rows)


def _mlp(b: _Builder, model: ModelSpec, s: _Sizes, tp: int, e: _Experts, sp: int = 1) -> None:
    """Each layer kind's FFN. A model of several kinds (DeepSeek: dense layers, then MoE
    ones) runs each kind's operations ``count / num_layers`` times per layer, so a stage
    of ``L`` layers costs the model's mix (exact at PP 1); the dense layers' operations
    are then named ``dense_*``. A MoE layer's shared experts are a dense MLP of
    ``shared_intermediate`` beside the routed ones (``shared_*``), split by TP, or with
    ``sp`` = TP (vLLM 0.33's sequence-parallel MoE) whole on ``1/TP`` of the tokens."""
    kinds = model.layer_kinds()
    for kind in kinds:
        start = len(b.ops)
        if kind.ffn == "none":
            continue
        if kind.ffn == "dense":
            prefix = "dense_" if model.num_experts > 1 else ""
            _dense_mlp(b, s, kind.intermediate_size // tp, prefix, model.gated_ffn)
        else:
            rows = e.rows_per_token
            _gemm(b, "router", s.h, model.num_experts, s, layer_linear=False)
            _expert_gemm(
                b, model, s, "gate_up_proj", s.h, (2 if model.gated_ffn else 1) * e.inter, e
            )
            b.add(
                "act",
                flops={"num_tokens": 3.0 * e.inter * rows},
                bytes={"num_tokens": 3.0 * e.inter * s.a * rows},
            )
            _expert_gemm(b, model, s, "down_proj", e.inter, s.h, e)
            if model.num_shared_experts:
                i = model.shared_intermediate // (tp // sp)
                _dense_mlp(b, s, i, "shared_", model.gated_ffn, rows=1.0 / sp)
                _shared_gate_and_merge(b, model, s, tp, sp)
        if kind.count != model.num_layers:
            share = kind.count / model.num_layers
            b.ops[start:] = [
                dataclasses.replace(op, count=op.count * share) for op in b.ops[start:]
            ]


def _shared_gate_and_merge(b: _Builder, model: ModelSpec, s: _Sizes, tp: int, sp: int) -> None:
    """What vLLM 0.33 runs around the shared experts it hands to ``FusedMoE`` besides
    their MLP, on the rows each GPU holds (``1/sp`` of the tokens under sequence-parallel
    MoE):

    - ``shared_expert_gate`` (``ModelSpec.shared_expert_gate``: Qwen3-Next, Qwen3.5): the
      16-bit ``h -> 1`` ``ReplicatedLinear`` (whole on every GPU; a GEMV, memory-bound) and
      ``shared_gate_mul``, ``sigmoid(gate) * out`` (``Qwen2MoeMLP.forward``: reads and
      writes ``h`` values). They run inside the opaque ``moe_forward_shared`` custom op
      (``fused_moe/runner/moe_runner.py``), so eagerly, in the shared branch.
    - ``shared_merge``, at TP > 1: ``shared_output + fused_output`` in
      ``MoERunner.forward``, outside that op, in the compiled graph, written out before
      the layer's all-reduce (reads ``2h`` values, writes ``h``). At TP 1 it feeds the
      next residual add and norm, with which the compiled graph fuses it (tokenyard
      counts the residual adds inside the norms); Gemma 4 adds its dense MLP's and
      experts' outputs in the graph between its norms (``shared_experts_overlap``
      false), likewise not a kernel of its own.

    The element-wise kernels are memory-bound (the calibrated bandwidth and launch
    latency where calibrated), as aiconfigurator's ``ElementWise`` ops price them
    (``sdk/models/qwen35.py``: ``shared_expert_gate_mul``, ``shared_merge``)."""
    rows = 1.0 / sp
    if model.shared_expert_gate:
        # A GEMV (n = 1): memory-bound, as the norms (the GEMM curves fit wide GEMMs).
        b.add(
            "shared_expert_gate",
            flops={"num_tokens": 2.0 * s.h * rows},
            bytes={"one": 2.0 * s.h, "num_tokens": (s.h + 1) * s.a * rows},
        )
        b.add(
            "shared_gate_mul",
            flops={"num_tokens": 2.0 * s.h * rows},
            bytes={"num_tokens": 2.0 * s.h * s.a * rows},
        )
    if tp > 1 and model.shared_experts_overlap:
        b.add(
            "shared_merge",
            flops={"num_tokens": float(s.h) * rows},
            bytes={"num_tokens": 3.0 * s.h * s.a * rows},
        )


#: The expert all-to-all's two halves under attention data parallelism.
A2A_OPS = ("moe_dispatch", "moe_combine")


def network_a2a_seconds(
    model: ModelSpec, device: DeviceSpec, tp: int, ep: int, act_bytes: float = 2.0
) -> Callable[[float], float] | None:
    """The off-node part of one half of the all-to-all, by a DP rank's tokens, where the EP
    group spans several NVLink domains and the catalog knows the NIC (else None): each GPU
    sends its ``tokens / TP x hidden x top-k`` values spread evenly over the EP group's
    GPUs, of which the share bound for other domains, ``1 - nvlink_domain / EP``, crosses
    its NIC (``network_gbps``, one direction) after ``network_latency_us``. The NVLink
    share runs at the same time: ``_all_to_all`` takes the longer of the two, which the
    measured predictor keeps where no table measures the nodes (``measured/moe.py``)."""
    if ep <= device.nvlink_domain or device.network_gbps <= 0:
        return None
    off_node = 1.0 - device.nvlink_domain / ep
    per_token = model.hidden_size * model.experts_per_token * act_bytes / tp
    link = device.network_gbps * 1e9
    latency = device.network_latency_us * 1e-6

    def seconds(tokens: float) -> float:
        return latency + tokens * per_token * off_node / link

    return seconds


def _link(b: _Builder, gpus: int, hops: int) -> tuple[float, float, str]:
    """One direction of a GPU's link for a collective over ``gpus`` GPUs: (latency s,
    bytes/s, source). The all-reduce fit's latency and link fraction for ``gpus`` where
    there is one ("calibrated"), else ``hops`` x the device's latency at the ``network``
    efficiency ("roofline")."""
    link = b.device.interconnect_gbps / 2 * 1e9
    fitted = b.calibration.all_reduce(gpus) if b.calibration is not None else None
    if fitted is not None:
        return fitted[0], link * fitted[1], "calibrated"
    return hops * b.device.interconnect_latency_us * 1e-6, link * b.eff.network, "roofline"


def _all_to_all(b: _Builder, model: ModelSpec, s: _Sizes, tp: int, ep: int, dp: int) -> None:
    """Attention DP with expert parallelism: each MoE layer dispatches its tokens' hidden
    states to the GPUs holding their top-k experts and combines the results back (DeepEP,
    or vLLM's all-gather / reduce-scatter). One GPU sends ``combined tokens x h x top-k /
    EP`` 16-bit values each way (the combined batch is ``DP x`` the rank's), over one
    direction of its link, at the all-reduce fit's link fraction and latency for ``EP``
    GPUs where there is one (else the ``network`` efficiency and one hop). An EP group
    wider than the device's NVLink domain sends the off-node share over the NIC
    (``network_a2a_seconds``) while the rest crosses NVLink: the longer of the two."""
    if dp == 1 or ep == 1:
        return
    latency, link, source = _link(b, ep, 1)
    per_token = dp * s.h * model.experts_per_token * s.a / ep
    share = model.num_moe_layers / model.num_layers
    network = network_a2a_seconds(model, b.device, tp, ep, s.a)
    on_node = b.device.nvlink_domain / ep
    cost: RooflineCost | TableCost = RooflineCost(
        flops={},
        bytes={"num_tokens": per_token},
        flops_per_s=b.flops_per_s,
        bytes_per_s=link,
        latency_s=latency,
    )
    if network is not None:

        def seconds(tokens: float, over: Callable[[float], float] = network) -> float:
            return max(latency + tokens * per_token * on_node / link, over(tokens))

        cost = grids.token_table("num_tokens", seconds, 2.0**17)
    for name in A2A_OPS:  # dispatch and combine move the same bytes
        b.ops.append(CompiledOp(name, "layer", "num_tokens", cost, share, source))


#: DP without EP's two collectives over the DP ranks (vLLM 0.33's ``AgRsAll2AllManager``:
#: ``dispatch_router_logits`` all-gathers, ``combine`` reduce-scatters).
GATHER_OPS = ("moe_all_gather", "moe_reduce_scatter")


def _dp_gather(b: _Builder, model: ModelSpec, s: _Sizes, tp: int, ep: int, dp: int) -> None:
    """DP without EP: before each MoE layer every GPU all-gathers its DP peers' hidden
    states (``T x h`` values from each of the ``DP`` ranks, a rank's ``T`` tokens taken
    as every rank's), and after it reduce-scatters the ``DP x T x h`` partial sums back;
    the attention TP's all-reduce then finishes the sum (``all_reduce``, as under TP).
    A ring moves ``(DP - 1) x T x h`` values through each GPU each way, over one direction
    of its link at the ``DP``-GPU all-reduce fit's link fraction and latency where there
    is one (else the ``network`` efficiency and ``DP - 1`` hops), or over the NIC where
    the replica's ``TP x DP`` GPUs outgrow the NVLink domain. The top-k ids and weights
    gathered beside the hidden states (8 x top-k bytes a token) are left out."""
    if dp == 1 or ep > 1 or not model.num_moe_layers:
        return
    latency, link, source = _link(b, dp, dp - 1)
    if tp * dp > b.device.nvlink_domain and b.device.network_gbps > 0:
        link = min(link, b.device.network_gbps * 1e9)
        latency = max(latency, b.device.network_latency_us * 1e-6)
        source = "roofline"
    cost = RooflineCost(
        flops={},
        bytes={"num_tokens": (dp - 1) * s.h * s.a},
        flops_per_s=b.flops_per_s,
        bytes_per_s=link,
        latency_s=latency,
    )
    share = model.num_moe_layers / model.num_layers
    for name in GATHER_OPS:  # the gather and the scatter move the same bytes
        b.ops.append(CompiledOp(name, "layer", "num_tokens", cost, share, source))


def dp_without_ep_words(tp: int, dp: int, how: str) -> str:
    """The banner's words for DP without EP: the layout, the equal-load assumption and
    what priced the two collectives (``how``)."""
    return (
        f"none (DP {dp} without EP): the experts one TP group of {tp} x {dp} = {tp * dp} "
        f"GPUs (moe_tp {tp * dp}) on every DP rank's tokens, taken as {dp} x this rank's "
        f"(equal load per rank), all-gathered and reduce-scattered over the {dp} DP ranks: "
        f"{how}"
    )


def _a2a_words(b: _Builder, ep: int, dp: int, tp: int = 1) -> str | None:
    """What priced the expert all-to-all (or DP without EP's gather), for the banner
    (None without one)."""
    if dp == 1:
        return None
    if ep == 1:
        if tp * dp > b.device.nvlink_domain and b.device.network_gbps > 0:
            how = f"roofline, ring over the NIC at {b.device.network_gbps:g} GB/s"
        elif b.calibration is not None and b.calibration.all_reduce(dp) is not None:
            how = f"roofline, ring at the {dp}-GPU all-reduce's fit"
        else:
            how = "roofline, ring at the network efficiency"
        return dp_without_ep_words(tp, dp, how)
    if ep > b.device.nvlink_domain and b.device.network_gbps > 0:
        domain = b.device.nvlink_domain
        return (
            f"roofline: tokens x hidden x top-k / EP, {1 - domain / ep:.0%} of it leaving "
            f"the {domain}-GPU NVLink domain at {b.device.network_gbps:g} GB/s"
        )
    if b.calibration is not None and b.calibration.all_reduce(ep) is not None:
        return (
            f"roofline: tokens x hidden x top-k / EP over the link at the {ep}-GPU all-reduce's fit"
        )
    return "roofline: tokens x hidden x top-k / EP over the link at the network efficiency"
