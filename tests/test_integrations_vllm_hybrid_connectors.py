"""tokenyard.integrations.vllm with a KV connector beside several KV cache groups, against
vLLM 0.33's own ``Scheduler`` on the same streams. vLLM runs its coordinator with a connector
that supports the hybrid allocator (``SupportsHMA``): the connector's tokens count as computed
in every group (``KVCacheManager.allocate_slots`` with ``num_external_computed_tokens``), a
bounded-replay window cuts a connector hit to whole blocks and replays it after an
asynchronous load unless the load restores the window (``get_loaded_kv_cache_group_ids``),
and new blocks are zeroed (mixed-precision groups) but those an asynchronous load writes.

A seeded connector (registered here) offers part of each request's tokens, loading them
asynchronously or not; its asynchronous loads land the step after they start. Every step is
compared: scheduled tokens, computed tokens, ``replay_start``, block ids per group, blocks to
zero, the requests waiting for their loads, KV usage and every request's block tables. Needs
vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus
from vllm_compare import BLOCK_SIZE, block_digest, kv_groups, runner_output, seeded_arrivals
from vllm_peer import VllmSchedulerPeer, bounded_replay_groups

from tokenyard.integrations.vllm import TokenyardScheduler

WINDOW = 32
CONNECTOR = "TokenyardSeededHybridConnector"


class SeededHybridConnector(KVConnectorBase_V1, SupportsHMA):
    """Scheduler side only. For each lookup ``(request, num_computed_tokens)`` it offers a
    seeded share of the tokens left (a synchronous load leaves the last one), asynchronously
    or not; ``loads_every_group`` restores every group (a P/D transfer), else the
    prefix-cacheable ones (vLLM's default). Finished requests' tables are kept."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._seed = int(extra["seed"])
        self._every_group = bool(extra["loads_every_group"])
        self.finished_tables: dict[str, tuple[list[int], ...]] = {}

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        key = f"{self._seed}:{request.request_id}:{num_computed_tokens}".encode()
        rng = random.Random(zlib.crc32(key))
        load_async = rng.random() < 0.5
        most = request.num_tokens - num_computed_tokens - (0 if load_async else 1)
        if most <= 0 or rng.random() < 0.3:
            return 0, False
        return rng.randrange(1, most + 1), load_async

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        if self._every_group:
            return self._kv_cache_config.transfer_group_ids
        return super().get_loaded_kv_cache_group_ids(request)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return False, None

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        self.finished_tables[request.request_id] = tuple(list(g) for g in block_ids)
        return False, None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


if CONNECTOR not in KVConnectorFactory._registry:
    KVConnectorFactory.register_connector(CONNECTOR, __name__, SeededHybridConnector.__name__)


def _pair(
    groups: list[Any], *, seed: int, loads_every_group: bool, num_blocks: int
) -> tuple[list[Any], VllmSchedulerPeer]:
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512
    )
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector=CONNECTOR,
        kv_role="kv_both",
        kv_connector_extra_config={"seed": seed, "loads_every_group": loads_every_group},
    )
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return [peer.build(cls, config) for cls in (Scheduler, TokenyardScheduler)], peer


def _loading(scheduler: Any) -> set[str]:
    return {
        r.request_id
        for r in scheduler.requests.values()
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    }


def _run(
    groups: list[Any], seed: int, *, loads_every_group: bool = False, num_blocks: int = 160
) -> dict[str, int]:
    """A seeded stream on both schedulers, every step compared (see the module doc).
    Returns what it exercised."""
    pair, peer = _pair(
        groups, seed=seed, loads_every_group=loads_every_group, num_blocks=num_blocks
    )
    arrivals = seeded_arrivals(
        random.Random(seed),
        count=10,
        prefix_tokens=160,
        shared=(0, 16, 48, 100, 160),
        tail_max=100,
        arrive_by=12,
        max_tokens=12,
        lowest_token=1,
        max_prompt=300,
    )
    seen = {"loads": 0, "replays": 0, "zeroed": 0, "preemptions": 0}
    loading: list[set[str]] = [set(), set()]
    for step in range(400):
        for at, *args in arrivals:
            if at == step:
                for scheduler in pair:
                    scheduler.add_request(peer.make_request(*args))
        outs = [scheduler.schedule() for scheduler in pair]
        digests = [
            {**block_digest(out, replay=True), "zero": out.new_block_ids_to_zero} for out in outs
        ]
        assert digests[1] == digests[0], f"step {step}"
        now_loading = [_loading(s) for s in pair]
        assert now_loading[1] == now_loading[0], f"step {step}"
        seen["loads"] += len(now_loading[0] - loading[0])
        seen["replays"] += sum(r.replay_start > 0 for r in outs[0].scheduled_new_reqs)
        seen["zeroed"] += len(outs[0].new_block_ids_to_zero or ())
        seen["preemptions"] += len(outs[0].preempted_req_ids)
        # Each load lands with the output of the step after the one that started it.
        landing = loading[0] & now_loading[0]
        for scheduler, out in zip(pair, outs, strict=True):
            output = runner_output(scheduler, out)
            output.kv_connector_output = KVConnectorOutput(finished_recving=set(landing))
            scheduler.update_from_output(out, output)
        loading = [now - landing for now in now_loading]
        ours, theirs = pair[1], pair[0]
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage())
        for request_id in theirs.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == theirs.kv_cache_manager.get_block_ids(request_id), step
        if step > 12 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            assert ours.connector.finished_tables == theirs.connector.finished_tables
            return seen
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize("seed", range(6))
def test_connector_loads_beside_bounded_replay_match_vllm(seed: int) -> None:
    seen = _run(bounded_replay_groups(WINDOW, block_size=BLOCK_SIZE), seed)
    assert seen["loads"] > 0
    assert seen["zeroed"] > 0


# vLLM 0.33 starts an asynchronous load only if it fits beside the blocks the in-flight
# prefills still need (``_inflight_prefill_reserved_blocks``); so does the core (seed 2
# meets it under memory pressure).
@pytest.mark.parametrize("seed", range(6))
def test_connector_loads_beside_bounded_replay_under_memory_pressure(seed: int) -> None:
    _run(bounded_replay_groups(WINDOW, block_size=BLOCK_SIZE), seed, num_blocks=40)


@pytest.mark.parametrize("seed", range(6))
def test_connector_loads_beside_a_sliding_window_under_memory_pressure(seed: int) -> None:
    _run(kv_groups(["full", "window32"]), seed, num_blocks=40)


@pytest.mark.parametrize("seed", range(3))
def test_window_carrying_loads_match_vllm(seed: int) -> None:
    _run(bounded_replay_groups(WINDOW, block_size=BLOCK_SIZE), seed, loads_every_group=True)


@pytest.mark.parametrize("seed", range(4))
def test_connector_loads_beside_a_sliding_window_match_vllm(seed: int) -> None:
    assert _run(kv_groups(["full", "window32"]), seed)["loads"] > 0


def test_replays_after_loads_happen() -> None:
    seen = [_run(bounded_replay_groups(WINDOW, block_size=BLOCK_SIZE), s) for s in range(6)]
    assert sum(s["replays"] for s in seen) > 0


@pytest.mark.parametrize("seed", range(4))
def test_the_connector_hears_of_requests_aborted_before_running(seed: int) -> None:
    # vLLM 0.33's _free_request asks the connector (_connector_finished) about every
    # finished request, whatever its status: waiting, loading or running.
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    pair, _ = _pair(
        kv_groups(["full", "window32"]), seed=seed, loads_every_group=False, num_blocks=160
    )
    tables = []
    for scheduler in pair:
        for i in range(3):
            prompt = list(range(100 * i, 100 * i + 40))
            scheduler.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=4), None))
        scheduler.schedule()
        scheduler.finish_requests(["r0", "r1", "r2"], RequestStatus.FINISHED_ABORTED)
        tables.append(scheduler.connector.finished_tables)
    assert tables[0] == tables[1]
    assert set(tables[0]) == {"r0", "r1", "r2"}
