"""``tokenyard search capacity`` and ``tokenyard search deployments``: a search config
(TOML/YAML, see docs/search.md) with ``--set`` overrides, run locally or on Ray."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tokenyard._output import write_text
from tokenyard.errors import ConfigError, TokenyardError
from tokenyard.search.capacity import is_closed_loop
from tokenyard.simulation.config import parse_set_options

__all__ = ["add_parser", "run_command"]

EPILOG = """\
Config (docs/search.md): [simulation] (or simulation = "sim.toml"), [slo] bounds such as
ttft_p99_s = 2.0 and tbt_p99_s = 0.2 (or named sets [slo.NAME]), [search] initial_qps,
min_qps, max_qps, tolerance, max_simulations, max_scheduling_delay_p99_s, refine_breaks,
target_qps, pareto_metric; deployments only: [grid] dotted key = [values], [[variants]],
[constraints] max_gpus, max_cost_per_hour, [prices] device = USD per GPU-hour.
"""


def add_parser(commands: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = commands.add_parser(
        "search",
        help="capacity planning: capacity and deployment searches on the simulator",
        description="Find the highest arrival rate a deployment serves within its SLOs "
        "(capacity), or that for every deployment of a grid, with its cost (deployments).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = p.add_subparsers(dest="search_command", required=True)
    for name, text in (
        ("capacity", "the capacity of one deployment"),
        ("deployments", "a capacity search for every point of a grid, with cost"),
    ):
        sub = kinds.add_parser(
            name,
            help=text,
            description=text,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.add_argument("config", help="a .toml, .yaml or .yml search config")
        sub.add_argument("--output", "-o", metavar="DIR", help="write the results into DIR")
        sub.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="set a key of the search config (dotted; VALUE is read as TOML), e.g. "
            "slo.ttft_p99_s=1.0 or simulation.cluster.num_replicas=2. Repeatable.",
        )
        sub.add_argument(
            "--workers",
            type=int,
            help="local worker processes (default: 1 for capacity, all cores for deployments)",
        )
        sub.add_argument(
            "--ray",
            nargs="?",
            const="auto",
            metavar="ADDRESS",
            help="run the simulations as Ray tasks: 'auto' (the running cluster; the "
            "default with no value), 'local' (a new local instance) or an address",
        )
        sub.add_argument("--json", action="store_true", help="print the result as JSON")
        sub.add_argument("--no-progress", action="store_true", help="no progress line")
        if name == "deployments":
            sub.add_argument(
                "--plots",
                metavar="FORMATS",
                help="also write capacity.FMT and pareto.FMT for each of these "
                "comma-separated formats (png, svg, pdf); needs matplotlib and --output",
            )
            sub.add_argument("--top", type=int, default=20, help="rows per SLO set shown")
    return p


def run_command(args: argparse.Namespace) -> int:
    from tokenyard.search.config import load_search_config

    name = f"tokenyard search {args.search_command}"
    try:
        config = load_search_config(args.config, parse_set_options(args.overrides))
        executor = "ray" if args.ray else None
        if args.search_command == "capacity":
            return _capacity(args, config, executor)
        return _deployments(args, config, executor)
    except TokenyardError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2


def _capacity(args: argparse.Namespace, config: Any, executor: str | None) -> int:
    from tokenyard.search.deployments import capacity_search

    for key, present in (("grid", config.grid), ("variants", config.variants)):
        if present:
            raise ConfigError(
                f"{key}: a capacity search runs one deployment; use "
                f"'tokenyard search deployments' for a grid",
                field=key,
            )
    start = time.perf_counter()
    report = capacity_search(
        config.simulation,
        config.slos,
        search=config.search,
        executor=executor or ("local" if (args.workers or 1) > 1 else "serial"),
        workers=args.workers,
        ray_address=args.ray,
        prices=config.prices,
    )
    wall = time.perf_counter() - start
    if args.output:
        write_text(args.output, "capacity.json", json.dumps(report.to_dict(), indent=2) + "\n")
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    print(format_capacity(report, config, wall))
    return 0


def format_capacity(report: Any, config: Any, wall_s: float) -> str:
    lines = []
    # A closed-loop workload's load is its number of users (capacity.is_closed_loop).
    unit = "users" if is_closed_loop(config.simulation) else "QPS"
    for slo in config.effective_slos():
        r = report.results[slo.name]
        bounds = ", ".join(f"{k} <= {v:g}" for k, v in slo.bounds.items())
        lines.append(f"SLO set {slo.name!r}: {bounds}")
        if r.error:
            lines.append(f"  error: {r.error}")
            continue
        if r.capacity_qps == 0:
            lines.append(f"  capacity: below min_qps ({config.search.min_qps:g} {unit})")
        elif r.capped:
            lines.append(f"  capacity: at least {r.capacity_qps:.4g} {unit} (max_qps)")
        elif r.hi_qps is None:  # stopped (max_simulations) before any load broke an SLO
            lines.append(f"  capacity: at least {r.capacity_qps:.4g} {unit} ({r.stop})")
        else:
            lines.append(
                f"  capacity: {r.capacity_qps:.4g} {unit} (breaks at {r.hi_qps:.4g}: "
                f"{', '.join(r.binding)}; stopped on {r.stop})"
            )
        if report.cost_per_hour:
            lines.append(
                f"  cost: {report.cost_per_hour:.2f} $/h, "
                f"{r.capacity_qps / report.cost_per_hour:.3g} {unit} per $/h"
            )
        if r.metrics:
            shown = dict.fromkeys(
                [*slo.bounds, "ttft_p50_s", "ttft_p99_s", "tbt_p99_s", "e2e_p99_s"]
            )
            lines.append("  at capacity: " + ", ".join(f"{k} = {r.metrics[k]:.4g}" for k in shown))
        for key, b in report.breaks[slo.name].items():
            held = "no rate tried" if b["held_qps"] is None else f"{b['held_qps']:.4g} {unit}"
            if b["break_qps"] is None:
                lines.append(f"  {key}: holds at every rate tried (up to {held})")
            else:
                lines.append(f"  {key}: holds at {held}, breaks at {b['break_qps']:.4g} {unit}")
    n = len(report.probes)
    lines.append(f"{n} simulations in {wall_s:.1f} s")
    return "\n".join(lines)


def _deployments(args: argparse.Namespace, config: Any, executor: str | None) -> int:
    from tokenyard.search.deployments import deployment_search

    formats: tuple[str, ...] = ()
    if args.plots:
        formats = tuple(f.strip().lstrip(".") for f in args.plots.split(",") if f.strip())
        if not args.output:
            raise ConfigError("--plots needs --output DIR", field="--plots")
        from tokenyard.search.plots import _pyplot

        _pyplot()  # fail before the search if matplotlib is missing
    start = time.perf_counter()
    result = deployment_search(
        config,
        output_dir=args.output,
        executor=executor,
        workers=args.workers,
        ray_address=args.ray,
        progress=not args.no_progress,
    )
    wall = time.perf_counter() - start
    if formats:
        from tokenyard.search.plots import write_plots

        write_plots(result, args.output, formats)
    if args.json:
        print(json.dumps({"rows": result.rows, "best": result.best}, indent=2, default=str))
        return 0
    print(result.summary(top=args.top))
    print(f"\n{wall:.1f} s of wall time")
    if args.output:
        extra = "".join(f", capacity.{f}, pareto.{f}, frontier.{f}" for f in formats)
        print(
            f"wrote {args.output}/: results.parquet, results.csv, probes.parquet, "
            f"summary.txt, search.json, points/{extra}"
        )
    return 0
