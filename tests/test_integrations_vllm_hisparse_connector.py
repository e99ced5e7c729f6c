"""vLLM 0.33's HiSparse connector (``HiSparseConnector``, its scheduler half) run by vLLM's
own ``Scheduler`` and ``AsyncScheduler`` on the HiSparse layout with prefix caching off, and
worker acknowledgements (``HiSparseConnectorWorkerMetadata``) synthesized by one or two
workers at seeded delays; the core's ``kv::DeviceResidency``
(``tokenyard._core.HiSparseDeviceResidency``) replayed with the KV operations vLLM's
scheduler makes, in its order: each successful ``KVCacheManager.allocate_slots`` (the
tables grown to the slots vLLM backed), each ``free`` (finish, preemption, deferred frees),
each ``HiSparseCoordinator.advance_scheduled`` (from ``build_connector_meta``, after all the
step's allocations) and each ``update_spills`` (from ``update_from_output``, after the
finished requests are freed). After every operation: each request's host, indexer and hot
tables and its resident row with residency changes applied, both free queues in order; at
every step the write-backs in ``SchedulerOutput.kv_connector_metadata.command``, and
``has_pending_block_frees`` / ``has_pending_push_work``. This is the scheduler's own call
order over the structure the step scheduler is to run (docs/integrations.md, "vLLM 0.33's
scheduler-side HiSparse rule"). Each stream runs twice: on the standalone port and on
``kv::HiSparseConnectorPool`` (``tokenyard._core.HiSparseConnectorPool``), the same rules
over the step scheduler's own KV coordinator (its HiSparse pins: ``touch``,
``unpin_blocks`` with reuse watchers) and a host pool with write-back references. The
adapter runs the connector in the step with prefix caching off
(``tests/test_integrations_vllm_hisparse_step.py``). Needs vLLM (the bench venv); skipped
elsewhere."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from test_integrations_vllm_hisparse_groups import layout
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (
    HiSparseConnector,
    HiSparseConnectorWorkerMetadata,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput
from vllm_compare import BLOCK_SIZE, runner_output, sampling, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard._core import HiSparseConnectorPool, HiSparseDeviceResidency
from tokenyard.integrations._vllm_hisparse_meta import ResidencySync, build_hisparse_metadata

HISPARSE = {"kv_connector": "HiSparseConnector", "kv_role": "kv_both"}
MAX_MODEL_LEN = 256
INDEXER, HOT = 1, 3
# The core structures replayed: the standalone port, and the rules on the coordinator.
CORES = {"standalone": HiSparseDeviceResidency, "coordinator": HiSparseConnectorPool}


class Workers:
    """Synthesized worker acknowledgements: each of ``num_workers`` reports a transfer's
    ``enqueued`` count 0 or 1 steps after it is planned and its ``completed`` count 0 to 2
    steps after that (seeded); a step's reports are aggregated as vLLM's engine does
    (``HiSparseConnectorWorkerMetadata.aggregate``)."""

    def __init__(self, rng: random.Random, num_workers: int) -> None:
        self.rng = rng
        self.num_workers = num_workers
        self.due: dict[int, list[HiSparseConnectorWorkerMetadata]] = {}

    def plan(self, step: int, transfer_ids: list[int]) -> None:
        for transfer_id in transfer_ids:
            for _ in range(self.num_workers):
                enqueued = step + self.rng.randrange(2)
                completed = enqueued + self.rng.randrange(3)
                for at, counts in (
                    (enqueued, ({transfer_id: 1}, {})),
                    (completed, ({}, {transfer_id: 1})),
                ):
                    meta = HiSparseConnectorWorkerMetadata(*counts)
                    self.due.setdefault(at, []).append(meta)

    def report(self, step: int) -> HiSparseConnectorWorkerMetadata | None:
        reports = self.due.pop(step, [])
        if not reports:
            return None
        meta = reports[0]
        for other in reports[1:]:
            meta = meta.aggregate(other)
        return meta  # type: ignore[return-value]

    def pending(self) -> bool:
        return bool(self.due)


class Replay:
    """The core's ``HiSparseDeviceResidency`` fed vLLM's KV operations as its scheduler
    makes them (the scheduler's ``kv_cache_manager`` and the connector's coordinator
    wrapped on the instance), checked against vLLM's state after each."""

    def __init__(
        self, scheduler: Any, num_blocks: int, host_num_blocks: int, core: str = "standalone"
    ) -> None:
        self.manager = manager = scheduler.kv_cache_manager
        connector = scheduler.connector
        assert isinstance(connector, HiSparseConnector)
        self.coordinator = coordinator = connector.connector_scheduler.coordinator
        self.resident = coordinator.resident_managers[0]
        self.host = coordinator.get_host_block_pool()
        self.core = CORES[core](
            num_blocks=num_blocks,
            host_num_blocks=host_num_blocks,
            block_size=BLOCK_SIZE,
            blocks_per_request=coordinator.hot_managers[0].kv_cache_spec.blocks_per_request,
            max_admission_blocks_per_request=self.resident.max_admission_blocks_per_request,
            max_spill_pages=coordinator.max_spill_pages,
        )
        self.held: set[str] = set()
        self.sync = ResidencySync()
        self.seen = dict.fromkeys(("ops", "frees", "acks", "advances"), 0)
        allocate, free = manager.allocate_slots, manager.free
        advance, update_spills = coordinator.advance_scheduled, coordinator.update_spills

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            blocks = allocate(request, *args, **kwargs)
            if blocks is not None:
                request_id = request.request_id
                slots = len(manager.get_block_ids(request_id)[INDEXER]) * BLOCK_SIZE
                assert self.core.allocate_slots(request_id, slots), request_id
                self.held.add(request_id)
                self.check()
            return blocks

        def free_request(request: Any) -> None:
            free(request)
            if request.request_id in self.held:
                self.held.discard(request.request_id)
                self.core.free(request.request_id)
                self.sync.forget(request.request_id)
                self.seen["frees"] += 1
                self.check()

        def advance_scheduled(requests: Any) -> None:
            requests = list(requests)
            advance(requests)
            for request_id, num_tokens in requests:
                computed = max(0, num_tokens - coordinator.num_reprefillable_tokens)
                self.core.advance_scheduled(request_id, computed)
                self.seen["advances"] += 1
            self.check()

        def acknowledge(enqueued: dict[int, int], completed: dict[int, int]) -> None:
            update_spills(enqueued, completed)
            self.core.acknowledge(dict(enqueued), dict(completed))
            self.seen["acks"] += len(completed)
            self.check()

        manager.allocate_slots = allocate_slots
        manager.free = free_request
        coordinator.advance_scheduled = advance_scheduled
        coordinator.update_spills = acknowledge

    def state(self) -> dict[str, Any]:
        tables = {}
        for request_id in sorted(self.held):
            source, indexer, _, hot = self.manager.get_block_ids(request_id)
            row = [b.block_id for b in self.resident.get_residency_row(request_id)]
            tables[request_id] = (list(source), list(indexer), row, list(hot))
        pool = self.manager.block_pool
        return {
            "tables": tables,
            "free": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            "host_free": [b.block_id for b in self.host.free_block_queue.get_all_free_blocks()],
        }

    def core_state(self) -> dict[str, Any]:
        return {
            "tables": {r: self.core.tables(r) for r in sorted(self.held)},
            "free": self.core.free_blocks(),
            "host_free": self.core.host_free_blocks(),
        }

    def check(self) -> None:
        self.seen["ops"] += 1
        self.core.check()
        assert self.core_state() == self.state()


def build(
    num_blocks: int, host_num_blocks: int, *, async_scheduling: bool, **options: Any
) -> tuple[Any, VllmSchedulerPeer]:
    options = {"max_num_seqs": 6, "max_num_batched_tokens": 64, **options}
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        enable_prefix_caching=False,
        **options,
    )
    peer.vllm_config.kv_transfer_config = KVTransferConfig(**HISPARSE)
    peer.vllm_config.scheduler_config.async_scheduling = async_scheduling
    cls = AsyncScheduler if async_scheduling else Scheduler
    return peer.build(cls, layout(num_blocks, host_num_blocks)), peer


def run_stream(
    seed: int,
    num_blocks: int,
    host_num_blocks: int,
    *,
    async_scheduling: bool,
    workers: int,
    core: str = "standalone",
    **options: Any,
) -> dict[str, int]:
    """One seeded stream to its end (acknowledgements drained), ``options`` for
    ``VllmSchedulerPeer``; returns what it exercised. Fails at the first operation or step
    where the core's replay differs from vLLM."""
    rng = random.Random(seed)
    scheduler, peer = build(
        num_blocks, host_num_blocks, async_scheduling=async_scheduling, **options
    )
    replay = Replay(scheduler, num_blocks, host_num_blocks, core)
    acks = Workers(random.Random(seed + 1000), workers)
    arrivals = seeded_arrivals(rng, count=10, tail_max=150, max_tokens=60, lowest_token=1)
    counted = "steps transfers preempted hot unpinned lost reclaim updates mirrors lost_told"
    seen = dict.fromkeys((*counted.split(), "not_resident"), 0)
    in_flight: list[tuple[int, Any, set[str]]] = []
    for step in range(1500):
        for at, request_id, prompt, max_tokens in arrivals:
            if at == step:
                scheduler.add_request(peer.make_request(request_id, prompt, max_tokens))
        out = scheduler.schedule()
        meta = out.kv_connector_metadata
        transfers = [
            (t.transfer_id, t.host_block_id, t.resident_block_ids[0])
            for t in (meta.command.page_transfers if meta.command else [])
        ]
        assert all(t.after_forward for t in meta.command.page_transfers), step
        assert replay.core.take_transfers() == transfers, f"step {step}"
        ours = build_hisparse_metadata(
            out,
            replay.core.tables,
            transfers,
            source_group=0,
            block_size=BLOCK_SIZE,
            sync=replay.sync,
        )
        assert ours == meta, f"step {step}"
        seen["updates"] += len(meta.residency_updates)
        seen["lost_told"] += sum(0 in u.block_ids[0] for u in meta.residency_updates.values())
        seen["not_resident"] += not meta.all_context_pages_resident
        seen["mirrors"] += sum(map(len, meta.row_mirrors.values()))
        acks.plan(step, [t for t, _, _ in transfers])
        seen["transfers"] += len(transfers)
        seen["preempted"] += len(out.preempted_req_ids)
        in_flight.append((step, out, sampling(scheduler, out) if async_scheduling else set()))
        # Under async scheduling a step lands after the next is scheduled; an empty step
        # lands everything in flight.
        while in_flight and (
            not async_scheduling or len(in_flight) == 2 or not out.num_scheduled_tokens
        ):
            at, landing, sampled = in_flight.pop(0)
            output = (
                runner_output(scheduler, landing, sampled)
                if async_scheduling
                else runner_output(scheduler, landing)
            )
            output.kv_connector_output = KVConnectorOutput(kv_connector_worker_meta=acks.report(at))
            scheduler.update_from_output(landing, output)
        connector = scheduler.connector
        reclaim = connector.has_pending_block_frees()
        assert replay.core.has_pending_reclamation() == reclaim, f"step {step}"
        assert replay.core.has_pending_work() == connector.has_pending_push_work(), step
        seen["reclaim"] += reclaim
        tables = replay.state()["tables"]
        seen["hot"] += sum(bool(t[HOT]) for t in tables.values())
        seen["lost"] += sum(t[2].count(0) for t in tables.values())
        seen["unpinned"] += len(replay.coordinator._owners)
        seen["steps"] = step
        drained = not scheduler.has_unfinished_requests() and not in_flight
        if step > 6 and drained and not acks.pending() and not connector.has_pending_push_work():
            return {**seen, **replay.seen}
    raise AssertionError("the stream did not drain")


LAYOUTS = [(80, 40), (48, 60), (120, 24)]


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("num_blocks", "host_num_blocks"), LAYOUTS)
@pytest.mark.parametrize("seed", range(8))
def test_the_cores_residency_under_vllms_scheduler(
    seed: int, num_blocks: int, host_num_blocks: int, core: str
) -> None:
    seen = run_stream(
        seed,
        num_blocks,
        host_num_blocks,
        async_scheduling=False,
        workers=1 + seed % 2,
        core=core,
    )
    assert seen["transfers"] > 0
    assert seen["acks"] > 0
    assert seen["frees"] > 0


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("num_blocks", "host_num_blocks"), LAYOUTS)
@pytest.mark.parametrize("seed", range(4))
def test_the_cores_residency_under_vllms_async_scheduler(
    seed: int, num_blocks: int, host_num_blocks: int, core: str
) -> None:
    seen = run_stream(
        seed,
        num_blocks,
        host_num_blocks,
        async_scheduling=True,
        workers=1 + seed % 2,
        core=core,
    )
    assert seen["transfers"] > 0
    assert seen["acks"] > 0


def test_the_streams_exercise_the_connectors_rules() -> None:
    # Summed over a few streams: hot regions required, clean pages unpinned and lost (and
    # the worker told of lost pages, steps not all resident), preemptions, and
    # has_pending_block_frees answering True at some steps.
    totals: dict[str, int] = {}
    for seed, (num_blocks, host_num_blocks) in enumerate(LAYOUTS):
        seen = run_stream(
            seed, num_blocks, host_num_blocks, async_scheduling=False, workers=1, core="coordinator"
        )
        for key, value in seen.items():
            totals[key] = totals.get(key, 0) + value
    for key in ("hot", "unpinned", "lost", "preempted", "reclaim", "lost_told", "not_resident"):
        assert totals[key] > 0, key


class _IgnoresAcknowledgements:
    """The coordinator-backed core with the workers' acknowledgements dropped."""

    def __init__(self, **options: Any) -> None:
        self.inner = HiSparseConnectorPool(**options)

    def acknowledge(self, enqueued: dict[int, int], completed: dict[int, int]) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_the_check_fails_when_the_coordinator_ignores_acknowledgements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(CORES, "ignores_acks", _IgnoresAcknowledgements)
    for seed, (num_blocks, host_num_blocks) in enumerate(LAYOUTS):
        with pytest.raises(AssertionError):
            run_stream(
                seed,
                num_blocks,
                host_num_blocks,
                async_scheduling=False,
                workers=1,
                core="ignores_acks",
            )
