"""vLLM 0.33's HiSparse layout with prefix caching on (vLLM's default) through the adapter,
side by side with vLLM's own ``Scheduler`` and ``AsyncScheduler`` (their
``HiSparseCoordinator`` bound as ``HiSparseConnector.bind_kv_cache_manager`` binds it), step
by step: scheduled tokens, preemptions, every group's block ids, KV usage, free host
blocks, and the scheduler stats (running, waiting, prefix cache requests, queries, hits).
Shared prefixes arrive before and after their first holders finish; the indexer caches its
blocks (freed ones go to the free queue's tail) and nothing hits, as in vLLM: its host
source group serves only pages its coordinator published, and a page is published only on
the HiSparse connector's acknowledged write-backs (``update_spills``), which the
connector's own scheduler side plans. Worker acknowledgements
(``HiSparseConnectorWorkerMetadata``) are synthesized at random steps: without that
connector both schedulers pass them by. The connector itself is refused by name with
caching on (served with it off: ``test_integrations_vllm_hisparse_step.py``). Needs vLLM
(the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from test_integrations_vllm_hisparse_groups import host_free, layout
from test_integrations_vllm_hybrid_connectors import CONNECTOR
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (
    HiSparseConnectorWorkerMetadata,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.hisparse.coordinator import get_hisparse_coordinator
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus
from vllm_compare import BLOCK_SIZE, block_digest, runner_output, sampling, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

OPTIONS = {"max_model_len": 256, "max_num_seqs": 6, "max_num_batched_tokens": 64}


def _peer(num_blocks: int, **options: Any) -> VllmSchedulerPeer:
    options = {"enable_prefix_caching": True, **OPTIONS, **options}
    return VllmSchedulerPeer(num_blocks=num_blocks, block_size=BLOCK_SIZE, **options)


def _arrivals(seed: int) -> list[tuple[int, str, list[int], int]]:
    # Twelve requests over 40 steps, most sharing 16 to 64 tokens of one prefix: later ones
    # arrive after earlier holders of their prefix finished (their indexer blocks cached).
    return seeded_arrivals(
        random.Random(seed),
        tail_max=90,
        max_tokens=24,
        count=12,
        prefix_tokens=64,
        shared=(0, 16, 48, 64, 64),
        arrive_by=40,
    )


def _acks(rng: random.Random) -> KVConnectorOutput | None:
    """A worker's acknowledgements of transfers 0-19 and host copies, or nothing (half the
    steps)."""
    if rng.random() < 0.5:
        return None
    ids = rng.sample(range(20), rng.randrange(1, 4))
    meta = HiSparseConnectorWorkerMetadata(
        enqueued_transfer_counts=dict.fromkeys(ids, 1),
        completed_transfer_counts=dict.fromkeys(rng.sample(ids, rng.randrange(len(ids) + 1)), 1),
        completed_host_copy_dst_ids=tuple(rng.sample(range(1, 8), rng.randrange(2))),
    )
    return KVConnectorOutput(kv_connector_worker_meta=meta)


def _cached_indexer_blocks(scheduler: Any) -> int:
    return len(scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block)


def _check_step(theirs: Any, ours: Any, outs: list[Any], step: int) -> None:
    assert block_digest(outs[1]) == block_digest(outs[0]), f"step {step}"
    assert host_free(ours) == host_free(theirs), f"step {step}"


def _stats(outputs: dict[int, Any]) -> Any:
    """A step's scheduler stats as ``update_from_output`` returns them: running and waiting
    requests and the prefix cache's requests, queries and hits (vLLM's counters)."""
    for engine_outputs in outputs.values():
        stats = engine_outputs.scheduler_stats
        if stats is not None:
            p = stats.prefix_cache_stats
            return stats.num_running_reqs, stats.num_waiting_reqs, (p.requests, p.queries, p.hits)
    return None


def _check_state(theirs: Any, ours: Any, step: int) -> None:
    assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
    for request_id in ours.requests:
        table = ours.kv_cache_manager.get_block_ids(request_id)
        assert table == theirs.kv_cache_manager.get_block_ids(request_id), f"step {step}"


def _stream(theirs: Any, ours: Any, peer: Any, seed: int, loads: bool = False) -> dict[str, int]:
    """Runs ``_arrivals(seed)`` on both until vLLM drains, with acknowledgements at random
    steps (and, with ``loads``, the seeded connector's loads landing a step after they
    start). Returns vLLM's preemptions, hits, cached indexer blocks at most, acks sent."""
    rng = random.Random(1000 + seed)
    arrivals = _arrivals(seed)
    seen = {"preempted": 0, "hits": 0, "cached": 0, "acks": 0, "queries": 0}
    loading: set[str] = set()
    for step in range(600):
        for at, request_id, prompt, max_tokens in arrivals:
            if at == step:
                for scheduler in (theirs, ours):
                    scheduler.add_request(peer.make_request(request_id, prompt, max_tokens))
        outs = [s.schedule() for s in (theirs, ours)]
        _check_step(theirs, ours, outs, step)
        seen["preempted"] += len(outs[0].preempted_req_ids)
        seen["hits"] += sum(r.num_computed_tokens > 0 for r in outs[0].scheduled_new_reqs)
        now_loading = {
            r.request_id
            for r in theirs.requests.values()
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        }
        landing = loading & now_loading
        acks = _acks(rng)
        if loads:
            acks = acks or KVConnectorOutput()
            acks.finished_recving = set(landing)
        seen["acks"] += acks is not None
        stats = []
        for scheduler, out in zip((theirs, ours), outs, strict=True):
            output = runner_output(scheduler, out)
            output.kv_connector_output = acks
            stats.append(_stats(scheduler.update_from_output(out, output)))
        assert stats[1] == stats[0], f"step {step}"
        seen["queries"] += stats[0][2][1] if stats[0] else 0
        loading = now_loading - landing
        seen["cached"] = max(seen["cached"], _cached_indexer_blocks(theirs))
        _check_state(theirs, ours, step)
        if step > 40 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return seen
    raise AssertionError("the stream did not drain")


def _pair(num_blocks: int, host_num_blocks: int, resident_groups: int) -> tuple[Any, Any, Any]:
    config = layout(num_blocks, host_num_blocks, num_resident_groups=resident_groups)
    peer = _peer(num_blocks)
    theirs = peer.build(Scheduler, config)
    get_hisparse_coordinator(theirs.kv_cache_manager)
    return theirs, peer.build(TokenyardScheduler, config), peer


@pytest.mark.parametrize(
    ("num_blocks", "host_num_blocks", "resident_groups"),
    [(80, 40, 1), (48, 60, 1), (120, 24, 1), (100, 40, 3)],
)
@pytest.mark.parametrize("seed", range(8))
def test_caching_streams_agree_with_vllms_scheduler(
    seed: int, num_blocks: int, host_num_blocks: int, resident_groups: int
) -> None:
    theirs, ours, peer = _pair(num_blocks, host_num_blocks, resident_groups)
    seen = _stream(theirs, ours, peer, seed)
    # vLLM's premise: the indexer caches, yet no request hits (no page was published);
    # lookups are counted all the same.
    assert seen["hits"] == 0
    assert seen["cached"] > 0
    assert seen["acks"] > 0
    assert seen["queries"] > 0


@pytest.mark.parametrize(("num_blocks", "host_num_blocks"), [(160, 80), (70, 60), (160, 30)])
@pytest.mark.parametrize("seed", range(2))
def test_caching_with_connector_loads_agrees_with_vllm(
    seed: int, num_blocks: int, host_num_blocks: int
) -> None:
    # A seeded connector (not HiSparse's) loads part of each prompt: vLLM records the host
    # import (record_pending_host_import), but only HiSparse's connector completes it into
    # published pages (finish_host_import).
    config = layout(num_blocks, host_num_blocks)
    peer = _peer(num_blocks)
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector=CONNECTOR,
        kv_role="kv_both",
        kv_connector_extra_config={"seed": seed, "loads_every_group": False},
    )
    theirs = peer.build(Scheduler, config)
    get_hisparse_coordinator(theirs.kv_cache_manager)
    ours = peer.build(TokenyardScheduler, config)
    seen = _stream(theirs, ours, peer, seed, loads=True)
    # Loaded tokens count as computed at admission: some admissions load.
    assert seen["hits"] > 0


@pytest.mark.parametrize(("num_blocks", "host_num_blocks"), [(80, 40), (48, 60), (120, 24)])
@pytest.mark.parametrize("seed", range(4))
def test_caching_under_async_scheduling_agrees_with_vllms_async_scheduler(
    seed: int, num_blocks: int, host_num_blocks: int
) -> None:
    peer = _peer(num_blocks)
    peer.vllm_config.scheduler_config.async_scheduling = True
    config = layout(num_blocks, host_num_blocks)
    theirs = peer.build(AsyncScheduler, config)
    get_hisparse_coordinator(theirs.kv_cache_manager)
    ours = peer.build(AsyncTokenyardScheduler, config)
    rng = random.Random(2000 + seed)
    arrivals = _arrivals(seed)
    pending: list[tuple[Any, Any, set[str], set[str]]] = []
    hits = 0
    for step in range(800):
        for at, request_id, prompt, max_tokens in arrivals:
            if at == step:
                for scheduler in (theirs, ours):
                    scheduler.add_request(peer.make_request(request_id, prompt, max_tokens))
        outs = [theirs.schedule(), ours.schedule()]
        _check_step(theirs, ours, outs, step)
        hits += sum(r.num_computed_tokens > 0 for r in outs[0].scheduled_new_reqs)
        pending.append((outs[0], outs[1], sampling(theirs, outs[0]), sampling(ours, outs[1])))
        if len(pending) == 2 or not outs[0].num_scheduled_tokens:
            old_v, old_t, sampling_v, sampling_t = pending.pop(0)
            assert sampling_t == sampling_v, f"step {step}"
            acks = _acks(rng)
            stats = []
            for scheduler, out, sampled in ((theirs, old_v, sampling_v), (ours, old_t, sampling_t)):
                output = runner_output(scheduler, out, sampled)
                output.kv_connector_output = acks
                stats.append(_stats(scheduler.update_from_output(out, output)))
            assert stats[1] == stats[0], f"step {step}"
        _check_state(theirs, ours, step)
        if step > 40 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            assert hits == 0
            return
    raise AssertionError("the stream did not drain")


HISPARSE = {"kv_connector": "HiSparseConnector", "kv_role": "kv_both"}


@pytest.mark.parametrize("inside_multi", [False, True])
def test_the_hisparse_connector_is_refused_by_name_with_caching_on(inside_multi: bool) -> None:
    # Its scheduler side plans write-backs every step (with references on device and host
    # blocks), so vLLM's block ids change with it; the core runs it with prefix caching
    # off (test_integrations_vllm_hisparse_step.py), not with it on (hits adopting GPU
    # copies of published pages), nor inside a MultiConnector.
    peer = _peer(80)
    extra = {"host_pool_gib": 1}
    if inside_multi:
        child = {**HISPARSE, "kv_connector_extra_config": extra}
        config = KVTransferConfig(
            kv_connector="MultiConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"connectors": [child]},
        )
    else:
        config = KVTransferConfig(**HISPARSE, kv_connector_extra_config=extra)
    peer.vllm_config.kv_transfer_config = config
    with pytest.raises(ConfigError, match="HiSparseConnector") as err:
        peer.build(TokenyardScheduler, layout(80, 40))
    if inside_multi:
        assert err.value.field == "kv_transfer_config.kv_connector"
        assert err.value.value == config.kv_connector
    else:
        assert err.value.field == "cache_config.enable_prefix_caching"
