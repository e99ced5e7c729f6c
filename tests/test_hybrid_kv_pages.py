"""vLLM 0.33's hybrid layout for attention layers of different page sizes
(``simulation/hybrid_kv_pages``), by hand on Gemma-4-26B-A4B (bf16 KV, block 16): a sliding
layer caches 8,192 B a token (a 131,072 B page), a global layer 4,096 B (65,536 B), so
``unify_kv_cache_spec_page_size`` gives the global layers blocks of 32; 25 sliding layers and
5 global ones make five sliding groups and one full group of 5 layers, a block of
5 x 131,072 = 655,360 B. ``benches/peers/vllm_kv_spec_diff.py`` checks the same against
vLLM's own planner (98,304 blocks in 60 GiB).

The simulator's runs (``plan_pages``): one H100 with 10% kept free leaves 80 GiB x 0.9 -
50,465,226,240 B of weights = 26,844,185,088 B of KV, 40,960 blocks of 655,360 B. A request
of 8,448 tokens holds in each sliding group ceil((1,024 - 1 + 2,048 in flight) / 16) + 1 =
193 blocks and in the full group 8,448 / 32 = 264: 1,229, so 33 at once (vLLM's
``get_max_concurrency_for_kv_cache_config``); with every layer full attention a token takes
25 x 8,192 + 5 x 4,096 = 225,280 B, 7,447 blocks of 16 tokens, 528 per request: 14."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard.catalog import model
from tokenyard.errors import ConfigError
from tokenyard.simulation import simulate
from tokenyard.simulation.hybrid_kv import requests_held
from tokenyard.simulation.hybrid_kv_pages import blocks_per_request, fitting_tokens, pages_layout
from tokenyard.simulation.planner import KvGroup, dtype_bytes, kv_groups
from tokenyard.simulation.replica_plan import _hybrid_scheduler, plan_for, planning_notes

GEMMA4 = "google/gemma-4-26B-A4B"
GROUP_SIZES = (16, 16, 16, 16, 16, 32)


def gemma4() -> tuple[KvGroup, ...]:
    spec = model("google/gemma-4-26B-A4B")
    return kv_groups(spec, 1, 1, dtype_bytes("bf16", "bf16")[1])


def test_gemma4_global_layers_get_the_larger_block() -> None:
    layout = pages_layout(gemma4(), 16, "gemma-4")
    assert [g.mixer for g in layout.groups] == ["sliding"] * 5 + ["gqa"]
    assert layout.group_block_sizes == (16, 16, 16, 16, 16, 32)
    assert (layout.layers_per_group, layout.bytes_per_block) == (5, 655_360)
    assert (layout.scheduler_block_size, layout.hash_block_size) == (32, 16)
    assert (60 << 30) // layout.bytes_per_block == 98_304


def test_a_request_holds_blocks_of_each_groups_size() -> None:
    layout = pages_layout(gemma4(), 16, "gemma-4")
    # 32,768 tokens, 1 in flight: each sliding group ceil(1,024 / 16) + 1 = 65, the full
    # group ceil(32,768 / 32) = 1,024.
    assert blocks_per_request(layout, 32_768, 1) == 5 * 65 + 1_024


def test_pages_that_do_not_divide_the_largest_or_beside_state_are_refused() -> None:
    odd = (KvGroup("sliding", 2, 2 * 300, 64), KvGroup("gqa", 2, 2 * 200, 0))
    with pytest.raises(ConfigError, match="do not divide"):
        pages_layout(odd, 16, "odd")
    state = (KvGroup("gqa", 2, 2 * 256, 0), KvGroup("gdn", 2, 0, 0, 1 << 20))
    with pytest.raises(ConfigError, match="linear-attention state"):
        pages_layout(state, 16, "state")


# ---- the simulator's runs ------------------------------------------------------------------


def config(
    *,
    hybrid: bool | None = None,
    cluster: dict[str, Any] | None = None,
    workload: dict[str, Any] | None = None,
    **replica: Any,
) -> Any:
    """One H100 replica of Gemma-4-26B-A4B, 10% of its memory kept free, requests of at most
    8,448 tokens; by default 64 requests of 8,192 + 256 tokens, all at once."""
    table: dict[str, Any] = {
        "model": GEMMA4,
        "device": "h100-sxm",
        "memory_margin_fraction": 0.1,
        "scheduler": {"max_request_tokens": 8448},
        **replica,
    }
    if hybrid is not None:
        table["hybrid_kv_cache_manager"] = hybrid
    jobs = workload or synthetic_workload(
        64, qps=1000.0, prompt_tokens=8192, output_tokens=256, seed=1
    )
    return one_replica(table, jobs, cluster=cluster or {})


def test_gemma4_is_planned_with_groups_of_different_block_sizes_by_default() -> None:
    unset, disabled = plan_for(config()), plan_for(config(hybrid=False))
    assert unset.available_kv_bytes == disabled.available_kv_bytes == 26_844_185_088
    assert [g.mixer for g in unset.kv_cache_groups] == ["sliding"] * 5 + ["gqa"]
    assert unset.kv_group_block_sizes == GROUP_SIZES
    assert unset.kv_block_size == 16  # the hash block size: the step scheduler's block_size
    assert (unset.num_blocks, unset.max_batch_size) == (40_960, 33)
    assert (disabled.num_blocks, disabled.max_batch_size) == (7_447, 14)
    assert disabled.kv_cache_groups == disabled.kv_group_block_sizes == ()
    assert plan_for(config(hybrid=True)).kv_group_block_sizes == GROUP_SIZES
    assert requests_held(config(), unset, 8448) == 33


def test_the_banner_states_the_layout_against_the_full_attention_plan() -> None:
    note = planning_notes(config(), plan_for(config()))[0]
    assert note.startswith(
        "KV PLANNED WITH vLLM's HYBRID KV CACHE MANAGER (replica.hybrid_kv_cache_manager "
        "unset: vLLM 0.33 default): 6 KV groups of 5 layers (5 x sliding (window 1024) in "
        "blocks of 16 + gqa in blocks of 32: "
    )
    assert "prefix hits land on 32 tokens, requests hashed at 16" in note
    assert "655,360 B per block: 40,960 blocks; a 8,448-token request holds 1229 blocks" in note
    assert "so 33 run at once" in note
    assert "against 7,447 blocks of 528 per request, 14, with --disable-hybrid" in note


def test_the_step_scheduler_takes_each_groups_block_size() -> None:
    """40,959 blocks (the null block kept): the five window groups never need more than
    193 each, so the full group may take 40,959 - 965 = 39,994 blocks of 32 tokens."""
    plan = plan_for(config())
    assert fitting_tokens(plan, 40_959, 2048) == 39_994 * 32
    scheduler = _hybrid_scheduler(config(), plan, plan.num_blocks, align=False)
    assert (scheduler.block_size, scheduler.kv_group_block_sizes) == (16, GROUP_SIZES)
    assert scheduler.max_model_len == 8448
    assert len(scheduler.kv_groups) == 6


def shared_prefix_job(hybrid: bool | None) -> Any:
    """20 requests two seconds apart, each opening with one 1,010-token shared prompt: 63
    whole hash blocks of 16 (1,008 tokens)."""
    jobs = synthetic_workload(
        20,
        qps=0.5,
        prompt_tokens=(1100, 1500),
        output_tokens=8,
        seed=3,
        shared_prefix={"num_groups": 1, "prefix_tokens": 1010, "share_ratio": 1.0},
    )
    return config(hybrid=hybrid, workload=jobs, scheduler={"max_request_tokens": 8192})


def test_gemma4_replays_with_its_groups_and_hits_land_on_their_lcm() -> None:
    """The groups' hits land on 32 tokens (vLLM's scheduler block size): 1,008 // 32 x 32 =
    992; with every layer full attention on the 16-token blocks, 1,008."""
    grouped = simulate(shared_prefix_job(None)).columns["prefix_hit_tokens"]
    full = simulate(shared_prefix_job(False)).columns["prefix_hit_tokens"]
    assert list(grouped) == [0] + [992] * 19
    assert list(full) == [0] + [1008] * 19


def test_gemma4_holds_more_requests_at_once_with_its_groups() -> None:
    """128 requests of 6,144 + 2,048 tokens at once, memory binding. Full attention: a
    running request holds at least ceil(6,145 / 16) = 385 of the 7,446 blocks, so at most
    19 run. Groups: at least 6,144 / 32 = 192 full blocks and 64 per window group, 512, so
    at most 40,959 // 512 = 79, and at least vLLM's max concurrency, 33."""
    jobs = synthetic_workload(128, qps=1000.0, prompt_tokens=6144, output_tokens=2048, seed=1)
    runs = {h: simulate(config(hybrid=h, workload=jobs)).summary for h in (None, False)}
    peak = {h: s["replicas"]["batch_size"]["max"] for h, s in runs.items()}
    assert peak[False] == 19
    assert 33 <= peak[None] <= 79
    rate = {h: s["throughput"]["requests_per_s"] for h, s in runs.items()}
    assert rate[None] > 1.5 * rate[False]


PD = {"num_replicas": 1, "decode": {"num_replicas": 1}}
EAGLE = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.7}
NGRAM_16 = {"method": "ngram", "num_speculative_tokens": 16, "acceptance_rate": 0.7}


def test_pd_plans_the_groups_on_both_pools_and_the_link_moves_each_groups_kv() -> None:
    """Under P/D (a KV connector, served beside groups of different block sizes since
    branch bszconn) both pools plan vLLM's groups, unset or true; the link moves every
    token of the 5 full-attention layers (ceil(L / 32) blocks in vLLM) and at most the
    1,024-token window and one 16-token block of the 25 sliding layers (ceil(1023 / 16) + 1
    = 65 blocks), as NixlConnector's request_finished_all_groups hands each group's blocks."""
    for hybrid in (None, True):
        plan = plan_for(config(hybrid=hybrid, cluster=PD))
        assert plan.kv_group_block_sizes == GROUP_SIZES
        assert (plan.kv_groups_note or "").startswith("KV PLANNED WITH vLLM's HYBRID")
    result = simulate(
        config(
            cluster=PD,
            workload=synthetic_workload(
                4, qps=1000.0, prompt_tokens=2048, output_tokens=16, seed=1
            ),
        )
    )
    link = result.summary["config"]["decode"]["link"]
    assert link["window_tokens"] == 65 * 16 == 1024 + 16
    assert link["kv_bytes_per_token"] == 5 * 4096  # 5 global layers: 2 heads of 512 x 2 B x K/V
    assert link["window_bytes_per_token"] == 25 * 8192  # 8 heads of 256 x 2 B x K/V
    # 2,048 prompt tokens each, one NVLink lane (TP 1 a side, one node).
    moved = 2048 * 5 * 4096 + 1040 * 25 * 8192
    want = link["nvlink_latency_s"] + moved / (link["nvlink_gbps"] * 1e9)
    pd = result.summary["disaggregation"]
    assert pd["num_transferred"] == 4
    assert pd["transfer_s"]["max"] == pytest.approx(want, rel=1e-9)


def test_pd_at_tp_8_moves_a_window_and_one_block_of_the_window_groups_own_size() -> None:
    """At TP 8 the sliding layers' pages are the smaller: their groups take blocks of 32,
    the global group 16, hashed at 16. The link moves the window and one block of 32 (vLLM:
    ceil(1023 / 32) + 1 = 33 blocks), not of the hash block size."""
    jobs = synthetic_workload(2, qps=1000.0, prompt_tokens=2048, output_tokens=4, seed=1)
    tp8 = config(cluster=PD, tensor_parallel_size=8, workload=jobs)
    plan = plan_for(tp8)
    assert plan.kv_group_block_sizes == (32, 32, 32, 32, 32, 16)
    assert plan.kv_block_size == 16
    link = simulate(tp8).summary["config"]["decode"]["link"]
    assert link["window_tokens"] == 33 * 32 == 1024 + 32


def test_pd_pools_whose_groups_differ_are_refused_naming_the_decode_block_size() -> None:
    """A decode pool at blocks of 32 plans groups of 32 and 64 hashed at 32 against the
    prefill pool's 16 and 32: the connector moves each group's blocks as they are."""
    pd = {
        "num_replicas": 1,
        "decode": {"num_replicas": 1, "scheduler": {"vllm_v1": {"block_size": 32}}},
    }
    with pytest.raises(ConfigError, match=r"\(32, 32, 32, 32, 32, 64\)") as err:
        simulate(
            config(
                cluster=pd,
                workload=synthetic_workload(
                    2, qps=1000.0, prompt_tokens=256, output_tokens=4, seed=1
                ),
            )
        )
    assert err.value.field == "cluster.decode.scheduler.vllm_v1.block_size"
    assert err.value.value == "32"
    # At one block size a decode pool at TP 8 (sliding groups at 32, global at 16) against
    # the prefill pool's TP 1 (16 and 32): the TP is the key to change.
    tp8 = {"num_replicas": 1, "decode": {"num_replicas": 1, "tensor_parallel_size": 8}}
    with pytest.raises(ConfigError, match=r"\(32, 32, 32, 32, 32, 16\)") as err:
        simulate(
            config(
                cluster=tp8,
                workload=synthetic_workload(
                    2, qps=1000.0, prompt_tokens=256, output_tokens=4, seed=1
                ),
            )
        )
    assert err.value.field == "cluster.decode.tensor_parallel_size"
    assert err.value.value == "8"


def test_a_request_that_fits_only_the_groups_is_planned_with_them() -> None:
    """131,072 tokens: 29.5 GB with every layer full attention (225,280 B a token) against
    the 26.8 GB there are; the groups need 131,072 / 32 + 5 x 193 = 5,061 of their 40,960
    blocks: 8 at once, under P/D too (the step scheduler serves the connector beside
    them)."""
    longest = {"scheduler": {"max_request_tokens": 131072}}
    assert plan_for(config(**longest)).max_batch_size == 40_960 // 5_061 == 8
    with pytest.raises(ConfigError, match="not enough for one request of 131072") as err:
        plan_for(config(hybrid=False, **longest))
    assert err.value.field == "replica.device"
    assert plan_for(config(cluster=PD, **longest)).max_batch_size == 8


@pytest.mark.parametrize("k", [15, 16, 32])
def test_speculative_steps_of_any_length_keep_the_groups(k: int) -> None:
    """1 + 15 drafts fit the 16-token hash block, 1 + 16 and 1 + 32 do not: the step
    scheduler runs them all, counting a step's slots on each group's own block size (vLLM's
    _spec_decode_step_blocks)."""
    ngram = {"method": "ngram", "num_speculative_tokens": k, "acceptance_rate": 0.7}
    plan = plan_for(config(speculative=ngram))
    assert plan.kv_group_block_sizes == GROUP_SIZES
    assert plan.kv_groups_note is None or "slots" not in plan.kv_groups_note
    jobs = synthetic_workload(20, qps=5.0, prompt_tokens=(500, 3000), output_tokens=50, seed=2)
    summary = simulate(config(speculative=ngram, workload=jobs)).summary
    assert summary["num_requests"] == 20


@pytest.mark.parametrize(("caching", "drop"), [(True, False), (True, True), (False, False)])
def test_eagle_keeps_the_groups_with_prefix_caching_on_or_off(caching: bool, drop: bool) -> None:
    """vLLM's EAGLE under prefix caching (hash look-ahead, or the trailing-block drop with
    eagle_block_drop, with the partial tail-block entries its full-attention managers
    register beside differing sizes) is served by the step scheduler as without it: the
    groups, the banner naming them (not the full-attention fallback's)."""
    v1: dict[str, Any] = {"enable_prefix_caching": caching, "eagle_block_drop": drop}
    if drop:
        v1["prefix_cache"] = "block_hash"  # the drop acts on block-hash hits
    off = {"policy": "vllm_v1", "vllm_v1": v1}
    scheduler = {"max_request_tokens": 8448, **off}
    plan = plan_for(config(speculative=EAGLE, scheduler=scheduler))
    assert plan.kv_group_block_sizes == GROUP_SIZES
    assert plan.kv_groups_note.startswith("KV PLANNED WITH vLLM's HYBRID KV CACHE MANAGER")
    # Two shared 1,000-token prefixes: the requests' prefix identity, so hits happen.
    shared = {"num_groups": 2, "prefix_tokens": 1000, "share_ratio": 1.0}
    jobs = synthetic_workload(
        20, qps=5.0, prompt_tokens=(1500, 3000), output_tokens=50, seed=2, shared_prefix=shared
    )
    summary = simulate(config(speculative=EAGLE, scheduler=scheduler, workload=jobs)).summary
    assert summary["num_requests"] == 20
    assert (summary["throughput"]["prefix_hit_rate"] > 0) == caching
    assert plan_for(config(speculative=EAGLE)).kv_group_block_sizes == GROUP_SIZES
