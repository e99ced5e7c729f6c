"""The host-memory KV tier in the simulator (``[replica.kv_offload]``,
docs/disaggregation.md#host-memory-kv-tier): its size and link from the config, hits that
come back over PCIe at the link's rate, the summary's split of GPU and host hits, invariants
over random aggregated and P/D configs, determinism, and bad configs refused naming their
key."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from exec_models import FAST_LINEAR
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenyard.errors import ConfigError
from tokenyard.simulation import simulate
from tokenyard.simulation.config import config_from_mapping
from tokenyard.simulation.kv_offload_config import DEFAULT_HOST_HIT_WEIGHT

STEP_MODEL = FAST_LINEAR
#: Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes per token.
KV_BYTES_PER_TOKEN = 131072


def workload(num_requests: int = 150, seed: int = 1, groups: int = 24) -> dict[str, Any]:
    """Prompts that open with one of ``groups`` long shared prefixes: more of them than a
    small GPU pool holds, so they are evicted and hit again later."""
    return {
        "kind": "synthetic",
        "num_requests": num_requests,
        "seed": seed,
        "arrival": {"kind": "poisson", "qps": 10.0},
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 200},
        "output_tokens": {"kind": "uniform", "low": 1, "high": 20},
        "shared_prefix": {"num_groups": groups, "prefix_tokens": 512, "share_ratio": 1.0},
    }


def mapping(
    kv_offload: dict[str, Any] | None = None, *, num_blocks: int = 200, **replica: Any
) -> dict[str, Any]:
    rep: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "device": "h100-sxm",
        "scheduler": {"policy": "vllm_v1", "vllm_v1": {"num_blocks": num_blocks}},
        **replica,
    }
    if kv_offload is not None:
        rep["kv_offload"] = kv_offload
    return {
        "replica": rep,
        "cluster": {"num_replicas": 1},
        "execution": STEP_MODEL,
        "workload": workload(),
        "metrics": {"sample_interval_s": 0.0},
    }


def run(m: dict[str, Any]) -> Any:
    return simulate(config_from_mapping(m))


def test_the_tier_size_is_the_host_memory_over_a_blocks_bytes() -> None:
    result = run(mapping({"host_memory_gb": 1.0}))
    described = result.summary["config"]["kv_offload"]
    # A 16-token block: 16 x 131072 B = 2 MiB on the replica's one GPU; 1 GB holds 476.
    assert described["kv_bytes_per_block"] == 16 * KV_BYTES_PER_TOKEN
    assert described["host_num_blocks"] == int(1e9 // (16 * KV_BYTES_PER_TOKEN)) == 476
    # Tensor parallelism splits the KV heads: each GPU offloads its half, the replica the same.
    tp2 = run(mapping({"host_memory_gb": 1.0}, tensor_parallel_size=2))
    assert tp2.summary["config"]["kv_offload"]["host_num_blocks"] == 476


def test_hits_in_host_memory_come_back_over_pcie_at_the_links_rate() -> None:
    without = run(mapping())
    result = run(mapping({"host_memory_gb": 4.0}))
    c = result.columns
    loaded = c["host_load_tokens"] > 0
    assert loaded.any()
    # H100 SXM: PCIe Gen5 x16 = 64 GB/s one way, x 0.8 for a pinned copy; 10 us per load.
    rate = 64e9 * 0.8
    expected = 10e-6 + c["host_load_tokens"][loaded] * KV_BYTES_PER_TOKEN / rate
    assert np.allclose(c["host_load_s"][loaded], expected, rtol=1e-9)
    assert (c["host_hit_tokens"] <= c["prefix_hit_tokens"]).all()
    offload = result.summary["kv_offload"]
    assert offload["host_hit_rate"] > 0.2
    # Loads move whole blocks: the requests' loaded tokens are the pool's loaded blocks.
    # (One offloaded block may be loaded many times: loading leaves the host copy.)
    assert int(c["host_load_tokens"].sum()) == offload["loaded_blocks"] * 16
    assert offload["loaded_gb"] == pytest.approx(
        offload["loaded_blocks"] * 16 * KV_BYTES_PER_TOKEN / 1e9
    )
    # What the tier holds is not recomputed: more hits, less prefill work, lower TTFT.
    assert result.summary["throughput"]["prefix_hit_rate"] > (
        without.summary["throughput"]["prefix_hit_rate"] + 0.2
    )
    assert (
        result.summary["latency_s"]["ttft"]["mean"] < without.summary["latency_s"]["ttft"]["mean"]
    )
    assert "kv_offload" not in without.summary


def test_a_slower_host_link_makes_the_same_loads_take_longer() -> None:
    fast = run(mapping({"host_memory_gb": 4.0}))
    slow = run(mapping({"host_memory_gb": 4.0, "host_to_device_gbps": 1.0, "latency_us": 500}))
    loaded = slow.columns["host_load_tokens"] > 0
    expected = 500e-6 + slow.columns["host_load_tokens"][loaded] * KV_BYTES_PER_TOKEN / 1e9
    assert np.allclose(slow.columns["host_load_s"][loaded], expected, rtol=1e-9)
    assert slow.summary["kv_offload"]["load_s"]["p50"] > fast.summary["kv_offload"]["load_s"]["p50"]


def test_host_hit_weight_changes_prefix_affinity_routing_and_unset_means_the_default() -> None:
    m = mapping({"host_memory_gb": 0.5}, num_blocks=40)
    m["workload"] = workload(num_requests=120, seed=3, groups=12)
    m["cluster"] = {"num_replicas": 3, "global_scheduler": {"policy": "prefix_affinity"}}
    unset = run(m)
    m["replica"]["kv_offload"]["host_hit_weight"] = DEFAULT_HOST_HIT_WEIGHT
    default = run(m)
    m["replica"]["kv_offload"]["host_hit_weight"] = 1.0
    full = run(m)
    assert np.array_equal(unset.columns["replica"], default.columns["replica"])
    assert unset.summary["config"]["kv_offload"]["host_hit_weight"] == DEFAULT_HOST_HIT_WEIGHT
    assert not np.array_equal(full.columns["replica"], default.columns["replica"])


def test_prefix_affinity_routing_learns_what_each_replica_holds_in_host_memory() -> None:
    m = mapping({"host_memory_gb": 4.0, "host_hit_weight": 0.5})
    m["cluster"] = {"num_replicas": 2, "global_scheduler": {"policy": "prefix_affinity"}}
    affine = run(m)
    m["cluster"]["global_scheduler"] = {"policy": "round_robin"}
    del m["replica"]["kv_offload"]["host_hit_weight"]  # refused with round_robin
    spread = run(m)
    # Following the GPU and host copies, a prefix is hit on the replica that holds it.
    assert (
        affine.summary["throughput"]["prefix_hit_rate"]
        > spread.summary["throughput"]["prefix_hit_rate"]
    )
    assert affine.summary["kv_offload"]["host_hit_rate"] > 0


def run_random(num_replicas: int, num_decode: int, routing: str, host_gb: float, seed: int) -> Any:
    m = mapping({"host_memory_gb": host_gb}, num_blocks=96)
    m["workload"] = workload(num_requests=80, seed=seed, groups=12)
    m["cluster"] = {"num_replicas": num_replicas, "global_scheduler": {"policy": routing}}
    if num_decode:
        m["cluster"]["decode"] = {"num_replicas": num_decode}
    return run(m)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_replicas=st.integers(1, 3),
    num_decode=st.integers(0, 2),
    routing=st.sampled_from(["round_robin", "prefix_affinity", "least_kv_load"]),
    host_gb=st.sampled_from([0.05, 0.5, 4.0]),
    seed=st.integers(0, 5),
)
def test_every_request_completes_once_and_runs_repeat_bit_for_bit(
    num_replicas: int, num_decode: int, routing: str, host_gb: float, seed: int
) -> None:
    # The core refuses to end a run while any replica still holds a block (none leak, on
    # either pool), so completing is itself a check of conservation.
    first = run_random(num_replicas, num_decode, routing, host_gb, seed)
    c = first.columns
    assert sorted(c["request_id"].tolist()) == list(range(80))
    assert (c["host_hit_tokens"] <= c["prefix_hit_tokens"]).all()
    assert (c["host_hit_tokens"] <= c["host_load_tokens"]).all()
    # A request that loaded from host memory got its first token after the load.
    loaded = (c["host_hit_tokens"] > 0) & (c["num_restarts"] == 0)
    landed = c["arrived_at"] + c["host_load_wait_s"] + c["host_load_s"]
    assert (c["first_token_at"][loaded] > landed[loaded]).all()
    again = run_random(num_replicas, num_decode, routing, host_gb, seed)
    for name, column in c.items():
        assert np.array_equal(column, again.columns[name], equal_nan=True), name


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"kv_offload": {"host_memory_gb": 0}}, "replica.kv_offload.host_memory_gb"),
        ({"kv_offload": {"host_memory_gb": -5}}, "replica.kv_offload.host_memory_gb"),
        ({"kv_offload": {"host_memory_gb": 1e-6}}, "replica.kv_offload.host_memory_gb"),
        (
            {"kv_offload": {"host_memory_gb": 1, "host_hit_weight": 2}},
            "replica.kv_offload.host_hit_weight",
        ),
        # The default router (round_robin) does not read the tier: the weight would be ignored.
        (
            {"kv_offload": {"host_memory_gb": 1, "host_hit_weight": 0.3}},
            "replica.kv_offload.host_hit_weight",
        ),
        ({"kv_offload": {"host_memory_gb": 1, "latency_us": -1}}, "replica.kv_offload.latency_us"),
        ({"kv_offload": {"host_memory_gb": 1, "bandwidth": 3}}, "replica.kv_offload.bandwidth"),
        (
            {
                "kv_offload": {"host_memory_gb": 1},
                "scheduler": {"policy": "vllm_v1", "vllm_v1": {"enable_prefix_caching": False}},
            },
            "replica.kv_offload",
        ),
        (
            {"kv_offload": {"host_memory_gb": 1}, "scheduler": {"policy": "sarathi"}},
            "replica.kv_offload",
        ),
        (
            {"scheduler": {"policy": "vllm_v1", "vllm_v1": {"host_num_blocks": 64}}},
            "replica.scheduler.vllm_v1.host_num_blocks",
        ),
    ],
)
def test_bad_configs_name_their_key(change: dict[str, Any], key: str) -> None:
    m = mapping()
    m["replica"].update(change)
    with pytest.raises(ConfigError) as caught:
        run(m)
    assert caught.value.field == key, caught.value


def test_a_workload_without_prefix_identity_is_refused_with_a_tier() -> None:
    m = mapping({"host_memory_gb": 1.0})
    m["workload"] = {
        "kind": "synthetic",
        "num_requests": 10,
        "arrival": {"kind": "poisson", "qps": 10.0},
        "prompt_tokens": {"kind": "fixed", "value": 100},
        "output_tokens": {"kind": "fixed", "value": 5},
    }
    with pytest.raises(ConfigError, match="prefix identity") as caught:
        run(m)
    assert caught.value.field == "replica.kv_offload"


def pd_mapping(decode_tier: dict[str, Any] | None, prefill_tier: dict[str, Any] | None) -> Any:
    m = mapping(prefill_tier, num_blocks=60)
    m["workload"] = workload(num_requests=120, seed=5, groups=12)
    m["cluster"] = {"num_replicas": 2, "decode": {"num_replicas": 2}}
    if decode_tier is not None:
        m["cluster"]["decode"]["kv_offload"] = decode_tier
    return m


def test_a_decode_pool_takes_its_own_tier_or_the_prefill_pools() -> None:
    # Unset: the decode pool inherits [replica.kv_offload], as before.
    inherited = run(pd_mapping(None, {"host_memory_gb": 1.0}))
    tier = inherited.summary["config"]["decode"]["kv_offload"]
    assert tier["host_memory_gb"] == 1.0
    assert tier["host_num_blocks"] == inherited.summary["config"]["kv_offload"]["host_num_blocks"]
    # Its own: a tier on the decode pool alone, described and summarized.
    own = run(pd_mapping({"host_memory_gb": 1.0}, None))
    assert "kv_offload" not in own.summary["config"]
    assert own.summary["config"]["decode"]["kv_offload"]["host_num_blocks"] == 476
    assert own.summary["kv_offload"]["loaded_blocks"] > 0
    decode_replica = own.columns["replica"] >= 2
    assert own.columns["host_load_tokens"][decode_replica].sum() > 0
    assert own.columns["host_load_tokens"][~decode_replica].sum() == 0
    # A different size changes the answer.
    small = run(pd_mapping({"host_memory_gb": 0.05}, None))
    assert (
        small.summary["kv_offload"]["loaded_blocks"] != own.summary["kv_offload"]["loaded_blocks"]
    )


@pytest.mark.parametrize(
    ("decode_tier", "key"),
    [
        (
            {"host_memory_gb": 1.0, "host_hit_weight": 0.5},
            "cluster.decode.kv_offload.host_hit_weight",
        ),
        ({"host_memory_gb": 0}, "cluster.decode.kv_offload.host_memory_gb"),
    ],
)
def test_a_decode_pools_bad_tier_names_its_key(decode_tier: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        run(pd_mapping(decode_tier, None))
    assert caught.value.field == key, caught.value


def test_a_decode_tier_without_prefix_identity_is_refused() -> None:
    m = pd_mapping({"host_memory_gb": 1.0}, None)
    del m["workload"]["shared_prefix"]
    with pytest.raises(ConfigError) as caught:
        run(m)
    assert caught.value.field == "cluster.decode.kv_offload"
