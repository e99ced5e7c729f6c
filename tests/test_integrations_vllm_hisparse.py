"""vLLM 0.33's HiSparse host page tier through the adapter
(``tokenyard.integrations._vllm_hisparse``, the core's ``sched::hisparse``): a HiSparse
``kv_cache_config`` assigned on a built scheduler sizes the core's host page pool, whose
pages gate admission (the whole prompt's, vLLM's full-ISL gate) and growth; a connector's
``has_pending_block_frees`` stalls a request instead of preempting. Side by side with vLLM's
own ``Scheduler`` given vLLM's HiSparse ``KVCacheManager`` over the same config, until the
first request finishes (from there vLLM keeps host pages until the HiSparse connector's
write-back spills land, which needs its worker). Needs vLLM (the bench venv); skipped
elsewhere.
"""

from __future__ import annotations

import random
from typing import Any
from unittest.mock import Mock

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (
    HiSparseConnector,
    HiSparseConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.hisparse.coordinator import get_hisparse_coordinator
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupRole,
    KVCacheGroupSpec,
)
from vllm.v1.request import RequestStatus
from vllm_compare import BLOCK_SIZE, add_both, build_pair, seeded_arrivals, update_both

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler


def hisparse_config(num_blocks: int, host_num_blocks: int) -> KVCacheConfig:
    """vLLM 0.33's HiSparse layout, as its tests build it (``make_hisparse_kv_cache_config``
    in ``tests/v1/core/test_prefix_caching.py``): a host source group, a device indexer, and
    the resident and hot page groups."""
    source = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    page = BLOCK_SIZE * 4
    groups = [
        KVCacheGroupSpec(
            ["source"], source, role=KVCacheGroupRole.HISPARSE_SOURCE, host_resident=True
        ),
        KVCacheGroupSpec(["indexer"], source, role=KVCacheGroupRole.HISPARSE_INDEXER),
        KVCacheGroupSpec(["resident"], HiSparseResidentSpec(block_size=BLOCK_SIZE, page_size=page)),
        KVCacheGroupSpec(
            ["hot"],
            HiSparseHotSpec(block_size=BLOCK_SIZE, page_size=page, blocks_per_request=2),
            enable_kv_transfer=False,
        ),
    ]
    return KVCacheConfig(
        num_blocks=num_blocks,
        hisparse_host_num_blocks=host_num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
    )


def hisparse_manager(
    num_blocks: int, host_num_blocks: int, max_model_len: int, caching: bool = False
) -> KVCacheManager:
    """vLLM's HiSparse ``KVCacheManager`` (prefix caching off unless ``caching``, stats on as
    the engine has them), its coordinator built."""
    manager = KVCacheManager(
        hisparse_config(num_blocks, host_num_blocks),
        max_model_len=max_model_len,
        scheduler_block_size=BLOCK_SIZE,
        hash_block_size=BLOCK_SIZE,
        enable_caching=caching,
        log_stats=True,
    )
    get_hisparse_coordinator(manager)
    return manager


def host_free(scheduler: Any) -> int:
    """Free host blocks: vLLM's HiSparse pool's, or the core's."""
    pool = scheduler._core.hisparse_host_pages if hasattr(scheduler, "_core") else None
    if pool is not None:
        return int(pool[2])
    host = get_hisparse_coordinator(scheduler.kv_cache_manager).get_host_block_pool()
    return int(host.get_num_free_blocks())


def hisparse_pair(
    host_num_blocks: int, caching: bool = False, **options: Any
) -> tuple[Any, Any, Any]:
    """vLLM's scheduler given vLLM's HiSparse manager, and the adapter given the same
    manager (whose config it adopts); prefix caching off on both unless ``caching``."""
    theirs, ours, peer = build_pair(
        num_blocks=400, max_model_len=128, enable_prefix_caching=caching, **options
    )
    for scheduler in (theirs, ours):
        manager = hisparse_manager(400, host_num_blocks, 128, caching)
        scheduler.kv_cache_manager = manager
        scheduler.kv_cache_config = manager.kv_cache_config
    return theirs, ours, peer


def test_a_hisparse_config_assigned_sizes_the_host_pool_and_a_plain_one_removes_it() -> None:
    _, ours, _ = build_pair(num_blocks=64, max_model_len=128)
    assert ours._core.hisparse_host_pages is None
    plain = ours.kv_cache_config
    ours.kv_cache_config = hisparse_config(64, 9)
    # 9 blocks, the null block among them, of the source group's 16 tokens.
    assert ours._core.hisparse_host_pages == (9, 16, 8)
    ours.kv_cache_config = plain
    assert ours._core.hisparse_host_pages is None


def test_vllms_hisparse_layout_at_construction_is_served_with_prefix_caching_on() -> None:
    # vLLM's default; nothing hits without the HiSparse connector's acknowledged
    # write-backs (test_integrations_vllm_hisparse_caching.py compares it with vLLM).
    _, _, peer = build_pair(num_blocks=64, max_model_len=128, enable_prefix_caching=True)
    ours = peer.build(TokenyardScheduler, hisparse_config(64, 9))
    assert ours._prefix_caching
    assert ours._core.hisparse_host_pages == (9, 16, 8)


def test_an_assigned_kv_cache_manager_is_adopted_for_its_config_or_refused() -> None:
    _, ours, peer = build_pair(num_blocks=64, max_model_len=128)
    view = ours.kv_cache_manager
    manager = hisparse_manager(64, 7, 128)
    ours.kv_cache_manager = manager
    # The config is taken; the view of the core's KV stays what the scheduler shows.
    assert ours._core.hisparse_host_pages == (7, 16, 6)
    assert ours.kv_cache_manager is view
    assert ours.kv_cache_config is manager.kv_cache_config
    # The assigned object's block reads show the scheduler's allocations (the core's), as
    # vLLM's scheduler allocates through the manager it was given.
    add_both((ours,), peer.make_request, "a", list(range(20)), 4)
    ours.schedule()
    assert manager.get_block_ids("a") == view.get_block_ids("a") == ([1, 2],)
    assert manager.get_blocks("a").get_block_ids() == ([1, 2],)
    with pytest.raises(ConfigError, match="kv_cache_manager"):
        ours.kv_cache_manager = object()


def test_host_pages_are_refused_once_requests_hold_blocks() -> None:
    _, ours, peer = build_pair(num_blocks=64, max_model_len=128)
    add_both((ours,), peer.make_request, "a", list(range(20)), 4)
    ours.schedule()
    with pytest.raises(ConfigError, match="hold KV blocks"):
        ours.kv_cache_config = hisparse_config(64, 9)


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("host_num_blocks", [6, 9, 12, 20])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_host_pages_gate_the_same_steps_as_vllms_hisparse_manager(
    seed: int, host_num_blocks: int, caching: bool
) -> None:
    # A seeded stream (prompts up to ~100 tokens: up to 7 pages, sharing prefixes) over a
    # host pool that holds one or a few of them (with 6 blocks, a prompt of more than 5
    # pages waits at the head for good, and the queue behind it): every step until the
    # first request finishes schedules and preempts the same requests, with the same free
    # host blocks and the same prefix hits (none with caching on: vLLM's HiSparse manager
    # looks its host group up first, which has published nothing).
    theirs, ours, peer = hisparse_pair(host_num_blocks, caching)
    arrivals = seeded_arrivals(random.Random(seed), tail_max=60, max_tokens=20)
    compared = 0
    for step in range(60):
        for at, *args in arrivals:
            if at == step:
                add_both((theirs, ours), peer.make_request, *args)
        outs = [s.schedule() for s in (theirs, ours)]
        assert dict(outs[1].num_scheduled_tokens) == dict(outs[0].num_scheduled_tokens), step
        hits = [{r.req_id: r.num_computed_tokens for r in o.scheduled_new_reqs} for o in outs]
        assert hits[1] == hits[0], step
        assert outs[1].preempted_req_ids == outs[0].preempted_req_ids, step
        assert host_free(ours) == host_free(theirs), step
        update_both((theirs, ours), outs)
        compared += 1
        if theirs.finished_req_ids:
            break
    assert compared > 3


def test_full_isl_admission_charges_held_pages_only() -> None:
    # Two prompts of 3 and 4 pages on 6 usable host blocks (7 with the null block): the
    # first prefill takes its chunk's pages; the second's whole prompt must fit beside
    # them to be admitted, as vLLM's get_num_blocks_to_allocate gate has it.
    theirs, ours, peer = hisparse_pair(7, max_num_batched_tokens=40)
    add_both((theirs, ours), peer.make_request, "first", list(range(48)), 4)
    add_both((theirs, ours), peer.make_request, "second", list(range(1000, 1064)), 4)
    for _ in range(3):
        outs = [s.schedule() for s in (theirs, ours)]
        assert dict(outs[1].num_scheduled_tokens) == dict(outs[0].num_scheduled_tokens)
        assert host_free(ours) == host_free(theirs)
        assert {r.request_id for r in ours._inflight_prefills} == {
            r.request_id for r in theirs._inflight_prefills
        }
        update_both((theirs, ours), outs)


def _bind_reclaiming_connector(scheduler: Any) -> None:
    """A HiSparse connector inside a MultiConnector (as vLLM's test binds it) whose
    coordinator reports a reclamation pending."""
    connector = object.__new__(HiSparseConnector)
    connector.connector_scheduler = HiSparseConnectorScheduler(async_speculative=False)
    coordinator = get_hisparse_coordinator(hisparse_manager(16, 16, 128))
    coordinator.has_pending_reclamation = Mock(return_value=True)  # type: ignore[method-assign]
    connector.connector_scheduler.bind_coordinator(coordinator)
    composite = object.__new__(MultiConnector)
    composite._connectors = (connector,)
    scheduler.connector = composite


@pytest.mark.parametrize("pending", [True, False])
def test_a_pending_reclamation_stalls_instead_of_preempting_as_in_vllm(pending: bool) -> None:
    # Host pages for two prompts and nothing more: the first decode that needs a new page
    # finds none. vLLM asks the connector's has_pending_block_frees first: with a
    # reclamation pending, nothing is scheduled and nobody is preempted; without one, the
    # last running request is preempted.
    theirs, ours, peer = hisparse_pair(5, max_num_batched_tokens=128)
    add_both((theirs, ours), peer.make_request, "a", list(range(32)), 20)
    add_both((theirs, ours), peer.make_request, "b", list(range(1000, 1032)), 20)
    outs = [s.schedule() for s in (theirs, ours)]
    update_both((theirs, ours), outs)
    if pending:
        for scheduler in (theirs, ours):
            _bind_reclaiming_connector(scheduler)
            scheduler.connector.build_connector_meta = Mock(return_value=None)
    outs = [s.schedule() for s in (theirs, ours)]
    assert dict(outs[1].num_scheduled_tokens) == dict(outs[0].num_scheduled_tokens)
    assert outs[1].preempted_req_ids == outs[0].preempted_req_ids
    assert bool(outs[0].preempted_req_ids) != pending
    statuses = [[r.status for r in s.running] for s in (theirs, ours)]
    assert statuses[0] == statuses[1]
    if pending:
        assert statuses[0] == [RequestStatus.RUNNING] * 2


def test_a_hisparse_consumer_with_batches_in_flight_defers_its_async_loads(
    tmp_path: Any,
) -> None:
    # vLLM 0.33's Scheduler.__init__: defer_async_loads = defer_block_free (a KV consumer
    # with several batches in flight) and a HiSparse host pool. A config with the pool and
    # groups the core serves turns both on, at construction or assigned later.
    from dataclasses import replace
    from unittest.mock import PropertyMock, patch

    from vllm.config import KVTransferConfig, VllmConfig
    from vllm_compare import VllmSchedulerPeer

    from tokenyard.integrations.vllm import AsyncTokenyardScheduler

    peer = VllmSchedulerPeer(
        num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256
    )
    peer.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="ExampleConnector",
        kv_role="kv_consumer",
        kv_connector_extra_config={"shared_storage_path": str(tmp_path)},
    )
    plain = peer.scheduler.kv_cache_config
    built = {}
    with patch.object(
        VllmConfig, "max_concurrent_batches", new_callable=PropertyMock, return_value=2
    ):
        for host in (None, 32):
            built[host] = AsyncTokenyardScheduler(
                vllm_config=peer.vllm_config,
                kv_cache_config=replace(plain, hisparse_host_num_blocks=host),
                structured_output_manager=Mock(),
                block_size=BLOCK_SIZE,
            )
    assert built[None].defer_block_free
    assert not built[None].defer_async_loads
    assert built[32].defer_block_free
    assert built[32].defer_async_loads
    assert built[32]._core.hisparse_host_pages == (32, BLOCK_SIZE, 31)
    # HiSparse's documented path assigns the config on a built scheduler: the gate follows.
    built[None].kv_cache_config = replace(plain, hisparse_host_num_blocks=32)
    assert built[None].defer_async_loads
    built[None].kv_cache_config = plain
    assert not built[None].defer_async_loads
    for scheduler in built.values():
        scheduler.shutdown()
