"""The answer of ``tokenyard recommend`` as a planner reads it: one row per verified point
(the SLO percentiles asked for, ``target_qps``, GPUs, tokens/s/GPU and /user, headroom,
cost and energy per million tokens), the text table with the best aggregated and
disaggregated points and their launch lines, and ``--out DIR``'s files.

``--out DIR`` writes fresh: ``recommendations.csv``/``.parquet``, ``summary.txt``,
``recommend.json`` and ``frontier.<fmt>`` (``frontier``) by fixed names, and ``launch/``
and ``configs/`` swapped in whole
(``tokenyard._output``), so no file of an earlier run stays beside the new ones.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tokenyard.recommend.recommend import (
    Recommendation,
    Simulated,
    point_config,
    tokens_per_s_per_gpu,
)
from tokenyard.recommend.verify import Verdict

__all__ = ["best_commands", "format_table", "rows", "write_outputs"]

_KIND = {"agg": "aggregated", "disagg": "disaggregated"}


def _config(rec: Recommendation, sim: Simulated, verdict: Verdict) -> Any:
    """The ``SimulationConfig`` of a point on the whole load at its verified rate."""
    return point_config(rec.ask, sim, verdict, run=False)[0]


def _details(rec: Recommendation, index: int) -> dict[str, Any]:
    """Cost and energy per million output tokens (``cost.cost_from_summary``: GPU-hours at
    the catalog price, power linear in busy fraction) and the utilisation a planner
    reads, from recommended point ``index``'s whole-load run."""
    from tokenyard.recommend import cost

    sim, verdict = rec.points[index]
    summary = rec.summaries[index]
    figures = cost.cost_from_summary(_config(rec, sim, verdict), summary)
    replicas = summary["replicas"]
    return {
        "cost_per_million_tokens": figures.usd_per_million_tokens,
        "energy_kwh_per_million_tokens": figures.kwh_per_million_tokens,
        "mean_power_w_per_gpu": figures.mean_power_w,
        "mean_busy_fraction": replicas["mean_busy_fraction"],
        "mean_batch_size": replicas["batch_size"]["mean"],
        "kv_usage_p90": replicas["kv_usage"]["p90"],
    }


def rows(rec: Recommendation) -> list[dict[str, Any]]:
    """One row per verified point, best first within each kind, then the rejected ones
    (``recommended`` False, with the reason in ``note``)."""
    out = []
    unit = "users" if rec.ask.closed_loop else "qps"
    for recommended, group in ((True, rec.points), (False, rec.rejected)):
        for rank, (sim, verdict) in enumerate(group, 1):
            c = sim.candidate
            tps = tokens_per_s_per_gpu(sim, verdict) if verdict.held else 0.0
            tpot = verdict.metrics.get("tpot_p50_s", math.nan)
            row: dict[str, Any] = {
                "recommended": recommended,
                "rank": rank if recommended else None,
                "kind": _KIND[c.kind],
                "deployment": c.label,
                "device": c.layout.device,
                "gpus": c.gpus,
                "prefill": f"{c.layout.label} x{c.replicas}" if c.decode else "",
                "decode": f"{c.decode.label} x{c.decode_replicas}" if c.decode else "",
                "max_num_seqs": c.decode_max_num_seqs if c.decode else c.max_num_seqs,
                "max_num_batched_tokens": c.max_num_batched_tokens,
                "speculative": json.dumps(dict(c.speculative)) if c.speculative else "",
                f"target_{unit}": verdict.rate,
                f"capacity_{unit}": sim.capacity,
                "tokens_per_s_per_gpu": tps,
                "tokens_per_s_per_user": 1.0 / tpot if tpot > 0 else math.nan,
                "estimated_tokens_per_s_per_gpu": c.estimate.get("tokens_per_s_per_gpu", math.nan),
            }
            for key in rec.slo.bounds:
                row[key] = verdict.metrics.get(key, math.nan)
            for key, room in verdict.headroom.items():
                row[f"headroom_{key}"] = room
            row["binding"] = verdict.binding
            row["verified_requests"] = verdict.num_requests
            row["note"] = verdict.note(rec.ask.margin)
            if recommended:  # group is rec.points: rank - 1 is the point's index
                row.update(_details(rec, rank - 1))
            out.append(row)
    return out


def _fmt(value: Any, width: int) -> str:
    if isinstance(value, float):
        text = "-" if not math.isfinite(value) else f"{value:.4g}"
    else:
        text = str(value)
    return text.rjust(width)


def format_table(rec: Recommendation, table: list[dict[str, Any]]) -> str:
    """The text answer: the question, the table, the best of each kind with its launch
    lines, the notes."""
    ask = rec.ask
    unit = "users" if ask.closed_loop else "qps"
    bounds = ", ".join(f"{k} <= {v:g}" for k, v in rec.slo.bounds.items())
    load = (
        f"{ask.gpus} GPUs"
        if ask.gpus
        else (f"{ask.rate:g} QPS" if ask.rate else f"{ask.concurrency} users")
    )
    lines = [
        f"tokenyard recommend: {ask.model} on {', '.join(ask.systems)} ({ask.framework}), {load}; "
        f"mean ISL {rec.mean_isl:.0f} / OSL {rec.mean_osl:.0f}; {bounds}; margin {ask.margin:.0%}",
        f"{rec.num_candidates} candidates estimated, {len(rec.simulated)} simulated, "
        f"{len(rec.points) + len(rec.rejected)} verified on the whole load "
        f"({rec.num_simulations} simulations, {rec.wall_s['total']:.1f} s)",
        "",
    ]
    shown = [r for r in table if r["recommended"]]
    lines += _table_lines(rec, shown, unit)
    if not shown:
        lines.append("  (no point held its SLOs on the whole load)")
    lines += _trailer(rec, table, unit)
    return "\n".join(lines)


def _table_lines(rec: Recommendation, shown: list[dict[str, Any]], unit: str) -> list[str]:
    """The header and one line per recommended row (and its note)."""
    lines: list[str] = []
    slo_cols = list(rec.slo.bounds)
    head = [
        "#",
        "deployment",
        "GPU",
        "GPUs",
        f"target_{unit}",
        *slo_cols,
        "binding",
        "headroom",
        "tok/s/GPU",
        "tok/s/user",
        "$/Mtok",
        "kWh/Mtok",
    ]
    width = max([len("deployment")] + [len(r["deployment"]) for r in shown])
    widths = [
        2,
        width,
        max([3] + [len(r["device"]) for r in shown]),
        4,
        10,
        *[max(9, len(k)) for k in slo_cols],
        max(8, *(len(r["binding"]) for r in shown), 8) if shown else 8,
        8,
        9,
        10,
        7,
        8,
    ]
    lines.append(
        "  ".join(
            h.rjust(w) if i != 1 else h.ljust(w)
            for i, (h, w) in enumerate(zip(head, widths, strict=True))
        )
    )
    for r in shown:
        binding = r["binding"]
        cells = [
            f"{r['rank']}{'a' if r['kind'] == 'aggregated' else 'd'}",
            r["deployment"].ljust(width),
            r["device"],
            r["gpus"],
            r[f"target_{unit}"],
            *[r[k] for k in slo_cols],
            binding,
            f"{r[f'headroom_{binding}']:.1%}" if binding else "-",
            r["tokens_per_s_per_gpu"],
            r["tokens_per_s_per_user"],
            r.get("cost_per_million_tokens", math.nan),
            r.get("energy_kwh_per_million_tokens", math.nan),
        ]
        lines.append(
            "  ".join(
                c if i == 1 else _fmt(c, w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
        )
        if r["note"]:
            lines.append(f"{'':4}note: {r['note']}")
    return lines


def _trailer(rec: Recommendation, table: list[dict[str, Any]], unit: str) -> list[str]:
    """What follows the table: the points not verified or not recommended and why, the
    best of each kind with its launch lines, the notes and the wall time."""
    ask = rec.ask
    lines: list[str] = []
    for sim in unverified(rec):
        lines.append(
            f"not verified: {sim.candidate.label} on {sim.candidate.layout.device}: "
            f"{why_short(rec, sim)}"
        )
    for r in table:
        if not r["recommended"]:
            lines.append(
                f"not recommended: {r['deployment']} on {r['device']} "
                f"(max_num_seqs={r['max_num_seqs']}, "
                f"max_num_batched_tokens={r['max_num_batched_tokens']}): {r['note']}"
            )
    for kind in ("agg", "disagg"):
        best = rec.best(kind)
        if best is None:
            continue
        sim, verdict = best
        lines += [
            "",
            f"best {_KIND[kind]}: {sim.candidate.label} on {sim.candidate.layout.device} "
            f"({sim.candidate.knobs}), "
            f"{verdict.rate:.4g} {unit}:",
        ]
        lines += [
            f"  {line}" for line in best_commands(rec, sim, verdict)[ask.framework].splitlines()
        ]
    for note in rec.notes:
        lines.append(f"note: {note}")
    lines.append(
        f"wall: estimate {rec.wall_s['estimate']:.1f} s, search {rec.wall_s['search']:.1f} s, "
        f"verify {rec.wall_s['verify']:.1f} s"
    )
    return lines


def unverified(rec: Recommendation) -> list[Simulated]:
    """Simulated points that were never verified because they fell short: capacity 0, or
    (with a target) a capacity that, less the margin, stays under it after growing."""
    verified = {id(s) for s, _ in (*rec.points, *rec.rejected)}
    target = rec.ask.target
    return [
        s
        for s in rec.simulated
        if id(s) not in verified
        and (s.capacity <= 0 or (target is not None and s.capacity * (1 - rec.ask.margin) < target))
    ]


def why_short(rec: Recommendation, sim: Simulated) -> str:
    r = sim.result
    if r.error:
        return f"its simulation failed: {r.error}"
    broke = ", ".join(r.binding) or "an SLO"
    if sim.capacity <= 0:
        return f"{broke} broke at every rate tried, down to {min(r.rates, default=0):.3g}"
    target = rec.ask.target
    return (
        f"capacity {sim.capacity:.4g} after {sim.rounds - 1} resizing round(s) ({broke} broke "
        f"above it), under the target {target:g} / (1 - margin)"
    )


def best_commands(rec: Recommendation, sim: Simulated, verdict: Verdict) -> dict[str, str]:
    """The tokenyard config of one point and the launch script of the framework it was
    simulated under (``--framework``): a line for the other engine would run a scheduler
    the point was never verified with, so none is written."""
    from tokenyard.recommend import launch

    config = _config(rec, sim, verdict)
    framework = rec.ask.framework
    out = {"config": launch.config_toml(config)}
    try:
        out[framework] = launch.launch_script(config, framework)
    except Exception as error:  # a layout the engine cannot launch
        out[framework] = f"# {framework}: {error}"
    return out


def write_outputs(
    rec: Recommendation,
    table: list[dict[str, Any]],
    directory: str | Path,
    text: str,
    plots: tuple[str, ...] = (),
) -> list[str]:
    """Writes ``--out DIR`` (see the module docstring), with ``frontier.<fmt>`` for each
    format in ``plots``; returns the names written.

    Raises:
        ConfigError: ``plots`` given without matplotlib installed.
    """
    import pyarrow.csv as pacsv  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    from tokenyard._output import staged_output
    from tokenyard.search.tables import to_arrow

    names = [
        "recommendations.csv",
        "recommendations.parquet",
        "summary.txt",
        "recommend.json",
        "launch/",
        "configs/",
        *(f"frontier.{fmt}" for fmt in plots),
    ]
    frame = to_arrow(table)
    with staged_output(directory) as stage:
        pacsv.write_csv(frame, stage / "recommendations.csv")
        pq.write_table(frame, stage / "recommendations.parquet")
        (stage / "summary.txt").write_text(text + "\n")
        (stage / "launch").mkdir()
        (stage / "configs").mkdir()
        for kind_rank, (sim, verdict) in _named(rec):
            commands = best_commands(rec, sim, verdict)
            (stage / "configs" / f"{kind_rank}.toml").write_text(commands["config"])
            fw = rec.ask.framework  # only the engine whose scheduler was simulated
            (stage / "launch" / f"{kind_rank}.{fw}.sh").write_text(commands[fw])
        (stage / "recommend.json").write_text(
            json.dumps(_summary(rec, table), indent=2, default=str) + "\n"
        )
        if plots:
            from tokenyard.recommend.frontier import plot_frontier

            for fmt in plots:
                plot_frontier(rec, stage / f"frontier.{fmt}")
    for old in Path(directory).glob("frontier.*"):  # an earlier run's other formats
        if old.name not in names and old.is_file():
            old.unlink()
    return names


def _named(rec: Recommendation) -> list[tuple[str, tuple[Simulated, Verdict]]]:
    counts: dict[str, int] = {}
    out = []
    for point in rec.points:
        kind = point[0].candidate.kind
        counts[kind] = counts.get(kind, 0) + 1
        out.append((f"{kind}-{counts[kind]}", point))
    return out


def _summary(rec: Recommendation, table: list[dict[str, Any]]) -> dict[str, Any]:
    ask = rec.ask
    return {
        "ask": {
            "model": ask.model,
            "systems": list(ask.systems),
            "framework": ask.framework,
            "gpus": ask.gpus,
            "rate": ask.rate,
            "concurrency": ask.concurrency,
            "slo": dict(rec.slo.bounds),
            "margin": ask.margin,
            "sample": ask.sample,
        },
        "mean_isl": rec.mean_isl,
        "mean_osl": rec.mean_osl,
        "num_candidates": rec.num_candidates,
        "num_simulations": rec.num_simulations,
        "wall_s": rec.wall_s,
        "notes": rec.notes,
        "skipped": [{"layout": a, "reason": b} for a, b in rec.skipped],
        "simulated": [
            {
                "deployment": s.candidate.label,
                "device": s.candidate.layout.device,
                "gpus": s.candidate.gpus,
                "knobs": s.candidate.knobs,
                "estimate": dict(s.candidate.estimate),
                "capacity": s.result.to_dict(),
            }
            for s in rec.simulated
        ],
        "rows": table,
    }
