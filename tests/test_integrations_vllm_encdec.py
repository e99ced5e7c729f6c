"""tokenyard.integrations.vllm for an encoder-decoder model (Whisper's layout): a
``CrossAttentionSpec`` KV group beside full attention becomes the core's
``CrossAttentionSpec`` group, and with ``is_encoder_decoder`` set the core encodes a
request's items with its first decoder tokens, gives it ``ceil(encoder tokens / block)``
cross-attention blocks and counts its encoder inputs as vLLM 0.33's
``EncoderDecoderCacheManager`` does (``vllm/v1/core/sched/scheduler.py``,
``_try_schedule_encoder_inputs`` and ``_free_encoder_inputs``;
``single_type_kv_cache_manager.py``, ``CrossAttentionManager``). Each case runs vLLM's
``Scheduler`` and ``TokenyardScheduler`` patched as vLLM's own tests patch it
(``_create_encoder_decoder_scheduler`` in ``tests/v1/core/test_scheduler.py``) and compares
every step. Needs vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager, EncoderDecoderCacheManager
from vllm.v1.core.single_type_kv_cache_manager import CrossAttentionManager
from vllm.v1.kv_cache_interface import CrossAttentionSpec, KVCacheGroupSpec
from vllm_compare import (
    BLOCK_SIZE,
    attention_spec,
    block_digest,
    build_pair,
    compare_stream,
    encoder_digest,
    image_request,
)

from tokenyard.errors import ConfigError, InputError


def _groups() -> list[Any]:
    cross = CrossAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float16
    )
    return [
        KVCacheGroupSpec(["self_attn"], attention_spec("full")),
        KVCacheGroupSpec(["cross_attn"], cross),
    ]


def _patch(scheduler: Any, budget: int, cache: int) -> None:
    """What vLLM's ``_create_encoder_decoder_scheduler`` does to a built scheduler."""
    scheduler.is_encoder_decoder = True
    scheduler.max_num_encoder_input_tokens = budget
    scheduler.encoder_cache_manager = EncoderDecoderCacheManager(cache_size=cache)


def _pair(num_blocks: int, budget: int, cache: int, **options: Any) -> tuple[Any, Any, Any]:
    theirs, ours, peer = build_pair(
        num_blocks=num_blocks, groups=_groups(), enable_prefix_caching=False, **options
    )
    for scheduler in (theirs, ours):
        _patch(scheduler, budget, cache)
    return theirs, ours, peer


def _cross_blocks(scheduler: Any, request_id: str) -> int:
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    (cross,) = [m for m in managers if isinstance(m, CrossAttentionManager)]
    return len(cross.req_to_blocks.get(request_id, []))


def _audio_arrivals(rng: random.Random, count: int) -> list[tuple[Any, ...]]:
    """``count`` requests: a decoder prompt of 4 to 60 tokens and, for most, one encoder
    input at offset 0 of 1 to 400 tokens (longer than the prompt, as Whisper's is)."""
    arrivals = []
    for i in range(count):
        prompt = [rng.randrange(1000) for _ in range(rng.randrange(4, 60))]
        items = [(0, rng.randrange(1, 400), f"audio{i}")] if rng.random() < 0.8 else []
        arrivals.append((rng.randrange(6), f"r{i}", prompt, items, rng.randrange(1, 20)))
    return arrivals


def _run(seed: int, num_blocks: int, budget: int, cache: int) -> tuple[int, int]:
    """A seeded stream on both schedulers, every step's decisions, block tables (both
    groups), encoder inputs, freed identifiers and encoder counter compared. Returns the
    encoder inputs scheduled and vLLM's preemptions."""
    theirs, ours, peer = _pair(num_blocks, budget, cache, max_num_seqs=6, max_model_len=256)
    encoded = 0

    def digest(out: Any) -> dict[str, Any]:
        return {**block_digest(out), **encoder_digest(out)}

    def check(outs: list[Any]) -> None:
        nonlocal encoded
        encoded += len(outs[0].scheduled_encoder_inputs)
        counters = [s.encoder_cache_manager.num_free_slots for s in (theirs, ours)]
        assert counters[1] == counters[0]

    stream = compare_stream(
        theirs,
        ours,
        _audio_arrivals(random.Random(seed), 12),
        lambda request_id, *args: image_request(peer._block_hasher, request_id, *args),
        digest=digest,
        on_scheduled=check,
        max_steps=600,
    )
    return encoded, len(stream.preempted)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_encoder_decoder_streams_match_vllm_step_by_step(seed: int) -> None:
    assert _run(seed, num_blocks=400, budget=2048, cache=2048)[0] > 0


@pytest.mark.parametrize("seed", [3, 5])
def test_a_tight_encoder_budget_and_kv_cache_match_vllm(seed: int) -> None:
    # Budget 400 embeddings a step and 50 blocks: requests wait for the encoder and for
    # KV (the full-sequence gate counts their cross-attention blocks); some are preempted
    # and encode again when readmitted.
    encoded, preempted = _run(seed, num_blocks=50, budget=400, cache=500)
    assert encoded > 0
    assert preempted > 0


def test_cross_attention_blocks_are_sized_by_the_encoder_input() -> None:
    theirs, ours, peer = _pair(num_blocks=400, budget=2048, cache=2048, max_model_len=256)
    lengths = {"a": 500, "b": 17, "c": 0}
    for scheduler in (theirs, ours):
        for request_id, n in lengths.items():
            items = [(0, n, f"enc-{request_id}")] if n else []
            scheduler.add_request(image_request(peer._block_hasher, request_id, [1] * 40, items, 4))
        scheduler.schedule()
        for request_id, n in lengths.items():
            assert _cross_blocks(scheduler, request_id) == math.ceil(n / BLOCK_SIZE)


def test_the_encoder_cache_manager_must_match_the_mode() -> None:
    _, ours, _ = build_pair(num_blocks=100, groups=_groups(), enable_prefix_caching=False)
    with pytest.raises(ConfigError) as info:
        ours.encoder_cache_manager = EncoderDecoderCacheManager(cache_size=100)
    assert info.value.field == "encoder_cache_manager"
    ours.is_encoder_decoder = True
    with pytest.raises(ConfigError):
        ours.encoder_cache_manager = EncoderCacheManager(cache_size=100)
    ours.encoder_cache_manager = EncoderDecoderCacheManager(cache_size=100)
    assert ours.encoder_cache_manager.cache_size == 100


def test_the_mode_cannot_change_under_a_request_with_items() -> None:
    _, ours, peer = _pair(num_blocks=100, budget=512, cache=512)
    ours.add_request(image_request(peer._block_hasher, "a", [1] * 8, [(0, 50, "x")], 2))
    with pytest.raises(InputError) as info:
        ours.is_encoder_decoder = False
    assert info.value.field == "is_encoder_decoder"
