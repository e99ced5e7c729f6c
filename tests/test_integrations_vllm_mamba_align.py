"""tokenyard.integrations.vllm with vLLM 0.33's Mamba ``align`` split on
(``Scheduler.need_mamba_block_aligned_split``; ``_mamba_block_aligned_split``,
``vllm/v1/core/sched/scheduler.py``): prefill chunks end on block boundaries and stop at
the last reusable state. Each case runs vLLM's ``Scheduler`` and ``TokenyardScheduler`` on
the same config with the split switched on (as vLLM's own tests switch it on a built
scheduler) and compares every step: scheduled tokens, block tuples, preemptions, KV usage
and block tables. Needs vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm_compare import (
    BLOCK_SIZE,
    block_digest,
    build_pair,
    compare_stream,
    kv_groups,
    sampling,
    seeded_arrivals,
)


def _both(
    kinds: tuple[str, ...], num_blocks: int, eagle: bool, lookahead: int = 0, **options: Any
) -> tuple[Any, ...]:
    """vLLM's Scheduler and TokenyardScheduler with the split on, or with ``lookahead`` as
    the drafter's prefill look-ahead instead (with both, a chunk the split ends on a
    boundary within the look-ahead of the prompt's end shrinks to 0 and the request stalls,
    in vLLM 0.33 as here), and the request maker."""
    config = {"max_num_batched_tokens": 40, **options}
    theirs, ours, peer = build_pair(
        num_blocks=num_blocks, groups=kv_groups(kinds, layer="layers.{}"), **config
    )
    for scheduler in (theirs, ours):
        scheduler.need_mamba_block_aligned_split = not lookahead
        scheduler.use_eagle_block_drop = eagle
        scheduler.num_prefill_lookahead = lookahead
    return theirs, ours, peer


def _run(
    seed: int,
    kinds: tuple[str, ...] = ("full",),
    num_blocks: int = 120,
    eagle: bool = False,
    lookahead: int = 0,
    **options: Any,
) -> int:
    """A seeded stream (shared prefixes, arrivals over the first steps) on both, compared
    step by step. Returns how many chunks vLLM ended off its natural length (the split
    clipped them): a stream where the split never acts proves nothing."""
    theirs, ours, peer = _both(kinds, num_blocks, eagle, lookahead, **options)
    arrivals = seeded_arrivals(
        random.Random(seed),
        prefix_tokens=64,
        shared=(0, 16, 40, 64),
        tail_max=150,
        max_tokens=30,
        max_prompt=400,
    )
    clipped = 0

    def count_clipped(outs: list[Any]) -> None:
        # A chunk that does not reach its request's known tokens while the step's budget
        # has room left: the split ended it.
        nonlocal clipped
        budget_left = options.get("max_num_batched_tokens", 40) - outs[0].total_num_scheduled_tokens
        if budget_left > 0:
            clipped += len(set(outs[0].num_scheduled_tokens) - sampling(theirs, outs[0]))

    compare_stream(
        theirs,
        ours,
        arrivals,
        peer.make_request,
        digest=lambda out: block_digest(out, finished=False),
        on_scheduled=count_clipped,
    )
    return clipped


@pytest.mark.parametrize("seed", range(6))
def test_aligned_chunks_match_vllm_step_by_step(seed: int) -> None:
    assert _run(seed) > 0


@pytest.mark.parametrize("seed", range(3))
def test_eagle_block_drop_moves_the_last_stop_as_in_vllm(seed: int) -> None:
    assert _run(seed, eagle=True) > 0


@pytest.mark.parametrize("seed", range(2))
def test_a_long_prefill_threshold_and_a_tight_cache_match_vllm(seed: int) -> None:
    _run(seed, num_blocks=30, long_prefill_token_threshold=24, max_num_seqs=6)


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_the_drafter_prefill_lookahead_matches_vllm(seed: int) -> None:
    # vLLM 0.33's _reserve_prefill_lookahead, set on a built scheduler as its tests set it;
    # the split off (see _both).
    assert _run(seed, lookahead=17) > 0


def test_a_hybrid_cache_with_the_split_matches_vllm() -> None:
    assert _run(7, kinds=("full", "window32")) > 0


def test_the_split_is_off_by_default_and_switches_the_core() -> None:
    _, ours, _ = _both(("full",), 40, eagle=False)
    assert ours._core.mamba_align == (BLOCK_SIZE, False, 0)
    ours.need_mamba_block_aligned_split = False
    assert ours._core.mamba_align is None
    assert not ours.need_mamba_block_aligned_split
