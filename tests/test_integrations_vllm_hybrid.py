"""tokenyard.integrations.vllm over a hybrid KV cache: vLLM 0.33's ``kv_cache_groups`` (a
full-attention group beside a sliding-window or chunked local one, a lone sliding-window
group) become the core's ``kv_groups``, and each step's ``block_ids`` tuples (one list per
group, vLLM's null block 0 where a group no longer attends) are vLLM's own. Each case runs
vLLM's ``Scheduler`` (``vllm/v1/core/sched/scheduler.py``) and ``TokenyardScheduler`` on the
same ``VllmConfig`` and ``KVCacheConfig`` and compares every step. Needs vLLM (the bench
venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm_compare import (
    BLOCK_SIZE,
    Stream,
    attention_spec,
    build_pair,
    compare_stream,
    kv_groups,
    seeded_arrivals,
)
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler


def _run(
    kinds: tuple[str, ...], num_blocks: int, seed: int, max_tokens: int = 40, **options: Any
) -> Stream:
    """A seeded stream (shared prefixes, arrivals over the first steps) on vLLM's Scheduler
    and TokenyardScheduler over one hybrid KV cache config; every step's digest, KV usage
    and block tables compared. Returns what it exercised: tables holding a null block (a
    group that stopped attending to some of its blocks) and vLLM's preemptions."""
    theirs, ours, peer = build_pair(num_blocks=num_blocks, groups=kv_groups(kinds), **options)
    arrivals = seeded_arrivals(
        random.Random(seed), tail_max=120, max_tokens=max_tokens, max_prompt=400
    )
    return compare_stream(theirs, ours, arrivals, peer.make_request)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_and_sliding_window_groups_match_vllm_step_by_step(seed: int) -> None:
    assert _run(("full", "window32"), num_blocks=80, seed=seed).tables_with_null > 0


@pytest.mark.parametrize("seed", [3, 6])
def test_a_tight_hybrid_cache_preempts_as_vllm_does(seed: int) -> None:
    seen = _run(("full", "window32"), num_blocks=28, seed=seed, max_tokens=150, max_num_seqs=8)
    assert seen.preempted


def test_a_lone_sliding_window_group_frees_blocks_out_of_the_window_as_vllm() -> None:
    assert _run(("window32",), num_blocks=40, seed=4).tables_with_null > 0


def test_full_and_chunked_local_groups_match_vllm() -> None:
    assert _run(("full", "chunk64"), num_blocks=80, seed=5).tables_with_null > 0


@pytest.mark.parametrize(
    ("kinds", "num_blocks", "seed"),
    [
        (("full", "window32r5"), 80, 0),
        (("full", "window32r5"), 80, 1),
        (("full", "window32r17"), 30, 2),
        (("window48r3",), 40, 3),
    ],
)
def test_windows_retaining_extra_tokens_match_vllm(
    kinds: tuple[str, ...], num_blocks: int, seed: int
) -> None:
    # A multi-module MTP drafter's runway below each window (extra_retained_tokens): blocks
    # leave the window later, admission caps count them, hits need the window alone.
    seen = _run(kinds, num_blocks=num_blocks, seed=seed, max_tokens=60)
    assert seen.tables_with_null > 0


def test_windows_retaining_different_counts_are_refused_by_name() -> None:
    peer = VllmSchedulerPeer(
        num_blocks=40, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=40,
        kv_cache_tensors=[],
        kv_cache_groups=kv_groups(("window32r3", "window64r4")),
    )
    with pytest.raises(ConfigError) as info:
        TokenyardScheduler(
            vllm_config=peer.vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=None,
            block_size=BLOCK_SIZE,
        )
    assert info.value.field == "kv_cache_groups[1].kv_cache_spec.extra_retained_tokens"
    assert info.value.value == "4"


@pytest.mark.parametrize("seed", [0, 1])
def test_a_full_attention_spec_carrying_a_window_matches_vllm(seed: int) -> None:
    # vLLM's hybrid manager turned off: every layer is full attention for the scheduler,
    # the window only the kernel's (and the KV events' metadata).
    _run((f"fullwindow{2 * BLOCK_SIZE}",), num_blocks=40, seed=seed)


def test_a_static_sink_group_is_refused_by_name_as_vllm_cannot_build_it() -> None:
    from vllm.v1.kv_cache_interface import SinkFullAttentionSpec

    peer = VllmSchedulerPeer(
        num_blocks=40, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512
    )
    spec = SinkFullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16, sink_len=16
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=40,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["layers.0.attn"], attention_spec("full")),
            KVCacheGroupSpec(["layers.1.attn"], spec),
        ],
    )
    # vLLM 0.33's coordinator passes every manager needs_kv_cache_zeroing, which
    # SinkFullAttentionManager.__init__ does not take.
    with pytest.raises(TypeError, match="needs_kv_cache_zeroing"):
        type(peer.scheduler)(
            vllm_config=peer.vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=peer.scheduler.structured_output_manager,
            block_size=BLOCK_SIZE,
        )
    with pytest.raises(ConfigError) as info:
        TokenyardScheduler(
            vllm_config=peer.vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=None,
            block_size=BLOCK_SIZE,
        )
    assert info.value.field == "kv_cache_groups[1].kv_cache_spec"
    assert info.value.value == "SinkFullAttentionSpec"
