"""tokenyard.integrations.vllm with a Mamba ``align`` group or chunked local attention beside
KV cache groups of different block sizes, against vLLM 0.33's ``Scheduler`` and
``AsyncScheduler`` (``HybridKVCacheCoordinator`` over ``MambaManager`` and
``ChunkedLocalAttentionManager``): ``benches/peers/vllm_block_sizes_diff.py``'s seeded streams
(arrivals with shared prefixes, aborts, preemption under small caches, n-gram drafts), every
step's scheduled tokens, block ids per group, computed tokens (hits), finishes and KV usage
compared. A Mamba ``align`` hit lands on the scheduler block size: vLLM's
``MambaManager.find_longest_cache_hit`` passes over states off that grid. Needs vLLM (the
bench venv); skipped elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm_compare import block_digest  # noqa: F401  (puts benches/peers on the path)
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler


@pytest.fixture
def restore_peer(monkeypatch: Any) -> None:
    """``vllm_block_sizes_diff.install`` patches ``VllmSchedulerPeer``; undone after."""
    import vllm_peer

    peer = vllm_peer.VllmSchedulerPeer
    monkeypatch.setattr(peer, "build", peer.build)
    monkeypatch.setattr(peer, "__init__", peer.__init__)


def _streams(layout: str, seeds: range, is_async: bool) -> tuple[list[int], int]:
    """The seeds of ``vllm_adapter_diff``'s scenarios over ``layout`` whose run differs
    from vLLM's at some step, and how many of vLLM's admissions hit a Mamba state (a
    non-null block in the Mamba group's hit)."""
    import vllm_adapter_diff
    import vllm_block_sizes_diff

    vllm_block_sizes_diff.install(layout, None)
    state_hits = 0
    schedule = Scheduler.schedule

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal state_hits
        out = schedule(self, *args, **kwargs)
        groups = self.kv_cache_config.kv_cache_groups
        mamba = [g for g, s in enumerate(groups) if isinstance(s.kv_cache_spec, MambaSpec)]
        for new in out.scheduled_new_reqs:
            if mamba and new.num_computed_tokens and any(new.block_ids[mamba[0]]):
                state_hits += 1
        return out

    differ = []
    Scheduler.schedule = counting  # type: ignore[method-assign]
    try:
        for seed in seeds:
            scenario = vllm_adapter_diff.draw(seed, 120)
            if vllm_block_sizes_diff.has_plain_mamba(layout):
                scenario.config.enable_prefix_caching = False
            try:
                diff = vllm_adapter_diff.run_scenario(scenario, 120, is_async)
            except Exception as err:  # a crash on either side is a difference
                diff = (-1, repr(err))
            if diff is not None:
                differ.append(seed)
    finally:
        Scheduler.schedule = schedule  # type: ignore[method-assign]
    return differ, state_hits


@pytest.mark.usefixtures("restore_peer")
@pytest.mark.parametrize("layout", ["mambaalign16", "mambaalignwin"])
@pytest.mark.parametrize("is_async", [False, True])
def test_mamba_align_beside_differing_sizes_agrees_with_vllm(layout: str, is_async: bool) -> None:
    # Prefix caching on (in most scenarios): the Mamba group on the hash block beside full
    # attention in 32, or in 32 beside a window in 32 that keeps partial hash hits off.
    differ, state_hits = _streams(layout, range(8), is_async)
    assert differ == []
    assert state_hits > 0


@pytest.mark.usefixtures("restore_peer")
@pytest.mark.parametrize("layout", ["mambaalign32", "chunk", "chunk16"])
@pytest.mark.parametrize("is_async", [False, True])
def test_other_layouts_beside_differing_sizes_agree_with_vllm(layout: str, is_async: bool) -> None:
    # A Mamba block over the hash block without prefix caching; chunked local attention on
    # the scheduler block size (cached) or a finer one (uncached).
    differ, _ = _streams(layout, range(6), is_async)
    assert differ == []


@pytest.mark.usefixtures("restore_peer")
def test_the_mamba_group_on_the_scheduler_block_size_disagrees(monkeypatch: Any) -> None:
    """The variant that fails: the adapter giving every group the scheduler block size (32,
    the Mamba group's slots and states then a block of 32 each) where vLLM's manager keeps
    its own 16."""
    from tokenyard.integrations import _vllm_translate

    real = _vllm_translate.group_block_sizes_of

    def one_size(*args: Any, **kwargs: Any) -> tuple[int, tuple[int, ...]]:
        _, sizes = real(*args, **kwargs)
        return max(sizes), ()

    monkeypatch.setattr(_vllm_translate, "group_block_sizes_of", one_size)
    differ, _ = _streams("mambaalign16", range(4), False)
    assert differ != []


def _spec(kind: str, block_size: int) -> Any:
    if kind == "full":
        return FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float16
        )
    if kind == "chunk":
        return ChunkedLocalAttentionSpec(
            attention_chunk_size=64,
            block_size=block_size,
            num_kv_heads=1,
            head_size=1,
            dtype=torch.float16,
        )
    return MambaSpec(
        block_size=block_size,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
    )


def _build(specs: list[Any], caching: bool = True) -> Any:
    peer = VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=512,
        block_size=16,
        enable_prefix_caching=caching,
    )
    groups = [KVCacheGroupSpec([f"layers.{i}"], s) for i, s in enumerate(specs)]
    config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)
    return TokenyardScheduler(
        vllm_config=peer.vllm_config,
        kv_cache_config=config,
        structured_output_manager=peer.scheduler.structured_output_manager,
        block_size=32,
        hash_block_size=16 if caching else 32,
    )


def test_what_vllm_cannot_serve_beside_differing_sizes_is_refused_by_name() -> None:
    # Chunked local attention off the scheduler block size under prefix caching: vLLM's
    # ChunkedLocalAttentionManager asserts its block is the hit alignment at the first lookup.
    with pytest.raises(ConfigError, match=r"kv_cache_groups\[1\]\.kv_cache_spec: Chunked"):
        _build([_spec("full", 32), _spec("chunk", 16)])
    # A Mamba align block over the hash block under prefix caching: vLLM's partial hash hits
    # with copy-on-write (not served).
    with pytest.raises(ConfigError, match="hash_block_size"):
        _build([_spec("full", 16), _spec("mamba", 32)])
    # Served: both without prefix caching, and the Mamba group on the hash block.
    _build([_spec("full", 32), _spec("chunk", 16)], caching=False)
    _build([_spec("full", 16), _spec("mamba", 32)], caching=False)
    _build([_spec("full", 32), _spec("mamba", 16)])
