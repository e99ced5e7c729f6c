"""vLLM 0.33's HiSparse layout given to the adapter at construction: the source group is the
core's host page pool (real host block ids, vLLM's order), the indexer a full-attention
group, the resident and hot pages the core's ``HiSparseResidentSpec`` and ``HiSparseHotSpec``
groups (``sched::hisparse_groups``). Side by side with vLLM's own ``Scheduler`` built on the
same config (its ``HiSparseCoordinator`` bound as the HiSparse connector binds it), step by
step: scheduled tokens, preemptions, every group's block ids in the outputs and tables,
KV usage and free host blocks. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from test_integrations_vllm_hybrid_connectors import CONNECTOR
from vllm.config import KVTransferConfig
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.hisparse.coordinator import get_hisparse_coordinator
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupRole,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus
from vllm_compare import (
    BLOCK_SIZE,
    block_digest,
    runner_output,
    sampling,
    seeded_arrivals,
    update_both,
)
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations._vllm_translate import settings
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler
from tokenyard.kv import FullAttentionSpec as CoreFull
from tokenyard.kv import HiSparseHotSpec as CoreHot
from tokenyard.kv import HiSparseResidentSpec as CoreResident


def layout(
    num_blocks: int, host_num_blocks: int, *, num_resident_groups: int = 1, hot_blocks: int = 2
) -> KVCacheConfig:
    """vLLM 0.33's HiSparse layout as its tests build it (``make_hisparse_kv_cache_config``
    in ``tests/v1/core/test_prefix_caching.py``): host source, device indexer, then resident
    and hot page groups (``num_resident_groups`` pairs)."""
    source = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    page = BLOCK_SIZE * 4
    groups = [
        KVCacheGroupSpec(
            ["source"], source, role=KVCacheGroupRole.HISPARSE_SOURCE, host_resident=True
        ),
        KVCacheGroupSpec(["indexer"], source, role=KVCacheGroupRole.HISPARSE_INDEXER),
    ]
    for i in range(num_resident_groups):
        groups.append(
            KVCacheGroupSpec(
                [f"resident_{i}"], HiSparseResidentSpec(block_size=BLOCK_SIZE, page_size=page)
            )
        )
        groups.append(
            KVCacheGroupSpec(
                [f"hot_{i}"],
                HiSparseHotSpec(
                    block_size=BLOCK_SIZE, page_size=page, blocks_per_request=hot_blocks
                ),
                enable_kv_transfer=False,
            )
        )
    return KVCacheConfig(
        num_blocks=num_blocks,
        hisparse_host_num_blocks=host_num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
    )


def pair(config: KVCacheConfig, **options: Any) -> tuple[Any, Any, VllmSchedulerPeer]:
    """vLLM's scheduler and the adapter built on ``config`` (prefix caching off); vLLM's
    HiSparse coordinator bound as ``HiSparseConnector.bind_kv_cache_manager`` binds it."""
    options = {"max_model_len": 256, "max_num_seqs": 4, "max_num_batched_tokens": 64, **options}
    peer = VllmSchedulerPeer(
        num_blocks=config.num_blocks,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=False,
        **options,
    )
    theirs = peer.build(Scheduler, config)
    get_hisparse_coordinator(theirs.kv_cache_manager)
    ours = peer.build(TokenyardScheduler, config)
    return theirs, ours, peer


def host_free(scheduler: Any) -> int:
    if hasattr(scheduler, "_core"):
        return int(scheduler._core.hisparse_host_pages[2])
    host = get_hisparse_coordinator(scheduler.kv_cache_manager).get_host_block_pool()
    return int(host.get_num_free_blocks())


def run_stream(
    theirs: Any, ours: Any, peer: Any, arrivals: list[Any], steps: int = 400
) -> tuple[int, int, int]:
    """Runs ``arrivals`` on both until vLLM drains; returns the steps compared, vLLM's
    preemptions and the fewest free host blocks seen. Fails at the first step whose
    digest, tables, KV usage or free host blocks differ."""
    both = (theirs, ours)
    preempted, fewest_free = 0, host_free(theirs)
    for step in range(steps):
        for at, request_id, prompt, max_tokens in arrivals:
            if at == step:
                for scheduler in both:
                    scheduler.add_request(peer.make_request(request_id, prompt, max_tokens))
        outs = [s.schedule() for s in both]
        assert block_digest(outs[1]) == block_digest(outs[0]), f"step {step}"
        assert host_free(ours) == host_free(theirs), f"step {step}"
        preempted += len(outs[0].preempted_req_ids)
        fewest_free = min(fewest_free, host_free(theirs))
        update_both(both, outs)
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        for request_id in ours.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == theirs.kv_cache_manager.get_block_ids(request_id), f"step {step}"
            # The coordinator's managers, by vLLM's group ids (the host one included).
            blocks = ours.kv_cache_manager.get_blocks(request_id).get_block_ids()
            assert blocks == table, f"step {step}"
        if step > 6 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return step, preempted, fewest_free
    raise AssertionError("the stream did not drain")


def test_the_layout_becomes_a_host_pool_and_three_device_groups() -> None:
    _, ours, peer = pair(layout(64, 9))
    groups = settings(peer.vllm_config, layout(64, 9), BLOCK_SIZE).kv_groups
    assert [type(g) for g in groups] == [CoreFull, CoreResident, CoreHot]
    # vLLM's max_admission_blocks_per_request: ceil(min(64 in flight, 256) / 16).
    assert groups[1].max_admission_blocks == 4
    assert groups[2].blocks_per_request == 2
    assert ours._core.hisparse_host_pages == (9, 16, 8)


def test_the_outputs_carry_the_host_blocks_at_the_source_groups_place() -> None:
    theirs, ours, peer = pair(layout(64, 9))
    for scheduler in (theirs, ours):
        scheduler.add_request(peer.make_request("a", list(range(40)), 4))
    outs = [s.schedule() for s in (theirs, ours)]
    # 40 tokens: 3 pages on host (blocks 1-3), the indexer's and the resident group's 3
    # device blocks each, no hot region.
    assert outs[1].scheduled_new_reqs[0].block_ids == outs[0].scheduled_new_reqs[0].block_ids
    assert outs[1].scheduled_new_reqs[0].block_ids == ([1, 2, 3], [1, 2, 3], [4, 5, 6], [])


def test_prefix_caching_beside_the_device_groups_is_served() -> None:
    # vLLM's default (VllmSchedulerPeer's too); the streams against vLLM with it are in
    # test_integrations_vllm_hisparse_caching.py.
    peer = VllmSchedulerPeer(
        num_blocks=64,
        block_size=BLOCK_SIZE,
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=64,
    )
    ours = peer.build(TokenyardScheduler, layout(64, 9))
    assert ours._core.hisparse_host_pages == (9, 16, 8)


def test_device_groups_without_a_host_pool_are_refused() -> None:
    config = layout(64, 9)
    config.hisparse_host_num_blocks = None
    peer = VllmSchedulerPeer(
        num_blocks=64,
        block_size=BLOCK_SIZE,
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
    )
    with pytest.raises(ConfigError, match="host pool") as err:
        peer.build(TokenyardScheduler, config)
    assert err.value.field == "kv_cache_groups[2].kv_cache_spec"


def test_zeroing_beside_the_layout_is_refused() -> None:
    # A second device attention group of another precision makes vLLM zero new blocks
    # (KVCacheConfig.needs_kv_cache_zeroing): not modelled beside HiSparse.
    config = layout(64, 9)
    half = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16
    )
    config.kv_cache_groups.insert(2, KVCacheGroupSpec(["half"], half))
    assert config.needs_kv_cache_zeroing
    peer = VllmSchedulerPeer(
        num_blocks=64,
        block_size=BLOCK_SIZE,
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
    )
    with pytest.raises(ConfigError, match="zeroing") as err:
        peer.build(TokenyardScheduler, config)
    assert err.value.field == "kv_cache_config.needs_kv_cache_zeroing"


def test_a_built_layout_keeps_its_host_pool() -> None:
    # Its outputs carry the source group's blocks: a config without the pool is refused.
    _, ours, _ = pair(layout(64, 9))
    plain = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[])
    with pytest.raises(ConfigError, match="keeps its host pool") as err:
        ours.kv_cache_config = plain
    assert err.value.field == "kv_cache_config"
    assert ours._core.hisparse_host_pages == (9, 16, 8)


@pytest.mark.parametrize(
    ("num_blocks", "host_num_blocks", "resident_groups", "preempts", "host_runs_out"),
    [
        (80, 40, 1, False, True),
        (48, 60, 1, True, False),
        (120, 24, 1, True, True),
        (100, 40, 3, True, False),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_streams_agree_with_vllms_scheduler_step_by_step(
    seed: int,
    num_blocks: int,
    host_num_blocks: int,
    resident_groups: int,
    preempts: bool,
    host_runs_out: bool,
) -> None:
    # Ten requests of up to ~170 tokens, each holding 1 + 2 x resident_groups device
    # tables: a device pool tight enough to preempt (48, and 100 with three resident
    # groups), a host pool tight enough to hold admissions back and preempt (24 and 40).
    config = layout(num_blocks, host_num_blocks, num_resident_groups=resident_groups)
    theirs, ours, peer = pair(config, max_num_seqs=6, max_num_batched_tokens=64)
    arrivals = seeded_arrivals(random.Random(seed), tail_max=120, max_tokens=40, count=10)
    steps, preempted, fewest_free = run_stream(theirs, ours, peer, arrivals)
    assert steps > 40
    assert (preempted > 0) == preempts
    assert (fewest_free <= 5) == host_runs_out


def _loads_pair(config: KVCacheConfig, seed: int) -> tuple[Any, Any, VllmSchedulerPeer]:
    """``pair`` with the seeded connector of ``test_integrations_vllm_hybrid_connectors``
    bound (it offers part of each request's tokens, loading them asynchronously or not)."""
    peer = VllmSchedulerPeer(
        num_blocks=config.num_blocks,
        block_size=BLOCK_SIZE,
        max_model_len=256,
        max_num_seqs=6,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
    )
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector=CONNECTOR,
        kv_role="kv_both",
        kv_connector_extra_config={"seed": seed, "loads_every_group": False},
    )
    theirs = peer.build(Scheduler, config)
    get_hisparse_coordinator(theirs.kv_cache_manager)
    return theirs, peer.build(TokenyardScheduler, config), peer


def _loading(scheduler: Any) -> set[str]:
    return {
        r.request_id
        for r in scheduler.requests.values()
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    }


@pytest.mark.parametrize(("num_blocks", "host_num_blocks"), [(160, 80), (70, 60), (160, 30)])
@pytest.mark.parametrize("seed", range(4))
def test_connector_loads_into_the_device_groups_agree_with_vllm(
    seed: int, num_blocks: int, host_num_blocks: int
) -> None:
    # A loaded prefix stays on host in the resident group but its last page, and the
    # request takes its hot region (2 blocks): every step's block ids per group, loads in
    # flight, usage and free host blocks as vLLM's. Loads land the step after they start.
    theirs, ours, peer = _loads_pair(layout(num_blocks, host_num_blocks), seed)
    pair = (theirs, ours)
    arrivals = seeded_arrivals(
        random.Random(seed), count=10, tail_max=100, max_tokens=12, lowest_token=1
    )
    loads, hot_regions = 0, 0
    loading: set[str] = set()
    for step in range(400):
        for at, request_id, prompt, max_tokens in arrivals:
            if at == step:
                for scheduler in pair:
                    scheduler.add_request(peer.make_request(request_id, prompt, max_tokens))
        outs = [s.schedule() for s in pair]
        assert block_digest(outs[1]) == block_digest(outs[0]), f"step {step}"
        assert host_free(ours) == host_free(theirs), f"step {step}"
        now_loading = [_loading(s) for s in pair]
        assert now_loading[1] == now_loading[0], f"step {step}"
        loads += len(now_loading[0] - loading)
        hot_regions += sum(bool(r.block_ids[3]) for r in outs[0].scheduled_new_reqs)
        landing = loading & now_loading[0]
        for scheduler, out in zip(pair, outs, strict=True):
            output = runner_output(scheduler, out)
            output.kv_connector_output = KVConnectorOutput(finished_recving=set(landing))
            scheduler.update_from_output(out, output)
        loading = now_loading[0] - landing
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        for request_id in theirs.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == theirs.kv_cache_manager.get_block_ids(request_id), f"step {step}"
        if step > 12 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            break
    else:
        raise AssertionError("the stream did not drain")
    assert loads > 0
    assert hot_regions > 0


@pytest.mark.parametrize(("num_blocks", "host_num_blocks"), [(80, 40), (48, 60), (120, 24)])
@pytest.mark.parametrize("seed", range(2))
def test_async_scheduling_agrees_with_vllms_async_scheduler(
    seed: int, num_blocks: int, host_num_blocks: int
) -> None:
    # Two batches in flight: vLLM's max_in_flight_tokens doubles (the resident admission
    # cap with it, 8 blocks here), and each step lands one step later.
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        max_model_len=256,
        max_num_seqs=6,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
    )
    peer.vllm_config.scheduler_config.async_scheduling = True
    config = layout(num_blocks, host_num_blocks)
    theirs = peer.build(AsyncScheduler, config)
    get_hisparse_coordinator(theirs.kv_cache_manager)
    ours = peer.build(AsyncTokenyardScheduler, config)
    arrivals = seeded_arrivals(random.Random(seed), tail_max=120, max_tokens=40, count=10)
    pending: list[tuple[Any, Any, set[str], set[str]]] = []
    for step in range(600):
        for at, request_id, prompt, max_tokens in arrivals:
            if at == step:
                for scheduler in (theirs, ours):
                    scheduler.add_request(peer.make_request(request_id, prompt, max_tokens))
        out_v, out_t = theirs.schedule(), ours.schedule()
        assert block_digest(out_t) == block_digest(out_v), f"step {step}"
        assert host_free(ours) == host_free(theirs), f"step {step}"
        pending.append((out_v, out_t, sampling(theirs, out_v), sampling(ours, out_t)))
        if len(pending) == 2 or not out_v.num_scheduled_tokens:
            old_v, old_t, sampling_v, sampling_t = pending.pop(0)
            assert sampling_t == sampling_v, f"step {step}"
            theirs.update_from_output(old_v, runner_output(theirs, old_v, sampling_v))
            ours.update_from_output(old_t, runner_output(ours, old_t, sampling_t))
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        for request_id in ours.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == theirs.kv_cache_manager.get_block_ids(request_id), f"step {step}"
        if step > 12 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return
    raise AssertionError("the stream did not drain")
