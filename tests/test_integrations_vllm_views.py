"""tokenyard.integrations.vllm's views of vLLM's internals (``_vllm_coordinator_view``):
``kv_cache_manager.coordinator.single_type_managers[i]`` (``req_to_blocks``,
``num_cached_block``, the null block), ``kv_cache_manager.block_pool`` (``blocks`` with their
ref counts and cached hashes, ``cached_block_hash_to_block``, ``free_block_queue``, whose
forced count is refused), ``_preempt_request`` as the hook every
preemption goes through, and ``num_in_flight_tokens`` / ``num_stale_output_tokens`` on
vLLM's ``Request``. Each case runs vLLM 0.33's own ``Scheduler`` (``AsyncScheduler``) and
the adapter on the same configs and requests, and compares what vLLM's real
``KVCacheManager`` holds with what the views read from the core, step by step. Needs vLLM
(the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import RequestStatus
from vllm_compare import (
    add_both,
    build_pair,
    kv_groups,
    runner_output,
    seeded_arrivals,
    update_both,
)
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import InputError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler


def _both(
    kinds: tuple[str, ...] = ("full",),
    num_blocks: int = 40,
    async_scheduling: bool = False,
    **options: Any,
) -> tuple[Any, Any, VllmSchedulerPeer]:
    """vLLM's scheduler and the adapter over one KV cache config (``AsyncScheduler`` and
    ``AsyncTokenyardScheduler`` with ``async_scheduling``), and the peer that makes
    requests (with vLLM's block hasher)."""
    if async_scheduling:
        options["classes"] = (AsyncScheduler, AsyncTokenyardScheduler)
    return build_pair(num_blocks=num_blocks, groups=kv_groups(kinds), **options)


def _manager_state(scheduler: Any) -> list[dict[str, Any]]:
    """Per KV group: each request's block ids, null blocks counted by identity, and its
    cached-block count, as the scheduler's coordinator (real or view) shows them."""
    state = []
    for manager in scheduler.kv_cache_manager.coordinator.single_type_managers:
        null = manager._null_block
        state.append(
            {
                "blocks": {r: [b.block_id for b in bs] for r, bs in manager.req_to_blocks.items()},
                "nulls": {r: sum(b is null for b in bs) for r, bs in manager.req_to_blocks.items()},
                "cached": dict(manager.num_cached_block),
            }
        )
    return state


def _hash_map(cached: Any) -> tuple[int, list[int]]:
    """``cached_block_hash_to_block`` as vLLM's tests read it: its length and the blocks
    its ``_cache`` holds (a block, or a dict of them where several cache one hash)."""
    ids = [
        b.block_id
        for value in cached._cache.values()
        for b in (value.values() if isinstance(value, dict) else [value])
    ]
    return len(cached), sorted(ids)


def _pool_state(scheduler: Any) -> dict[str, Any]:
    """The block pool's per-block ref counts and cached flags, free blocks and size."""
    pool = scheduler.kv_cache_manager.block_pool
    blocks = pool.blocks
    return {
        "num_gpu_blocks": pool.num_gpu_blocks,
        "ref_cnt": [b.ref_cnt for b in blocks],
        "cached": [b.block_hash is not None for b in blocks],
        "_block_hash": [b._block_hash is not None for b in blocks],
        "hash_map": _hash_map(pool.cached_block_hash_to_block),
        "free": pool.free_block_queue.num_free_blocks,
        "free_ids": sorted(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
        "null": blocks[0] is pool.null_block and pool.null_block.is_null,
    }


def _run_and_compare(
    kinds: tuple[str, ...], num_blocks: int, seed: int, abort_every: int = 0, **options: Any
) -> int:
    """A seeded stream with shared prefixes on both schedulers; after every step the
    coordinators and block pools must agree. Returns the steps compared."""
    theirs, ours, peer = _both(kinds, num_blocks, **options)
    arrivals = seeded_arrivals(random.Random(seed), tail_max=100, max_tokens=30)
    for step in range(2000):
        for at, *args in arrivals:
            if at == step:
                add_both((theirs, ours), peer.make_request, *args)
        if abort_every and step % abort_every == abort_every - 1 and theirs.running:
            victim = theirs.running[0].request_id
            for scheduler in (theirs, ours):
                scheduler.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
        outs = [scheduler.schedule() for scheduler in (theirs, ours)]
        assert dict(outs[1].num_scheduled_tokens) == dict(outs[0].num_scheduled_tokens)
        assert _manager_state(ours) == _manager_state(theirs), f"step {step}, scheduled"
        update_both((theirs, ours), outs)
        assert _manager_state(ours) == _manager_state(theirs), f"step {step}, updated"
        assert _pool_state(ours) == _pool_state(theirs), f"step {step}"
        if step > 6 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return step
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize("seed", [0, 1])
def test_single_group_coordinator_and_pool_match_vllms_kv_cache_manager(seed: int) -> None:
    assert _run_and_compare(("full",), num_blocks=40, seed=seed, abort_every=7) > 6


def test_without_prefix_caching_num_cached_block_stays_empty_as_in_vllm() -> None:
    steps = _run_and_compare(("full",), num_blocks=40, seed=2, enable_prefix_caching=False)
    assert steps > 6


def test_a_tight_pool_that_preempts_keeps_the_views_equal() -> None:
    _run_and_compare(("full",), num_blocks=14, seed=3, max_num_seqs=6)


def test_hybrid_groups_show_null_blocks_where_a_window_left_as_vllm() -> None:
    theirs, ours, peer = _both(("full", "window32"), num_blocks=60)
    for scheduler in (theirs, ours):
        scheduler.add_request(peer.make_request("a", list(range(100)), 4))
    nulls_seen = 0
    for _ in range(8):
        outs = [scheduler.schedule() for scheduler in (theirs, ours)]
        update_both((theirs, ours), outs)
        assert _manager_state(ours) == _manager_state(theirs)
        assert _pool_state(ours) == _pool_state(theirs)
        nulls_seen += sum(_manager_state(ours)[1]["nulls"].values())
    assert nulls_seen > 0


def test_req_to_blocks_is_live_not_a_snapshot() -> None:
    theirs, ours, peer = _both()
    req_to_blocks = ours.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
    assert "a" not in req_to_blocks
    assert len(req_to_blocks) == 0
    for scheduler in (theirs, ours):
        scheduler.add_request(peer.make_request("a", list(range(40)), 3))
        scheduler.schedule()
    assert [b.block_id for b in req_to_blocks["a"]] == [
        b.block_id
        for b in theirs.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks["a"]
    ]
    block = req_to_blocks["a"][0]
    assert block.ref_cnt == 1
    ours.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert "a" not in req_to_blocks
    assert block.ref_cnt == 0
    with pytest.raises(KeyError):
        req_to_blocks["a"]


def test_every_preemption_goes_through_a_wrapped_preempt_request_as_in_vllm() -> None:
    theirs, ours, peer = _both(num_blocks=12, max_num_seqs=6)
    seen: dict[str, list[tuple[str, int]]] = {"vllm": [], "tokenyard": []}
    for name, scheduler in (("vllm", theirs), ("tokenyard", ours)):
        original = scheduler._preempt_request

        def wrapped(
            request: Any, timestamp: float, *, _o: Any = original, _n: str = name, **kwargs: Any
        ) -> None:
            seen[_n].append((request.request_id, request.num_in_flight_tokens))
            _o(request, timestamp, **kwargs)

        scheduler._preempt_request = wrapped
    for i in range(5):
        for scheduler in (theirs, ours):
            scheduler.add_request(peer.make_request(f"r{i}", [i * 100 + j for j in range(30)], 40))
    for _ in range(400):
        outs = [scheduler.schedule() for scheduler in (theirs, ours)]
        assert set(outs[1].preempted_req_ids) == set(outs[0].preempted_req_ids)
        update_both((theirs, ours), outs)
        if not theirs.has_unfinished_requests():
            break
    assert seen["vllm"], "the cache is tight enough to preempt"
    assert seen["tokenyard"] == seen["vllm"]


def test_preempt_request_called_from_outside_preempts_as_vllms() -> None:
    """vLLM's tests call ``_preempt_request`` on a running request between ``schedule()``
    and ``update_from_output``: the core preempts it (blocks freed, back to waiting), the
    step's output is still delivered, and it resumes, as in vLLM."""
    theirs, ours, peer = _both(enable_prefix_caching=True)
    requests = add_both((theirs, ours), peer.make_request, "a", list(range(40)), 3)
    outs = [scheduler.schedule() for scheduler in (theirs, ours)]
    for scheduler, request in zip((theirs, ours), requests, strict=True):
        # As vLLM's tests do (its running list is its own; the adapter's a fresh copy).
        scheduler.running.remove(request)
        scheduler._preempt_request(request, 0.0)
    states = [
        (r.status, r.num_computed_tokens, r.num_stale_output_tokens, r.num_preemptions)
        for r in requests
    ]
    assert states[1] == states[0] == (RequestStatus.PREEMPTED, 0, 40, 1)
    assert _pool_state(ours) == _pool_state(theirs)
    assert _manager_state(ours) == _manager_state(theirs)
    # The step ran before the preemption: its sampled token comes back.
    sampled = ModelRunnerOutput(req_ids=["a"], req_id_to_index={"a": 0}, sampled_token_ids=[[7]])
    for scheduler, out in zip((theirs, ours), outs, strict=True):
        scheduler.update_from_output(out, sampled)
    assert [list(r.output_token_ids) for r in requests] == [[7], [7]]
    assert [r.num_stale_output_tokens for r in requests] == [0, 0]
    outs = [scheduler.schedule() for scheduler in (theirs, ours)]
    assert dict(outs[1].num_scheduled_tokens) == dict(outs[0].num_scheduled_tokens)
    assert [r.status for r in requests] == [RequestStatus.RUNNING] * 2
    ours.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    with pytest.raises(InputError) as info:
        ours._preempt_request(requests[1], 0.0)
    assert info.value.field == "request_id"


def test_num_in_flight_tokens_follow_vllms_accounting_under_async_scheduling() -> None:
    theirs, ours, peer = _both(async_scheduling=True)
    pairs = add_both((theirs, ours), peer.make_request, "a", list(range(100)), 5)
    counts: dict[str, list[int]] = {"vllm": [], "tokenyard": []}
    for name, scheduler, request in (("vllm", theirs, pairs[0]), ("tokenyard", ours, pairs[1])):
        out0 = scheduler.schedule()
        counts[name].append(request.num_in_flight_tokens)
        out1 = scheduler.schedule()
        counts[name].append(request.num_in_flight_tokens)
        scheduler.update_from_output(out0, runner_output(scheduler, out0))
        counts[name].append(request.num_in_flight_tokens)
        scheduler.update_from_output(out1, runner_output(scheduler, out1))
        counts[name].append(request.num_in_flight_tokens)
    assert counts["vllm"] == [64, 100, 36, 0]
    assert counts["tokenyard"] == counts["vllm"]


def test_forcing_the_free_block_count_above_the_queue_is_refused_by_name() -> None:
    # vLLM's tests set free_block_queue.num_free_blocks to force preemptions; the core
    # keeps the forced gap (tests/test_integrations_vllm_forced_free.py), and refuses a
    # count above the blocks its queue holds.
    theirs, ours, _ = _both()
    queue = ours.kv_cache_manager.block_pool.free_block_queue
    free = queue.num_free_blocks
    assert free == theirs.kv_cache_manager.block_pool.free_block_queue.num_free_blocks
    queue.num_free_blocks = free
    with pytest.raises(InputError, match="num_free_blocks") as err:
        queue.num_free_blocks = free + 1
    assert (err.value.field, err.value.value) == ("num_free_blocks", str(free + 1))
    assert queue.num_free_blocks == free
    queue.num_free_blocks = 0
    assert queue.num_free_blocks == 0
