"""tokenyard.integrations.vllm's invalid KV blocks under async scheduling with two steps in
flight, against vLLM 0.33's own ``AsyncScheduler``, step by step on seeded streams.

vLLM's ``_update_requests_with_invalid_blocks`` scans a running request's blocks up to its
``num_computed_tokens`` less the step being updated (the later step's tokens count as
computed), cuts the count back to its first invalid block, and ``update_from_output`` skips
the request's output of that step before ``_update_request_with_output``: the step's output
placeholder is never resolved. The later step lands and appends its token; from then on
the request computes one position past its tokens (its ``num_output_placeholders`` keeps
the skipped step's), as the core now models it.

The streams are those of ``test_integrations_vllm_load_failures`` (a seeded KV connector
loading part of each prompt, synchronously or not; blocks reported invalid with a step's
output), run on ``AsyncScheduler`` with each step updated once the next one is scheduled.
Every step is compared: scheduled tokens and block ids, the requests waiting for loads,
each update's outputs, every request's status, computed tokens, block table and
``num_output_placeholders``, the failed loads still waiting, KV usage, and the calls
reaching ``kv_cache_manager.evict_blocks`` (not ``cache_blocks``: the core caches the
blocks of outputs landing late itself, which vLLM's ``update_from_output`` does through
that call under async scheduling; the blocks cached show in the next lookups, compared).
Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from test_integrations_vllm_block_sizes_connectors import _loading, build_pair
from test_integrations_vllm_load_failures import (
    ONE,
    _invalid_blocks,
    _outputs,
    _spy_manager_calls,
    _state,
)
from vllm.v1.engine import FinishReason
from vllm.v1.outputs import KVConnectorOutput
from vllm_compare import block_digest, runner_output, seeded_arrivals

#: Steps in flight: each step is updated once the next one is scheduled (vLLM's engine
#: with async scheduling keeps two).
IN_FLIGHT = 2


def _placeholders(scheduler: Any) -> dict[str, int]:
    return {r.request_id: r.num_output_placeholders for r in scheduler.requests.values()}


def _sampling(theirs: Any, out: Any) -> set[str]:
    """The requests of the step ``out`` that sample, as vLLM's ``AsyncScheduler`` decided
    (its ``is_prefill_chunk``: a request still short of its tokens and outputs in flight
    samples nothing); both schedulers get the same tokens."""
    return {r for r in out.num_scheduled_tokens if not theirs.requests[r].is_prefill_chunk}


def _stuck(scheduler: Any, out: Any) -> bool:
    """Whether the step ran nothing while only running requests are left, each holding an
    output placeholder with no step in flight: vLLM 0.33's async check ("avoid scheduling
    an extra step when we are sure that the previous step has reached max_tokens",
    ``num_computed_tokens + 2 - num_output_placeholders >= num_prompt_tokens +
    max_tokens``) counts the placeholder a cut left unresolved as the last token in
    flight, so a request one token short of ``max_tokens`` is never scheduled again."""
    left = list(scheduler.requests.values())
    return (
        not out.num_scheduled_tokens
        and not scheduler.waiting
        and all(r.status.name == "RUNNING" and r.num_output_placeholders > 0 for r in left)
    )


def _arrivals(rng: random.Random) -> list[tuple[Any, ...]]:
    return seeded_arrivals(
        rng,
        count=10,
        prefix_tokens=160,
        shared=(0, 16, 48, 100, 160),
        tail_max=100,
        arrive_by=12,
        max_tokens=12,
        lowest_token=1,
        max_prompt=300,
    )


def _update(pair: list[Any], step: tuple[Any, ...], calls: list[Any]) -> list[Any]:
    """Both schedulers' update of one step in flight; returns their outputs."""
    outs, samples, landing, failed, invalid = step
    results = []
    for scheduler, out in zip(pair, outs, strict=True):
        output = runner_output(scheduler, out, samples)
        output.kv_connector_output = KVConnectorOutput(
            finished_recving=set(landing),
            failed_recving=set(failed),
            invalid_block_ids=set(invalid),
        )
        results.append(_outputs(scheduler.update_from_output(out, output)))
    assert results[1] == results[0]
    assert _evictions(calls[1]) == _evictions(calls[0]), "manager calls"
    return results[0]


def _evictions(calls: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [c for c in calls if c[0] == "evict_blocks"]


def run_async_invalid(seed: int, policy: str, *, invalid_share: float) -> dict[str, int]:
    """A seeded stream on both schedulers, two steps in flight (see the module doc);
    returns what it exercised: ``multi`` counts running requests cut back (or failed)
    while a later step of theirs was in flight, ``unresolved`` steps ending with a running
    request holding more placeholders than its steps in flight sample tokens, ``stuck``
    the requests left in vLLM's stall (``_stuck``) when the stream ends in it."""
    pair, peer = build_pair(ONE, seed=seed, policy=policy, num_blocks=200, asynchronous=True)
    theirs, ours = pair
    calls = [_spy_manager_calls(s) for s in pair]
    rng = random.Random(seed)
    arrivals = _arrivals(rng)
    seen = {"invalid": 0, "cut": 0, "multi": 0, "unresolved": 0, "errors": 0, "stuck": 0}
    started: set[str] = set()
    pending: list[tuple[Any, ...]] = []
    for step in range(400):
        for at, *args in arrivals:
            if at == step:
                for scheduler in pair:
                    scheduler.add_request(peer.make_request(*args))
        outs = [scheduler.schedule() for scheduler in pair]
        assert block_digest(outs[1]) == block_digest(outs[0]), f"step {step}"
        assert _evictions(calls[1]) == _evictions(calls[0]), f"step {step}"
        now_loading = [_loading(s) for s in pair]
        assert now_loading[1] == now_loading[0], f"step {step}"
        told = sorted(theirs.connector.allocs, key=lambda a: a[0])
        for s in pair:
            s.connector.allocs.clear()
        landing = started & now_loading[0]
        started = {r for r, _, n in told if n and r in now_loading[0]}
        # Under "fail", one request failed per step at most (see _invalid_blocks).
        invalid = _invalid_blocks(rng, theirs, outs[0], invalid_share, one=policy == "fail")
        seen["invalid"] += len(invalid)
        pending.append((outs, _sampling(theirs, outs[0]), landing, set(), invalid))
        idle = not any(o.num_scheduled_tokens for o in outs)
        while pending and (len(pending) == IN_FLIGHT or idle):
            current = pending.pop(0)
            later = {r for o, *_ in pending for r in o[0].num_scheduled_tokens}
            computed = {r.request_id: r.num_computed_tokens for r in theirs.requests.values()}
            try:
                results = _update(pair, current, calls)
            except AssertionError as err:
                raise AssertionError(f"step {step}: {err}") from err
            for c in calls:
                c.clear()
            errors = [r for r, _, reason in results if reason == FinishReason.ERROR]
            seen["errors"] += len(errors)
            seen["multi"] += sum(r in later for r in errors)
            for r in theirs.requests.values():
                if r.num_computed_tokens < computed.get(r.request_id, 0):
                    seen["cut"] += 1
                    seen["multi"] += r.request_id in later
        assert _state(ours) == _state(theirs), f"step {step}"
        assert _placeholders(ours) == _placeholders(theirs), f"step {step}"
        assert ours.failed_recving_kv_req_ids == theirs.failed_recving_kv_req_ids, step
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        seen["unresolved"] += any(
            r.status.name == "RUNNING"
            and r.num_output_placeholders > sum(r.request_id in p[1] for p in pending)
            for r in theirs.requests.values()
        )
        if step > 12 and not pending and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return seen
        if step > 12 and not pending and _stuck(theirs, outs[0]):
            # vLLM's stall, which the adapter keeps (every step above agreed).
            assert _stuck(ours, outs[1])
            seen["stuck"] = len(theirs.running)
            return seen
    raise AssertionError(f"every step agreed, and after 400 {sorted(theirs.requests)} wait")


@pytest.mark.parametrize("seed", range(4))
def test_invalid_blocks_with_two_steps_in_flight_match_vllm_under_recompute(seed: int) -> None:
    seen = run_async_invalid(seed, "recompute", invalid_share=0.3)
    assert seen["invalid"] > 0


@pytest.mark.parametrize("seed", range(3))
def test_invalid_blocks_with_two_steps_in_flight_match_vllm_under_fail(seed: int) -> None:
    seen = run_async_invalid(seed, "fail", invalid_share=0.15)
    assert seen["invalid"] > 0


def test_the_streams_cut_requests_with_a_later_step_in_flight() -> None:
    # The streams above exercise what they compare: running requests cut back while their
    # next step was in flight, left with a placeholder never resolved; failed requests.
    recompute = [run_async_invalid(s, "recompute", invalid_share=0.3) for s in range(2)]
    assert sum(s["multi"] for s in recompute) > 0
    assert sum(s["unresolved"] for s in recompute) > 0
    failed = [run_async_invalid(s, "fail", invalid_share=0.15) for s in range(3)]
    assert sum(s["errors"] for s in failed) > 0
    assert sum(s["multi"] for s in failed) > 0
