"""What a search keeps: one JSON record per grid point (written as the point finishes, so
an interrupted search resumes), and the tables assembled from them.

Output folder::

    points/<key>.json     one per point: its overrides, layout, capacities, probes
    results.parquet       one row per (point, SLO set): capacity, cost, metrics, breaks
    probes.parquet        one row per simulation
    summary.txt           the table printed at the end
    search.json           the search config, the best point per SLO set, the Pareto front

A point's ``key`` is a hash of everything that decides its simulations (its whole
simulation document, the SLO sets and the search knobs): a re-run skips the points whose
record is already there, and any change to them gives a new key. Prices and budgets are
applied when the tables are assembled, so changing a price (or ``target_qps``,
``pareto_metric``) re-runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PointRecord", "load_records", "point_key", "write_record"]

FORMAT = 1

#: A point's record: ``key``, ``index``, ``overrides``, ``layout``, ``status`` (ok,
#: skipped, error), ``reason``, ``capacities`` (SLO set -> CapacityResult dict), ``breaks``
#: (SLO set -> key -> held/break rates), ``probes`` (Probe dicts).
PointRecord = dict[str, Any]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def point_key(simulation: Mapping[str, Any], slos: Sequence[Any], search: Mapping[str, Any]) -> str:
    """A stable hash (hex, 16 characters) of what decides a point's simulations."""
    doc = {k: v for k, v in simulation.items() if k != "base_dir"}
    if "base_dir" in simulation and doc.get("workload", {}).get("kind") == "trace":
        doc["base_dir"] = str(simulation["base_dir"])  # a relative trace path depends on it
    text = _canonical({"format": FORMAT, "simulation": doc, "slos": slos, "search": search})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_record(directory: Path, record: PointRecord) -> None:
    """Writes ``points/<key>.json`` atomically (a temporary file moved in place)."""
    folder = directory / "points"
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".point-", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, folder / f"{record['key']}.json")


def load_records(directory: Path) -> dict[str, PointRecord]:
    """The records already in ``directory`` (unreadable ones are ignored: re-run)."""
    out = {}
    for path in sorted((directory / "points").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("key") == path.stem:
            out[path.stem] = record
    return out
