"""Linear-attention replicas with vLLM 0.33's default Mamba prefix caching
(``mamba_cache_mode="align"``: ``MambaModelConfig.verify_and_update_config``,
``vllm/model_executor/models/config.py``), as the simulator runs them
(``simulation/hybrid_kv.align_mode``): Mamba states cached at block boundaries, 2 pages a
request per Mamba group, the block-aligned prefill split; ``enable_prefix_caching = false``
keeps ``"none"``.

Qwen3.5-35B-A3B at TP 2 has an aligned block of 1,056 tokens (tests/test_hybrid_kv_state.py
derives it). Its prompts here open with one of 2 shared prefixes of 4 blocks (4,224 tokens):
a hit ends on a block boundary, where a state was cached.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard.catalog import model as catalog_model
from tokenyard.kv import FullAttentionSpec, MambaSpec
from tokenyard.simulation import simulate
from tokenyard.simulation.hybrid_kv import (
    blocks_per_request,
    group_specs,
    max_model_len_fitting,
    vllm_kv_layout,
)
from tokenyard.simulation.planner import dtype_bytes, kv_groups
from tokenyard.simulation.run import plan_for

QWEN = "Qwen/Qwen3.5-35B-A3B"
NEMOTRON = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
BLOCK = 1056
PREFIX = {"num_groups": 2, "prefix_tokens": 4 * BLOCK, "share_ratio": 1.0}


def config(
    *,
    caching: bool = True,
    n: int = 64,
    cluster: dict[str, Any] | None = None,
    **replica: Any,
) -> Any:
    """``n`` requests of 5,000-7,000 prompt and 64 output tokens at 4 a second on one H200
    at TP 2, every prompt opening with a shared prefix."""
    table: dict[str, Any] = {
        "model": QWEN,
        "device": "h200",
        "tensor_parallel_size": 2,
        "memory_margin_fraction": 0.5,
        "scheduler": {
            "max_request_tokens": 8448,
            "vllm_v1": {"enable_prefix_caching": caching},
        },
        **replica,
    }
    workload = synthetic_workload(
        n, qps=4.0, prompt_tokens=(5000, 7000), output_tokens=64, seed=1, shared_prefix=PREFIX
    )
    return one_replica(table, workload, cluster=cluster or {})


def test_a_shared_prefix_hits_on_block_boundaries_and_cuts_ttft() -> None:
    on = simulate(config())
    off = simulate(config(caching=False))
    hits = np.asarray(on.columns["prefix_hit_tokens"], dtype=np.int64)
    assert on.summary["throughput"]["prefix_hit_rate"] > 0.5
    # A Mamba group hits only where a state was cached: a block boundary.
    assert (hits > 0).sum() >= 60
    assert not (hits % BLOCK).any()
    assert off.summary["throughput"]["prefix_hit_rate"] == 0.0
    assert on.summary["latency_s"]["ttft"]["p50"] < 0.6 * off.summary["latency_s"]["ttft"]["p50"]


def test_prefill_chunks_end_on_block_boundaries_but_the_last() -> None:
    """One request of 6,766 prompt tokens (its prefix gives it prefix identity; nothing is
    cached before it), a budget of 2,048 (the section's default): vLLM's
    _mamba_block_aligned_split clips each chunk to a multiple of 1,056 (one block: 1,056 <
    2,048 < 2,112), the last ending the prompt; without align the chunks fill the budget."""

    def chunks(caching: bool) -> list[int]:
        c = config(caching=caching, n=1)
        c = dataclasses.replace(c, metrics=dataclasses.replace(c.metrics, record_stages=True))
        result = simulate(c)
        assert result.stages is not None
        prefill = [int(t) for t in result.stages["num_prefill_tokens"] if t]
        assert sum(prefill) == int(result.columns["num_prefill_tokens"][0]) == 6766
        return prefill

    aligned = chunks(True)
    ends = np.cumsum(aligned)
    assert not (ends[:-1] % BLOCK).any()
    assert aligned == [BLOCK] * 6 + [6766 - 6 * BLOCK]
    assert chunks(False) == [2048, 2048, 2048, 622]


@pytest.mark.parametrize(
    ("model", "tp", "num_mamba", "full_blocks"),
    [
        # 8,448 tokens: 8 blocks of 1,056 in Qwen3.5's one full group, 3 GDN groups.
        (QWEN, 2, 3, 8),
        # Nemotron-3-Nano: blocks of 2,096, ceil(8,448 / 2,096) = 5; 4 Mamba2 groups.
        (NEMOTRON, 1, 4, 5),
    ],
)
def test_align_holds_two_pages_per_mamba_group(
    model: str, tp: int, num_mamba: int, full_blocks: int
) -> None:
    """vLLM's MambaSpec.max_memory_usage_bytes: 2 pages in align mode (the running state
    and the one it was copied from), 1 + num_speculative_blocks in none."""
    groups = kv_groups(catalog_model(model), tp, 1, dtype_bytes("bf16", "bf16")[1])
    layout = vllm_kv_layout(groups, 16, model)
    bs = layout.block_size
    assert (
        blocks_per_request(layout.groups, 8448, bs, 2048, align=True) == full_blocks + 2 * num_mamba
    )
    assert blocks_per_request(layout.groups, 8448, bs, 2048) == full_blocks + num_mamba
    assert blocks_per_request(layout.groups, 8448, bs, 2048, 2) == full_blocks + 3 * num_mamba


def test_the_longest_request_counts_two_states_per_align_group() -> None:
    """vLLM sizes an align-mode Mamba group at two states a request at start-up
    (``MambaSpec.max_memory_usage_bytes``), whatever the length: Qwen3.5's full group and
    three GDN groups on 28 blocks of 1,056 tokens fit ``28 - 3 x 2 = 22`` full blocks,
    23,232 tokens (a block per table slot would have given 28 // 4 = 7 blocks, 7,392)."""
    groups = kv_groups(catalog_model(QWEN), 2, 1, dtype_bytes("bf16", "bf16")[1])
    layout = vllm_kv_layout(groups, 16, QWEN)
    bs = layout.block_size
    assert bs == 1056
    fitting = max_model_len_fitting(layout.groups, 28, bs, 2048, align=True)
    assert fitting == 22 * 1056 == 23_232
    assert max_model_len_fitting(layout.groups, 28, bs, 2048) == 25 * 1056


def test_group_specs_give_the_core_align_groups() -> None:
    plan = plan_for(config())
    specs = group_specs(plan.kv_cache_groups, align=True)
    assert [type(s) for s in specs] == [MambaSpec] * 3 + [FullAttentionSpec]
    assert {s.mamba_cache_mode for s in specs if isinstance(s, MambaSpec)} == {"align"}
    assert all(s.mamba_cache_mode == "none" for s in group_specs(plan.kv_cache_groups)[:3])
    # Under speculative decoding each align group holds the draft tokens' states.
    drafts = group_specs(plan.kv_cache_groups, 2, align=True)
    assert [s.num_speculative_blocks for s in drafts[:3]] == [2, 2, 2]


def test_speculative_decoding_keeps_align_and_its_prefix_hits() -> None:
    # vLLM 0.33 keeps mamba_cache_mode 'align' under speculative decoding, its Mamba groups
    # holding num_speculative_tokens more state blocks (MambaManager): the shared prefix
    # still hits. Under its MTP drafter's look-ahead hashes (VllmConfig.
    # num_hash_lookahead_tokens, 1 for Qwen3.5's one MTP module) a block is cached only
    # once the token after it exists, so fewer hit than without drafts.
    spec = {"method": "mtp", "num_speculative_tokens": 2, "acceptance_rate": 0.7}
    summary = simulate(config(n=16, speculative=spec)).summary
    plain = simulate(config(n=16)).summary
    assert summary["num_requests"] == 16
    assert summary["throughput"]["prefix_hit_rate"] > 0.0
    assert summary["throughput"]["prefix_hit_rate"] < plain["throughput"]["prefix_hit_rate"]


def test_pd_prefill_pool_hits_the_shared_prefix() -> None:
    """Under P/D (NixlConnector is SupportsHMA) the prefill pool's align groups hit the
    shared prefix as one replica's do."""
    pd = {"decode": {"num_replicas": 1}}
    on = simulate(config(n=32, cluster=pd)).summary
    off = simulate(config(n=32, caching=False, cluster=pd)).summary
    assert on["num_requests"] == off["num_requests"] == 32
    assert on["throughput"]["prefix_hit_rate"] > 0.5
    assert off["throughput"]["prefix_hit_rate"] == 0.0
