"""The replica plots a planner reads (issue 31, item 4): waiting requests are whole
numbers, drawn flat per bin; load is batch fill against the batch cap and KV use, not only
"busy"; beyond a few replicas a band (min to max) and the median replace a line each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from exec_models import FAST_LINEAR

from tokenyard.report import load_run
from tokenyard.report.plots import (
    MAX_REPLICA_LINES,
    _draw_series,
    _replica_series,
    batch_cap,
    binned_last,
    replica_fill,
)
from tokenyard.report.run import time_bins
from tokenyard.simulation import config_from_mapping, simulate


def run_into(folder: Path, *, replicas: int = 2, max_num_seqs: int = 4) -> Any:
    mapping = {
        "cluster": {"num_replicas": replicas},
        "replica": {
            "model": "llama-3.1-8b",
            "device": "h100-sxm",
            "scheduler": {"policy": "vllm_v1", "vllm_v1": {"max_num_seqs": max_num_seqs}},
        },
        "execution": FAST_LINEAR,
        "workload": {
            "kind": "synthetic",
            "num_requests": 200,
            "seed": 5,
            "arrival": {"kind": "poisson", "qps": 40.0},
            "prompt_tokens": {"kind": "uniform", "low": 20, "high": 300},
            "output_tokens": {"kind": "uniform", "low": 5, "high": 40},
        },
        "metrics": {"sample_interval_s": 0.0},
    }
    simulate(config_from_mapping(mapping)).write(folder)
    return load_run(folder)


def test_binned_last_keeps_whole_numbers_and_carries_forward() -> None:
    times = np.array([0.1, 0.2, 0.35, 0.9])
    values = np.array([3.0, 1.0, 2.0, 5.0])
    edges = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    # Bin ends 0.25, 0.5, 0.75, 1.0: the last sample at or before each (0.75 carries 2).
    assert binned_last(times, values, edges).tolist() == [1.0, 2.0, 2.0, 5.0]
    assert binned_last(times, values, np.array([0.0, 0.05])).tolist() == [0.0]


def test_waiting_requests_are_whole_numbers(tmp_path: Path) -> None:
    run = run_into(tmp_path / "run")
    edges = time_bins(run.makespan_s)
    per_replica = _replica_series(run, "waiting", edges)
    stacked = np.vstack(per_replica)
    assert stacked.max() > 0, "max_num_seqs 4 at 40 QPS queues requests"
    assert np.array_equal(stacked, np.round(stacked))
    # The cluster total (a sum of whole numbers) is whole too.
    assert np.array_equal(stacked.sum(axis=0), np.round(stacked.sum(axis=0)))


def test_batch_fill_is_against_the_configured_cap(tmp_path: Path) -> None:
    run = run_into(tmp_path / "run")
    assert batch_cap(run) == (4, "max_num_seqs")
    fill, kv = replica_fill(run)
    mean_batch = np.asarray(run.summary["replicas"]["mean_batch_size"])
    assert fill == pytest.approx(mean_batch * 100 / 4)
    assert (fill <= 100 + 1e-9).all()
    samples = run.samples
    for r in range(run.num_replicas):
        mine = samples["replica"] == r
        assert kv[r] == pytest.approx(100 * samples["kv_usage"][mine].mean())
    edges = time_bins(run.makespan_s)
    series = np.vstack(_replica_series(run, "batch_fill", edges))
    assert series.max() <= 100 + 1e-9
    assert series.max() > 50, "the queue keeps batches near the cap"


def test_an_unbounded_cap_is_shown_as_requests(tmp_path: Path) -> None:
    run = run_into(tmp_path / "run", max_num_seqs=0)
    assert batch_cap(run) is None
    fill, _ = replica_fill(run)
    assert fill == pytest.approx(np.asarray(run.summary["replicas"]["mean_batch_size"]))


@pytest.mark.parametrize("replicas", [MAX_REPLICA_LINES, MAX_REPLICA_LINES + 2])
def test_a_band_replaces_one_line_per_replica_beyond_a_few(replicas: int) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    edges = np.linspace(0, 10, 11)
    per_replica = [np.full(10, float(r)) for r in range(replicas)]
    _draw_series(ax, edges, per_replica, 1.0, 0, None, 1, "mean")  # type: ignore[arg-type]
    labels = [p.get_label() for p in ax.patches]
    plt.close(fig)
    if replicas <= MAX_REPLICA_LINES:
        assert labels == [f"replica {r}" for r in range(replicas)]
    else:
        assert labels == [f"min-max of {replicas} replicas", "replica median"]


def test_a_rerun_into_the_same_folder_leaves_nothing_of_the_earlier_run(tmp_path: Path) -> None:
    from tokenyard.cli import main as cli_main

    folder = tmp_path / "out"
    base = ["simulate", "--no-progress", "--requests", "200", "-o", str(folder)]
    assert cli_main([*base, "--stage-trace", "--plots", "png"]) == 0
    assert {"trace.json", "report.html", "plots", "command.txt"} <= {
        p.name for p in folder.iterdir()
    }
    outside = tmp_path / "mine.txt"
    outside.write_text("keep")
    # Nothing from the first run stays: no trace, report or plots of other results.
    assert cli_main(base) == 0
    names = {p.name for p in folder.iterdir()}
    assert "trace.json" not in names
    assert "report.html" not in names
    assert "plots" not in names
    assert "command.txt" in names, "this run's own"
    # Through the API: the CLI's command line is removed too, and a link is removed, not
    # what it points to.
    (folder / "report.html").symlink_to(outside)
    result = simulate(config_from_mapping({"workload": {**_SMALL}}))
    result.write(folder)
    assert not (folder / "command.txt").exists()
    assert not (folder / "report.html").exists()
    assert outside.read_text() == "keep"


_SMALL = {
    "kind": "synthetic",
    "num_requests": 50,
    "arrival": {"kind": "poisson", "qps": 5.0},
    "prompt_tokens": {"kind": "fixed", "value": 64},
    "output_tokens": {"kind": "fixed", "value": 8},
}


def test_a_whole_number_band_median_is_one_replicas_count() -> None:
    """Six replicas waiting 0..5: the median line is 2 (the lower middle), not 2.5."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    edges = np.linspace(0, 10, 11)
    per_replica = [np.full(10, float(r)) for r in range(6)]
    _draw_series(ax, edges, per_replica, 1.0, 0, None, 1, "sum", whole=True)  # type: ignore[arg-type]
    median = [p for p in ax.patches if p.get_label() == "replica median"]
    plt.close(fig)
    assert median[0].get_data().values.tolist() == [2.0] * 10


def pd_run_into(folder: Path, *, prefill: int, decode: int) -> Any:
    """A tiny P/D run (prefill replicas 0..prefill-1, then decode ones) whose decode pool
    caps batches at 8 against the prefill pool's 4."""
    scheduler = {"policy": "vllm_v1", "vllm_v1": {"max_num_seqs": 4}}
    mapping = {
        "cluster": {
            "num_replicas": prefill,
            "decode": {
                "num_replicas": decode,
                "scheduler": {"policy": "vllm_v1", "vllm_v1": {"max_num_seqs": 8}},
            },
        },
        "replica": {"model": "llama-3.1-8b", "device": "h100-sxm", "scheduler": scheduler},
        "execution": FAST_LINEAR,
        "workload": {
            "kind": "synthetic",
            "num_requests": 120,
            "seed": 3,
            "arrival": {"kind": "poisson", "qps": 30.0},
            "prompt_tokens": {"kind": "uniform", "low": 20, "high": 300},
            "output_tokens": {"kind": "uniform", "low": 5, "high": 40},
        },
        "metrics": {"sample_interval_s": 0.0},
    }
    simulate(config_from_mapping(mapping)).write(folder)
    return load_run(folder)


def test_a_pd_run_reports_both_pools(tmp_path: Path) -> None:
    """2 prefill + 1 decode replicas: three per-replica series, named by pool, the decode
    replica's batch fill against its own cap; the report draws (it crashed on a shape
    mismatch when only the prefill pool was counted)."""
    from tokenyard.report import write_report

    run = pd_run_into(tmp_path / "run", prefill=2, decode=1)
    assert run.num_replicas == 3
    assert run.replica_labels == ["prefill replica 0", "prefill replica 1", "decode replica 0"]
    edges = time_bins(run.makespan_s)
    kv = _replica_series(run, "kv_usage", edges)
    assert len(kv) == 3
    assert kv[2].max() > 0, "the decode replica holds KV"
    assert batch_cap(run, "decode") == (8, "max_num_seqs")
    fill, _ = replica_fill(run)
    batch = run.summary["replicas"]["mean_batch_size"]
    assert fill.tolist() == pytest.approx([batch[0] * 25, batch[1] * 25, batch[2] * 12.5])
    write_report(run.path)
    assert (run.path / "plots" / "over_time.png").is_file()
    assert (run.path / "plots" / "replicas.png").is_file()


def test_beyond_a_few_replicas_each_pd_pool_gets_its_own_band(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = pd_run_into(tmp_path / "run", prefill=3, decode=3)
    edges = time_bins(run.makespan_s)
    fig, ax = plt.subplots()
    per_replica = _replica_series(run, "kv_usage", edges)
    _draw_series(ax, edges, per_replica, 100.0, 0, run, 1, "mean")
    labels = [p.get_label() for p in ax.patches]
    plt.close(fig)
    assert labels == [
        "min-max of 3 prefill replicas",
        "prefill replica median",
        "min-max of 3 decode replicas",
        "decode replica median",
    ]
