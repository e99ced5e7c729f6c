"""The adapter's KV cache events against vLLM 0.33's own: both schedulers run one seeded
stream with ``KVEventsConfig(enable_kv_cache_events=True)`` and a publisher stub; every
published batch must be equal, event for event and field for field (vLLM's
``BlockPool.cache_full_blocks`` / ``_emit_block_removed_events`` / ``reset_prefix_cache``
events, annotated by ``KVCacheManager.take_events``). Streams: prefix hits, evictions,
preemptions, ``reset_prefix_cache``, LoRA, cache salts, images, async scheduling."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import BlockStored
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request
from vllm_compare import (
    BLOCK_SIZE,
    Budget,
    compare_stream,
    image_arrivals,
    image_request,
    make_multimodal,
    seeded_arrivals,
)
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler


class Capture:
    """A KV event publisher that keeps each published batch's events."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def publish(self, batch: Any) -> None:
        self.batches.append(list(batch.events))

    def shutdown(self) -> None:
        pass


def _pair(
    num_blocks: int, *, classes: tuple[type, type] = (Scheduler, TokenyardScheduler), **config: Any
) -> tuple[Any, Any, VllmSchedulerPeer, Capture, Capture]:
    settings = {"max_model_len": 1024, "max_num_seqs": 4, "max_num_batched_tokens": 64, **config}
    peer = VllmSchedulerPeer(num_blocks=num_blocks, block_size=BLOCK_SIZE, **settings)
    peer.vllm_config.kv_events_config = KVEventsConfig(
        enable_kv_cache_events=True, publisher="null"
    )
    kv_cache_config = peer.scheduler.kv_cache_config
    theirs, ours = (peer.build(cls, kv_cache_config) for cls in classes)
    captures = Capture(), Capture()
    theirs.kv_event_publisher, ours.kv_event_publisher = captures
    return theirs, ours, peer, *captures


def _check(theirs: Capture, ours: Capture) -> Counter[str]:
    """Every batch equal; returns the count of each event kind published."""
    assert len(ours.batches) == len(theirs.batches)
    for i, (mine, vllms) in enumerate(zip(ours.batches, theirs.batches, strict=True)):
        assert mine == vllms, f"batch {i}"
    return Counter(type(e).__name__ for batch in theirs.batches for e in batch)


def _run(
    seed: int,
    num_blocks: int,
    make: Callable[[VllmSchedulerPeer], Callable[..., Request]] | None = None,
    **config: Any,
) -> tuple[Counter[str], int]:
    """A seeded text stream (``make(peer)`` builds its requests); returns the events
    published by kind and vLLM's preemptions."""
    rng = random.Random(seed)
    theirs, ours, peer, their_events, our_events = _pair(num_blocks, **config)
    arrivals = seeded_arrivals(rng, tail_max=60, max_tokens=40, count=10, arrive_by=10)
    maker = make(peer) if make is not None else peer.make_request
    seen = compare_stream(theirs, ours, arrivals, maker, max_steps=2000)
    return _check(their_events, our_events), len(seen.preempted)


# ---- plain text: prefix hits, evictions, preemptions --------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_text_streams_publish_vllms_events(seed: int) -> None:
    kinds, _ = _run(seed, num_blocks=(14, 24, 60)[seed % 3])
    assert kinds["BlockStored"] > 0


@pytest.mark.parametrize("seed", range(6, 10))
def test_a_tight_pool_evicts_and_preempts_with_vllms_events(seed: int) -> None:
    kinds, num_preempted = _run(seed, num_blocks=11)
    assert kinds["BlockRemoved"] > 0
    _PREEMPTED[seed] = num_preempted


_PREEMPTED: dict[int, int] = {}


def test_the_tight_streams_preempted() -> None:
    """The tight streams above (run first, in file order) preempted requests."""
    if len(_PREEMPTED) < 4:
        pytest.skip("runs after the tight streams")
    assert sum(_PREEMPTED.values()) > 0


def test_the_streams_covered_evictions_and_stores_of_many_blocks() -> None:
    """Hand-checkable: one 40-token prompt (2 full blocks of 16) caches both in one
    ``BlockStored`` with its 32 tokens, no parent; its third block once the decode fills
    it, with the second as parent."""
    theirs, ours, peer, their_events, our_events = _pair(num_blocks=8)
    arrivals = [(0, "r0", list(range(100, 140)), 12)]
    compare_stream(theirs, ours, arrivals, peer.make_request)
    _check(their_events, our_events)
    stored = [e for batch in our_events.batches for e in batch]
    assert [len(e.block_hashes) for e in stored] == [2, 1]
    assert stored[0].token_ids == list(range(100, 132))
    assert stored[0].parent_block_hash is None
    assert stored[1].parent_block_hash == stored[0].block_hashes[1]
    assert stored[0].group_idx == 0
    assert stored[0].kv_cache_spec_kind == "full_attention"


# ---- reset_prefix_cache ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10, 13))
def test_a_reset_between_streams_publishes_all_blocks_cleared(seed: int) -> None:
    rng = random.Random(seed)
    theirs, ours, peer, their_events, our_events = _pair(num_blocks=20)
    for wave in ("a", "b"):
        arrivals = [
            (at, f"{wave}{rid}", prompt, n)
            for at, rid, prompt, n in seeded_arrivals(rng, tail_max=50, max_tokens=20)
        ]
        compare_stream(theirs, ours, arrivals, peer.make_request)
        assert ours.reset_prefix_cache()
        assert theirs.reset_prefix_cache()
    kinds = _check(their_events, our_events)
    assert kinds["AllBlocksCleared"] == 1  # the second reset's goes out with no next step


# ---- LoRA and cache salts: extra keys ----------------------------------------------------


def _lora_requests(peer: VllmSchedulerPeer) -> Callable[..., Request]:
    loras = [None, LoRARequest("ada", 1, "/nonexistent/ada"), LoRARequest("bob", 2, "/x/bob")]

    def make(request_id: str, prompt: list[int], max_tokens: int) -> Request:
        lora = loras[int(request_id[1:]) % 3]
        params = SamplingParams(max_tokens=max_tokens)
        return Request(
            request_id, prompt, params, None, lora_request=lora, block_hasher=peer._block_hasher
        )

    return make


def _salted_requests(peer: VllmSchedulerPeer) -> Callable[..., Request]:
    def make(request_id: str, prompt: list[int], max_tokens: int) -> Request:
        salt = (None, "tenant-a", "tenant-b")[int(request_id[1:]) % 3]
        params = SamplingParams(max_tokens=max_tokens)
        return Request(
            request_id, prompt, params, None, cache_salt=salt, block_hasher=peer._block_hasher
        )

    return make


@pytest.mark.parametrize("seed", range(13, 16))
def test_lora_requests_publish_their_adapter_and_extra_keys(seed: int) -> None:
    kinds, _ = _run(seed, num_blocks=(16, 40, 12)[seed % 3], make=_lora_requests)
    assert kinds["BlockStored"] > 0


@pytest.mark.parametrize("seed", range(16, 19))
def test_salted_requests_publish_the_salt_in_their_first_blocks_extra_keys(seed: int) -> None:
    kinds, _ = _run(seed, num_blocks=(16, 40, 12)[seed % 3], make=_salted_requests)
    assert kinds["BlockStored"] > 0


# ---- async scheduling --------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(19, 22))
def test_async_scheduling_publishes_vllms_events(seed: int) -> None:
    kinds, _ = _run(
        seed, num_blocks=(12, 30, 60)[seed % 3], classes=(AsyncScheduler, AsyncTokenyardScheduler)
    )
    assert kinds["BlockStored"] > 0


# ---- images: multimodal extra keys -------------------------------------------------------


@pytest.mark.parametrize("seed", range(22, 25))
def test_image_requests_publish_their_items_in_the_extra_keys(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_multimodal(monkeypatch)
    Budget.compute, Budget.cache = 1024, 2048
    theirs, ours, peer, their_events, our_events = _pair(
        num_blocks=(40, 200, 60)[seed % 3], max_num_batched_tokens=256
    )
    arrivals = image_arrivals(random.Random(seed), count=10, images=5, max_tokens=30)

    def make(request_id: str, prompt: list[int], items: list[Any], n: int) -> Request:
        return image_request(peer._block_hasher, request_id, prompt, items, n)

    compare_stream(theirs, ours, arrivals, make, check_kv=False, max_steps=1000)
    _check(their_events, our_events)
    stored = [e for batch in our_events.batches for e in batch if isinstance(e, BlockStored)]
    keys = [k for e in stored for k in e.extra_keys or ()]
    assert any(k is not None for k in keys)


# ---- EAGLE's look-ahead hashes: lookahead_token_ids --------------------------------------


@pytest.mark.parametrize("seed", range(25, 27))
def test_lookahead_hashes_publish_their_lookahead_tokens(seed: int) -> None:
    eagle = {"num_speculative_tokens": 2, "speculative_method": "eagle3"}
    rng = random.Random(seed)
    theirs, ours, peer, their_events, our_events = _pair(num_blocks=(14, 40)[seed % 2], **eagle)
    assert peer.vllm_config.num_hash_lookahead_tokens == 1
    arrivals = seeded_arrivals(rng, tail_max=60, max_tokens=40, count=10, arrive_by=10)
    compare_stream(theirs, ours, arrivals, peer.make_request, max_steps=2000)
    _check(their_events, our_events)
    stored = [e for batch in our_events.batches for e in batch if isinstance(e, BlockStored)]
    assert all(len(t) == 1 for e in stored for t in e.lookahead_token_ids or [[0]])
    assert stored[0].lookahead_token_ids
