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
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.structured_output import StructuredOutputManager
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import TokenyardScheduler

BLOCK_SIZE = 16


def _spec(kind: str) -> Any:
    common = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    if kind == "full":
        return FullAttentionSpec(**common)
    return SlidingWindowSpec(**common, sliding_window=int(kind[len("window") :]))


def _both(
    kinds: tuple[str, ...], num_blocks: int, eagle: bool, lookahead: int = 0, **options: Any
) -> tuple[Any, ...]:
    """vLLM's Scheduler and TokenyardScheduler with the split on, or with ``lookahead`` as
    the drafter's prefill look-ahead instead (with both, a chunk the split ends on a
    boundary within the look-ahead of the prompt's end shrinks to 0 and the request stalls,
    in vLLM 0.33 as here), and the request maker."""
    config = {"max_num_seqs": 4, "max_num_batched_tokens": 40}
    config.update(options)
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks, max_model_len=512, block_size=BLOCK_SIZE, **config
    )
    schedulers = []
    for cls in (Scheduler, TokenyardScheduler):
        groups = [KVCacheGroupSpec([f"layers.{i}"], _spec(k)) for i, k in enumerate(kinds)]
        scheduler = cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=KVCacheConfig(
                num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
            ),
            structured_output_manager=StructuredOutputManager(peer.vllm_config),
            block_size=BLOCK_SIZE,
            hash_block_size=BLOCK_SIZE,
            log_stats=True,
        )
        scheduler.need_mamba_block_aligned_split = not lookahead
        scheduler.use_eagle_block_drop = eagle
        scheduler.num_prefill_lookahead = lookahead
        schedulers.append(scheduler)
    return schedulers[0], schedulers[1], peer


def _digest(out: Any) -> dict[str, Any]:
    cached = out.scheduled_cached_reqs
    return {
        "new": {r.req_id: (r.block_ids, r.num_computed_tokens) for r in out.scheduled_new_reqs},
        "cached": dict(
            zip(
                cached.req_ids,
                zip(cached.new_block_ids, cached.num_computed_tokens, strict=True),
                strict=True,
            )
        ),
        "tokens": dict(out.num_scheduled_tokens),
        "preempted": set(out.preempted_req_ids),
    }


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
    rng = random.Random(seed)
    prefix = [rng.randrange(1000) for _ in range(64)]
    arrivals = []
    for i in range(8):
        tail = [rng.randrange(1000) for _ in range(rng.randrange(1, 150))]
        prompt = (prefix[: rng.choice((0, 16, 40, 64))] + tail)[:400]
        arrivals.append((rng.randrange(6), f"r{i}", prompt, rng.randrange(1, 30)))
    clipped = 0
    for step in range(3000):
        for at, request_id, prompt, max_tokens in arrivals:
            if at == step:
                for scheduler in (theirs, ours):
                    scheduler.add_request(peer.make_request(request_id, prompt, max_tokens))
        outs = [scheduler.schedule() for scheduler in (theirs, ours)]
        assert _digest(outs[1]) == _digest(outs[0]), f"step {step}"
        budget_left = options.get("max_num_batched_tokens", 40) - outs[0].total_num_scheduled_tokens
        for scheduler, out in zip((theirs, ours), outs, strict=True):
            ids = list(out.num_scheduled_tokens)
            sampled = []
            for request_id in ids:
                request = scheduler.requests[request_id]
                done = request.num_computed_tokens >= request.num_tokens
                if scheduler is theirs and not done and budget_left > 0:
                    clipped += 1
                sampled.append([7] if done else [])
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
            assert table == theirs.kv_cache_manager.get_block_ids(request_id)
        if step > 6 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return clipped
    raise AssertionError("the stream did not drain")


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
