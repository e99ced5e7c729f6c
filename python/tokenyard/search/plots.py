"""Plots of a deployment search (matplotlib, imported lazily): capacity per configuration,
cost against latency with the Pareto front, and tokens/s per GPU against tokens/s per user
(aggregated against disaggregated) from the evaluated deployments. The format follows the
file's suffix (``.png``, ``.svg``, ``.pdf``)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenyard._output import staged_output
from tokenyard.errors import ConfigError
from tokenyard.search.tables import frontier_rows, pareto_metric

if TYPE_CHECKING:
    from tokenyard.search.tables import SearchResult

__all__ = [
    "draw_frontier",
    "plot_capacity",
    "plot_frontier",
    "plot_frontier_rows",
    "plot_pareto",
    "write_plots",
]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "plots: plotting needs matplotlib (pip install 'tokenyard[plots]' or "
            "pip install matplotlib)",
            field="plots",
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_capacity(result: SearchResult, path: str | Path) -> Path:
    """One horizontal bar per configuration (and SLO set): its capacity in QPS, labelled
    with its cost per hour; skipped and failed points shown as 0 with their status."""
    plt = _pyplot()
    rows = sorted(result.rows, key=lambda r: (r["slo"], -(r["capacity_qps"] or 0.0), r["point"]))
    several = len(result.config.slos) > 1
    labels = [(f"[{r['slo']}] " if several else "") + r["label"] for r in rows]
    values = [r["capacity_qps"] or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.28 * len(rows)))
    bars = ax.barh(range(len(rows)), values, color=["C2" if r["best"] else "C0" for r in rows])
    for bar, r in zip(bars, rows, strict=True):
        note = (
            f" {r['cost_per_hour']:.2f} $/h" if r["status"] == "ok" and r["cost_per_hour"] else ""
        )
        if r["status"] != "ok":
            note = f" {r['status']}"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, note, va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("capacity (QPS at which the SLOs still hold)")
    ax.set_title("capacity per configuration (green: best per SLO set)")
    return _save(fig, plt, path)


def plot_pareto(result: SearchResult, path: str | Path) -> Path:
    """Cost against the Pareto metric at capacity, every usable row, the front joined."""
    plt = _pyplot()
    config = result.config.search
    axis = "cost_per_hour" if config.target_qps is not None else "cost_per_qps"
    metric = pareto_metric(result.config)
    rows = [r for r in result.rows if r[axis] is not None and r.get(metric) is not None]
    fig, ax = plt.subplots(figsize=(7, 5))
    for slo in result.config.slos:
        mine = [r for r in rows if r["slo"] == slo.name]
        ax.scatter([r[axis] for r in mine], [r[metric] for r in mine], s=18, label=slo.name)
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r[axis])
    if front:
        ax.plot(
            [r[axis] for r in front], [r[metric] for r in front], "k--", lw=1, label="Pareto front"
        )
        for r in front:
            ax.annotate(
                r["label"],
                (r[axis], r[metric]),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.set_xscale("log")  # costs per QPS span orders of magnitude across a grid
    ax.set_xlabel("$ per hour" if axis == "cost_per_hour" else "$ per hour per QPS of capacity")
    ax.set_ylabel(f"{metric} at capacity (s)")
    ax.set_title("cost against latency")
    ax.legend(fontsize=7)
    return _save(fig, plt, path)


def plot_frontier(result: SearchResult, path: str | Path) -> Path:
    """Output tokens/s per GPU against tokens/s per user, aggregated against disaggregated:
    one point per evaluated deployment at its found capacity (``tables.frontier_rows``;
    never a bisection probe), each kind's frontier joined, its points labelled. Several SLO
    sets: one panel each."""
    plt = _pyplot()
    slos = [s.name for s in result.config.slos]
    fig, axes = plt.subplots(1, len(slos), figsize=(7 * len(slos), 5), squeeze=False)
    rows = frontier_rows(result.rows)
    for ax, name in zip(axes[0], slos, strict=True):
        draw_frontier(
            ax,
            [r for r in rows if r["slo"] == name],
            f"SLO set {name!r}: each deployment at its capacity",
        )
    return _save(fig, plt, path)


def plot_frontier_rows(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str) -> Path:
    """``plot_frontier``'s chart, one panel, from rows already chosen (``draw_frontier``
    says which keys they carry): ``tokenyard recommend`` draws its evaluated points so."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    draw_frontier(ax, rows, title)
    return _save(fig, plt, path)


#: ``verdict`` of a row -> (legend text, marker, size) drawn over its point.
_VERDICTS = {
    "recommended": ("recommended (held on the whole load)", "*", 140),
    "rejected": ("rejected by the whole load", "x", 60),
}


def draw_frontier(ax: Any, rows: Sequence[Mapping[str, Any]], title: str) -> None:
    """Draws ``rows`` on ``ax``: ``tokens_per_s_per_user`` across, ``tokens_per_s_per_gpu``
    up, coloured by ``deployment`` (``aggregated`` / ``disaggregated``); rows with
    ``frontier`` true are joined per kind and labelled with ``label``. A row's optional
    ``verdict`` (``recommended``, ``rejected``) is marked over its point (and labelled)."""
    styles = {"aggregated": ("C0", "o"), "disaggregated": ("C3", "s")}
    for kind, (color, marker) in styles.items():
        mine = [r for r in rows if r["deployment"] == kind]
        if not mine:
            continue
        ax.scatter(
            [r["tokens_per_s_per_user"] for r in mine],
            [r["tokens_per_s_per_gpu"] for r in mine],
            s=22,
            color=color,
            marker=marker,
            alpha=0.5,
            label=f"{kind} ({len(mine)})",
        )
        front = sorted((r for r in mine if r["frontier"]), key=lambda r: r["tokens_per_s_per_user"])
        ax.plot(
            [r["tokens_per_s_per_user"] for r in front],
            [r["tokens_per_s_per_gpu"] for r in front],
            color=color,
            lw=1.2,
            label=f"{kind} frontier",
        )
        for r in mine:
            if r["frontier"] or r.get("verdict") in _VERDICTS:
                ax.annotate(
                    r["label"],
                    (r["tokens_per_s_per_user"], r["tokens_per_s_per_gpu"]),
                    fontsize=6,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
    for verdict, (text, marker, size) in _VERDICTS.items():
        marked = [r for r in rows if r.get("verdict") == verdict]
        if marked:
            ax.scatter(
                [r["tokens_per_s_per_user"] for r in marked],
                [r["tokens_per_s_per_gpu"] for r in marked],
                s=size,
                marker=marker,
                facecolors="none" if marker == "*" else "k",
                edgecolors="k",
                linewidths=1.0,
                label=f"{text} ({len(marked)})",
            )
    ax.set_xlabel("output tokens/s per user (1 / mean TPOT)")
    ax.set_ylabel("output tokens/s per GPU at capacity")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _save(fig: Any, plt: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # tight_layout with very long labels
        fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_plots(
    result: SearchResult, directory: str | Path, formats: tuple[str, ...] = ("png",)
) -> list[Path]:
    """``capacity.<fmt>``, ``pareto.<fmt>`` and ``frontier.<fmt>`` in ``directory`` for each
    format, renamed in
    at the end over a link already there rather than through it (``tokenyard._output``)."""
    names = []
    with staged_output(directory) as staging:
        for fmt in formats:
            names.append(plot_capacity(result, staging / f"capacity.{fmt}").name)
            names.append(plot_pareto(result, staging / f"pareto.{fmt}").name)
            names.append(plot_frontier(result, staging / f"frontier.{fmt}").name)
    return [Path(directory) / name for name in names]
