"""The adapter's KV cache events beside a Mamba ``align`` group, a chunked-local-attention
group and groups of different block sizes, against vLLM 0.33's own: both schedulers run
one seeded stream with ``KVEventsConfig(enable_kv_cache_events=True)`` and a capturing
publisher; every published batch must be equal, field for field, and every step's
scheduled tokens and block tables per group too (``compare_stream``).

- Mamba ``align`` (``MambaManager``): the state blocks vLLM's ``reachable_block_mask``
  keeps are cached, the nulls before the running state left out of the hashes but not the
  tokens; a preempted or finished request's states are evicted with their group.
- Chunked local attention (``ChunkedLocalAttentionManager``): the blocks before the
  current chunk are null, skipped as a window's are.
- Different block sizes (``HybridKVCacheCoordinator``, Gemma-like 32/16 over hash blocks of
  16): each group's ``BlockStored`` carries its own ``block_size`` and the hashes at its
  blocks' last hash boundary (``resolve_block_hashes``); a full-attention group whose
  block holds several hash blocks also registers the prompt's last hash boundary inside a
  block (``FullAttentionManager._cache_partial_tail_block`` through
  ``BlockPool.cache_partial_block``: one hash, ``block_size`` the hash block), removed with
  the block.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.structured_output import StructuredOutputManager
from vllm_compare import BLOCK_SIZE, attention_spec, compare_stream, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

#: Each layout's groups as ``(kind, block_size)`` (``vllm_compare.attention_spec`` kinds,
#: ``"mamba"`` in align mode); the scheduler block size is their lcm, the hash block 16.
LAYOUTS = {
    "full-mamba": [("full", 16), ("mamba", 16)],
    "full-window-mamba": [("full", 16), ("window32", 16), ("mamba", 16)],
    "full-chunk": [("full", 16), ("chunk32", 16)],
    "full-window-chunk": [("full", 16), ("window48", 16), ("chunk64", 16)],
    "gemma-sizes": [("full", 32), ("window64", 16)],
    "three-sizes": [("full", 64), ("window48", 16), ("window100", 32)],
    "full-sizes": [("full", 16), ("full", 32)],
}


class Capture:
    """A KV event publisher that keeps each published batch's events."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def publish(self, batch: Any) -> None:
        self.batches.append(list(batch.events))

    def shutdown(self) -> None:
        pass


def _spec(kind: str, block_size: int) -> Any:
    if kind == "mamba":
        return MambaSpec(
            block_size=block_size,
            shapes=((1, 1),),
            dtypes=(torch.float32,),
            mamba_cache_mode="align",
        )
    if kind.startswith("window"):
        spec = attention_spec(kind)
        return dataclasses.replace(spec, block_size=block_size)
    return dataclasses.replace(attention_spec(kind), block_size=block_size)


def _pair(
    layout: str, num_blocks: int, *, asynchronous: bool = False, publisher: str = "null"
) -> tuple[Any, Any, Any, Capture, Capture]:
    """vLLM's scheduler and the adapter over ``LAYOUTS[layout]`` with KV cache events on
    and a capturing publisher each, as vLLM's engine builds them (the scheduler block size
    the groups' lcm, the hash block size 16)."""
    kinds = LAYOUTS[layout]
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=1024,
        block_size=BLOCK_SIZE,
    )
    if any(kind == "mamba" for kind, _ in kinds):
        peer.vllm_config.cache_config.mamba_cache_mode = "align"
    peer.vllm_config.scheduler_config.async_scheduling = asynchronous
    peer.vllm_config.kv_events_config = KVEventsConfig(
        enable_kv_cache_events=True, publisher=publisher, endpoint="inproc://kvevlayouts"
    )
    classes = (
        (AsyncScheduler, AsyncTokenyardScheduler)
        if asynchronous
        else (Scheduler, TokenyardScheduler)
    )
    groups = [KVCacheGroupSpec([f"layers.{i}"], _spec(*k)) for i, k in enumerate(kinds)]
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    block_size = math.lcm(*(size for _, size in kinds))
    theirs, ours = (
        cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=config,
            structured_output_manager=StructuredOutputManager(peer.vllm_config),
            block_size=block_size,
            hash_block_size=BLOCK_SIZE,
            log_stats=True,
        )
        for cls in classes
    )
    captures = Capture(), Capture()
    theirs.kv_event_publisher, ours.kv_event_publisher = captures
    return theirs, ours, peer, *captures


def _check(theirs: Capture, ours: Capture) -> Counter[str]:
    """Every batch equal; returns the count of each event kind published."""
    for i, (mine, vllms) in enumerate(zip(ours.batches, theirs.batches, strict=False)):
        assert mine == vllms, f"batch {i}"
    assert len(ours.batches) == len(theirs.batches)
    return Counter(type(e).__name__ for batch in theirs.batches for e in batch)


def run_stream(
    layout: str, seed: int, num_blocks: int, *, asynchronous: bool = False, reset: bool = False
) -> tuple[Counter[str], list[Any], int]:
    """One seeded stream (two waves with a ``reset_prefix_cache`` between them with
    ``reset``) on both sides: the event kinds published, vLLM's events and its preemptions."""
    rng = random.Random(seed)
    theirs, ours, peer, their_events, our_events = _pair(
        layout, num_blocks, asynchronous=asynchronous
    )
    preempted = 0
    for wave in ("a", "b") if reset else ("a",):
        arrivals = [
            (at, f"{wave}{rid}", prompt, n)
            for at, rid, prompt, n in seeded_arrivals(
                rng,
                prefix_tokens=96,
                shared=(0, 16, 48, 96),
                tail_max=120,
                max_tokens=40,
                count=10,
                arrive_by=10,
                max_prompt=300,
            )
        ]
        stream = compare_stream(theirs, ours, arrivals, peer.make_request, max_steps=3000)
        preempted += len(stream.preempted)
        if reset:
            assert ours.reset_prefix_cache() == theirs.reset_prefix_cache()
    kinds = _check(their_events, our_events)
    return kinds, [e for batch in their_events.batches for e in batch], preempted


CASES = [(layout, seed, blocks) for layout in LAYOUTS for seed in range(4) for blocks in (160, 40)]


@pytest.mark.parametrize(("layout", "seed", "num_blocks"), CASES)
def test_each_layout_publishes_vllms_events(layout: str, seed: int, num_blocks: int) -> None:
    kinds, events, _ = run_stream(layout, seed, num_blocks)
    assert kinds["BlockStored"] > 0
    groups = {e.group_idx for e in events if isinstance(e, BlockStored) and e.block_hashes}
    assert groups == set(range(len(LAYOUTS[layout])))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("seed", range(40, 42))
def test_each_layout_under_async_scheduling_publishes_vllms_events(layout: str, seed: int) -> None:
    kinds, _, _ = run_stream(layout, seed, (40, 160)[seed % 2], asynchronous=True)
    assert kinds["BlockStored"] > 0


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_tight_pool_preempts_and_evicts_with_vllms_events(layout: str) -> None:
    kinds, _, preempted = run_stream(layout, 50, 24)
    assert kinds["BlockRemoved"] > 0
    assert preempted > 0


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_reset_publishes_one_all_blocks_cleared_per_wave(layout: str) -> None:
    kinds, _, _ = run_stream(layout, 60, 160, reset=True)
    assert kinds["AllBlocksCleared"] == 2
