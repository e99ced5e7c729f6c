"""A disaggregated decode pool with its own expert and attention data parallelism
(``cluster.decode.expert_parallel_size`` / ``data_parallel_size``, docs/disaggregation.md):
wide-EP decode as DeepSeek and Kimi are served, its memory planned per DP rank, its steps
priced for its layout, one scheduler per DP rank; the prefill pool's EP/DP alongside; and
contradictory layouts refused naming the key."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard import catalog
from tokenyard.errors import ConfigError
from tokenyard.recommend.cost import pools_from_summary
from tokenyard.simulation import simulate
from tokenyard.simulation.run import decode_config, plan_for

QWEN = "Qwen/Qwen3-30B-A3B"  # 48 layers, 4 KV heads of 128, 128 experts (top-8)
WORKLOAD = synthetic_workload(30, qps=10.0, prompt_tokens=(100, 1000), output_tokens=(5, 50))
#: The decode pools compared: one replica of TP 4, or of TP 1 x DP 4 with EP 4 (4 GPUs each).
TP4 = {"num_replicas": 1, "tensor_parallel_size": 4}
EP4_DP4 = {
    "num_replicas": 1,
    "tensor_parallel_size": 1,
    "expert_parallel_size": 4,
    "data_parallel_size": 4,
}


@pytest.fixture(scope="module", autouse=True)
def _qwen_bundled() -> None:
    if QWEN not in catalog.bundled_model_names():
        pytest.skip("aiconfigurator-core's bundled model configs are not installed")


def _pd(decode: dict[str, Any], execution: str = "roofline", **replica: Any) -> Any:
    """Qwen3-30B-A3B on H100s: one prefill replica of TP 2 (or ``replica``'s layout) and
    the ``decode`` pool."""
    layout = {"model": QWEN, "device": "h100-sxm", "tensor_parallel_size": 2, **replica}
    return one_replica(layout, WORKLOAD, cluster={"decode": decode}, execution={"model": execution})


def test_the_decode_pool_plans_memory_per_dp_rank() -> None:
    """KV per token on one GPU: TP 4 holds one of the 4 KV heads (48 x 1 x 128 x 2 x 2 B),
    a TP 1 rank all 4; EP 4 x DP 4 keeps attention and embeddings whole on each GPU and
    32 of the 128 experts whole. Blocks: (80 GiB x 0.9 - weights) / (16 x KV a token)."""
    usable = int(80 * 2**30 * 0.9)
    tp4 = plan_for(decode_config(_pd(TP4)))
    ep4 = plan_for(decode_config(_pd(EP4_DP4)))
    assert tp4.kv_bytes_per_token == 48 * 1 * 128 * 2 * 2 == 24_576
    assert ep4.kv_bytes_per_token == 48 * 4 * 128 * 2 * 2 == 98_304
    assert ep4.parameter_bytes_per_device > tp4.parameter_bytes_per_device
    for plan in (tp4, ep4):
        blocks = (usable - plan.parameter_bytes_per_device) // (16 * plan.kv_bytes_per_token)
        assert plan.num_blocks == blocks
    assert (tp4.num_blocks, ep4.num_blocks) == (157_735, 37_976)
    # The pool as a whole: one TP 4 cache of 2.52M tokens against four of 608K.
    assert tp4.max_kv_tokens == 2_523_760
    assert 4 * ep4.max_kv_tokens == 4 * 607_616


def test_each_decode_dp_rank_is_a_scheduler_with_its_own_kv_and_link() -> None:
    result = simulate(_pd(EP4_DP4))
    summary, c = result.summary, result.columns
    decode = summary["config"]["decode"]
    assert decode["layout"] == "TP 1 x DP 4 (4 schedulers), EP 4, PP 1"
    assert (decode["expert_parallel_size"], decode["data_parallel_size"]) == (4, 4)
    assert decode["num_blocks"] == 37_976  # one rank's
    # Prefill replica 0, then decode ranks 1-4: five schedulers, the ranks all used.
    assert len(summary["replicas"]["busy_fraction"]) == 5
    handed = c["prefill_replica"] >= 0
    assert set(c["replica"][handed].tolist()) == {1, 2, 3, 4}
    assert 0 < summary["disaggregation"]["decode_busy_fraction"] <= 1
    # A rank's KV arrives on its one GPU: 98,304 B a token over one NVLink lane at
    # 450 GB/s (prefill TP 2 and the 4 ranks share an 8-GPU node), 5 us.
    assert decode["link"]["decode_gpus"] == 1
    tokens = c["kv_transfer_tokens"][handed].astype(np.float64)
    moved = tokens > 0
    expected = 5e-6 + tokens * 98_304 / 450e9
    assert np.allclose(c["kv_transfer_s"][handed][moved], expected[moved], rtol=1e-9)
    # Cost counts each rank at its own GPUs: 2 for prefill, 1 per decode rank.
    usage = pools_from_summary(_pd(EP4_DP4), summary)
    assert [u.num_gpus for u in usage] == [2, 1, 1, 1, 1]


def test_the_decode_pool_is_priced_for_its_own_layout() -> None:
    """The TP 4 pool's steps have no all-to-all; the EP 4 x DP 4 pool's dispatch and
    combine its ranks' tokens, and its decode runs at a different speed."""
    tp4 = simulate(_pd(TP4)).summary
    ep4 = simulate(_pd(EP4_DP4)).summary
    assert "a2a" not in tp4["config"]["decode"]["execution"]
    assert ep4["config"]["decode"]["execution"]["a2a"].startswith("roofline: tokens x hidden")
    assert "a2a" not in ep4["config"]["execution"], "the prefill pool (TP 2) has none"
    assert ep4["latency_s"]["tpot"]["mean"] != pytest.approx(
        tp4["latency_s"]["tpot"]["mean"], rel=1e-3
    )


def test_a_prefill_pool_with_expert_and_data_parallelism_is_served() -> None:
    """Prefill TP 1 x DP 2 with EP 2 (two schedulers), decode TP 2 with experts split by
    TP: the decode pool sets its EP and DP to 1, as they would otherwise be the replica's."""
    config = _pd(
        {"tensor_parallel_size": 2, "expert_parallel_size": 1, "data_parallel_size": 1},
        tensor_parallel_size=1,
        expert_parallel_size=2,
        data_parallel_size=2,
    )
    result = simulate(config)
    c = result.columns
    assert result.summary["config"]["layout"] == "TP 1 x DP 2 (2 schedulers), EP 2, PP 1"
    assert result.summary["config"]["decode"]["layout"] == "TP 2, PP 1"
    handed = c["prefill_replica"] >= 0
    assert set(c["prefill_replica"][handed].tolist()) == {0, 1}
    assert set(c["replica"][handed].tolist()) == {2}


@pytest.mark.parametrize(
    ("replica", "decode", "field", "words"),
    [
        # The replica's EP 2 / DP 2 carried into a TP 2 decode pool: EP would need 4.
        (
            {"tensor_parallel_size": 1, "expert_parallel_size": 2, "data_parallel_size": 2},
            {"tensor_parallel_size": 2},
            "cluster.decode.expert_parallel_size",
            "= 2 x 2 = 4 (vLLM's --enable-expert-parallel spreads the experts over every GPU "
            "of the replica), got 2 (unset in [cluster.decode], taken from [replica]: "
            "expert_parallel_size, data_parallel_size)",
        ),
        (
            {},
            {"tensor_parallel_size": 2, "expert_parallel_size": 4, "data_parallel_size": 1},
            "cluster.decode.expert_parallel_size",
            "tensor_parallel_size x data_parallel_size = 2 x 1 = 2",
        ),
        ({}, {"expert_parallel_size": 0}, "cluster.decode.expert_parallel_size", "got 0"),
        ({}, {"data_parallel_size": 600}, "cluster.decode.data_parallel_size", "got 600"),
        (
            {},
            {"num_replicas": 600, "expert_parallel_size": 8, "data_parallel_size": 8},
            "cluster.decode.num_replicas",
            "600 replicas of 8 data-parallel ranks make 4800 schedulers",
        ),
    ],
)
def test_contradictory_decode_layouts_are_refused_naming_the_key(
    replica: dict[str, Any], decode: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as error:
        _pd(decode, **replica)
    assert error.value.field == field
    assert words in str(error.value)


def test_decode_expert_parallelism_needs_experts_it_divides() -> None:
    """Checked with the model (the decode pool's plan): named by the decode pool's key."""
    with pytest.raises(ConfigError) as error:
        simulate(
            _pd({"tensor_parallel_size": 1, "expert_parallel_size": 3, "data_parallel_size": 3})
        )
    assert error.value.field == "cluster.decode.expert_parallel_size"
    assert str(error.value).startswith(
        "cluster.decode.expert_parallel_size: 3 does not divide the 128 routed experts"
    )
    dense = one_replica(
        {"model": "llama-3.1-8b", "device": "h100-sxm"},
        WORKLOAD,
        cluster={"decode": {"expert_parallel_size": 2, "data_parallel_size": 2}},
        execution={"model": "roofline"},
    )
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model") as error:
        simulate(dense)
    assert error.value.field == "cluster.decode.expert_parallel_size"


def test_a_search_label_tells_the_decode_pools_dp_from_the_replicas() -> None:
    from tokenyard.search.tables import label

    overrides = {
        "replica.data_parallel_size": 2,
        "cluster.decode.data_parallel_size": 4,
        "cluster.decode.expert_parallel_size": 4,
    }
    assert label(overrides, {}) == "dp=2 decode_dp=4 decode_ep=4"
