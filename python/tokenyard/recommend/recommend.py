"""``recommend``: from a model, GPU types, a load and SLOs to verified deployments.

Three phases, each narrower and dearer than the one before:

1. **Estimate** (``candidates``, ``estimate``): every layout that fits (TP, PP, EP and
   attention DP, xPyD pools, chunk sizes, batch caps, MTP) priced at its steady state by
   the simulator's own step predictor; seconds for hundreds of candidates.
2. **Simulate** the best ``top_k`` of each kind (aggregated, disaggregated) on the load:
   capacity by bisection (``tokenyard.search``'s ``PointJob`` on its executors: a process
   pool or Ray); with a target rate, pools are resized to it from the simulated capacity
   and searched again (twice at most).
3. **Verify** (``verify``) the best simulated points on the WHOLE load at ``(1 - margin) x``
   capacity (or at the target rate); only points that hold are recommended.

Invariant: every row of ``Recommendation.rows`` held all the SLOs in a simulation of the
whole load at its ``target_qps``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from tokenyard._checks import check_key_int
from tokenyard.errors import ConfigError
from tokenyard.recommend.candidates import Candidate, Space, enumerate_candidates
from tokenyard.recommend.verify import Verdict, verify_points
from tokenyard.search.capacity import DECODE_TOKENS_KEY, CapacityResult
from tokenyard.search.config import SLO, SearchParams, check_slo_key
from tokenyard.search.driver import PointJob, run_jobs
from tokenyard.search.executors import Executor, make_executor

__all__ = ["FRAMEWORKS", "Ask", "Recommendation", "recommend", "resolve_device"]

#: ``--framework`` -> the replica policy that schedules like it.
FRAMEWORKS = {"vllm": "vllm_v1", "sglang": "sglang"}
#: Without a TTFT or e2e bound nothing sees a queue grow past saturation: this guard does
#: (the search's ``max_scheduling_delay_p99_s``), and the output names it.
GUARD = ("scheduling_delay_p99_s", 2.0)


def resolve_device(name: str) -> str:
    """A catalog GPU from a catalog name or alias, or an aiconfigurator system name
    (``h200_sxm``: the device whose measured tables it names).

    Raises:
        ConfigError: no such GPU (field ``--system``).
    """
    from tokenyard.catalog import current_catalog
    from tokenyard.predictor.measured.data import SYSTEM_OF_DEVICE

    catalog = current_catalog()
    by_system = {system: device for device, system in SYSTEM_OF_DEVICE.items()}
    refusal: ConfigError | None = None
    for guess in (name, by_system.get(name), name.replace("_", "-")):
        if guess is None:
            continue
        try:
            return str(catalog.device(guess, field="--system").name)
        except ConfigError as error:
            refusal = refusal or error  # the plain name's: it lists the catalog's GPUs
    systems = ", ".join(sorted(by_system))
    raise ConfigError(
        f"{refusal} (or an aiconfigurator system: {systems})", field="--system", value=repr(name)
    )


@dataclasses.dataclass(frozen=True)
class Ask:
    """The planner's question. One of ``gpus`` (a budget: every layout uses it whole, or
    fewer GPUs for P/D), ``rate`` (requests/s to serve) or ``concurrency`` (users of a
    closed loop). ``workload``: the whole load, as ``tokenyard simulate``'s ``[workload]``
    (its rate is set by the search); ``sample``: how much of it the search simulates
    (a trace's first requests; a synthetic load's count), the whole of it being verified.
    ``slo``: bounds such as ``{"ttft_p90_s": 1.0, "tpot_p90_s": 0.05}``."""

    model: str
    systems: tuple[str, ...]
    workload: Mapping[str, Any]
    slo: Mapping[str, float]
    framework: str = "vllm"
    gpus: int | None = None
    rate: float | None = None
    concurrency: int | None = None
    margin: float = 0.10
    sample: int | None = 1000
    top_k: int = 4
    show: int = 3
    execution: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"model": "auto"})
    replica: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    disaggregated: bool = True
    mtp_acceptance: float | None = None
    seed: int = 0
    #: ``replica.scheduler.max_request_tokens`` (vLLM's ``--max-model-len``); ``recommend``
    #: sets it to the load's longest request, so the planner sizes KV for the load and not
    #: for the model's whole context (which can leave a layout no room at all).
    max_request_tokens: int | None = None

    def check(self) -> None:
        """Raises ConfigError naming the first bad field."""
        given = [k for k in ("gpus", "rate", "concurrency") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ConfigError(
                f"--gpus/--rate/--concurrency: give exactly one, got {given or 'none'}",
                field="--gpus",
            )
        if self.gpus is not None:
            check_key_int("--gpus", self.gpus, low=1, high=4096)
        if self.concurrency is not None:
            check_key_int("--concurrency", self.concurrency, low=1, high=1_000_000)
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise ConfigError(
                f"--rate: must be a finite number > 0, got {self.rate!r}",
                field="--rate",
                value=repr(self.rate),
            )
        if self.framework not in FRAMEWORKS:
            raise ConfigError(
                f"--framework: must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}",
                field="--framework",
                value=repr(self.framework),
            )
        if not 0.0 <= self.margin < 0.9:
            raise ConfigError(
                f"--margin: must be in [0, 0.9), got {self.margin!r}",
                field="--margin",
                value=repr(self.margin),
            )
        if not self.slo:
            raise ConfigError("--ttft/--tpot/--e2e/--slo: give at least one SLO", field="--slo")
        for key, bound in self.slo.items():
            check_slo_key(key, "--slo")
            if not (math.isfinite(bound) and bound > 0):
                raise ConfigError(
                    f"--slo {key}: must be a finite number of seconds > 0, got {bound!r}",
                    field="--slo",
                    value=repr(bound),
                )
        if not self.systems:
            raise ConfigError("--system: give at least one GPU system", field="--system")
        check_key_int("--top-k", self.top_k, low=1, high=100)
        check_key_int("--show", self.show, low=1, high=100)
        if self.sample is not None:
            check_key_int("--sample", self.sample, low=10, high=100_000_000)
        if self.mtp_acceptance is not None and not 0.0 < self.mtp_acceptance <= 1.0:
            raise ConfigError(
                f"--mtp-acceptance: must be in (0, 1], got {self.mtp_acceptance!r}",
                field="--mtp-acceptance",
                value=repr(self.mtp_acceptance),
            )

    @property
    def policy(self) -> str:
        return FRAMEWORKS[self.framework]

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None

    @property
    def target(self) -> float | None:
        """The load to serve: ``rate`` (requests/s) or ``concurrency`` (users); ``None``
        for a GPU budget."""
        return self.rate if self.rate is not None else self.concurrency

    def slo_set(self) -> tuple[SLO, str | None]:
        """The SLO set simulated, and the note when the saturation guard joins it."""
        bounds = dict(self.slo)
        if any(k.startswith(("ttft_", "e2e_", "scheduling_delay_")) for k in bounds):
            return SLO("recommend", bounds), None
        bounds[GUARD[0]] = GUARD[1]
        note = (
            f"no TTFT or e2e bound: {GUARD[0]} <= {GUARD[1]:g} s added, or a queue growing "
            "past saturation would go unseen"
        )
        return SLO("recommend", bounds), note

    def space(self, isl: float, osl: float) -> Space:
        """What the candidates are built for, on a load of these mean lengths; the
        estimate checks the TTFT and TPOT bounds (the last given of each)."""
        bound = {k.split("_")[0]: v for k, v in self.slo.items()}
        return Space(
            isl=isl,
            osl=osl,
            ttft_s=bound.get("ttft"),
            tpot_s=bound.get("tpot"),
            gpus=self.gpus,
            target=self.target,
            closed_loop=self.closed_loop,
            margin=self.margin,
            disaggregated=self.disaggregated,
            mtp_acceptance=self.mtp_acceptance,
        )

    def whole_workload(self) -> dict[str, Any]:
        workload = dict(self.workload)
        if self.concurrency is not None:
            loop = dict(workload.get("closed_loop") or {})
            loop["concurrency"] = self.concurrency
            workload["closed_loop"] = loop
            if workload.get("kind") == "synthetic":
                # Arrival times are lower bounds under a closed loop: make them no bound,
                # so the users alone set the load (docs/sessions.md).
                workload["arrival"] = {"kind": "poisson", "qps": 1e6}
        return workload

    def sample_workload(self) -> dict[str, Any]:
        """The load the search simulates: the whole load cut to ``sample`` requests."""
        workload = self.whole_workload()
        if self.sample is None:
            return workload
        if workload.get("kind") == "trace":
            limit = workload.get("limit")
            workload["limit"] = self.sample if limit is None else min(int(limit), self.sample)
        elif "num_requests" in workload:
            workload["num_requests"] = min(int(workload["num_requests"]), self.sample)
        return workload

    def base(self, workload: Mapping[str, Any]) -> dict[str, Any]:
        """The simulation document without a layout."""
        # The user's scheduler table (caps, limits) stays; the policy is the framework's.
        scheduler: dict[str, Any] = {**(self.replica.get("scheduler") or {}), "policy": self.policy}
        if self.max_request_tokens is not None:
            scheduler["max_request_tokens"] = self.max_request_tokens
        replica = {**self.replica, "model": self.model, "scheduler": scheduler}
        return {
            "seed": self.seed,
            "replica": replica,
            "execution": dict(self.execution),
            "workload": dict(workload),
        }


@dataclasses.dataclass
class Simulated:
    """A candidate after its capacity search: ``capacity`` (requests/s, or users)."""

    candidate: Candidate
    result: CapacityResult
    rounds: int = 1

    @property
    def capacity(self) -> float:
        return self.result.capacity_qps


@dataclasses.dataclass
class Recommendation:
    """The answer: ``points`` (verified, best first per kind), ``rejected`` (simulated
    and verified, but the whole load broke an SLO), counts and wall times per phase."""

    ask: Ask
    slo: SLO
    points: list[tuple[Simulated, Verdict]]
    rejected: list[tuple[Simulated, Verdict]]
    simulated: list[Simulated]
    num_candidates: int
    skipped: list[tuple[str, str]]
    mean_isl: float
    mean_osl: float
    notes: list[str]
    wall_s: dict[str, float]
    num_simulations: int = 0
    #: The summary of each recommended point's whole-load run (``points`` order): busy
    #: fractions and KV use for the cost and energy figures.
    summaries: list[Mapping[str, Any]] = dataclasses.field(default_factory=list)

    def best(self, kind: str) -> tuple[Simulated, Verdict] | None:
        return next((p for p in self.points if p[0].candidate.kind == kind), None)


class _Kept:
    """An executor that survives ``run_jobs`` (which closes what it is given), so one
    process pool serves every phase; ``close_now`` ends it."""

    def __init__(self, inner: Executor):
        self.inner = inner
        self.max_in_flight = inner.max_in_flight
        self.count = 0

    def submit(self, tag: Hashable, payload: dict[str, Any]) -> None:
        self.count += 1
        self.inner.submit(tag, payload)

    def wait(self) -> list[tuple[Hashable, dict[str, Any]]]:
        return self.inner.wait()

    def close(self) -> None:
        pass

    def close_now(self) -> None:
        self.inner.close()


def _load_stats(ask: Ask) -> tuple[float, float]:
    """The searched sample's mean prompt and output tokens."""
    stats = _stats(ask.sample_workload())
    return stats.mean_prefill_tokens, max(1.0, stats.mean_decode_tokens)


def _stats(workload: Mapping[str, Any]) -> Any:
    from tokenyard.search.capacity import with_rate
    from tokenyard.workload import load_workload
    from tokenyard.workload.chunk import summarize

    doc = with_rate({"workload": dict(workload)}, 1.0)
    return summarize(load_workload(doc["workload"]))


def _model(ask: Ask) -> Any:
    """The catalog entry of ``ask.model``."""
    from tokenyard.simulation.catalog import catalog_for
    from tokenyard.simulation.config import config_from_mapping

    config = config_from_mapping(ask.base(ask.sample_workload()))
    return catalog_for(config).model(config.model_name(), field="--model")


def _check_mtp(ask: Ask) -> None:
    """Raises ConfigError when an MTP acceptance rate is given for a model without an MTP
    module (no speculative variant could use it: a setting that changes nothing)."""
    if ask.mtp_acceptance is not None and not getattr(_model(ask), "num_mtp_layers", 0):
        raise ConfigError(
            f"--mtp-acceptance: {ask.model} ships no MTP module, so no MTP variant is tried",
            field="--mtp-acceptance",
            value=repr(ask.mtp_acceptance),
        )


#: ``max_request_tokens`` is the load's longest request rounded up to this.
REQUEST_TOKENS_STEP = 1024


def _request_limit(ask: Ask) -> tuple[Ask, str | None]:
    """``ask`` with ``max_request_tokens`` at the whole load's longest request (rounded up
    to ``REQUEST_TOKENS_STEP``, at most the model's context), and the note saying so;
    unchanged when the user set a limit (``replica.scheduler.max_request_tokens``, or
    ``vllm_v1.max_model_len`` under vLLM): ``Ask.base`` keeps the user's table."""
    scheduler = ask.replica.get("scheduler") or {}
    # vLLM's own max_model_len takes precedence over max_request_tokens under vllm_v1
    # (SchedulerConfig.request_limit): a user's setting of either is the limit.
    max_model_len = (scheduler.get("vllm_v1") or {}).get("max_model_len")
    given = ask.policy == "vllm_v1" and bool(max_model_len)
    if ask.max_request_tokens is not None or "max_request_tokens" in scheduler or given:
        return ask, None
    stats = _stats(ask.whole_workload())
    longest = stats.max_prefill_tokens + stats.max_decode_tokens
    limit = -(-longest // REQUEST_TOKENS_STEP) * REQUEST_TOKENS_STEP
    context = _model(ask).context_length
    if limit >= context:
        return ask, None
    return dataclasses.replace(ask, max_request_tokens=limit), (
        f"max_request_tokens = {limit} (vLLM --max-model-len, SGLang --context-length): the "
        f"load's longest request is {longest} tokens; KV is planned for it, not for the "
        f"model's {context}-token context"
    )


#: Candidates within this fraction of a group's best estimated tokens/s/GPU count as tied
#: (the estimate cannot tell them apart); the tie goes to tokens/s/user.
ESTIMATE_TIE = 0.03


def _survivors(candidates: Sequence[Candidate], top_k: int) -> list[Candidate]:
    """The candidates to simulate: per kind, the ``top_k`` best groups by estimated
    tokens/s/GPU, a group being one layout (aggregated) or one prefill layout (P/D: the
    decode pool is sized to it, so decode layouts tie). Within a group, the candidates
    tied with its best (``ESTIMATE_TIE``) go by GPUs used (a budget is for using), then
    tokens/s/user; the best group also sends its runner-up (the estimate ranks variants
    less surely than layouts). An aggregated layout's variants tie only exactly (its cap
    variants, B and 2B). Every aggregated layout simulated also sends its vLLM-default
    variant (``Candidate.default_caps``) unless one of its chosen variants has those caps:
    the estimate can prefer caps the simulation finds worse than vLLM's defaults (a small
    cap queues prompts; a small budget splits them), so at most ``top_k`` more searches."""
    out: list[Candidate] = []
    defaults = {c.shape: c for c in candidates if c.kind == "agg" and c.default_caps}
    for kind in ("agg", "disagg"):
        groups: dict[str, list[tuple[int, Candidate]]] = {}
        for order, c in enumerate(candidates):
            if c.kind == kind and not c.default_caps:
                key = c.label if kind == "agg" else f"{c.layout.label} on {c.layout.device}"
                groups.setdefault(key, []).append((order, c))
        ranked_groups: list[tuple[float, str, list[Candidate]]] = []
        for members in groups.values():
            best = max(m.estimate["tokens_per_s_per_gpu"] for _, m in members)
            tie = ESTIMATE_TIE if kind == "disagg" else 0.0
            tied = [
                m
                for _, m in sorted(
                    members,
                    key=lambda om: (
                        om[1].estimate["tokens_per_s_per_gpu"] < (1 - tie) * best,
                        -om[1].gpus,
                        -om[1].estimate["tokens_per_s_per_user"],
                        om[0],  # enumeration order: a layout's cap variants side by side
                    ),
                )
            ]
            ranked_groups.append((-best, tied[0].label, tied))
        ranked_groups.sort(key=lambda g: (g[0], g[1]))
        for i, (_, _, chosen) in enumerate(ranked_groups[:top_k]):
            sent = chosen[: 2 if i == 0 else 1]
            default = defaults.get(sent[0].shape) if kind == "agg" else None
            caps = {(c.max_num_seqs, c.max_num_batched_tokens) for c in sent}
            if (
                default is not None
                and (default.max_num_seqs, default.max_num_batched_tokens) not in caps
            ):
                sent.append(_sized_as(default, sent[0]))
            out.extend(sent)
    return out


def _sized_as(default: Candidate, chosen: Candidate) -> Candidate:
    """``default`` with ``chosen``'s replicas (a target rate sizes each variant by its own
    estimate), its estimated capacity scaled with them."""
    if default.replicas == chosen.replicas:
        return default
    estimate = dict(default.estimate)
    estimate["capacity"] = estimate.get("capacity", 0.0) * chosen.replicas / default.replicas
    return dataclasses.replace(default, replicas=chosen.replicas, estimate=estimate)


#: A run must last this many times the largest latency bound at the rate it is run at,
#: or a queue too short-lived to break an SLO hides an overload (docs/search.md,
#: "Workload size").
RUN_LENGTH_BOUNDS = 50


def _long_enough(ask: Ask, survivors: Sequence[Candidate], slo: SLO) -> tuple[Ask, str | None]:
    """``ask`` with its sample grown so a run at the best estimated capacity lasts
    ``RUN_LENGTH_BOUNDS`` x the largest bound (up to the whole load), and a note saying
    so, or that the whole load itself is shorter than that."""
    if ask.sample is None or ask.closed_loop or not survivors:
        return ask, None
    rate = max(c.estimate.get("capacity", 0.0) for c in survivors)
    needed = math.ceil(rate * RUN_LENGTH_BOUNDS * max(slo.bounds.values()))
    whole = ask.whole_workload()
    total = whole.get("num_requests") if whole.get("kind") != "trace" else whole.get("limit")
    if needed <= ask.sample:
        return ask, None
    if total is not None and needed > int(total):
        return dataclasses.replace(ask, sample=None), (
            f"the whole load ({total} requests) lasts under {RUN_LENGTH_BOUNDS}x the largest "
            f"bound at the estimated {rate:.3g} requests/s: the search runs all of it, and a "
            "longer load would test the SLOs better"
        )
    return dataclasses.replace(ask, sample=needed), (
        f"sample raised to {needed} requests: {RUN_LENGTH_BOUNDS}x the largest bound at "
        f"the estimated {rate:.3g} requests/s"
    )


def _params(candidate: Candidate, closed_loop: bool) -> SearchParams:
    guess = candidate.estimate.get("capacity", 1.0) * 0.7
    low = 1.0 if closed_loop else 0.01
    initial = max(low, round(guess) if closed_loop else float(f"{guess:.3g}"))
    return SearchParams(
        initial_qps=initial,
        min_qps=low,
        # Far above the estimate only a run too short to build a queue still holds.
        max_qps=max(initial, 10.0 * candidate.estimate.get("capacity", 1e4)),
        tolerance=0.05,
        max_simulations=24,
        max_scheduling_delay_p99_s=math.inf,
    )


def _search(
    candidates: Sequence[Candidate], ask: Ask, slo: SLO, executor: _Kept, rounds: int = 1
) -> list[Simulated]:
    base = ask.base(ask.sample_workload())
    jobs = [
        PointJob(str(i), c.simulation(base, ask.policy), [slo], _params(c, ask.closed_loop))
        for i, c in enumerate(candidates)
    ]
    run_jobs(jobs, executor)
    return [
        Simulated(c, job.results()[slo.name], rounds)
        for c, job in zip(candidates, jobs, strict=True)
    ]


def _resize(sim: Simulated, target: float, margin: float) -> Candidate | None:
    """The candidate with its pools scaled so ``(1 - margin) x`` capacity just covers
    ``target``, capacity taken as proportional to the replicas (round-robin routing over
    identical replicas): grown when short, shrunk when a smaller size would do. ``None``
    when the size would not change or the point never held any load."""
    c, usable = sim.candidate, sim.capacity * (1.0 - margin)
    if sim.capacity <= 0:
        return None
    factor = target / usable
    resized = c.with_replicas(
        max(1, math.ceil(c.replicas * factor)),
        max(1, math.ceil(c.decode_replicas * factor)) if c.decode is not None else 0,
    )
    same = (resized.replicas, resized.decode_replicas) == (c.replicas, c.decode_replicas)
    return None if same else resized


def _size_to_target(
    simulated: Sequence[Simulated], target: float, ask: Ask, slo: SLO, executor: _Kept
) -> list[Simulated]:
    """``simulated`` with each point's pools sized to ``target`` from its simulated
    capacity (``_resize``) and searched again, twice at most: a resized point replaces the
    one before when it fits, or when the one before did not; no size is searched twice."""
    simulated = list(simulated)
    tried = [{(s.candidate.replicas, s.candidate.decode_replicas)} for s in simulated]
    for round_ in (2, 3):
        resized = [
            (i, r)
            for i, s in enumerate(simulated)
            if (r := _resize(s, target, ask.margin))
            and (r.replicas, r.decode_replicas) not in tried[i]
        ]
        if not resized:
            break
        again = _search([r for _, r in resized], ask, slo, executor, round_)
        for (i, r), s in zip(resized, again, strict=True):
            tried[i].add((r.replicas, r.decode_replicas))
            fits = s.capacity * (1.0 - ask.margin) >= target
            if fits or simulated[i].capacity * (1.0 - ask.margin) < target:
                simulated[i] = s  # a smaller size that fits, or the old one did not
    return simulated


def _usable(sim: Simulated, ask: Ask) -> float:
    """The rate (or users) a point is verified at."""
    if ask.target is not None:
        return float(ask.target)
    usable = sim.capacity * (1.0 - ask.margin)
    return float(max(1, math.floor(usable))) if ask.closed_loop else usable


def tokens_per_s_per_gpu(sim: Simulated, verdict: Verdict) -> float:
    """Output tokens/s per GPU at the verified rate: the whole-load run's own output
    tokens/s (its summary's ``throughput.decode_tokens_per_s``) over the point's GPUs, not
    the searched sample's mean output length (a sample need not look like the whole)."""
    return verdict.metrics.get(DECODE_TOKENS_KEY, 0.0) / sim.candidate.gpus


def recommend(
    ask: Ask,
    *,
    executor: str | Executor | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
) -> Recommendation:
    """Answers ``ask`` (see the module docstring).

    Raises:
        ConfigError: a bad ask, model, system or workload, before any simulation.
    """
    from tokenyard.search.capacity import check_rate_settable

    ask.check()
    check_rate_settable(ask.whole_workload(), "--workload")
    start = time.perf_counter()
    devices = list(dict.fromkeys(resolve_device(s) for s in ask.systems))
    slo, guard_note = ask.slo_set()
    notes = [guard_note] if guard_note else []
    _check_mtp(ask)
    ask, limit_note = _request_limit(ask)
    notes += [limit_note] if limit_note else []
    isl, osl = _load_stats(ask)
    space = ask.space(isl, osl)
    if ask.disaggregated and ask.framework != "vllm":
        notes.append(
            "P/D not searched: the simulator's disaggregated pools run vllm_v1 replicas "
            "(docs/disaggregation.md)"
        )
    candidates, skipped = enumerate_candidates(
        space, ask.base(ask.sample_workload()), devices, framework=ask.framework
    )
    if not candidates:
        reasons = "; ".join(f"{label}: {why}" for label, why in skipped[:3]) or "none fit"
        raise ConfigError(
            f"--gpus/--system: no layout of {ask.model} fits the budget on "
            f"{', '.join(devices)} within the SLOs by the estimate ({reasons})",
            field="--gpus",
        )
    t_estimate = time.perf_counter()
    survivors = _survivors(candidates, ask.top_k)
    ask, note = _long_enough(ask, survivors, slo)
    notes += [note] if note else []
    kept = _Kept(make_executor(executor, workers=workers, ray_address=ray_address))
    try:
        simulated = _search(survivors, ask, slo, kept)
        if ask.target is not None:
            simulated = _size_to_target(simulated, ask.target, ask, slo, kept)
        t_search = time.perf_counter()
        points, rejected = _verify(simulated, ask, slo, kept, osl)
    finally:
        kept.close_now()
    # The verified run's own summary (the same config and seed would give it again).
    summaries = [
        v.summary if v.summary is not None else point_config(ask, s, v)[1] for s, v in points
    ]
    end = time.perf_counter()
    return Recommendation(
        ask=ask,
        slo=slo,
        points=points,
        rejected=rejected,
        simulated=simulated,
        num_candidates=len(candidates),
        skipped=skipped,
        mean_isl=isl,
        mean_osl=osl,
        notes=notes,
        wall_s={
            "estimate": t_estimate - start,
            "search": t_search - t_estimate,
            "verify": end - t_search,
            "total": end - start,
        },
        num_simulations=kept.count + sum(v.summary is None for _, v in points),
        summaries=summaries,
    )


def _verify_queue(
    simulated: Sequence[Simulated], kind: str, ask: Ask, osl: float
) -> list[Simulated]:
    """The points of ``kind`` to verify, best first: by tokens/s/GPU at the rate verified
    (a budget), or by fewest GPUs among those whose usable capacity covers the target;
    one point per layout, its best size and cap/chunk variant (the rest repeat it)."""
    target = ask.target
    ranked = sorted(
        (s for s in simulated if s.candidate.kind == kind and s.capacity > 0),
        key=lambda s: (
            -_usable(s, ask) * osl / s.candidate.gpus if target is None else s.candidate.gpus,
            -s.capacity,
        ),
    )
    if target is not None:
        ranked = [s for s in ranked if s.capacity * (1.0 - ask.margin) >= target]
    firsts: dict[str, Simulated] = {}
    for s in ranked:
        firsts.setdefault(s.candidate.shape, s)
    return list(firsts.values())


def _verify(
    simulated: Sequence[Simulated], ask: Ask, slo: SLO, executor: _Kept, osl: float
) -> tuple[list[tuple[Simulated, Verdict]], list[tuple[Simulated, Verdict]]]:
    """Verifies the best simulated points of each kind on the whole load, in rounds, until
    ``ask.show`` of a kind held or none is left. Both kinds' rounds run side by side (one
    batch on the executor), each kind's points chosen as if it ran alone."""
    whole = ask.base(ask.whole_workload())
    queues = {kind: _verify_queue(simulated, kind, ask, osl) for kind in ("agg", "disagg")}
    held: dict[str, list[tuple[Simulated, Verdict]]] = {kind: [] for kind in queues}
    rejected: dict[str, list[tuple[Simulated, Verdict]]] = {kind: [] for kind in queues}
    while True:
        batch: list[tuple[tuple[str, int], Simulated]] = []
        for kind, queue in queues.items():
            wanted = ask.show - len(held[kind])
            if wanted > 0:
                batch += [((kind, i), s) for i, s in enumerate(queue[:wanted])]
                queues[kind] = queue[wanted:]
        if not batch:
            break
        points = [
            (tag, s.candidate.simulation(whole, ask.policy), _usable(s, ask)) for tag, s in batch
        ]
        verdicts = verify_points(
            points,
            slo,
            executor,
            margin=ask.margin,
            step_down=ask.target is None,
            closed_loop=ask.closed_loop,
        )
        for (kind, i), s in batch:
            verdict = verdicts[(kind, i)]
            (held if verdict.held else rejected)[kind].append((s, verdict))
    out: list[tuple[Simulated, Verdict]] = []
    for mine in held.values():
        out += sorted(mine, key=lambda p: -tokens_per_s_per_gpu(p[0], p[1]))
    return out, [p for kind in rejected for p in rejected[kind]]


def point_config(
    ask: Ask, sim: Simulated, verdict: Verdict, *, run: bool = True
) -> tuple[Any, Mapping[str, Any]]:
    """The ``SimulationConfig`` of a point on the whole load at its verified rate (what
    ``--out`` writes as the tokenyard config that reproduces it) and, with ``run``, the
    summary of that run (the verified one again: same config, same seed, same result)."""
    from tokenyard.search.capacity import with_rate
    from tokenyard.simulation import simulate
    from tokenyard.simulation.config import config_from_mapping

    doc = sim.candidate.simulation(ask.base(ask.whole_workload()), ask.policy)
    config = config_from_mapping(with_rate(doc, verdict.rate))
    return config, (simulate(config).summary if run else {})
