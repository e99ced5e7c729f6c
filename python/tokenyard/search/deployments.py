"""Deployment search: a capacity search for every point of a declared grid, with the cost
of each deployment, its QPS per dollar, the Pareto front of cost against latency and the
best point per SLO set.

``expand`` turns the grid into points and checks all of them before anything runs: a bad
key or value, an unknown model or GPU, a TP that does not divide the heads (or a PP the
layers), a missing price or a rate the search cannot set is a ``ConfigError`` naming the
key; a point over the GPU or cost budget, whose model does not fit the GPU's memory, or
whose expert/data-parallel layout vLLM would refuse (expert parallelism on a dense model,
data parallelism without it, an EP other than TP x DP, ...) when the grid or a variant
chose it, is skipped with the reason recorded. A deployment's GPUs are counted in one
place, ``gpu_pools``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenyard._checks import check_key_int
from tokenyard.catalog import Catalog, current_catalog
from tokenyard.catalog.specs import MAX_PARALLELISM
from tokenyard.errors import ConfigError
from tokenyard.search.capacity import CapacityResult, Probe, check_rate_settable, with_rate
from tokenyard.search.config import SLO, SearchConfig, SearchParams, rekey
from tokenyard.search.driver import PointJob, Progress, run_jobs
from tokenyard.search.executors import Executor, make_executor
from tokenyard.search.results import Point, PointRecord, load_records, point_key, write_record
from tokenyard.search.tables import SearchResult, assemble
from tokenyard.simulation.catalog import catalog_for
from tokenyard.simulation.config import (
    ReplicaConfig,
    SimulationConfig,
    apply_overrides,
    config_from_mapping,
)
from tokenyard.simulation.run import decode_config, plan_for

__all__ = [
    "CapacityReport",
    "capacity_search",
    "deployment_search",
    "expand",
    "gpu_pools",
    "replica_gpus",
]

#: The keys of an expert/data-parallel layout (docs/simulate.md, "Expert and data
#: parallelism") whose refusals are a grid point to skip, not a bad config...
_LAYOUT_FIELDS = ("replica.expert_parallel_size", "replica.data_parallel_size")
#: ...when the grid or a variant sets one of these (the layout's inputs: a disaggregated
#: decode pool refuses EP too). Otherwise every point would be refused alike: an error.
_LAYOUT_KEYS = (*_LAYOUT_FIELDS, "replica.model", "replica.tensor_parallel_size", "cluster.decode")


def replica_gpus(replica: ReplicaConfig) -> int:
    """One replica's GPUs: ``TP x DP x PP`` (each attention DP rank is TP GPUs per stage;
    the experts are spread over those same GPUs, so EP adds none)."""
    return replica.tensor_parallel_size * replica.data_parallel_size * replica.num_pipeline_stages


def gpu_pools(
    config: SimulationConfig, *, replica: ReplicaConfig | None = None
) -> list[tuple[str, int]]:
    """``(device, GPUs)`` per pool of the deployment: the replicas' (the prefill pool of a
    disaggregated cluster), then the decode pool's if there is one. Every GPU count of the
    search (cost, ``constraints.max_gpus``, the ``num_gpus`` column) is their sum.
    ``replica``: the replicas' config in place of ``config.replica`` (a point whose layout
    is refused is counted as the grid asked for it)."""
    replica = replica or config.replica
    pools = [(replica.device, config.cluster.num_replicas * replica_gpus(replica))]
    if config.cluster.decode is not None:
        decode = decode_config(config).replica
        pools.append((decode.device, config.cluster.decode.num_replicas * replica_gpus(decode)))
    return pools


def _pool_price(
    pools: list[tuple[str, int]],
    prices: Mapping[str, float],
    catalog: Catalog,
    need_prices: bool,
) -> float | None:
    """USD per GPU-hour over the pools' GPUs (each pool's device priced on its own; a
    disaggregated cluster's prefill and decode pools may run different GPUs)."""
    total = 0.0
    for device, num_gpus in pools:
        price = _price(device, prices, catalog)
        if price is None:
            if need_prices:
                raise ConfigError(
                    f"prices.{device}: the catalog has no price for {device}; "
                    f"set one (USD per GPU-hour) under [prices]",
                    field=f"prices.{device}",
                )
            return None
        total += price * num_gpus
    return total / sum(n for _, n in pools)


def _price(
    device: str, prices: Mapping[str, float], catalog: Catalog | None = None
) -> float | None:
    """USD per GPU-hour: the config's ``[prices]`` first, then the catalog (0 = unknown)."""
    spec = (catalog or current_catalog()).device(device, field="replica.device")
    for name in (device, spec.name, *spec.aliases):  # a price may name any of them
        if name in prices:
            return prices[name]
    price = getattr(spec, "price_per_hour", None)
    return float(price) if price else None


def _source(field: str, origins: Mapping[str, str]) -> str:
    """Which table of the search config set the key ``field`` (``grid``, ``variants[i]``
    or ``simulation``)."""
    for key, origin in origins.items():
        if field == key or field.startswith(key + ".") or key.startswith(field + "."):
            return origin
    return "simulation"


def _check_layout(config: SimulationConfig) -> None:
    """Unknown model or device, or a TP/PP that does not divide the model: errors. Then an
    EP the model cannot take (a dense model, experts it does not divide): a ConfigError
    naming ``replica.expert_parallel_size`` (a skip if the grid chose it: ``_layout_skip``)."""
    catalog = catalog_for(config)
    replica = config.replica
    model = catalog.model(config.model_name(), field="replica.model")
    catalog.device(replica.device, field="replica.device")
    model.check_layout(replica.tensor_parallel_size, replica.num_pipeline_stages)
    model.check_expert_parallel(replica.expert_parallel_size)


def _layout_skip(error: ConfigError, overrides: Mapping[str, Any]) -> str | None:
    """The skip reason when ``error`` refuses an expert/data-parallel layout that the
    point's grid values or variant chose; ``None``: it is a plain config error."""
    if error.field not in _LAYOUT_FIELDS:
        return None
    chosen = any(
        key == k or key.startswith(k + ".") or k.startswith(key + ".")
        for key in overrides
        for k in _LAYOUT_KEYS
    )
    return f"infeasible layout: {error}" if chosen else None


def _build(
    doc: Mapping[str, Any], overrides: Mapping[str, Any]
) -> tuple[SimulationConfig, ReplicaConfig, str | None]:
    """The point's config, its replica as asked, and why its layout is infeasible
    (``None``: it is not). An infeasible point's config is built with EP and DP 1, so the
    rest of it is still checked; its replica keeps the EP and DP asked for (which must still
    be whole numbers in range), to count its GPUs and label it.

    Raises:
        ConfigError: any error but an infeasible layout the grid chose.
    """
    try:
        sim = config_from_mapping(doc)
        _check_layout(sim)
        return sim, sim.replica, None
    except ConfigError as error:
        skip = _layout_skip(error, overrides)
        if skip is None:
            raise
    replica = doc.get("replica", {})
    sizes = {
        field: check_key_int(
            field, replica.get(field.split(".")[1], 1), low=1, high=MAX_PARALLELISM
        )
        for field in _LAYOUT_FIELDS
    }
    relaxed = apply_overrides(doc, {field: 1 for field in _LAYOUT_FIELDS})
    sim = config_from_mapping(relaxed)
    _check_layout(sim)
    asked = dataclasses.replace(
        sim.replica,
        expert_parallel_size=sizes["replica.expert_parallel_size"],
        data_parallel_size=sizes["replica.data_parallel_size"],
    )
    return sim, asked, skip


def _combinations(
    config: SearchConfig,
) -> list[tuple[str | None, dict[str, Any], dict[str, str]]]:
    """Every (variant name, overrides, origin of each key): variants (in order) x the
    grid's product."""
    axes = list(config.grid)
    out = []
    variants: Sequence[Mapping[str, Any]] = config.variants or ({},)
    for i, named in enumerate(variants):
        name = named.get("name")
        variant = {k: v for k, v in named.items() if k != "name"}
        for key in variant:
            if key in config.grid:
                raise ConfigError(
                    f"variants[{i}].{key}: also a grid axis; set it in one place",
                    field=f"variants[{i}].{key}",
                    value=repr(variant[key]),
                )
        for values in itertools.product(*(config.grid[a] for a in axes)):
            overrides = {**variant, **dict(zip(axes, values, strict=True))}
            origins = {k: f"variants[{i}]" for k in variant} | {a: "grid" for a in axes}
            out.append((name, overrides, origins))
    return out


def expand(config: SearchConfig, *, need_prices: bool = True) -> list[Point]:
    """The grid's points, all checked (see the module docstring); duplicates dropped.

    Raises:
        ConfigError: the first bad point, naming the key in the search config.
    """
    slos = [s.to_dict() for s in config.effective_slos()]
    # What decides the simulations; target_qps and pareto_metric only rank the results.
    params = dataclasses.asdict(config.search)
    params.pop("target_qps")
    params.pop("pareto_metric")
    points: list[Point] = []
    seen: set[str] = set()
    checked_workloads: set[str] = set()
    for variant, overrides, origins in _combinations(config):
        try:
            doc = apply_overrides(config.simulation, overrides)
            sim, replica, infeasible = _build(doc, overrides)
            check_rate_settable(sim.workload)
            workload_text = json.dumps(dict(sim.workload), sort_keys=True, default=str)
            if workload_text not in checked_workloads:
                from tokenyard.workload import load_workload

                load_workload(
                    with_rate(doc, config.search.initial_qps)["workload"], base_dir=sim.base_dir
                )
                checked_workloads.add(workload_text)
        except ConfigError as error:
            raise rekey(error, _source(error.field or "", origins)) from None
        pools = gpu_pools(sim, replica=replica)
        num_gpus = sum(n for _, n in pools)
        layout: dict[str, Any] = {
            "model": replica.model,
            "device": replica.device,
            "num_replicas": sim.cluster.num_replicas,
            "tensor_parallel_size": replica.tensor_parallel_size,
            "data_parallel_size": replica.data_parallel_size,
            "expert_parallel_size": replica.expert_parallel_size,
            "num_pipeline_stages": replica.num_pipeline_stages,
            "num_gpus": num_gpus,
        }
        if sim.cluster.decode is not None:
            decode = decode_config(sim).replica
            layout.update(
                decode_num_replicas=sim.cluster.decode.num_replicas,
                decode_device=decode.device,
                decode_tensor_parallel_size=decode.tensor_parallel_size,
            )
        price = _pool_price(pools, config.prices, catalog_for(sim), need_prices)
        key = point_key(doc, slos, params)
        if key in seen:
            continue
        seen.add(key)
        point = Point(len(points), overrides, doc, layout, price, key, variant)
        skip = infeasible or _over_budget(config, num_gpus, point.cost_per_hour)
        if skip is None:
            try:
                plan_for(sim)
                if sim.cluster.decode is not None:
                    plan_for(decode_config(sim))
            except ConfigError as error:
                if error.field == "replica.device":
                    skip = f"does not fit: {error}"
                else:  # a bad value, not a model too big
                    skip = _layout_skip(error, overrides)
                    if skip is None:
                        raise rekey(error, _source(error.field or "", origins)) from None
        points.append(dataclasses.replace(point, skip=skip))
    return points


def _over_budget(config: SearchConfig, num_gpus: int, cost_per_hour: float | None) -> str | None:
    """Why a deployment of ``num_gpus`` at ``cost_per_hour`` is over ``[constraints]``."""
    if config.max_gpus is not None and num_gpus > config.max_gpus:
        return f"over budget: {num_gpus} GPUs > constraints.max_gpus = {config.max_gpus}"
    limit = config.max_cost_per_hour
    if limit is not None and cost_per_hour is not None and cost_per_hour > limit:
        return f"over budget: {cost_per_hour:.2f} $/h > constraints.max_cost_per_hour = {limit}"
    return None


def _record(point: Point, job: PointJob | None) -> PointRecord:
    record: PointRecord = {
        "key": point.key,
        "overrides": dict(point.overrides),
        "layout": dict(point.layout),
        "status": "skipped" if point.skip else "ok",
        "reason": point.skip,
        "capacities": {},
        "breaks": {},
        "probes": [],
    }
    if job is not None:
        results = job.results()
        errors = [r.error for r in results.values() if r.error]
        if errors:
            record["status"], record["reason"] = "error", errors[0]
        record["capacities"] = {k: r.to_dict() for k, r in results.items()}
        record["breaks"] = job.breaks()
        record["probes"] = [job.probes[r].to_dict() for r in sorted(job.probes)]
    return record


def deployment_search(
    config: SearchConfig,
    *,
    output_dir: str | Path | None = None,
    executor: str | Executor | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: bool = False,
) -> SearchResult:
    """Runs a capacity search for every point of ``config``'s grid.

    Args:
        config: the search (``load_search_config`` reads one from a file).
        output_dir: where results go; points already recorded there (same key) are not
            run again, and each point's record is written as soon as it finishes.
        executor: ``"local"`` (a process pool of ``workers``, default all cores),
            ``"serial"``, ``"ray"`` (at ``ray_address``, default ``"auto"``) or an
            executor object (closed at the end).
        progress: a progress line on stderr (on a terminal).

    Raises:
        ConfigError: a bad grid, before any simulation runs.
    """
    points = expand(config)
    directory = Path(output_dir) if output_dir is not None else None
    done = load_records(directory) if directory is not None else {}
    records: dict[str, PointRecord] = {}
    jobs = []
    slos = config.effective_slos()
    for point in points:
        if point.skip is not None:
            records[point.key] = _record(point, None)
        elif point.key in done:
            records[point.key] = done[point.key]
        else:
            jobs.append(PointJob(point.key, dict(point.simulation), slos, config.search))
    by_key = {p.key: p for p in points}
    meter = Progress(len(jobs), enabled=progress)

    def on_done(job: PointJob) -> None:
        record = _record(by_key[job.key], job)
        records[job.key] = record
        if directory is not None:
            write_record(directory, record)

    if jobs:
        run_jobs(
            jobs,
            make_executor(executor, workers=workers, ray_address=ray_address),
            on_done=on_done,
            progress=meter,
        )
    meter.close()
    rows, probes, best = assemble(config, points, records)
    result = SearchResult(
        rows=rows,
        probes=probes,
        best=best,
        config=config,
        ran=meter.simulations,
        reused=sum(1 for p in points if p.skip is None and p.key in done),
    )
    if directory is not None:
        result.write(directory)
    return result


@dataclasses.dataclass
class CapacityReport:
    """One deployment's capacity per SLO set (``results``), the rate at which each SLO key
    breaks (``breaks``: SLO set -> key -> ``held_qps``/``break_qps``), and every
    simulation (``probes``, by rate)."""

    results: dict[str, CapacityResult]
    breaks: dict[str, dict[str, dict[str, float | None]]]
    probes: list[Probe]
    cost_per_hour: float | None = None

    @property
    def capacity_qps(self) -> float:
        """The capacity under the first SLO set."""
        return next(iter(self.results.values())).capacity_qps

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": {k: r.to_dict() for k, r in self.results.items()},
            "breaks": self.breaks,
            "probes": [p.to_dict() for p in self.probes],
            "cost_per_hour": self.cost_per_hour,
        }


def capacity_search(
    simulation: SimulationConfig | Mapping[str, Any],
    slo: Mapping[str, float] | SLO | Sequence[SLO] | None = None,
    *,
    search: SearchParams | Mapping[str, Any] | None = None,
    executor: str | Executor | None = "serial",
    workers: int | None = None,
    ray_address: str | None = None,
    prices: Mapping[str, float] | None = None,
) -> CapacityReport:
    """The highest arrival rate at which ``simulation`` meets ``slo``.

    Args:
        simulation: the deployment and its workload (the workload's rate is replaced).
        slo: bounds such as ``{"ttft_p99_s": 2.0, "tbt_p99_s": 0.2}`` (default those two),
            or ``SLO`` sets; the saturation guard ``search.max_scheduling_delay_p99_s`` is
            added where it applies (by default, to a set that bounds no queueing).
        search: ``SearchParams`` or a mapping of its fields.
        executor: ``"serial"`` (default: the bisection is sequential), ``"local"``,
            ``"ray"`` or an executor object; only ``refine_breaks`` and several SLO sets
            give it more than one simulation at a time.

    Raises:
        ConfigError: a bad config, or a model that does not fit the device.
    """
    from tokenyard.search.config import search_config_from_mapping

    if isinstance(simulation, SimulationConfig):
        simulation = _as_mapping(simulation)
    params = search if isinstance(search, SearchParams) else None
    data: dict[str, Any] = {"simulation": dict(simulation)}
    if isinstance(search, Mapping):
        data["search"] = dict(search)
    if isinstance(slo, Mapping):
        data["slo"] = dict(slo)
    config = search_config_from_mapping(data)
    if params is not None:
        params.check("search")
        config = dataclasses.replace(config, search=params)
    if isinstance(slo, SLO):
        config = dataclasses.replace(config, slos=(slo,))
    elif slo is not None and not isinstance(slo, Mapping):
        config = dataclasses.replace(config, slos=tuple(slo))
    if prices is not None:
        config = dataclasses.replace(config, prices=dict(prices))
    (point,) = expand(config, need_prices=False)
    if point.skip is not None:
        raise ConfigError(
            f"simulation.replica.device: {point.skip}", field="simulation.replica.device"
        )
    job = PointJob(point.key, dict(point.simulation), config.effective_slos(), config.search)
    run_jobs([job], make_executor(executor, workers=workers, ray_address=ray_address))
    return CapacityReport(
        results=job.results(),
        breaks=job.breaks(),
        probes=[job.probes[r] for r in sorted(job.probes)],
        cost_per_hour=point.cost_per_hour,
    )


def _as_mapping(config: SimulationConfig) -> dict[str, Any]:
    data = dataclasses.asdict(config)
    data["workload"] = dict(config.workload)
    if data.get("base_dir") is None:
        data.pop("base_dir", None)
    converted: dict[str, Any] = _lists(data)
    return converted


def _lists(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_lists(v) for v in value]
    return value
