"""The candidate deployments of ``tokenyard recommend`` and their steady-state estimates.

A ``Candidate`` is one deployment: aggregated (``replicas`` copies of one layout) or
disaggregated (a prefill pool and a decode pool, xPyD, each with its own layout), with its
step budget (``max_num_batched_tokens``, the chunk size), its batch cap (``max_num_seqs``)
and, where the model ships an MTP module and an acceptance rate is given, speculative
decoding. ``enumerate_candidates`` builds every layout that the memory planner fits and
whose GPUs divide the budget (or, for a target rate, the replicas it needs), and prices
each with ``estimate``. Layouts that do not fit are returned as skips with the reason.
Under ``--framework vllm`` every aggregated layout also gets the caps ``vllm serve`` runs
with when neither flag is given (``vllm_default_caps``, ``Candidate.default_caps``), which
``recommend`` simulates for every layout it simulates at all.

Invariant: a candidate's ``simulation()`` is a complete ``tokenyard simulate`` document;
its GPU count is ``gpus`` (both pools), as ``tokenyard.search.deployments.gpu_pools``
counts it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from tokenyard.errors import ConfigError
from tokenyard.recommend import estimate as est
from tokenyard.simulation.config import SimulationConfig, apply_overrides, config_from_mapping
from tokenyard.simulation.hybrid_kv import requests_held
from tokenyard.simulation.planner import MemoryPlan

__all__ = [
    "CHUNK_SIZES",
    "GPUS_PER_NODE",
    "Candidate",
    "Layout",
    "Space",
    "enumerate_candidates",
    "vllm_default_caps",
]

#: Step token budgets tried (vLLM 0.33's ``max_num_batched_tokens`` default is 8192 for
#: ``vllm serve`` on H100/H200 and 16384 on B200/B300: ``EngineArgs.
#: _set_default_max_num_seqs_and_batched_tokens_args`` in vllm/engine/arg_utils.py).
CHUNK_SIZES = (2048, 8192, 16384)
#: TP (and a P/D transfer on NVLink) stays within one node of this many GPUs.
GPUS_PER_NODE = 8
_TP = (1, 2, 4, 8)
_PP = (1, 2, 4)
_DP = (1, 2, 4, 8)

Kind = Literal["agg", "disagg"]


def vllm_default_caps(device: Any) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` of ``vllm serve`` on catalog GPU
    ``device`` when neither flag is given: vLLM 0.33's ``EngineArgs.get_batch_defaults``
    (vllm/engine/arg_utils.py) for ``UsageContext.OPENAI_API_SERVER``, applied by
    ``_set_default_max_num_seqs_and_batched_tokens_args``: 1024 / 16384 on GPUs of 160 GiB
    or more (B200, B300, MI300X), 1024 / 8192 on 70 GiB or more except A100s (H100, H200),
    256 / 2048 on the rest. vLLM reads the memory the driver reports; the catalog's
    marketed size stands for it (no catalog GPU is near either threshold). Not modelled:
    ``--performance-mode throughput`` (doubles both) and the DeepEP low-latency backend's
    256-token budget (``use_batched_dp_moe``), neither of which a plain launch sets."""
    memory = float(device.memory_gib)
    if memory >= 160:
        return 1024, 16384
    if memory >= 70 and "a100" not in str(device.name).lower():
        return 1024, 8192
    return 256, 2048


#: Fields whose refusal skips a layout (it does not fit the GPU, or the framework's policy
#: cannot run it: SGLang's has no pipeline parallelism); any other error is the ask's.
_LAYOUT_REFUSALS = (
    "replica.device",
    "replica.expert_parallel_size",
    "replica.data_parallel_size",
    "replica.num_pipeline_stages",
    "replica.tensor_parallel_size",
)


@dataclasses.dataclass(frozen=True)
class Layout:
    """One replica's parallelism on ``device``: TP x PP x DP GPUs; EP spreads the experts
    over the TP x DP ranks (1: every expert split by TP, over TP x DP GPUs where DP > 1)."""

    device: str
    tp: int
    pp: int = 1
    dp: int = 1
    ep: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def label(self) -> str:
        parts = [f"TP{self.tp}"]
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        if self.dp > 1:
            parts.append(f"DP{self.dp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        return " ".join(parts)

    def replica(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "tensor_parallel_size": self.tp,
            "num_pipeline_stages": self.pp,
            "data_parallel_size": self.dp,
            "expert_parallel_size": self.ep,
        }


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One deployment to simulate. ``estimate``: its steady-state figures (capacity in
    requests/s or users, tokens/s/GPU, TPOT, TTFT) from ``estimate``."""

    kind: Kind
    layout: Layout
    replicas: int
    max_num_batched_tokens: int
    max_num_seqs: int
    decode: Layout | None = None
    decode_replicas: int = 0
    decode_max_num_seqs: int = 0
    speculative: Mapping[str, Any] | None = None
    estimate: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: The caps are vLLM's defaults on this GPU (``vllm_default_caps``), not the estimate's
    #: choice: simulated for every simulated layout, whatever the estimate prefers.
    default_caps: bool = False

    @property
    def gpus(self) -> int:
        extra = self.decode.gpus * self.decode_replicas if self.decode is not None else 0
        return self.layout.gpus * self.replicas + extra

    @property
    def label(self) -> str:
        if self.decode is None:
            spec = f" MTP{self.speculative['num_speculative_tokens']}" if self.speculative else ""
            return f"{self.layout.label} x{self.replicas}{spec}"
        return (
            f"prefill {self.layout.label} x{self.replicas} + "
            f"decode {self.decode.label} x{self.decode_replicas}"
        )

    @property
    def shape(self) -> str:
        """The layout without its replica counts: points of one shape differ in size only."""
        spec = f" MTP{self.speculative['num_speculative_tokens']}" if self.speculative else ""
        if self.decode is None:
            return f"{self.layout.label}{spec} on {self.layout.device}"
        return f"prefill {self.layout.label} + decode {self.decode.label} on {self.layout.device}"

    @property
    def knobs(self) -> str:
        """The scheduler caps, in vLLM's words."""
        seqs = self.max_num_seqs if self.decode is None else self.decode_max_num_seqs
        return f"max_num_seqs={seqs} max_num_batched_tokens={self.max_num_batched_tokens}"

    def with_replicas(self, replicas: int, decode_replicas: int = 0) -> Candidate:
        return dataclasses.replace(
            self, replicas=replicas, decode_replicas=decode_replicas or self.decode_replicas
        )

    def simulation(self, base: Mapping[str, Any], policy: str) -> dict[str, Any]:
        """The ``tokenyard simulate`` document of this deployment on ``base`` (seed,
        model, dtypes, execution, workload) under scheduler ``policy``."""
        replica = {
            **self.layout.replica(),
            "scheduler": _scheduler(policy, self.max_num_seqs, self.max_num_batched_tokens),
        }
        if self.speculative:
            replica["speculative"] = dict(self.speculative)
        cluster: dict[str, Any] = {"num_replicas": self.replicas}
        if self.decode is not None:
            cluster["decode"] = {
                "num_replicas": self.decode_replicas,
                "device": self.decode.device,
                "tensor_parallel_size": self.decode.tp,
                "num_pipeline_stages": self.decode.pp,
                "data_parallel_size": self.decode.dp,
                "expert_parallel_size": self.decode.ep,
                "scheduler": _scheduler(
                    policy, self.decode_max_num_seqs, self.max_num_batched_tokens
                ),
            }
        return apply_overrides(base, _dotted({"replica": replica, "cluster": cluster}))


def _dotted(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``: overrides that merge into ``base``."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping) and value:
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _scheduler(policy: str, max_num_seqs: int, max_num_batched_tokens: int) -> dict[str, Any]:
    if policy == "sglang":
        section = {
            "max_running_requests": max_num_seqs,
            "chunked_prefill_size": max_num_batched_tokens,
        }
    else:
        section = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens}
    return {"policy": policy, policy: section}


@dataclasses.dataclass(frozen=True)
class Space:
    """What the candidates are built for: the load's mean lengths, the SLO bounds the
    estimator checks (seconds; the stat the user asked for is applied by the simulation),
    and the GPU budget or the target load (requests/s, or users for a closed loop)."""

    isl: float
    osl: float
    ttft_s: float | None
    tpot_s: float | None
    gpus: int | None = None
    target: float | None = None
    closed_loop: bool = False
    margin: float = 0.1
    disaggregated: bool = True
    mtp_acceptance: float | None = None


def _layouts(model: Any, device: str, max_gpus: int) -> list[Layout]:
    moe = model.num_experts > 1
    out = []
    for tp in _TP:
        for pp in _PP:
            for dp in _DP if moe else (1,):
                if tp * pp * dp > max_gpus or tp > GPUS_PER_NODE:
                    continue
                try:
                    model.check_layout(tp, pp)
                except ConfigError:
                    continue
                # EP 1 with DP > 1: vLLM's --data-parallel-size without
                # --enable-expert-parallel, the experts one TP group of TP x DP GPUs;
                # the block-FP8 slices vLLM refuses are the config's to refuse.
                eps = (1, tp * dp) if moe else (1,)
                for ep in dict.fromkeys(eps):
                    try:
                        model.check_expert_parallel(ep)
                    except ConfigError:
                        continue
                    out.append(Layout(device, tp, pp, dp, ep))
    return out


@dataclasses.dataclass
class _Priced:
    layout: Layout
    price: est.Pricer
    max_kv_tokens: int
    #: vLLM's default caps on this layout (``vllm_default_caps``), or None: not vLLM, or
    #: the linear-attention state reserved for its ``max_num_seqs`` leaves no KV room.
    defaults: tuple[int, int] | None = None
    #: The most requests of ``isl + osl`` tokens the KV holds at once: with vLLM's hybrid
    #: groups ``requests_held`` (a request holds blocks in every group, which
    #: ``max_kv_tokens`` counts once), else the batch ladder's top.
    max_batch: int = est.BATCH_SIZES[-1]


def _price_layouts(
    base: Mapping[str, Any],
    space: Space,
    layouts: Sequence[Layout],
    skipped: list[tuple[str, str]],
    defaults: tuple[int, int] | None = None,
) -> list[_Priced]:
    from tokenyard.simulation.run import plan_for

    out = []
    for layout in layouts:
        doc = apply_overrides(base, _dotted({"replica": layout.replica()}))
        try:
            config = config_from_mapping(doc)
            plan = plan_for(config)
        except ConfigError as error:
            if error.field in _LAYOUT_REFUSALS:  # does not fit, or the policy refuses it
                skipped.append((layout.label + f" on {layout.device}", str(error)))
                continue
            raise
        mine = defaults
        if mine is not None and plan.state_bytes_per_request:
            # The state reserved grows with max_num_seqs: plan the default cap too.
            seqs, budget = mine
            caps = {"vllm_v1": {"max_num_seqs": seqs, "max_num_batched_tokens": budget}}
            try:
                plan_for(
                    config_from_mapping(
                        apply_overrides(doc, _dotted({"replica": {"scheduler": caps}}))
                    )
                )
            except ConfigError:
                mine = None
        held = _max_batch(config, plan, space)
        out.append(_Priced(layout, est.pricer(config), plan.max_kv_tokens, mine, held))
    return out


def _max_batch(config: SimulationConfig, plan: MemoryPlan, space: Space) -> int:
    """``_Priced.max_batch``: with vLLM's hybrid groups the requests of ``isl + osl``
    tokens they hold at once (``requests_held``, prefix caching on as the launched vLLM
    runs it), else the batch ladder's top (``max_kv_tokens`` bounds it)."""
    if not plan.kv_cache_groups:
        return est.BATCH_SIZES[-1]
    return requests_held(config, plan, math.ceil(space.isl + space.osl))


def _aggregated(space: Space, priced: _Priced, budget: int) -> est.Estimate | None:
    layout = priced.layout
    best: est.Estimate | None = est.best_batch(
        lambda b: est.aggregated(
            priced.price,
            isl=space.isl,
            osl=space.osl,
            batch_size=b,
            max_num_batched_tokens=budget,
            num_stages=layout.pp,
            data_parallel_size=layout.dp,
            gpus=layout.gpus,
        ),
        max_kv_tokens=priced.max_kv_tokens,
        ttft_s=space.ttft_s,
        tpot_s=space.tpot_s,
        max_batch=priced.max_batch,
    )
    return best


def _replicas_for(space: Space, per_replica: float) -> int:
    """Replicas to carry the target with the margin (the estimate is optimistic)."""
    if space.target is None or per_replica <= 0:
        return 0
    return max(1, math.ceil(space.target / (per_replica * (1.0 - space.margin))))


def _agg_candidates(space: Space, priced: Sequence[_Priced]) -> list[Candidate]:
    """Per layout and step budget, the estimate's batch B as the cap and 2B; and, where
    ``_Priced.defaults``, vLLM's default caps (priced by the estimate at the default
    budget, or at the layout's best budget where the default one fails it: the estimate
    only guides the capacity search's first guess there)."""
    out = []
    for p in priced:
        if space.gpus is not None and space.gpus % p.layout.gpus:
            continue
        mine = []
        estimates: dict[int, est.Estimate] = {}
        for budget in CHUNK_SIZES:
            e = _aggregated(space, p, budget)
            if e is None:
                continue
            estimates[budget] = e
            cap = min(2 * e.batch_size, budget)
            for seqs in dict.fromkeys((e.batch_size, cap)):
                mine.append(_agg_candidate(space, p, budget, seqs, e))
        if p.defaults is not None and mine:
            seqs, budget = p.defaults  # vLLM's default budgets are among CHUNK_SIZES
            e = estimates.get(budget)
            if e is None:  # the layout's best budget prices it
                best = max(mine, key=lambda c: c.estimate["tokens_per_s_per_gpu"])
                e = estimates[best.max_num_batched_tokens]
            mine.append(_agg_candidate(space, p, budget, seqs, e, default_caps=True))
        out.extend(mine)
    return out


def _agg_candidate(
    space: Space,
    p: _Priced,
    budget: int,
    seqs: int,
    e: est.Estimate,
    *,
    default_caps: bool = False,
) -> Candidate:
    # Closed loop: a replica's capacity is its users, the batch it holds.
    per_replica = e.batch_size * p.layout.dp if space.closed_loop else e.requests_per_s
    if space.gpus is not None:
        replicas = space.gpus // p.layout.gpus
    else:
        replicas = _replicas_for(space, per_replica)
    return Candidate(
        "agg",
        p.layout,
        replicas,
        budget,
        seqs,
        estimate={
            "capacity": per_replica * replicas,
            "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
            "tokens_per_s_per_user": e.tokens_per_s_per_user,
            "tpot_s": e.tpot_s,
            "ttft_s": e.ttft_s,
            "batch_size": e.batch_size,
        },
        default_caps=default_caps,
    )


def _disagg_candidates(space: Space, priced: Sequence[_Priced]) -> list[Candidate]:
    # Either pool may run EP and attention DP (MoE), as cluster.decode takes them too.
    decodes = _decode_pools(space, priced)
    out = []
    for p, budget, pe in _prefill_pools(space, priced):
        for d, de in decodes:
            if p.layout.device != d.layout.device:
                continue  # one GPU type per deployment (KV layouts alike)
            rp = pe.requests_per_s
            rd = de.requests_per_s
            if space.closed_loop:  # users: what the decode pool holds
                rd = float(de.batch_size * d.layout.dp)
            sizes = _pool_sizes(space, p.layout.gpus, d.layout.gpus, rp, rd)
            if sizes is None:
                continue
            x, y = sizes
            rate = min(x * rp, y * rd) if not space.closed_loop else y * rd
            gpus = x * p.layout.gpus + y * d.layout.gpus
            tokens = rate * (space.osl if not space.closed_loop else 1.0 / de.tpot_s)
            out.append(
                Candidate(
                    "disagg",
                    p.layout,
                    x,
                    budget,
                    min(budget, 256),  # prompts held until their KV has left
                    decode=d.layout,
                    decode_replicas=y,
                    decode_max_num_seqs=min(de.batch_size, budget),
                    estimate={
                        "capacity": rate,
                        "tokens_per_s_per_gpu": tokens / gpus,
                        "tokens_per_s_per_user": 1.0 / de.tpot_s,
                        "tpot_s": de.tpot_s,
                        "ttft_s": pe.ttft_s,
                        "batch_size": de.batch_size,
                    },
                )
            )
    return out


def _prefill_pools(
    space: Space, priced: Sequence[_Priced]
) -> list[tuple[_Priced, int, est.PrefillEstimate]]:
    """Each layout as a prefill pool at each step budget above the smallest, where its
    estimate meets the TTFT bound."""
    out = []
    for p in priced:
        for budget in CHUNK_SIZES[1:]:
            pe = est.prefill_only(
                p.price,
                isl=space.isl,
                max_num_batched_tokens=budget,
                ttft_s=space.ttft_s if space.ttft_s is not None else math.inf,
                num_stages=p.layout.pp,
                data_parallel_size=p.layout.dp,
            )
            if pe is not None:
                out.append((p, budget, pe))
    return out


def _decode_pools(
    space: Space, priced: Sequence[_Priced]
) -> list[tuple[_Priced, est.DecodeEstimate]]:
    """Each layout as a decode pool at its best batch within the TPOT bound and its KV."""
    out = []
    for p in priced:

        def decode(b: int, p: _Priced = p) -> est.DecodeEstimate:
            return est.decode_only(
                p.price,
                isl=space.isl,
                osl=space.osl,
                batch_size=b,
                num_stages=p.layout.pp,
                data_parallel_size=p.layout.dp,
            )

        de = est.best_batch(
            decode,
            max_kv_tokens=p.max_kv_tokens,
            ttft_s=None,
            tpot_s=space.tpot_s,
            max_batch=p.max_batch,
        )
        if de is not None:
            out.append((p, de))
    return out


def _pool_sizes(
    space: Space, prefill_gpus: int, decode_gpus: int, rp: float, rd: float
) -> tuple[int, int] | None:
    """Prefill and decode replicas ``(x, y)`` for pools of ``rp`` and ``rd`` requests/s
    each (users, for the decode pool of a closed loop): within a GPU budget the split
    with the best estimated rate per GPU (``None``: no split fits), else the fewest that
    carry the target."""
    if space.gpus is None:
        x = _replicas_for(space, rp if not space.closed_loop else math.inf) or 1
        return x, _replicas_for(space, rd)
    best: tuple[float, int, int] | None = None
    for x in range(1, space.gpus // prefill_gpus + 1):
        room = space.gpus - x * prefill_gpus
        y = room // decode_gpus
        if y < 1:
            break
        # Fewest decode replicas that keep up with x prefill replicas.
        need = math.ceil(x * rp / rd) if not space.closed_loop else y
        y = max(1, min(y, need))
        rate = min(x * rp, y * rd) if not space.closed_loop else y * rd
        per_gpu = rate / (x * prefill_gpus + y * decode_gpus)
        if best is None or per_gpu > best[0]:
            best = (per_gpu, x, y)
    return None if best is None else (best[1], best[2])


def _mtp_candidates(space: Space, model: Any, agg: Sequence[Candidate]) -> list[Candidate]:
    """Speculative (MTP) variants of the aggregated candidates, where the model ships an
    MTP module and an acceptance rate was given (it is a property of the data, which no
    estimate knows)."""
    if space.mtp_acceptance is None or not getattr(model, "num_mtp_layers", 0):
        return []
    out = []
    for c in agg:
        for k in (1, 2, 3):
            spec = {
                "method": "mtp",
                "num_speculative_tokens": k,
                "acceptance_rate": space.mtp_acceptance,
            }
            out.append(dataclasses.replace(c, speculative=spec))
    return out


def enumerate_candidates(
    space: Space,
    base: Mapping[str, Any],
    devices: Sequence[str],
    *,
    framework: str,
) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """Every candidate on ``devices`` with its estimate, and the layouts skipped (label,
    reason). ``base``: the simulation document without a layout (model, dtypes, execution,
    workload)."""
    from tokenyard.simulation.catalog import catalog_for

    config = config_from_mapping(base)
    catalog = catalog_for(config)
    model = catalog.model(config.model_name(), field="replica.model")
    skipped: list[tuple[str, str]] = []
    max_gpus = space.gpus if space.gpus is not None else 4 * GPUS_PER_NODE
    out: list[Candidate] = []
    for device in devices:
        defaults = (
            vllm_default_caps(catalog.device(device, field="--system"))
            if framework == "vllm"
            else None
        )
        priced = _price_layouts(base, space, _layouts(model, device, max_gpus), skipped, defaults)
        agg = _agg_candidates(space, priced)
        out.extend(agg)
        out.extend(_mtp_candidates(space, model, agg))
        if space.disaggregated and framework == "vllm":
            out.extend(_disagg_candidates(space, priced))
    if space.gpus is not None:
        out = [c for c in out if c.gpus <= space.gpus]
    return out, skipped
