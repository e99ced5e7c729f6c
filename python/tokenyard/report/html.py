"""Self-contained HTML: one run's report (``report.html``) or a comparison of several
(``compare.html``). Everything is inside the file: styles, the plots (PNG as data URIs, or
SVG inline), the config; it opens without a network or the results folder.
"""

from __future__ import annotations

import base64
import html
import json
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tokenyard.report.plots import PLOTS
from tokenyard.report.run import Run

__all__ = ["METRICS", "Metric", "compare_html", "comparison_rows", "run_html", "wins"]

Metric = tuple[str, Callable[[dict[str, Any]], float], str, str]

#: The headline metrics: label, where in summary.json, which way is better, format.
METRICS: tuple[Metric, ...] = (
    ("TTFT mean (s)", lambda s: s["latency_s"]["ttft"]["mean"], "lower", "{:.4f}"),
    ("TTFT p50 (s)", lambda s: s["latency_s"]["ttft"]["p50"], "lower", "{:.4f}"),
    ("TTFT p99 (s)", lambda s: s["latency_s"]["ttft"]["p99"], "lower", "{:.4f}"),
    ("TPOT mean (s)", lambda s: s["latency_s"]["tpot"]["mean"], "lower", "{:.4f}"),
    ("TPOT p99 (s)", lambda s: s["latency_s"]["tpot"]["p99"], "lower", "{:.4f}"),
    ("TBT p99 (s)", lambda s: s["latency_s"]["tbt"]["p99"], "lower", "{:.4f}"),
    ("e2e mean (s)", lambda s: s["latency_s"]["e2e"]["mean"], "lower", "{:.3f}"),
    ("e2e p99 (s)", lambda s: s["latency_s"]["e2e"]["p99"], "lower", "{:.3f}"),
    (
        "sched. delay p99 (s)",
        lambda s: s["latency_s"]["scheduling_delay"]["p99"],
        "lower",
        "{:.4f}",
    ),
    ("throughput (req/s)", lambda s: s["throughput"]["requests_per_s"], "higher", "{:.2f}"),
    ("decode (tok/s)", lambda s: s["throughput"]["decode_tokens_per_s"], "higher", "{:,.0f}"),
    ("goodput (% of requests)", lambda s: 100 * s["goodput"]["fraction"], "higher", "{:.1f}"),
    (
        "prefix-cache hits (%)",
        lambda s: 100 * s["throughput"]["prefix_hit_rate"],
        "higher",
        "{:.1f}",
    ),
    ("preemptions (restarts)", lambda s: s["preemption"]["num_restarts"], "lower", "{:,.0f}"),
    ("KV usage mean (%)", lambda s: 100 * s["replicas"]["kv_usage"]["mean"], "", "{:.1f}"),
    ("busy mean (%)", lambda s: 100 * s["replicas"]["mean_busy_fraction"], "", "{:.1f}"),
)

#: Relative difference under which two runs tie on a metric.
TIE = 1e-3

LATENCY_ROWS = (
    ("TTFT", "ttft"),
    ("TPOT", "tpot"),
    ("TBT (all tokens)", "tbt"),
    ("end to end", "e2e"),
    ("scheduling delay", "scheduling_delay"),
)

STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.7em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f2f2f2; }
td.best { font-weight: bold; background: #e8f5e9; }
img, svg { max-width: 100%; height: auto; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.note { color: #555; font-size: 0.9em; }
"""


def _page(title: str, body: list[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{STYLE}</style></head><body>",
            *body,
            "</body></html>",
            "",
        ]
    )


def _figure(files: Sequence[Path], alt: str) -> str:
    """The plot inline: a PNG as a data URI, else the SVG's own markup."""
    png = [f for f in files if f.suffix == ".png"]
    if png:
        data = base64.b64encode(png[0].read_bytes()).decode("ascii")
        return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
    svg = files[0].read_text()
    return svg[svg.index("<svg") :]


def _plots(plots: dict[str, list[Path]]) -> list[str]:
    out = []
    for name, files in plots.items():
        title = PLOTS[name][1]
        out += [f"<h2>{html.escape(title)}</h2>", _figure(files, title)]
    return out


def _latency_table(summary: dict[str, Any]) -> str:
    rows = ['<table id="latency"><thead><tr><th>latency (s)</th>']
    rows += ["".join(f"<th>{q}</th>" for q in ("mean", "p50", "p90", "p99")) + "</tr></thead>"]
    for label, key in LATENCY_ROWS:
        stats = summary["latency_s"][key]
        cells = "".join(f"<td>{stats[q]:.4f}</td>" for q in ("mean", "p50", "p90", "p99"))
        rows.append(f"<tr><td>{label}</td>{cells}</tr>")
    rows.append("</table>")
    return "".join(rows)


def _headline_table(summary: dict[str, Any]) -> str:
    rows = ['<table id="headline"><thead><tr><th>metric</th><th>value</th></tr></thead>']
    for label, get, _, fmt in METRICS[9:]:
        rows.append(f"<tr><td>{html.escape(label)}</td><td>{fmt.format(get(summary))}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _headline(summary: dict[str, Any]) -> str:
    c = summary["config"]
    execution = c.get("execution", {}).get("label", c.get("execution", {}).get("model", ""))
    layout = c.get("layout") or f"TP {c['tensor_parallel_size']}, PP {c['num_pipeline_stages']}"
    return (
        f"{c['num_replicas']} x {c['model']} on {c['device']} ("
        f"{layout}), "
        f"{c['replica_policy']} "
        f"replicas, {c['global_policy']} routing, {summary['num_requests']:,} requests; "
        f"execution model: {execution}"
    )


def reproduce_commands(run: Run) -> list[str]:
    """How to run it again: the command that ran it (if known), and the saved config."""
    commands = [run.command] if run.command else []
    if run.config is not None:
        config = shlex.quote(str(run.path / "config.json"))
        commands.append(f"tokenyard simulate {config} --output {shlex.quote(str(run.path))}")
    return commands


def run_html(run: Run, plots: dict[str, list[Path]]) -> str:
    """The report of one run."""
    s = run.summary
    body = [
        f"<h1>tokenyard simulation: {html.escape(run.name)}</h1>",
        f"<p>{html.escape(_headline(s))}</p>",
        f'<p class="note">simulated {s["makespan_s"]:.1f} s in {s["wall_s"]:.2f} s of wall time; '
        f"goodput SLOs: TTFT &le; {s['goodput']['slo_ttft_s']:g} s and TPOT &le; "
        f"{s['goodput']['slo_tpot_s']:g} s</p>",
        "<h2>Summary</h2>",
        _latency_table(s),
        _headline_table(s),
        *_plots(plots),
        "<h2>Reproduce</h2>",
    ]
    commands = reproduce_commands(run)
    body.append(
        "<pre>" + html.escape("\n".join(commands)) + "</pre>"
        if commands
        else '<p class="note">This run was written without its config (an older version).</p>'
    )
    if run.config is not None:
        body += [
            "<h2>Config</h2>",
            "<pre>" + html.escape(json.dumps(run.config, indent=2)) + "</pre>",
        ]
    body += ["<h2>Summary as written (summary.json)</h2>"]
    body += ["<pre>" + html.escape(json.dumps(s, indent=2)) + "</pre>"]
    return _page(f"tokenyard: {run.name}", body)


def comparison_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per headline metric: each run's value, its change against the first run, and the
    indices of the best runs (within ``TIE`` of the best; empty where no direction is
    better or every run ties)."""
    rows = []
    for label, get, better, fmt in METRICS:
        values = [float(get(r.summary)) for r in runs]
        base = values[0]
        changes = [None if base == 0 else (v - base) / abs(base) for v in values]
        best: set[int] = set()
        if better:
            top = min(values) if better == "lower" else max(values)
            # Within 0.1% of the best is a tie: a difference no one would act on.
            best = {i for i, v in enumerate(values) if abs(v - top) <= TIE * abs(top)}
            best = best if len(best) < len(values) else set()
        rows.append(
            {
                "metric": label,
                "values": values,
                "changes": changes,
                "best": best,
                "format": fmt,
                "better": better,
            }
        )
    return rows


def wins(runs: Sequence[Run], rows: list[dict[str, Any]]) -> str:
    """``a: best on 9 of 12; b: best on 3 of 12`` over the metrics where one is better."""
    ranked = [r for r in rows if r["best"]]
    counts = [sum(1 for r in ranked if i in r["best"]) for i in range(len(runs))]
    return "; ".join(
        f"{run.name}: best on {c} of {len(ranked)}" for run, c in zip(runs, counts, strict=True)
    )


def compare_html(runs: Sequence[Run], plots: dict[str, list[Path]]) -> str:
    """The side-by-side report of several runs."""
    rows = comparison_rows(runs)
    head = "".join(f"<th>{html.escape(r.name)}</th>" for r in runs)
    table = [f'<table id="compare"><thead><tr><th>metric</th>{head}</tr></thead>']
    for row in rows:
        cells = []
        for i, (value, change) in enumerate(zip(row["values"], row["changes"], strict=True)):
            text = row["format"].format(value)
            if i > 0 and change is not None:
                text += f" ({change:+.1%})"
            css = ' class="best"' if i in row["best"] else ""
            cells.append(f"<td{css}>{text}</td>")
        table.append(f"<tr><td>{html.escape(row['metric'])}</td>{''.join(cells)}</tr>")
    table.append("</table>")
    body = [
        "<h1>tokenyard: " + html.escape(" vs ".join(r.name for r in runs)) + "</h1>",
        "<ul>"
        + "".join(
            f"<li><b>{html.escape(r.name)}</b>: {html.escape(_headline(r.summary))}</li>"
            for r in runs
        )
        + "</ul>",
        "<h2>Headline metrics</h2>",
        '<p class="note">In brackets: the change against the first run. Green: the best '
        "run on that metric.</p>",
        "".join(table),
        f"<p><b>{html.escape(wins(runs, rows))}</b></p>",
        *_plots(plots),
    ]
    return _page("tokenyard compare", body)
