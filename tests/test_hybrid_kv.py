"""vLLM 0.33's hybrid KV cache manager: the embeddable scheduler over KV groups, the pool the
planner sizes for them (``simulation/hybrid_kv.py``) and ``replica.hybrid_kv_cache_manager``.

Hand arithmetic (gpt-oss-20b, bf16 KV, block 16): a layer caches 2 (K, V) x 8 KV heads x 64
x 2 B = 2,048 B per token, a page 32,768 B. vLLM groups its 12 sliding + 12 full layers as
two groups of 12 layers (``_get_kv_cache_groups_uniform_page_size``), so a block holds
12 x 32,768 = 393,216 B; with ``--disable-hybrid-kv-cache-manager`` one group of all 24
layers, 786,432 B a block.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard.errors import ConfigError
from tokenyard.kv import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from tokenyard.sched import Scheduler, SchedulerConfig
from tokenyard.simulation import simulate
from tokenyard.simulation.hybrid_kv import max_model_len_fitting
from tokenyard.simulation.run import plan_for, planning_notes

GPT_OSS = "openai/gpt-oss-20b"


def config(
    model: str = GPT_OSS,
    *,
    hybrid: bool | None = None,
    cluster: dict[str, Any] | None = None,
    **replica: Any,
) -> Any:
    """A one-replica job of 64 requests of 8,192 + 256 tokens, all at once; 78% of the
    H100's 80 GiB kept free, so KV memory binds."""
    table: dict[str, Any] = {
        "model": model,
        "device": "h100-sxm",
        "memory_margin_fraction": 0.78,
        "scheduler": {"max_request_tokens": 8448},
        **replica,
    }
    if hybrid is not None:
        table["hybrid_kv_cache_manager"] = hybrid
    workload = synthetic_workload(64, qps=1000.0, prompt_tokens=8192, output_tokens=256, seed=1)
    return one_replica(table, workload, cluster=cluster or {})


# ---- the planner: vLLM's arithmetic --------------------------------------------------------


def test_gpt_oss_pool_is_vllms_arithmetic_for_its_groups() -> None:
    """The same 5,150,005,222 B of KV memory (80 GiB x 0.22 less 13.7 GB of weights):
    hybrid 5,150,005,222 // 393,216 = 13,097 blocks; disabled // 786,432 = 6,548. A request
    of 8,448 tokens holds 528 full-attention blocks, and its window group is charged
    ceil((128 - 1 + 2,048 in flight) / 16) + 1 = 137 (vLLM's admission cap): 665 blocks,
    19 at once (vLLM's max concurrency), against 6,548 // 528 = 12."""
    hybrid, disabled = plan_for(config(hybrid=True)), plan_for(config(hybrid=False))
    assert hybrid.available_kv_bytes == disabled.available_kv_bytes == 5_150_005_222
    assert [(g.mixer, g.layers, g.window) for g in hybrid.kv_cache_groups] == [
        ("sliding", 12, 128),
        ("gqa", 12, 0),
    ]
    assert hybrid.kv_bytes_per_token * 16 == 393_216
    assert (hybrid.num_blocks, disabled.num_blocks) == (13_097, 6_548)
    assert (hybrid.max_batch_size, disabled.max_batch_size) == (19, 12)
    assert disabled.kv_cache_groups == ()


def test_a_request_that_fits_only_the_hybrid_groups_is_planned_with_them() -> None:
    """131,072 tokens: 6 GiB with every layer full (8,192 blocks of 786,432 B) against the
    4.8 GiB there are; the hybrid groups need 8,192 + 137 = 8,329 of their 13,097 blocks."""
    longest = {"scheduler": {"max_request_tokens": 131072}}
    assert plan_for(config(hybrid=True, **longest)).max_batch_size == 1
    with pytest.raises(ConfigError, match="not enough for one request of 131072") as err:
        plan_for(config(hybrid=False, **longest))
    assert err.value.field == "replica.device"


def test_the_default_is_vllms_choice_and_the_banner_says_it() -> None:
    plan = plan_for(config())
    assert plan.kv_cache_groups, "vLLM 0.33 runs its hybrid manager for gpt-oss"
    (note,) = planning_notes(config(), plan)
    assert note.startswith(
        "KV PLANNED WITH vLLM's HYBRID KV CACHE MANAGER (replica.hybrid_kv_cache_manager "
        "unset: vLLM 0.33 default): 2 KV groups of 12 layers (sliding (window 128) + gqa), "
        "393,216 B per block of 16 tokens: 13,097 blocks; a 8,448-token request holds 665 "
        "blocks, so 19 "
        "run at once"
    )
    assert "against 6,548 blocks of 528 per request, 12, with --disable-hybrid" in note


def test_the_longest_request_is_the_longest_whose_blocks_fit_every_group() -> None:
    """13,096 blocks hold KV; the window group never needs more than its cap of 137, so
    the full group may take 12,959 blocks: 207,344 tokens."""
    groups = plan_for(config(hybrid=True)).kv_cache_groups
    assert max_model_len_fitting(groups, 13_096, 16, 2048) == 12_959 * 16 == 207_344


def test_chunked_local_attention_is_off_by_default_and_on_when_asked() -> None:
    """Llama 4 Scout at TP 4: 36 chunked + 12 full layers, 1,024 B a token each; groups of
    12 layers (36 >= 1.5 x 12): 3 chunked + 1 full, 12 x 1,024 x 16 = 196,608 B a block."""
    scout = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
    off = plan_for(config(scout, tensor_parallel_size=4, memory_margin_fraction=0.1))
    assert off.kv_cache_groups == ()
    assert "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE" in off.kv_groups_note
    on = plan_for(config(scout, hybrid=True, tensor_parallel_size=4, memory_margin_fraction=0.1))
    assert [g.mixer for g in on.kv_cache_groups] == ["chunked"] * 3 + ["gqa"]
    assert on.kv_bytes_per_token * 16 == 196_608
    assert on.num_blocks == on.available_kv_bytes // 196_608


def test_pd_disaggregation_plans_the_groups_as_vllm_does_with_nixl() -> None:
    """vLLM 0.33 keeps its hybrid manager beside a connector that supports it
    (NixlConnector is SupportsHMA), so P/D plans the same groups as one pool; false is
    --disable-hybrid-kv-cache-manager there too."""
    pd = {"num_replicas": 1, "decode": {"num_replicas": 1}}
    unset, on = plan_for(config(cluster=pd)), plan_for(config(hybrid=True, cluster=pd))
    assert unset.kv_cache_groups == on.kv_cache_groups == plan_for(config()).kv_cache_groups
    assert unset.num_blocks == 13_097
    assert plan_for(config(hybrid=False, cluster=pd)).num_blocks == 6_548


@pytest.mark.parametrize(
    ("model", "replica", "words"),
    [
        ("google/gemma-4-26B-A4B", {"scheduler": {"policy": "sarathi"}}, "vllm_v1 replicas only"),
        (
            "llama-2-7b",
            {"device": "a100-80gb", "scheduler": {"max_request_tokens": 4096}},
            "only full-attention layers",
        ),
        (GPT_OSS, {"scheduler": {"policy": "sarathi"}}, "vllm_v1 replicas only"),
        (GPT_OSS, {"kv_offload": {"host_memory_gb": 64}}, "no host tier"),
    ],
)
def test_what_the_groups_cannot_serve_is_refused_by_field(
    model: str, replica: dict[str, Any], words: str
) -> None:
    replica = {"memory_margin_fraction": 0.1, **replica}
    if "scheduler" in replica:
        replica["scheduler"] = {"max_request_tokens": 8448, **replica["scheduler"]}
    with pytest.raises(ConfigError, match=words) as err:
        plan_for(config(model, hybrid=True, **replica))
    assert err.value.field == "replica.hybrid_kv_cache_manager"


def test_prefix_affinity_routing_is_refused_with_the_groups() -> None:
    routing = {"num_replicas": 1, "global_scheduler": {"policy": "prefix_affinity"}}
    with pytest.raises(ConfigError, match="KV cache events") as err:
        plan_for(config(hybrid=True, cluster=routing))
    assert err.value.field == "replica.hybrid_kv_cache_manager"
    assert plan_for(config(cluster=routing)).kv_cache_groups == ()


# ---- the simulation ------------------------------------------------------------------------


def test_gpt_oss_runs_more_requests_at_once_with_the_hybrid_manager() -> None:
    """64 requests of 8,192 + 256 tokens arrive at once. Disabled: 6,547 blocks hold 12
    requests of 528 blocks. Hybrid: 13,096 blocks; a request is admitted when 665 are free
    (528 + the window group's admission cap of 137), and holds its 528 full blocks plus at
    most 9 window blocks (128 / 16 + 1) once it decodes: 537. So 23 decoding requests
    (12,351 blocks) leave 745 >= 665 for a 24th, and 24 leave 208: 24 run at once."""
    runs = {h: simulate(config(hybrid=h)).summary for h in (True, False)}
    peak = {h: s["replicas"]["batch_size"]["max"] for h, s in runs.items()}
    assert peak[False] == 12
    assert peak[True] == 24
    assert all(s["num_requests"] == 64 for s in runs.values())
    rate = {h: s["throughput"]["requests_per_s"] for h, s in runs.items()}
    assert rate[True] > rate[False]


# ---- the embeddable scheduler --------------------------------------------------------------


def window_config(**extra: Any) -> SchedulerConfig:
    options: dict[str, Any] = {
        "num_blocks": 64,
        "block_size": 4,
        "max_model_len": 64,
        "max_num_batched_tokens": 16,
        "kv_groups": (FullAttentionSpec(), SlidingWindowSpec(sliding_window=8)),
        **extra,
    }
    return SchedulerConfig(**options)


def test_the_scheduler_gives_a_block_table_per_group_and_frees_the_window() -> None:
    s = Scheduler(window_config())
    s.add_request(1, list(range(10)), max_tokens=30)
    out = s.schedule()
    (new,) = out.scheduled_new_reqs
    assert len(new.block_ids) == 0
    assert [len(t) for t in new.group_block_ids] == [3, 3]
    s.update_from_output({1: [5]})
    for _ in range(20):
        out = s.schedule()
        (added,) = out.scheduled_cached_reqs.new_group_block_ids
        assert len(added) == 2
        s.update_from_output({1: [5]})
        full, window = s.group_block_ids(1)
        assert len(full) == len(window)
        # A window of 8 tokens in blocks of 4: at most 8 / 4 + 1 = 3 live blocks.
        assert sum(1 for b in window if b != 0) <= 3
    assert list(s.block_ids(1)) == list(full)


def test_one_full_attention_group_is_the_single_group_pool() -> None:
    one = SchedulerConfig(num_blocks=64, block_size=4, max_model_len=64)
    grouped = SchedulerConfig(
        num_blocks=64, block_size=4, max_model_len=64, kv_groups=(FullAttentionSpec(),)
    )
    runs = []
    for cfg in (one, grouped):
        s = Scheduler(cfg)
        s.add_request(1, list(range(10)), max_tokens=4)
        out = s.schedule()
        (new,) = out.scheduled_new_reqs
        runs.append((new.block_ids.tolist(), new.group_block_ids))
    assert runs[0] == runs[1] == ([0, 1, 2], ())


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"prefix_cache": "radix"}, "prefix_cache"),
        ({"host_num_blocks": 8}, "host_num_blocks"),
        ({"kv_groups": (FullAttentionSpec(), MambaSpec())}, "enable_prefix_caching"),
        ({"kv_groups": ("full",)}, "kv_groups"),
    ],
)
def test_the_scheduler_refuses_what_its_groups_cannot_serve(
    extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        Scheduler(window_config(**extra))  # the dataclass or the core refuses
    assert err.value.field == field
