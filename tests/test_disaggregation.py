"""Disaggregated serving through the public API (docs/disaggregation.md): the pools and
the link from the config, the transfer in every request's columns, invariants over random
P/D configs, determinism, and bad configs refused naming their key."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from exec_models import FAST_LINEAR
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenyard import catalog
from tokenyard.errors import ConfigError
from tokenyard.simulation import simulate
from tokenyard.simulation.config import config_from_mapping
from tokenyard.simulation.disagg_config import check_transferable, kv_bytes_per_token

STEP_MODEL = FAST_LINEAR


def workload(num_requests: int = 60, seed: int = 1, qps: float = 20.0) -> dict[str, Any]:
    return {
        "kind": "synthetic",
        "num_requests": num_requests,
        "seed": seed,
        "arrival": {"kind": "poisson", "qps": qps},
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 600},
        "output_tokens": {"kind": "uniform", "low": 1, "high": 40},
        "shared_prefix": {"num_groups": 4, "prefix_tokens": 64, "share_ratio": 0.5},
    }


def pd_mapping(**cluster: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"num_replicas": 1, "decode": {"num_replicas": 1}}
    base.update(cluster)
    return {
        "replica": {"model": "llama-3.1-8b", "device": "h100-sxm"},
        "cluster": base,
        "execution": STEP_MODEL,
        "workload": workload(),
        "metrics": {"sample_interval_s": 0.0},
    }


def run(mapping: dict[str, Any]) -> Any:
    return simulate(config_from_mapping(mapping))


def test_a_request_is_prefilled_in_one_pool_and_decoded_in_the_other() -> None:
    result = run(pd_mapping())
    c = result.columns
    handed = c["num_decode_tokens"] > 1
    assert (c["prefill_replica"][handed] == 0).all()
    assert (c["replica"][handed] == 1).all(), "decode replica 1 follows prefill replica 0"
    assert (c["prefill_replica"][~handed] == -1).all(), "one-token requests stay"
    # llama-3.1-8b: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131072 B per token;
    # both replicas on one node: NVLink at 450 GB/s one way, 5 us.
    link = result.summary["config"]["decode"]["link"]
    assert link["kv_bytes_per_token"] == 131072
    assert link["nvlink_gbps"] == 450.0
    tokens = c["kv_transfer_tokens"][handed].astype(np.float64)
    moved = tokens > 0
    expected = 5e-6 + tokens * 131072 / 450e9
    assert np.allclose(c["kv_transfer_s"][handed][moved], expected[moved], rtol=1e-9)
    # The second token comes after the KV landed and a decode step ran.
    landed = c["first_token_at"] + c["kv_transfer_wait_s"] + c["kv_transfer_s"]
    assert (c["second_token_at"][handed] > landed[handed]).all()
    disagg = result.summary["disaggregation"]
    assert disagg["num_transferred"] == int(handed.sum())
    assert 0 < disagg["decode_busy_fraction"] <= 1


def test_across_nodes_the_transfer_takes_the_network() -> None:
    near = run(pd_mapping())
    far = run(pd_mapping(kv_transfer={"gpus_per_node": 1}))
    link = far.summary["config"]["decode"]["link"]
    assert link["network_gbps"] == 50.0
    assert link["network_latency_s"] == pytest.approx(1e-5)
    moved = near.columns["kv_transfer_tokens"] > 0
    assert (far.columns["kv_transfer_s"][moved] > near.columns["kv_transfer_s"][moved]).all()


def test_the_decode_pool_has_its_own_layout_and_the_summary_says_so() -> None:
    result = run(pd_mapping(decode={"num_replicas": 2, "tensor_parallel_size": 2}))
    decode = result.summary["config"]["decode"]
    assert (decode["num_replicas"], decode["tensor_parallel_size"]) == (2, 2)
    assert decode["link"]["decode_gpus"] == 2
    assert set(result.columns["replica"][result.columns["prefill_replica"] >= 0]) <= {1, 2}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_prefill=st.integers(1, 3),
    num_decode=st.integers(1, 3),
    router=st.sampled_from(["round_robin", "least_kv_load", "power_of_two", "lor", "random"]),
    gpus_per_node=st.sampled_from([1, 2, 8]),
    seed=st.integers(0, 5),
    num_blocks=st.sampled_from([0, 96]),
)
def test_every_request_completes_once_and_decode_waits_for_its_kv(
    num_prefill: int, num_decode: int, router: str, gpus_per_node: int, seed: int, num_blocks: int
) -> None:
    mapping = pd_mapping(
        num_replicas=num_prefill,
        decode={
            "num_replicas": num_decode,
            "global_scheduler": {"policy": router},
            # A small decode pool makes requests wait for blocks and be preempted.
            "scheduler": {"vllm_v1": {"num_blocks": num_blocks}},
        },
        kv_transfer={"gpus_per_node": gpus_per_node},
    )
    mapping["workload"] = workload(num_requests=50, seed=seed, qps=40.0)
    mapping["seed"] = seed
    first = run(mapping)
    c = first.columns
    assert sorted(c["request_id"].tolist()) == list(range(50))
    handed = c["prefill_replica"] >= 0
    assert (c["replica"][handed] >= num_prefill).all()
    assert (c["prefill_replica"][handed] < num_prefill).all()
    landed = c["first_token_at"] + c["kv_transfer_wait_s"] + c["kv_transfer_s"]
    assert (c["second_token_at"][handed] > landed[handed]).all()
    assert (c["completed_at"] >= c["first_token_at"]).all()
    again = run(mapping)
    for name, column in c.items():
        assert np.array_equal(column, again.columns[name], equal_nan=True), name


@pytest.mark.parametrize(
    ("cluster", "replica", "key"),
    [
        ({"decode": {"num_replicas": 0}}, {}, "cluster.decode.num_replicas"),
        ({"decode": None, "kv_transfer": {"gpus_per_node": 2}}, {}, "cluster.kv_transfer"),
        (
            {"decode": {"num_replicas": 1, "scheduler": {"policy": "sarathi"}}},
            {},
            "cluster.decode.scheduler.policy",
        ),
        ({}, {"scheduler": {"policy": "sglang"}}, "replica.scheduler.policy"),
        (
            {"decode": {"num_replicas": 1, "tensor_parallel_size": 3}},
            {},
            "cluster.decode.tensor_parallel_size",
        ),
        (
            {"decode": {"num_replicas": 1, "global_scheduler": {"policy": "prefix_magic"}}},
            {},
            "cluster.decode.global_scheduler.policy",
        ),
        ({"kv_transfer": {"network_gbps": 0}}, {}, "cluster.kv_transfer.network_gbps"),
        ({}, {"device": "l40s"}, "cluster.kv_transfer.network_gbps"),
        (
            {"decode": {"num_replicas": 1, "memory_margin_fraction": 0.9}},
            {},
            "cluster.decode.device",
        ),
    ],
)
def test_bad_pd_configs_name_the_key(
    cluster: dict[str, Any], replica: dict[str, Any], key: str
) -> None:
    mapping = pd_mapping(**cluster)
    if mapping["cluster"].get("decode") is None:
        del mapping["cluster"]["decode"]
    mapping["replica"].update(replica)
    with pytest.raises(ConfigError) as error:
        run(mapping)
    assert error.value.field == key, error.value


def test_the_link_moves_each_layer_kinds_own_kv() -> None:
    # Llama-3.1-8B: K and V of 8 heads of 128 in 32 layers; DeepSeek-V3: one latent of
    # 512 + 64 values in each of 61 layers (not 128 heads' K and V); bf16.
    assert kv_bytes_per_token(catalog.model("llama-3.1-8b"), 2) == 2 * 2 * 8 * 128 * 32
    if "deepseek-ai/DeepSeek-V3" in catalog.bundled_model_names():
        assert kv_bytes_per_token(catalog.model("deepseek-ai/DeepSeek-V3"), 2) == 2 * 576 * 61
    if "Qwen/Qwen3.5-35B-A3B" in catalog.bundled_model_names():
        # Its gated-DeltaNet state (tens of MB a request) would cross too: refused.
        with pytest.raises(ConfigError, match="linear-attention state"):
            check_transferable(catalog.model("Qwen/Qwen3.5-35B-A3B"))
