"""tokenyard.integrations.vllm with multimodal requests: vLLM's ``mm_features`` go to the
core with the encoder budget and cache size vLLM 0.33's ``Scheduler.__init__`` takes from
``MultiModalBudget``, and each step's ``scheduled_encoder_inputs`` and
``free_encoder_mm_hashes`` are vLLM's. Each case runs vLLM's ``Scheduler``
(``vllm/v1/core/sched/scheduler.py``, ``_try_schedule_encoder_inputs``) and
``TokenyardScheduler`` on the same configs, with the stub model made multimodal and
``MultiModalBudget`` giving both the same budget, and compares every step. Needs vLLM (the
bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.v1.request import Request
from vllm_compare import (
    Budget,
    build_pair,
    compare_stream,
    encoder_digest,
    image_arrivals,
    image_request,
    make_multimodal,
    runner_output,
)

from tokenyard.errors import InputError


@pytest.fixture
def multimodal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub model takes images; both schedulers get ``vllm_compare.Budget``."""
    make_multimodal(monkeypatch)


def _both(
    budget: int, cache: int, prefix_caching: bool = True, **options: Any
) -> tuple[Any, Any, Any]:
    Budget.compute, Budget.cache = budget, cache
    config = {"max_num_batched_tokens": 256, "num_blocks": 200, **options}
    return build_pair(max_model_len=1024, enable_prefix_caching=prefix_caching, **config)


def _request(peer: Any, request_id: str, prompt: list[int], items: list[Any], n: int) -> Request:
    return image_request(peer._block_hasher, request_id, prompt, items, n)


def _digest(out: Any) -> dict[str, Any]:
    return {
        **encoder_digest(out),
        "new": {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs},
    }


def _run(seed: int, budget: int, cache: int, **options: Any) -> tuple[int, int]:
    """A seeded stream of image requests (one placeholder id for every image, some images
    shared between requests) on both schedulers, every step compared. Returns the encoder
    inputs scheduled and the identifiers freed, over the stream."""
    theirs, ours, peer = _both(budget, cache, **options)
    arrivals = image_arrivals(random.Random(seed), count=10, images=5, max_tokens=30)
    encoded = freed = 0

    def count(outs: list[Any]) -> None:
        nonlocal encoded, freed
        encoded += sum(len(v) for v in outs[0].scheduled_encoder_inputs.values())
        freed += len(outs[0].free_encoder_mm_hashes)

    compare_stream(
        theirs,
        ours,
        arrivals,
        lambda *args: _request(peer, *args),
        digest=_digest,
        settle_steps=8,
        max_steps=1000,
        check_kv=False,
        on_scheduled=count,
    )
    return encoded, freed


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_image_requests_match_vllm_with_a_roomy_encoder(seed: int) -> None:
    encoded, _ = _run(seed, budget=1024, cache=2048)
    assert encoded > 0


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", [3, 4])
def test_a_tight_encoder_budget_and_cache_stop_tokens_and_evict_as_vllm(seed: int) -> None:
    encoded, freed = _run(seed, budget=160, cache=300)
    assert encoded > 0
    assert freed > 0


@pytest.mark.usefixtures("multimodal")
def test_without_prefix_caching_too() -> None:
    assert _run(5, budget=300, cache=600, prefix_caching=False)[0] > 0


@pytest.mark.usefixtures("multimodal")
def test_two_images_behind_one_placeholder_id_share_no_prefix_blocks() -> None:
    """Same tokens, different images: vLLM keys blocks by the items they hold, so the
    second request finds no hit past the text before the image; nor does the adapter."""
    ours_vllm, ours, peer = _both(1024, 2048)
    prompt = list(range(32)) + [32000] * 64 + list(range(40, 56))
    for n, image in enumerate(("cat", "dog")):
        for scheduler in (ours_vllm, ours):
            scheduler.add_request(_request(peer, f"r{n}", prompt, [(32, 64, image)], 1))
            out = scheduler.schedule()
            every = set(out.num_scheduled_tokens)
            scheduler.update_from_output(out, runner_output(scheduler, out, samples=every))
    probe = _request(peer, "probe", prompt, [(32, 64, "bird")], 1)
    hit = ours.kv_cache_manager.get_computed_blocks(probe)[1]
    assert hit == ours_vllm.kv_cache_manager.get_computed_blocks(probe)[1] == 32
    same = _request(peer, "again", prompt, [(32, 64, "cat")], 1)
    hit = ours.kv_cache_manager.get_computed_blocks(same)[1]
    assert hit == ours_vllm.kv_cache_manager.get_computed_blocks(same)[1] == 96


def test_a_text_only_model_refuses_images_by_name() -> None:
    _, ours, peer = _both(0, 0)
    with pytest.raises(InputError) as info:
        ours.add_request(_request(peer, "a", [1] * 64, [(8, 16, "img")], 1))
    assert info.value.field == "mm_features"
