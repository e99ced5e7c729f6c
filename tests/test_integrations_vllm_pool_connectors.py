"""tokenyard.integrations.vllm with the KV connectors that keep vLLM's GPU block pool
(``bind_gpu_block_pool``): vLLM 0.33's ``SimpleCPUOffloadConnector`` against vLLM's own
``Scheduler`` on the same seeded streams, and those the adapter still refuses by name.

vLLM's ``Scheduler.__init__`` binds its ``KVCacheManager`` into the connector, whose base
method hands ``block_pool`` to ``bind_gpu_block_pool``; ``SimpleCPUOffloadScheduler``
(``vllm/v1/simple_kv_offload/manager.py``) then ``touch``-es the GPU blocks it stores from
and loads into, frees them when the copy completes (``free_blocks``), reads their
``block_hash`` to key its CPU cache, and in lazy mode walks the GPU free queue
(``free_block_queue.iter_blocks_after``). Through the adapter those go to the core's pool
(``_vllm_coordinator_view.BlockPoolView``). The worker side is synthesized as vLLM's
``SimpleCPUOffloadWorker`` reports (``v1/simple_kv_offload/worker.py``: a load event's
requests in ``finished_recving``, a store event in
``SimpleCPUOffloadWorkerMetadata.completed_store_events``), each event completing after a
seeded delay of 0 to 2 steps, in order, as its stream's events do. Every step is compared:
scheduled tokens and block ids, the connector metadata (load and store events and their GPU
and CPU blocks, flush flag), the requests waiting for loads, KV usage, block tables, the GPU
free queue and the ref counts. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.config import KVEventsConfig, KVTransferConfig
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus
from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadWorkerMetadata
from vllm.v1.structured_output import StructuredOutputManager
from vllm_compare import BLOCK_SIZE, block_digest, runner_output, sampling, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler


def _spec(block_size: int = BLOCK_SIZE) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float16
    )


def _kv_cache_config(
    num_blocks: int, block_size: int = BLOCK_SIZE, window: int | None = None
) -> KVCacheConfig:
    """One full-attention group, and a sliding-window one of ``window`` tokens beside it
    (each group's tensor overlays the one allocation, as vLLM lays out a hybrid model's)."""
    specs: list[Any] = [_spec(block_size)]
    if window is not None:
        specs.append(
            SlidingWindowSpec(
                block_size=block_size,
                num_kv_heads=1,
                head_size=1,
                dtype=torch.float16,
                sliding_window=window,
            )
        )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[
            KVCacheTensor(
                size=spec.page_size_bytes * num_blocks,
                layers=[f"l{g}"],
                layer_stride=spec.page_size_bytes * num_blocks,
                block_stride=spec.page_size_bytes,
            )
            for g, spec in enumerate(specs)
        ],
        kv_cache_groups=[KVCacheGroupSpec([f"l{g}"], spec) for g, spec in enumerate(specs)],
    )


def _simple_cpu(cpu_blocks: int, lazy: bool) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="SimpleCPUOffloadConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "cpu_bytes_to_use": cpu_blocks * _spec().page_size_bytes,
            "lazy_offload": lazy,
        },
    )


def _peer(
    transfer: KVTransferConfig,
    num_blocks: int,
    events: bool,
    asynchronous: bool = False,
    caching: bool = True,
) -> VllmSchedulerPeer:
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=512,
        enable_prefix_caching=caching,
    )
    if not caching:
        # EngineCore hashes requests whenever a KV connector is on, prefix caching or not.
        hash_fn = get_hash_fn_by_name(peer.vllm_config.cache_config.prefix_caching_hash_algo)
        kv_cache_utils.init_none_hash(hash_fn)
        peer._block_hasher = kv_cache_utils.get_request_block_hasher(BLOCK_SIZE, hash_fn)
    peer.vllm_config.kv_transfer_config = transfer
    peer.vllm_config.scheduler_config.async_scheduling = asynchronous
    if events:
        peer.vllm_config.kv_events_config = KVEventsConfig(
            enable_kv_cache_events=True, publisher="null"
        )
    return peer


def _meta(out: Any) -> tuple[Any, ...]:
    meta = out.kv_connector_metadata
    return (
        meta.load_event,
        list(meta.load_gpu_blocks),
        list(meta.load_cpu_blocks),
        {e: list(r) for e, r in meta.load_event_to_reqs.items()},
        meta.store_event,
        list(meta.store_gpu_blocks),
        list(meta.store_cpu_blocks),
        meta.need_flush,
    )


def _loading(scheduler: Any) -> set[str]:
    return {
        r.request_id
        for r in scheduler.requests.values()
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    }


def _pool_state(scheduler: Any) -> tuple[list[int], list[int]]:
    """The GPU pool's free queue (eviction order) and every block's ref count, vLLM's ids."""
    pool = scheduler.kv_cache_manager.block_pool
    free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    return free, [b.ref_cnt for b in pool.blocks[1:]]


def _outputs(by_client: dict[int, Any]) -> dict[int, Any]:
    """A step's engine outputs: each request's new tokens and finish reason, per client."""
    return {
        client: [(o.request_id, list(o.new_token_ids), o.finish_reason) for o in outs.outputs]
        for client, outs in by_client.items()
    }


def _events(batches: list[Any]) -> list[Any]:
    """The KV events published so far, drained: the GPU pool's (the core's, built as vLLM's
    since branch ``kvevents``, beside every layout these streams run) and the connector's
    CPU tier's; each event's type, vLLM block hashes, parent, tokens and medium."""
    events = [
        (
            type(e).__name__,
            getattr(e, "block_hashes", None),
            getattr(e, "parent_block_hash", None),
            getattr(e, "token_ids", None),
            e.medium,
        )
        for batch in batches
        for e in batch.events
    ]
    batches.clear()
    return events


def _check_pool(ours: Any, theirs: Any, step: int) -> None:
    mine, peer = _pool_state(ours), _pool_state(theirs)
    if mine != peer:
        free_ours, refs_ours = mine
        free_peer, refs_peer = peer
        pairs = enumerate(zip(refs_ours, refs_peer, strict=True), start=1)
        refs = [(block, a, b) for block, (a, b) in pairs if a != b]
        raise AssertionError(
            f"step {step}: free queues {free_ours[:12]} vs vLLM's {free_peer[:12]} "
            f"(first differing at {_first_diff(free_ours, free_peer)}), "
            f"ref counts (block, ours, vLLM's) {refs[:12]}, tails {free_ours[-5:]} {free_peer[-5:]}"
        )


def _first_diff(a: list[int], b: list[int]) -> int:
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))


def _waves(seed: int) -> list[tuple[int, str, list[int], int]]:
    """Three seeded waves: a second with other prompts pushes the first's blocks out of a
    small GPU pool, and a third asks the first's prompts again (from the CPU)."""
    waves = []
    for wave, (rng_seed, start) in enumerate(((seed, 0), (seed + 1000, 50), (seed, 110))):
        waves += [
            (start + at, f"{request_id}w{wave}", prompt, max_tokens)
            for at, request_id, prompt, max_tokens in seeded_arrivals(
                random.Random(rng_seed),
                count=8,
                prefix_tokens=160,
                shared=(0, 16, 48, 100, 160),
                tail_max=100,
                arrive_by=30,
                max_tokens=20,
                lowest_token=1,
                max_prompt=300,
            )
        ]
    return waves


class _Worker:
    """vLLM's ``SimpleCPUOffloadWorker`` as the scheduler sees it: each step's load and
    store events complete after the delays drawn for them (the same draws on both sides),
    each stream in order."""

    def __init__(self) -> None:
        self.loads: list[tuple[int, int, list[str]]] = []  # (due step, event, requests)
        self.stores: list[tuple[int, int]] = []  # (due step, event)

    def submit(self, out: Any, step: int, delays: tuple[int, int]) -> None:
        meta = out.kv_connector_metadata
        if meta.load_event >= 0:
            due = max([step + delays[0], *(d for d, _, _ in self.loads)])
            self.loads.append((due, meta.load_event, meta.load_event_to_reqs[meta.load_event]))
        if meta.store_event >= 0:
            due = max([step + delays[1], *(d for d, _ in self.stores)])
            self.stores.append((due, meta.store_event))

    def report(self, step: int) -> KVConnectorOutput:
        landed = {r for due, _, reqs in self.loads if due <= step for r in reqs}
        stored = {event: 1 for due, event in self.stores if due <= step}
        self.loads = [x for x in self.loads if x[0] > step]
        self.stores = [x for x in self.stores if x[0] > step]
        worker_meta = SimpleCPUOffloadWorkerMetadata(completed_store_events=stored)
        return KVConnectorOutput(
            finished_recving=landed or None,
            kv_connector_worker_meta=worker_meta if stored else None,
        )


def _run(
    seed: int,
    *,
    num_blocks: int,
    cpu_blocks: int,
    lazy: bool = False,
    events: bool = True,
    window: int | None = None,
    asynchronous: bool = False,
    caching: bool = True,
    layout: Any = None,
) -> dict[str, int]:
    """A seeded stream on both schedulers, every step compared (see the module doc): a
    sliding-window group of ``window`` tokens beside the full-attention one if given;
    vLLM's ``AsyncScheduler`` and ``AsyncTokenyardScheduler`` if ``asynchronous`` (a step's
    output lands after the next step is formed); prefix caching off if not ``caching``;
    ``layout`` the KV cache groups instead, with its own ``prepare(peer, num_blocks)``
    (the config, the peer set for it) and ``build(peer, cls, config)``
    (test_integrations_vllm_simple_offload_kinds.py)."""
    peer = _peer(_simple_cpu(cpu_blocks, lazy), num_blocks, events, asynchronous, caching)
    config = (
        _kv_cache_config(num_blocks, window=window)
        if layout is None
        else layout.prepare(peer, num_blocks)
    )
    classes = (
        (AsyncScheduler, AsyncTokenyardScheduler)
        if asynchronous
        else (Scheduler, TokenyardScheduler)
    )
    pair = [
        peer.build(cls, config) if layout is None else layout.build(peer, cls, config)
        for cls in classes
    ]
    published: list[list[Any]] = [[], []]
    for scheduler, batches in zip(pair, published, strict=True):
        publisher = scheduler.kv_event_publisher
        publisher.publish = batches.append  # type: ignore[method-assign]
    workers = [_Worker(), _Worker()]
    rng = random.Random(seed * 7 + 3)
    arrivals = _waves(seed)
    seen = {"loads": 0, "stores": 0, "preemptions": 0, "cpu_events": 0}
    # Steps formed whose outputs are not in yet (the asynchronous schedulers take a step's
    # output after forming the next one): the step, its outputs and who samples.
    pending: list[tuple[int, list[Any], list[set[str]]]] = []
    for step in range(800):
        for at, *args in arrivals:
            if at == step:
                for scheduler in pair:
                    scheduler.add_request(peer.make_request(*args))
        outs = [scheduler.schedule() for scheduler in pair]
        assert block_digest(outs[1]) == block_digest(outs[0]), f"step {step}"
        metas = [_meta(out) for out in outs]
        assert metas[1] == metas[0], f"step {step}"
        assert _loading(pair[1]) == _loading(pair[0]), f"step {step}"
        # The connector's boundary-store counters (it has no scheduler manager with prefix
        # caching off).
        stats = [s.connector.get_boundary_store_stats() for s in pair]
        assert stats[1] == stats[0], f"step {step}"
        seen["boundary_stores"] = stats[0].stored if stats[0] is not None else 0
        seen["loads"] += len(metas[0][1])
        seen["stores"] += len(metas[0][5])
        seen["preemptions"] += len(outs[0].preempted_req_ids)
        delays = (rng.randrange(3), rng.randrange(3))
        for worker, out in zip(workers, outs, strict=True):
            worker.submit(out, step, delays)
        pending.append((step, outs, [sampling(s, o) for s, o in zip(pair, outs, strict=True)]))
        idle = not any(o.num_scheduled_tokens for o in outs)
        while pending and (not asynchronous or len(pending) == 2 or idle):
            formed, outs, samples = pending.pop(0)
            results = []
            for scheduler, worker, out, sample in zip(pair, workers, outs, samples, strict=True):
                output = runner_output(scheduler, out, sample)
                output.kv_connector_output = worker.report(formed)
                results.append(_outputs(scheduler.update_from_output(out, output)))
            assert results[1] == results[0], f"step {formed}"
        events = _events(published[0])
        assert _events(published[1]) == events, f"step {step}"
        seen["cpu_events"] += sum(1 for event in events if event[4] != "GPU")
        ours, theirs = pair[1], pair[0]
        _check_pool(ours, theirs, step)
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        for request_id in theirs.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == theirs.kv_cache_manager.get_block_ids(request_id), step
        drained = not pending and not workers[0].stores and not workers[0].loads
        if step > 150 and drained and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            ours._core.check_invariants()
            return seen
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize("seed", range(6))
def test_simple_cpu_offload_matches_vllm(seed: int) -> None:
    seen = _run(seed, num_blocks=160, cpu_blocks=400)
    assert seen["stores"] > 0
    assert seen["cpu_events"] > 0


# A small GPU pool evicts the first wave's prompts; the third wave loads them from the CPU.
@pytest.mark.parametrize("seed", range(6))
def test_simple_cpu_offload_under_memory_pressure_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=40, cpu_blocks=400)["loads"] > 0


# A pool so small that running requests are preempted: vLLM's connector flushes
# (need_flush) and forgets the preempted requests' stored blocks.
@pytest.mark.parametrize("seed", range(3))
def test_simple_cpu_offload_with_preemptions_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=21, cpu_blocks=400)["preemptions"] > 0


# A small CPU pool too: the CPU side evicts (LRU) what the third wave would have loaded.
@pytest.mark.parametrize("seed", range(3))
def test_simple_cpu_offload_small_cpu_pool_matches_vllm(seed: int) -> None:
    _run(seed, num_blocks=40, cpu_blocks=24, events=False)


# Lazy mode: the connector walks the GPU free queue from a cursor and stores what nears
# eviction.
@pytest.mark.parametrize("seed", range(3))
def test_simple_cpu_offload_lazy_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=40, cpu_blocks=400, lazy=True)["stores"] > 0


def test_simple_cpu_offload_is_bound_to_the_pool_view() -> None:
    scheduler = _peer(_simple_cpu(64, False), 64, False).build(
        TokenyardScheduler, _kv_cache_config(64)
    )
    manager = scheduler.connector.scheduler_manager
    assert manager._gpu_block_pool is scheduler.kv_cache_manager.block_pool


def _with_group(config: KVCacheConfig, spec: Any) -> KVCacheConfig:
    """``config`` with a group of ``spec`` beside (its tensor overlaying the allocation)."""
    name = f"l{len(config.kv_cache_groups)}"
    config.kv_cache_groups.append(KVCacheGroupSpec([name], spec))
    size = config.kv_cache_tensors[0].size
    config.kv_cache_tensors.append(
        KVCacheTensor(size=size, layers=[name], layer_stride=size, block_stride=size // 64)
    )
    return config


def test_simple_cpu_offload_beside_an_unchecked_group_kind_is_refused_by_name() -> None:
    spec = MLAAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16)
    config = _with_group(_kv_cache_config(64), spec)
    peer = _peer(_simple_cpu(64, False), 64, False)
    assert peer.build(Scheduler, config).connector is not None
    with pytest.raises(ConfigError, match="beside a MLAAttentionSpec KV cache") as e:
        peer.build(TokenyardScheduler, config)
    assert e.value.field == "kv_transfer_config.kv_connector"
    assert e.value.value == "SimpleCPUOffloadConnector"


# Groups of two block sizes (vLLM hashes at their gcd and schedules at their lcm) are served
# in eager mode with KV cache events off (test_integrations_vllm_simple_offload_kinds.py);
# vLLM's full-attention partial tail entries, which the core does not register, reach the
# connector's KV events and its lazy free-queue walk.
@pytest.mark.parametrize(
    ("lazy", "events", "reason"),
    [
        (True, False, "block_size 32 over hash_block_size 16 in lazy_offload mode"),
        (False, True, "block_size 32 over hash_block_size 16 with KV cache events on"),
    ],
)
def test_simple_cpu_offload_over_two_block_sizes_is_refused_by_name(
    lazy: bool, events: bool, reason: str
) -> None:
    window = SlidingWindowSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16, sliding_window=48
    )
    config = _with_group(_kv_cache_config(64, block_size=2 * BLOCK_SIZE), window)
    peer = _peer(_simple_cpu(64, lazy), 64, events)

    def build(cls: type) -> Any:
        return cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=config,
            structured_output_manager=StructuredOutputManager(peer.vllm_config),
            block_size=2 * BLOCK_SIZE,
            hash_block_size=BLOCK_SIZE,
        )

    assert build(Scheduler).connector is not None
    with pytest.raises(ConfigError, match=reason) as e:
        build(TokenyardScheduler)
    assert e.value.value == "SimpleCPUOffloadConnector"


# A sliding window beside full attention (vLLM's hybrid layout): blocks leaving the window
# are null in the GPU table; vLLM's connector stores them from the GPU prefix cache
# (``_cached_gpu_block``: ``get_cached_block`` per group) and loads each group's hit.
@pytest.mark.parametrize("seed", range(4))
def test_simple_cpu_offload_sliding_window_matches_vllm(seed: int) -> None:
    seen = _run(seed, num_blocks=160, cpu_blocks=400, window=48)
    assert seen["stores"] > 0


# vLLM's AsyncScheduler: a step's output lands after the next step is formed, so the
# connector's stores read confirmed tokens (num_computed_tokens less the placeholders).
@pytest.mark.parametrize("seed", range(4))
def test_simple_cpu_offload_async_matches_vllm(seed: int) -> None:
    seen = _run(seed, num_blocks=40, cpu_blocks=400, asynchronous=True)
    assert seen["stores"] > 0
    assert seen["loads"] > 0


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("seed", range(4))
def test_simple_cpu_offload_sliding_window_async_matches_vllm(seed: int, lazy: bool) -> None:
    seen = _run(seed, num_blocks=40, cpu_blocks=400, window=48, lazy=lazy, asynchronous=True)
    assert seen["stores"] > 0


@pytest.mark.parametrize("seed", range(4))
def test_simple_cpu_offload_sliding_window_lazy_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=40, cpu_blocks=400, window=48, lazy=True)["stores"] > 0


# Prefix caching off: vLLM's GPU pool caches no hashes, so the connector finds nothing to
# store (every block NOT_HASHED) and its CPU cache stays empty; only its empty events run.
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("seed", range(3))
def test_simple_cpu_offload_without_prefix_caching_matches_vllm(
    seed: int, lazy: bool, asynchronous: bool
) -> None:
    seen = _run(
        seed, num_blocks=40, cpu_blocks=400, lazy=lazy, caching=False, asynchronous=asynchronous
    )
    assert seen["stores"] == seen["loads"] == 0


# The checks can fail: the blocks an asynchronous update caches before the connector is
# told a request finished left unanswered (their hashes as the update began), or every
# block's hash keyed by the full-attention group, and vLLM's scheduler is no longer matched.
@pytest.mark.parametrize(
    ("broken", "window"),
    [
        ("cached_by_update", None),
        ("_hash_and_group", 48),
    ],
)
def test_simple_cpu_offload_checks_can_fail(
    monkeypatch: pytest.MonkeyPatch, broken: str, window: int | None
) -> None:
    from tokenyard.integrations._vllm_coordinator_view import BlockPoolView

    original = getattr(BlockPoolView, broken)

    def group_zero(self: Any, key: int) -> Any:
        found = original(self, key)
        return None if found is None else (found[0], 0)

    replacement = (lambda *_: None) if broken == "cached_by_update" else group_zero
    monkeypatch.setattr(BlockPoolView, broken, replacement)
    with pytest.raises((AssertionError, TypeError)):
        _run(0, num_blocks=40, cpu_blocks=400, window=window, asynchronous=True)
