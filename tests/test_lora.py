"""Multi-LoRA serving (docs/lora.md): adapter ids in the workload, the vllm_v1 replica's
GPU slots and host cache, the load time and the LoRA kernels' cost."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tests.exec_models as exec_models
from tokenyard import _core
from tokenyard.catalog import device, model
from tokenyard.errors import ConfigError, InputError
from tokenyard.predictor.roofline import Efficiencies
from tokenyard.simulation.config import SimulationConfig, config_from_mapping, default_workload
from tokenyard.simulation.execution import build_predictor, with_lora
from tokenyard.simulation.lora_config import PCIE_EFFICIENCY, LoraConfig, adapter_bytes, lora_op
from tokenyard.simulation.run import plan_for, simulate
from tokenyard.workload import load_workload
from tokenyard.workload.chunk import RequestChunk, rechunk

LLAMA_2_7B_LAYER = 4 * (4096 + 4096) + 3 * (4096 + 11008)  # Σ d_in + d_out, 7 linears


def workload(num_requests: int = 40, **lora: Any) -> dict[str, Any]:
    w = default_workload()
    w["num_requests"] = num_requests
    w["lora"] = {"num_adapters": 2, **lora}
    return w


def config(**overrides: Any) -> SimulationConfig:
    mapping: dict[str, Any] = {
        "cluster": {"num_replicas": 1},
        "workload": workload(),
        "replica": {"lora": {"max_loras": 1, "max_cpu_loras": 2}},
        "execution": {"model": "roofline"},
    }
    for key, value in overrides.items():
        mapping[key] = value
    return config_from_mapping(mapping)


def test_adapter_bytes_by_hand() -> None:
    llama = model("llama-2-7b")
    lora = LoraConfig()  # rank 16, all seven linears, bf16
    assert adapter_bytes(lora, llama, "bf16", 1, 1) == 16 * LLAMA_2_7B_LAYER * 32 * 2
    # TP 2: column-parallel linears halve d_out, row-parallel ones d_in.
    tp2 = 4 * (4096 + 2048) + 3 * (4096 + 5504)
    assert adapter_bytes(lora, llama, "bf16", 2, 2) == 16 * tp2 * 16 * 2
    attention = dataclasses.replace(lora, rank=8, target_modules=("q_proj", "v_proj"))
    assert adapter_bytes(attention, llama, "fp32", 1, 1) == 8 * 2 * 8192 * 32 * 4


def test_first_uses_pay_bytes_over_bandwidth() -> None:
    cfg = config()
    result = simulate(cfg)
    lora = result.summary["lora"]
    size = adapter_bytes(LoraConfig(), model("llama-2-7b"), "bf16", 1, 1)
    # Each adapter is read from disk once (2 fit in the host cache), then every load
    # copies it over PCIe Gen4 (32 GB/s x 0.8).
    assert lora["disk_loads"] == 2
    expected = 2 * size / 2e9 + lora["adapter_loads"] * size / (32e9 * PCIE_EFFICIENCY)
    assert lora["load_time_s"] == pytest.approx(expected, rel=1e-12)
    assert len(result.columns["request_id"]) == 40


def test_lora_op_priced_by_hand_and_equal_in_rust() -> None:
    eff = Efficiencies()
    op = lora_op(LoraConfig(), model("llama-2-7b"), device("a100-80gb"), "bf16", 1, eff)
    tokens, adapters = 100, 2
    flops = 2 * 16 * LLAMA_2_7B_LAYER * tokens
    weights = 16 * LLAMA_2_7B_LAYER * 2 * adapters
    per_token = 2 * (4 * (4096 + 32) + 4 * 2 * 4096 + 2 * (4096 + 32 + 2 * 11008))
    per_token += 2 * (11008 + 32 + 2 * 4096)
    memory = (weights + per_token * tokens) / (2039e9 * eff.memory)
    compute = flops / (312e12 * eff.gemm)
    features = {"num_lora_tokens": float(tokens), "num_lora_adapters": float(adapters)}
    assert op.cost.time(features) == pytest.approx(max(memory, compute), rel=1e-12)

    cfg = config()
    compiled = build_predictor(cfg)
    assert compiled is not None
    predictor = with_lora(cfg, compiled)
    shape = {
        "num_requests": 3,
        "num_prefill_tokens": 90,
        "num_decode_tokens": 10,
        "sum_decode_context": 400,
        "sum_prefill_context": 8100,
        "sum_prefill_squared": 8100,
        "num_padding_rows": 0,
    }
    base = predictor(stage=0, num_stages=1, **shape)
    with_adapters = predictor(
        stage=0, num_stages=1, num_lora_tokens=tokens, num_lora_adapters=adapters, **shape
    )
    assert with_adapters[1] == pytest.approx(base[1] + 32 * op.cost.time(features), rel=1e-12)
    columns = {k: np.array([v], dtype=np.uint64) for k, v in shape.items()}
    columns["num_lora_tokens"] = np.array([tokens], dtype=np.uint64)
    columns["num_lora_adapters"] = np.array([adapters], dtype=np.uint64)
    total, model_s = _core.evaluate_ops(predictor.to_core(), columns)
    assert (float(total[0]), float(model_s[0])) == pytest.approx(with_adapters, rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(
    num_requests=st.integers(1, 30),
    num_adapters=st.integers(1, 4),
    max_loras=st.integers(1, 3),
    base_fraction=st.sampled_from([0.0, 0.3, 1.0]),
    popularity=st.sampled_from(["uniform", "zipf"]),
    seed=st.integers(0, 2**32),
)
def test_batches_hold_at_most_max_loras_adapters_and_every_request_finishes_once(
    num_requests: int,
    num_adapters: int,
    max_loras: int,
    base_fraction: float,
    popularity: str,
    seed: int,
) -> None:
    w = default_workload()
    w.update(num_requests=num_requests, seed=seed)
    w["arrival"] = {"kind": "poisson", "qps": 50.0}
    w["lora"] = {
        "num_adapters": num_adapters,
        "popularity": popularity,
        "base_fraction": base_fraction,
        "seed": seed,
    }
    cfg = config(
        workload=w,
        replica={"lora": {"max_loras": max_loras, "max_cpu_loras": max_loras}},
        execution={"model": "tests.exec_models:lora_recording_model"},
    )
    exec_models.LORA_ADAPTERS_SEEN.clear()
    result = simulate(cfg)
    assert exec_models.LORA_ADAPTERS_SEEN
    assert max(exec_models.LORA_ADAPTERS_SEEN) <= max_loras
    ids = np.sort(result.columns["request_id"])
    assert np.array_equal(ids, np.arange(num_requests))
    if base_fraction == 1.0:
        assert result.summary["lora"]["adapter_loads"] == 0


def test_runs_are_deterministic() -> None:
    cfg = config(workload=workload(60, popularity="zipf", base_fraction=0.2))
    first, second = simulate(cfg), simulate(cfg)
    for name, column in first.columns.items():
        assert np.array_equal(column, second.columns[name], equal_nan=True), name
    assert first.summary["lora"] == second.summary["lora"]


def test_more_slots_never_load_more_from_disk_than_adapters() -> None:
    result = simulate(config(replica={"lora": {"max_loras": 2, "max_cpu_loras": 2}}))
    assert result.summary["lora"]["disk_loads"] == 2  # two adapters, both cached on the host


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"replica": {"scheduler": {"policy": "sglang"}, "lora": {}}}, "replica.lora"),
        ({"replica": {}}, "replica.lora"),
        ({"replica": {"scheduler": {"policy": "vllm"}}}, "replica.scheduler.policy"),
        ({"workload": {**default_workload(), "num_requests": 5}}, "replica.lora"),
        ({"execution": {"model": "linear"}}, "execution.model"),
        (
            {"replica": {"lora": {}, "scheduler": {"vllm_v1": {"max_loras": 2}}}},
            "replica.scheduler.vllm_v1.max_loras",
        ),
        ({"replica": {"lora": {"max_loras": 2, "max_cpu_loras": 1}}}, "replica.lora.max_cpu_loras"),
        ({"replica": {"lora": {"max_loras": 0}}}, "replica.lora.max_loras"),
        ({"replica": {"lora": {"rank": 32}}}, "replica.lora.rank"),
        ({"replica": {"lora": {"target_modules": ["lm_head"]}}}, "replica.lora.target_modules"),
        ({"replica": {"lora": {"lora_dtype": "int4"}}}, "replica.lora.lora_dtype"),
        ({"replica": {"lora": {"disk_gbps": 0}}}, "replica.lora.disk_gbps"),
        ({"replica": {"lora": {"max_lora": 2}}}, "replica.lora.max_lora"),
    ],
)
def test_bad_configs_name_the_key(overrides: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as error:
        config(**overrides)
    assert error.value.field == key, error.value.message


def test_moe_experts_are_refused_naming_target_modules() -> None:
    cfg = config(replica={"model": "mixtral-8x7b", "tensor_parallel_size": 4, "lora": {}})
    with pytest.raises(ConfigError) as error:
        simulate(cfg)
    assert error.value.field == "replica.lora.target_modules"


@pytest.mark.parametrize(
    ("lora", "key"),
    [
        ({"num_adapters": 0}, "workload.lora.num_adapters"),
        ({"num_adapters": 2, "popularity": "pareto"}, "workload.lora.popularity"),
        ({"num_adapters": 2, "zipf_exponent": 2.0}, "workload.lora.zipf_exponent"),
        ({"num_adapters": 2, "base_fraction": 1.5}, "workload.lora.base_fraction"),
        ({"adapters": 2}, "workload.lora.adapters"),
    ],
)
def test_bad_popularity_names_the_key(lora: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_workload({**default_workload(), "lora": lora})
    assert error.value.field == key, error.value.message


def test_adapters_do_not_depend_on_the_chunk_size_and_follow_the_popularity() -> None:
    spec = workload(5000, num_adapters=4, popularity="zipf", zipf_exponent=1.0, base_fraction=0.2)
    w = load_workload(spec)
    ids = np.concatenate([c.lora_ids for c in w.chunks(777) if c.lora_ids is not None])
    again = np.concatenate([c.lora_ids for c in w.chunks(5000) if c.lora_ids is not None])
    assert np.array_equal(ids, again)
    assert abs(np.mean(ids == -1) - 0.2) < 0.03
    counts = np.bincount(ids[ids >= 0], minlength=4)
    # Zipf(1) over 4: weights 1, 1/2, 1/3, 1/4.
    expected = np.array([1, 1 / 2, 1 / 3, 1 / 4]) / (25 / 12)
    assert np.allclose(counts / counts.sum(), expected, atol=0.03)
    assert load_workload(w.describe()).describe() == w.describe()


def test_chunk_lora_ids_are_checked_and_survive_rechunking() -> None:
    at = np.zeros(3)
    ones = np.ones(3, dtype=np.uint32)
    chunk = RequestChunk(at, ones, ones, lora_ids=np.array([0, -1, 5], dtype=np.int64))
    pieces = list(rechunk([chunk, chunk], 4))
    assert [list(p.lora_ids) for p in pieces if p.lora_ids is not None] == [
        [0, -1, 5, 0],
        [-1, 5],
    ]
    with pytest.raises(InputError, match="lora_ids"):
        RequestChunk(at, ones, ones, lora_ids=np.array([0, -2, 1], dtype=np.int64))
    with pytest.raises(InputError, match="lora_ids"):
        RequestChunk(at, ones, ones, lora_ids=np.array([0, 1], dtype=np.int64))
    with pytest.raises(InputError, match="lora_ids"):
        list(rechunk([chunk, RequestChunk(at, ones, ones)], 6))


def test_slots_take_memory_from_the_kv_cache() -> None:
    with_slots = plan_for(config(replica={"lora": {"max_loras": 4, "max_lora_rank": 32}}))
    without = plan_for(config_from_mapping({"cluster": {"num_replicas": 1}}))
    # Four slots of rank 32 over Llama-2-7B's seven linears, 32 layers, bf16.
    slots = 4 * 32 * LLAMA_2_7B_LAYER * 32 * 2
    assert without.available_kv_bytes - with_slots.available_kv_bytes == slots
    assert with_slots.num_blocks < without.num_blocks
