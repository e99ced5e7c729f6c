"""tokenyard.integrations.vllm: the encoder budget and cache set on a built scheduler, as
vLLM 0.33's own tests set them on the text-only test model
(``scheduler.max_num_encoder_input_tokens = ...``,
``scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=...)``), and
``encoder_cache_manager`` read under vLLM's names. vLLM's ``Scheduler``
(``vllm/v1/core/sched/scheduler.py``: ``_try_schedule_encoder_inputs``,
``_make_scheduled_encoder_input_stats``) and ``TokenyardScheduler`` run the same streams;
each step's decisions, encoder inputs, freed identifiers and stats, and the encoder
cache's entries and counters must be equal. Needs vLLM (the bench venv, ``.venv-bench``);
skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.v1.core.encoder_cache_manager import EncoderCacheManager, EncoderDecoderCacheManager
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_compare import IMAGE_TOKEN, image_arrivals, image_request, update_both
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError, InputError
from tokenyard.integrations.vllm import TokenyardScheduler


def _pair(**options: Any) -> tuple[list[Any], Any]:
    """vLLM's Scheduler and tokenyard's on the (text-only) stub model, no budget set."""
    config = {"num_blocks": 400, "max_num_seqs": 4, "max_num_batched_tokens": 256}
    config.update(options)
    pair, hasher = [], None
    for cls in (Scheduler, TokenyardScheduler):
        peer = VllmSchedulerPeer(max_model_len=2048, scheduler_cls=cls, **config)
        pair.append(peer.scheduler)
        hasher = peer._block_hasher
    return pair, hasher


def _set_encoder(pair: list[Any], budget: int, cache: int) -> None:
    for s in pair:
        s.max_num_encoder_input_tokens = budget
        s.encoder_cache_manager = EncoderCacheManager(cache_size=cache)


def _cache_state(scheduler: Any) -> tuple[Any, ...]:
    m = scheduler.encoder_cache_manager
    return (
        m.cache_size,
        m.num_free_slots,
        m.num_freeable_slots,
        {h: set(ids) for h, ids in m.cached.items()},
        list(m.freeable.items()),
        sorted(m.freed),
    )


def _step(pair: list[Any], what: str) -> list[Any]:
    outs = [s.schedule() for s in pair]
    theirs, mine = outs
    assert dict(mine.num_scheduled_tokens) == dict(theirs.num_scheduled_tokens), what
    assert mine.scheduled_encoder_inputs == theirs.scheduled_encoder_inputs, what
    assert sorted(mine.free_encoder_mm_hashes) == sorted(theirs.free_encoder_mm_hashes), what
    theirs_stats, mine_stats = (
        (s.num_inputs, s.output_tokens) if s else None
        for s in (o.scheduled_encoder_input_stats for o in outs)
    )
    assert mine_stats == theirs_stats, what
    assert _cache_state(mine_s := pair[1]) == _cache_state(pair[0]), what
    update_both(pair, outs)
    assert _cache_state(mine_s) == _cache_state(pair[0]), what
    return outs


def test_a_text_only_models_images_are_refused_until_a_budget_and_cache_are_set() -> None:
    """vLLM's budget and cache are 0 for the text-only model: an image would never be
    encoded, so the adapter refuses it by name; once both are set it is served."""
    pair, hasher = _pair()
    ours = pair[1]
    assert ours.max_num_encoder_input_tokens == pair[0].max_num_encoder_input_tokens == 0
    assert ours.encoder_cache_manager.cache_size == pair[0].encoder_cache_manager.cache_size
    prompt = list(range(20)) + [IMAGE_TOKEN] * 100 + list(range(30))
    with pytest.raises(InputError) as info:
        ours.add_request(image_request(hasher, "r", prompt, [(20, 100, "img")], 3))
    assert info.value.field == "mm_features"
    ours.max_num_encoder_input_tokens = 100
    with pytest.raises(InputError):
        ours.add_request(image_request(hasher, "r", prompt, [(20, 100, "img")], 3))
    _set_encoder(pair, 100, 1000)
    for s in pair:
        s.add_request(image_request(hasher, "r", prompt, [(20, 100, "img")], 3))
    outs = _step(pair, "first step")
    assert outs[1].scheduled_encoder_inputs == {"r": [0]}


def test_a_budget_lowered_between_steps_holds_the_next_image_as_vllm_does() -> None:
    """Two 100-token images at 0 and 150: budget 200 encodes both at once; lowered to 100
    before the second request, one image a step."""
    pair, hasher = _pair()
    _set_encoder(pair, 200, 1000)
    items = [(0, 100, "a0"), (150, 100, "a1")]
    prompt = [IMAGE_TOKEN] * 100 + list(range(50)) + [IMAGE_TOKEN] * 100 + list(range(50))
    for s in pair:
        s.add_request(image_request(hasher, "a", prompt, items, 2))
    assert _step(pair, "budget 200")[1].scheduled_encoder_inputs == {"a": [0, 1]}
    for s in pair:
        s.max_num_encoder_input_tokens = 100
        s.add_request(image_request(hasher, "b", prompt, [(0, 100, "b0"), (150, 100, "b1")], 2))
    assert _step(pair, "budget 100")[1].num_scheduled_tokens["b"] == 150
    assert _step(pair, "budget 100, next")[1].scheduled_encoder_inputs == {"b": [1]}


def test_assigning_an_encoder_decoder_cache_or_a_used_manager_is_refused_by_name() -> None:
    pair, _ = _pair()
    ours = pair[1]
    with pytest.raises(ConfigError) as info:
        ours.encoder_cache_manager = EncoderDecoderCacheManager(cache_size=100)
    assert info.value.field == "encoder_cache_manager"
    used = EncoderCacheManager(cache_size=100)
    used.cached["x"] = set()
    with pytest.raises(ConfigError):
        ours.encoder_cache_manager = used
    # The size given with the three counters at once, as vLLM's tests do.
    ecm = ours.encoder_cache_manager
    ecm.cache_size = ecm.num_free_slots = ecm.num_freeable_slots = 128
    assert (ecm.cache_size, ecm.num_free_slots, ecm.num_freeable_slots) == (128, 128, 128)
    with pytest.raises(ConfigError):
        ecm.num_free_slots = 5


def test_the_step_stats_of_encoder_inputs_are_vllms_with_iteration_logging() -> None:
    pair, hasher = _pair()
    _set_encoder(pair, 512, 1024)
    for s in pair:
        s.observability_config.enable_logging_iteration_details = True
    prompt = [IMAGE_TOKEN] * 96 + list(range(10)) + [IMAGE_TOKEN] * 48
    for s in pair:
        s.add_request(image_request(hasher, "r", prompt, [(0, 96, "i0"), (106, 48, "i1")], 2))
    stats = _step(pair, "stats")[1].scheduled_encoder_input_stats
    assert (stats.num_inputs, stats.output_tokens) == (2, 144)


@pytest.mark.parametrize(
    ("seed", "budget", "cache"), [(0, 160, 300), (1, 300, 300), (2, 512, 2048), (3, 144, 200)]
)
def test_random_image_streams_with_the_encoder_set_after_construction_agree(
    seed: int, budget: int, cache: int
) -> None:
    """Shared and repeated images, a budget and cache tight enough to stop tokens short of
    an image and to evict; every step and the cache's entries and counters equal."""
    pair, hasher = _pair()
    _set_encoder(pair, budget, cache)
    arrivals = image_arrivals(random.Random(seed), count=10, images=5, max_tokens=30)
    encoded = 0
    for step in range(1000):
        for at, request_id, prompt, items, n in arrivals:
            if at == step:
                for s in pair:
                    s.add_request(image_request(hasher, request_id, prompt, items, n))
        outs = _step(pair, f"seed {seed}, step {step}")
        encoded += sum(len(v) for v in outs[0].scheduled_encoder_inputs.values())
        if step > 8 and not pair[0].has_unfinished_requests():
            assert not pair[1].has_unfinished_requests()
            assert encoded > 0
            return
    raise AssertionError("the stream did not drain")
