"""tokenyard.integrations.vllm with SWA bounded replay: vLLM 0.33's layout of a
prefix-cached full-attention group beside a ``SlidingWindowMLASpec(bounded_replay=True)``
group that is never cached (DeepSeek-V4.1). After a prefix hit longer than the window, vLLM's
``Scheduler`` (``vllm/v1/core/sched/scheduler.py``: ``_mark_prefix_replay``) recomputes the
hit's last window, keeps the hit's blocks and hands the worker ``NewRequestData.replay_start``;
a hit no longer than the window is not adopted. Each case runs vLLM's ``Scheduler`` and
``TokenyardScheduler`` on the same configs and compares every step: scheduled tokens,
computed tokens, ``replay_start``, new and cached block ids per group, preemptions, KV usage
and every request's block tables. Needs vLLM (the bench venv, ``.venv-bench``); skipped
elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm_compare import BLOCK_SIZE, block_digest, build_pair, compare_stream, seeded_arrivals
from vllm_peer import VllmSchedulerPeer, bounded_replay_groups

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler

WINDOW = 32


def _groups(bounded_replay: bool = True) -> list[Any]:
    return bounded_replay_groups(WINDOW, block_size=BLOCK_SIZE, bounded_replay=bounded_replay)


def _run(num_blocks: int, seed: int, max_tokens: int = 40, **options: Any) -> dict[str, int]:
    """A seeded stream (prompts sharing prefixes shorter and longer than the window,
    arrivals over the first steps) on vLLM's Scheduler and TokenyardScheduler over the
    replay layout, every step compared (``replay_start`` included). Returns what it
    exercised: admissions that replayed, and preemptions. Prompts draw from 1..999 and
    outputs are 7, which may repeat a prompt token: both sides see the same tokens."""
    theirs, ours, peer = build_pair(num_blocks=num_blocks, groups=_groups(), **options)
    assert ours.prefix_replay_tokens == theirs.prefix_replay_tokens == WINDOW
    arrivals = seeded_arrivals(
        random.Random(seed),
        count=10,
        prefix_tokens=160,
        shared=(0, 16, 32, 40, 48, 64, 100, 160),
        tail_max=100,
        arrive_by=12,
        max_tokens=max_tokens,
        lowest_token=1,
        max_prompt=400,
    )
    replays = 0

    def count_replays(outs: list[Any]) -> None:
        nonlocal replays
        replays += sum(r.replay_start > 0 for r in outs[0].scheduled_new_reqs)

    seen = compare_stream(
        theirs,
        ours,
        arrivals,
        peer.make_request,
        digest=lambda out: block_digest(out, replay=True),
        settle_steps=12,
        on_scheduled=count_replays,
    )
    return {"replays": replays, "preemptions": len(seen.preempted)}


@pytest.mark.parametrize("seed", range(8))
def test_bounded_replay_matches_vllm_step_by_step(seed: int) -> None:
    assert _run(num_blocks=200, seed=seed)["replays"] > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_replay_only_chunks_match_vllm(seed: int) -> None:
    # A 16-token chunk cap below the 32-token window: the first chunks of a replaying
    # admission recompute only the hit's tail.
    seen = _run(num_blocks=200, seed=seed, long_prefill_token_threshold=16)
    assert seen["replays"] > 0


@pytest.mark.parametrize("seed", [3, 4])
def test_replay_only_chunks_reserve_lookahead_slots_as_vllm(seed: int) -> None:
    # Speculative decoding reserves lookahead slots at every allocation, a replay-only
    # chunk's included (vLLM: ``total_computed + num_tokens_past_hit + lookahead``).
    seen = _run(
        num_blocks=200, seed=seed, long_prefill_token_threshold=16, num_speculative_tokens=2
    )
    assert seen["replays"] > 0


@pytest.mark.parametrize("seed", [2, 5])
def test_a_tight_replay_cache_preempts_as_vllm_does(seed: int) -> None:
    seen = _run(num_blocks=40, seed=seed, max_tokens=150, max_num_seqs=8)
    assert seen["preemptions"] > 0


def test_the_replay_group_maps_to_the_cores_replayed_window() -> None:
    peer = VllmSchedulerPeer(
        num_blocks=40, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512
    )
    ours = TokenyardScheduler(
        vllm_config=peer.vllm_config,
        kv_cache_config=KVCacheConfig(
            num_blocks=40, kv_cache_tensors=[], kv_cache_groups=_groups()
        ),
        structured_output_manager=None,
        block_size=BLOCK_SIZE,
    )
    assert (ours.prefix_replay_tokens, ours.prefix_replay_group_ids) == (WINDOW, (1,))
    # Without bounded replay the MLA window is an ordinary, cached window group.
    plain = TokenyardScheduler(
        vllm_config=peer.vllm_config,
        kv_cache_config=KVCacheConfig(
            num_blocks=40, kv_cache_tensors=[], kv_cache_groups=_groups(bounded_replay=False)
        ),
        structured_output_manager=None,
        block_size=BLOCK_SIZE,
    )
    assert (plain.prefix_replay_tokens, plain.prefix_replay_group_ids) == (0, ())


def test_replay_windows_that_disagree_are_refused() -> None:
    from tokenyard.kv import FullAttentionSpec as CoreFull
    from tokenyard.kv import SlidingWindowSpec
    from tokenyard.sched import Scheduler as CoreScheduler
    from tokenyard.sched import SchedulerConfig

    groups = (
        CoreFull(),
        SlidingWindowSpec(sliding_window=32, bounded_replay=True),
        SlidingWindowSpec(sliding_window=64, bounded_replay=True),
    )
    with pytest.raises(ConfigError) as info:
        CoreScheduler(SchedulerConfig(kv_groups=groups, num_blocks=100, block_size=16))
    assert info.value.field == "kv_groups"
