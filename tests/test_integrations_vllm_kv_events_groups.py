"""The adapter's KV cache events beside several KV cache groups and with
``kv_cache_report_mode="full"``, against vLLM 0.33's own: both schedulers run one seeded
stream with ``KVEventsConfig(enable_kv_cache_events=True)`` and a capturing publisher;
every published batch must be equal, field for field, and every step's scheduled tokens
and block tables per group too (``compare_stream``).

- A hybrid full attention + sliding window layout (gpt-oss, Gemma 3): vLLM's one block
  pool caches each group's blocks in its own ``BlockStored`` (``group_idx``, the group's
  ``kv_cache_spec_kind`` and window), a window's freed blocks evicted later with their
  group's ``BlockRemoved``, the null block never.
- ``kv_cache_report_mode="full"`` (a request's ``SamplingParams.extra_args``): vLLM's
  ``KVCacheManager.get_computed_blocks`` publishes a prefix hit's blocks at each lookup
  (``emit_cached_block_events``), per group, null blocks' hashes included.
- Beside a Mamba ``align`` group, published as vLLM publishes them (more layouts in
  tests/test_integrations_vllm_kv_events_layouts.py).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request
from vllm_compare import BLOCK_SIZE, compare_stream, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

WINDOW = 40
SYNC = (Scheduler, TokenyardScheduler)
ASYNC = (AsyncScheduler, AsyncTokenyardScheduler)


class Capture:
    """A KV event publisher that keeps each published batch's events."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def publish(self, batch: Any) -> None:
        self.batches.append(list(batch.events))

    def shutdown(self) -> None:
        pass


def _groups(num_blocks: int, *kinds: str) -> KVCacheConfig:
    common = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 1}
    specs = {
        "full": lambda: FullAttentionSpec(dtype=torch.float16, **common),
        "window": lambda: SlidingWindowSpec(sliding_window=WINDOW, dtype=torch.float16, **common),
        "mamba": lambda: MambaSpec(
            block_size=BLOCK_SIZE,
            shapes=((1, 1),),
            dtypes=(torch.float32,),
            mamba_cache_mode="align",
        ),
    }
    groups = [KVCacheGroupSpec([f"layers.{i}"], specs[k]()) for i, k in enumerate(kinds)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def _pair(
    num_blocks: int, kinds: tuple[str, ...], classes: tuple[type, type] = SYNC
) -> tuple[Any, Any, VllmSchedulerPeer, Capture, Capture]:
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        max_model_len=1024,
        max_num_seqs=4,
        max_num_batched_tokens=64,
    )
    peer.vllm_config.kv_events_config = KVEventsConfig(
        enable_kv_cache_events=True, publisher="null"
    )
    config = peer.scheduler.kv_cache_config if kinds == ("full",) else _groups(num_blocks, *kinds)
    theirs, ours = (peer.build(cls, config) for cls in classes)
    captures = Capture(), Capture()
    theirs.kv_event_publisher, ours.kv_event_publisher = captures
    return theirs, ours, peer, *captures


def _check(theirs: Capture, ours: Capture) -> Counter[str]:
    """Every batch equal; returns the count of each event kind published."""
    assert len(ours.batches) == len(theirs.batches)
    for i, (mine, vllms) in enumerate(zip(ours.batches, theirs.batches, strict=True)):
        assert mine == vllms, f"batch {i}"
    return Counter(type(e).__name__ for batch in theirs.batches for e in batch)


def _maker(peer: VllmSchedulerPeer, full_every: int) -> Any:
    """Requests whose id's number is a multiple of ``full_every`` (0: none) ask for the
    ``"full"`` report."""

    def make(request_id: str, prompt: list[int], max_tokens: int) -> Request:
        full = full_every and int(request_id[1:]) % full_every == 0
        extra = {"kv_cache_report_mode": "full"} if full else None
        params = SamplingParams(max_tokens=max_tokens, extra_args=extra)
        return Request(request_id, prompt, params, None, block_hasher=peer._block_hasher)

    return make


def _run(
    seed: int,
    num_blocks: int,
    kinds: tuple[str, ...],
    *,
    full_every: int = 0,
    classes: tuple[type, type] = SYNC,
) -> tuple[Counter[str], list[Any]]:
    rng = random.Random(seed)
    theirs, ours, peer, their_events, our_events = _pair(num_blocks, kinds, classes)
    arrivals = seeded_arrivals(rng, tail_max=90, max_tokens=50, count=10, arrive_by=10)
    compare_stream(theirs, ours, arrivals, _maker(peer, full_every), max_steps=2000)
    kinds_seen = _check(their_events, our_events)
    return kinds_seen, [e for batch in their_events.batches for e in batch]


# ---- full attention + sliding window -----------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_a_window_beside_full_attention_publishes_vllms_events(seed: int) -> None:
    kinds, events = _run(seed, (20, 40, 90)[seed % 3], ("full", "window"))
    groups = {e.group_idx for e in events if isinstance(e, BlockStored) and e.block_hashes}
    assert groups == {0, 1}
    window = [e for e in events if isinstance(e, BlockStored) and e.group_idx == 1]
    assert all(e.kv_cache_spec_sliding_window == WINDOW for e in window)
    assert kinds["BlockStored"] > 0


@pytest.mark.parametrize("seed", range(6, 10))
def test_a_tight_hybrid_pool_evicts_per_group_with_vllms_events(seed: int) -> None:
    kinds, events = _run(seed, 24, ("full", "window"))
    removed = {e.group_idx for e in events if isinstance(e, BlockRemoved)}
    assert kinds["BlockRemoved"] > 0
    assert removed == {0, 1}


@pytest.mark.parametrize("seed", range(10, 12))
def test_async_scheduling_beside_a_window_publishes_vllms_events(seed: int) -> None:
    kinds, _ = _run(seed, (24, 60)[seed % 2], ("full", "window"), classes=ASYNC)
    assert kinds["BlockStored"] > 0


def test_a_reset_beside_a_window_publishes_one_all_blocks_cleared() -> None:
    rng = random.Random(12)
    theirs, ours, peer, their_events, our_events = _pair(30, ("full", "window"))
    for wave in ("a", "b"):
        arrivals = [
            (at, f"{wave}{rid}", prompt, n)
            for at, rid, prompt, n in seeded_arrivals(rng, tail_max=50, max_tokens=20)
        ]
        compare_stream(theirs, ours, arrivals, peer.make_request)
        assert ours.reset_prefix_cache()
        assert theirs.reset_prefix_cache()
    assert _check(their_events, our_events)["AllBlocksCleared"] == 1


def test_a_shared_prompt_stores_each_group_once_per_block() -> None:
    """Hand-checkable: a 40-token prompt (2 full blocks of 16) caches blocks 0..2 in each
    group, one ``BlockStored`` per group with the same vLLM hashes and tokens; the second
    request with the same prompt hits both groups and stores nothing new."""
    theirs, ours, peer, their_events, our_events = _pair(30, ("full", "window"))
    prompt = list(range(100, 140))
    arrivals = [(0, "r0", prompt, 1), (5, "r1", prompt, 1)]
    compare_stream(theirs, ours, arrivals, peer.make_request)
    _check(their_events, our_events)
    stored = [e for batch in our_events.batches for e in batch if isinstance(e, BlockStored)]
    assert [(e.group_idx, len(e.block_hashes)) for e in stored] == [(0, 2), (1, 2)]
    assert stored[0].block_hashes == stored[1].block_hashes
    assert stored[1].token_ids == prompt[:32]
    assert (stored[0].kv_cache_spec_kind, stored[1].kv_cache_spec_kind) == (
        "full_attention",
        "sliding_window",
    )


# ---- kv_cache_report_mode="full" ---------------------------------------------------------


@pytest.mark.parametrize("seed", range(13, 17))
def test_the_full_report_publishes_each_lookups_hit(seed: int) -> None:
    kinds, events = _run(seed, (14, 40)[seed % 2], ("full",), full_every=2)
    reused = [e for e in events if isinstance(e, BlockStored) and e.parent_block_hash is None]
    assert kinds["BlockStored"] > 0
    assert reused


@pytest.mark.parametrize("seed", range(17, 20))
def test_the_full_report_beside_a_window_publishes_each_groups_hit(seed: int) -> None:
    num_blocks = (20, 60, 30)[seed % 3]
    kinds, events = _run(seed, num_blocks, ("full", "window"), full_every=1)
    incremental, _ = _run(seed, num_blocks, ("full", "window"))
    assert kinds["BlockStored"] > incremental["BlockStored"]
    reused = {e.group_idx for e in events if isinstance(e, BlockStored) and e.block_hashes}
    assert reused == {0, 1}


@pytest.mark.parametrize("seed", range(20, 22))
def test_the_full_report_under_async_scheduling(seed: int) -> None:
    kinds, _ = _run(seed, 30, ("full", "window"), full_every=2, classes=ASYNC)
    assert kinds["BlockStored"] > 0


def test_a_full_report_hit_is_published_at_its_lookup() -> None:
    """Hand-checkable: r0 caches its 40-token prompt's 2 full blocks; r1 and r2 repeat it.
    Only r0 asking for the full report (its lookup missed): r0's store alone. All three
    asking: r1's and r2's lookups hit 2 blocks and publish them (no parent, their 32
    tokens), beside no new store."""
    theirs, ours, peer, their_events, our_events = _pair(30, ("full",))
    prompt = list(range(100, 140))
    arrivals = [(0, "r0", prompt, 1), (2, "r1", prompt, 1), (4, "r2", prompt, 1)]
    compare_stream(theirs, ours, arrivals, _maker(peer, full_every=1 << 30))
    _check(their_events, our_events)
    flat = [e for batch in our_events.batches for e in batch if isinstance(e, BlockStored)]
    # r0 is "full" too (0 is a multiple): its lookup missed, so only its store shows.
    assert [len(e.block_hashes) for e in flat] == [2]
    theirs, ours, peer, their_events, our_events = _pair(30, ("full",))
    compare_stream(theirs, ours, arrivals, _maker(peer, full_every=1))
    _check(their_events, our_events)
    flat = [e for batch in our_events.batches for e in batch if isinstance(e, BlockStored)]
    assert [len(e.block_hashes) for e in flat] == [2, 2, 2]
    assert flat[1].block_hashes == flat[0].block_hashes
    assert flat[1].parent_block_hash is None
    assert flat[1].token_ids == prompt[:32]


# ---- the check can fail ------------------------------------------------------------------


def test_the_comparison_fails_when_a_groups_events_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The variant showing the check can fail: the adapter publishing group 0's events
    only differs from vLLM."""
    from tokenyard.integrations import _vllm_kv_events

    build = _vllm_kv_events.KvEventBuilder.build

    def group_0_only(self: Any, events: Any, calls: Any, request_of: Any) -> list[Any]:
        out = build(self, events, calls, request_of)
        return [e for e in out if getattr(e, "group_idx", 0) == 0]

    monkeypatch.setattr(_vllm_kv_events.KvEventBuilder, "build", group_0_only)
    with pytest.raises(AssertionError, match="batch"):
        _run(0, 40, ("full", "window"))


def test_the_comparison_fails_when_the_full_report_is_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The adapter dropping the lookups' hits (the incremental report for every request)
    differs from vLLM on a stream whose requests ask for the full one."""
    from tokenyard.integrations import _vllm_kv_events

    build = _vllm_kv_events.KvEventBuilder.build

    def no_reuse(self: Any, events: Any, calls: Any, request_of: Any) -> list[Any]:
        return build(self, events, [c for c in calls if not c[6]], request_of)

    monkeypatch.setattr(_vllm_kv_events.KvEventBuilder, "build", no_reuse)
    with pytest.raises(AssertionError, match="batch"):
        _run(13, 40, ("full",), full_every=1)


# ---- beside a Mamba align group -----------------------------------------------------------


def _mamba_peer(publisher: str) -> VllmSchedulerPeer:
    peer = VllmSchedulerPeer(
        num_blocks=40, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512
    )
    peer.vllm_config.cache_config.mamba_cache_mode = "align"
    peer.vllm_config.kv_events_config = KVEventsConfig(
        enable_kv_cache_events=True, publisher=publisher, endpoint="inproc://kvevgroups"
    )
    return peer


def test_events_beside_a_mamba_align_group_are_vllms() -> None:
    """Refused before (``kv_events_config.publisher='zmq'``); now published, batch for
    batch as vLLM's (tests/test_integrations_vllm_kv_events_layouts.py runs the streams):
    the prompt's 2 full blocks in full attention, its last state block in the Mamba
    group."""
    peer = _mamba_peer("zmq")
    captures = Capture(), Capture()
    pair = []
    for cls, capture in zip((Scheduler, TokenyardScheduler), captures, strict=True):
        # Each publisher binds its own endpoint.
        peer.vllm_config.kv_events_config.endpoint = f"inproc://kvevgroups-{cls.__name__}"
        scheduler = peer.build(cls, _groups(40, "full", "mamba"))
        scheduler.kv_event_publisher.shutdown()
        scheduler.kv_event_publisher = capture
        pair.append(scheduler)
    theirs, ours = pair
    compare_stream(theirs, ours, [(0, "r0", list(range(100, 140)), 3)], peer.make_request)
    _check(*captures)
    stored = [e for b in captures[1].batches for e in b if isinstance(e, BlockStored)]
    assert [(e.group_idx, len(e.block_hashes), len(e.token_ids)) for e in stored] == [
        (0, 2, 32),
        (1, 1, 32),
    ]
