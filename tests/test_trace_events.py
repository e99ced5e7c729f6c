"""The Chrome / Perfetto trace-event export (docs/simulate.md, "Trace events"): the file a
loader reads (every event has its phase's keys, microsecond times in order on each track,
processes and threads named), its content against the run's own tables, its bounds (a
window, a request range, a cap that says it cut), determinism, P/D pools named as such,
and malformed options refused naming their key."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from exec_models import FAST_LINEAR

from tokenyard.errors import ConfigError
from tokenyard.simulation import simulate
from tokenyard.simulation.config import config_from_mapping
from tokenyard.simulation.trace_events import REQUESTS_TID, trace_events

#: The keys each phase needs (the Trace Event Format: "X" complete events carry ``dur``;
#: "i" instant events a scope ``s``; "M" metadata names a process or thread).
REQUIRED = {
    "X": {"name", "ph", "ts", "dur", "pid", "tid"},
    "i": {"name", "ph", "ts", "pid", "tid", "s"},
    "M": {"name", "ph", "pid", "tid", "args"},
}


def mapping(**metrics: Any) -> dict[str, Any]:
    return {
        "cluster": {"num_replicas": 2},
        "replica": {"model": "llama-3.1-8b", "device": "h100-sxm", "num_pipeline_stages": 2},
        "execution": FAST_LINEAR,
        "workload": {
            "kind": "synthetic",
            "num_requests": 120,
            "seed": 3,
            "arrival": {"kind": "poisson", "qps": 30.0},
            "prompt_tokens": {"kind": "uniform", "low": 16, "high": 900},
            "output_tokens": {"kind": "uniform", "low": 1, "high": 60},
        },
        "metrics": {"sample_interval_s": 0.0, **metrics},
    }


def load(path: Path) -> dict[str, Any]:
    """Reads a trace file as a trace-event loader would, checking the format on the way."""
    document: dict[str, Any] = json.loads(path.read_text())
    assert set(document) >= {"traceEvents", "displayTimeUnit", "otherData"}
    named_processes, named_threads = set(), set()
    last: dict[tuple[int, int], float] = defaultdict(lambda: -1.0)
    stage_end: dict[tuple[int, int], float] = defaultdict(lambda: -1.0)
    for event in document["traceEvents"]:
        ph = event["ph"]
        assert ph in REQUIRED, event
        missing = REQUIRED[ph] - set(event)
        assert not missing, (missing, event)
        assert isinstance(event["pid"], int)
        assert isinstance(event["tid"], int)
        if ph == "M":
            assert event["name"] in (
                "process_name",
                "process_sort_index",
                "thread_name",
                "thread_sort_index",
            )
            if event["name"] == "process_name":
                named_processes.add(event["pid"])
            elif event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
            continue
        assert isinstance(event["ts"], float)
        assert event["ts"] >= 0
        track = (event["pid"], event["tid"])
        if event.get("s") != "g":  # a global note is on no track
            assert event["pid"] in named_processes, f"process {event['pid']} unnamed"
            assert track in named_threads, f"thread {track} unnamed"
        assert event["ts"] >= last[track], f"time goes back on {track}: {event}"
        last[track] = event["ts"]
        if ph == "X":
            assert event["dur"] >= 0
            assert event["ts"] >= stage_end[track] - 1e-3, f"slices overlap on {track}"
            stage_end[track] = event["ts"] + event["dur"]
    return document


def events(document: dict[str, Any], ph: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        e for e in document["traceEvents"] if e["ph"] == ph and (name is None or e["name"] == name)
    ]


def test_the_whole_run_is_every_batch_stage_arrival_and_completion(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    result = simulate(config_from_mapping(mapping(trace_events=str(path))))
    assert result.stages is None, "the result keeps stages only when record_stages asks"
    document = load(path)
    other = document["otherData"]
    assert other["truncated"] is False
    assert other["kv_use"].startswith("each batch's own")
    slices = events(document, "X")
    n = int(result.summary["num_requests"])
    assert len(slices) == 2 * int(result.summary["num_batches"]), "2 stages per batch"
    assert len(events(document, "i", "arrival")) == n
    completions = events(document, "i", "completion")
    assert len(completions) == n
    assert {e["tid"] for e in completions} == {REQUESTS_TID}
    # Each batch's tokens summed over its slices of stage 0 are the run's totals.
    first = [e for e in slices if e["tid"] == 0]
    prompt = int(result.columns["num_prefill_tokens"].sum())
    assert sum(e["args"]["prefill_tokens"] for e in first) >= prompt  # recompute adds more
    busy = sum(e["dur"] for e in slices) / 1e6
    replicas = result.summary["replicas"]
    makespan = result.summary["makespan_s"]
    expected = sum(replicas["busy_fraction"]) * 2 * makespan  # busy_fraction is per stage
    assert busy == pytest.approx(expected, rel=1e-6)
    # KV: each batch's own sample, the same on both stages of the batch.
    kv = {e["args"]["batch_id"]: e["args"]["kv_use_fraction"] for e in first}
    samples = result.samples["kv_usage"]
    assert all(kv[b] == pytest.approx(samples[b], abs=1e-6) for b in kv)
    for e in slices:
        assert e["args"]["kv_use_fraction"] == kv[e["args"]["batch_id"]]
        assert (
            e["args"]["kv_blocks_used"]
            == round(e["args"]["kv_use_fraction"] * result.summary["config"]["num_blocks"])
            or abs(
                e["args"]["kv_blocks_used"]
                - e["args"]["kv_use_fraction"] * result.summary["config"]["num_blocks"]
            )
            <= 1
        )
    names = {e["args"]["name"] for e in events(document, "M", "process_name")}
    assert names == {"cluster", "replica 0", "replica 1"}
    threads = {e["args"]["name"] for e in events(document, "M", "thread_name")}
    assert threads == {"arrivals (routing)", "stage 0", "stage 1", "requests"}


def test_a_window_keeps_what_overlaps_it_and_is_smaller(tmp_path: Path) -> None:
    whole, part = tmp_path / "whole.json", tmp_path / "part.json"
    simulate(config_from_mapping(mapping(trace_events=str(whole))))
    simulate(config_from_mapping(mapping(trace_events=str(part), trace_window_s=[1.0, 2.0])))
    document = load(part)
    assert document["otherData"]["window_s"] == [1.0, 2.0]
    for e in events(document, "X"):
        assert e["ts"] <= 2e6
        assert e["ts"] + e["dur"] >= 1e6 - 1e-3
    instants = events(document, "i")
    assert instants
    assert all(1e6 <= e["ts"] <= 2e6 for e in instants)
    assert 0 < len(document["traceEvents"]) < len(load(whole)["traceEvents"]) / 2
    assert part.stat().st_size < whole.stat().st_size / 2


def test_a_request_range_shows_those_requests_and_the_batches_while_they_ran(
    tmp_path: Path,
) -> None:
    path = tmp_path / "trace.json"
    result = simulate(config_from_mapping(mapping(trace_events=str(path), trace_requests=[10, 20])))
    document = load(path)
    arrivals = events(document, "i", "arrival")
    assert sorted(e["args"]["request_id"] for e in arrivals) == list(range(10, 20))
    done = sorted(e["args"]["request_id"] for e in events(document, "i", "completion"))
    assert done == list(range(10, 20))
    c = result.columns
    start, end = c["arrived_at"][10:20].min() * 1e6, c["completed_at"][10:20].max() * 1e6
    slices = events(document, "X")
    assert slices
    assert all(e["ts"] <= end + 1e-3 and e["ts"] + e["dur"] >= start - 1e-3 for e in slices)


def test_the_cap_cuts_the_trace_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    simulate(config_from_mapping(mapping(trace_events=str(path), trace_max_events=50)))
    document = load(path)
    other = document["otherData"]
    assert other["truncated"] is True
    assert other["num_events"] == 50
    assert other["num_selected"] > 50
    assert "TRUNCATED" in other["note"]
    data = [e for e in document["traceEvents"] if e["ph"] != "M"]
    assert len(data) == 51, "50 events and the global note"
    assert data[-1]["s"] == "g"
    assert data[-1]["name"] == other["note"]
    assert path.stat().st_size < 30_000


def test_the_same_run_writes_the_same_bytes(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    simulate(config_from_mapping(mapping(trace_events=str(a))))
    simulate(config_from_mapping(mapping(trace_events=str(b))))
    assert a.read_bytes() == b.read_bytes()


def test_sampled_kv_is_labelled_as_such(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    simulate(config_from_mapping(mapping(trace_events=str(path), sample_interval_s=0.5)))
    document = load(path)
    assert "latest sample" in document["otherData"]["kv_use"]


def test_pd_pools_are_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    m = mapping(trace_events=str(path))
    m["cluster"] = {"num_replicas": 2, "decode": {"num_replicas": 1}}
    m["replica"]["num_pipeline_stages"] = 1
    result = simulate(config_from_mapping(m))
    document = load(path)
    names = {e["args"]["name"] for e in events(document, "M", "process_name")}
    assert names == {"cluster", "prefill replica 0", "prefill replica 1", "decode replica 0"}
    handed = result.columns["prefill_replica"] >= 0
    assert handed.any()
    routed = {e["args"]["routed_to"] for e in events(document, "i", "arrival")}
    assert routed <= {"prefill replica 0", "prefill replica 1"}
    decode_pid = 3
    done = [e for e in events(document, "i", "completion") if e["pid"] == decode_pid]
    assert len(done) == int(handed.sum())


@pytest.mark.parametrize(
    ("metrics", "field"),
    [
        ({"trace_window_s": [2.0, 1.0]}, "metrics.trace_window_s"),
        ({"trace_window_s": [1.0]}, "metrics.trace_window_s"),
        ({"trace_requests": [5, 5]}, "metrics.trace_requests"),
        ({"trace_max_events": 0}, "metrics.trace_max_events"),
        ({"trace_events": ""}, "metrics.trace_events"),
    ],
)
def test_malformed_options_are_refused_naming_the_key(metrics: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(mapping(**metrics))
    assert info.value.field == field


def test_the_record_without_stages_is_refused() -> None:
    result = simulate(config_from_mapping(mapping()))
    with pytest.raises(ConfigError, match="record_stages"):
        trace_events(result)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenyard", "simulate", "--no-progress", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


def test_cli_writes_a_windowed_trace_with_each_batchs_kv(tmp_path: Path) -> None:
    config = tmp_path / "job.json"
    m = mapping()
    del m["metrics"]  # the CLI samples every batch itself when it writes trace events
    config.write_text(json.dumps(m))
    done = cli(str(config), "--trace-events", "t.json", "--trace-window", "0.5:1.5", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = load(tmp_path / "t.json")
    assert document["otherData"]["window_s"] == [0.5, 1.5]
    assert document["otherData"]["kv_use"].startswith("each batch's own")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--trace-window", "1:2"), "--trace-window: needs --trace-events"),
        (("--trace-events", "t.json", "--trace-window", "1-2"), "--trace-window: must be"),
        (("--trace-events", "t.json", "--trace-requests", "a:b"), "--trace-requests: must be"),
    ],
)
def test_cli_refuses_bad_trace_flags(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    config = tmp_path / "job.json"
    config.write_text(json.dumps(mapping()))
    done = cli(str(config), *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "t.json").exists()


def test_slices_never_overlap_on_a_stage_across_a_long_run(tmp_path: Path) -> None:
    """The microsecond rounding keeps each stage's slices in order (a monotone map)."""
    path = tmp_path / "trace.json"
    m = mapping(trace_events=str(path))
    m["workload"]["num_requests"] = 400
    simulate(config_from_mapping(m))
    document = load(path)
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events(document, "X"):
        by_track[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        starts = np.array([s for s, _ in spans])
        ends = np.array([e for _, e in spans])
        assert (starts[1:] >= ends[:-1] - 1e-3).all()


def test_a_config_files_trace_path_is_taken_from_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    m = mapping(trace_events="t.json")
    (folder / "job.json").write_text(json.dumps(m))
    done = cli(str(folder / "job.json"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (folder / "t.json").exists()
    assert not (tmp_path / "t.json").exists()


def test_a_trace_events_file_in_the_output_folder_survives_the_results(tmp_path: Path) -> None:
    """`--trace-events out/trace.json -o out`: writing the results neither removes the
    file (as an earlier run's stale stage trace) nor, with `--stage-trace`, writes the
    whole-run stage trace over the windowed one asked for."""
    config = tmp_path / "job.json"
    config.write_text(json.dumps(mapping()))
    out = tmp_path / "out"
    done = cli(str(config), "--trace-events", "out/trace.json", "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"trace events: {out / 'trace.json'}" in done.stdout
    whole = load(out / "trace.json")
    assert whole["otherData"]["window_s"][0] == 0.0
    done = cli(
        str(config),
        *("--trace-events", "out/trace.json", "--trace-window", "1:2"),
        *("--stage-trace", "-o", "out"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert load(out / "trace.json")["otherData"]["window_s"] == [1.0, 2.0]


def test_the_results_stage_trace_is_the_trace_event_export(tmp_path: Path) -> None:
    """`record_stages` writes `trace.json` through the one exporter: the whole run's
    slices, arrivals and completions, as `trace_events` builds them."""
    result = simulate(config_from_mapping(mapping(record_stages=True)))
    out = result.write(tmp_path / "out")
    document = load(out / "trace.json")
    assert document == json.loads(json.dumps(trace_events(result)[0]))
    assert len(events(document, "X")) == len(result.stages["batch_id"])  # type: ignore[index]
    assert len(events(document, "i", "completion")) == len(result.columns["request_id"])


def test_a_trace_events_file_named_as_a_result_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = simulate(config_from_mapping(mapping(trace_events=str(out / "summary.json"))))
    with pytest.raises(ConfigError, match=r"metrics\.trace_events: names .*summary\.json"):
        result.write(out)
    assert json.loads((out / "summary.json").read_text())["otherData"], "the trace is kept"


def test_the_cli_refuses_a_trace_events_file_named_as_a_result_before_the_run(
    tmp_path: Path,
) -> None:
    config = tmp_path / "job.json"
    config.write_text(json.dumps(mapping()))
    done = cli(str(config), "--trace-events", "out/requests.csv", "-o", "out", cwd=tmp_path)
    assert done.returncode == 2
    assert "metrics.trace_events: names" in done.stderr
    assert not (tmp_path / "out" / "requests.csv").exists(), "refused before the run"
