"""tokenyard.integrations.vllm over a hybrid KV cache: vLLM 0.33's ``kv_cache_groups`` (a
full-attention group beside a sliding-window or chunked local one, a lone sliding-window
group) become the core's ``kv_groups``, and each step's ``block_ids`` tuples (one list per
group, vLLM's null block 0 where a group no longer attends) are vLLM's own. Each case runs
vLLM's ``Scheduler`` (``vllm/v1/core/sched/scheduler.py``) and ``TokenyardScheduler`` on the
same ``VllmConfig`` and ``KVCacheConfig`` and compares every step. Needs vLLM (the bench
venv, ``.venv-bench``); skipped elsewhere.
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
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.structured_output import StructuredOutputManager
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler

BLOCK_SIZE = 16


def _spec(kind: str) -> Any:
    common = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    if kind == "full":
        return FullAttentionSpec(**common)
    if kind.startswith("window"):
        return SlidingWindowSpec(**common, sliding_window=int(kind[len("window") :]))
    if kind.startswith("chunk"):
        return ChunkedLocalAttentionSpec(**common, attention_chunk_size=int(kind[len("chunk") :]))
    raise AssertionError(kind)


def _both(kinds: tuple[str, ...], num_blocks: int, **options: Any) -> tuple[Any, Any, Any]:
    """vLLM's Scheduler and TokenyardScheduler over one hybrid KV cache config, and the
    peer that makes requests (with vLLM's block hasher)."""
    config = {"max_num_seqs": 4, "max_num_batched_tokens": 64}
    config.update(options)
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks, max_model_len=512, block_size=BLOCK_SIZE, **config
    )
    schedulers = []
    for cls in (Scheduler, TokenyardScheduler):
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec([f"layers.{i}.attn"], _spec(kind)) for i, kind in enumerate(kinds)
            ],
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
        "finished": set(out.finished_req_ids),
    }


#: The requests vLLM preempted in the last _run, in order (tokenyard's matched them).
preemptions: list[str] = []


def _run(
    kinds: tuple[str, ...], num_blocks: int, seed: int, max_tokens: int = 40, **options: Any
) -> int:
    """A seeded stream (shared prefixes, arrivals over the first steps) on both; every
    step's digest, KV usage and block tables compared. Returns how many tables (request
    by step) held a null block: a group that stopped attending to some of its blocks."""
    ours_vllm, ours, peer = _both(kinds, num_blocks, **options)
    rng = random.Random(seed)
    prefix = [rng.randrange(1000) for _ in range(48)]
    arrivals = []
    for i in range(8):
        tail = [rng.randrange(1000) for _ in range(rng.randrange(1, 120))]
        prompt = (prefix[: rng.choice((0, 16, 48))] + tail)[:400]
        arrivals.append((rng.randrange(6), f"r{i}", prompt, rng.randrange(1, max_tokens)))
    with_nulls = 0
    preemptions.clear()
    for step in range(3000):
        for at, request_id, prompt, max_tokens in arrivals:
            if at == step:
                for scheduler in (ours_vllm, ours):
                    scheduler.add_request(peer.make_request(request_id, prompt, max_tokens))
        outs = [scheduler.schedule() for scheduler in (ours_vllm, ours)]
        assert _digest(outs[1]) == _digest(outs[0]), f"step {step}"
        preemptions.extend(outs[0].preempted_req_ids)
        for scheduler, out in zip((ours_vllm, ours), outs, strict=True):
            ids = list(out.num_scheduled_tokens)
            sampled = []
            for request_id in ids:
                request = scheduler.requests[request_id]
                # schedule() advanced num_computed_tokens past this step's tokens.
                sampled.append([7] if request.num_computed_tokens >= request.num_tokens else [])
            scheduler.update_from_output(
                out,
                ModelRunnerOutput(
                    req_ids=ids,
                    req_id_to_index={r: n for n, r in enumerate(ids)},
                    sampled_token_ids=sampled,
                ),
            )
        assert ours.get_kv_cache_usage() == pytest.approx(ours_vllm.get_kv_cache_usage())
        for request_id in ours.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == ours_vllm.kv_cache_manager.get_block_ids(request_id)
            with_nulls += any(0 in group for group in table)
        if step > 6 and not ours_vllm.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return with_nulls
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_and_sliding_window_groups_match_vllm_step_by_step(seed: int) -> None:
    assert _run(("full", "window32"), num_blocks=80, seed=seed) > 0


@pytest.mark.parametrize("seed", [3, 6])
def test_a_tight_hybrid_cache_preempts_as_vllm_does(seed: int) -> None:
    _run(("full", "window32"), num_blocks=28, seed=seed, max_tokens=150, max_num_seqs=8)
    assert preemptions


def test_a_lone_sliding_window_group_frees_blocks_out_of_the_window_as_vllm() -> None:
    assert _run(("window32",), num_blocks=40, seed=4) > 0


def test_full_and_chunked_local_groups_match_vllm() -> None:
    assert _run(("full", "chunk64"), num_blocks=80, seed=5) > 0


def test_a_group_kind_the_core_has_none_for_is_refused_by_name() -> None:
    from vllm.v1.kv_cache_interface import CrossAttentionSpec

    peer = VllmSchedulerPeer(
        num_blocks=40, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512
    )
    spec = CrossAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=40,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["layers.0.attn"], _spec("full")),
            KVCacheGroupSpec(["layers.1.attn"], spec),
        ],
    )
    with pytest.raises(ConfigError) as info:
        TokenyardScheduler(
            vllm_config=peer.vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=None,
            block_size=BLOCK_SIZE,
        )
    assert info.value.field == "kv_cache_groups[1].kv_cache_spec"
    assert info.value.value == "CrossAttentionSpec"
