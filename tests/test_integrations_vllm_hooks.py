"""vLLM methods replaced on a built scheduler, routed through the replacement as vLLM 0.33's
``schedule()`` calls them (``tokenyard.integrations._vllm_hooks``):
``kv_cache_manager.allocate_slots`` (a ``None`` refuses the allocation: the running request
preempts or the admission waits) and ``_mamba_block_aligned_split``; and
``num_sampled_tokens_per_step`` assigned on a built scheduler; a parallel drafter's slots
charged per scheduled request (``max_num_new_slots_for_drafting``) and vLLM's two budgets
(``max_num_scheduled_tokens`` apart from ``max_num_batched_tokens``). Each differential case runs
vLLM 0.33's own ``Scheduler`` and the adapter with the same replacement on the same requests
and compares every step. Needs vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import weakref
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_compare import add_both, build_pair, compare_stream, seeded_arrivals, update_both

import tokenyard.integrations.vllm as vllm_adapter
from tokenyard.errors import ConfigError, InputError
from tokenyard.integrations._vllm_translate import core_config
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

SYNC = (Scheduler, TokenyardScheduler)


def _refusing(scheduler: Any, refuse: set[int]) -> list[int]:
    """Replaces ``scheduler.kv_cache_manager.allocate_slots`` with one that refuses the
    calls numbered in ``refuse`` (from 1) and delegates the others; returns the list each
    call appends its number to (refused ones negated)."""
    real = scheduler.kv_cache_manager.allocate_slots
    calls: list[int] = []

    def allocate(*args: Any, **kwargs: Any) -> Any:
        number = len(calls) + 1
        if number in refuse:
            calls.append(-number)
            return None
        calls.append(number)
        return real(*args, **kwargs)

    scheduler.kv_cache_manager.allocate_slots = allocate
    return calls


@pytest.mark.parametrize(("seed", "policy"), [(0, "fcfs"), (1, "fcfs"), (2, "priority")])
def test_a_patched_allocate_slots_is_called_and_obeyed_as_in_vllm(seed: int, policy: str) -> None:
    # A seeded stream on a tight pool: every 5th allocate_slots call is refused. Both
    # schedulers must ask it the same number of times and schedule, preempt and finish
    # alike at every step.
    theirs, ours, peer = build_pair(num_blocks=24, policy=policy)
    refuse = set(range(5, 100_000, 5))
    calls = [_refusing(s, refuse) for s in (theirs, ours)]
    arrivals = seeded_arrivals(random.Random(seed), tail_max=60, max_tokens=20)
    for step in range(2000):
        for at, *args in arrivals:
            if at == step:
                add_both((theirs, ours), peer.make_request, *args)
        outs = [s.schedule() for s in (theirs, ours)]
        assert dict(outs[1].num_scheduled_tokens) == dict(outs[0].num_scheduled_tokens), step
        assert outs[1].preempted_req_ids == outs[0].preempted_req_ids, step
        assert len(calls[1]) == len(calls[0]), step
        update_both((theirs, ours), outs)
        if step > 6 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            break
    else:
        raise AssertionError("the stream did not drain")
    assert any(c < 0 for c in calls[0])


@pytest.mark.parametrize("seed", [0, 1])
def test_priorities_changed_after_arrival_pick_the_victims_as_in_vllm(seed: int) -> None:
    # Priority policy on a tight pool: after each step one running request's priority is
    # changed by hand on both (vLLM reads Request.priority when it picks a victim).
    theirs, ours, peer = build_pair(num_blocks=14, policy="priority")
    rng = random.Random(seed)
    arrivals = seeded_arrivals(random.Random(seed), tail_max=60, max_tokens=40, count=10)
    num_preempted = 0
    for step in range(2000):
        for at, *args in arrivals:
            if at == step:
                add_both((theirs, ours), peer.make_request, *args)
        outs = [s.schedule() for s in (theirs, ours)]
        assert dict(outs[1].num_scheduled_tokens) == dict(outs[0].num_scheduled_tokens), step
        assert outs[1].preempted_req_ids == outs[0].preempted_req_ids, step
        num_preempted += len(outs[0].preempted_req_ids)
        update_both((theirs, ours), outs)
        if theirs.running:
            request_id = rng.choice(theirs.running).request_id
            priority = rng.randrange(-5, 5)
            for scheduler in (theirs, ours):
                scheduler.requests[request_id].priority = priority
        if step > 6 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            break
    else:
        raise AssertionError("the stream did not drain")
    assert num_preempted > 0


def test_the_views_allocate_slots_answers_only_within_a_step() -> None:
    _, ours, peer = build_pair(num_blocks=24)
    request = peer.make_request("a", list(range(8)), 4)
    ours.add_request(request)
    with pytest.raises(InputError, match="allocate_slots"):
        ours.kv_cache_manager.allocate_slots(request, 8)
    calls = _refusing(ours, {1})
    assert not ours.schedule().num_scheduled_tokens
    assert ours.schedule().num_scheduled_tokens == {"a": 8}
    assert calls == [-1, 2]
    # Un-patched (the instance attribute deleted), the core allocates alone again.
    del ours.kv_cache_manager.allocate_slots
    ours.add_request(peer.make_request("b", list(range(50, 58)), 4))
    assert ours.schedule().num_scheduled_tokens == {"b": 8}
    assert calls == [-1, 2]


def test_a_replaced_mamba_split_decides_the_chunk_as_in_vllm() -> None:
    # The split switched on over a full-attention model (as vLLM's tests do) and replaced
    # by one keeping at most 5 tokens of the original's chunk: both schedulers prefill a
    # 23-token prompt 5, 5, 5, then 1 token (the original stops at the 16-token block),
    # and so on; the adapter's own method answers the core's split.
    theirs, ours, peer = build_pair(num_blocks=24)
    seen: list[list[int]] = [[], []]
    for i, scheduler in enumerate((theirs, ours)):
        scheduler.need_mamba_block_aligned_split = True
        original = scheduler._mamba_block_aligned_split

        def split(request: Any, n: int, *args: Any, _o: Any = original, _i: int = i) -> int:
            kept = min(_o(request, n, *args), 5)
            seen[_i].append(kept)
            return int(kept)

        scheduler._mamba_block_aligned_split = split
    add_both((theirs, ours), peer.make_request, "a", list(range(100, 123)), 4)
    for _ in range(8):
        outs = [s.schedule() for s in (theirs, ours)]
        assert dict(outs[1].num_scheduled_tokens) == dict(outs[0].num_scheduled_tokens)
        update_both((theirs, ours), outs)
    assert seen[1] == seen[0]
    assert seen[0][:4] == [5, 5, 5, 1]
    with pytest.raises(InputError, match="_mamba_block_aligned_split"):
        type(ours)._mamba_block_aligned_split(ours, ours.requests["a"], 3)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_parallel_drafters_slots_are_budgeted_per_request_as_in_vllm(seed: int) -> None:
    # n-gram with parallel drafting and 4 speculative tokens: vLLM's scheduler charges
    # max_num_new_slots_for_drafting (3) of max_num_batched_tokens per scheduled request.
    _, _, peer = build_pair(num_blocks=64, num_speculative_tokens=4, max_num_seqs=8)
    spec = peer.vllm_config.speculative_config
    object.__setattr__(spec, "parallel_drafting", True)
    assert spec.max_num_new_slots_for_drafting == 3
    kv_cache_config = peer.scheduler.kv_cache_config
    theirs, ours = (peer.build(cls, kv_cache_config) for cls in (Scheduler, TokenyardScheduler))
    assert ours._core.num_draft_slots_per_request == 3
    arrivals = seeded_arrivals(random.Random(seed), tail_max=60, max_tokens=12, count=10)
    for step in range(2000):
        for at, *args in arrivals:
            if at == step:
                add_both((theirs, ours), peer.make_request, *args)
        outs = [s.schedule() for s in (theirs, ours)]
        assert dict(outs[1].num_scheduled_tokens) == dict(outs[0].num_scheduled_tokens), step
        update_both((theirs, ours), outs)
        if step > 6 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            break
    else:
        raise AssertionError("the stream did not drain")


def _two_budget_pair(
    classes: tuple[type, type],
    *,
    batched: int,
    scheduled: int | None,
    parallel: bool,
    adaptive: bool = False,
) -> tuple[Any, Any, Any]:
    """vLLM's scheduler and the adapter (``classes``) with vLLM's two budgets:
    ``max_num_batched_tokens`` (input rows: tokens and draft slots) and
    ``max_num_scheduled_tokens`` (tokens); n-gram with 4 speculative tokens, parallel
    drafting (3 draft slots per request) or not (none); an adaptive long-prefill threshold
    of 8 (a fair share of the input budget) with ``adaptive``."""
    _, _, peer = build_pair(
        num_blocks=96, num_speculative_tokens=4, max_num_seqs=8, max_num_batched_tokens=batched
    )
    object.__setattr__(peer.vllm_config.speculative_config, "parallel_drafting", parallel)
    sched = peer.vllm_config.scheduler_config
    sched.max_num_scheduled_tokens = scheduled
    if adaptive:
        sched.long_prefill_token_threshold = 8
        sched.long_prefill_token_threshold_adaptive = True
    kv_cache_config = peer.scheduler.kv_cache_config
    theirs, ours = (peer.build(cls, kv_cache_config) for cls in classes)
    return theirs, ours, peer


TWO_BUDGETS = [
    # (max_num_batched_tokens, max_num_scheduled_tokens, parallel drafting, adaptive)
    (64, 32, True, False),
    (64, 48, True, False),
    (40, 64, True, False),
    (64, 40, False, False),
    (48, 64, False, False),
    (64, 24, False, True),
]


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize(("batched", "scheduled", "parallel", "adaptive"), TWO_BUDGETS)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_token_budget_is_kept_apart_from_the_input_budget_as_in_vllm(
    seed: int, batched: int, scheduled: int, parallel: bool, adaptive: bool, asynchronous: bool
) -> None:
    # vLLM 0.33's schedule() keeps token_budget (max_num_scheduled_tokens) and input_budget
    # (max_num_batched_tokens, less each scheduled request's draft slots) apart: every step
    # (tokens, block ids, preemptions, finishes) and block table must match.
    classes = (AsyncScheduler, AsyncTokenyardScheduler) if asynchronous else SYNC
    theirs, ours, peer = _two_budget_pair(
        classes, batched=batched, scheduled=scheduled, parallel=parallel, adaptive=adaptive
    )
    assert ours._core.num_draft_slots_per_request == (3 if parallel else 0)
    arrivals = seeded_arrivals(random.Random(seed), tail_max=60, max_tokens=12, count=10)
    compare_stream(theirs, ours, arrivals, peer.make_request)


def test_two_budgets_by_hand() -> None:
    # Input budget 64, token budget 32, 3 slots: two 30-token prompts get 30 (tokens 2
    # left, input 31) and min(2, 31 - 3) = 2. One budget of 64 would give 30 and 31.
    theirs, ours, peer = _two_budget_pair(SYNC, batched=64, scheduled=32, parallel=True)
    for scheduler in (theirs, ours):
        for request_id in ("a", "b"):
            scheduler.add_request(peer.make_request(request_id, list(range(30)), 4))
    for scheduler in (theirs, ours):
        assert dict(scheduler.schedule().num_scheduled_tokens) == {"a": 30, "b": 2}


def test_a_core_with_one_budget_differs_from_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    # The variant: the core given only max_num_batched_tokens (one budget, as before) drifts
    # from vLLM at the first step that fills the token budget.
    def one_budget(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(core_config(*args, **kwargs), max_num_scheduled_tokens=None)

    monkeypatch.setattr(vllm_adapter, "core_config", one_budget)
    theirs, ours, peer = _two_budget_pair(SYNC, batched=64, scheduled=32, parallel=True)
    arrivals = seeded_arrivals(random.Random(0), tail_max=60, max_tokens=12, count=10)
    with pytest.raises(AssertionError, match="step"):
        compare_stream(theirs, ours, arrivals, peer.make_request)


def test_num_sampled_tokens_per_step_assigned_on_a_built_scheduler_reaches_the_core() -> None:
    _, ours, _ = build_pair(num_blocks=24)
    assert ours.num_sampled_tokens_per_step == 1
    ours.num_sampled_tokens_per_step = 0
    assert ours._core.num_sampled_tokens_per_step == 0
    with pytest.raises(ConfigError, match="num_sampled_tokens_per_step"):
        ours.num_sampled_tokens_per_step = 2
    with pytest.raises(ConfigError, match="num_sampled_tokens_per_step"):
        ours.num_sampled_tokens_per_step = -1


def test_a_scheduler_with_hooks_is_freed_once_dropped() -> None:
    # The core holds the hooks; they reach the adapter weakly, so a dropped adapter (here
    # under the priority policy, with a patched allocate_slots) is collected.
    _, ours, peer = build_pair(num_blocks=24, policy="priority")
    _refusing(ours, {1})
    ours.add_request(peer.make_request("a", list(range(8)), 4))
    ours.schedule()
    alive = weakref.ref(ours)
    del ours
    gc.collect()
    assert alive() is None
