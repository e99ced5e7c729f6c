"""The search's configuration: a base simulation, SLO sets, the search's own knobs, and (for
a deployment search) the grid, its variants, a budget and GPU prices. Built from a
TOML/YAML file or a mapping; every unknown key and bad value is a ``ConfigError`` naming
its key path, raised before any simulation runs.

Layout (see ``docs/search.md``)::

    simulation = "sim.toml" | {...}   the base simulation (keys of ``tokenyard simulate``)
    [slo]                             ttft_p99_s = 2.0, tbt_p99_s = 0.2, ... (one SLO set)
    [slo.<name>]                      or several named sets
    [search]                          initial_qps, min_qps, max_qps, tolerance, ...
    [grid]                            dotted config key -> list of values (cartesian)
    [[variants]]                      dotted config key -> value (each variant x the grid)
    [constraints]                     max_gpus, max_cost_per_hour
    [prices]                          device -> USD per GPU-hour (overrides the catalog)
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenyard._checks import check_key_int, read_document
from tokenyard.errors import ConfigError
from tokenyard.simulation.config import (
    apply_overrides,
    config_from_mapping,
    default_workload,
    read_config_file,
)

__all__ = [
    "METRIC_STATS",
    "SLO",
    "SearchConfig",
    "SearchParams",
    "load_search_config",
    "search_config_from_mapping",
]

#: The latency metrics an SLO may bound, and the statistics the simulator reports of each.
METRIC_STATS: dict[str, tuple[str, ...]] = {
    "ttft": ("mean", "p50", "p90", "p99", "max"),
    "tpot": ("mean", "p50", "p90", "p99", "max"),
    "tbt": ("mean", "p50", "p90", "p99"),
    "e2e": ("mean", "p50", "p90", "p99", "max"),
    "scheduling_delay": ("mean", "p50", "p90", "p99", "max"),
    "max_token_gap": ("mean", "p50", "p90", "p99", "max"),
}
_SLO_KEY = re.compile(r"^(?P<metric>[a-z0-9_]+?)_(?P<stat>mean|p50|p90|p99|max)_s$")
#: The saturation guard's metric (``search.max_scheduling_delay_p99_s``).
GUARD_KEY = "scheduling_delay_p99_s"
#: The guard's bound when the search sets none and the SLO set bounds no queueing.
GUARD_DEFAULT_S = 2.0
#: Metrics that hold a request's wait in the queue: an SLO set bounding one of them needs
#: no default guard.
QUEUE_METRICS = ("ttft_", "e2e_", "scheduling_delay_")
#: Keys of the simulation that the search sets itself (the arrival rate).
RATE_KEYS = ("workload.arrival.qps", "workload.arrival.burst_qps", "workload.target_qps")
_TOP_KEYS = (
    "base_dir",
    "constraints",
    "grid",
    "prices",
    "search",
    "simulation",
    "slo",
    "variants",
)


def _fail(where: str, message: str, value: object) -> ConfigError:
    return ConfigError(f"{where}: {message}", field=where, value=repr(value))


def rekey(error: ConfigError, prefix: str) -> ConfigError:
    """``error`` with its key path put under ``prefix`` (``replica.device: ...`` becomes
    ``grid.replica.device: ...``)."""
    field = error.field or ""
    new_field = f"{prefix}.{field}" if field else prefix
    if field and error.message.startswith(field):
        message = f"{prefix}.{error.message}"
    else:
        message = f"{new_field}: {error.message}"
    return ConfigError(message, field=new_field, value=error.value)


def metric_value(summary: Mapping[str, Any], key: str) -> float:
    """The value of an SLO key (``ttft_p99_s``) in a simulation summary."""
    match = _SLO_KEY.match(key)
    if match is None:  # pragma: no cover - keys are checked when parsed
        raise KeyError(key)
    return float(summary["latency_s"][match["metric"]][match["stat"]])


def check_slo_key(key: str, where: str) -> None:
    match = _SLO_KEY.match(key)
    if (
        match is None
        or match["metric"] not in METRIC_STATS
        or match["stat"] not in METRIC_STATS[match["metric"]]
    ):
        names = ", ".join(f"{m}_{{{'|'.join(s)}}}_s" for m, s in METRIC_STATS.items())
        raise _fail(where, f"unknown SLO metric {key!r}; expected one of {names}", key)


@dataclasses.dataclass(frozen=True)
class SLO:
    """One set of latency bounds: each ``{metric}_{stat}_s`` key (``ttft_p99_s``) must stay
    at or below its value in seconds (``inf`` = reported, never binding)."""

    name: str
    bounds: Mapping[str, float]

    def violations(self, metrics: Mapping[str, float]) -> list[str]:
        """The keys whose measured value is above the bound (or not a finite number)."""
        return [
            key
            for key, bound in self.bounds.items()
            if not (math.isfinite(metrics[key]) and metrics[key] <= bound)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bounds": dict(self.bounds)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchParams:
    """How one capacity search brackets and bisects the arrival rate (requests/s)."""

    #: First rate simulated; doubled while the SLOs hold, halved while they break.
    initial_qps: float = 1.0
    #: Below this the deployment is reported with capacity 0.
    min_qps: float = 0.01
    #: The doubling stops here; a deployment holding at it is reported as capped.
    max_qps: float = 10_000.0
    #: Bisection stops when (first failing rate) / (last holding rate) - 1 <= tolerance.
    tolerance: float = 0.02
    #: Simulations per capacity search, at most.
    max_simulations: int = 40
    #: Saturation guard: a p99 scheduling delay bound (seconds) added to the SLO sets.
    #: ``None`` (the default): ``GUARD_DEFAULT_S`` for the sets that bound no TTFT, e2e or
    #: scheduling delay (nothing else sees a queue grow past saturation); the others are
    #: the user's own. A number: added to every set; ``inf`` turns it off.
    max_scheduling_delay_p99_s: float | None = None
    #: Bisect each SLO's own breaking rate too (more simulations; without it the rate at
    #: which an SLO breaks is the first simulated rate at which it did).
    refine_breaks: bool = False
    #: Deployment search: the traffic to serve; adds ``meets_target`` and makes the Pareto
    #: front's cost axis dollars per hour among the deployments that meet it.
    target_qps: float | None = None
    #: The latency axis of the Pareto front (an SLO key, value at capacity). ``None``: the
    #: first SLO set's TTFT bound (its first bound without one; ``tables.pareto_metric``).
    pareto_metric: str | None = None

    def check(self, where: str) -> None:
        for name in ("initial_qps", "min_qps", "max_qps", "tolerance"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise _fail(f"{where}.{name}", f"must be a finite number > 0, got {value!r}", value)
        if not self.min_qps <= self.initial_qps <= self.max_qps:
            raise _fail(
                f"{where}.initial_qps",
                f"must be in [min_qps, max_qps] = [{self.min_qps}, {self.max_qps}], "
                f"got {self.initial_qps}",
                self.initial_qps,
            )
        check_key_int(f"{where}.max_simulations", self.max_simulations, low=2, high=100_000)
        guard = self.max_scheduling_delay_p99_s
        if guard is not None and not guard > 0:
            raise _fail(
                f"{where}.max_scheduling_delay_p99_s",
                f"must be > 0 (inf turns it off), got {self.max_scheduling_delay_p99_s}",
                self.max_scheduling_delay_p99_s,
            )
        if self.target_qps is not None and not (
            math.isfinite(self.target_qps) and self.target_qps > 0
        ):
            raise _fail(
                f"{where}.target_qps",
                f"must be a finite number > 0, got {self.target_qps!r}",
                self.target_qps,
            )
        if self.pareto_metric is not None:
            check_slo_key(self.pareto_metric, f"{where}.pareto_metric")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """A whole search: ``simulation`` is the base simulation's document (a mapping
    ``tokenyard.simulation.config_from_mapping`` accepts); a capacity search runs it alone,
    a deployment search runs every point of ``grid`` x ``variants`` over it."""

    simulation: Mapping[str, Any]
    slos: tuple[SLO, ...]
    search: SearchParams = dataclasses.field(default_factory=SearchParams)
    grid: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    variants: tuple[Mapping[str, Any], ...] = ()
    max_gpus: int | None = None
    max_cost_per_hour: float | None = None
    prices: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def effective_slos(self) -> tuple[SLO, ...]:
        """Each SLO set with the saturation guard where it applies (the tighter bound wins;
        ``SearchParams.max_scheduling_delay_p99_s``)."""
        out = []
        for slo in self.slos:
            bounds = dict(slo.bounds)
            guard = self.search.max_scheduling_delay_p99_s
            if guard is None:
                queued = any(k.startswith(QUEUE_METRICS) for k in bounds)
                guard = math.inf if queued else GUARD_DEFAULT_S
            if math.isfinite(guard):
                bounds[GUARD_KEY] = min(bounds.get(GUARD_KEY, math.inf), guard)
            out.append(SLO(slo.name, bounds))
        return tuple(out)


def _number(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise _fail(where, f"must be a number, got {value!r}", value)
    return float(value)


def _table(where: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, f"must be a table, got {value!r}", value)
    return value


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables to dotted keys: ``{"replica": {"device": [..]}}`` and
    ``{"replica.device": [..]}`` are the same axis. A leaf is anything but a table."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(_flatten(value, path))
        else:
            out[path] = value
    return out


def _slos(value: object) -> tuple[SLO, ...]:
    table = _table("slo", value)
    if not table:
        raise _fail("slo", "needs at least one bound, e.g. ttft_p99_s = 2.0", value)
    nested = [isinstance(v, Mapping) for v in table.values()]
    if all(nested):
        sets = [
            (str(name), _table(f"slo.{name}", bounds), f"slo.{name}")
            for name, bounds in table.items()
        ]
    elif not any(nested):
        sets = [("default", table, "slo")]
    else:
        raise _fail(
            "slo",
            "either bounds (ttft_p99_s = 2.0) or named sets ([slo.interactive]), not both",
            dict(table),
        )
    out = []
    for name, bounds, where in sets:
        if not bounds:
            raise _fail(where, "needs at least one bound, e.g. ttft_p99_s = 2.0", dict(bounds))
        checked = {}
        for key, bound in bounds.items():
            check_slo_key(str(key), f"{where}.{key}")
            number = _number(f"{where}.{key}", bound)
            if number < 0:
                raise _fail(f"{where}.{key}", f"must be >= 0, got {bound!r}", bound)
            checked[str(key)] = number
        out.append(SLO(name, checked))
    return tuple(out)


def _params(value: object) -> SearchParams:
    table = _table("search", value)
    fields = {f.name: f for f in dataclasses.fields(SearchParams)}
    values: dict[str, Any] = {}
    for key, item in table.items():
        where = f"search.{key}"
        if key not in fields:
            raise _fail(where, f"unknown key; expected one of {', '.join(sorted(fields))}", item)
        if key == "refine_breaks":
            if not isinstance(item, bool):
                raise _fail(where, f"must be true or false, got {item!r}", item)
            values[key] = item
        elif key == "max_simulations":
            if isinstance(item, bool) or not isinstance(item, int):
                raise _fail(where, f"must be an integer, got {item!r}", item)
            values[key] = item
        elif key == "pareto_metric":
            if not isinstance(item, str):
                raise _fail(where, f"must be a string, got {item!r}", item)
            values[key] = item
        else:
            values[key] = None if item is None and key == "target_qps" else _number(where, item)
    params = SearchParams(**values)
    params.check("search")
    return params


def _grid(value: object) -> dict[str, tuple[Any, ...]]:
    axes = _flatten(_table("grid", value))
    out = {}
    for key, values in axes.items():
        where = f"grid.{key}"
        if not isinstance(values, (list, tuple)):
            raise _fail(where, f"must be a list of values, got {values!r}", values)
        if not values:
            raise _fail(where, "is empty: an axis needs at least one value", values)
        _check_not_rate(key, where)
        out[key] = tuple(values)
    return out


def _variants(value: object) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, (list, tuple)):
        raise _fail("variants", f"must be an array of tables ([[variants]]), got {value!r}", value)
    if not value:
        raise _fail("variants", "is empty: give at least one variant or leave it out", value)
    out = []
    for i, item in enumerate(value):
        flat = _flatten(_table(f"variants[{i}]", item))
        name = flat.get("name")
        if "name" in flat and not isinstance(name, str):
            raise _fail(f"variants[{i}].name", f"must be a string, got {name!r}", name)
        for key in flat:
            _check_not_rate(key, f"variants[{i}].{key}")
        out.append(flat)
    return tuple(out)


def _check_not_rate(key: str, where: str) -> None:
    if key in RATE_KEYS:
        raise _fail(where, "the arrival rate is what the search varies; it cannot be set", key)


def _constraints(value: object) -> tuple[int | None, float | None]:
    table = _table("constraints", value)
    max_gpus: int | None = None
    max_cost: float | None = None
    for key, item in table.items():
        where = f"constraints.{key}"
        if key == "max_gpus":
            max_gpus = check_key_int(where, item, low=1, high=1_000_000)
        elif key == "max_cost_per_hour":
            max_cost = _number(where, item)
            if max_cost <= 0:
                raise _fail(where, f"must be > 0, got {item!r}", item)
        else:
            raise _fail(where, "unknown key; expected one of max_cost_per_hour, max_gpus", item)
    return max_gpus, max_cost


def _prices(value: object) -> dict[str, float]:
    out = {}
    for device, price in _table("prices", value).items():
        number = _number(f"prices.{device}", price)
        if not (math.isfinite(number) and number > 0):
            raise _fail(f"prices.{device}", f"must be a finite number > 0, got {price!r}", price)
        out[str(device)] = number
    return out


def search_config_from_mapping(
    data: Mapping[str, Any], *, base_dir: str | Path | None = None
) -> SearchConfig:
    """Builds a search config from a parsed TOML/YAML document.

    ``simulation`` may be a table or a path to a simulation config file (relative to
    ``base_dir``, the search file's folder). Only the search's own keys are checked here;
    the simulation and the grid points are checked by ``deployments.expand``.

    Raises:
        ConfigError: naming the key path of the first bad or unknown key.
    """
    for key in data:
        if key not in _TOP_KEYS:
            raise _fail(str(key), f"unknown key; expected one of {', '.join(_TOP_KEYS)}", data[key])
    if base_dir is None and isinstance(data.get("base_dir"), str):
        base_dir = data["base_dir"]
    simulation = data.get("simulation", {})
    if isinstance(simulation, (str, Path)):
        path = Path(base_dir or ".") / simulation
        simulation = read_config_file(path)
    else:
        simulation = dict(_table("simulation", simulation))
        simulation.setdefault("workload", default_workload())
        if base_dir is not None:
            simulation.setdefault("base_dir", str(base_dir))
    try:
        config_from_mapping(simulation)
    except ConfigError as error:
        raise rekey(error, "simulation") from None
    max_gpus, max_cost = _constraints(data.get("constraints", {}))
    return SearchConfig(
        simulation=simulation,
        slos=_slos(data.get("slo", {"ttft_p99_s": 2.0, "tbt_p99_s": 0.2})),
        search=_params(data.get("search", {})),
        grid=_grid(data.get("grid", {})),
        variants=_variants(data["variants"]) if "variants" in data else (),
        max_gpus=max_gpus,
        max_cost_per_hour=max_cost,
        prices=_prices(data.get("prices", {})),
    )


def load_search_config(
    path: str | Path, overrides: Mapping[str, Any] | None = None
) -> SearchConfig:
    """Reads a ``.toml``/``.yaml``/``.yml`` search config; ``overrides`` (dotted keys such
    as ``"slo.ttft_p99_s"`` or ``"simulation.cluster.num_replicas"``) win.

    Raises:
        ConfigError: an unreadable file or a bad key (named by its path).
    """
    path = Path(path)
    data = apply_overrides(_read(path), overrides or {})
    return search_config_from_mapping(data, base_dir=path.parent)


def _read(path: Path) -> dict[str, Any]:
    """The document of a search file (``read_config_file`` would add a simulation's
    defaults at the top level, where a search file has none)."""
    return read_document(path)
