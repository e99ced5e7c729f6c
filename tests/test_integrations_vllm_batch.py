"""tokenyard.integrations.vllm: the step path's reused batch (``Batch`` in
``_vllm_state``). A steady decode step reuses the previous step's lists of ids and
requests; a step where the batch changes, a request finishes between ``schedule()`` and
``update_from_output``, or the output's ``num_scheduled_tokens`` was edited takes the
per-request path. Each case runs on vLLM 0.33's own ``Scheduler`` and on
``TokenyardScheduler`` with the same vLLM arguments, step by step, and the answers are
compared. Needs vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import RequestStatus
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler


def _both(async_scheduling: bool = False) -> dict[str, Any]:
    """vLLM's Scheduler and the adapter over the same configs, 6 requests of 20 tokens
    (``max_tokens`` 12, the first ends at 5), one sharing the others' first block."""
    peer = VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=256,
        block_size=16,
        enable_prefix_caching=True,
        scheduler_cls=AsyncScheduler if async_scheduling else None,
    )
    cls = AsyncTokenyardScheduler if async_scheduling else TokenyardScheduler
    ours = cls(
        vllm_config=peer.vllm_config,
        kv_cache_config=peer.scheduler.kv_cache_config,
        structured_output_manager=peer.scheduler.structured_output_manager,
        block_size=16,
        log_stats=True,
    )
    schedulers = {"vllm": peer.scheduler, "tokenyard": ours}
    for scheduler in schedulers.values():
        for i in range(6):
            prompt = [100 + j for j in range(16)] + [1000 * i + j for j in range(4)]
            scheduler.add_request(peer.make_request(f"r{i}", prompt, 5 if i == 0 else 12))
    return schedulers


def _runner(scheduler: Any, out: Any) -> ModelRunnerOutput:
    """Token ``3 + step`` for each request whose prompt is computed, none for a chunk."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for request_id in ids:
        request = scheduler.requests.get(request_id)
        done = request is None or request.num_computed_tokens >= request.num_prompt_tokens
        sampled.append([3] if done else [])
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={i: n for n, i in enumerate(ids)}, sampled_token_ids=sampled
    )


def _summary(out: Any, outputs: Any, scheduler: Any) -> tuple[Any, ...]:
    """What a step hands the engine and leaves on the requests."""
    engine = [
        (o.request_id, list(o.new_token_ids), o.finish_reason, o.stop_reason)
        for eco in outputs.values()
        for o in eco.outputs
    ]
    cached = out.scheduled_cached_reqs
    state = sorted(
        (
            r.request_id,
            r.num_computed_tokens,
            r.num_output_tokens,
            r.status,
            r.is_prefill_chunk,
            r.num_in_flight_tokens,
        )
        for r in scheduler.requests.values()
    )
    return (
        dict(out.num_scheduled_tokens),
        cached.req_ids,
        cached.num_computed_tokens,
        cached.num_output_tokens,
        cached.new_block_ids,
        cached.all_token_ids,
        sorted(out.finished_req_ids),
        sorted(engine),
        state,
    )


def _run(schedulers: dict[str, Any], steps: int, between: Any = None) -> dict[str, list[Any]]:
    """``steps`` synchronous steps on each scheduler; ``between(name, scheduler, out, step)``
    runs between ``schedule()`` and ``update_from_output``."""
    seen: dict[str, list[Any]] = {}
    for name, scheduler in schedulers.items():
        seen[name] = []
        for step in range(steps):
            out = scheduler.schedule()
            if between is not None:
                between(name, scheduler, out, step)
            outputs = scheduler.update_from_output(out, _runner(scheduler, out))
            seen[name].append(_summary(out, outputs, scheduler))
    return seen


def test_steady_decode_reuses_the_batch_and_agrees_with_vllm() -> None:
    """Decode steps with the same requests reuse one batch; when r0 finishes the batch is
    rebuilt; every step agrees with vLLM's."""
    batches: list[Any] = []

    def record(name: str, scheduler: Any, out: Any, step: int) -> None:
        if name == "tokenyard":
            batches.append(scheduler._batches[0][1])

    schedulers = _both()
    seen = _run(schedulers, 10, record)
    assert seen["tokenyard"] == seen["vllm"]
    # Step 0 admits all six; 1-4 decode them (the same batch); r0 stops at its 5th token.
    assert batches[1] is batches[2] is batches[3] is batches[4]
    assert batches[5] is not batches[4]
    assert batches[5].vllm_ids == ["r1", "r2", "r3", "r4", "r5"]
    assert batches[6] is batches[5]


def test_abort_between_schedule_and_update_takes_the_per_request_path() -> None:
    """r2 aborted while its step runs (the batch reused): its output is dropped, the
    others' delivered, as vLLM does."""

    def abort(name: str, scheduler: Any, out: Any, step: int) -> None:
        if step == 3:
            scheduler.finish_requests("r2", RequestStatus.FINISHED_ABORTED)

    seen = _run(_both(), 8, abort)
    assert seen["tokenyard"] == seen["vllm"]
    engine_step3 = seen["vllm"][3][7]
    assert [e[0] for e in engine_step3] == ["r0", "r1", "r3", "r4", "r5"]


def test_prev_step_ids_read_and_changed_between_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """V1 runner: ``prev_step_scheduled_req_ids`` read after each ``schedule()`` is
    vLLM's; r3 dropped from it in place (as a caller may) sends r3's whole token list in
    the next step's ``CachedRequestData.all_token_ids``, as vLLM's does."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    read: dict[str, list[set[str]]] = {"vllm": [], "tokenyard": []}

    def edit(name: str, scheduler: Any, out: Any, step: int) -> None:
        if step % 2:
            read[name].append(set(scheduler.prev_step_scheduled_req_ids))
        if step == 2:
            scheduler.prev_step_scheduled_req_ids.discard("r3")

    schedulers = _both()
    assert not schedulers["tokenyard"].use_v2_model_runner
    seen = _run(schedulers, 6, edit)
    assert seen["tokenyard"] == seen["vllm"]
    assert read["tokenyard"] == read["vllm"]
    assert list(seen["tokenyard"][3][5]) == ["r3"]


def test_an_edited_num_scheduled_tokens_is_read_as_given() -> None:
    """An output whose ``num_scheduled_tokens`` was edited after ``schedule()`` (r3
    dropped) is not matched to the batch: the update reads it as given, as vLLM's."""

    def edit(name: str, scheduler: Any, out: Any, step: int) -> None:
        if step == 2:
            del out.num_scheduled_tokens["r3"]

    seen = _run(_both(), 4, edit)
    assert seen["tokenyard"] == seen["vllm"]
    assert "r3" not in [e[0] for e in seen["tokenyard"][2][7]]


def test_async_steps_agree_with_vllm() -> None:
    """Async scheduling (two steps in flight, the first step's update after the second
    is formed), r0 finishing while a step is in flight: every step agrees with vLLM's."""
    schedulers = _both(async_scheduling=True)
    seen: dict[str, list[Any]] = {}
    for name, scheduler in schedulers.items():
        seen[name] = []
        pending = scheduler.schedule()
        for _ in range(9):
            nxt = scheduler.schedule()
            outputs = scheduler.update_from_output(pending, _runner(scheduler, pending))
            seen[name].append(_summary(pending, outputs, scheduler))
            pending = nxt
    assert seen["tokenyard"] == seen["vllm"]
