"""The simulator through its Python API: hand-computed times under the linear model, every
policy on random workloads (each request completes exactly once, deterministically, without
over-allocating KV memory), the routing experiment, typed errors and the output files."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenyard.errors import CapacityError, ConfigError, InputError
from tokenyard.simulation import config_from_mapping, simulate
from tokenyard.simulation.cluster_config import DEFAULT_BALANCE
from tokenyard.simulation.config import default_workload
from tokenyard.workload import TraceError

REPLICA_POLICIES = [
    "vllm",
    "sarathi",
    "orca",
    "lightllm",
    "faster_transformer",
    "vllm_v1",
    "sglang",
]
GLOBAL_POLICIES = [
    "round_robin",
    "lor",
    "random",
    "least_kv_load",
    "power_of_two",
    "prefix_affinity",
]
#: One second per iteration plus 0.1 s per prefill token and 0.2 s per decode token.
STEP_MODEL = {
    "model": "linear",
    "constant_s": 1.0,
    "per_prefill_token_s": 0.1,
    "per_decode_token_s": 0.2,
    "per_decode_context_token_s": 0.0,
    "per_prefill_context_token_s": 0.0,
    "cpu_overhead_s": 0.0,
}


def write_trace(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        writer.writerows(rows)
    return path


def config(trace: Path, *, policy: str = "vllm", stages: int = 1, **extra: Any) -> Any:
    scheduler = {"policy": policy, "block_size": 1 if policy == "lightllm" else 4}
    scheduler.update(extra.pop("scheduler", {}))
    mapping = {
        "cluster": {"num_replicas": extra.pop("replicas", 1)},
        "replica": {"num_pipeline_stages": stages, "scheduler": scheduler},
        "execution": extra.pop("execution", STEP_MODEL),
        "workload": {"kind": "trace", "format": "vidur", "path": str(trace)},
        "metrics": {"record_stages": True, "sample_interval_s": 0.0},
    }
    mapping.update(extra)
    return config_from_mapping(mapping)


def times(result: Any) -> list[tuple[float, float]]:
    c = result.columns
    return [
        (float(a), float(b)) for a, b in zip(c["first_token_at"], c["completed_at"], strict=True)
    ]


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "orca", "vllm_v1", "sglang"])
def test_one_request_takes_the_hand_computed_time(tmp_path: Path, policy: str) -> None:
    # Prefill of 10 tokens: 1 + 0.1 * 10 = 2 s (the first token); 2 decodes of 1.2 s.
    trace = write_trace(tmp_path / "t.csv", [(0.0, 10, 3)])
    result = simulate(config(trace, policy=policy, scheduler={"vidur": {"chunk_size": 64}}))
    assert times(result) == [pytest.approx((2.0, 4.4))]
    row = result.table().to_pylist()[0]
    assert row["ttft"] == pytest.approx(2.0)
    assert row["tpot"] == pytest.approx(1.2)
    assert row["e2e"] == pytest.approx(4.4)


def test_orca_admits_at_the_next_iteration_faster_transformer_after_the_batch(
    tmp_path: Path,
) -> None:
    flat = {**STEP_MODEL, "per_prefill_token_s": 0.0, "per_decode_token_s": 0.0}
    trace = write_trace(tmp_path / "t.csv", [(0.0, 4, 4), (0.5, 4, 2)])
    orca = simulate(config(trace, policy="orca", execution=flat))
    assert times(orca) == [(1.0, 4.0), (2.0, 3.0)]
    ft = simulate(config(trace, policy="faster_transformer", execution=flat))
    assert times(ft) == [(1.0, 4.0), (5.0, 6.0)], "B waits for A's whole batch"


def test_two_stage_pipeline_runs_two_batches_at_once(tmp_path: Path) -> None:
    model = {**STEP_MODEL, "constant_s": 2.0, "per_prefill_token_s": 0.0, "per_decode_token_s": 0.0}
    trace = write_trace(tmp_path / "t.csv", [(0.0, 4, 2), (0.5, 4, 2)])
    result = simulate(config(trace, stages=2, execution=model))
    assert times(result) == [(2.0, 4.0), (3.0, 5.0)]
    stages = result.stages
    assert stages is not None
    assert list(stages["stage"]) == [0, 0, 1, 1, 0, 1, 0, 1]


workloads = st.lists(
    st.tuples(st.floats(0, 3), st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=25
)


@settings(max_examples=25, deadline=None)
@given(
    rows=workloads,
    policy=st.sampled_from(REPLICA_POLICIES),
    router=st.sampled_from(GLOBAL_POLICIES),
    replicas=st.integers(1, 3),
    num_blocks=st.integers(16, 64),
)
def test_every_request_completes_once_with_its_tokens_deterministically(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[float, int, int]],
    policy: str,
    router: str,
    replicas: int,
    num_blocks: int,
) -> None:
    rows = sorted(rows)
    trace = write_trace(tmp_path_factory.mktemp("w") / "t.csv", rows)
    cfg = config(
        trace,
        policy=policy,
        replicas=replicas,
        cluster={"num_replicas": replicas, "global_scheduler": {"policy": router}},
        scheduler={
            "num_blocks": num_blocks * (4 if policy == "lightllm" else 1),
            "max_request_tokens": 64,
            # Each policy reads its own section; the others are inert.
            "vidur": {"chunk_size": 16},
            "vllm_v1": {"max_num_batched_tokens": 16, "max_num_seqs": 16},
            "sglang": {"chunked_prefill_size": 16},
        },
    )
    first = simulate(cfg)
    c = first.columns
    assert list(c["request_id"]) == list(range(len(rows)))
    assert list(c["num_prefill_tokens"]) == [r[1] for r in rows]
    assert list(c["num_decode_tokens"]) == [r[2] for r in rows]
    assert np.all(c["arrived_at"] <= c["scheduled_at"])
    assert np.all(c["scheduled_at"] <= c["first_token_at"])
    assert np.all(c["first_token_at"] <= c["completed_at"])
    assert np.all(first.samples["kv_usage"] <= 1.0), "KV memory never over-allocated"
    again = simulate(cfg)
    for name, values in c.items():
        assert np.array_equal(values, again.columns[name], equal_nan=True), name


def shared_prefix_job(
    global_scheduler: dict[str, Any],
    *,
    replicas: int,
    requests: int,
    qps: float,
    prompt: int,
    output: int,
    groups: int,
    prefix: int,
) -> Any:
    """``vllm_v1`` replicas behind ``global_scheduler``, every prompt (``prompt`` tokens)
    opening with one of ``groups`` shared prefixes of ``prefix`` tokens."""
    return config_from_mapping(
        {
            "cluster": {"num_replicas": replicas, "global_scheduler": global_scheduler},
            "replica": {"scheduler": {"policy": "vllm_v1"}},
            "workload": {
                "kind": "synthetic",
                "num_requests": requests,
                "arrival": {"kind": "poisson", "qps": qps},
                "prompt_tokens": {"kind": "fixed", "value": prompt},
                "output_tokens": {"kind": "fixed", "value": output},
                "shared_prefix": {
                    "num_groups": groups,
                    "prefix_tokens": prefix,
                    "share_ratio": 1.0,
                },
            },
        }
    )


def test_prefix_affinity_finds_more_cached_prefix_than_round_robin() -> None:
    """The documented experiment (docs/simulate.md), scaled down."""
    results = {}
    for router in ("round_robin", "lor", "prefix_affinity"):
        cfg = shared_prefix_job(
            {"policy": router},
            replicas=4,
            requests=2000,
            qps=16.0,
            prompt=2048,
            output=32,
            groups=8,
            prefix=1792,
        )
        results[router] = simulate(cfg).summary
    hit = {k: v["throughput"]["prefix_hit_rate"] for k, v in results.items()}
    ttft = {k: v["latency_s"]["ttft"]["mean"] for k, v in results.items()}
    assert hit["prefix_affinity"] > hit["round_robin"]
    assert hit["prefix_affinity"] > hit["lor"]
    assert ttft["prefix_affinity"] < ttft["round_robin"]


def test_the_simulation_seed_drives_the_workload_unless_the_workload_pins_its_own() -> None:
    def arrivals(simulation_seed: int, **workload: Any) -> Any:
        spec = {**default_workload(), "num_requests": 50, **workload}
        return simulate(config_from_mapping({"seed": simulation_seed, "workload": spec})).columns

    base = arrivals(0)
    assert np.array_equal(base["arrived_at"], arrivals(0, seed=0)["arrived_at"])
    assert not np.array_equal(base["arrived_at"], arrivals(1)["arrived_at"])
    assert np.array_equal(base["arrived_at"], arrivals(1, seed=0)["arrived_at"])
    # The seeded parts inherit it too: a closed loop's think times, LoRA draws.
    closed = {"concurrency": 4, "think_time": {"kind": "exponential", "mean_s": 0.5}}
    config = config_from_mapping(
        {"seed": 3, "workload": {**default_workload(), "closed_loop": closed}}
    )
    assert config.seeded_workload()["closed_loop"]["seed"] == 3
    assert config.seeded_workload()["seed"] == 3
    pinned = {**closed, "seed": 9}
    config = config_from_mapping(
        {"seed": 3, "workload": {**default_workload(), "closed_loop": pinned}}
    )
    assert config.seeded_workload()["closed_loop"]["seed"] == 9
    lora = {"num_adapters": 4}
    config = config_from_mapping(
        {
            "seed": 5,
            "replica": {"lora": {"max_loras": 2}},
            "workload": {**default_workload(), "lora": lora},
        }
    )
    assert config.seeded_workload()["lora"] == {"num_adapters": 4, "seed": 5}
    assert "seed" not in config.workload  # the config itself is left as given


@pytest.mark.parametrize(
    ("vllm_v1", "key"),
    [
        ({"pad_spec_decode": False}, "replica.scheduler.vllm_v1.pad_spec_decode"),
        ({"cache_accepted_drafts": False}, "replica.scheduler.vllm_v1.cache_accepted_drafts"),
        (
            {"long_prefill_token_threshold_adaptive": True},
            "replica.scheduler.vllm_v1.long_prefill_token_threshold_adaptive",
        ),
    ],
)
def test_vllm_v1_knobs_that_would_change_nothing_here_are_refused(
    vllm_v1: dict[str, Any], key: str
) -> None:
    mapping: dict[str, Any] = {"replica": {"scheduler": {"policy": "vllm_v1", "vllm_v1": vllm_v1}}}
    with pytest.raises(ConfigError) as err:
        config_from_mapping(mapping)
    assert err.value.field == key
    # Where they apply they are accepted: with speculation, or with a threshold to floor.
    if "long_prefill_token_threshold_adaptive" in vllm_v1:
        vllm_v1 = {**vllm_v1, "long_prefill_token_threshold": 256}
    else:
        mapping["replica"]["speculative"] = {
            "method": "ngram",
            "num_speculative_tokens": 2,
            "acceptance_rate": 0.5,
        }
    mapping["replica"]["scheduler"]["vllm_v1"] = vllm_v1
    config_from_mapping(mapping)


def test_balance_weighs_prefix_affinity_and_is_refused_with_a_router_that_ignores_it() -> None:
    def routed(global_scheduler: dict[str, Any]) -> Any:
        cfg = shared_prefix_job(
            global_scheduler,
            replicas=3,
            requests=300,
            qps=30.0,
            prompt=1024,
            output=16,
            groups=2,
            prefix=768,
        )
        return simulate(cfg).columns["replica"]

    unset = routed({"policy": "prefix_affinity"})
    default = routed({"policy": "prefix_affinity", "balance": DEFAULT_BALANCE})
    assert np.array_equal(unset, default)
    assert not np.array_equal(routed({"policy": "prefix_affinity", "balance": 0.0}), default)
    for policy in ("round_robin", "lor", "least_kv_load"):
        with pytest.raises(ConfigError) as err:
            routed({"policy": policy, "balance": DEFAULT_BALANCE})
        assert err.value.field == "cluster.global_scheduler.balance"
        assert policy in str(err.value)


def test_a_python_execution_model_gives_the_same_result_as_the_rust_linear_one(
    tmp_path: Path,
) -> None:
    trace = write_trace(tmp_path / "t.csv", [(0.1 * i, 5 + i, 3 + i % 4) for i in range(30)])
    rust = simulate(config(trace, policy="sarathi", scheduler={"chunk_size": 16}))
    python = simulate(
        config(
            trace,
            policy="sarathi",
            scheduler={"chunk_size": 16},
            execution={"model": "tests.exec_models:step_model"},
        )
    )
    for name, values in rust.columns.items():
        assert np.allclose(values, python.columns[name], equal_nan=True), name


def test_results_write_every_file(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", [(0.0, 10, 3), (0.5, 4, 2)])
    result = simulate(config(trace))
    out = result.write(tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "requests.csv",
        "requests.parquet",
        "samples.parquet",
        "summary.json",
        "token_gaps.parquet",
        "trace.json",
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == 2
    # The trace-event export (tests/test_trace_events.py): a slice per batch stage.
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert result.stages is not None
    assert [e for e in events if e["ph"] == "X"], "batch stages as complete slices"
    assert sum(e["ph"] == "X" for e in events) == len(result.stages["batch_id"])
    # B (arrives 0.5) prefills after A, prefill first (vLLM): 2 + 1.4 - 0.5 = 2.9 s.
    assert result.to_pandas()["ttft"].tolist() == pytest.approx([2.0, 2.9])


@pytest.mark.parametrize(
    ("mapping", "key"),
    [
        ({"cluster": {"num_replica": 2}}, "cluster.num_replica"),
        ({"cluster": {"num_replicas": 0}}, "cluster.num_replicas"),
        ({"replica": {"scheduler": {"policy": "vllm2"}}}, "replica.scheduler.policy"),
        ({"replica": {"scheduler": {"policy": "lightllm"}}}, "replica.scheduler.vidur.block_size"),
        (
            {"replica": {"num_pipeline_stages": 2, "scheduler": {"policy": "sglang"}}},
            "replica.num_pipeline_stages",
        ),
        (
            {"cluster": {"global_scheduler": {"policy": "nearest"}}},
            "cluster.global_scheduler.policy",
        ),
        ({"execution": {"model": "linear", "constant_s": -1.0}}, "execution.constant_s"),
        ({"metrics": {"record_stages": "yes"}}, "metrics.record_stages"),
    ],
)
def test_bad_configs_name_the_key(mapping: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(mapping)
    assert info.value.field == key
    assert key in str(info.value)


def test_a_model_that_does_not_fit_is_a_config_error() -> None:
    cfg = config_from_mapping({"replica": {"model": "llama-2-70b", "device": "a10g"}})
    with pytest.raises(ConfigError, match="not enough for one request"):
        simulate(cfg)


def test_a_malformed_trace_names_file_line_and_field_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,4,2\n0.5,-3,2\n")
    with pytest.raises(TraceError) as info:
        simulate(config(bad))
    assert "bad.csv:3" in str(info.value)
    assert info.value.field == "num_prefill_tokens"
    assert not (tmp_path / "out").exists()
    missing = tmp_path / "missing.csv"
    missing.write_text("arrived_at,num_prefill_tokens\n0.0,4\n")
    with pytest.raises(TraceError, match="num_decode_tokens"):
        simulate(config(missing))


def test_a_request_larger_than_a_replica_is_an_input_error(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", [(0.0, 100, 2)])
    with pytest.raises(InputError, match="blocks"):
        simulate(config(trace, scheduler={"num_blocks": 8}))


def test_a_plugin_that_never_schedules_stalls_with_a_capacity_error(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", [(0.0, 4, 2)])
    with pytest.raises(CapacityError, match="stalled"):
        simulate(config(trace, scheduler={"policy": "tests.sim_plugins:NeverSchedules"}))


@pytest.mark.parametrize("num_pages", [40, 48, 64])
@pytest.mark.parametrize("page_size", [1, 16])
def test_sglang_admission_never_overcommits_pages_with_shared_prefixes(
    num_pages: int, page_size: int
) -> None:
    # Regression: admission summed tokens before rounding to pages and counted a hit's
    # pages as evictable after locking them, so a decode could find no page (a bug).
    pages = num_pages * (16 if page_size == 1 else 1)
    result = simulate(
        config_from_mapping(
            {
                "cluster": {"num_replicas": 1},
                "replica": {
                    "scheduler": {
                        "policy": "sglang",
                        "max_request_tokens": 256,
                        "sglang": {
                            "page_size": page_size,
                            "num_pages": pages,
                            "chunked_prefill_size": 128,
                        },
                    }
                },
                "execution": STEP_MODEL,
                "workload": {
                    "kind": "synthetic",
                    "num_requests": 40,
                    "seed": 0,
                    "arrival": {"kind": "constant", "qps": 32.0},
                    "prompt_tokens": {"kind": "uniform", "low": 50, "high": 190},
                    "output_tokens": {"kind": "uniform", "low": 13, "high": 62},
                    "shared_prefix": {"num_groups": 3, "prefix_tokens": 128, "share_ratio": 0.75},
                },
            }
        )
    )
    assert result.summary["num_requests"] == 40
    assert np.all(result.samples["kv_usage"] <= 1.0)


def test_sglang_reserves_the_pages_of_a_chunked_prompt_completing_in_the_batch(
    tmp_path: Path,
) -> None:
    # Regression (found by hypothesis): request 0's prompt finishes its last chunk in the
    # batch that admits request 1; its output pages were not reserved, so a decode found
    # no page. 16 pages of 4 tokens; 30 + 34 tokens do not fit together.
    trace = write_trace(tmp_path / "t.csv", [(0.0, 23, 7), (0.0, 27, 7)])
    result = simulate(
        config(
            trace,
            policy="sglang",
            scheduler={"num_blocks": 16, "sglang": {"chunked_prefill_size": 16}},
        )
    )
    assert result.columns["completed_at"].tolist() == pytest.approx([11.5, 23.4])


def test_vllm_v1_under_pipeline_stages_samples_only_in_the_batch_that_caught_up(
    tmp_path: Path,
) -> None:
    # Regression (found by fuzzing): with two batches in flight, request 3's prompt ran in
    # two chunks, one per batch; the first batch's end sampled it too, so its scheduler ran
    # one token ahead of the simulation and released it before it completed.
    rows = [(0.798, 7, 3), (1.037, 1, 3), (1.745, 12, 6), (4.544, 26, 3), (4.6, 30, 18)]
    trace = write_trace(tmp_path / "t.csv", rows)
    result = simulate(
        config(
            trace,
            policy="vllm_v1",
            stages=2,
            scheduler={
                "num_blocks": 24,
                "max_request_tokens": 64,
                "vllm_v1": {"max_num_batched_tokens": 16, "max_num_seqs": 16},
            },
        )
    )
    assert result.columns["num_decode_tokens"].tolist() == [3, 3, 6, 3, 18]
    assert result.columns["completed_at"].tolist() == pytest.approx([6.9, 8.25, 14.0, 12.2, 31.4])
