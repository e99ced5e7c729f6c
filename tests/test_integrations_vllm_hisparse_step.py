"""vLLM 0.33's ``HiSparseConnector`` through the adapter with prefix caching off, side by side
with vLLM's own ``Scheduler`` and ``AsyncScheduler`` running the real connector's scheduler
half on the same HiSparse layout. The core runs the connector's rules in its step
(``sched::hisparse_step``); the adapter builds ``HiSparseConnectorMetadata`` from the core's
tables and hands the workers' acknowledgements to the core (``_vllm_hisparse_step``). Worker
acknowledgements (``HiSparseConnectorWorkerMetadata``) are synthesized by one or two
workers at seeded delays, as in ``test_integrations_vllm_hisparse_connector.py`` (the replay
of vLLM's KV operations on the core), and given to both schedulers alike. Every step:
scheduled tokens, preemptions and block ids per group (``block_digest``), the connector
metadata (write-backs, source blocks, row mirrors, residency updates), both free queues in
order, every request's tables and resident row, the update's outputs,
``has_pending_block_frees`` and ``has_pending_push_work``. Needs vLLM (the bench venv);
skipped elsewhere."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from test_integrations_vllm_hisparse_connector import HISPARSE, MAX_MODEL_LEN, Workers
from test_integrations_vllm_hisparse_groups import layout
from vllm.config import KVTransferConfig
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput
from vllm_compare import BLOCK_SIZE, block_digest, runner_output, sampling, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations import _vllm_hisparse_meta
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

LAYOUTS = [(80, 40), (48, 60), (120, 24)]


def build_pair(
    num_blocks: int, host_num_blocks: int, *, async_scheduling: bool, **options: Any
) -> tuple[Any, Any, VllmSchedulerPeer]:
    """vLLM's scheduler and the adapter, each with the HiSparse connector, caching off."""
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
    config = layout(num_blocks, host_num_blocks)
    if async_scheduling:
        return peer.build(AsyncScheduler, config), peer.build(AsyncTokenyardScheduler, config), peer
    return peer.build(Scheduler, config), peer.build(TokenyardScheduler, config), peer


def vllm_state(scheduler: Any) -> dict[str, Any]:
    coordinator = scheduler.connector.connector_scheduler.coordinator
    resident = coordinator.resident_managers[0]
    tables = {}
    for request_id in sorted(scheduler.requests):
        if not resident.get_residency_row(request_id) and not any(
            scheduler.kv_cache_manager.get_block_ids(request_id)
        ):
            continue
        row = [b.block_id for b in resident.get_residency_row(request_id)]
        tables[request_id] = (scheduler.kv_cache_manager.get_block_ids(request_id), row)
    pool = scheduler.kv_cache_manager.block_pool
    host = coordinator.get_host_block_pool()
    return {
        "tables": tables,
        "free": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "host_free": [b.block_id for b in host.free_block_queue.get_all_free_blocks()],
    }


def adapter_state(scheduler: Any) -> dict[str, Any]:
    core = scheduler._core
    tables = {}
    for request_id in sorted(scheduler.requests):
        core_id = scheduler._core_ids.get(request_id)
        ours = None if core_id is None else core.hisparse_tables(core_id)
        if ours is None:
            continue
        tables[request_id] = (scheduler.kv_cache_manager.get_block_ids(request_id), ours[2])
    return {
        "tables": tables,
        "free": core.free_block_ids().tolist(),
        "host_free": core.hisparse_host_free_blocks(),
    }


def _land(scheduler: Any, out: Any, sampled: set[str] | None, acks: Any) -> Any:
    output = (
        runner_output(scheduler, out) if sampled is None else runner_output(scheduler, out, sampled)
    )
    output.kv_connector_output = KVConnectorOutput(kv_connector_worker_meta=acks)
    return scheduler.update_from_output(out, output)


def _outputs(engine_outputs: dict[int, Any]) -> list[Any]:
    return [
        (o.request_id, list(o.new_token_ids), o.finish_reason)
        for outs in engine_outputs.values()
        for o in outs.outputs
    ]


def run_stream(
    seed: int, num_blocks: int, host_num_blocks: int, *, async_scheduling: bool, workers: int
) -> dict[str, int]:
    """One seeded stream of ten requests on both until both drain (acknowledgements
    included); returns what it exercised. Fails at the first step that differs."""
    theirs, ours, peer = build_pair(num_blocks, host_num_blocks, async_scheduling=async_scheduling)
    both = (theirs, ours)
    acks = Workers(random.Random(seed + 1000), workers)
    arrivals = seeded_arrivals(
        random.Random(seed), count=10, tail_max=150, max_tokens=60, lowest_token=1
    )
    seen = dict.fromkeys(("transfers", "preempted", "reclaim", "lost_told", "not_resident"), 0)
    in_flight: list[tuple[int, list[Any], list[set[str] | None]]] = []
    for step in range(1500):
        for at, request_id, prompt, max_tokens in arrivals:
            if at == step:
                for scheduler in both:
                    scheduler.add_request(peer.make_request(request_id, prompt, max_tokens))
        outs = [s.schedule() for s in both]
        assert block_digest(outs[1]) == block_digest(outs[0]), f"step {step}"
        meta = outs[0].kv_connector_metadata
        assert outs[1].kv_connector_metadata == meta, f"step {step}"
        assert outs[1].has_sync_kv_loads == outs[0].has_sync_kv_loads, f"step {step}"
        transfers = [t.transfer_id for t in meta.command.page_transfers]
        acks.plan(step, transfers)
        seen["transfers"] += len(transfers)
        seen["preempted"] += len(outs[0].preempted_req_ids)
        seen["not_resident"] += not meta.all_context_pages_resident
        seen["lost_told"] += sum(0 in u.block_ids[0] for u in meta.residency_updates.values())
        samples = [
            sampling(s, o) if async_scheduling else None for s, o in zip(both, outs, strict=True)
        ]
        in_flight.append((step, outs, samples))
        while in_flight and (
            not async_scheduling or len(in_flight) == 2 or not outs[0].num_scheduled_tokens
        ):
            at, landing, sampled = in_flight.pop(0)
            report = acks.report(at)
            results = [
                _land(s, o, x, copy.deepcopy(report))
                for s, o, x in zip(both, landing, sampled, strict=True)
            ]
            assert _outputs(results[1]) == _outputs(results[0]), f"step {step}"
        assert adapter_state(ours) == vllm_state(theirs), f"step {step}"
        reclaim = theirs.connector.has_pending_block_frees()
        assert ours.connector.has_pending_block_frees() == reclaim, f"step {step}"
        pending = theirs.connector.has_pending_push_work()
        assert ours.connector.has_pending_push_work() == pending, f"step {step}"
        assert ours.has_unfinished_requests() == theirs.has_unfinished_requests(), step
        seen["reclaim"] += reclaim
        drained = not theirs.has_unfinished_requests() and not in_flight
        if step > 6 and drained and not acks.pending() and not pending:
            return seen
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize(("num_blocks", "host_num_blocks"), LAYOUTS)
@pytest.mark.parametrize("seed", range(8))
def test_the_connector_in_the_step_agrees_with_vllms_scheduler(
    seed: int, num_blocks: int, host_num_blocks: int
) -> None:
    seen = run_stream(
        seed, num_blocks, host_num_blocks, async_scheduling=False, workers=1 + seed % 2
    )
    assert seen["transfers"] > 0


@pytest.mark.parametrize(("num_blocks", "host_num_blocks"), LAYOUTS)
@pytest.mark.parametrize("seed", range(4))
def test_the_connector_in_the_step_agrees_with_vllms_async_scheduler(
    seed: int, num_blocks: int, host_num_blocks: int
) -> None:
    seen = run_stream(
        seed, num_blocks, host_num_blocks, async_scheduling=True, workers=1 + seed % 2
    )
    assert seen["transfers"] > 0


def test_the_streams_exercise_the_connectors_rules() -> None:
    # Summed over a stream per layout: preemptions, lost pages told to the worker, steps
    # not all resident, and has_pending_block_frees answering True.
    totals: dict[str, int] = {}
    for seed, (num_blocks, host_num_blocks) in enumerate(LAYOUTS):
        seen = run_stream(seed, num_blocks, host_num_blocks, async_scheduling=False, workers=1)
        for key, value in seen.items():
            totals[key] = totals.get(key, 0) + value
    for key in ("preempted", "reclaim", "lost_told", "not_resident"):
        assert totals[key] > 0, key


def test_the_check_fails_without_lost_pages_in_the_residency_updates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A variant: the worker told only of appended pages (never of pages lost to reuse).
    def appended_only(self: Any, request_id: str, row: list[int]) -> Any:
        sent = self._sent.get(request_id, [])
        if len(sent) >= len(row):
            return None
        self._sent[request_id] = list(row)
        return list(range(len(sent), len(row))), row[len(sent) :]

    monkeypatch.setattr(_vllm_hisparse_meta.ResidencySync, "take", appended_only)
    failed = 0
    for seed, (num_blocks, host_num_blocks) in enumerate(LAYOUTS):
        try:
            run_stream(seed, num_blocks, host_num_blocks, async_scheduling=False, workers=1)
        except AssertionError:
            failed += 1
    assert failed > 0


def test_the_check_fails_when_the_core_drops_acknowledgements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tokenyard.integrations import _vllm_hisparse_step

    monkeypatch.setattr(
        _vllm_hisparse_step.CoreHiSparseCoordinator, "update_spills", lambda *args: None
    )
    with pytest.raises(AssertionError):
        run_stream(0, *LAYOUTS[0], async_scheduling=False, workers=1)


def _refused(**changes: Any) -> ConfigError:
    peer = VllmSchedulerPeer(
        num_blocks=80,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=6,
        max_num_batched_tokens=64,
        enable_prefix_caching=changes.pop("enable_prefix_caching", False),
    )
    peer.vllm_config.kv_transfer_config = changes.pop("transfer", KVTransferConfig(**HISPARSE))
    config = layout(80, 40, **changes)
    with pytest.raises(ConfigError) as err:
        peer.build(TokenyardScheduler, config)
    return err.value


def test_prefix_caching_with_the_connector_is_refused_by_name() -> None:
    err = _refused(enable_prefix_caching=True)
    assert err.field == "cache_config.enable_prefix_caching"
    assert "HiSparseConnector" in str(err)


def test_several_resident_groups_with_the_connector_are_refused() -> None:
    err = _refused(num_resident_groups=3)
    assert err.field == "kv_cache_config.kv_cache_groups"


def test_the_connector_inside_a_multi_connector_is_refused_by_name() -> None:
    child = {**HISPARSE, "kv_connector_extra_config": {"host_pool_gib": 1}}
    transfer = KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": [child]},
    )
    err = _refused(transfer=transfer)
    assert err.field == "kv_transfer_config.kv_connector"
    assert err.value == "MultiConnector"


def test_assigning_a_kv_cache_config_beside_the_connector_is_refused() -> None:
    _, ours, _ = build_pair(80, 40, async_scheduling=False)
    with pytest.raises(ConfigError) as err:
        ours.kv_cache_config = layout(80, 40)
    assert err.value.field == "kv_cache_config"
