"""The plots of one run, or of several overlaid (matplotlib, imported lazily).

Each function draws one figure for a list of runs: one run gets a line per replica where
that says something (time series, load), several runs get one line per run. Files are
deterministic: no dates or software versions in their metadata, a fixed SVG id salt.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenyard.errors import ConfigError
from tokenyard.report.run import Run, binned_mean, binned_rate, cdf, gap_cdf, time_bins

__all__ = ["FORMATS", "PLOTS", "parse_formats", "write_plots"]

FORMATS = ("png", "svg")
#: Above this many replicas a run's time series show the mean and the range, not a line each.
MAX_REPLICA_LINES = 12


def parse_formats(text: str, field: str = "--plots") -> tuple[str, ...]:
    """``"png,svg"`` -> ``("png", "svg")``; anything else is a ConfigError."""
    formats = tuple(f.strip().lower() for f in text.split(",") if f.strip())
    bad = [f for f in formats if f not in FORMATS]
    if not formats or bad:
        raise ConfigError(
            f"{field}: formats must be a comma-separated list of {', '.join(FORMATS)}, "
            f"got {text!r}",
            field=field,
            value=repr(text),
        )
    return formats


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "plots: plotting needs matplotlib (pip install 'tokenyard[plots]')", field="plots"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "tokenyard"
    plt.rcParams["figure.dpi"] = 100
    return plt


def _save(fig: Any, plt: Any, stem: Path, formats: Sequence[str]) -> list[Path]:
    fig.tight_layout()
    out = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        metadata = {"Software": None} if fmt == "png" else {"Date": None, "Creator": None}
        fig.savefig(path, format=fmt, metadata=metadata)
        out.append(path)
    plt.close(fig)
    return out


def latency_cdfs(runs: Sequence[Run], stem: Path, formats: Sequence[str]) -> list[Path]:
    """TTFT, TPOT, inter-token gap and end-to-end latency CDFs, with the SLO lines."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = (
        ("ttft", "time to first token (TTFT)", "slo_ttft_s"),
        ("tpot", "time per output token (TPOT)", "slo_tpot_s"),
        ("gap", "inter-token gap (every output token)", "slo_tpot_s"),
        ("e2e", "end to end", None),
    )
    for ax, (key, title, slo_key) in zip(axes.flat, panels, strict=True):
        for i, run in enumerate(runs):
            if key == "gap":
                if run.token_gaps is None:
                    continue
                xs, ys = gap_cdf(run.token_gaps)
            else:
                values = run.requests[key]
                xs, ys = cdf(values[values > 0] if key == "tpot" else values)
            if xs.size:
                ax.step(xs, 100 * ys, where="post", color=f"C{i}", label=run.name)
        slos = {run.summary["goodput"][slo_key] for run in runs} if slo_key else set()
        for slo in sorted(slos):
            ax.axvline(slo, color="0.3", ls="--", lw=1)
            ax.text(slo, 2, f" SLO {slo:g} s", color="0.3", fontsize=8, rotation=90, va="bottom")
        _log_axis(ax)
        ax.set_title(title)
        ax.set_xlabel("seconds (log scale)")
        ax.set_ylabel("% of requests" if key != "gap" else "% of tokens")
        ax.set_ylim(0, 101)
        ax.grid(alpha=0.3)
    if len(runs) > 1:
        axes.flat[0].legend(fontsize=8)
    fig.suptitle("latency distributions" + _of(runs))
    return _save(fig, plt, stem, formats)


def _log_axis(ax: Any) -> None:
    """A log x axis labelled in plain numbers (0.02, 0.1, 1), no crowded minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _of(runs: Sequence[Run]) -> str:
    return f" ({runs[0].name})" if len(runs) == 1 else ""


def _replica_series(run: Run, column: str, edges: np.ndarray) -> list[np.ndarray]:
    samples = run.samples
    if column == "waiting":  # sampled when a batch forms: the rest of the replica's requests
        values = samples["num_outstanding"].astype(np.float64) - samples["batch_size"]
        values = np.maximum(values, 0.0)
    else:
        values = samples[column].astype(np.float64)
    return [
        binned_mean(
            samples["time"][samples["replica"] == r], values[samples["replica"] == r], edges
        )
        for r in range(run.num_replicas)
    ]


def _completions(run: Run, edges: np.ndarray) -> list[np.ndarray]:
    done, replica = run.requests["completed_at"], run.requests["replica"]
    return [binned_rate(done[replica == r], edges) for r in range(run.num_replicas)]


def over_time(runs: Sequence[Run], stem: Path, formats: Sequence[str]) -> list[Path]:
    """Throughput (completions per second), waiting requests, batch size and KV usage over
    time: per replica for one run, per run (cluster total or replica mean) for
    several."""
    plt = _pyplot()
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    panels = (
        ("completed requests / s", "completions", "sum"),
        ("waiting requests", "waiting", "sum"),
        ("batch size (requests)", "batch_size", "mean"),
        ("KV cache usage (%)", "kv_usage", "mean"),
    )
    for i, run in enumerate(runs):
        edges = time_bins(run.makespan_s)
        middles = (edges[:-1] + edges[1:]) / 2
        for ax, (_, column, combine) in zip(axes, panels, strict=True):
            if column == "completions":
                per_replica = _completions(run, edges)
            else:
                per_replica = _replica_series(run, column, edges)
            scale = 100.0 if column == "kv_usage" else 1.0
            _draw_series(ax, middles, per_replica, scale, i, run, len(runs), combine)
    for ax, (label, _, _) in zip(axes, panels, strict=True):
        ax.set_ylabel(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("simulated time (s)")
    handles = axes[0].get_legend_handles_labels()[0]
    if handles:
        axes[0].legend(fontsize=8, ncol=min(6, len(handles)))
    fig.suptitle("over time" + _of(runs))
    return _save(fig, plt, stem, formats)


def _draw_series(
    ax: Any,
    xs: np.ndarray,
    per_replica: list[np.ndarray],
    scale: float,
    index: int,
    run: Run,
    num_runs: int,
    combine: str,
) -> None:
    stacked = np.vstack(per_replica) * scale
    with warnings.catch_warnings():  # a time bin no replica sampled is NaN: a gap
        warnings.simplefilter("ignore", RuntimeWarning)
        if num_runs > 1:
            line = np.nansum(stacked, axis=0) if combine == "sum" else np.nanmean(stacked, axis=0)
            ax.plot(xs, line, color=f"C{index}", lw=1.2, label=run.name)
        elif len(per_replica) <= MAX_REPLICA_LINES:
            for r, values in enumerate(stacked):
                ax.plot(xs, values, color=f"C{r % 10}", lw=0.9, label=f"replica {r}")
        else:
            low, high = np.nanmin(stacked, axis=0), np.nanmax(stacked, axis=0)
            ax.fill_between(xs, low, high, alpha=0.25, color="C0", label="replica range")
            ax.plot(xs, np.nanmean(stacked, axis=0), color="C0", lw=1.2, label="replica mean")


def replica_load(runs: Sequence[Run], stem: Path, formats: Sequence[str]) -> list[Path]:
    """Per replica: requests served, busy fraction and mean batch size (grouped by run)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        replicas = np.arange(run.num_replicas)
        served = np.bincount(run.requests["replica"], minlength=run.num_replicas)
        busy = 100 * np.asarray(run.summary["replicas"]["busy_fraction"])
        batch = np.asarray(run.summary["replicas"]["mean_batch_size"])
        x = replicas + (i - (len(runs) - 1) / 2) * width
        for ax, values in zip(axes, (served, busy, batch), strict=True):
            ax.bar(x, values, width=width, color=f"C{i}", label=run.name)
    for ax, title in zip(
        axes, ("requests served", "busy (% of the run)", "mean batch size"), strict=True
    ):
        ax.set_title(title)
        ax.set_xlabel("replica")
        ax.grid(alpha=0.3, axis="y")
        ax.xaxis.get_major_locator().set_params(integer=True)
    if len(runs) > 1:
        axes[0].legend(fontsize=8)
    fig.suptitle("load per replica" + _of(runs))
    return _save(fig, plt, stem, formats)


def prefix_hits(runs: Sequence[Run], stem: Path, formats: Sequence[str]) -> list[Path]:
    """The share of prompt tokens served from the prefix cache, by arrival time."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for i, run in enumerate(runs):
        edges = time_bins(run.makespan_s)
        arrived = run.requests["arrived_at"]
        hits = binned_rate(arrived, edges, run.requests["prefix_hit_tokens"].astype(float))
        prompt = binned_rate(arrived, edges, run.requests["num_prefill_tokens"].astype(float))
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(prompt > 0, 100 * hits / np.maximum(prompt, 1e-12), np.nan)
        overall = 100 * run.summary["throughput"]["prefix_hit_rate"]
        label = f"{run.name} (overall {overall:.1f}%)"
        ax.plot((edges[:-1] + edges[1:]) / 2, share, color=f"C{i}", lw=1.1, label=label)
    ax.set_ylabel("prompt tokens from cache (%)")
    ax.set_xlabel("arrival time (s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("prefix-cache hit rate over time" + _of(runs))
    return _save(fig, plt, stem, formats)


#: Plot name -> (function, title in the report); prefix hits only when some run has hits.
PLOTS = {
    "latency": (latency_cdfs, "Latency distributions"),
    "over_time": (over_time, "Over time"),
    "replicas": (replica_load, "Load per replica"),
    "prefix_hits": (prefix_hits, "Prefix-cache hits over time"),
}


def write_plots(
    runs: Sequence[Run], folder: str | Path, formats: Sequence[str] = ("png",)
) -> dict[str, list[Path]]:
    """Every plot of ``runs`` into ``folder`` as ``<name>.<format>``; returns the files by
    plot name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, list[Path]] = {}
    for name, (draw, _) in PLOTS.items():
        if name == "prefix_hits" and not any(
            r.summary["throughput"]["prefix_hit_rate"] > 0 for r in runs
        ):
            continue
        written[name] = draw(runs, folder / name, formats)
    return written
