"""The memory planner against hand computations (the arithmetic is written out), dtypes,
tensor and pipeline parallel layouts, and the errors it raises."""

from __future__ import annotations

from typing import Any

import pytest

from tokenyard import catalog
from tokenyard.catalog import ModelSpec
from tokenyard.errors import ConfigError
from tokenyard.simulation.planner import MemoryPlan, parameters_per_device, plan_memory

GiB = 1024**3


def plan(model: str, device: str, **kwargs: Any) -> MemoryPlan:
    options: dict[str, Any] = {
        "tensor_parallel_size": 1,
        "num_pipeline_stages": 1,
        "memory_margin_fraction": 0.1,
        "max_request_tokens": 4096,
        "block_size": 16,
    }
    options.update(kwargs)
    return plan_memory(catalog.model(model), catalog.device(device), **options)


def test_llama_2_7b_on_one_a100_80gb() -> None:
    p = plan("llama-2-7b", "a100-80gb")
    weights = 6_738_415_616 * 2  # parameters x 2 bytes (bf16)
    assert p.parameter_bytes_per_device == p.parameter_bytes_total == weights == 13_476_831_232
    assert p.kv_bytes_per_token == 2 * 2 * 128 * 32 * 32 == 524_288  # K+V, bf16, d, heads, layers
    usable = int(80 * GiB * 0.9)  # 77_309_411_328
    assert p.available_kv_bytes == usable - weights == 63_832_580_096
    assert p.max_batch_size == 63_832_580_096 // (524_288 * 4096) == 29
    assert p.num_blocks == 63_832_580_096 // (524_288 * 16) == 7609
    assert p.max_kv_tokens == 7609 * 16 == 121_744
    assert p.max_request_slots == 7609


def test_llama_2_70b_on_four_h100_with_tp4() -> None:
    p = plan("llama-2-70b", "h100-sxm", tensor_parallel_size=4)
    # 8 KV heads over 4 workers: 2 each; 80 layers all on every worker.
    assert p.kv_bytes_per_token == 2 * 2 * 128 * 2 * 80 == 81_920
    # Every matrix divides by 4 (64 heads, 8 KV heads, 28672 inter, 32000 vocab), so each
    # worker holds a quarter of the weights but for the norms, which every worker keeps:
    # 80 layers x 2 x 8192 + 8192 replicated values.
    norms = 80 * 2 * 8192 + 8192
    per_device = (68_976_648_192 - norms) // 4 + norms
    assert p.parameter_bytes_per_device == per_device * 2 == 34_490_302_464
    assert p.parameter_bytes_per_device == pytest.approx(68.98e9 * 2 / 4, rel=0.001)
    assert p.parameter_bytes_total == 68_976_648_192 * 2
    assert p.num_blocks == (int(80 * GiB * 0.9) - 34_490_302_464) // (81_920 * 16)


def test_llama_2_7b_with_two_pipeline_stages() -> None:
    p = plan("llama-2-7b", "a100-80gb", num_pipeline_stages=2)
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096  # 202_383_360
    embeddings = 32000 * 4096  # first stage; the last has the lm_head (same size) + final norm
    last_stage = 16 * layer + embeddings + 4096
    assert p.parameter_bytes_per_device == last_stage * 2 == 6_738_419_712
    assert p.kv_bytes_per_token == 2 * 2 * 128 * 32 * 16 == 262_144  # 16 layers per stage


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    p = plan("llama-3.1-70b", "h100-sxm", tensor_parallel_size=16)
    # 8 KV heads over 16 workers: ceil(8 / 16) = 1 head per worker, not a half.
    assert p.kv_bytes_per_token == 2 * 2 * 128 * 1 * 80 == 40_960


def test_tied_embeddings_are_held_once_per_stage() -> None:
    tied = ModelSpec(
        name="tied",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=4,
        head_dim=16,
        intermediate_size=128,
        vocab_size=1000,
        context_length=4096,
        tied_embeddings=True,
    )
    layer = 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert parameters_per_device(tied, 1, 1) == tied.num_parameters() == 2 * layer + 1000 * 64 + 64
    # Two stages: each holds a copy (embedding first, lm_head last); the last is the larger.
    assert parameters_per_device(tied, 1, 2) == layer + 1000 * 64 + 64


def test_one_device_holds_the_whole_model_for_every_built_in() -> None:
    for spec in catalog.models().values():
        assert parameters_per_device(spec, 1, 1) == spec.num_parameters()


def test_fp8_kv_halves_kv_bytes_per_token() -> None:
    bf16 = plan("llama-3.1-8b", "h100-sxm")
    fp8 = plan("llama-3.1-8b", "h100-sxm", kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token == 2 * 2 * 128 * 8 * 32
    assert fp8.parameter_bytes_per_device == bf16.parameter_bytes_per_device
    assert fp8.num_blocks >= 2 * bf16.num_blocks


@pytest.mark.parametrize(
    ("weight_dtype", "weight_bytes", "kv_bytes"),
    [("fp32", 4, 4), ("fp16", 2, 2), ("fp8_e4m3", 1, 2), ("int8", 1, 2), ("int4", 0.5, 2)],
)
def test_auto_kv_dtype_is_the_compute_dtype_of_the_weights(
    weight_dtype: str, weight_bytes: float, kv_bytes: int
) -> None:
    p = plan("llama-2-7b", "h200", weight_dtype=weight_dtype)
    assert p.parameter_bytes_total == 6_738_415_616 * weight_bytes
    assert p.kv_bytes_per_token == 2 * kv_bytes * 128 * 32 * 32  # quantised weights: bf16 KV


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"weight_dtype": "fp4"}, "replica.dtype"),
        ({"kv_cache_dtype": "int4"}, "replica.kv_cache_dtype"),
        ({"kv_cache_dtype": "float16"}, "replica.kv_cache_dtype"),
        ({"num_pipeline_stages": 3}, "replica.num_pipeline_stages"),
        ({"tensor_parallel_size": 3}, "replica.tensor_parallel_size"),
        ({"tensor_parallel_size": 0}, "replica.tensor_parallel_size"),
        ({"memory_margin_fraction": 1.0}, "replica.memory_margin_fraction"),
        ({"block_size": 0}, "replica.scheduler.block_size"),
    ],
)
def test_bad_options_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan("llama-2-7b", "a100-80gb", **kwargs)
    assert info.value.field == field
    assert field in str(info.value)


def test_a_layout_that_does_not_divide_names_value_and_model() -> None:
    with pytest.raises(ConfigError, match=r"3 does not divide the 32 layers of llama-2-7b"):
        plan("llama-2-7b", "a100-80gb", num_pipeline_stages=3)


def test_a_model_that_does_not_fit_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not enough for one request") as info:
        plan("llama-3.1-405b", "a10g")
    assert info.value.field == "replica.device"
    assert "llama-3.1-405b on a10g" in str(info.value)


def test_auto_kv_cache_dtype_is_the_compute_dtype() -> None:
    """As in vLLM: fp8 or int8 weights still compute, and cache K and V, in 16 bits."""
    from tokenyard.simulation.planner import dtype_bytes

    assert dtype_bytes("fp8") == (1, 2)
    assert dtype_bytes("int8") == (1, 2)
    assert dtype_bytes("int4") == (0.5, 2)
    assert dtype_bytes("fp32") == (4, 4)
    assert dtype_bytes("fp8", "fp8") == (1, 1)


def test_a_bad_dtype_in_a_config_names_the_key() -> None:
    from tokenyard.simulation import config_from_mapping

    for key in ("dtype", "kv_cache_dtype"):
        with pytest.raises(ConfigError) as err:
            config_from_mapping({"replica": {key: "fp9"}})
        assert err.value.field == f"replica.{key}"
