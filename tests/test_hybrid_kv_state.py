"""vLLM 0.33's hybrid KV cache manager for linear-attention models and under P/D
(``simulation/hybrid_kv.py``, ``disagg_config.hybrid_link_terms``): Mamba groups in the
pool with vLLM's aligned block size, and the groups' KV moved over the P/D link.

Hand arithmetic (Qwen3.5-35B-A3B, TP 2, bf16 KV): an attention layer caches 2 (K, V) x 1
KV head x 256 x 2 B = 1,024 B per token; a GDN layer holds a 1,073,152 B state per request
(32,194,560 B over 30 layers: ``MambaStateShapeCalculator.gated_delta_net_state_shape``,
checked against vLLM in ``benches/peers/vllm_kv_spec_diff.py``). vLLM grows the attention
block until one layer's page holds a state page (``Platform._align_hybrid_block_size``,
``vllm/platforms/interface.py``): 16 x ceil(1,073,152 / (16 x 1,024)) = 16 x 66 = 1,056
tokens, a page of 1,081,344 B, the state padded to it. 10 full + 30 GDN layers form groups of
10 (30 >= 1.5 x 10: ``_get_kv_cache_groups_uniform_page_size``): 3 GDN groups + 1 full, a
block of 10 x 1,081,344 = 10,813,440 B. A request of 8,448 tokens holds ceil(8,448 / 1,056) =
8 full-attention blocks and, per GDN group, two pages in vLLM's default
``mamba_cache_mode="align"`` (``MambaSpec.max_memory_usage_bytes``): 14; one page with
prefix caching off (``"none"``): 11. The align mode's prefix hits and chunk split are in
tests/test_hybrid_kv_align.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard.catalog import model as catalog_model
from tokenyard.errors import ConfigError
from tokenyard.simulation import simulate
from tokenyard.simulation.cli import format_summary
from tokenyard.simulation.hybrid_kv import aligned_block_size, requests_held, vllm_kv_layout
from tokenyard.simulation.planner import dtype_bytes, kv_groups
from tokenyard.simulation.run import plan_for, planning_notes

QWEN = "Qwen/Qwen3.5-35B-A3B"
NEMOTRON = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
GPT_OSS = "openai/gpt-oss-20b"
PD = {"num_replicas": 1, "decode": {"num_replicas": 1}}
#: The pool benches/peers/vllm_kv_spec_diff.py sizes with vLLM's own
#: get_kv_cache_config_from_groups (60 GiB).
PEER_POOL_BYTES = 60 * 2**30


def config(
    model: str = QWEN,
    *,
    hybrid: bool | None = None,
    cluster: dict[str, Any] | None = None,
    scheduler: dict[str, Any] | None = None,
    **replica: Any,
) -> Any:
    """64 requests of 8,192 + 256 tokens at once on one H200 at TP 2, half its memory kept
    free."""
    table: dict[str, Any] = {
        "model": model,
        "device": "h200",
        "tensor_parallel_size": 2,
        "memory_margin_fraction": 0.5,
        "scheduler": {"max_request_tokens": 8448, **(scheduler or {})},
        **replica,
    }
    if hybrid is not None:
        table["hybrid_kv_cache_manager"] = hybrid
    workload = synthetic_workload(64, qps=1000.0, prompt_tokens=8192, output_tokens=256, seed=1)
    return one_replica(table, workload, cluster=cluster or {})


# ---- the plan: vLLM's arithmetic -----------------------------------------------------------


def test_the_attention_block_grows_until_a_page_holds_a_mamba_state() -> None:
    assert aligned_block_size(1024, 1_073_152, 16) == 1056
    # Kernel alignment is max(16, block_size): 32 x ceil(1,073,152 / 32,768) = 32 x 33.
    assert aligned_block_size(1024, 1_073_152, 32) == 1056
    assert aligned_block_size(1024, 1_073_152, 2048) == 2048, "a larger block is kept"
    # fp8 KV halves the attention page: 16 x ceil(1,073,152 / 8,192) = 2,096.
    assert aligned_block_size(512, 1_073_152, 16) == 2096


def test_qwen35_pool_is_vllms_arithmetic_for_its_mamba_groups() -> None:
    """Unset is vLLM 0.33's default (hybrid: required for Mamba state). The pool takes the
    memory the plan without groups reserved for 256 requests' state: 41,017,137,536 B,
    3,793 blocks of 10,813,440 B; 3,793 // 14 = 270 requests at once in vLLM's default
    align mode, 3,793 // 11 = 344 with prefix caching off."""
    plan = plan_for(config())
    assert [(g.mixer, g.layers) for g in plan.kv_cache_groups] == [("gdn", 10)] * 3 + [("gqa", 10)]
    assert plan.kv_block_size == 1056
    assert plan.kv_bytes_per_token * 1056 == 10_813_440
    # Other policies run no KV groups: the state is reserved, for vLLM's default 256.
    reserved = plan_for(config(scheduler={"policy": "sarathi"}))
    assert reserved.kv_cache_groups == ()
    assert reserved.reserved_state_bytes == 256 * 32_194_560
    assert plan.available_kv_bytes == reserved.available_kv_bytes + reserved.reserved_state_bytes
    assert plan.reserved_state_bytes == 0
    assert plan.num_blocks == 41_017_137_536 // 10_813_440 == 3_793
    assert plan.max_batch_size == 3_793 // 14 == 270
    off = plan_for(config(scheduler={"vllm_v1": {"enable_prefix_caching": False}}))
    assert off.num_blocks == 3_793
    assert off.max_batch_size == 3_793 // 11 == 344


@pytest.mark.parametrize(
    ("model", "tp", "kv", "block", "num_groups", "num_blocks"),
    [
        # vLLM's own get_kv_cache_config_from_groups over 60 GiB (vllm_kv_spec_diff.py).
        (QWEN, 2, "bf16", 1056, 4, 5_957),
        (QWEN, 2, "fp8", 2096, 4, 6_003),
        # Nemotron-3-Nano: 6 attention (1,024 B/token) + 23 Mamba2 layers (2,134,016 B):
        # block 16 x ceil(2,134,016 / 16,384) = 2,096; groups of 6: 4 Mamba2 + 1 full.
        (NEMOTRON, 1, "bf16", 2096, 5, 5_002),
        (NEMOTRON, 1, "fp8", 4176, 5, 5_021),
    ],
)
def test_the_layout_gives_vllms_num_blocks(
    model: str, tp: int, kv: str, block: int, num_groups: int, num_blocks: int
) -> None:
    groups = kv_groups(catalog_model(model), tp, 1, dtype_bytes("bf16", kv)[1])
    layout = vllm_kv_layout(groups, 16, model)
    assert (layout.block_size, len(layout.groups)) == (block, num_groups)
    assert PEER_POOL_BYTES // layout.bytes_per_block == num_blocks


def test_false_is_refused_for_linear_state_and_true_is_the_default() -> None:
    with pytest.raises(ConfigError, match="cannot promote a MambaSpec") as err:
        plan_for(config(hybrid=False))
    assert err.value.field == "replica.hybrid_kv_cache_manager"
    assert plan_for(config(hybrid=True)).kv_cache_groups == plan_for(config()).kv_cache_groups
    # Other policies keep the state reservation (no KV groups there).
    sarathi = plan_for(config(scheduler={"policy": "sarathi"}))
    assert sarathi.kv_cache_groups == ()
    assert sarathi.reserved_state_bytes > 0


def test_the_banner_says_the_block_the_groups_and_the_mamba_cache_mode() -> None:
    c = config()
    (note,) = planning_notes(c, plan_for(c))
    assert note.startswith(
        "KV PLANNED WITH vLLM's HYBRID KV CACHE MANAGER (replica.hybrid_kv_cache_manager "
        "unset: vLLM 0.33 default): 4 KV groups of 10 layers (gdn + gdn + gdn + gqa), "
        "10,813,440 B per block of 1056 tokens: 3,793 blocks; a 8,448-token request holds 14 "
        "blocks, so 270 run at once"
    )
    assert "holds a 1,073,152 B Mamba state page" in note
    assert "PREFIX CACHING ON WITH mamba_cache_mode 'align'" in note
    assert "holds 2 pages per request" in note
    assert "WITHOUT PREFIX CACHING" not in note
    off = config(scheduler={"vllm_v1": {"enable_prefix_caching": False}})
    (off_note,) = planning_notes(off, plan_for(off))
    assert "a 8,448-token request holds 11 blocks, so 344 run at once" in off_note
    assert "holds one page per request (mamba_cache_mode 'none') (enable_prefix_caching" in (
        off_note
    )
    assert "'align'" not in off_note
    # No comparison with a layout vLLM refuses to start (state reserved, no groups).
    assert "Without groups" not in note
    assert "state reserved for" not in note


def test_the_plan_the_run_and_the_recommender_share_one_align_rule() -> None:
    """The synthetic workload has no prefix identity, and the run's groups still hold
    align's pages, as vLLM (which never sees the workload) runs align whenever prefix
    caching is on (MambaModelConfig.verify_and_update_config): 3,793 // 14 = 270 at once,
    not 'none''s 344; the plan the run prints says so, and requests_held counts the same.
    enable_prefix_caching = false runs 'none' (344)."""
    c = config()
    result = simulate(c)
    banner = format_summary(result)
    assert "so 270 run at once" in banner
    assert "PREFIX CACHING ON WITH mamba_cache_mode 'align'" in banner
    assert "no prefix identity" not in banner
    plan = plan_for(c)
    assert plan.max_batch_size == 270
    assert requests_held(c, plan, 8448) == 3_793 // 14
    off = config(scheduler={"vllm_v1": {"enable_prefix_caching": False}})
    assert plan_for(off).max_batch_size == 344
    assert requests_held(off, plan_for(off), 8448) == 344


def test_pd_pools_whose_groups_disagree_are_refused_on_the_decode_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A guard: both pools resolve the groups from one model and one setting today, so
    the decode pool's plan is made to lack them here (as a decode-only setting would):
    the link would move one pool's blocks into a layout the other lacks."""
    import dataclasses

    from tokenyard.simulation import run as run_module

    real = run_module.plan_for

    def plan_for_pools(c: Any, **kwargs: Any) -> Any:
        plan = real(c, **kwargs)
        decode = c.replica.memory_margin_fraction == 0.7
        return dataclasses.replace(plan, kv_cache_groups=()) if decode else plan

    monkeypatch.setattr(run_module, "plan_for", plan_for_pools)
    pd = {"num_replicas": 1, "decode": {"num_replicas": 1, "memory_margin_fraction": 0.7}}
    replica = {"device": "h100-sxm", "tensor_parallel_size": 1, "memory_margin_fraction": 0.6}
    with pytest.raises(ConfigError, match="KV layout agrees") as err:
        simulate(config(GPT_OSS, cluster=pd, **replica))
    assert (err.value.field, err.value.value) == ("cluster.decode.scheduler", "vllm_v1")


# ---- the simulation ------------------------------------------------------------------------


@pytest.mark.parametrize("caching", [True, False])
def test_qwen35_runs_as_many_requests_as_its_groups_hold(caching: bool) -> None:
    """100 blocks (99 past the null block): each decoding request holds 8 full-attention
    blocks and one page in each of the 3 Mamba groups, so 99 // 11 = 9 run at once, with
    prefix caching on (vLLM's align, prefix identity or not: its second page is held only
    while a chunk moves the state on, MambaManager freeing the one it was copied from) or
    off ('none'). Those transient pages preempt under align, not under 'none'."""
    scheduler = {"num_blocks": 100, "vllm_v1": {"enable_prefix_caching": caching}}
    summary = simulate(config(scheduler=scheduler)).summary
    assert summary["num_requests"] == 64
    assert summary["replicas"]["batch_size"]["max"] == 9
    assert (summary["preemption"]["num_restarts"] > 0) == caching


def test_the_state_comes_from_the_pool_not_a_max_num_seqs_reservation() -> None:
    """300 short requests at once with max_num_seqs 0 (unbounded): the plan reserves no
    state for 256 requests, so nothing holds them to 256: all 300 start together."""
    workload = synthetic_workload(300, qps=1e5, prompt_tokens=(8, 16), output_tokens=(20, 30))
    replica = {
        "model": QWEN,
        "device": "h200",
        "tensor_parallel_size": 2,
        "scheduler": {
            "max_request_tokens": 4096,
            "vllm_v1": {"max_num_seqs": 0, "max_num_batched_tokens": 16384},
        },
    }
    columns = simulate(one_replica(replica, workload, execution={"model": "linear"})).columns
    first = np.asarray(columns["first_token_at"])
    assert int(np.sum(first < np.asarray(columns["completed_at"]).min())) == 300


# ---- P/D: the groups' KV over the link -----------------------------------------------------


def test_pd_moves_every_full_token_and_one_state_with_qwen35() -> None:
    """What crosses the link (one copy of the KV, TP 1 figures): 10 full-attention layers x
    2 KV heads x 256 x 2 x 2 B = 20,480 B a token, and the 30 GDN layers' state once,
    2 x 32,194,560 = 64,389,120 B. Both pools on one node of 8: NVLink, 2 lanes of 450 GB/s,
    5 us. The decode replica holds vLLM's pool: 3,793 blocks of 1,056 tokens."""
    result = simulate(config(cluster=PD))
    link = result.summary["config"]["decode"]["link"]
    assert (link["kv_bytes_per_token"], link["state_bytes"]) == (20_480, 64_389_120)
    assert (link["window_tokens"], link["window_bytes_per_token"]) == (0, 0.0)
    assert result.summary["config"]["decode"]["num_blocks"] == 3_793
    c = result.columns
    moved = c["kv_transfer_tokens"] > 0
    assert moved.sum() > 0
    tokens = c["kv_transfer_tokens"][moved].astype(np.float64)
    expected = 5e-6 + (tokens * 20_480 + 64_389_120) / (2 * 450e9)
    assert np.allclose(c["kv_transfer_s"][moved], expected, rtol=1e-9)


def test_pd_moves_only_the_window_of_gpt_oss_sliding_layers() -> None:
    """gpt-oss-20b: 12 full and 12 sliding (128) layers of 8 KV heads x 64 x 2 x 2 B =
    2,048 B a token each: 24,576 B a token for every token, and 24,576 for at most the
    window and a block (144 tokens). H100, one GPU a pool: 1 lane of 450 GB/s. The decode
    pool holds the hybrid pool (13,097 blocks, 6,548 with the manager off)."""
    replica = {"device": "h100-sxm", "tensor_parallel_size": 1, "memory_margin_fraction": 0.78}
    result = simulate(config(GPT_OSS, cluster=PD, **replica))
    link = result.summary["config"]["decode"]["link"]
    assert link["kv_bytes_per_token"] == 24_576
    assert (link["window_tokens"], link["window_bytes_per_token"]) == (144, 24_576.0)
    assert link["state_bytes"] == 0.0
    assert result.summary["config"]["decode"]["num_blocks"] == 13_097
    c = result.columns
    moved = c["kv_transfer_tokens"] > 0
    tokens = c["kv_transfer_tokens"][moved].astype(np.float64)
    expected = 5e-6 + (tokens * 24_576 + np.minimum(tokens, 144) * 24_576) / 450e9
    assert np.allclose(c["kv_transfer_s"][moved], expected, rtol=1e-9)
    off = simulate(config(GPT_OSS, hybrid=False, cluster=PD, **replica)).summary
    assert off["config"]["decode"]["num_blocks"] == 6_548
    assert off["config"]["decode"]["link"]["kv_bytes_per_token"] == 49_152
    assert "state_bytes" not in off["config"]["decode"]["link"]
    # More decodes fit the decode pool with the groups: they finish sooner.
    assert result.summary["makespan_s"] < off["makespan_s"]


def test_pd_pools_whose_aligned_blocks_differ_are_refused() -> None:
    """TP 1 on the decode pool: 2 KV heads and the whole state per GPU, 16 x ceil(2,146,304
    / (16 x 2,048)) = 1,056 as well; TP 4 keeps 1 KV head (replicated) but quarters the
    state: 16 x ceil(536,576 / 16,384) = 528 tokens, not 1,056."""
    pd = {"num_replicas": 1, "decode": {"num_replicas": 1, "tensor_parallel_size": 4}}
    with pytest.raises(ConfigError, match="1056 tokens on the prefill pool and 528") as err:
        simulate(config(cluster=pd))
    assert err.value.field == "cluster.decode.tensor_parallel_size"


def test_a_model_whose_reserved_states_would_not_fit_runs_with_mamba_groups() -> None:
    """Nemotron-3-Nano on an H200 with half its memory kept free: 58.8 GiB of weights leave
    ~11.7 GiB, less than 256 requests' reserved state (256 x 49,082,368 B = 11.7 GiB), so
    the plan without groups fits nothing; the groups hold a request's state only while it
    runs."""
    nemotron = config(NEMOTRON, tensor_parallel_size=1)
    with pytest.raises(ConfigError, match="not enough for one request"):
        plan_for(config(NEMOTRON, tensor_parallel_size=1, scheduler={"policy": "sarathi"}))
    plan = plan_for(nemotron)
    assert plan.kv_block_size == 2096
    assert plan.max_batch_size >= 1
    assert simulate(nemotron).summary["num_requests"] == 64


def test_draft_tokens_take_a_state_page_each_in_every_mamba_group() -> None:
    """MTP with 2 draft tokens: vLLM's MambaSpec.num_speculative_blocks is
    num_speculative_tokens (MambaBase.get_kv_cache_spec). With prefix caching on (align
    mode, kept under speculative decoding) a GDN group holds 2 + 2 pages a request
    (MambaSpec.max_memory_usage_bytes): 8 + 3 x 4 = 20 blocks, 3,793 // 20 = 189 at once;
    with it off ('none') 1 + 2: 8 + 3 x 3 = 17, 223. Run over 100 blocks (align, as vLLM
    runs it whatever the workload): the 2 lookahead slots make 8,450 tokens 9
    full-attention blocks, and a decoding request holds 1 + 2 pages per Mamba group (the
    copied-from state is freed), so 99 // (9 + 9) = 5."""
    spec = {"method": "mtp", "num_speculative_tokens": 2, "acceptance_rate": 0.7}
    c = config(speculative=spec)
    assert plan_for(c).max_batch_size == 3_793 // 20 == 189
    (note,) = planning_notes(c, plan_for(c))
    assert "holds 4 pages per request" in note
    assert "2 for the draft tokens' states" in note
    assert "WITHOUT PREFIX CACHING" not in note
    off = config(speculative=spec, scheduler={"enable_prefix_caching": False})
    assert plan_for(off).max_batch_size == 3_793 // 17 == 223
    (note,) = planning_notes(off, plan_for(off))
    assert "each Mamba group holds 1 + 2 pages" in note
    summary = simulate(config(speculative=spec, scheduler={"num_blocks": 100})).summary
    assert summary["replicas"]["batch_size"]["max"] == 5
    assert summary["num_requests"] == 64


def test_a_host_tier_on_either_pool_keeps_both_off_the_groups() -> None:
    """The coordinator serves no host tier, and both pools' blocks must agree: a tier on
    the decode pool alone plans gpt-oss without groups on both; true is refused there."""
    pd = {"num_replicas": 1, "decode": {"num_replicas": 1, "kv_offload": {"host_memory_gb": 16}}}
    replica = {"device": "h100-sxm", "tensor_parallel_size": 1, "memory_margin_fraction": 0.78}
    plan = plan_for(config(GPT_OSS, cluster=pd, **replica))
    assert plan.kv_cache_groups == ()
    assert "host tier" in plan.kv_groups_note
    with pytest.raises(ConfigError, match="serves no host tier") as err:
        plan_for(config(GPT_OSS, hybrid=True, cluster=pd, **replica))
    assert err.value.field == "replica.hybrid_kv_cache_manager"


@pytest.mark.parametrize(
    ("hybrid", "cluster", "replica", "key"),
    [
        (
            None,
            {"global_scheduler": {"policy": "prefix_affinity"}},
            {},
            "cluster.global_scheduler.policy",
        ),
        (
            True,
            {"global_scheduler": {"policy": "prefix_affinity"}},
            {},
            "cluster.global_scheduler.policy",
        ),
        (None, {}, {"kv_offload": {"host_memory_gb": 16}}, "replica.kv_offload"),
        (True, {}, {"kv_offload": {"host_memory_gb": 16}}, "replica.kv_offload"),
        (
            None,
            {"decode": {"num_replicas": 1, "kv_offload": {"host_memory_gb": 16}}},
            {},
            "cluster.decode.kv_offload",
        ),
    ],
)
def test_what_keeps_the_mamba_groups_off_is_refused_on_its_own_key(
    hybrid: bool | None, cluster: dict[str, object], replica: dict[str, object], key: str
) -> None:
    """vLLM 0.33 cannot start Qwen3.5 without its hybrid manager, so a host tier or
    prefix_affinity routing (which the simulator's groups do not serve) is refused naming
    that key, unset or true: never planned as a reserved-state layout, never "set it
    false" (false is refused too)."""
    with pytest.raises(ConfigError) as err:
        plan_for(config(hybrid=hybrid, cluster=cluster, **replica))
    assert err.value.field == key
    assert "set it false" not in str(err.value)
