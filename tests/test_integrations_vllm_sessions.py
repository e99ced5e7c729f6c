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

The streams with edges add sessions whose first chunk is empty and chunks for sessions
whose ``WAITING_FOR_STREAMING_REQ`` status, output token and computed tokens are set by
hand on a queued request, against vLLM's schedulers with their ``assert`` statements
stripped (``scheduler.py`` compiled as ``python -O`` does): vLLM's ``schedule()`` asserts
``num_new_tokens > 0`` when it reaches an empty session, and skips it past that assertion.
"""

from __future__ import annotations

import random
import sys
import types
from functools import cache
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


@cache
def _without_asserts() -> tuple[type, type]:
    """vLLM 0.33's ``Scheduler`` and ``AsyncScheduler`` compiled without their ``assert``
    statements (``compile(..., optimize=1)``, what ``python -O`` runs), in modules of
    their own; the rest of vLLM is the one imported."""
    import vllm.v1.core.sched.async_scheduler as async_module
    import vllm.v1.core.sched.scheduler as sync_module

    built = []
    saved = sys.modules[sync_module.__name__]
    try:
        for module in (sync_module, async_module):
            path = Path(str(module.__file__))
            stripped = types.ModuleType(module.__name__)
            stripped.__file__ = str(path)
            code = compile(path.read_text(), str(path), "exec", optimize=1)
            exec(code, stripped.__dict__)
            # The async module imports Scheduler from the stripped one.
            sys.modules[sync_module.__name__] = stripped
            built.append(stripped)
    finally:
        sys.modules[sync_module.__name__] = saved
    return built[0].Scheduler, built[1].AsyncScheduler


def _pair(
    *, async_scheduling: bool, num_blocks: int = 64, stripped: bool = False, **options: Any
) -> list[Any]:
    """vLLM's scheduler (``stripped``: without its asserts) and tokenyard's over the same
    config (prefix caching on)."""
    sync_cls, async_cls = _without_asserts() if stripped else (Scheduler, AsyncScheduler)
    classes = (
        (async_cls, AsyncTokenyardScheduler) if async_scheduling else (sync_cls, TokenyardScheduler)
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


def _stats(s: Any) -> tuple[Any, ...]:
    stats = s.make_stats()
    prefix = stats.prefix_cache_stats
    return (
        stats.num_running_reqs,
        stats.num_waiting_reqs,
        round(stats.kv_cache_usage, 9),
        (prefix.requests, prefix.queries, prefix.hits),
    )


def _hand_set_chunk(pair: list[Any], rng: random.Random, sessions: list[str], step: int) -> None:
    """vLLM's tests' edit: a queued session that was never scheduled since it arrived or
    resumed gets ``WAITING_FOR_STREAMING_REQ``, one output token and computed tokens by
    hand, then its next chunk (``add_request``)."""
    requests = pair[0].requests
    queued = [
        i
        for i in sessions
        if i in requests
        and requests[i].status == RequestStatus.WAITING
        and requests[i].num_computed_tokens == 0
    ]
    if not queued:
        return
    request_id = rng.choice(queued)
    num_computed = rng.randint(0, requests[request_id].num_tokens)
    for s in pair:
        request = s.requests[request_id]
        request.status = RequestStatus.WAITING_FOR_STREAMING_REQ
        request.append_output_token_ids(step)
        request.num_computed_tokens = num_computed
    chunk = [step * 100 + 70 + t for t in range(rng.randint(1, 12))]
    _add(pair, request_id, chunk, rng.randint(1, 8))


def _vllm_stalls(vllm: Any, outs: list[Any]) -> bool:
    """vLLM scheduled nothing with nothing running while the adapter preempted waiting
    requests that hold blocks to admit another (vLLM would never schedule again)."""
    return (
        not outs[0].num_scheduled_tokens
        and not vllm.running
        and bool(outs[1].preempted_req_ids)
        and not outs[0].preempted_req_ids
    )


def _stream(seed: int, async_scheduling: bool, edges: bool = False) -> None:
    rng = random.Random(seed)
    # vLLM's lookup of an empty session fails even without asserts (its
    # find_longest_cache_hit slices -1 // block_size hashes): empty ones only without
    # prefix caching.
    caching = not edges or rng.random() < 0.5
    pair = _pair(
        async_scheduling=async_scheduling,
        num_blocks=rng.choice([10, 16, 64]),
        max_num_seqs=rng.choice([2, 4, 8]),
        stripped=edges,
        enable_prefix_caching=caching,
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
        elif roll < 0.45 and edges and not caching:
            # A session whose first chunk is empty: queued, skipped at each step.
            _add(pair, f"e{step}", [], rng.randint(1, 8))
            sessions.append(f"e{step}")
            _same(pair, f"{what}: empty session")
        elif roll < 0.55 and edges:
            _hand_set_chunk(pair, rng, sessions, step)
            _same(pair, f"{what}: chunk for a wait set by hand")
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
        if edges and _vllm_stalls(pair[0], outs):
            # Every request waits and the blocks are all held by waiting sessions: vLLM
            # breaks at allocate_slots at every step from now on; the core releases the
            # waiting holders' blocks (`release_landed_loads`, documented).
            return
        assert _decisions(outs[1]) == _decisions(outs[0]), what
        requests = pair[0].requests
        sampling = {i for i in outs[0].num_scheduled_tokens if not requests[i].is_prefill_chunk}
        for queue, out in zip(in_flight, outs, strict=True):
            queue.append((out, sampling))
        _same(pair, f"{what}: scheduled")
        if edges:
            assert _stats(pair[1]) == _stats(pair[0]), f"{what}: stats"
            deferred = [sorted(r.request_id for r in s.deferred_waiting) for s in pair]
            assert deferred[1] == deferred[0], f"{what}: deferred"


@pytest.mark.parametrize("seed", range(30))
def test_random_session_streams_agree_step_by_step(seed: int) -> None:
    _stream(seed, async_scheduling=False)


@pytest.mark.parametrize("seed", range(30))
def test_random_async_session_streams_agree_step_by_step(seed: int) -> None:
    _stream(seed, async_scheduling=True)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_random_streams_with_empty_sessions_and_hand_set_waits_agree(
    seed: int, async_scheduling: bool
) -> None:
    _stream(seed, async_scheduling, edges=True)


def test_an_empty_first_chunk_waits_skipped_at_each_step_its_chunks_queued() -> None:
    """vLLM (its asserts stripped, no prefix caching) queues an empty session, skips it at
    each step (deferred, unfinished), and queues its next chunk in ``streaming_queue``;
    a 4-token request behind it runs."""
    pair = _pair(async_scheduling=False, stripped=True, enable_prefix_caching=False)
    _add(pair, "e", [])
    _add(pair, "p", list(range(4)), resumable=False)
    for step in range(3):
        outs = [s.schedule() for s in pair]
        assert _decisions(outs[1]) == _decisions(outs[0])
        assert "e" not in outs[1].num_scheduled_tokens
        for s, out in zip(pair, outs, strict=True):
            s.update_from_output(out, _runner_output(out, {}, set(out.num_scheduled_tokens)))
        _same(pair, f"step {step}")
        assert _stats(pair[1]) == _stats(pair[0])
    _add(pair, "e", [5, 6])
    _same(pair, "chunk queued")
    assert len(pair[1].requests["e"].streaming_queue) == 1
    # The empty session and the request still decoding.
    assert pair[1].get_num_unfinished_requests() == 2


def test_a_chunk_on_a_wait_set_by_hand_is_admitted_from_the_computed_tokens_set() -> None:
    """vLLM's test_streaming_request_session_update on a stream: a queued 20-token session
    gets the streaming status, one output and 20 computed tokens by hand; its 5-token
    chunk drops the output and is admitted at once from 20 computed (5 scheduled), where
    it was queued, and vLLM's parked-session counter goes to -1."""
    pair = _pair(async_scheduling=False)
    _add(pair, "s", list(range(100, 120)))
    for s in pair:
        request = s.requests["s"]
        request.status = RequestStatus.WAITING_FOR_STREAMING_REQ
        request.append_output_token_ids(9)
        request.num_computed_tokens = 20
    _add(pair, "s", list(range(200, 205)))
    _same(pair, "chunk taken")
    assert pair[1].num_waiting_for_streaming_input == -1
    outs = [s.schedule() for s in pair]
    assert _decisions(outs[1]) == _decisions(outs[0])
    assert outs[1].num_scheduled_tokens == {"s": 5}
    assert outs[1].scheduled_new_reqs[0].num_computed_tokens == 20
    _same(pair, "admitted")


def test_the_edge_streams_catch_a_hand_set_chunk_admitted_by_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check can fail: an adapter that tells the core nothing was computed admits the
    hand-set chunk by lookup, its whole prompt scheduled, and the streams find it."""
    original = TokenyardScheduler._resume_unparked

    def by_lookup(self: Any, session: Any, update: Any) -> None:
        computed = session.num_computed_tokens
        session.num_computed_tokens = 0
        try:
            original(self, session, update)
        finally:
            session.num_computed_tokens = computed

    monkeypatch.setattr(TokenyardScheduler, "_resume_unparked", by_lookup)

    def streams() -> None:
        for seed in range(10):
            _stream(seed, async_scheduling=False, edges=True)

    with pytest.raises(AssertionError):
        streams()
