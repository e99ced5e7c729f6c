"""Coalesced decode steps (docs/simulate.md, "Coalesced decode steps") change no result: random
clusters and workloads run through ``simulate()`` with ``coalesce_decode_steps`` on and off give
the same per-request columns, summary, samples, stage trace and token-gap histogram, bit for
bit. The Rust twin (``rust/core/src/sim/coalesce_tests.rs``) covers more cases faster; this
one goes through the public API, the trace readers and the measured execution model's
binding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenyard.simulation import SimulationResult, config_from_mapping, simulate
from tokenyard.simulation.config import default_workload

# Nothing in these figures depends on how fast the loop ran.
WALL_KEYS = {"wall_s", "requests_per_wall_s"}


def same_arrays(a: dict[str, np.ndarray] | None, b: dict[str, np.ndarray] | None) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert sorted(a) == sorted(b)
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert x.dtype == y.dtype, name
        assert x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), f"column {name} differs"


def same_summary(a: Any, b: Any, where: str = "summary") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict), where
        assert sorted(a) == sorted(b), where
        for key in a:
            if key not in WALL_KEYS:
                same_summary(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, float) and isinstance(b, float) and np.isnan(a):
        assert np.isnan(b), where
    else:
        assert type(a) is type(b), where
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_identical(a: SimulationResult, b: SimulationResult) -> None:
    same_arrays(a.columns, b.columns)
    same_arrays(a.samples, b.samples)
    same_arrays(a.stages, b.stages)
    same_arrays(a.token_gaps, b.token_gaps)
    same_summary(a.summary, b.summary)


def workload(kind: str, seed: int, num: int, closed: int | None) -> dict[str, Any]:
    if kind == "sessions":
        spec: dict[str, Any] = {
            "kind": "sessions",
            "num_sessions": max(2, num // 3),
            "seed": seed,
            "hash_block_size": 4,
            "turns": {"kind": "uniform", "low": 1, "high": 4},
            "first_prompt_tokens": {"kind": "uniform", "low": 8, "high": 60},
            "input_tokens": {"kind": "uniform", "low": 1, "high": 16},
            "output_tokens": {"kind": "uniform", "low": 1, "high": 40},
            "think_time": {"kind": "exponential", "mean_s": 0.3},
            "arrival": {"kind": "poisson", "qps": 6.0},
        }
    else:
        spec = {
            "kind": "synthetic",
            "num_requests": num,
            "seed": seed,
            "arrival": {"kind": "poisson", "qps": 8.0},
            "prompt_tokens": {"kind": "uniform", "low": 4, "high": 90},
            "output_tokens": {"kind": "uniform", "low": 1, "high": 70},
        }
        if kind == "shared_prefix":
            spec["shared_prefix"] = {"num_groups": 3, "prefix_tokens": 24, "share_ratio": 0.6}
    if closed is not None:
        spec["closed_loop"] = {"concurrency": closed}
    return spec


@settings(max_examples=60, deadline=None)
@given(
    replicas=st.integers(1, 4),
    router=st.sampled_from(["round_robin", "lor", "least_kv_load", "prefix_affinity"]),
    kind=st.sampled_from(["unique", "shared_prefix", "sessions"]),
    stages=st.sampled_from([1, 1, 2]),
    block_size=st.sampled_from([4, 16]),
    num_blocks=st.integers(8, 80),
    budget=st.sampled_from([32, 2048]),
    max_num_seqs=st.sampled_from([0, 3, 256]),
    closed=st.one_of(st.none(), st.integers(1, 6)),
    seed=st.integers(0, 2**16),
    num=st.integers(3, 40),
)
def test_coalesced_decode_steps_change_no_result(
    replicas: int,
    router: str,
    kind: str,
    stages: int,
    block_size: int,
    num_blocks: int,
    budget: int,
    max_num_seqs: int,
    closed: int | None,
    seed: int,
    num: int,
) -> None:
    # At least one longest request must fit a replica (prompt + output <= 160 tokens).
    num_blocks = max(num_blocks, 200 // block_size + 1)
    config = config_from_mapping(
        {
            "seed": seed,
            "cluster": {"num_replicas": replicas, "global_scheduler": {"policy": router}},
            "replica": {
                "num_pipeline_stages": stages,
                "over_length": "skip",
                "scheduler": {
                    "policy": "vllm_v1",
                    "vllm_v1": {
                        "block_size": block_size,
                        "num_blocks": num_blocks,
                        "max_num_batched_tokens": budget,
                        # vLLM refuses a budget below the sequence cap (0: no cap).
                        "max_num_seqs": min(max_num_seqs, budget),
                    },
                },
            },
            "execution": {
                "model": "linear",
                "constant_s": 0.0123,
                "per_prefill_token_s": 1.7e-4,
                "per_decode_token_s": 9.1e-4,
                "per_decode_context_token_s": 3.3e-6,
                "per_prefill_context_token_s": 0.0,
                "cpu_overhead_s": 0.0007,
            },
            "workload": workload(kind, seed, num, closed),
            "metrics": {"sample_interval_s": 0.05, "record_stages": True},
        }
    )
    stepped = simulate(config, coalesce_decode_steps=False)
    coalesced = simulate(config, coalesce_decode_steps=True)
    assert_identical(stepped, coalesced)


def test_the_default_job_is_identical_at_a_smaller_size() -> None:
    """The built-in job (measured A100 tables, prefix caching, 4 replicas) at 600 requests."""
    config = config_from_mapping({"workload": {**default_workload(), "num_requests": 600}})
    assert_identical(
        simulate(config, coalesce_decode_steps=False),
        simulate(config, coalesce_decode_steps=True),
    )


@pytest.mark.parametrize("seed", range(6))
def test_coalescing_keeps_the_prefill_cadence(seed: int) -> None:
    # vLLM's prefill_schedule_interval counts executed steps: a replica holding prefill
    # behind decodes must hold it for the same steps whether decode steps coalesce or not.
    config = config_from_mapping(
        {
            "seed": seed,
            "cluster": {"num_replicas": 2, "global_scheduler": {"policy": "round_robin"}},
            "replica": {
                "over_length": "skip",
                "scheduler": {
                    "policy": "vllm_v1",
                    "vllm_v1": {
                        "block_size": 16,
                        "num_blocks": 80,
                        "max_num_batched_tokens": 2048,
                        "prefill_schedule_interval": 2 + seed % 3,
                    },
                },
            },
            "workload": workload("unique", seed, 30, None),
        }
    )
    assert_identical(
        simulate(config, coalesce_decode_steps=True),
        simulate(config, coalesce_decode_steps=False),
    )
