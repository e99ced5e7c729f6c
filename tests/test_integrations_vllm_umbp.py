"""tokenyard.integrations.vllm with vLLM 0.33's UMBP store connector (``UMBPStoreConnector``,
``vllm/distributed/kv_transfer/kv_connector/v1/umbp/``, loaded by module path as a user
loads it) against vLLM's own ``Scheduler`` and ``AsyncScheduler`` on the same seeded
streams, and its layouts the adapter refuses by name.

The connector's scheduler half (``UMBPStoreConnectorScheduler``) overrides both of vLLM's
binds: ``bind_kv_cache_manager`` keeps the manager (the base method, which hands its block
pool to ``bind_gpu_block_pool``) and binds a local-cache probe; each store event it emits
in ``build_connector_meta`` pins the GPU blocks its plans read (``pool.touch``), dropped,
tail first, when every worker reported the event (``update_connector_output``:
``UMBPConnectorWorkerMetadata.store_events``, ``pool.free_blocks``). Its runtime (the
``embedded`` mode's, MORI on ROCm) is replaced on both sides by the same model: a store of
keys, its lookup answering per key whether a completed store event saved it. The worker is
synthesized as ``UMBPStoreConnectorWorker`` reports: an async load's request in
``finished_recving``, a store event in ``store_events``, each after a seeded delay of 0 to 2
steps. Every step compares scheduled tokens and block ids, the connector metadata (store
and load plans: keys, blocks, requests; the store event; preempted ids), the pinned events,
the requests waiting for loads, the outputs, KV usage, block tables, the GPU free queue in
eviction order and every block's ref count, and with KV cache events on the store events
published. Layouts: one full-attention group, a sliding window or a Mamba ``align`` group
beside it (UMBP's own lookup coordinator then probes the local cache per group), groups of
differing block sizes (built as the Mooncake store's test builds them), MLA's spec alone or
beside MLA's sliding window, chunked local attention beside full attention. Some streams
fail loads partially (``invalid_block_ids`` under ``kv_load_failure_policy`` "recompute",
the failed loads compared too). Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from test_integrations_vllm_mooncake_store import (
    _attention,
    _build,
    _kv_cache_config,
    _layout,
    _layout_config,
    _loading,
    _mamba_spec,
    _outputs,
    _peer,
    _pool_state,
    _spec,
    _waves,
)
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.umbp import scheduler as umbp_scheduler
from vllm.distributed.kv_transfer.kv_connector.v1.umbp.data import (
    StoreEventResult,
    UMBPConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime.factory import UMBPRuntimeFactory
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    CrossAttentionSpec,
    KVCacheGroupSpec,
    MambaSpec,
    RSWASpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm_compare import BLOCK_SIZE, block_digest, runner_output, sampling

from tokenyard.errors import ConfigError, InputError
from tokenyard.integrations import _vllm_connector_binding
from tokenyard.integrations._vllm_boundary_offloads import BoundaryStateOffers
from tokenyard.integrations._vllm_coordinator_view import BlockPoolView
from tokenyard.integrations._vllm_pool_connectors import refuse_umbp_layout
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler


class _Store:
    """UMBP's scheduler handle over a store of keys: ``lookup`` answers per key whether a
    completed store event saved it."""

    def __init__(self) -> None:
        self.saved: set[str] = set()

    def lookup(self, keys: Sequence[str]) -> list[bool]:
        return [key in self.saved for key in keys]

    def clear(self) -> bool:
        self.saved.clear()
        return True

    def close(self) -> None:
        pass


class _Runtime:
    """The ``embedded`` runtime as the scheduler side uses it: one handle."""

    def __init__(self, config: Any) -> None:
        self.store = _Store()

    def create_scheduler_handle(self, namespace: str, topology: Any, layout: Any) -> _Store:
        return self.store

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _modelled_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(UMBPRuntimeFactory._builders, "embedded", _Runtime)


class _Clock:
    """The connector's clock (``time.monotonic`` in ``umbp/scheduler.py``, which times its
    event reconciliation, ``_reconcile_kv_events``: a second apart): 0.4 s a step, shared
    by both schedulers, so both reconcile on the same steps."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class _InlineExecutor:
    """The connector's lookup pool (``ThreadPoolExecutor``) run in the caller: each residency
    or lookup future is done when submitted, on both sides alike."""

    def __init__(self, **_: Any) -> None:
        pass

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(umbp_scheduler, "time", clock)
    monkeypatch.setattr(umbp_scheduler, "ThreadPoolExecutor", _InlineExecutor)
    return clock


def _published(batches: list[Any]) -> list[Any]:
    """The connector's KV events (the store's, ``medium`` not GPU) published so far,
    drained: each event's type, block hashes, parent, tokens, medium and group."""
    events = [
        (
            type(e).__name__,
            getattr(e, "block_hashes", None),
            getattr(e, "parent_block_hash", None),
            getattr(e, "token_ids", None),
            e.medium,
            e.group_idx,
        )
        for batch in batches
        for e in batch.events
        if getattr(e, "medium", None) != "GPU"
    ]
    batches.clear()
    return events


def _umbp(**extra: Any) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="UMBPStoreConnector",
        kv_connector_module_path="vllm.distributed.kv_transfer.kv_connector.v1.umbp.connector",
        kv_role="kv_both",
        kv_connector_extra_config={"key_namespace": "tokenyard-test", **extra},
    )


def _plans(plans: Any) -> list[tuple[Any, ...]]:
    return [(p.key, p.block_id, p.group_id) for p in plans]


def _meta(out: Any) -> tuple[Any, ...]:
    meta = out.kv_connector_metadata
    return (
        meta.async_load,
        [(p.key, p.block_id, p.request_id, p.group_id) for p in meta.store_plans],
        {r: _plans(plans) for r, plans in meta.load_requests.items()},
        {r: _plans(plans) for r, plans in meta.store_requests.items()},
        sorted(meta.preempted_request_ids),
        meta.store_event,
    )


def _pinned(scheduler: Any) -> dict[int, list[int]]:
    events = scheduler.connector.connector_scheduler._store_events
    return {event: list(state.block_ids()) for event, state in events.items()}


class _Worker:
    """``UMBPStoreConnectorWorker`` as the scheduler sees it: each step's async loads and
    store event complete after the delays drawn for that step (the same on both sides); a
    completed store event saves its keys."""

    def __init__(self, store: _Store) -> None:
        self.store = store
        self.loads: list[tuple[int, str]] = []
        self.saves: list[tuple[int, int, list[str]]] = []
        # Each load's GPU blocks (its plans'), and the synchronous loads of the step.
        self.loaded: dict[str, list[int]] = {}
        self.sync: list[str] = []

    def submit(self, out: Any, step: int, delays: tuple[int, int]) -> None:
        meta = out.kv_connector_metadata
        for r, plans in meta.load_requests.items():
            self.loaded[r] = [p.block_id for p in plans]
        self.sync = [] if meta.async_load else list(meta.load_requests)
        if meta.async_load:
            self.loads += [(step + delays[0], r) for r in meta.load_requests]
        if meta.store_event >= 0:
            keys = [p.key for plans in meta.store_plan_groups() for p in plans]
            self.saves.append((step + delays[1], meta.store_event, keys))

    def landing(self, step: int) -> list[str]:
        """The loads this step's report lands, then the step's synchronous loads."""
        return sorted({r for due, r in self.loads if due <= step}) + self.sync

    def report(self, step: int, invalid: set[int] | None = None) -> KVConnectorOutput:
        landed = {r for due, r in self.loads if due <= step}
        done = [(event, keys) for due, event, keys in self.saves if due <= step]
        self.loads = [x for x in self.loads if x[0] > step]
        self.saves = [x for x in self.saves if x[0] > step]
        for _, keys in done:
            self.store.saved.update(keys)
        events = {event: StoreEventResult(completed_workers=1) for event, _ in done}
        return KVConnectorOutput(
            finished_recving=landed or None,
            invalid_block_ids=invalid or set(),
            kv_connector_worker_meta=UMBPConnectorWorkerMetadata(store_events=events)
            if events
            else None,
        )


def _umbp_layout_config(num_blocks: int, layout: str) -> Any:
    """``_layout_config``'s layouts, and one group alone of another kind than full
    attention (``window``: a sliding window; ``lonechunked``: chunked local attention),
    for which UMBP's lookup runs its own coordinator and probes the local cache."""
    lone = {"window": "window", "lonechunked": "chunked"}
    if layout not in lone:
        return _layout_config(num_blocks, layout)
    config = _layout_config(num_blocks, "full")
    config.kv_cache_groups[0] = KVCacheGroupSpec(
        config.kv_cache_groups[0].layer_names, _attention(lone[layout], BLOCK_SIZE)
    )
    return config


def _invalid_blocks(
    rng: random.Random, worker: _Worker, landing: list[str], share: float
) -> set[int]:
    """Blocks reported invalid with a step's output: for a ``share`` of the loads it lands
    (and of its synchronous loads), one of the GPU blocks the load wrote (the first ones
    more often), held by that request alone; vLLM cuts its computed tokens back to the
    blocks before it (``_update_requests_with_invalid_blocks``, "recompute")."""
    invalid: set[int] = set()
    for request_id in landing:
        blocks = worker.loaded.get(request_id)
        if not blocks or rng.random() >= share:
            continue
        invalid.add(blocks[min(rng.randrange(len(blocks)), rng.randrange(len(blocks)))])
    return invalid


def _run(
    seed: int,
    *,
    num_blocks: int,
    asynchronous: bool = False,
    layout: str = "full",
    caching: bool = True,
    clock: _Clock | None = None,
    fail_share: float = 0.0,
    **extra: Any,
) -> dict[str, int]:
    """A seeded stream on both schedulers, every step compared (see the module doc);
    ``layout`` as the Mooncake store test's ``_layout_config``; ``caching`` False: prefix
    caching off; with ``clock`` (the ``clock`` fixture's), KV cache events on, the store's
    events published each step compared too."""
    transfer = _umbp(**extra)
    if fail_share:
        transfer.kv_load_failure_policy = "recompute"
    peer = _peer(transfer, num_blocks, clock is not None, caching)
    peer.vllm_config.scheduler_config.async_scheduling = asynchronous
    if layout == "mamba":
        peer.vllm_config.cache_config.mamba_cache_mode = "align"
    classes = (
        (AsyncScheduler, AsyncTokenyardScheduler)
        if asynchronous
        else (Scheduler, TokenyardScheduler)
    )
    pair = [_build(peer, cls, _umbp_layout_config(num_blocks, layout)) for cls in classes]
    workers = [_Worker(s.connector.connector_scheduler.runtime) for s in pair]
    published: list[list[Any]] = [[], []]
    for scheduler, batches in zip(pair, published, strict=True):
        scheduler.kv_event_publisher.publish = batches.append
    rng = random.Random(seed * 7 + 3)
    arrivals = _waves(seed)
    fail_rng = random.Random(seed * 11 + 5)
    seen = {"loads": 0, "stores": 0, "preemptions": 0, "store_events": 0}
    seen |= {"invalid": 0, "kept": 0}
    pending: list[tuple[list[Any], list[set[str]]]] = []
    for step in range(800):
        if clock is not None:
            clock.now = step * 0.4
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
        seen["loads"] += len(metas[0][2])
        seen["stores"] += metas[0][5] >= 0
        seen["preemptions"] += len(outs[0].preempted_req_ids)
        delays = (rng.randrange(3), rng.randrange(3))
        for worker, out in zip(workers, outs, strict=True):
            worker.submit(out, step, delays)
        pending.append((outs, [sampling(s, out) for s, out in zip(pair, outs, strict=True)]))
        idle = not any(out.num_scheduled_tokens for out in outs)
        while pending and (not asynchronous or len(pending) == 2 or idle):
            step_outs, samples = pending.pop(0)
            landing = workers[0].landing(step) if fail_share else []
            if asynchronous:
                landing = [r for r in landing if r not in workers[0].sync]
            invalid = _invalid_blocks(fail_rng, workers[0], landing, fail_share)
            seen["invalid"] += len(invalid)
            results = []
            for scheduler, worker, out, sample in zip(
                pair, workers, step_outs, samples, strict=True
            ):
                output = runner_output(scheduler, out, sample)
                output.kv_connector_output = worker.report(step, invalid)
                results.append(_outputs(scheduler.update_from_output(out, output)))
            assert results[1] == results[0], f"step {step}"
            failed = pair[0].failed_recving_kv_req_ids
            assert pair[1].failed_recving_kv_req_ids == failed, f"step {step}"
            seen["kept"] += sum(
                pair[0].requests[r].num_computed_tokens > 0 for r in failed if r in landing
            )
        ours, theirs = pair[1], pair[0]
        events = _published(published[0])
        assert _published(published[1]) == events, f"step {step}"
        seen["store_events"] += len(events)
        assert _pinned(ours) == _pinned(theirs), f"step {step}"
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        assert _pool_state(ours) == _pool_state(theirs), f"step {step}"
        for request_id in theirs.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == theirs.kv_cache_manager.get_block_ids(request_id), step
        assert ours.has_unfinished_requests() == theirs.has_unfinished_requests(), step
        drained = not theirs.requests if clock is not None else True
        if (
            step > 150
            and not pending
            and drained
            and (clock is not None or not theirs.has_unfinished_requests())
        ):
            ours._core.check_invariants()
            return seen
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize("seed", range(4))
def test_umbp_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=160)["stores"] > 0


# A small GPU pool evicts the first wave's prompts; the third wave loads them from the store.
@pytest.mark.parametrize("seed", range(4))
def test_umbp_under_memory_pressure_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=40)["loads"] > 0


@pytest.mark.parametrize("seed", range(2))
def test_umbp_with_preemptions_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=20)["preemptions"] > 0


# Loads done in the step (load_async off).
@pytest.mark.parametrize("seed", range(2))
def test_umbp_sync_loads_match_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=40, load_async=False)["loads"] > 0


@pytest.mark.parametrize("seed", range(3))
def test_umbp_async_scheduling_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=40, asynchronous=True)["loads"] > 0


def test_the_check_fails_when_the_pins_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BlockPoolView, "touch", lambda self, blocks: None)
    monkeypatch.setattr(BlockPoolView, "free_blocks", lambda self, blocks: None)
    with pytest.raises(AssertionError, match="step"):
        _run(0, num_blocks=40)


def test_umbp_is_bound_to_the_pool_view() -> None:
    scheduler = _peer(_umbp(), 64, False).build(TokenyardScheduler, _kv_cache_config(64))
    umbp = scheduler.connector.connector_scheduler
    assert umbp._gpu_block_pool is scheduler.kv_cache_manager.block_pool
    assert scheduler.connector._kv_cache_manager is scheduler.kv_cache_manager


# Beside a sliding-window group, or a Mamba ``align`` group (Qwen3-Next's layout), UMBP's
# lookup runs a coordinator of its own over the store's answers and probes the local prefix
# cache per group (``local_cache_hit``, through the adapter's coordinator view); beside
# Mamba it stores each state vLLM's manager hands off (``_add_boundary_state_plans``).
@pytest.mark.parametrize(
    ("seed", "layout", "num_blocks"),
    [
        (0, "swa", 80),
        (1, "swa", 80),
        (2, "swa", 40),
        (0, "mamba", 160),
        (1, "mamba", 40),
        (2, "mamba", 40),
        (3, "mamba", 24),
    ],
)
def test_umbp_beside_several_groups_matches_vllm(seed: int, layout: str, num_blocks: int) -> None:
    seen = _run(seed, num_blocks=num_blocks, layout=layout)
    assert seen["stores"] > 0
    if num_blocks == 40:
        assert seen["loads"] > 0


@pytest.mark.parametrize(("seed", "layout"), [(0, "swa"), (1, "mamba")])
def test_async_umbp_beside_several_groups_matches_vllm(seed: int, layout: str) -> None:
    assert _run(seed, num_blocks=40, layout=layout, asynchronous=True)["loads"] > 0


def test_the_groups_check_fails_without_the_local_cache_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The adapter without vLLM's hashes indexed for UMBP's probe (beside a sliding window;
    a Mamba ``align`` group has them indexed anyway): its pool view then answers no local
    block, and UMBP's coordinator finds other hits than vLLM's."""
    monkeypatch.setattr(_vllm_connector_binding, "umbp_probes_local_cache", lambda leaf: False)
    with pytest.raises(AssertionError, match="step"):
        _run(2, num_blocks=40, layout="swa")


def test_the_groups_check_fails_in_the_old_hand_off_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hand-offs ordered as before this change (the requests cached outside the step's
    allocations first): a landed load's state is stored ahead of the running requests'
    where vLLM's waiting pass caches it after them."""

    def old_order(self: Any, scheduled: Any, requests: Any) -> list[str]:
        return [*(r for r in requests if r not in scheduled), *scheduled]

    monkeypatch.setattr(BoundaryStateOffers, "cache_order", old_order)
    with pytest.raises(AssertionError, match="step"):
        _run(1, num_blocks=40, layout="mamba")


# Prefix caching off: the requests are hashed (a connector is on), nothing hits the GPU
# prefix cache, the store saves and loads.
@pytest.mark.parametrize(
    ("seed", "layout", "asynchronous"),
    [(0, "full", False), (1, "full", True), (0, "swa", False), (1, "mamba", False)],
)
def test_umbp_without_prefix_caching_matches_vllm(
    seed: int, layout: str, asynchronous: bool
) -> None:
    seen = _run(seed, num_blocks=40, layout=layout, caching=False, asynchronous=asynchronous)
    assert seen["stores"] > 0


# KV cache events on: a completed store event's blocks are published (``BlockStored``, the
# store's medium) once a residency lookup confirms them (``_reconcile_kv_events``, on the
# connector's clock and thread pool, made a step clock and an inline pool on both sides).
@pytest.mark.parametrize(("seed", "layout"), [(0, "full"), (1, "full"), (2, "swa"), (3, "mamba")])
def test_umbp_with_kv_events_matches_vllm(seed: int, layout: str, clock: _Clock) -> None:
    seen = _run(seed, num_blocks=40, layout=layout, clock=clock)
    assert seen["store_events"] > 0
    assert seen["loads"] > 0


def test_async_umbp_with_kv_events_matches_vllm(clock: _Clock) -> None:
    seen = _run(1, num_blocks=40, asynchronous=True, clock=clock, lookup_async=True)
    assert seen["store_events"] > 0


def test_the_events_check_fails_without_the_connector_events(
    monkeypatch: pytest.MonkeyPatch, clock: _Clock
) -> None:
    """An adapter that publishes its own events only: the store's are missing."""
    publish = TokenyardScheduler._publish_kv_events

    def without_connector_events(self: Any) -> None:
        connector, self.connector = self.connector, None
        try:
            publish(self)
        finally:
            self.connector = connector

    monkeypatch.setattr(TokenyardScheduler, "_publish_kv_events", without_connector_events)
    with pytest.raises(AssertionError, match="step"):
        _run(0, num_blocks=40, clock=clock)


def test_umbp_beside_an_unchecked_group_is_refused_by_name() -> None:
    connector = _peer(_umbp(), 64, False).build(Scheduler, _kv_cache_config(64)).connector
    plain = MambaSpec(
        block_size=BLOCK_SIZE, shapes=((1,),), dtypes=(torch.float16,), mamba_cache_mode="none"
    )
    with pytest.raises(ConfigError, match=r"mamba_cache_mode 'none'\) KV cache group \(group 1"):
        refuse_umbp_layout(connector, "", _layout(_spec(), plain))
    # Kinds never checked against vLLM's, refused by exact class (R-SWA's spec subclasses
    # FullAttentionSpec).
    common = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    for spec in (RSWASpec(rswa_window=64, **common), CrossAttentionSpec(**common)):
        kind = type(spec).__name__
        with pytest.raises(ConfigError, match=rf"beside a {kind} KV cache group \(group 1") as e:
            refuse_umbp_layout(connector, "", _layout(_spec(), spec))
        assert e.value.field == "kv_transfer_config.kv_connector"
        assert e.value.value == "UMBPStoreConnector"
    with pytest.raises(ConfigError, match="one KV cache group of block_size 16 over hash_block"):
        refuse_umbp_layout(connector, "", _layout(_spec(), hash_block_size=8))
    refuse_umbp_layout(connector, "", _layout(_spec(), _mamba_spec()))


def test_umbp_over_differing_block_sizes_with_partial_hits_is_refused_by_name() -> None:
    """Groups of differing block sizes are served with UMBP's ``enable_partial_hash_hits``
    off; on (sub-block hits), or beside a Mamba align block over the hash block size
    (vLLM's partial hash hits), refused."""
    sizes = _layout(_spec(32), _attention("window", 16), hash_block_size=16)
    for partial in (False, True):
        peer = _peer(_umbp(enable_partial_hash_hits=partial), 64, False)
        connector = peer.build(Scheduler, _kv_cache_config(64)).connector
        if not partial:
            refuse_umbp_layout(connector, "", sizes)
            continue
        with pytest.raises(ConfigError, match=r"partial hash hits on beside .*\[16, 32\]"):
            refuse_umbp_layout(connector, "", sizes)
    mamba = _layout(_spec(32), _mamba_spec(64), hash_block_size=16)
    with pytest.raises(ConfigError, match=r"partial hash hits on beside .*\[32, 64\]"):
        refuse_umbp_layout(connector, "", mamba)


# Groups of differing block sizes (as the Mooncake store's test builds them): UMBP keys each
# group's blocks at its own size (``group_block_sizes``) and its lookup coordinator finds
# the hit every group can reuse, landing on the scheduler block size.
@pytest.mark.parametrize(
    ("seed", "layout", "num_blocks", "asynchronous", "caching"),
    [
        (0, "sizes", 60, False, True),
        (1, "sizes", 30, False, True),
        (2, "sizes", 60, True, True),
        (0, "sizes3", 60, False, True),
        (3, "sizes", 40, False, False),
    ],
)
def test_umbp_over_differing_block_sizes_matches_vllm(
    seed: int, layout: str, num_blocks: int, asynchronous: bool, caching: bool
) -> None:
    seen = _run(
        seed, num_blocks=num_blocks, layout=layout, asynchronous=asynchronous, caching=caching
    )
    assert seen["stores"] > 0
    assert seen["loads"] > 0


# KV cache events on over differing block sizes: the store events each group's blocks
# published, compared every step.
@pytest.mark.parametrize(("seed", "asynchronous"), [(0, False), (1, True)])
def test_umbp_over_differing_block_sizes_with_kv_events_matches_vllm(
    seed: int, asynchronous: bool, clock: _Clock
) -> None:
    seen = _run(seed, num_blocks=60, layout="sizes", asynchronous=asynchronous, clock=clock)
    assert seen["store_events"] > 0
    assert seen["loads"] > 0


# MLA's spec (DeepSeek's) alone or beside MLA's sliding window (plain, and bounded replay,
# which is not prefix-cacheable: UMBP leaves that group out, ``prefix_cacheable_group_ids``),
# and chunked local attention (Llama 4's) beside full attention. UMBP's scheduler half reads
# a group's kind only to tell Mamba ``align`` apart (stored from hand-offs) and, for the
# rest, through vLLM's own managers (its lookup coordinator, ``get_kv_cache_coordinator``;
# its store mask, ``KVCacheSpecRegistry.get_manager_class(spec).reachable_block_mask``);
# the old check refused MLA's and chunked local attention's groups.
@pytest.mark.parametrize(
    ("seed", "layout", "num_blocks", "asynchronous"),
    [
        (0, "mla", 40, False),
        (1, "mla", 40, True),
        (0, "swmla", 60, False),
        (3, "swmla", 40, True),
        (0, "replay", 60, False),
        (0, "chunked", 60, False),
        (2, "chunked", 40, False),
        (3, "chunked", 40, True),
    ],
)
def test_umbp_beside_mla_and_chunked_groups_matches_vllm(
    seed: int, layout: str, num_blocks: int, asynchronous: bool
) -> None:
    seen = _run(seed, num_blocks=num_blocks, layout=layout, asynchronous=asynchronous)
    assert seen["stores"] > 0
    assert seen["loads"] > 0


# The same kinds with prefix caching off, and with KV cache events on.
@pytest.mark.parametrize("layout", ["mla", "chunked"])
def test_umbp_beside_mla_and_chunked_groups_in_other_modes_matches_vllm(
    layout: str, clock: _Clock
) -> None:
    assert _run(0, num_blocks=40, layout=layout, caching=False)["stores"] > 0
    seen = _run(2, num_blocks=40, layout=layout, clock=clock)
    assert seen["store_events"] > 0
    assert seen["loads"] > 0


def test_umbp_beside_the_served_kinds_is_not_refused() -> None:
    """Every kind served (the old check refused MLA's and chunked local attention's)."""
    connector = _peer(_umbp(), 64, False).build(Scheduler, _kv_cache_config(64)).connector
    kinds = ("mla", "window", "swmla", "replay", "chunked")
    refuse_umbp_layout(
        connector, "", _layout(_spec(), *(_attention(k, BLOCK_SIZE) for k in kinds), _mamba_spec())
    )
    refuse_umbp_layout(connector, "", _layout(_attention("mla", BLOCK_SIZE)))


# A landed load's blocks, cached when vLLM's waiting pass reaches it
# (``_update_waiting_for_remote_kv``), are a local hit by the time UMBP is asked about a
# later waiting request sharing their prefix: its per-group probe of the local cache
# (``local_cache_hit``) finds them, and its coordinator a longer hit. The pool view enters
# them as the pass reaches each (``BlockPoolView.landed_before``); before, it answered from
# the hashes as the step began and these streams diverged at such a lookup.
_LANDED_IN_THE_STEP = [
    (1, "chunked", 40, True),
    (1, "chunked", 40, False),
    (1, "swmla", 40, False),
    (5, "sizes", 30, False),
]


@pytest.mark.parametrize(("seed", "layout", "num_blocks", "asynchronous"), _LANDED_IN_THE_STEP)
def test_umbp_probes_the_blocks_a_landed_load_cached_in_the_step(
    seed: int, layout: str, num_blocks: int, asynchronous: bool
) -> None:
    seen = _run(seed, num_blocks=num_blocks, layout=layout, asynchronous=asynchronous)
    assert seen["loads"] > 0


@pytest.mark.parametrize(("seed", "layout", "num_blocks", "asynchronous"), _LANDED_IN_THE_STEP)
def test_the_landed_check_fails_without_the_landed_blocks(
    monkeypatch: pytest.MonkeyPatch, seed: int, layout: str, num_blocks: int, asynchronous: bool
) -> None:
    monkeypatch.setattr(BlockPoolView, "landed_before", lambda self, request_id: None)
    with pytest.raises(AssertionError, match="step"):
        _run(seed, num_blocks=num_blocks, layout=layout, asynchronous=asynchronous)


# Partial load failures beside UMBP (``kv_load_failure_policy`` "recompute"): some of the
# GPU blocks an async load wrote are reported invalid with the output that lands it
# (``invalid_block_ids``), or with the step's output for a synchronous load (load_async
# off); vLLM cuts the request back to the blocks before the first invalid one and, for an
# async load, marks it failed (``failed_recving_kv_req_ids``) and caches that prefix when
# its waiting pass reaches it (``_update_waiting_for_remote_kv``). The adapter leaves such
# a load out of the blocks its pool view enters for UMBP's local-cache probe
# (``_expect_landings``); no stream can tell, see there: vLLM takes ``invalid_block_ids``
# beside one KV cache group alone, and over one full-attention group UMBP's lookup reads
# the local hit vLLM hands it and probes the pool for nothing.
_PARTIAL_FAILURES = [
    (seed, asynchronous, extra)
    for seed in range(4)
    for asynchronous, extra in ((False, {}), (True, {}), (False, {"load_async": False}))
]


@pytest.mark.parametrize(("seed", "asynchronous", "extra"), _PARTIAL_FAILURES)
def test_umbp_with_partial_load_failures_matches_vllm(
    seed: int, asynchronous: bool, extra: dict[str, Any]
) -> None:
    num_blocks = 30 if extra else 40
    seen = _run(seed, num_blocks=num_blocks, asynchronous=asynchronous, fail_share=0.5, **extra)
    assert seen["loads"] > 0
    assert seen["invalid"] > 0
    if seed and not extra:
        # Async loads cut back to a valid prefix, cached by vLLM's waiting pass.
        assert seen["kept"] > 0


def test_the_failures_check_fails_when_the_invalid_blocks_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle = TokenyardScheduler._handle_kv_load_failures

    def without_invalid_blocks(self: Any, failed: Any, invalid: Any, scheduled: Any) -> Any:
        return handle(self, failed, set(), scheduled)

    monkeypatch.setattr(TokenyardScheduler, "_handle_kv_load_failures", without_invalid_blocks)
    with pytest.raises(AssertionError, match="step"):
        _run(1, num_blocks=40, fail_share=0.5)


# One group alone of another kind (a sliding window, chunked local attention), the only
# layouts where a failed load keeps a valid prefix (one group) and UMBP probes the local
# cache (its own coordinator): the core scans no block table of such a pool for an async
# load's invalid blocks (``invalid_block_scan``: ``block_ids`` answers none beside the
# block-hash pool), so vLLM marks the load failed and the adapter does not (the window's
# streams then differ at once; chunked local attention's caching raises, ``InputError``:
# "only 16 computed tokens are not yet cached"); a running request's are refused by name
# (``check_truncatable``, ``ConfigError``). A gap of the core's, kept in view.
@pytest.mark.xfail(
    strict=True,
    raises=(AssertionError, InputError),
    reason="the core scans no table of a lone window's pool",
)
@pytest.mark.parametrize(("seed", "layout"), [(0, "window"), (1, "lonechunked")])
def test_partial_load_failures_beside_a_lone_window_group(seed: int, layout: str) -> None:
    _run(seed, num_blocks=40, layout=layout, asynchronous=True, fail_share=0.5)
