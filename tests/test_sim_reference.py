"""The Rust simulator against the pure-Python reference (tests/sim_reference.py) for Vidur's
vLLM and Sarathi replica schedulers: identical per-request times on random workloads, tight
memory (preemption by restart) and pipeline stages included."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_reference import Limits
from sim_reference import simulate as reference

from tokenyard.simulation import config_from_mapping, simulate


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
    path = tmp_path_factory.mktemp("ref") / "trace.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        writer.writerows(arrivals)
    block_size = 4
    config = config_from_mapping(
        {
            "cluster": {"num_replicas": num_replicas},
            "replica": {
                "num_pipeline_stages": 1 if num_stages == 3 else num_stages,
                "model": "llama-2-7b",
                "scheduler": {
                    "policy": policy,
                    "block_size": block_size,
                    "num_blocks": num_blocks,
                    "watermark_blocks_fraction": 0.1,
                    "batch_size_cap": 6,
                    "max_tokens_in_batch": 48,
                    "chunk_size": chunk_size,
                    "max_request_tokens": 64,
                },
            },
            "execution": {
                "model": "linear",
                "constant_s": 1.0,
                "per_prefill_token_s": 0.01,
                "per_decode_token_s": 0.1,
                "per_decode_context_token_s": 0.0,
                "per_prefill_context_token_s": 0.0,
                "cpu_overhead_s": 0.0,
            },
            "workload": {"kind": "trace", "format": "vidur", "path": str(path)},
        }
    )
    stages = config.replica.num_pipeline_stages
    rust = simulate(config).columns
    # The planner's batch size for 64-token requests on an A100 is far above the cap.
    limits = Limits(
        num_blocks=num_blocks,
        block_size=block_size,
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
    assert np.array_equal(rust["first_token_at"], [r.first_token_at for r in expected])
    assert np.array_equal(rust["completed_at"], [r.completed_at for r in expected])
    assert np.array_equal(rust["scheduled_at"], [r.scheduled_at for r in expected])
    assert list(rust["num_restarts"]) == [r.restarts for r in expected]
