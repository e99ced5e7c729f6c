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
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
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
    # The smallest pools these streams drain in, about: every layout preempts.
    num_blocks = 30 if len(LAYOUTS[layout]) > 2 else 24
    removed = preempted = 0
    for seed in (51, 54):
        kinds, _, num_preempted = run_stream(layout, seed, num_blocks)
        removed += kinds["BlockRemoved"]
        preempted += num_preempted
    assert removed > 0
    assert preempted > 0


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_reset_between_two_waves_publishes_all_blocks_cleared(layout: str) -> None:
    """The first wave's reset goes out with the second wave's first batch; the second's
    would go out with a later step's, which the stream does not run (as in vLLM)."""
    kinds, _, _ = run_stream(layout, 60, 160, reset=True)
    assert kinds["AllBlocksCleared"] == 1


def test_a_partial_tail_entry_is_published_and_removed_after_its_block() -> None:
    """Hand-checkable, Gemma-like (full attention in blocks of 32, a window of 64 in blocks
    of 16, hash blocks of 16): a 40-token prompt's last hash boundary below 40 is 32, a
    block boundary (no entry); a 60-token prompt's is 48, inside full attention's block 1
    (tokens 32..64). Once 64 tokens are computed, block 1's ``BlockStored`` (32 tokens) is
    followed by the partial entry's: one hash (the 48-token prefix's), parent the 32-token
    one, tokens 32..48, ``block_size`` 16. A reset after the request ends clears both."""
    theirs, ours, peer, their_events, our_events = _pair("gemma-sizes", 40)
    prompt = list(range(100, 160))
    compare_stream(theirs, ours, [(0, "r0", prompt, 8)], peer.make_request)
    _check(their_events, our_events)
    stored = [e for b in our_events.batches for e in b if isinstance(e, BlockStored)]
    full = [(e.block_size, len(e.token_ids)) for e in stored if e.group_idx == 0]
    assert full == [(32, 32), (32, 32), (16, 16)]
    hashes = [maybe_convert_block_hash(h) for h in peer.make_request("r", prompt, 1).block_hashes]
    partial = [e for e in stored if e.group_idx == 0][2]
    assert (partial.block_hashes, partial.parent_block_hash) == ([hashes[2]], hashes[1])
    assert partial.token_ids == prompt[32:48]
    # Evicting: a second stream's requests take every block; block 1's removal is
    # followed by its partial entry's.
    arrivals = [
        (0, f"x{i}", list(range(1000 * (i + 1), 1000 * (i + 1) + 400)), 2) for i in range(3)
    ]
    compare_stream(theirs, ours, arrivals, peer.make_request)
    _check(their_events, our_events)
    removed = [e for b in our_events.batches for e in b if isinstance(e, BlockRemoved)]
    hashes = [e.block_hashes[0] for e in removed]
    assert partial.block_hashes[0] in hashes
    block_1 = [e for e in stored if e.group_idx == 0][1].block_hashes[0]
    assert hashes.index(partial.block_hashes[0]) == hashes.index(block_1) + 1


# ---- the check can fail ------------------------------------------------------------------


def test_the_comparison_fails_without_the_partial_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builder dropping the core's partial entries (as before) differs from vLLM."""
    from tokenyard.integrations import _vllm_kv_events

    build = _vllm_kv_events.KvEventBuilder.build

    def no_partials(self: Any, events: Any, calls: Any, request_of: Any) -> list[Any]:
        out = build(self, events, calls, request_of)
        return [
            e
            for e in out
            if not (isinstance(e, BlockStored) and e.block_size == 16 and e.group_idx == 0)
        ]

    monkeypatch.setattr(_vllm_kv_events.KvEventBuilder, "build", no_partials)
    with pytest.raises(AssertionError, match="batch"):
        run_stream("gemma-sizes", 0, 160)


def test_the_comparison_fails_with_one_block_size_for_every_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Events built in the scheduler block size for every group (the builder before
    differing sizes were served) differ from vLLM's."""
    from tokenyard.integrations import _vllm_kv_events

    monkeypatch.setattr(
        _vllm_kv_events.KvEventBuilder, "_group_block_size", lambda self, group: self._block_size
    )
    # vLLM's view of the hashes at the group's block size runs past the request's (an
    # IndexError) before any batch differs.
    with pytest.raises((AssertionError, IndexError)):
        run_stream("gemma-sizes", 0, 160)


# ---- refused by name ---------------------------------------------------------------------


def _checkpointing_mamba(publisher: str) -> tuple[Any, KVCacheConfig]:
    peer = VllmSchedulerPeer(
        num_blocks=40, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512
    )
    peer.vllm_config.cache_config.mamba_cache_mode = "align"
    peer.vllm_config.kv_events_config = KVEventsConfig(
        enable_kv_cache_events=True, publisher=publisher, endpoint="inproc://kvevlayouts2"
    )
    mamba = MambaSpec(
        block_size=BLOCK_SIZE,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=1,
        prefill_checkpoint_alignment=1,
    )
    groups = [
        KVCacheGroupSpec(["layers.0"], attention_spec("full")),
        KVCacheGroupSpec(["layers.1"], mamba),
    ]
    return peer, KVCacheConfig(num_blocks=40, kv_cache_tensors=[], kv_cache_groups=groups)


def test_a_checkpointing_mamba_group_is_refused_by_name() -> None:
    """A Mamba ``align`` group's prefill checkpoint block re-keys its partial entries
    (``replace_existing_hashes``), which the core does not record."""
    peer, config = _checkpointing_mamba("zmq")
    with pytest.raises(ConfigError, match=r"kv_events_config\.publisher='zmq'"):
        peer.build(TokenyardScheduler, config)
    peer, config = _checkpointing_mamba("null")
    peer.build(TokenyardScheduler, config)
