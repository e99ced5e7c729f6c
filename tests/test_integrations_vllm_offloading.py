"""tokenyard.integrations.vllm with vLLM 0.33's CPU offloading connector
(``OffloadingConnector`` with ``CPUOffloadingSpec``), against vLLM's own ``Scheduler`` on
the same seeded streams; and the connectors the adapter refuses because their scheduler
side keeps and changes vLLM's own GPU ``BlockPool`` or ``KVCacheManager`` object.

vLLM's ``Scheduler.__init__`` ends with ``connector.bind_kv_cache_manager(kv_cache_manager)``
(``v1/core/sched/scheduler.py``); the adapter binds its manager view there too
(``_vllm_connector_binding``). The worker side is synthesized as vLLM's
``OffloadingConnectorWorker`` reports (``offloading/worker.py``: every job of a step's
metadata completes, ``OffloadingWorkerMetadata.completed_jobs``; an asynchronous load's
request comes back in ``finished_recving``; stores never report ``finished_sending``).
Every step is compared: scheduled tokens and block ids, the connector metadata (its load and
store jobs, sync flags, source and destination blocks, and the jobs to flush), the requests
waiting for loads, KV usage and block tables. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.config import KVEventsConfig, KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus
from vllm_compare import BLOCK_SIZE, block_digest, runner_output, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler


def _kv_cache_config(num_blocks: int) -> KVCacheConfig:
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[
            KVCacheTensor(
                size=spec.page_size_bytes * num_blocks,
                layers=["l0"],
                layer_stride=spec.page_size_bytes * num_blocks,
                block_stride=spec.page_size_bytes,
            )
        ],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)],
    )


def _peer(transfer: KVTransferConfig, num_blocks: int) -> VllmSchedulerPeer:
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512
    )
    peer.vllm_config.kv_transfer_config = transfer
    # The offloading connector's events beside the scheduler's (vLLM's own tests' setting).
    peer.vllm_config.kv_events_config = KVEventsConfig(
        enable_kv_cache_events=True, publisher="null"
    )
    return peer


def _offloading(cpu_chunks: int) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "cpu_bytes_to_use": cpu_chunks * 4096,
            "offload_prompt_only": False,
        },
    )


def _jobs(jobs: dict[int, Any]) -> dict[int, Any]:
    return {
        job_id: (job.req_id, job.sync, repr(job.src_spec), repr(job.dst_spec))
        for job_id, job in jobs.items()
    }


def _meta(out: Any) -> tuple[Any, ...]:
    meta = out.kv_connector_metadata
    return _jobs(meta.load_jobs), _jobs(meta.store_jobs), meta.jobs_to_flush


def _loading(scheduler: Any) -> set[str]:
    return {
        r.request_id
        for r in scheduler.requests.values()
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    }


def _waves(seed: int) -> list[tuple[int, str, list[int], int]]:
    """Three seeded waves of requests: a second with other prompts pushes the first's blocks
    out of a small GPU pool, and a third asks the first's prompts again (from the CPU)."""
    waves = []
    for wave, (rng_seed, start) in enumerate(((seed, 0), (seed + 1000, 60), (seed, 120))):
        waves += [
            (start + at, f"{request_id}w{wave}", prompt, max_tokens)
            for at, request_id, prompt, max_tokens in seeded_arrivals(
                random.Random(rng_seed),
                count=8,
                prefix_tokens=160,
                shared=(0, 16, 48, 100, 160),
                tail_max=100,
                arrive_by=30,
                max_tokens=12,
                lowest_token=1,
                max_prompt=300,
            )
        ]
    return waves


def _run(seed: int, *, num_blocks: int, cpu_chunks: int) -> dict[str, int]:
    """A seeded stream on both schedulers, every step compared (see the module doc)."""
    peer = _peer(_offloading(cpu_chunks), num_blocks)
    config = _kv_cache_config(num_blocks)
    pair = [peer.build(cls, config) for cls in (Scheduler, TokenyardScheduler)]
    assert pair[1].connector._kv_cache_manager is pair[1].kv_cache_manager
    arrivals = _waves(seed)
    seen = {"loads": 0, "stores": 0, "sync_loads": 0, "preemptions": 0}
    for step in range(600):
        for at, *args in arrivals:
            if at == step:
                for scheduler in pair:
                    scheduler.add_request(peer.make_request(*args))
        outs = [scheduler.schedule() for scheduler in pair]
        assert block_digest(outs[1]) == block_digest(outs[0]), f"step {step}"
        metas = [_meta(out) for out in outs]
        assert metas[1] == metas[0], f"step {step}"
        assert _loading(pair[1]) == _loading(pair[0]), f"step {step}"
        loads, stores, _ = metas[0]
        seen["loads"] += len(loads)
        seen["sync_loads"] += sum(job[1] for job in loads.values())
        seen["stores"] += len(stores)
        seen["preemptions"] += len(outs[0].preempted_req_ids)
        for scheduler, out in zip(pair, outs, strict=True):
            meta = out.kv_connector_metadata
            done = OffloadingWorkerMetadata()
            for job_id in (*meta.load_jobs, *meta.store_jobs):
                done.mark_completed(job_id)
            landed = {job.req_id for job in meta.load_jobs.values() if not job.sync}
            output = runner_output(scheduler, out)
            output.kv_connector_output = KVConnectorOutput(
                finished_recving=landed, kv_connector_worker_meta=done
            )
            scheduler.update_from_output(out, output)
        ours, theirs = pair[1], pair[0]
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage())
        for request_id in theirs.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == theirs.kv_cache_manager.get_block_ids(request_id), step
        if step > 150 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return seen
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize("seed", range(8))
def test_cpu_offloading_matches_vllm(seed: int) -> None:
    seen = _run(seed, num_blocks=160, cpu_chunks=400)
    assert seen["stores"] > 0


# A small GPU pool evicts the first wave's prompts; the third wave loads them from the CPU.
@pytest.mark.parametrize("seed", range(6))
def test_cpu_offloading_under_memory_pressure_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=40, cpu_chunks=400)["loads"] > 0


# A small CPU pool too: the CPU side evicts (LRU) what the third wave would have loaded.
@pytest.mark.parametrize("seed", range(4))
def test_small_cpu_pool_matches_vllm(seed: int) -> None:
    _run(seed, num_blocks=40, cpu_chunks=24)


class _PoolKeeper(KVConnectorBase_V1):
    """A connector whose scheduler side keeps vLLM's GPU block pool (as
    ``SimpleCPUOffloadConnector`` and the Mooncake store connector do)."""

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self.pool = gpu_block_pool

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, n: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        return None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


class _ManagerKeeper(_PoolKeeper):
    """One that builds on vLLM's manager object (as UMBP's does)."""

    bind_gpu_block_pool = KVConnectorBase_V1.bind_gpu_block_pool

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        self.manager = kv_cache_manager


for _cls in (_PoolKeeper, _ManagerKeeper):
    _name = f"TokenyardTest{_cls.__name__}"
    if _name not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(_name, __name__, _cls.__name__)


def _build(transfer: KVTransferConfig, cls: type = TokenyardScheduler) -> Any:
    return _peer(transfer, 64).build(cls, _kv_cache_config(64))


@pytest.mark.parametrize(
    ("name", "method"),
    [("_PoolKeeper", "bind_gpu_block_pool"), ("_ManagerKeeper", "bind_kv_cache_manager")],
)
def test_connectors_keeping_vllms_pool_are_refused_by_name(name: str, method: str) -> None:
    transfer = KVTransferConfig(kv_connector=f"TokenyardTest{name}", kv_role="kv_both")
    # vLLM's own scheduler binds its BlockPool into them.
    assert _build(transfer, Scheduler).connector is not None
    with pytest.raises(ConfigError, match=f"{name} is not served.*overrides {method}") as e:
        _build(transfer)
    assert e.value.field == "kv_transfer_config.kv_connector"
    assert e.value.value == name


def test_a_pool_keeper_inside_a_multi_connector_is_refused_by_name() -> None:
    transfer = KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "connectors": [
                {
                    "kv_connector": "OffloadingConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20},
                },
                {"kv_connector": "TokenyardTest_PoolKeeper", "kv_role": "kv_both"},
            ]
        },
    )
    with pytest.raises(ConfigError, match="_PoolKeeper \\(inside MultiConnector\\)") as e:
        _build(transfer)
    assert e.value.field == "kv_transfer_config.kv_connector"


def test_offloading_inside_a_multi_connector_is_bound() -> None:
    transfer = KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "connectors": [
                {
                    "kv_connector": "OffloadingConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20},
                },
            ]
        },
    )
    scheduler = _build(transfer)
    (inner,) = scheduler.connector._connectors
    assert inner._kv_cache_manager is scheduler.kv_cache_manager
