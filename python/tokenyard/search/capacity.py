"""Capacity search: the highest arrival rate at which a deployment still meets its SLOs.

A ``CapacitySearch`` is a state machine over simulated runs ("probes") of one deployment:
it asks for a rate, is told whether the SLOs held there, and asks for the next. Bracketing
is fixed so the sequence of rates depends only on the outcomes: start at ``initial_qps``,
double while the SLOs hold (up to ``max_qps``) or halve while they break (down to
``min_qps``), then bisect geometrically until ``hi / lo - 1 <= tolerance``. The capacity
is ``lo``, the last rate that held.

Invariant: ``lo`` only rises and ``hi`` only falls, and ``lo < hi``. Hence, for two SLO
sets where the looser holds wherever the tighter does, the searches take the same rates
until the first rate where only the looser holds; from there the looser's ``lo`` is at or
above that rate and the tighter's ``hi`` at or below it, so a looser SLO never lowers the
capacity (for any outcomes, monotone in the rate or not).

A probe is one simulation of the deployment with its workload re-timed to the rate
(``with_rate``); ``run_probe`` is the top-level task function the executors ship.

Closed-loop load (``workload.closed_loop``): the load is the number of users, not a rate, so
the search varies ``closed_loop.concurrency`` over whole numbers (a midpoint is rounded; the
bisection stops when no whole number lies between ``lo`` and ``hi``), and the "capacity" is
the most users for which the SLOs held.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

from tokenyard.errors import ConfigError, TokenyardError
from tokenyard.search.config import METRIC_STATS, SLO, SearchParams
from tokenyard.simulation.config import apply_overrides, config_from_mapping, default_workload

__all__ = [
    "CapacityResult",
    "CapacitySearch",
    "Probe",
    "check_rate_settable",
    "is_closed_loop",
    "run_probe",
    "with_rate",
]

#: Every metric a probe reports (each SLO key's value), in seconds.
METRIC_KEYS = tuple(f"{m}_{s}_s" for m, stats in METRIC_STATS.items() for s in stats)
#: A probe's output tokens per second (decode tokens, the first included), beside its
#: latency metrics.
DECODE_TOKENS_KEY = "decode_tokens_per_s"


def is_closed_loop(simulation: Mapping[str, Any]) -> bool:
    """Whether the simulation's workload is closed-loop (its load is a number of users)."""
    workload = simulation.get("workload") or {}
    return isinstance(workload, Mapping) and "closed_loop" in workload


def check_rate_settable(workload: Mapping[str, Any], where: str = "workload") -> None:
    """Raises ``ConfigError`` when the search cannot re-time ``workload`` to a rate."""
    kind = workload.get("kind")
    if "closed_loop" in workload:
        return  # the search sets the number of users
    if kind == "sessions" or workload.get("format") in ("sessions", "bailian"):
        raise ConfigError(
            f"{where}: a session workload's load is not a request rate (each turn waits "
            f"for the one before); add {where}.closed_loop = {{concurrency = 1}} and the "
            f"search varies the number of users",
            field=where,
            value=repr(kind if kind == "sessions" else workload.get("format")),
        )
    if kind == "trace":
        if workload.get("time_scale", 1.0) != 1.0:
            raise ConfigError(
                f"{where}.time_scale: the search sets the rate through target_qps; remove "
                f"time_scale (got {workload['time_scale']!r})",
                field=f"{where}.time_scale",
                value=repr(workload["time_scale"]),
            )
    elif kind == "synthetic":
        arrival = workload.get("arrival")
        if not isinstance(arrival, Mapping):
            raise ConfigError(
                f"{where}.arrival: missing; the search re-times it", field=f"{where}.arrival"
            )


def with_rate(simulation: Mapping[str, Any], rate: float) -> dict[str, Any]:
    """The simulation document with its workload re-timed to ``rate`` requests/s (for a
    closed-loop workload: with ``rate`` users).

    Synthetic: ``arrival.qps = rate`` (poisson, gamma, constant keep their kind and seed,
    so the same seed gives the same stream scaled in time); bursty: ``qps`` and
    ``burst_qps`` scaled together so the mean rate is ``rate``. Traces: ``target_qps``.
    """
    workload = dict(simulation.get("workload") or default_workload())
    if "closed_loop" in workload:
        loop = dict(workload["closed_loop"])
        loop["concurrency"] = max(1, round(rate))
        workload["closed_loop"] = loop
    elif workload.get("kind") == "trace":
        workload["target_qps"] = rate
        workload.pop("time_scale", None)
    else:
        arrival = dict(workload.get("arrival") or {})
        if arrival.get("kind") == "bursty":
            from tokenyard.workload import ArrivalProcess

            mean = ArrivalProcess(**arrival).mean_qps
            arrival["qps"] = float(arrival["qps"]) * rate / mean
            arrival["burst_qps"] = float(arrival["burst_qps"]) * rate / mean
        else:
            arrival["qps"] = rate
        workload["arrival"] = arrival
    return apply_overrides(simulation, {"workload": workload})


@dataclasses.dataclass(frozen=True)
class Probe:
    """One simulation at ``rate``: every metric (``METRIC_KEYS`` and the output tokens per
    second, ``DECODE_TOKENS_KEY``), the throughput, and the wall time; or the error that
    stopped it."""

    rate: float
    metrics: Mapping[str, float]
    requests_per_s: float = 0.0
    num_requests: int = 0
    wall_s: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "metrics": dict(self.metrics),
            "requests_per_s": self.requests_per_s,
            "num_requests": self.num_requests,
            "wall_s": self.wall_s,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Probe:
        return cls(
            rate=float(data["rate"]),
            metrics={k: float(v) for k, v in data["metrics"].items()},
            requests_per_s=float(data["requests_per_s"]),
            num_requests=int(data["num_requests"]),
            wall_s=float(data["wall_s"]),
            error=data["error"],
        )


def run_probe(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The task function: simulate ``payload["simulation"]`` at ``payload["rate"]``; with
    ``payload["keep_summary"]`` true the result also carries the run's ``summary``.

    Top-level and taking only plain data, so a process pool (spawn/forkserver) or Ray can
    ship it. A tokenyard error comes back as the probe's ``error``; anything else (a bug)
    is raised.
    """
    from tokenyard.search.config import metric_value
    from tokenyard.simulation import simulate

    rate = float(payload["rate"])
    start = time.perf_counter()
    try:
        result = simulate(config_from_mapping(with_rate(payload["simulation"], rate)))
    except TokenyardError as error:
        return Probe(rate, {}, error=f"{type(error).__name__}: {error}").to_dict()
    summary = result.summary
    metrics = {key: metric_value(summary, key) for key in METRIC_KEYS}
    # Not an SLO key: the output tokens served, for tokens/s per GPU at capacity.
    metrics[DECODE_TOKENS_KEY] = float(summary["throughput"]["decode_tokens_per_s"])
    out = Probe(
        rate,
        metrics,
        requests_per_s=float(summary["throughput"]["requests_per_s"]),
        num_requests=int(summary["num_requests"]),
        wall_s=time.perf_counter() - start,
    ).to_dict()
    if payload.get("keep_summary"):  # the caller reports from this run (recommend's rows)
        out["summary"] = summary
    return out


@dataclasses.dataclass(frozen=True)
class CapacityResult:
    """The outcome of one capacity search.

    ``capacity_qps``: the highest simulated rate at which every SLO held (0 when none did
    down to ``min_qps``). ``hi_qps``: the lowest simulated rate at which one broke (``None``
    if none did up to ``max_qps``: then ``capped``). ``binding``: the SLO keys broken at
    ``hi_qps``. ``metrics``: every metric at ``capacity_qps``. ``stop``: why the search
    ended (``tolerance``, ``max_qps``, ``min_qps``, ``max_simulations``, ``error``).
    """

    slo: str
    capacity_qps: float
    hi_qps: float | None
    stop: str
    rates: tuple[float, ...]
    binding: tuple[str, ...] = ()
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    error: str | None = None

    @property
    def capped(self) -> bool:
        return self.stop == "max_qps"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["metrics"] = dict(self.metrics)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityResult:
        return cls(
            slo=data["slo"],
            capacity_qps=float(data["capacity_qps"]),
            hi_qps=None if data["hi_qps"] is None else float(data["hi_qps"]),
            stop=data["stop"],
            rates=tuple(float(r) for r in data["rates"]),
            binding=tuple(data["binding"]),
            metrics={k: float(v) for k, v in data["metrics"].items()},
            error=data["error"],
        )


class CapacitySearch:
    """Bisection for one SLO set; see the module docstring. ``next_rate()`` is the rate to
    simulate next (``None`` once done); ``record(probe)`` takes its outcome."""

    def __init__(self, slo: SLO, params: SearchParams, users: bool = False):
        self.slo, self.params = slo, params
        #: Closed-loop load: the rates are whole numbers of users.
        self.users = users
        self.lo: Probe | None = None
        self.hi: Probe | None = None
        self.rates: list[float] = []
        self.stop: str | None = None
        self.error: str | None = None

    @property
    def done(self) -> bool:
        return self.stop is not None

    def next_rate(self) -> float | None:
        if self.stop is not None:
            return None
        p = self.params
        lo = None if self.lo is None else self.lo.rate
        hi = None if self.hi is None else self.hi.rate
        # Users are whole numbers: the bounds are the whole numbers within min/max_qps.
        low = float(max(math.ceil(p.min_qps), 1)) if self.users else p.min_qps
        high = float(math.floor(p.max_qps)) if self.users else p.max_qps
        if lo is None and hi is None:
            rate = p.initial_qps
        elif hi is None:
            if lo is not None and lo >= high:
                return self._finish("max_qps")
            rate = min(2.0 * (lo or 0.0), high)
        elif lo is None:
            if hi <= low:
                return self._finish("min_qps")
            rate = max(hi / 2.0, low)
        else:
            if hi / lo - 1.0 <= p.tolerance or (self.users and hi - lo <= 1):
                return self._finish("tolerance")
            rate = math.sqrt(lo * hi)
        if self.users:
            # Strictly between lo and hi when hi - lo >= 2: sqrt(lo * hi) > lo + 0.5 there.
            rate = min(max(float(round(rate)), low), high)
            if high < low:
                return self._finish("min_qps")  # no whole number of users in the bounds
        if len(self.rates) >= p.max_simulations:
            return self._finish("max_simulations")
        return rate

    def _finish(self, stop: str) -> float | None:
        self.stop = stop
        return None

    def record(self, probe: Probe) -> None:
        self.rates.append(probe.rate)
        if probe.error is not None:
            self.error = probe.error
            self.stop = "error"
        elif self.slo.violations(probe.metrics):
            self.hi = probe
        else:
            self.lo = probe

    def result(self) -> CapacityResult:
        if self.stop is None:
            raise RuntimeError("the search has not finished")  # pragma: no cover - a bug
        return CapacityResult(
            slo=self.slo.name,
            capacity_qps=0.0 if self.lo is None else self.lo.rate,
            hi_qps=None if self.hi is None else self.hi.rate,
            stop=self.stop,
            rates=tuple(self.rates),
            binding=tuple(self.slo.violations(self.hi.metrics)) if self.hi else (),
            metrics=dict(self.lo.metrics) if self.lo else {},
            error=self.error,
        )


def breaks_from_probes(
    slo: SLO, probes: Mapping[float, Probe]
) -> dict[str, dict[str, float | None]]:
    """Per SLO key: ``break_qps``, the lowest simulated rate at which it broke (``None``:
    never), and ``held_qps``, the highest simulated rate below that at which it held."""
    ok = sorted((p for p in probes.values() if p.error is None), key=lambda p: p.rate)
    out: dict[str, dict[str, float | None]] = {}
    for key in slo.bounds:
        one = SLO(key, {key: slo.bounds[key]})
        broke = [p.rate for p in ok if one.violations(p.metrics)]
        first = min(broke) if broke else None
        held = [p.rate for p in ok if not one.violations(p.metrics)]
        below = [r for r in held if first is None or r < first]
        out[key] = {"held_qps": max(below) if below else None, "break_qps": first}
    return out
