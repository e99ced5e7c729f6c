"""tokenyard.integrations.vllm with a forced free-block count: vLLM's tests set
``block_pool.free_block_queue.num_free_blocks`` (to 0, to force a preemption). vLLM's
``FreeKVCacheBlockQueue`` (``vllm/v1/core/kv_cache_utils.py``) keeps its free blocks linked
in order while ``num_free_blocks`` is a counter every pop, removal and append moves with
the list; ``BlockPool.get_num_free_blocks`` (``vllm/v1/core/block_pool.py``) reads the
counter, and so do ``get_new_blocks``, ``get_usage`` and ``KVCacheManager.allocate_slots``.
Each case forces the count mid-stream on vLLM's ``Scheduler`` and on
``TokenyardScheduler`` alike, later lifts it back to the queue's length, and compares every
step: scheduled tokens, new and cached block ids per group, preemptions, KV usage, the
free count and every request's block tables. Needs vLLM (the bench venv); skipped
elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm_compare import build_pair, compare_stream, kv_groups, seeded_arrivals

from tokenyard.errors import InputError


def _queue(scheduler: Any) -> Any:
    return scheduler.kv_cache_manager.block_pool.free_block_queue


def _run(seed: int, *, groups: list[Any] | None = None, both: bool = True) -> dict[str, int]:
    """A seeded stream with the count forced at a seeded step to a seeded value (0 half
    the time) on vLLM's side, and on the adapter's unless ``both`` is False, lifted back to
    the queue's length a few steps later. Returns the preemptions seen."""
    rng = random.Random(seed)
    theirs, ours, peer = build_pair(num_blocks=64, groups=groups)
    arrivals = seeded_arrivals(
        rng, count=8, prefix_tokens=48, tail_max=120, arrive_by=6, max_tokens=40
    )
    force_at = rng.randrange(2, 10)
    lift_at = force_at + rng.randrange(1, 8)
    zero = rng.random() < 0.5
    step = 0

    def force(outs: list[Any]) -> None:
        nonlocal step
        theirs_queue, ours_queue = _queue(theirs), _queue(ours)
        assert ours_queue.num_free_blocks == theirs_queue.num_free_blocks, step
        assert [b.block_id for b in ours_queue.get_all_free_blocks()] == [
            b.block_id for b in theirs_queue.get_all_free_blocks()
        ], step
        if step == force_at:
            value = 0 if zero else rng.randint(0, theirs_queue.num_free_blocks)
            theirs_queue.num_free_blocks = value
            if both:
                ours_queue.num_free_blocks = value
        elif step == lift_at:
            value = len(theirs_queue.get_all_free_blocks())
            theirs_queue.num_free_blocks = value
            if both:
                ours_queue.num_free_blocks = value
        step += 1

    seen = compare_stream(theirs, ours, arrivals, peer.make_request, on_scheduled=force)
    return {"preemptions": len(seen.preempted)}


@pytest.mark.parametrize("seed", range(12))
def test_forced_free_count_matches_vllm_step_by_step(seed: int) -> None:
    _run(seed)


@pytest.mark.parametrize("seed", range(4))
def test_forced_free_count_matches_vllm_with_two_groups(seed: int) -> None:
    _run(seed, groups=kv_groups(["full", "window32"]))


def test_forcing_the_count_preempts_on_both_sides() -> None:
    # Across the seeds the forced count must bite: some stream preempts.
    assert sum(_run(seed)["preemptions"] for seed in range(12)) > 0


def test_forcing_only_vllm_makes_the_check_fail() -> None:
    """The check can fail: forcing vLLM's count alone differs at some step."""
    failed = 0
    for seed in range(12):
        try:
            _run(seed, both=False)
        except AssertionError:
            failed += 1
    assert failed > 0


@pytest.mark.parametrize("value", [-1, 1000, 2.0, True, "0"])
def test_a_negative_too_large_or_non_int_count_is_refused_by_name(value: Any) -> None:
    _, ours, _ = build_pair(num_blocks=64)
    with pytest.raises(InputError) as err:
        _queue(ours).num_free_blocks = value
    assert err.value.field == "num_free_blocks"
    assert _queue(ours).num_free_blocks == 63
