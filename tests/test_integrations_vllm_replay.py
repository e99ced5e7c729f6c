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
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

import torch
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowMLASpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.structured_output import StructuredOutputManager
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler

BLOCK_SIZE = 16
WINDOW = 32


def _groups(window: int = WINDOW, bounded_replay: bool = True) -> list[Any]:
    full = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    swa = SlidingWindowMLASpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=1,
        head_size=64,
        dtype=torch.bfloat16,
        sliding_window=window,
        bounded_replay=bounded_replay,
    )
    return [KVCacheGroupSpec(["full"], full), KVCacheGroupSpec(["swa"], swa)]


def _both(num_blocks: int, **options: Any) -> tuple[Any, Any, Any]:
    """vLLM's Scheduler and TokenyardScheduler over the replay layout, and the peer that
    makes requests (with vLLM's block hasher)."""
    config = {"max_num_seqs": 4, "max_num_batched_tokens": 64}
    config.update(options)
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks, max_model_len=512, block_size=BLOCK_SIZE, **config
    )
    schedulers = []
    for cls in (Scheduler, TokenyardScheduler):
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=_groups()
        )
        schedulers.append(
            cls(
                vllm_config=peer.vllm_config,
                kv_cache_config=kv_cache_config,
                structured_output_manager=StructuredOutputManager(peer.vllm_config),
                block_size=BLOCK_SIZE,
                hash_block_size=BLOCK_SIZE,
                log_stats=True,
            )
        )
    return schedulers[0], schedulers[1], peer


def _digest(out: Any) -> dict[str, Any]:
    cached = out.scheduled_cached_reqs
    return {
        "new": {
            r.req_id: (r.block_ids, r.num_computed_tokens, r.replay_start)
            for r in out.scheduled_new_reqs
        },
        "cached": dict(
            zip(
                cached.req_ids,
                zip(cached.new_block_ids, cached.num_computed_tokens, strict=True),
                strict=True,
            )
        ),
        "tokens": dict(out.num_scheduled_tokens),
        "preempted": set(out.preempted_req_ids),
        "finished": set(out.finished_req_ids),
    }


def _run(num_blocks: int, seed: int, max_tokens: int = 40, **options: Any) -> dict[str, int]:
    """A seeded stream (prompts sharing prefixes shorter and longer than the window,
    arrivals over the first steps) on both, every step compared. Returns what it exercised:
    admissions that replayed, and preemptions."""
    theirs, ours, peer = _both(num_blocks, **options)
    assert ours.prefix_replay_tokens == theirs.prefix_replay_tokens == WINDOW
    rng = random.Random(seed)
    prefix = [rng.randrange(1, 1000) for _ in range(160)]
    arrivals = []
    for i in range(10):
        tail = [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 100))]
        shared = rng.choice((0, 16, 32, 40, 48, 64, 100, 160))
        prompt = (prefix[:shared] + tail)[:400]
        arrivals.append((rng.randrange(12), f"r{i}", prompt, rng.randrange(1, max_tokens)))
    seen = {"replays": 0, "preemptions": 0}
    for step in range(3000):
        for at, request_id, prompt, max_tokens in arrivals:
            if at == step:
                for scheduler in (theirs, ours):
                    scheduler.add_request(peer.make_request(request_id, prompt, max_tokens))
        outs = [scheduler.schedule() for scheduler in (theirs, ours)]
        assert _digest(outs[1]) == _digest(outs[0]), f"step {step}"
        seen["replays"] += sum(r.replay_start > 0 for r in outs[0].scheduled_new_reqs)
        seen["preemptions"] += len(outs[0].preempted_req_ids)
        for scheduler, out in zip((theirs, ours), outs, strict=True):
            ids = list(out.num_scheduled_tokens)
            sampled = []
            for request_id in ids:
                request = scheduler.requests[request_id]
                # schedule() advanced num_computed_tokens past this step's tokens; outputs
                # are 7, never a prompt token (prompts draw from 1..999 but 7 may repeat:
                # both sides see the same tokens either way).
                sampled.append([7] if request.num_computed_tokens >= request.num_tokens else [])
            scheduler.update_from_output(
                out,
                ModelRunnerOutput(
                    req_ids=ids,
                    req_id_to_index={r: n for n, r in enumerate(ids)},
                    sampled_token_ids=sampled,
                ),
            )
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage())
        for request_id in ours.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == theirs.kv_cache_manager.get_block_ids(request_id), step
        if step > 12 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return seen
    raise AssertionError("the stream did not drain")


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
