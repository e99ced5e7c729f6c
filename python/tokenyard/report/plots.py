"""The plots of one run, or of several overlaid (matplotlib, imported lazily).

Each function draws one figure for a list of runs: one run gets a line per replica where
that says something (time series, load), several runs get one line per run. Files are
deterministic: no dates or software versions in their metadata, a fixed SVG id salt.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenyard.errors import ConfigError
from tokenyard.report.run import Run, binned_mean, binned_rate, cdf, gap_cdf, time_bins

__all__ = ["FORMATS", "PLOTS", "parse_formats", "write_plots"]

FORMATS = ("png", "svg")
#: Above this many replicas a run's time series show the median and the range (min to
#: max), not a line each: more lines overlap into noise.
MAX_REPLICA_LINES = 4


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


def batch_cap(run: Run, pool: str = "") -> tuple[int, str] | None:
    """A pool's configured batch cap and its key (``max_num_seqs`` for vllm_v1,
    ``max_running_requests`` for sglang, ``batch_size_cap`` for Vidur's policies), or
    ``None`` without a saved config, for a plugin, or when it is 0 (unbounded). The
    ``decode`` pool's is ``[cluster.decode.scheduler]``'s where set, else the replica's."""
    from tokenyard import _core

    if run.config is None:
        return None
    decode = (run.config["cluster"].get("decode") or {}) if pool == "decode" else {}
    scheduler = decode.get("scheduler") or run.config["replica"]["scheduler"]
    info = _core.REPLICA_POLICIES.get(scheduler["policy"])
    section = info["section"] if info else "plugin"
    key = {"vllm_v1": "max_num_seqs", "sglang": "max_running_requests"}.get(
        section, "batch_size_cap" if section == "vidur" else ""
    )
    value = int(scheduler.get(section, {}).get(key) or 0) if key else 0
    return (value, key) if value > 0 else None


def _replica_caps(run: Run) -> np.ndarray | None:
    """Each replica's batch cap (its pool's), or ``None`` when some pool has none."""
    caps = np.zeros(run.num_replicas)
    for pool, members in run.pools:
        cap = batch_cap(run, pool)
        if cap is None:
            return None
        caps[members.start : members.stop] = cap[0]
    return caps


def binned_last(times: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The sampled state at each bin's end: the last sample at or before it, carried
    forward (0 before the first). A count stays a whole number: nothing is averaged."""
    index = np.searchsorted(times, edges[1:], side="right") - 1
    return np.where(index >= 0, values[np.maximum(index, 0)], 0.0)


def _replica_series(run: Run, column: str, edges: np.ndarray) -> list[np.ndarray]:
    """Per replica: ``waiting`` (requests queued, a whole number: the last sample in each
    bin), ``batch_fill`` (mean batch size in % of the batch cap; requests without one),
    or the bin mean of a sampled column."""
    samples = run.samples
    reduce = binned_mean
    if column == "waiting":  # sampled when a batch forms: the rest of the replica's requests
        values = samples["num_outstanding"].astype(np.int64) - samples["batch_size"]
        values = np.maximum(values, 0).astype(np.float64)
        reduce = binned_last
    elif column == "batch_fill":
        caps = _replica_caps(run)
        values = samples["batch_size"].astype(np.float64)
        if caps is not None:
            values = values * (100.0 / caps[samples["replica"]])
    else:
        values = samples[column].astype(np.float64)
    return [
        _carried(
            reduce(samples["time"][samples["replica"] == r], values[samples["replica"] == r], edges)
        )
        for r in range(run.num_replicas)
    ]


def _carried(values: np.ndarray) -> np.ndarray:
    """A bin without a sample keeps the last sampled value (a replica is sampled at most
    once per ``sample_interval_s``; its state holds between samples); 0 before the first."""
    index = np.where(np.isnan(values), 0, np.arange(values.size))
    np.maximum.accumulate(index, out=index)
    filled = values[index]
    return np.where(np.isnan(filled), 0.0, filled)


def _cap_words(runs: Sequence[Run]) -> str:
    """The batch panel's unit: % of the one cap all runs share, of each run's own, or
    requests when a run has none."""
    caps = [batch_cap(run, pool) for run in runs for pool, _ in run.pools]
    if any(c is None for c in caps) or any(_replica_caps(run) is None for run in runs):
        return "batch size (requests)"
    if len(set(caps)) == 1 and caps[0] is not None:
        return f"batch fill (% of {caps[0][1]} = {caps[0][0]})"
    return "batch fill (% of each pool's cap)"


def _completions(run: Run, edges: np.ndarray) -> list[np.ndarray]:
    done, replica = run.requests["completed_at"], run.requests["replica"]
    return [binned_rate(done[replica == r], edges) for r in range(run.num_replicas)]


def over_time(runs: Sequence[Run], stem: Path, formats: Sequence[str]) -> list[Path]:
    """Throughput (completions per second), waiting requests (whole numbers), batch fill
    against the batch cap and KV usage over time, each bin drawn flat (no interpolation
    between bins): per replica for one run (the median and range beyond
    ``MAX_REPLICA_LINES`` replicas), per run (cluster total or replica mean) for several.
    Batch fill and KV use, not "busy", say how loaded a replica is: one running a batch of
    5 is busy all the time at 2% of a cap of 256."""
    plt = _pyplot()
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    panels = (
        ("completed requests / s", "completions", "sum"),
        ("waiting requests", "waiting", "sum"),
        (_cap_words(runs), "batch_fill", "mean"),
        ("KV cache usage (%)", "kv_usage", "mean"),
    )
    for i, run in enumerate(runs):
        edges = time_bins(run.makespan_s)
        for ax, (_, column, combine) in zip(axes, panels, strict=True):
            if column == "completions":
                per_replica = _completions(run, edges)
            else:
                per_replica = _replica_series(run, column, edges)
            scale = 100.0 if column == "kv_usage" else 1.0
            whole = column == "waiting"
            _draw_series(ax, edges, per_replica, scale, i, run, len(runs), combine, whole=whole)
    from matplotlib.ticker import MaxNLocator

    axes[1].yaxis.set_major_locator(MaxNLocator(integer=True))  # requests are whole
    axes[1].set_ylim(0, max(1.0, axes[1].get_ylim()[1]))
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
    edges: np.ndarray,
    per_replica: list[np.ndarray],
    scale: float,
    index: int,
    run: Run,
    num_runs: int,
    combine: str,
    *,
    whole: bool = False,
) -> None:
    """Each bin's value drawn flat over the bin (``stairs``): one line per run, per replica
    up to ``MAX_REPLICA_LINES`` (named by pool in a P/D run), else per pool the replicas'
    median and their min-max band. A ``whole``-number series (waiting requests) takes the
    lower of the two middle replicas as its median, a count rather than their mean."""
    # No bin is NaN: each series carries its last sample forward (``_carried``).
    stacked = np.vstack(per_replica) * scale
    if num_runs > 1:
        line = stacked.sum(axis=0) if combine == "sum" else stacked.mean(axis=0)
        ax.stairs(line, edges, color=f"C{index}", lw=1.2, label=run.name)
        return
    count = len(per_replica)
    pools = run.pools if run is not None else [("", range(count))]
    if count <= MAX_REPLICA_LINES:
        labels = run.replica_labels if run is not None else [f"replica {r}" for r in range(count)]
        for r, values in enumerate(stacked):
            ax.stairs(values, edges, color=f"C{r % 10}", lw=0.9, label=labels[r])
        return
    for g, (pool, members) in enumerate(pools):
        mine = stacked[members.start : members.stop]
        noun = f"{pool} replica" if pool else "replica"
        if len(mine) > 1:
            ax.stairs(
                mine.max(axis=0), edges, baseline=mine.min(axis=0), fill=True, alpha=0.25,
                color=f"C{g}", label=f"min-max of {len(mine)} {noun}s",
            )  # fmt: skip
        median = np.percentile(mine, 50, axis=0, method="lower") if whole else np.median(mine, 0)
        ax.stairs(median, edges, color=f"C{g}", lw=1.2, label=f"{noun} median")


def replica_fill(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Per replica: the mean batch fill (% of the batch cap; requests without one) and
    the mean sampled KV use (%)."""
    caps = _replica_caps(run)
    batch = np.asarray(run.summary["replicas"]["mean_batch_size"], dtype=np.float64)
    fill = batch * (100.0 / caps) if caps is not None else batch
    replica, kv = run.samples["replica"], run.samples["kv_usage"].astype(np.float64)
    counts = np.bincount(replica, minlength=run.num_replicas)
    sums = np.bincount(replica, weights=kv, minlength=run.num_replicas)
    kv_mean = 100.0 * sums / np.maximum(counts, 1)
    return fill[: run.num_replicas], kv_mean[: run.num_replicas]


def _served(run: Run) -> np.ndarray:
    """Requests each replica worked on: where each finished, and in a P/D run also the
    prefill replica of each handed to the decode pool."""
    served = np.bincount(run.requests["replica"], minlength=run.num_replicas)
    prefilled = run.requests.get("prefill_replica")
    if prefilled is not None:
        served = served + np.bincount(prefilled[prefilled >= 0], minlength=run.num_replicas)
    return served


def replica_load(runs: Sequence[Run], stem: Path, formats: Sequence[str]) -> list[Path]:
    """Per replica: requests served, time with a batch running, mean batch fill against
    the batch cap and mean KV use (grouped by run). "Busy" alone reads as saturated: a
    replica running batches of 5 is busy all the time; the fill and KV panels say how
    much of it is used."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8))
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        replicas = np.arange(run.num_replicas)
        served = _served(run)
        busy = 100 * np.asarray(run.summary["replicas"]["busy_fraction"])
        fill, kv = replica_fill(run)
        x = replicas + (i - (len(runs) - 1) / 2) * width
        for ax, values in zip(axes, (served, busy, fill, kv), strict=True):
            ax.bar(x, values, width=width, color=f"C{i}", label=run.name)
    fill_title = "mean " + _cap_words(runs)
    titles = ("requests served", "a batch running (% of the run)", fill_title, "mean KV use (%)")
    # A P/D run's replicas: prefill ones first, then decode ones, ticked P0.. D0..
    shared = {tuple((pool, len(m)) for pool, m in run.pools) for run in runs}
    pools = runs[0].pools if len(shared) == 1 and len(runs[0].pools) > 1 else None
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
        if pools is not None:
            ticks = [(r, f"{pool[0].upper()}{i}") for pool, m in pools for i, r in enumerate(m)]
            ax.set_xticks([r for r, _ in ticks], [text for _, text in ticks])
            ax.set_xlabel("replica (P prefill, D decode)")
        else:
            ax.set_xlabel(
                "replica" if all(len(r.pools) == 1 for r in runs) else "replica (prefill first)"
            )
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
