"""What a search keeps: one JSON record per grid point (written as the point finishes, so
an interrupted search resumes), and the tables assembled from them.

Output folder::

    points/<key>.json     one per point: its overrides, layout, capacities, probes
    results.parquet       one row per (point, SLO set): capacity, cost, metrics, breaks
    probes.parquet        one row per simulation
    summary.txt           the table printed at the end
    search.json           the search config, the best point per SLO set, the Pareto front

A point's ``key`` is a hash of everything that decides its simulations (its whole
simulation document, the files it names — catalog files, profiles, the trace — by content
or, past 16 MiB, by size and modification time, the SLO sets, the search knobs and
tokenyard's version): a re-run skips the points whose record is already there, and any
change to them gives a new key. Prices and budgets are
applied when the tables are assembled, so changing a price (or ``target_qps``,
``pareto_metric``) re-runs nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Point", "PointRecord", "load_records", "point_key", "write_record"]

FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Point:
    """One deployment of the grid. ``overrides``: the dotted keys the grid and variant set
    (``variant``: the variant's ``name``, if it has one);
    ``simulation``: the whole simulation document; ``layout``: model, device, replicas,
    TP, DP, EP, PP and GPUs (``gpu_pools``); ``skip``: why it is not simulated (``None``:
    it is)."""

    index: int
    overrides: Mapping[str, Any]
    simulation: Mapping[str, Any]
    layout: Mapping[str, Any]
    price_per_gpu_hour: float | None
    key: str
    variant: str | None = None
    skip: str | None = None

    @property
    def cost_per_hour(self) -> float | None:
        if self.price_per_gpu_hour is None:
            return None
        return float(self.layout["num_gpus"]) * self.price_per_gpu_hour


#: A point's record: ``key``, ``index``, ``overrides``, ``layout``, ``status`` (ok,
#: skipped, error), ``reason``, ``capacities`` (SLO set -> CapacityResult dict), ``breaks``
#: (SLO set -> key -> held/break rates), ``probes`` (Probe dicts).
PointRecord = dict[str, Any]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def point_key(simulation: Mapping[str, Any], slos: Sequence[Any], search: Mapping[str, Any]) -> str:
    """A stable hash (hex, 16 characters) of what decides a point's simulations."""
    from tokenyard import __version__

    doc = {k: v for k, v in simulation.items() if k != "base_dir"}
    files = {name: _file_identity(path) for name, path in _named_files(simulation)}
    text = _canonical(
        {
            "format": FORMAT,
            "version": __version__,
            "simulation": doc,
            "files": files,
            "slos": slos,
            "search": search,
        }
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _named_files(simulation: Mapping[str, Any]) -> list[tuple[str, Path]]:
    """The files a simulation document names, resolved against its ``base_dir``."""
    base = Path(simulation.get("base_dir") or ".")
    profiled = simulation.get("execution", {}).get("profiled", {})
    names = [*simulation.get("catalog", ()), *profiled.get("profiles", ())]
    workload = simulation.get("workload", {})
    if isinstance(workload.get("path"), str):
        names.append(workload["path"])
    out = []
    for name in names:
        path = base / name
        inside = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        out += [(str(p), p) for p in inside]
    return out


_WHOLE_FILE_LIMIT = 16 * 1024 * 1024


def _file_identity(path: Path) -> str:
    try:
        stat = path.stat()
    except OSError:
        return "missing"
    if stat.st_size > _WHOLE_FILE_LIMIT:  # a big trace: hashing it per point costs too much
        return f"{stat.st_size}:{stat.st_mtime_ns}"
    return _content_digest(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _content_digest(path: str, size: int, mtime_ns: int) -> str:
    del size, mtime_ns  # part of the cache key: a changed file is read again
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_record(directory: Path, record: PointRecord) -> None:
    """Writes ``points/<key>.json`` atomically (a temporary file moved in place). A link
    named ``points`` is replaced by a folder, never followed (as ``tokenyard._output``
    does with every output)."""
    folder = directory / "points"
    if folder.is_symlink():
        folder.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".point-", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, folder / f"{record['key']}.json")


def load_records(directory: Path) -> dict[str, PointRecord]:
    """The records already in ``directory`` (unreadable ones are ignored: re-run; none are
    read through a link named ``points``, which ``write_record`` replaces)."""
    if (directory / "points").is_symlink():
        return {}
    out = {}
    for path in sorted((directory / "points").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("key") == path.stem:
            out[path.stem] = record
    return out
