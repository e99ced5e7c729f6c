"""A deployment search's tables: one row per (point, SLO set) with its cost, capacity and
metrics, the Pareto front of cost against latency, the best row per SLO set, and the text
summary, held in ``SearchResult``. Prices and budgets enter here, not in the simulations."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenyard._output import staged_output
from tokenyard.search.capacity import DECODE_TOKENS_KEY
from tokenyard.search.config import GUARD_KEY
from tokenyard.search.results import Point, PointRecord

if TYPE_CHECKING:
    from tokenyard.search.config import SLO, SearchConfig

__all__ = [
    "SearchResult",
    "assemble",
    "format_summary",
    "frontier_rows",
    "pareto_front",
    "pareto_metric",
    "pool_text",
    "to_arrow",
    "write_tables",
]

#: Metrics always reported at capacity (besides every SLO key).
SHOWN_METRICS = (
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p99_s",
    "tbt_p99_s",
    "e2e_p99_s",
    "scheduling_delay_p99_s",
    "tpot_mean_s",  # tokens/s per user is its inverse
)
_SHORT = {
    # A disaggregated cluster's pools: cluster.num_replicas is then the prefill pool.
    "cluster.decode.num_replicas": "decode",
    "cluster.decode.tensor_parallel_size": "decode_tp",
    "cluster.decode.data_parallel_size": "decode_dp",
    "cluster.decode.expert_parallel_size": "decode_ep",
    "cluster.decode.device": "decode_device",
    "cluster.num_replicas": "replicas",
    "tensor_parallel_size": "tp",
    "data_parallel_size": "dp",
    "expert_parallel_size": "ep",
    "num_pipeline_stages": "pp",
    "num_replicas": "replicas",
    "global_scheduler.policy": "router",
    "scheduler.policy": "policy",
}


def label(
    overrides: Mapping[str, Any],
    layout: Mapping[str, Any],
    variant: str | None = None,
    grid_keys: Collection[str] = (),
) -> str:
    """A short name for a point: its variant's name (standing for the variant's keys) and
    its grid values, or all its overrides; the last part of each key."""
    pools = pool_text(layout)
    if pools is not None:
        # The pools in their own words (cluster.num_replicas is the prefill pool's).
        overrides = {k: v for k, v in overrides.items() if not _said_by_pools(k, v)}
    if variant is not None:
        rest = {k: v for k, v in overrides.items() if k in grid_keys}
        words = [variant, *([pools] if pools else [])]
        return " ".join([*words, *([label(rest, {})] if rest else [])])
    if pools is not None:
        return " ".join([pools, *([label(overrides, {})] if overrides else [])])
    if not overrides:
        where = f"{layout['model']} on {layout['device']}"
        return f"{layout['num_replicas']} x {where} ({_layout(layout)})"
    parts = []
    for key, value in overrides.items():
        name = key.rsplit(".", 1)[-1]
        for long, short in _SHORT.items():
            if key.endswith(long):
                name = short
                break
        parts.append(f"{name}={_text(value)}")
    return " ".join(parts)


#: The override keys a P/D label says as its pools.
_POOL_KEYS = (
    "cluster.num_replicas",
    "cluster.decode.num_replicas",
    "replica.tensor_parallel_size",
    "cluster.decode.tensor_parallel_size",
)


def _said_by_pools(key: str, value: Any) -> bool:
    """Whether the pools' words already say override ``key = value``."""
    if key.endswith(_POOL_KEYS):
        return True
    return (
        key.endswith("cluster.decode")
        and isinstance(value, Mapping)
        and set(value) <= {"num_replicas", "tensor_parallel_size"}
    )


def pool_text(layout: Mapping[str, Any]) -> str | None:
    """A disaggregated deployment's pools, ``prefill 2 x TP4 / decode 3 x TP8`` (``None``
    for an aggregated one)."""
    if layout.get("decode_num_replicas") is None:
        return None
    prefill = f"prefill {layout['num_replicas']} x TP{layout['tensor_parallel_size']}"
    decode = f"decode {layout['decode_num_replicas']} x TP{layout['decode_tensor_parallel_size']}"
    return f"{prefill} / {decode}"


def _layout(layout: Mapping[str, Any]) -> str:
    """``TP 2, PP 1``, or with expert and attention data parallelism ``TP 1 x DP 2, EP 2,
    PP 1`` (the simulate banner's words)."""
    tp, pp = layout["tensor_parallel_size"], layout["num_pipeline_stages"]
    dp, ep = layout.get("data_parallel_size", 1), layout.get("expert_parallel_size", 1)
    attention = f"TP {tp} x DP {dp}" if dp > 1 else f"TP {tp}"
    return f"{attention}, EP {ep}, PP {pp}" if ep > 1 or dp > 1 else f"TP {tp}, PP {pp}"


def _text(value: Any) -> str:
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _cell(value: Any) -> Any:
    return value if value is None or isinstance(value, (str, int, float, bool)) else _text(value)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (cost, latency): whether no other point is at least as good in both and
    better in one (both minimized)."""
    flags = []
    for i, (c, lat) in enumerate(points):
        dominated = any(
            (c2 <= c and l2 <= lat) and (c2 < c or l2 < lat)
            for j, (c2, l2) in enumerate(points)
            if j != i
        )
        flags.append(not dominated)
    return flags


def assemble(
    config: SearchConfig, points: Sequence[Point], records: Mapping[str, PointRecord]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, dict[str, Any] | None]]:
    """The rows (one per point and SLO set), the probes and the best row per SLO set."""
    slos = config.effective_slos()
    target = config.search.target_qps
    axes = list(dict.fromkeys(k for p in points for k in p.overrides))
    metrics = list(
        dict.fromkeys([*SHOWN_METRICS, *(k for s in slos for k in s.bounds), pareto_metric(config)])
    )
    break_keys = list(dict.fromkeys(k for s in slos for k in s.bounds))
    rows: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    for point in points:
        record = records[point.key]
        ok = record["status"] == "ok"
        for slo in slos:
            cap = record["capacities"].get(slo.name)
            row: dict[str, Any] = {
                "point": point.index,
                "key": point.key,
                "slo": slo.name,
                "label": label(point.overrides, point.layout, point.variant, config.grid),
                "variant": point.variant,
            }
            row.update({a: _cell(point.overrides.get(a)) for a in axes})
            row.update(point.layout)
            disaggregated = point.layout.get("decode_num_replicas") is not None
            row["deployment"] = "disaggregated" if disaggregated else "aggregated"
            cost = point.cost_per_hour
            capacity = float(cap["capacity_qps"]) if ok and cap else None
            row |= {
                "price_per_gpu_hour": point.price_per_gpu_hour,
                "cost_per_hour": cost,
                "status": record["status"],
                "reason": record["reason"],
                "capacity_qps": capacity,
                "hi_qps": cap["hi_qps"] if cap else None,
                "capped": bool(cap and cap["stop"] == "max_qps"),
                "stop": cap["stop"] if cap else None,
                "num_simulations": len(cap["rates"]) if cap else 0,
                "binding": ",".join(cap["binding"]) if cap else None,
                "qps_per_dollar": capacity / cost if capacity is not None and cost else None,
                "cost_per_qps": cost / capacity if capacity and cost else None,
            }
            row["requests_per_dollar"] = (
                None if row["qps_per_dollar"] is None else row["qps_per_dollar"] * 3600.0
            )
            row["target_qps"] = target
            if target is not None:
                row["meets_target"] = capacity is not None and capacity >= target
            values = cap["metrics"] if cap else {}
            row.update({m: values.get(m) for m in metrics})
            row.update(_tokens(values, point.layout["num_gpus"]))
            guard = _guard(config, slo)
            # The guard alone stopped it: the user's SLOs still held where it broke.
            row["guard_binding"] = bool(
                cap and guard is not None and list(cap["binding"]) == [GUARD_KEY]
            )
            row["guard_s"] = guard
            breaks = record["breaks"].get(slo.name, {})
            for k in break_keys:
                row[f"{k}_break_qps"] = breaks.get(k, {}).get("break_qps")
            row["pareto"] = False
            row["best"] = False
            rows.append(row)
        for probe in record["probes"]:
            probes.append(
                {
                    "point": point.index,
                    "key": point.key,
                    "rate": probe["rate"],
                    **probe["metrics"],
                    "requests_per_s": probe["requests_per_s"],
                    "wall_s": probe["wall_s"],
                    "error": probe["error"],
                }
            )
    _mark_pareto(rows, config)
    _mark_frontier(rows)
    best = _mark_best(rows, config)
    return rows, probes, best


def _user_bounds(config: SearchConfig, name: str) -> Mapping[str, float]:
    """The SLO set ``name`` as the user gave it (without the saturation guard)."""
    return next(s.bounds for s in config.slos if s.name == name)


def _guard(config: SearchConfig, slo: SLO) -> float | None:
    """The saturation guard's bound in the effective set ``slo``, or ``None`` where it does
    not apply or the user bounds ``scheduling_delay_p99_s`` themselves."""
    return None if GUARD_KEY in _user_bounds(config, slo.name) else slo.bounds.get(GUARD_KEY)


def _tokens(metrics: Mapping[str, float], num_gpus: int) -> dict[str, float | None]:
    """Output tokens per second at capacity, per GPU, and per user (1 / mean TPOT: the
    decode speed one request sees, aiconfigurator's tokens/s/user)."""
    total = metrics.get(DECODE_TOKENS_KEY)
    tpot = metrics.get("tpot_mean_s")
    return {
        "decode_tokens_per_s": total,
        "tokens_per_s_per_gpu": total / num_gpus if total is not None and num_gpus else None,
        "tokens_per_s_per_user": 1.0 / tpot if tpot and math.isfinite(tpot) else None,
    }


def frontier_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows the tokens/s/GPU-against-tokens/s/user chart draws: one per evaluated
    deployment (and SLO set) at its found capacity, status ok with a capacity above 0 and
    both figures known; never a bisection probe."""
    return [
        r
        for r in rows
        if r["status"] == "ok"
        and r["capacity_qps"]
        and r.get("tokens_per_s_per_gpu") is not None
        and r.get("tokens_per_s_per_user") is not None
    ]


def _mark_frontier(rows: list[dict[str, Any]]) -> None:
    """``frontier``: no other deployment of the same kind (aggregated or disaggregated)
    and SLO set gives more tokens/s per GPU and more tokens/s per user (both maximized)."""
    for row in rows:
        row["frontier"] = False
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in frontier_rows(rows):
        groups.setdefault((r["slo"], r["deployment"]), []).append(r)
    for members in groups.values():
        costs = [(-r["tokens_per_s_per_gpu"], -r["tokens_per_s_per_user"]) for r in members]
        for r, flag in zip(members, pareto_front(costs), strict=True):
            r["frontier"] = flag


def pareto_metric(config: SearchConfig) -> str:
    """The cost-latency front's latency axis: ``search.pareto_metric`` if set, else the
    first SLO set's TTFT bound (the percentile the user asked for), else its first bound."""
    if config.search.pareto_metric is not None:
        return config.search.pareto_metric
    first = list(config.slos[0].bounds) if config.slos else []
    ttft = [k for k in first if k.startswith("ttft_")]
    return (ttft or first or ["ttft_p99_s"])[0]


def _usable(row: Mapping[str, Any], config: SearchConfig) -> bool:
    target = config.search.target_qps
    return bool(
        row["status"] == "ok"
        and row["capacity_qps"]
        and row["cost_per_hour"]
        and (target is None or row.get("meets_target"))
    )


def _mark_pareto(rows: list[dict[str, Any]], config: SearchConfig) -> None:
    """Cost (``cost_per_hour`` with a target rate, else ``cost_per_qps``) against the
    latency metric at capacity, over every SLO set's rows."""
    axis = "cost_per_hour" if config.search.target_qps is not None else "cost_per_qps"
    metric = pareto_metric(config)
    usable = [
        r for r in rows if _usable(r, config) and r[metric] is not None and math.isfinite(r[metric])
    ]
    for row, flag in zip(usable, pareto_front([(r[axis], r[metric]) for r in usable]), strict=True):
        row["pareto"] = flag


def _mark_best(
    rows: list[dict[str, Any]], config: SearchConfig
) -> dict[str, dict[str, Any] | None]:
    """Per SLO set: the cheapest deployment meeting ``target_qps``, or without a target
    the most QPS per dollar (ties: the earlier point)."""
    best: dict[str, dict[str, Any] | None] = {}
    for slo in config.slos:
        candidates = [r for r in rows if r["slo"] == slo.name and _usable(r, config)]
        if config.search.target_qps is not None:
            candidates.sort(key=lambda r: (r["cost_per_hour"], -r["capacity_qps"], r["point"]))
        else:
            candidates.sort(key=lambda r: (-r["qps_per_dollar"], r["point"]))
        best[slo.name] = candidates[0] if candidates else None
        if candidates:
            candidates[0]["best"] = True
    return best


def to_arrow(rows: Sequence[Mapping[str, Any]]) -> Any:
    """Rows as a ``pyarrow.Table``; a column mixing types (an axis whose values differ in
    type) is written as text."""
    import pyarrow as pa  # type: ignore[import-untyped]

    columns: dict[str, list[Any]] = {}
    for row in rows:
        for key in row:
            columns.setdefault(key, [])
    for key, values in columns.items():
        values.extend(row.get(key) for row in rows)
        kinds = {type(v) for v in values if v is not None}
        if kinds == {int, float}:
            columns[key] = [None if v is None else float(v) for v in values]
        elif len(kinds) > 1:
            columns[key] = [None if v is None else _text(v) for v in values]
    return pa.table(columns) if rows else pa.table({})


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _column_title(key: str) -> str:
    """``ttft_p90_s`` -> ``TTFT p90``; ``scheduling_delay_p99_s`` -> ``queue p99``."""
    metric, _, stat = key[: -len("_s")].rpartition("_")
    names = {"scheduling_delay": "queue", "max_token_gap": "max gap"}
    return f"{names.get(metric, metric.upper())} {stat}"


def format_summary(result: SearchResult, *, top: int = 20) -> str:
    """The table a planner reads: per SLO set, its bounds (the saturation guard named as
    such), the target rate, and per deployment its GPUs, cost, capacity, the values at
    capacity of the very statistics the SLOs bound (p90 when they say p90), output tokens
    per second per GPU and per user, and what broke first."""
    config = result.config
    rows = result.rows
    points = {r["point"] for r in rows}
    skipped = {r["point"]: r for r in rows if r["status"] == "skipped"}
    errors = {r["point"]: r for r in rows if r["status"] == "error"}
    lines = [
        f"tokenyard search: {len(points)} points ({len(skipped)} skipped, {len(errors)} "
        f"failed), {len(config.slos)} SLO set(s); {result.ran} simulations run, "
        f"{result.reused} points reused"
    ]
    target = config.search.target_qps
    lines.append(
        f"target_qps: {target:g} (QPS marked '<' falls short of it)"
        if target is not None
        else "target_qps: none (ranked by QPS per $/h)"
    )
    for slo in config.effective_slos():
        user = _user_bounds(config, slo.name)
        bounds = ", ".join(f"{k} <= {v:g}" for k, v in user.items())
        guard = _guard(config, slo)
        if guard is not None:
            bounds += (
                f"; saturation guard {GUARD_KEY} <= {guard:g} (search.max_scheduling_delay_p99_s)"
            )
        lines += ["", f"SLO set {slo.name!r}: {bounds}"]
        best = result.best.get(slo.name)
        if best is None:
            lines.append(
                "  no deployment holds these SLOs" + (f" at {target:g} QPS" if target else "")
            )
        else:
            lines.append(
                f"  best: {best['label']}: {best['capacity_qps']:.3g} QPS at "
                f"{best['cost_per_hour']:.2f} $/h ({best['qps_per_dollar']:.3g} QPS per $/h)"
            )
        ranked = [r for r in rows if r["slo"] == slo.name and r["status"] == "ok"]
        ranked.sort(key=lambda r: (-(r["qps_per_dollar"] or 0.0), r["point"]))
        width = max([len(r["label"]) for r in ranked[:top]] + [6])
        keys = list(user)
        titles = [_column_title(k) for k in keys]
        widths = [max(len(t), 8) for t in titles]
        header = " ".join(f"{t:>{w}}" for t, w in zip(titles, widths, strict=True))
        lines.append(
            f"  {'config':<{width}} {'GPUs':>5} {'$/h':>8} {'QPS':>9} {'QPS/$h':>8} "
            f"{header} {'tok/s/GPU':>9} {'tok/s/user':>10}  breaks first"
        )
        for r in ranked[:top]:
            cap = _fmt(r["capacity_qps"], ".3g") + ("+" if r["capped"] else "")
            if target is not None and not r.get("meets_target"):
                cap += "<"
            mark = " *" if r["pareto"] else ""
            values = " ".join(
                f"{_fmt(r.get(k), '.3f'):>{w}}" for k, w in zip(keys, widths, strict=True)
            )
            binding = r["binding"] or "-"
            if r.get("guard_s") is not None:
                binding = binding.replace(GUARD_KEY, f"{GUARD_KEY} (guard)")
            lines.append(
                f"  {r['label']:<{width}} {r['num_gpus']:>5} {_fmt(r['cost_per_hour'], '.2f'):>8} "
                f"{cap:>9} {_fmt(r['qps_per_dollar'], '.3g'):>8} {values} "
                f"{_fmt(r.get('tokens_per_s_per_gpu'), '.1f'):>9} "
                f"{_fmt(r.get('tokens_per_s_per_user'), '.1f'):>10}  {binding}{mark}"
            )
        if len(ranked) > top:
            lines.append(f"  ... {len(ranked) - top} more in results.parquet")
        guarded = sum(1 for r in ranked if r.get("guard_binding"))
        if guarded:
            lines.append(
                f"  {guarded} deployment(s) stopped by the saturation guard alone, not by these "
                "SLOs (search.max_scheduling_delay_p99_s; inf turns it off)"
            )
    if any(r["pareto"] for r in rows):
        lines += ["", "* on the Pareto front of cost against " + pareto_metric(config)]
    for r in [*skipped.values(), *errors.values()]:
        lines.append(f"{r['status']}: {r['label']}: {r['reason']}")
    return "\n".join(lines)


#: The search's plot files, ``<stem>.<format>`` (``tokenyard.search.plots``).
PLOT_STEMS = ("capacity", "pareto", "frontier")


def _remove_plots(directory: Path) -> None:
    """Removes the plots an earlier search left in ``directory`` (a link is removed, never
    what it points to), so a re-run without ``--plots``, or with other formats, leaves no
    plot of other results beside its tables."""
    for stem in PLOT_STEMS:
        for path in sorted(directory.glob(f"{stem}.*")):
            if path.is_symlink() or path.is_file():
                path.unlink()


def write_tables(result: SearchResult, directory: Path) -> Path:
    """Writes the tables into ``directory``; they are renamed in together at the end, over a
    link already there rather than through it (``tokenyard._output``). Plots of an earlier
    run (``PLOT_STEMS``) are removed: they would describe other results."""
    import pyarrow.csv as pacsv  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    config = result.config
    doc = {
        "slos": [s.to_dict() for s in config.effective_slos()],
        "search": {**vars(config.search), "pareto_metric": pareto_metric(config)},
        "best": {
            name: (row and {k: row[k] for k in ("point", "key", "label")})
            for name, row in result.best.items()
        },
        "pareto": [
            {"point": r["point"], "slo": r["slo"], "label": r["label"]}
            for r in result.rows
            if r["pareto"]
        ],
    }
    with staged_output(directory) as staging:
        _remove_plots(directory)  # an earlier run's: write_plots draws this run's after
        table = to_arrow(result.rows)
        pq.write_table(table, staging / "results.parquet")
        pacsv.write_csv(table, staging / "results.csv")
        pq.write_table(to_arrow(result.probes), staging / "probes.parquet")
        (staging / "summary.txt").write_text(format_summary(result) + "\n")
        (staging / "search.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return directory


@dataclasses.dataclass
class SearchResult:
    """A deployment search's outcome: ``rows`` (one per point and SLO set; see
    ``docs/search.md`` for the columns), ``probes`` (one per simulation), ``best`` (SLO
    set -> its best row, or ``None``), and the number of simulations run now (``ran``)
    and points taken from an earlier run (``reused``)."""

    rows: list[dict[str, Any]]
    probes: list[dict[str, Any]]
    best: dict[str, dict[str, Any] | None]
    config: SearchConfig
    ran: int = 0
    reused: int = 0

    def table(self) -> Any:
        """The rows as a ``pyarrow.Table``."""
        return to_arrow(self.rows)

    def to_pandas(self) -> Any:
        return self.table().to_pandas()

    def summary(self, top: int = 20) -> str:
        return format_summary(self, top=top)

    def write(self, directory: str | Path) -> Path:
        """Writes results.parquet, probes.parquet, summary.txt and search.json."""
        return write_tables(self, Path(directory))
