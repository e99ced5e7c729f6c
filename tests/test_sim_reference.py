"""The Rust simulator against the pure-Python reference (tests/sim_reference.py) for Vidur's
vLLM and Sarathi replica schedulers: identical per-request times on random workloads, tight
memory (preemption by restart) and pipeline stages included."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_reference import Limits, Req
from sim_reference import simulate as reference

from tokenyard.simulation import config_from_mapping, simulate


def run_rust(
    path: Path,
    arrivals: list[tuple[float, int, int]],
    *,
    policy: str,
    num_replicas: int,
    num_stages: int,
    num_blocks: int,
    chunk_size: int,
    batch_size_cap: int = 6,
    watermark_blocks_fraction: float = 0.1,
    step_time: tuple[float, float, float] = (1.0, 0.01, 0.1),
) -> dict[str, np.ndarray]:
    """The Rust simulator on ``arrivals`` (block size 4; ``step_time`` as the reference
    takes it); per-request columns in request-id order."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        writer.writerows(arrivals)
    config = config_from_mapping(
        {
            "cluster": {"num_replicas": num_replicas},
            "replica": {
                "num_pipeline_stages": num_stages,
                "model": "llama-2-7b",
                "scheduler": {
                    "policy": policy,
                    "block_size": 4,
                    "num_blocks": num_blocks,
                    "watermark_blocks_fraction": watermark_blocks_fraction,
                    "batch_size_cap": batch_size_cap,
                    "max_tokens_in_batch": 48,
                    "chunk_size": chunk_size,
                    "max_request_tokens": 64,
                },
            },
            "execution": {
                "model": "linear",
                "constant_s": step_time[0],
                "per_prefill_token_s": step_time[1],
                "per_decode_token_s": step_time[2],
                "per_decode_context_token_s": 0.0,
                "per_prefill_context_token_s": 0.0,
                "cpu_overhead_s": 0.0,
            },
            "workload": {"kind": "trace", "format": "vidur", "path": str(path)},
        }
    )
    return simulate(config).columns


def assert_same_times(rust: dict[str, np.ndarray], expected: list[Req]) -> None:
    assert np.array_equal(rust["first_token_at"], [r.first_token_at for r in expected])
    assert np.array_equal(rust["completed_at"], [r.completed_at for r in expected])
    assert np.array_equal(rust["scheduled_at"], [r.scheduled_at for r in expected])
    assert list(rust["num_restarts"]) == [r.restarts for r in expected]


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0]), min_size=1, max_size=30),
    data=st.data(),
    policy=st.sampled_from(["vllm", "sarathi"]),
    num_replicas=st.integers(1, 3),
    num_stages=st.integers(1, 3),
    num_blocks=st.integers(12, 40),
    chunk_size=st.integers(4, 32),
)
def test_rust_matches_the_reference(
    tmp_path_factory: pytest.TempPathFactory,
    gaps: list[float],
    data: st.DataObject,
    policy: str,
    num_replicas: int,
    num_stages: int,
    num_blocks: int,
    chunk_size: int,
) -> None:
    arrivals = []
    now = 0.0
    for i, gap in enumerate(gaps):
        now += gap if i else 0.0  # the trace reader starts the first arrival at 0
        arrivals.append((now, data.draw(st.integers(1, 30)), data.draw(st.integers(1, 12))))
    stages = 1 if num_stages == 3 else num_stages
    rust = run_rust(
        tmp_path_factory.mktemp("ref") / "trace.csv",
        arrivals,
        policy=policy,
        num_replicas=num_replicas,
        num_stages=stages,
        num_blocks=num_blocks,
        chunk_size=chunk_size,
    )
    # The planner's batch size for 64-token requests on an A100 is far above the cap.
    limits = Limits(
        num_blocks=num_blocks,
        block_size=4,
        watermark_blocks=int(0.1 * num_blocks),
        batch_size_cap=6,
        max_micro_batch_size=max(1, 6 // stages),
        max_tokens_in_batch=48,
        chunk_size=chunk_size,
    )
    expected = reference(
        arrivals,
        policy=policy,
        limits=limits,
        num_replicas=num_replicas,
        num_stages=stages,
        step_time=(1.0, 0.01, 0.1),
    )
    assert_same_times(rust, expected)


def test_sarathi_victim_is_the_last_request_of_the_latest_batch(tmp_path: Path) -> None:
    """Vidur 0.0.26's Sarathi restarts the back of its running list (the ended batches in
    order), not the latest arrival. Two stages, 4 blocks, chunk 4, two requests a batch: at
    t = 4 the batch [C decode, B chunk] has ended with every block taken; C needs a free
    block and B, the last of that batch though it arrived first, is the victim (again at
    t = 5, as B comes back last each time), while C never restarts. Sorting by arrival
    first would leave C no victim: C restarted itself."""
    arrivals = [(0.0, 6, 2), (0.5, 4, 4), (1.0, 4, 4)]
    limits = Limits(
        num_blocks=4,
        block_size=4,
        watermark_blocks=0,
        batch_size_cap=4,
        max_micro_batch_size=2,
        max_tokens_in_batch=48,
        chunk_size=4,
    )
    step_time = (1.0, 0.0, 0.0)
    expected = reference(
        arrivals, policy="sarathi", limits=limits, num_replicas=1, num_stages=2, step_time=step_time
    )
    assert [r.restarts for r in expected] == [0, 3, 0]
    assert (expected[2].first_token_at, expected[2].completed_at) == (3.0, 6.0)
    rust = run_rust(
        tmp_path / "trace.csv",
        arrivals,
        policy="sarathi",
        num_replicas=1,
        num_stages=2,
        num_blocks=4,
        chunk_size=4,
        batch_size_cap=4,
        watermark_blocks_fraction=0.0,
        step_time=step_time,
    )
    assert_same_times(rust, expected)
