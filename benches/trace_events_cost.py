"""What a trace-event export costs on the built-in job (docs/simulate.md, "Trace events"):
the run's wall time without a trace, with a 10 s window (every batch sampled, as
``tokenyard simulate --trace-events`` does), and with the whole run; the export alone; the
files' sizes and event counts. Medians of ``--repeat`` runs, in one process.

    .venv/bin/python benches/trace_events_cost.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenyard.simulation import SimulationConfig, simulate
from tokenyard.simulation.config import MetricsConfig
from tokenyard.simulation.trace_events import write_trace_events


def timed(config: SimulationConfig, repeat: int) -> tuple[float, Any]:
    walls, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = simulate(config, progress=None)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    base = SimulationConfig()
    simulate(base)  # builds the measured tables once, outside the timings
    cases: dict[str, MetricsConfig] = {
        "no trace": base.metrics,
        "10 s window": MetricsConfig(
            sample_interval_s=0.0,
            trace_events=str(folder / "window.json"),
            trace_window_s=(10.0, 20.0),
        ),
        "whole run": MetricsConfig(sample_interval_s=0.0, trace_events=str(folder / "all.json")),
    }
    rows = {}
    for name, metrics in cases.items():
        wall, result = timed(dataclasses.replace(base, metrics=metrics), args.repeat)
        rows[name] = {"wall_s": wall, "num_batches": result.summary["num_batches"]}
        if metrics.trace_events:
            path = Path(metrics.trace_events)
            other = json.loads(path.read_text())["otherData"]
            rows[name] |= {"bytes": path.stat().st_size, "events": other["num_events"]}
    # The export alone, from a result that kept its stages.
    kept = dataclasses.replace(
        base, metrics=MetricsConfig(sample_interval_s=0.0, record_stages=True)
    )
    result = simulate(kept)
    for name, window in (("10 s window", (10.0, 20.0)), ("whole run", ())):
        walls = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            write_trace_events(result, folder / "x.json", window_s=window)
            walls.append(time.perf_counter() - start)
        rows[name]["export_s"] = statistics.median(walls)
    base_wall = rows["no trace"]["wall_s"]
    for name, row in rows.items():
        row["ratio"] = row["wall_s"] / base_wall
        print(name, json.dumps(row))


if __name__ == "__main__":
    main()
