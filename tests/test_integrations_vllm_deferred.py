"""tokenyard.integrations.vllm: deferred block frees without a KV connector
(``scheduler.defer_block_free = True`` on a built scheduler, as vLLM 0.33's
``tests/v1/core/test_deferred_block_free.py`` sets it). vLLM's ``Scheduler`` /
``AsyncScheduler`` and tokenyard's are driven through the same operations; after each, the
free blocks, the deferred frees' fences, the fence counters and each step's decisions must
be equal (vLLM 0.33 ``scheduler.py``: ``_free_request_blocks``, ``_drain_deferred_frees``,
the allocation loop's ``_request_blocks_can_be_freed`` check). Needs vLLM (the bench venv,
``.venv-bench``); skipped elsewhere.
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
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import RequestStatus
from vllm_compare import add_to_each, peer_pair

from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

STOP = 42
_PROMPT_BASES: dict[str, int] = {}


def _pair(*, async_scheduling: bool = True, num_blocks: int = 64, **options: Any) -> list[Any]:
    """vLLM's scheduler and tokenyard's over the same config (prefix caching on), frees
    deferred by hand."""
    classes = (
        (AsyncScheduler, AsyncTokenyardScheduler)
        if async_scheduling
        else (Scheduler, TokenyardScheduler)
    )
    config = {"max_num_seqs": 8, "max_num_batched_tokens": 128, "max_model_len": 256}
    config.update(options)
    pair = peer_pair(classes, num_blocks=num_blocks, **config)
    for scheduler in pair:
        scheduler.defer_block_free = True
    return pair


def _add(pair: list[Any], request_id: str, num_tokens: int = 33, max_tokens: int = 5) -> None:
    """The same request to each scheduler, with the block hasher vLLM's engine gives it.
    Prompts share their first 16 tokens (one block) when ``num_tokens`` is over 20."""
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP])
    base = 1000 * _PROMPT_BASES.setdefault(request_id, len(_PROMPT_BASES) + 1)
    prompt = [base + t for t in range(num_tokens)]
    if num_tokens > 20:
        prompt[:16] = range(16)
    add_to_each(pair, request_id, prompt, params)


def _runner_output(
    out: Any, tokens: dict[str, int] | None = None, sampling: set[str] | None = None
) -> ModelRunnerOutput:
    """Token 0 (or ``tokens``) for each request of ``out``; with ``sampling``, only those
    in it sample (the others ran a prefill chunk)."""
    ids = list(out.num_scheduled_tokens)
    tokens = tokens or {}
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={i: n for n, i in enumerate(ids)},
        sampled_token_ids=[
            [tokens.get(i, 0)] if sampling is None or i in sampling else [] for i in ids
        ],
    )


def _state(scheduler: Any) -> tuple[Any, ...]:
    return (
        scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
        [fence for fence, _ in scheduler.deferred_frees],
        scheduler.sched_step_seq,
        scheduler.processed_step_seq,
    )


def _decisions(out: Any) -> tuple[Any, ...]:
    return (dict(out.num_scheduled_tokens), set(out.preempted_req_ids), set(out.finished_req_ids))


def _same(pair: list[Any], what: str) -> None:
    vllm_state, ours = (_state(s) for s in pair)
    assert ours == vllm_state, what


def test_a_request_stopping_with_its_next_step_in_flight_keeps_its_blocks_until_it_lands() -> None:
    """33-token prompt (3 blocks of 16): it stops on its prefill's output while its first
    decode is in flight; its 3 blocks wait for that step (fence 2)."""
    pair = _pair()
    _add(pair, "r")
    outs = [(s.schedule(), s.schedule()) for s in pair]
    _same(pair, "two steps scheduled")
    for s, (out0, _) in zip(pair, outs, strict=True):
        s.update_from_output(out0, _runner_output(out0, {"r": STOP}))
        assert s.requests.get("r") is None
    _same(pair, "stopped, its blocks deferred")
    assert _state(pair[1])[1] == [2]
    for s, (_, out1) in zip(pair, outs, strict=True):
        s.update_from_output(out1, _runner_output(out1))
    _same(pair, "the step in flight landed")
    assert not pair[1].deferred_frees


def test_an_abort_with_three_steps_in_flight_waits_for_the_newest() -> None:
    pair = _pair()
    _add(pair, "r", max_tokens=10)
    outs: list[list[Any]] = []
    for s in pair:
        outs.append([s.schedule() for _ in range(3)])
        s.finish_requests("r", RequestStatus.FINISHED_ABORTED)
    _same(pair, "aborted with three steps in flight")
    assert _state(pair[1])[1] == [3]
    for k in range(3):
        for s, steps in zip(pair, outs, strict=True):
            s.update_from_output(steps[k], _runner_output(steps[k]))
        _same(pair, f"step {k + 1} landed")
    assert not pair[1].deferred_frees


def test_a_synchronous_scheduler_defers_through_the_step_fence() -> None:
    pair = _pair(async_scheduling=False)
    _add(pair, "r")
    outs = []
    for s in pair:
        outs.append(s.schedule())
        assert s.requests["r"].last_sched_seq == 1
        s.finish_requests("r", RequestStatus.FINISHED_ABORTED)
    _same(pair, "aborted while its step runs")
    for s, out in zip(pair, outs, strict=True):
        s.update_from_output(out, _runner_output(out))
    _same(pair, "its step landed")


def test_a_victim_served_by_a_step_in_flight_is_not_preempted_until_it_lands() -> None:
    """6 blocks of 16 (5 usable beside vLLM's null block): two 32-token prompts take 2
    each; their decodes need a 3rd. The victim's blocks wait for the step in flight, so
    the allocation loop stops instead of preempting (vLLM 0.33's check); once the step
    lands the victim is preempted."""
    pair = _pair(num_blocks=6)
    for i in range(3):
        _add(pair, f"r{i}", num_tokens=32, max_tokens=40)
    steps: list[list[Any]] = [[s.schedule() for _ in range(3)] for s in pair]
    assert _decisions(steps[0][1]) == _decisions(steps[1][1])
    assert _decisions(steps[0][2]) == _decisions(steps[1][2])
    _same(pair, "three steps formed")
    for k in range(3):
        for s, mine in zip(pair, steps, strict=True):
            s.update_from_output(mine[k], _runner_output(mine[k]))
            mine.append(s.schedule())
        assert _decisions(steps[0][-1]) == _decisions(steps[1][-1]), f"step {k + 4}"
        _same(pair, f"step {k + 4}")


@pytest.mark.parametrize("seed", range(40))
def test_random_streams_with_stops_and_aborts_in_flight_agree_step_by_step(seed: int) -> None:
    """Requests stop (token 42) and are aborted with one or two steps in flight, under a
    pool tight enough to preempt; vLLM's async scheduler and tokenyard's agree on every
    step's decisions, the free blocks and the deferred fences."""
    rng = random.Random(seed)
    pair = _pair(num_blocks=rng.choice([8, 12, 24]), max_num_batched_tokens=64)
    # Each step in flight with the requests that sample in it (read on vLLM's requests).
    in_flight: list[list[tuple[Any, set[str]]]] = [[], []]
    for step in range(40):
        if rng.random() < 0.3:
            size, max_tokens = rng.randint(5, 60), rng.randint(1, 12)
            _add(pair, f"q{step}", num_tokens=size, max_tokens=max_tokens)
        if rng.random() < 0.1 and pair[0].requests:
            victim = rng.choice(sorted(pair[0].requests))
            for s in pair:
                s.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
        if len(in_flight[0]) == 2 or (in_flight[0] and rng.random() < 0.3):
            stops = {i: STOP for i in pair[0].requests if rng.random() < 0.15}
            for s, queue in zip(pair, in_flight, strict=True):
                out, sampling = queue.pop(0)
                s.update_from_output(out, _runner_output(out, stops, sampling))
            _same(pair, f"seed {seed}, output landed before step {step}")
        outs = [s.schedule() for s in pair]
        assert _decisions(outs[0]) == _decisions(outs[1]), f"seed {seed}, step {step}"
        requests = pair[0].requests
        sampling = {i for i in outs[0].num_scheduled_tokens if not requests[i].is_prefill_chunk}
        for queue, out in zip(in_flight, outs, strict=True):
            queue.append((out, sampling))
        _same(pair, f"seed {seed}, step {step}")
