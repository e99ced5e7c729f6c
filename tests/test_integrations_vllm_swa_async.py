"""tokenyard.integrations.vllm over a hybrid KV cache under async scheduling: a window
group (sliding window, chunked local attention) frees the blocks that left its window on
vLLM 0.33's processed-token basis, ``num_computed_tokens - num_in_flight_tokens``
(``KVCacheManager.allocate_slots``, ``vllm/v1/core/kv_cache_manager.py``), so a step in
flight that still reads a block keeps it. Each case runs vLLM's ``AsyncScheduler`` and
``AsyncTokenyardScheduler`` on the same configs, two steps in flight, and compares every
step's decisions and block ids, then the KV usage and every request's block tables right
after the step is scheduled (where the frees happen): full + sliding window, a lone
window, full + chunked local, a tight cache that preempts, and DeepSeek-V4.1's SWA
bounded-replay layout. Needs vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm_compare import (
    BLOCK_SIZE,
    Stream,
    add_both,
    block_digest,
    kv_groups,
    runner_output,
    sampling,
    seeded_arrivals,
)
from vllm_peer import VllmSchedulerPeer, bounded_replay_groups

from tokenyard.integrations.vllm import AsyncTokenyardScheduler


def _tables_agree(theirs: Any, ours: Any, step: int) -> int:
    """KV usage and every request's block tables equal; returns the tables holding vLLM's
    null block."""
    assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
    with_null = 0
    for request_id in ours.requests:
        table = ours.kv_cache_manager.get_block_ids(request_id)
        assert table == theirs.kv_cache_manager.get_block_ids(request_id), step
        with_null += any(0 in group for group in table)
    return with_null


def _run(
    kinds: tuple[str, ...] | list[Any],
    num_blocks: int,
    seed: int,
    *,
    arrivals: dict[str, Any] | None = None,
    **options: Any,
) -> Stream:
    """A seeded stream (shared prefixes, arrivals over the first steps; ``arrivals``
    overrides ``seeded_arrivals``' arguments) on both async schedulers over one KV cache
    config of ``kinds`` (or of these ``KVCacheGroupSpec``s); each step lands one step later
    (two in flight), or at once when it scheduled nothing. Returns what it exercised."""
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_model_len=512,
        max_num_seqs=options.pop("max_num_seqs", 4),
        max_num_batched_tokens=64,
        block_size=BLOCK_SIZE,
        **options,
    )
    # As `vllm serve --async-scheduling` sets it: two batches in flight
    # (`VllmConfig.max_concurrent_batches`), which a window group's admission cap counts
    # (`max_in_flight_tokens`) on both sides.
    peer.vllm_config.scheduler_config.async_scheduling = True
    groups = kv_groups(kinds) if isinstance(kinds, tuple) else kinds
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )
    theirs, ours = (
        peer.build(cls, kv_cache_config) for cls in (AsyncScheduler, AsyncTokenyardScheduler)
    )
    shape = {"tail_max": 120, "max_tokens": 40, "max_prompt": 400, **(arrivals or {})}
    stream = seeded_arrivals(random.Random(seed), **shape)
    seen = Stream()
    pending: list[tuple[Any, Any, set[str], set[str]]] = []
    for step in range(3000):
        for at, *args in stream:
            if at == step:
                add_both((theirs, ours), peer.make_request, *args)
        out_v, out_t = theirs.schedule(), ours.schedule()
        assert block_digest(out_t, replay=True) == block_digest(out_v, replay=True), step
        seen.preempted.extend(out_v.preempted_req_ids)
        seen.tables_with_null += _tables_agree(theirs, ours, step)
        pending.append((out_v, out_t, sampling(theirs, out_v), sampling(ours, out_t)))
        if len(pending) == 2 or not out_v.num_scheduled_tokens:
            old_v, old_t, sampling_v, sampling_t = pending.pop(0)
            assert sampling_t == sampling_v, step
            theirs.update_from_output(old_v, runner_output(theirs, old_v, sampling_v))
            ours.update_from_output(old_t, runner_output(ours, old_t, sampling_t))
            _tables_agree(theirs, ours, step)
        if step > 12 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            seen.steps = step
            return seen
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_async_full_and_sliding_window_groups_free_as_vllm_step_by_step(seed: int) -> None:
    # Before 2026-11-27 the core freed the window's blocks counting the step in flight:
    # a decode scheduled while the prefill was in flight dropped blocks vLLM keeps.
    assert _run(("full", "window32"), num_blocks=80, seed=seed).tables_with_null > 0


def test_async_lone_sliding_window_group_frees_as_vllm() -> None:
    assert _run(("window32",), num_blocks=40, seed=4).tables_with_null > 0


def test_async_full_and_chunked_local_groups_free_as_vllm() -> None:
    assert _run(("full", "chunk64"), num_blocks=80, seed=5).tables_with_null > 0


@pytest.mark.parametrize("seed", [2, 5, 6, 8])
def test_async_tight_hybrid_cache_preempts_as_vllm(seed: int) -> None:
    seen = _run(("full", "window32"), num_blocks=28, seed=seed, max_num_seqs=8)
    assert seen.preempted


@pytest.mark.parametrize("bounded_replay", [True, False])
@pytest.mark.parametrize("seed", [0, 4])
def test_async_swa_bounded_replay_layout_matches_vllm(seed: int, bounded_replay: bool) -> None:
    # DeepSeek-V4.1's layout (a full group beside a window-32 `SlidingWindowMLASpec`, with
    # bounded replay or as an ordinary cached window), prompts sharing prefixes shorter and
    # longer than the window: it differed from step 1-3 before the processed-token frees.
    groups = bounded_replay_groups(32, block_size=BLOCK_SIZE, bounded_replay=bounded_replay)
    shape = {
        "count": 10,
        "prefix_tokens": 160,
        "shared": (0, 16, 32, 40, 48, 64, 100, 160),
        "tail_max": 100,
        "arrive_by": 12,
        "lowest_token": 1,
    }
    assert _run(groups, num_blocks=200, seed=seed, arrivals=shape).tables_with_null > 0
