"""tokenyard.integrations.vllm with vLLM 0.33's Mooncake store connector
(``MooncakeStoreConnector``, ``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/``)
against vLLM's own ``Scheduler`` on the same seeded streams, and its layouts the adapter
refuses by name.

The connector's scheduler half (``MooncakeStoreScheduler``) pins the GPU blocks of every
store job it emits (``_reference_save_blocks``: ``pool.touch([pool.blocks[i] ...])``) and
drops them, tail first, when every rank reported the job done
(``update_connector_output``: ``MooncakeStoreWorkerMetadata.completed_saves``,
``pool.free_blocks``). Through the adapter those go to the core's pool
(``_vllm_coordinator_view.BlockPoolView``). Its store is modelled: the lookup
(``LookupKeyClient.lookup``, replaced on both sides by the same model) answers the longest
prefix of a request's block hashes every group can reuse from the ``(group, hash)`` keys
completed store jobs saved, found by the connector's own ``MooncakeStoreCoordinator``, as the
worker's ``LookupKeyServer`` does (a full hit found again below the request's end);
with ``lookup_async`` it answers ``None`` first, then the hit. The worker is synthesized as
``MooncakeStoreWorker`` reports: an async load's request in ``finished_recving``, a store job
in ``completed_saves``, each after a seeded delay of 0 to 2 steps. Every step compares
scheduled tokens and block ids, the connector metadata (every ``ReqMeta`` field the worker
reads: tokens, block ids, hashes, load spec, store job, token ids), the pinned store jobs,
the requests waiting for loads, the outputs, KV usage, block tables, the GPU free queue in
eviction order and every block's ref count. Layouts: one full-attention group, a sliding
window or a Mamba ``align`` group beside it (its states stored from vLLM's boundary-state
hand-offs, as boundary puts keyed per group), MLA's group alone or with MLA's sliding window
(bounded replay too), chunked local attention beside full attention, and groups of differing
block sizes (``_build``: the scheduler block size their lcm, the requests hashed at their
gcd, each group's blocks keyed at its own size), prefix caching on or off. Needs vLLM (the
bench venv); skipped elsewhere.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.config import KVEventsConfig, KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import (
    scheduler as mooncake_scheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.coordinator import (
    ExternalCachedBlockPool,
)
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import (
    MooncakeLookupResult,
    MooncakeStoreWorkerMetadata,
    TailKeyBoundary,
)
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from vllm_compare import BLOCK_SIZE, block_digest, runner_output, sampling, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations import _vllm_boundary_offloads
from tokenyard.integrations._vllm_coordinator_view import BlockPoolView
from tokenyard.integrations._vllm_pool_connectors import refuse_mooncake_store_layout
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler


def _spec(block_size: int = BLOCK_SIZE) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float16
    )


def _tensor(layer: str, num_blocks: int) -> KVCacheTensor:
    page = _spec().page_size_bytes
    return KVCacheTensor(
        size=page * num_blocks, layers=[layer], layer_stride=page * num_blocks, block_stride=page
    )


def _kv_cache_config(num_blocks: int) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[_tensor("l0", num_blocks)],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], _spec())],
    )


def _mamba_spec(block_size: int = BLOCK_SIZE) -> MambaSpec:
    return MambaSpec(
        block_size=block_size, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"
    )


def _attention(kind: str, block_size: int) -> Any:
    """A group spec of ``kind`` (``mla``, ``window``: 64 tokens, ``chunked``: chunks of 64)."""
    common = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    if kind == "mla":
        return MLAAttentionSpec(**common)
    if kind == "window":
        return SlidingWindowSpec(sliding_window=64, **common)
    if kind in ("swmla", "replay"):
        return SlidingWindowMLASpec(sliding_window=64, bounded_replay=kind == "replay", **common)
    return ChunkedLocalAttentionSpec(attention_chunk_size=64, **common)


# Layouts of more groups: (kind, block size) of each beside a full-attention group of the
# first size. ``sizes``: Gemma's under P/D (a 32-token full-attention block, a 16-token
# window's); ``sizes3``: three sizes (the core takes differing sizes for these two kinds).
_GROUPS = {
    "mla": [],
    "swmla": [("swmla", BLOCK_SIZE)],
    "replay": [("replay", BLOCK_SIZE)],
    "chunked": [("chunked", BLOCK_SIZE)],
    "sizes": [("window", 16)],
    "sizes3": [("window", 16), ("window", 32)],
}
_FIRST = {
    "mla": ("mla", BLOCK_SIZE),
    "swmla": ("mla", BLOCK_SIZE),
    "replay": ("mla", BLOCK_SIZE),
    "sizes": ("full", 32),
    "sizes3": ("full", 64),
}


def _groups_config(num_blocks: int, layout: str) -> KVCacheConfig:
    kind, size = _FIRST.get(layout, ("full", BLOCK_SIZE))
    specs = [_spec(size) if kind == "full" else _attention(kind, size)]
    specs += [_attention(k, s) for k, s in _GROUPS[layout]]
    groups = [KVCacheGroupSpec([f"l{i}"], spec) for i, spec in enumerate(specs)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def _build(peer: VllmSchedulerPeer, cls: type, config: KVCacheConfig) -> Any:
    """``cls`` over ``config`` as vLLM's engine builds it: beside groups of differing block
    sizes the scheduler block size their lcm, the hash block size their gcd, requests hashed
    at it (``resolve_kv_cache_block_sizes``)."""
    sizes = [g.kv_cache_spec.block_size for g in config.kv_cache_groups]
    if len(set(sizes)) == 1:
        return peer.build(cls, config)
    hash_fn = get_hash_fn_by_name(peer.vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    peer._block_hasher = get_request_block_hasher(math.gcd(*sizes), hash_fn)
    return cls(
        vllm_config=peer.vllm_config,
        kv_cache_config=config,
        structured_output_manager=StructuredOutputManager(peer.vllm_config),
        block_size=math.lcm(*sizes),
        hash_block_size=math.gcd(*sizes),
    )


def _store_keys(
    hashes: list[bytes], sizes: list[int], unit: int, num_tokens: int, skip: set[int]
) -> list[tuple[int, bytes]]:
    """The ``(group, hash)`` keys a save of ``num_tokens`` tokens writes: each group's
    blocks keyed by the hash at their end (``chunk_hashes_for_block_size``), ``skip``'s
    groups (Mamba's, stored by boundary puts) left out."""
    return [
        (group, hashes[(i + 1) * size // unit - 1])
        for group, size in enumerate(sizes)
        if group not in skip
        for i in range(min(num_tokens, len(hashes) * unit) // size)
    ]


def _layout_config(num_blocks: int, layout: str) -> KVCacheConfig:
    """``full``: one full-attention group; ``swa``: a 32-token sliding window beside it;
    ``mamba``: a Mamba ``align`` group beside it (Qwen3-Next's, Nemotron-H's layout); the
    layouts of ``_GROUPS``."""
    if layout == "full":
        return _kv_cache_config(num_blocks)
    if layout == "swa":
        return _two_groups(num_blocks)
    if layout in _GROUPS:
        return _groups_config(num_blocks, layout)
    config = _kv_cache_config(num_blocks)
    mamba = _mamba_spec()
    config.kv_cache_groups.append(KVCacheGroupSpec(["mamba"], mamba))
    page = mamba.page_size_bytes
    config.kv_cache_tensors.append(
        KVCacheTensor(
            size=page * num_blocks,
            layers=["mamba"],
            layer_stride=page * num_blocks,
            block_stride=page,
        )
    )
    return config


def _mooncake(role: str = "kv_both", **extra: Any) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="MooncakeStoreConnector", kv_role=role, kv_connector_extra_config=extra
    )


def _peer(
    transfer: KVTransferConfig, num_blocks: int, events: bool, caching: bool = True
) -> VllmSchedulerPeer:
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=512,
        enable_prefix_caching=caching,
    )
    peer.vllm_config.kv_transfer_config = transfer
    if events:
        peer.vllm_config.kv_events_config = KVEventsConfig(
            enable_kv_cache_events=True, publisher="null"
        )
    if not caching:
        # EngineCore hashes requests whenever a KV connector is on, prefix caching or not.
        hash_fn = get_hash_fn_by_name(peer.vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        peer._block_hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)
    return peer


class _Store:
    """Mooncake's store as its lookup answers (``MooncakeStoreWorker.lookup``): the
    ``(group, block hash)`` keys completed store jobs saved, the longest prefix every group
    can reuse found by the connector's own ``MooncakeStoreCoordinator`` over an
    ``ExternalCachedBlockPool`` of them, a hit reaching the request's end found again below
    it, each group's tail key at the hit. With ``non_block`` (``lookup_async``) the first
    ask of a request answers ``None`` (not ready), the next the hit, as
    ``LookupKeyClient.lookup`` does once its future is done. ``coord`` is set once the
    connector is built."""

    def __init__(self) -> None:
        self.saved: set[tuple[int, bytes]] = set()
        self.asked: set[str] = set()
        self.coord: Any = None

    def lookup(
        self, req_id: str, num_tokens: int, block_hashes: Any, non_block: bool = False
    ) -> MooncakeLookupResult | None:
        if non_block and req_id not in self.asked:
            self.asked.add(req_id)
            return None
        self.asked.discard(req_id)
        coord = self.coord
        pool = ExternalCachedBlockPool(coord.hash_block_size, self.saved)
        token_len = coord.align_lookup_length(num_tokens)
        _, hit = coord.find_longest_cache_hit(block_hashes, token_len, pool)
        if hit >= num_tokens:
            _, hit = coord.find_longest_cache_hit(
                block_hashes, coord.align_lookup_length(num_tokens - 1), pool
            )
        groups = range(len(coord.kv_cache_groups))
        tails = tuple(TailKeyBoundary(g, hit) for g in groups) if hit else ()
        return MooncakeLookupResult(hit, tails)

    def discard(self, req_id: str) -> None:
        self.asked.discard(req_id)

    def reset(self) -> bool:
        self.saved.clear()
        return True


class _Worker:
    """``MooncakeStoreWorker`` as the scheduler sees it: each async load and each store job
    of a step completes after the delays drawn for that step (the same draws on both sides);
    a completed store job saves its keys into the store: each attention group's hashes of
    the blocks its tokens cover, and each boundary put's (``BoundaryPut``: a Mamba state
    handed off, keyed by the hash at its boundary)."""

    def __init__(self, store: _Store, load_async: bool, mamba_groups: set[int]) -> None:
        self.store = store
        self.load_async = load_async
        self.mamba_groups = mamba_groups
        coord = store.coord
        self.sizes = [g.kv_cache_spec.block_size for g in coord.kv_cache_groups]
        self.unit = coord.hash_block_size
        self.loads: list[tuple[int, str]] = []  # (due step, request)
        self.saves: list[tuple[int, int, list[tuple[int, bytes]]]] = []  # (due, job, keys)

    def _keys(self, req: Any) -> list[tuple[int, bytes]]:
        hashes = [bytes(h) for h in req.block_hashes]
        keys = _store_keys(hashes, self.sizes, self.unit, req.token_len_chunk, self.mamba_groups)
        for put in req.boundary_puts or []:
            keys.append((put.group_id, hashes[put.num_tokens // self.unit - 1]))
        return keys

    def submit(self, out: Any, step: int, delays: tuple[int, int]) -> None:
        for req in out.kv_connector_metadata.requests:
            if self.load_async and req.load_spec is not None and req.load_spec.can_load:
                self.loads.append((step + delays[0], req.req_id))
            if req.store_job_id is not None:
                self.saves.append((step + delays[1], req.store_job_id, self._keys(req)))

    def report(self, step: int) -> KVConnectorOutput:
        landed = {r for due, r in self.loads if due <= step}
        done = [(job, keys) for due, job, keys in self.saves if due <= step]
        self.loads = [x for x in self.loads if x[0] > step]
        self.saves = [x for x in self.saves if x[0] > step]
        for _, keys in done:
            self.store.saved.update(keys)
        completed = {job: 1 for job, _ in done}
        return KVConnectorOutput(
            finished_recving=landed or None,
            kv_connector_worker_meta=(
                MooncakeStoreWorkerMetadata(completed_saves=completed) if completed else None
            ),
        )


@pytest.fixture(autouse=True)
def _modelled_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each connector's lookups go to a ``_Store`` of its own instead of a ZMQ client of
    the worker's ``LookupKeyServer`` (none runs here)."""
    monkeypatch.setattr(mooncake_scheduler, "LookupKeyClient", lambda vllm_config: _Store())


def _meta(out: Any) -> tuple[Any, ...]:
    """Every field of the step's ``MooncakeStoreConnectorMetadata`` the worker reads."""
    meta = out.kv_connector_metadata
    requests = [
        (
            r.req_id,
            r.token_len_chunk,
            [list(g) for g in r.block_ids],
            [bytes(h) for h in r.block_hashes],
            r.can_save,
            None
            if r.load_spec is None
            else (
                r.load_spec.vllm_cached_tokens,
                r.load_spec.kvpool_cached_tokens,
                r.load_spec.can_load,
                r.load_spec.token_len,
                r.load_spec.tail_key_boundaries,
            ),
            r.token_ids,
            r.token_ids_start,
            r.num_prompt_tokens,
            r.prefill_end_tokens,
            r.store_job_id,
            r.boundary_puts,
            r.completed_token_len,
            r.publish_partial_tail,
        )
        for r in meta.requests
    ]
    return requests, sorted(meta.unfinished_request_ids), sorted(meta.preempted_req_ids)


def _pinned(scheduler: Any) -> dict[int, tuple[list[int], int]]:
    return dict(scheduler.connector.connector_scheduler._pinned_saves)


def _loading(scheduler: Any) -> set[str]:
    return {
        r.request_id
        for r in scheduler.requests.values()
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    }


def _pool_state(scheduler: Any) -> tuple[list[int], list[int]]:
    pool = scheduler.kv_cache_manager.block_pool
    free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    return free, [b.ref_cnt for b in pool.blocks[1:]]


def _outputs(by_client: dict[int, Any]) -> dict[int, Any]:
    return {
        client: [(o.request_id, list(o.new_token_ids), o.finish_reason) for o in outs.outputs]
        for client, outs in by_client.items()
    }


def _waves(seed: int) -> list[tuple[int, str, list[int], int]]:
    """Three seeded waves: a second with other prompts pushes the first's blocks out of a
    small GPU pool, and a third asks the first's prompts again (from the store)."""
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


def _run(
    seed: int,
    *,
    num_blocks: int,
    role: str = "kv_both",
    events: bool = False,
    layout: str = "full",
    caching: bool = True,
    asynchronous: bool = False,
    **extra: Any,
) -> dict[str, int]:
    """A seeded stream on both schedulers, every step compared (see the module doc). With
    ``asynchronous``, vLLM's ``AsyncScheduler`` and ``AsyncTokenyardScheduler``: a step's
    output (and the worker's report with it) is taken after the next step is formed.
    ``layout`` as ``_layout_config``'s; ``caching`` False: prefix caching off."""
    peer = _peer(_mooncake(role, **extra), num_blocks, events, caching)
    peer.vllm_config.scheduler_config.async_scheduling = asynchronous
    if layout == "mamba":
        peer.vllm_config.cache_config.mamba_cache_mode = "align"
    config = _layout_config(num_blocks, layout)
    mamba_groups = {
        i for i, g in enumerate(config.kv_cache_groups) if isinstance(g.kv_cache_spec, MambaSpec)
    }
    classes = (
        (AsyncScheduler, AsyncTokenyardScheduler)
        if asynchronous
        else (Scheduler, TokenyardScheduler)
    )
    pair = [_build(peer, cls, config) for cls in classes]
    load_async = extra.get("load_async", True)
    workers = []
    for scheduler in pair:
        store_scheduler = scheduler.connector.connector_scheduler
        store_scheduler.client.coord = store_scheduler._store_coord
        workers.append(_Worker(store_scheduler.client, load_async, mamba_groups))
    if role == "kv_consumer":
        # A consumer's store is filled by a producer elsewhere: its first wave's prompts.
        for worker in workers:
            for _, request_id, prompt, max_tokens in _waves(seed)[:8]:
                request = peer.make_request(request_id, prompt, max_tokens)
                hashes = [bytes(h) for h in request.block_hashes]
                keys = _store_keys(hashes, worker.sizes, worker.unit, len(prompt), set())
                worker.store.saved.update(keys)
    rng = random.Random(seed * 7 + 3)
    arrivals = _waves(seed)
    seen = {"loads": 0, "stores": 0, "preemptions": 0, "boundary_puts": 0}
    # Steps formed whose outputs are not in yet (two at most with async scheduling).
    pending: list[tuple[list[Any], list[set[str]]]] = []
    for step in range(800):
        for at, *args in arrivals:
            if at == step:
                for scheduler in pair:
                    scheduler.add_request(peer.make_request(*args))
        outs = [scheduler.schedule() for scheduler in pair]
        assert block_digest(outs[1]) == block_digest(outs[0]), f"step {step}"
        metas = [_meta(out) for out in outs]
        assert metas[1] == metas[0], f"step {step}"
        assert _pinned(pair[1]) == _pinned(pair[0]), f"step {step}"
        assert _loading(pair[1]) == _loading(pair[0]), f"step {step}"
        seen["loads"] += sum(r[5] is not None for r in metas[0][0])
        seen["stores"] += sum(r[10] is not None for r in metas[0][0])
        seen["boundary_puts"] += sum(len(r[11] or ()) for r in metas[0][0])
        seen["preemptions"] += len(outs[0].preempted_req_ids)
        delays = (rng.randrange(3), rng.randrange(3))
        for worker, out in zip(workers, outs, strict=True):
            worker.submit(out, step, delays)
        pending.append((outs, [sampling(s, out) for s, out in zip(pair, outs, strict=True)]))
        idle = not any(out.num_scheduled_tokens for out in outs)
        while pending and (not asynchronous or len(pending) == 2 or idle):
            step_outs, samples = pending.pop(0)
            results = []
            for scheduler, worker, out, sample in zip(
                pair, workers, step_outs, samples, strict=True
            ):
                output = runner_output(scheduler, out, sample)
                output.kv_connector_output = worker.report(step)
                results.append(_outputs(scheduler.update_from_output(out, output)))
            assert results[1] == results[0], f"step {step}"
        ours, theirs = pair[1], pair[0]
        assert _pinned(ours) == _pinned(theirs), f"step {step}"
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        assert _pool_state(ours) == _pool_state(theirs), f"step {step}"
        for request_id in theirs.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == theirs.kv_cache_manager.get_block_ids(request_id), step
        assert ours.has_unfinished_requests() == theirs.has_unfinished_requests(), step
        if step > 150 and not pending and not theirs.has_unfinished_requests():
            ours._core.check_invariants()
            return seen
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize("seed", range(4))
def test_mooncake_store_matches_vllm(seed: int) -> None:
    seen = _run(seed, num_blocks=160)
    assert seen["stores"] > 0


# A small GPU pool evicts the first wave's prompts; the third wave loads them from the store.
@pytest.mark.parametrize("seed", range(4))
def test_mooncake_store_under_memory_pressure_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=40)["loads"] > 0


# A pool so small that running requests are preempted while their store jobs hold blocks.
@pytest.mark.parametrize("seed", range(2))
def test_mooncake_store_with_preemptions_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=20)["preemptions"] > 0


# Lookups answered a step late (lookup_async) and loads done in the step (load_async off),
# KV events on (the connector tracks token ids then).
@pytest.mark.parametrize("seed", range(2))
def test_mooncake_store_lookup_async_sync_loads_matches_vllm(seed: int) -> None:
    seen = _run(seed, num_blocks=40, events=True, lookup_async=True, load_async=False)
    assert seen["loads"] > 0


# A producer (which looks up too: enable_lookup); a consumer with save_decode_cache loads
# the prompts a producer saved and stores its decode blocks.
@pytest.mark.parametrize("seed", range(2))
def test_mooncake_store_producer_and_consumer_match_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=40, role="kv_producer")["stores"] > 0
    seen = _run(seed, num_blocks=40, role="kv_consumer", save_decode_cache=True)
    assert seen["loads"] > 0
    assert seen["stores"] > 0


# AsyncScheduler: each step's output comes in after the next step is formed.
@pytest.mark.parametrize("seed", range(3))
def test_mooncake_store_async_scheduling_matches_vllm(seed: int) -> None:
    seen = _run(seed, num_blocks=40, asynchronous=True)
    assert seen["loads"] > 0
    assert _run(seed, num_blocks=20, asynchronous=True)["stores"] > 0


@pytest.mark.parametrize("caching", [True, False])
def test_the_check_fails_when_the_pins_are_dropped(
    monkeypatch: pytest.MonkeyPatch, caching: bool
) -> None:
    """The comparison catches a pool view whose touches do nothing (and whose frees drop
    nothing): the ref counts and free queue then differ from vLLM's."""
    monkeypatch.setattr(BlockPoolView, "touch", lambda self, blocks: None)
    monkeypatch.setattr(BlockPoolView, "free_blocks", lambda self, blocks: None)
    with pytest.raises(AssertionError, match="step"):
        _run(0, num_blocks=40, caching=caching)


def test_mooncake_store_is_bound_to_the_pool_view() -> None:
    scheduler = _peer(_mooncake(), 64, False).build(TokenyardScheduler, _kv_cache_config(64))
    store = scheduler.connector.connector_scheduler
    assert store._gpu_block_pool is scheduler.kv_cache_manager.block_pool


def _two_groups(num_blocks: int) -> KVCacheConfig:
    config = _kv_cache_config(num_blocks)
    config.kv_cache_groups.append(
        KVCacheGroupSpec(
            ["l1"],
            SlidingWindowSpec(
                block_size=BLOCK_SIZE,
                num_kv_heads=1,
                head_size=1,
                dtype=torch.float16,
                sliding_window=32,
            ),
        )
    )
    config.kv_cache_tensors.append(_tensor("l1", num_blocks))
    return config


# A full-attention and a sliding-window group: the store job pins each group's blocks (the
# window's null blocks skipped), the core's coordinator pool holding them.
@pytest.mark.parametrize("seed", range(3))
def test_mooncake_store_beside_a_sliding_window_group_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=80, layout="swa")["loads"] > 0


# Qwen3-Next's, Nemotron-H's layout: full attention beside a Mamba ``align`` group. vLLM's
# MambaManager hands each state it caches to the connector (``take_boundary_state_offloads``
# in ``kv_connector_block_state.boundary_state_offloads``), which stores it as a boundary
# put of the request's store job (``_handle_boundary_state_offloads``) and pins its block
# with the job's; a later request hits where both groups' keys are stored. Pools small
# enough to evict (the third wave loads from the store) and to preempt.
@pytest.mark.parametrize(("seed", "num_blocks"), [(0, 160), (1, 160), (2, 40), (3, 40), (0, 24)])
def test_mooncake_store_beside_a_mamba_align_group_matches_vllm(seed: int, num_blocks: int) -> None:
    seen = _run(seed, num_blocks=num_blocks, layout="mamba")
    assert seen["boundary_puts"] > 0
    assert seen["stores"] > 0
    if num_blocks == 40:
        assert seen["loads"] > 0


@pytest.mark.parametrize("seed", range(3))
def test_async_mooncake_store_beside_a_mamba_align_group_matches_vllm(seed: int) -> None:
    seen = _run(seed, num_blocks=40, layout="mamba", asynchronous=True)
    assert seen["boundary_puts"] > 0
    assert seen["loads"] > 0


# Lookups a step late, loads in the step, KV events on, beside the Mamba group.
def test_mooncake_store_mamba_lookup_async_sync_loads_matches_vllm() -> None:
    seen = _run(1, num_blocks=40, layout="mamba", events=True, lookup_async=True, load_async=False)
    assert seen["loads"] > 0


def test_the_mamba_check_fails_without_boundary_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter before boundary hand-offs: no Mamba state is put, so the store jobs'
    metadata and pins differ from vLLM's."""
    monkeypatch.setattr(_vllm_boundary_offloads.BoundaryStateOffers, "take", lambda *a: {})
    with pytest.raises(AssertionError, match="step"):
        _run(0, num_blocks=160, layout="mamba")


# Prefix caching off: vLLM's requests are still hashed (a connector is on), the store
# saves and loads, nothing hits the GPU prefix cache. vLLM's Mamba manager caches nothing
# then, so no boundary state is handed off and beside a Mamba group nothing loads.
@pytest.mark.parametrize(
    ("seed", "layout", "asynchronous"),
    [
        (0, "full", False),
        (1, "full", False),
        (2, "full", True),
        (0, "swa", False),
        (0, "mamba", False),
        (1, "mamba", True),
    ],
)
def test_mooncake_store_without_prefix_caching_matches_vllm(
    seed: int, layout: str, asynchronous: bool
) -> None:
    seen = _run(seed, num_blocks=40, layout=layout, caching=False, asynchronous=asynchronous)
    assert seen["stores"] > 0
    assert seen["boundary_puts"] == 0
    # Beside Mamba no state is stored, so no prefix of both groups hits.
    assert (seen["loads"] > 0) == (layout != "mamba")


def _layout(*specs: Any, hash_block_size: int = BLOCK_SIZE) -> Any:
    """What the refusal reads of the adapter's ``kv_cache_manager``."""
    groups = [KVCacheGroupSpec([f"l{i}"], spec) for i, spec in enumerate(specs)]
    return SimpleNamespace(
        kv_cache_config=KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups),
        block_pool=SimpleNamespace(hash_block_size=hash_block_size),
    )


def _connector() -> Any:
    peer = _peer(_mooncake(), 64, False)
    return peer.build(Scheduler, _kv_cache_config(64)).connector


def test_mooncake_store_beside_a_plain_mamba_group_is_refused_by_name() -> None:
    mamba = MambaSpec(
        block_size=BLOCK_SIZE, shapes=((1,),), dtypes=(torch.float16,), mamba_cache_mode="none"
    )
    with pytest.raises(ConfigError, match=r"mamba_cache_mode 'none' \(group 1") as e:
        refuse_mooncake_store_layout(_connector(), "", _layout(_spec(), mamba))
    assert e.value.field == "kv_transfer_config.kv_connector"
    assert e.value.value == "MooncakeStoreConnector"
    refuse_mooncake_store_layout(_connector(), "", _layout(_spec(), _mamba_spec()))


@pytest.mark.parametrize("kind", ["RSWASpec", "CrossAttentionSpec"])
def test_mooncake_store_beside_an_unchecked_group_is_refused_by_name(kind: str) -> None:
    """Kinds never checked against vLLM's, refused by exact class: R-SWA's spec, a subclass
    of FullAttentionSpec, passed the old ``isinstance`` check unchecked."""
    common = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    spec = (
        RSWASpec(rswa_window=64, **common) if kind == "RSWASpec" else CrossAttentionSpec(**common)
    )
    with pytest.raises(ConfigError, match=rf"beside a {kind} KV cache group \(group 1") as e:
        refuse_mooncake_store_layout(_connector(), "", _layout(_spec(), spec))
    assert e.value.value == "MooncakeStoreConnector"


def test_mooncake_store_beside_the_served_kinds_is_not_refused() -> None:
    served = [_attention(kind, BLOCK_SIZE) for kind in ("mla", "window", "swmla", "chunked")]
    refuse_mooncake_store_layout(_connector(), "", _layout(_spec(), *served, _mamba_spec()))


def test_mooncake_store_with_its_partial_hash_hits_on_is_refused_by_name() -> None:
    """The store's own partial hash hits (``enable_partial_hash_hits``, which vLLM's store
    takes from the engine's ``cache_hit_alignment_tokens`` below the scheduler block:
    sub-block hits, finish-time partial tails) are not modelled; with them off, groups of
    differing block sizes are served, a Mamba align block over the hash block size too
    (the core's own partial hits are refused before, by ``_vllm_block_sizes``, where
    vLLM's managers would take them)."""
    layout = _layout(_spec(32), _mamba_spec(64), hash_block_size=16)
    connector = _connector()
    refuse_mooncake_store_layout(connector, "", layout)
    # A sliding window of another size keeps vLLM's fine-grained hits off: served (it was
    # refused while the check ignored the groups' managers).
    window = _layout(_spec(16), _attention("window", 32), _mamba_spec(64), hash_block_size=16)
    refuse_mooncake_store_layout(connector, "", window)
    connector.connector_scheduler.enable_partial_hash_hits = True
    with pytest.raises(ConfigError, match=r"partial hash hits on beside .*\[32, 64\]") as e:
        refuse_mooncake_store_layout(connector, "", layout)
    assert e.value.value == "MooncakeStoreConnector"
    sizes = _layout(_spec(32), _attention("window", 16), _mamba_spec(16), hash_block_size=16)
    refuse_mooncake_store_layout(_connector(), "", sizes)
    # One group over the hash block size: vLLM's engine never builds it.
    with pytest.raises(ConfigError, match="one KV cache group of block_size 16 over hash_block"):
        refuse_mooncake_store_layout(_connector(), "", _layout(_spec(), hash_block_size=8))


def test_the_sizes_check_fails_when_the_pins_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over differing block sizes too, a pool view whose touches and frees do nothing
    leaves ref counts and the free queue unlike vLLM's."""
    monkeypatch.setattr(BlockPoolView, "touch", lambda self, blocks: None)
    monkeypatch.setattr(BlockPoolView, "free_blocks", lambda self, blocks: None)
    with pytest.raises(AssertionError, match="step"):
        _run(1, num_blocks=60, layout="sizes")


# MLA's spec (DeepSeek's) and chunked local attention (Llama 4's) beside full attention:
# vLLM's MooncakeStoreScheduler stores them by their block tables as any non-Mamba group
# (the old check let MLA pass by isinstance and refused chunked local attention).
@pytest.mark.parametrize(
    ("seed", "layout"),
    [(0, "mla"), (1, "mla"), (0, "chunked"), (2, "chunked"), (0, "swmla"), (0, "replay")],
)
def test_mooncake_store_beside_mla_and_chunked_groups_matches_vllm(seed: int, layout: str) -> None:
    seen = _run(seed, num_blocks=60, layout=layout)
    assert seen["stores"] > 0
    assert seen["loads"] > 0


# Groups of differing block sizes (the scheduler block size their lcm, requests hashed at
# their gcd): each group's blocks stored keyed at its own size, a hit where every group's
# keys are stored, as the connector's own MooncakeStoreCoordinator finds it.
@pytest.mark.parametrize(
    ("seed", "layout", "num_blocks", "asynchronous"),
    [
        (0, "sizes", 160, False),
        (1, "sizes", 60, False),
        (2, "sizes", 30, False),
        (3, "sizes", 60, True),
        (0, "sizes3", 80, False),
        (1, "sizes3", 60, True),
        (2, "sizes3", 30, False),
    ],
)
def test_mooncake_store_over_differing_block_sizes_matches_vllm(
    seed: int, layout: str, num_blocks: int, asynchronous: bool
) -> None:
    seen = _run(seed, num_blocks=num_blocks, layout=layout, asynchronous=asynchronous)
    assert seen["stores"] > 0
    # A pool of 160 blocks keeps the first wave's prompts: they hit the GPU prefix cache.
    assert (seen["loads"] > 0) == (num_blocks < 160)


# Over differing block sizes: prefix caching off (the requests hashed at the gcd still, a
# connector being on); lookups a step late, loads in the step, KV events on; a consumer.
def test_mooncake_store_over_differing_block_sizes_in_other_modes_matches_vllm() -> None:
    assert _run(0, num_blocks=40, layout="sizes", caching=False)["loads"] > 0
    seen = _run(1, num_blocks=40, layout="sizes", events=True, lookup_async=True, load_async=False)
    assert seen["loads"] > 0
    seen = _run(2, num_blocks=40, layout="sizes", role="kv_consumer", save_decode_cache=True)
    assert seen["loads"] > 0
