"""What makes ``tokenyard recommend`` faster must not change what it answers: the rows'
figures come from the verified run itself (not a second simulation of it), and the
per-process caches of the files every simulation reads notice a rewritten file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from test_recommend import LINEAR  # TP buys nothing: the small, fast step model

from tokenyard.recommend.recommend import Ask, point_config, recommend
from tokenyard.search.capacity import run_probe
from tokenyard.search.executors import SerialExecutor


class Counting(SerialExecutor):
    """The serial executor, counting the simulations it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def submit(self, tag: Any, payload: dict[str, Any]) -> None:
        self.runs += 1
        super().submit(tag, payload)


@pytest.fixture(scope="module")
def counted() -> tuple[Any, Counting]:
    ask = Ask(
        model="llama-3.1-8b",
        systems=("h100_sxm",),
        workload={
            "kind": "synthetic",
            "num_requests": 1000,
            "arrival": {"kind": "poisson", "qps": 1.0},
            "prompt_tokens": {"kind": "fixed", "value": 200},
            "output_tokens": {"kind": "fixed", "value": 50},
        },
        slo={"ttft_p90_s": 0.5, "tpot_p90_s": 0.05},
        gpus=2,
        sample=300,
        execution=LINEAR,
        disaggregated=False,
        top_k=2,
        show=2,
    )
    executor = Counting()
    return recommend(ask, executor=executor), executor


def test_the_rows_come_from_the_verified_runs(counted: tuple[Any, Counting]) -> None:
    """Each recommended point's summary is its verified run's, the same as simulating that
    point again; no simulation is run beyond the executor's."""
    rec, executor = counted
    assert rec.points
    assert rec.num_simulations == executor.runs
    for (sim, verdict), summary in zip(rec.points, rec.summaries, strict=True):
        assert verdict.summary is summary
        again = point_config(rec.ask, sim, verdict)[1]
        assert summary["throughput"] == again["throughput"]
        assert summary["replicas"]["mean_busy_fraction"] == again["replicas"]["mean_busy_fraction"]
        assert summary["num_requests"] == verdict.num_requests == 1000


def test_a_probe_keeps_its_summary_only_when_asked(counted: tuple[Any, Counting]) -> None:
    rec, _ = counted
    sim, verdict = rec.points[0]
    doc = sim.candidate.simulation(rec.ask.base(rec.ask.whole_workload()), rec.ask.policy)
    plain = run_probe({"simulation": doc, "rate": verdict.rate})
    kept = run_probe({"simulation": doc, "rate": verdict.rate, "keep_summary": True})
    assert "summary" not in plain
    assert kept["summary"]["throughput"] == rec.summaries[0]["throughput"]
    assert {k: v for k, v in kept.items() if k not in ("summary", "wall_s")} == {
        k: v for k, v in plain.items() if k != "wall_s"
    }


def test_a_rewritten_query_versions_file_is_read_again(tmp_path: Path) -> None:
    from tokenyard.predictor.measured.data import _current_version

    root = tmp_path / "systems" / "data"
    root.mkdir(parents=True)
    versions = tmp_path / "systems" / "query_versions.yaml"
    versions.write_text("defaults:\n  vllm:\n    current: 0.10.0\n")
    assert _current_version(root, "h100_sxm", "vllm") == "0.10.0"
    versions.write_text("defaults:\n  vllm:\n    current: 0.12.0\n")
    stat = versions.stat()
    os.utime(versions, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert _current_version(root, "h100_sxm", "vllm") == "0.12.0"
