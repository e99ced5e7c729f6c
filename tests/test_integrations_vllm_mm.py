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
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

import vllm.v1.core.sched.scheduler as vllm_scheduler_module
from vllm.config import ModelConfig
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm_peer import VllmSchedulerPeer

import tokenyard.integrations.vllm as adapter_module
from tokenyard.errors import InputError
from tokenyard.integrations.vllm import TokenyardScheduler

BLOCK_SIZE = 16


class _Budget:
    """``MultiModalBudget`` as compute_mm_encoder_budget leaves it for a model whose
    largest item fits both (the numbers are the test's)."""

    compute = 0
    cache = 0

    def __init__(self, vllm_config: Any, mm_registry: Any) -> None:
        self.encoder_compute_budget = _Budget.compute
        self.encoder_cache_size = _Budget.cache


@pytest.fixture
def multimodal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub model takes images; both schedulers get ``_Budget``."""
    monkeypatch.setattr(ModelConfig, "supports_multimodal_inputs", property(lambda self: True))
    monkeypatch.setattr(vllm_scheduler_module, "MultiModalBudget", _Budget)
    monkeypatch.setattr(adapter_module, "MultiModalBudget", _Budget)


def _both(
    budget: int, cache: int, prefix_caching: bool = True, **options: Any
) -> tuple[Any, Any, Any]:
    _Budget.compute, _Budget.cache = budget, cache
    config = {"max_num_seqs": 4, "max_num_batched_tokens": 256, "num_blocks": 200}
    config.update(options)
    peer = VllmSchedulerPeer(
        max_model_len=1024, block_size=BLOCK_SIZE, enable_prefix_caching=prefix_caching, **config
    )
    schedulers = [
        cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=peer.scheduler.kv_cache_config,
            structured_output_manager=StructuredOutputManager(peer.vllm_config),
            block_size=BLOCK_SIZE,
            hash_block_size=BLOCK_SIZE,
            log_stats=True,
        )
        for cls in (Scheduler, TokenyardScheduler)
    ]
    return schedulers[0], schedulers[1], peer


def _request(peer: Any, request_id: str, prompt: list[int], items: list[Any], n: int) -> Request:
    features = [
        MultiModalFeatureSpec(
            data=None,
            modality="image",
            identifier=identifier,
            mm_position=PlaceholderRange(offset=offset, length=length),
        )
        for offset, length, identifier in items
    ]
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=n),
        pooling_params=None,
        mm_features=features or None,
        block_hasher=peer._block_hasher,
    )


def _run(seed: int, budget: int, cache: int, **options: Any) -> tuple[int, int]:
    """A seeded stream of image requests (one placeholder id for every image, some images
    shared between requests) on both schedulers, every step compared. Returns the encoder
    inputs scheduled and the identifiers freed, over the stream."""
    ours_vllm, ours, peer = _both(budget, cache, **options)
    rng = random.Random(seed)
    image_token = 32000
    arrivals = []
    for i in range(10):
        text = [rng.randrange(1000) for _ in range(rng.randrange(4, 40))]
        prompt, items = list(text), []
        for _ in range(rng.randrange(0, 3)):
            length = rng.choice((48, 96, 144))
            items.append((len(prompt), length, f"img{rng.randrange(5)}-{length}"))
            prompt += [image_token] * length + [rng.randrange(1000) for _ in range(8)]
        arrivals.append((rng.randrange(8), f"r{i}", prompt, items, rng.randrange(1, 30)))
    encoded = freed = 0
    for step in range(1000):
        for at, request_id, prompt, items, n in arrivals:
            if at == step:
                for scheduler in (ours_vllm, ours):
                    scheduler.add_request(_request(peer, request_id, prompt, items, n))
        outs = [scheduler.schedule() for scheduler in (ours_vllm, ours)]
        theirs, mine = outs
        assert dict(mine.num_scheduled_tokens) == dict(theirs.num_scheduled_tokens), step
        assert mine.scheduled_encoder_inputs == theirs.scheduled_encoder_inputs, step
        assert sorted(mine.free_encoder_mm_hashes) == sorted(theirs.free_encoder_mm_hashes), step
        assert mine.encoder_input_updates == theirs.encoder_input_updates, step
        assert {r.req_id: r.num_computed_tokens for r in mine.scheduled_new_reqs} == {
            r.req_id: r.num_computed_tokens for r in theirs.scheduled_new_reqs
        }, step
        encoded += sum(len(v) for v in theirs.scheduled_encoder_inputs.values())
        freed += len(theirs.free_encoder_mm_hashes)
        for scheduler, out in zip((ours_vllm, ours), outs, strict=True):
            ids = list(out.num_scheduled_tokens)
            sampled = [
                [7]
                if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens
                else []
                for r in ids
            ]
            scheduler.update_from_output(
                out,
                ModelRunnerOutput(
                    req_ids=ids,
                    req_id_to_index={r: k for k, r in enumerate(ids)},
                    sampled_token_ids=sampled,
                ),
            )
        if step > 8 and not ours_vllm.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return encoded, freed
    raise AssertionError("the stream did not drain")


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
            ids = list(out.num_scheduled_tokens)
            scheduler.update_from_output(
                out,
                ModelRunnerOutput(
                    req_ids=ids,
                    req_id_to_index={r: k for k, r in enumerate(ids)},
                    sampled_token_ids=[[7] for _ in ids],
                ),
            )
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
