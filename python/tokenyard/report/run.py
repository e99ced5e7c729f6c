"""A finished run, read back from its results folder (what ``tokenyard simulate --output``
writes), and the series its plots and tables are drawn from.

Only what a picture needs is read: the summary, a few per-request columns, the sampled
replica state and the token-gap histogram. Every series is reduced to at most a few
hundred points per line before plotting (quantiles for distributions, time bins for
series), so a report of a million-request run costs what one of a thousand does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenyard.errors import ConfigError
from tokenyard.simulation.disagg_config import decode_schedulers

__all__ = ["Run", "cdf", "gap_cdf", "load_run", "time_bins"]

FloatArray = npt.NDArray[np.float64]

#: The per-request columns the plots read.
REQUEST_COLUMNS = (
    "replica",
    "arrived_at",
    "completed_at",
    "num_prefill_tokens",
    "num_decode_tokens",
    "prefix_hit_tokens",
    "ttft",
    "tpot",
    "e2e",
)
#: Read where present: the replica that prefilled a request handed to the decode pool
#: (-1 otherwise).
OPTIONAL_COLUMNS = ("prefill_replica",)


@dataclass(frozen=True)
class Run:
    """One results folder: ``summary`` (summary.json), ``requests`` (the columns above),
    ``samples`` (samples.parquet), ``token_gaps`` (token_gaps.parquet, if written),
    ``config`` (config.json, if written) and ``command`` (command.txt, if written)."""

    path: Path
    name: str
    summary: dict[str, Any]
    requests: dict[str, np.ndarray]
    samples: dict[str, np.ndarray]
    token_gaps: dict[str, np.ndarray] | None
    config: dict[str, Any] | None
    command: str | None

    @property
    def num_replicas(self) -> int:
        """Schedulers, as the per-replica columns number them: each attention DP rank of
        a replica is one (``data_parallel_size``, absent before it existed: 1), and in a
        disaggregated run the decode pool's replicas follow the prefill pool's."""
        return sum(len(members) for _, members in self.pools)

    @property
    def pools(self) -> list[tuple[str, range]]:
        """Each pool's name and its replicas' numbers: ``("prefill", ...)`` then
        ``("decode", ...)`` for a disaggregated run (summary ``config.decode``), else one
        pool named ``""``."""
        config = self.summary["config"]
        first = int(config["num_replicas"]) * int(config.get("data_parallel_size", 1))
        decode = config.get("decode")
        if not decode:
            return [("", range(first))]
        return [
            ("prefill", range(first)),
            ("decode", range(first, first + decode_schedulers(decode))),
        ]

    @property
    def replica_labels(self) -> list[str]:
        """Each replica's name in plots: ``replica r``, or ``prefill replica i`` /
        ``decode replica j`` (numbered within the pool) in a disaggregated run."""
        return [
            f"{pool} replica {i}" if pool else f"replica {r}"
            for pool, members in self.pools
            for i, r in enumerate(members)
        ]

    @property
    def makespan_s(self) -> float:
        return float(self.summary["makespan_s"])


def _missing(path: Path, what: str) -> ConfigError:
    return ConfigError(
        f"{path}: not a tokenyard results folder ({what}); write one with "
        "`tokenyard simulate --output DIR`",
        field="run",
        value=str(path),
    )


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Reads a results folder.

    Raises:
        ConfigError: the folder or one of its required files (summary.json,
            requests.parquet, samples.parquet) is missing or unreadable (``field`` "run").
    """
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    folder = Path(path)
    if not folder.is_dir():
        raise _missing(folder, "no such folder")
    try:
        summary = json.loads((folder / "summary.json").read_text())
        table = folder / "requests.parquet"
        # A P/D run's prefill replicas (older folders, from before P/D, have no column).
        extra = [c for c in OPTIONAL_COLUMNS if c in pq.read_schema(table).names]
        requests = pq.read_table(table, columns=[*REQUEST_COLUMNS, *extra])
        samples = pq.read_table(folder / "samples.parquet")
    except (OSError, ValueError, KeyError) as exc:
        raise _missing(folder, str(exc).splitlines()[0]) from None
    gaps_path, config_path = folder / "token_gaps.parquet", folder / "config.json"
    command_path = folder / "command.txt"
    return Run(
        path=folder,
        name=name or folder.resolve().name,
        summary=summary,
        requests={c: requests.column(c).to_numpy() for c in requests.column_names},
        samples={c: samples.column(c).to_numpy() for c in samples.column_names},
        token_gaps=(
            {c: v.to_numpy() for c, v in zip(*_columns(pq.read_table(gaps_path)), strict=True)}
            if gaps_path.is_file()
            else None
        ),
        config=json.loads(config_path.read_text()) if config_path.is_file() else None,
        command=command_path.read_text().strip() if command_path.is_file() else None,
    )


def _columns(table: Any) -> tuple[list[str], list[Any]]:
    return table.column_names, [table.column(c) for c in table.column_names]


def cdf(values: FloatArray, points: int = 400) -> tuple[FloatArray, FloatArray]:
    """``(value, fraction of requests at or below it)`` at ``points`` evenly spaced
    quantiles (the whole curve's shape, whatever the number of requests)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return np.zeros(0), np.zeros(0)
    fractions = np.linspace(0.0, 1.0, min(points, values.size))
    return np.quantile(values, fractions), fractions


def gap_cdf(gaps: dict[str, np.ndarray]) -> tuple[FloatArray, FloatArray]:
    """The inter-token gap CDF from its histogram: at each bucket's upper bound, the
    fraction of gaps below it (exact up to the 2.3%-wide buckets)."""
    counts = gaps["count"].astype(np.float64)
    total = counts.sum()
    if total == 0:
        return np.zeros(0), np.zeros(0)
    keep = counts > 0
    cumulative = np.cumsum(counts) / total
    return np.asarray(gaps["high_s"], dtype=np.float64)[keep], cumulative[keep]


def time_bins(makespan_s: float, bins: int = 200) -> FloatArray:
    """``bins + 1`` evenly spaced edges over the run."""
    return np.linspace(0.0, max(makespan_s, 1e-9), bins + 1)


def binned_mean(times: FloatArray, values: FloatArray, edges: FloatArray) -> FloatArray:
    """The mean of ``values`` per time bin (NaN where a bin has none)."""
    index = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, len(edges) - 2)
    sums = np.bincount(index, weights=values, minlength=len(edges) - 1)
    counts = np.bincount(index, minlength=len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def binned_rate(
    times: FloatArray, edges: FloatArray, weights: FloatArray | None = None
) -> FloatArray:
    """Events (or ``weights``) per second in each time bin."""
    counts, _ = np.histogram(times, bins=edges, weights=weights)
    return counts / np.diff(edges)
