"""tokenyard.integrations.vllm: streaming-input sessions (vLLM 0.33's resumable requests).
vLLM's ``Scheduler`` / ``AsyncScheduler`` and tokenyard's are driven through the same
operations: sessions whose turns stop (token 42) and park, input chunks added while a
session is parked (it resumes) or running (queued until its turn stops), sessions ended by
a non-resumable request with their id, aborts, and plain requests beside them. After each
operation the decisions, the resumed sessions' ``NewRequestData``, each request's status,
computed tokens and token ids, the outputs' finish reasons, the free blocks and the
counters must be equal (vLLM 0.33 ``scheduler.py``: ``_handle_stopped_request``,
``_update_request_as_session``, ``add_request``, ``get_num_unfinished_requests``, the
admission cap ``len(running) + num_waiting_for_streaming_input``). Needs vLLM (the bench
venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import RequestStatus
from vllm_compare import add_to_each, peer_pair

from tokenyard.errors import InputError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

STOP = 42


def _pair(*, async_scheduling: bool, num_blocks: int = 64, **options: Any) -> list[Any]:
    """vLLM's scheduler and tokenyard's over the same config (prefix caching on)."""
    classes = (
        (AsyncScheduler, AsyncTokenyardScheduler)
        if async_scheduling
        else (Scheduler, TokenyardScheduler)
    )
    config = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 256}
    config.update(options)
    return peer_pair(classes, num_blocks=num_blocks, **config)


def _add(
    pair: list[Any],
    request_id: str,
    prompt: list[int],
    max_tokens: int = 6,
    resumable: bool = True,
) -> None:
    """The same request to each scheduler (a new one, or a session's chunk or end)."""
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP])
    add_to_each(pair, request_id, prompt, params, resumable=resumable)


def _runner_output(out: Any, tokens: dict[str, int], sampling: set[str]) -> ModelRunnerOutput:
    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={i: n for n, i in enumerate(ids)},
        sampled_token_ids=[[tokens.get(i, 7)] if i in sampling else [] for i in ids],
    )


def _state(s: Any) -> tuple[Any, ...]:
    requests = {
        i: (r.status, r.num_computed_tokens, list(r.all_token_ids), r.num_prompt_tokens)
        for i, r in s.requests.items()
    }
    return (
        requests,
        s.kv_cache_manager.block_pool.get_num_free_blocks(),
        s.num_waiting_for_streaming_input,
        s.get_request_counts(),
        s.get_num_unfinished_requests(),
        sorted(r.request_id for r in s.kv_holding_waiting),
        sorted(r.request_id for r in s.waiting),
    )


def _decisions(out: Any) -> tuple[Any, ...]:
    return (
        dict(out.num_scheduled_tokens),
        [(r.req_id, r.num_computed_tokens, r.block_ids) for r in out.scheduled_new_reqs],
        set(out.preempted_req_ids),
        set(out.finished_req_ids),
    )


def _outputs(outputs: dict[int, Any]) -> list[tuple[Any, ...]]:
    return sorted(
        (o.request_id, list(o.new_token_ids), o.finish_reason)
        for eco in outputs.values()
        for o in eco.outputs
    )


def _same(pair: list[Any], what: str) -> None:
    vllm_state, ours = (_state(s) for s in pair)
    assert ours == vllm_state, what


def test_a_stopped_session_parks_and_its_next_chunk_resumes_from_its_blocks() -> None:
    """A 20-token session stops on its first output (token 42): reported stopped, parked
    with its 2 blocks (20 computed tokens); its 12-token chunk makes a 32-token prompt
    (the 42 dropped), admitted as a new request with 20 computed, 12 scheduled."""
    pair = _pair(async_scheduling=False)
    _add(pair, "s", list(range(100, 120)))
    for s in pair:
        out = s.schedule()
        outputs = s.update_from_output(out, _runner_output(out, {"s": STOP}, {"s"}))
        assert _outputs(outputs)[0][2] is not None
        assert s.requests["s"].status == RequestStatus.WAITING_FOR_STREAMING_REQ
    _same(pair, "parked")
    _add(pair, "s", list(range(200, 212)))
    _same(pair, "resumed")
    outs = [s.schedule() for s in pair]
    assert _decisions(outs[1]) == _decisions(outs[0])
    assert outs[1].num_scheduled_tokens == {"s": 12}
    assert outs[1].scheduled_new_reqs[0].num_computed_tokens == 20
    _same(pair, "admitted")


def test_a_parked_session_keeps_its_slot_and_pause_new_leaves_it_out() -> None:
    pair = _pair(async_scheduling=False, max_num_seqs=1)
    _add(pair, "s", list(range(10)))
    for s in pair:
        out = s.schedule()
        s.update_from_output(out, _runner_output(out, {"s": STOP}, {"s"}))
    _add(pair, "other", list(range(50, 54)), resumable=False)
    outs = [s.schedule() for s in pair]
    assert _decisions(outs[1]) == _decisions(outs[0])
    assert not outs[1].num_scheduled_tokens
    for s in pair:
        s.set_pause_state(PauseState.PAUSED_NEW)
    _same(pair, "paused")
    assert pair[1].get_num_unfinished_requests() == 0


def test_a_chunk_added_while_the_session_runs_waits_for_its_turn_to_stop() -> None:
    """Async, three steps in flight: the chunk is queued; when the first step's stop lands
    the session resumes at once (never parked), and the later steps' outputs are stale
    and dropped."""
    pair = _pair(async_scheduling=True)
    _add(pair, "s", list(range(10)), max_tokens=4)
    steps = [[s.schedule() for _ in range(3)] for s in pair]
    _add(pair, "s", list(range(300, 305)))
    _same(pair, "chunk queued")
    for s, mine in zip(pair, steps, strict=True):
        out = mine[0]
        s.update_from_output(out, _runner_output(out, {"s": STOP}, {"s"}))
        assert s.requests["s"].status == RequestStatus.WAITING
    _same(pair, "resumed on its stop")
    for s, mine in zip(pair, steps, strict=True):
        for out in mine[1:]:
            outputs = s.update_from_output(out, _runner_output(out, {}, {"s"}))
            assert not _outputs(outputs)
    _same(pair, "stale outputs dropped")


def test_a_duplicate_id_that_is_no_session_is_refused() -> None:
    pair = _pair(async_scheduling=False)
    _add(pair, "p", list(range(10)), resumable=False)
    with pytest.raises(InputError) as info:
        _add(pair[1:], "p", list(range(10)), resumable=False)
    assert info.value.field == "request_id"


def _stream(seed: int, async_scheduling: bool) -> None:
    rng = random.Random(seed)
    pair = _pair(
        async_scheduling=async_scheduling,
        num_blocks=rng.choice([10, 16, 64]),
        max_num_seqs=rng.choice([2, 4, 8]),
    )
    in_flight: list[list[tuple[Any, set[str]]]] = [[], []]
    sessions: list[str] = []
    for step in range(60):
        what = f"seed {seed}, step {step}"
        roll = rng.random()
        if roll < 0.15:
            request_id = f"q{step}"
            resumable = rng.random() < 0.7
            _add(
                pair,
                request_id,
                [step * 100 + t for t in range(rng.randint(3, 40))],
                rng.randint(1, 8),
                resumable,
            )
            if resumable:
                sessions.append(request_id)
        elif roll < 0.35 and sessions:
            # The next chunk of a live session (or, now and then, its end).
            request_id = rng.choice(sessions)
            if request_id in pair[0].requests:
                if rng.random() < 0.15:
                    _add(pair, request_id, [1], resumable=False)
                    sessions.remove(request_id)
                else:
                    chunk = [step * 100 + 50 + t for t in range(rng.randint(1, 20))]
                    _add(pair, request_id, chunk, rng.randint(1, 8))
            _same(pair, f"{what}: chunk")
        elif roll < 0.4 and pair[0].requests:
            victim = rng.choice(sorted(pair[0].requests))
            for s in pair:
                s.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
            _same(pair, f"{what}: abort")
        depth = 3 if async_scheduling else 1
        if len(in_flight[0]) == depth or (in_flight[0] and rng.random() < 0.4):
            stops = {i: STOP for i in pair[0].requests if rng.random() < 0.3}
            outputs = []
            for s, queue in zip(pair, in_flight, strict=True):
                out, sampling = queue.pop(0)
                outputs.append(
                    _outputs(s.update_from_output(out, _runner_output(out, stops, sampling)))
                )
            assert outputs[1] == outputs[0], f"{what}: outputs"
            _same(pair, f"{what}: landed")
        outs = [s.schedule() for s in pair]
        assert _decisions(outs[1]) == _decisions(outs[0]), what
        requests = pair[0].requests
        sampling = {i for i in outs[0].num_scheduled_tokens if not requests[i].is_prefill_chunk}
        for queue, out in zip(in_flight, outs, strict=True):
            queue.append((out, sampling))
        _same(pair, f"{what}: scheduled")


@pytest.mark.parametrize("seed", range(30))
def test_random_session_streams_agree_step_by_step(seed: int) -> None:
    _stream(seed, async_scheduling=False)


@pytest.mark.parametrize("seed", range(30))
def test_random_async_session_streams_agree_step_by_step(seed: int) -> None:
    _stream(seed, async_scheduling=True)
