"""tokenyard.integrations.vllm: images in a streaming-input session's later chunks. vLLM
0.33's ``_update_request_as_session`` places a chunk's ``mm_features`` after the session's
kept tokens (``base = session.num_tokens`` once the last sampled token is dropped) and
appends them to its items; ``has_encoder_inputs`` is a property of the items, so the
resumed session's next admission schedules them (``_try_schedule_encoder_inputs``) and
its updates free them once computed (``_free_encoder_inputs``), as for any request.
vLLM's ``Scheduler`` / ``AsyncScheduler`` and tokenyard's are driven through the same
seeded streams of sessions (text or images in any chunk, images shared between chunks and
sessions), plain image requests, aborts and ends; after each operation the decisions,
the encoder inputs scheduled and freed, the encoder cache, each request's status, computed
tokens, tokens and items, the outputs and the free blocks must be equal. Needs vLLM (the
bench venv, ``.venv-bench``); skipped elsewhere."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from test_integrations_vllm_sessions import (
    STOP,
    _decisions,
    _outputs,
    _runner_output,
    _without_asserts,
)
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus
from vllm_compare import _BLOCK_HASHERS, IMAGE_TOKEN, Budget, make_multimodal, peer_pair

import tokenyard.integrations._vllm_sessions as sessions_module
from tokenyard.errors import InputError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

Item = tuple[int, int, str]


@pytest.fixture(autouse=True)
def multimodal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub model takes images; both schedulers get ``vllm_compare.Budget``, vLLM's
    compiled without its asserts too."""
    make_multimodal(monkeypatch)
    stripped_globals = _without_asserts()[0].__init__.__globals__
    monkeypatch.setitem(stripped_globals, "MultiModalBudget", Budget)


def _pair(
    *, async_scheduling: bool, budget: int, cache: int, stripped: bool = False, **config: Any
) -> list[Any]:
    """vLLM's scheduler (``stripped``: without its asserts, as a wait set by hand needs:
    vLLM's parked-session counter goes below 0 and its admission passes ``max_num_seqs``,
    which an assert catches) and tokenyard's."""
    Budget.compute, Budget.cache = budget, cache
    sync_cls, async_cls = _without_asserts() if stripped else (Scheduler, AsyncScheduler)
    classes = (
        (async_cls, AsyncTokenyardScheduler) if async_scheduling else (sync_cls, TokenyardScheduler)
    )
    options = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 1024}
    options.update(config)
    return peer_pair(classes, **options)


def _add(
    pair: list[Any],
    request_id: str,
    prompt: list[int],
    items: list[Item],
    max_tokens: int,
    resumable: bool = True,
) -> None:
    """The same request (a new one, a session's chunk or its end) to each scheduler, each
    with items of its own: vLLM moves a chunk's items in place."""
    for s in pair:
        features = [
            MultiModalFeatureSpec(
                # Data only the V2 runner's encoder_input_updates carry.
                data={"pixels": identifier},  # type: ignore[arg-type]
                modality="image",
                identifier=identifier,
                mm_position=PlaceholderRange(offset=offset, length=length),
            )
            for offset, length, identifier in items
        ]
        params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP])
        s.add_request(
            Request(
                request_id,
                list(prompt),
                params,
                None,
                block_hasher=_BLOCK_HASHERS[id(s)],
                mm_features=features or None,
                resumable=resumable,
            )
        )


def _text_and_images(rng: random.Random, tag: int, images: int) -> tuple[list[int], list[Item]]:
    """Text with up to ``images`` images of 8, 16 or 24 placeholder tokens, each followed by
    a few text tokens; identifiers from a small pool, so chunks and sessions share some."""
    prompt = [tag * 100 + t for t in range(rng.randint(1, 12))]
    items: list[Item] = []
    for _ in range(rng.randint(0, images)):
        length = rng.choice((8, 16, 24))
        items.append((len(prompt), length, f"img{rng.randrange(4)}-{length}"))
        prompt += [IMAGE_TOKEN] * length + [tag * 100 + 90 + t for t in range(rng.randint(0, 4))]
    return prompt, items


def _state(s: Any) -> tuple[Any, ...]:
    requests = {
        i: (
            r.status,
            r.num_computed_tokens,
            list(r.all_token_ids),
            r.num_prompt_tokens,
            [(f.mm_position.offset, f.mm_position.length, f.identifier) for f in r.mm_features],
        )
        for i, r in s.requests.items()
    }
    cache = s.encoder_cache_manager
    return (
        requests,
        s.kv_cache_manager.block_pool.get_num_free_blocks(),
        s.num_waiting_for_streaming_input,
        s.get_num_unfinished_requests(),
        {k: set(v) for k, v in cache.cached.items()},
        dict(cache.freeable),
        cache.num_free_slots,
        cache.num_freeable_slots,
    )


def _same(pair: list[Any], what: str) -> None:
    vllm_state, ours = (_state(s) for s in pair)
    assert ours == vllm_state, what


def _encoder(out: Any) -> tuple[Any, ...]:
    return (
        {i: list(v) for i, v in out.scheduled_encoder_inputs.items()},
        sorted(out.free_encoder_mm_hashes),
        out.encoder_input_updates,
    )


def _hand_set_chunk(pair: list[Any], rng: random.Random, sessions: list[str], step: int) -> int:
    """vLLM's tests' edit (``test_streaming_request_session_update``): a queued session
    never scheduled since it arrived or resumed gets ``WAITING_FOR_STREAMING_REQ``, one
    output token and computed tokens by hand, then a chunk with text and images. Returns
    the images the chunk carries (0 when no session is queued untouched)."""
    requests = pair[0].requests
    queued = [
        i
        for i in sessions
        if i in requests
        and requests[i].status == RequestStatus.WAITING
        and requests[i].num_computed_tokens == 0
    ]
    if not queued:
        return 0
    request_id = rng.choice(queued)
    num_computed = rng.randint(0, requests[request_id].num_tokens)
    for s in pair:
        request = s.requests[request_id]
        request.status = RequestStatus.WAITING_FOR_STREAMING_REQ
        request.append_output_token_ids(step)
        request.num_computed_tokens = num_computed
    prompt, items = _text_and_images(rng, step, 2)
    _add(pair, request_id, prompt, items, rng.randint(1, 8))
    return len(items)


def _stream(seed: int, async_scheduling: bool, hand_set: bool = False) -> tuple[int, int]:
    """One seeded stream (``hand_set``: with chunks on waits set by hand); returns the
    encoder inputs of later chunks scheduled (inputs past a session's first chunk's items)
    and the hand-set chunks' images (the steps compared without ``hand_set``)."""
    rng = random.Random(seed)
    budget, cache = rng.choice([(64, 128), (32, 48), (24, 24)])
    pair = _pair(
        async_scheduling=async_scheduling,
        budget=budget,
        cache=cache,
        num_blocks=rng.choice([24, 40, 96]),
        max_num_seqs=rng.choice([2, 4, 8]),
        enable_prefix_caching=rng.random() < 0.7,
        stripped=hand_set,
    )
    in_flight: list[list[tuple[Any, set[str]]]] = [[], []]
    sessions: list[str] = []
    first_items: dict[str, int] = {}
    later_inputs = hand_set_images = 0
    for step in range(70):
        what = f"seed {seed}, step {step}"
        roll = rng.random()
        if hand_set and rng.random() < 0.12:
            hand_set_images += _hand_set_chunk(pair, rng, sessions, step)
            _same(pair, f"{what}: chunk for a wait set by hand")
        if roll < 0.15:
            request_id = f"q{step}"
            resumable = rng.random() < 0.75
            prompt, items = _text_and_images(rng, step, 1)
            _add(pair, request_id, prompt, items, rng.randint(1, 8), resumable)
            if resumable:
                sessions.append(request_id)
                first_items[request_id] = len(items)
            _same(pair, f"{what}: new")
        elif roll < 0.4 and sessions:
            request_id = rng.choice(sessions)
            if request_id in pair[0].requests:
                if rng.random() < 0.1:
                    _add(pair, request_id, [1], [], 1, resumable=False)
                    sessions.remove(request_id)
                else:
                    prompt, items = _text_and_images(rng, step, 2)
                    _add(pair, request_id, prompt, items, rng.randint(1, 8))
            _same(pair, f"{what}: chunk")
        elif roll < 0.44 and pair[0].requests:
            victim = rng.choice(sorted(pair[0].requests))
            for s in pair:
                s.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
            _same(pair, f"{what}: abort")
        depth = 3 if async_scheduling else 1
        if len(in_flight[0]) == depth or (in_flight[0] and rng.random() < 0.4):
            stops = {i: STOP for i in pair[0].requests if rng.random() < 0.3}
            outputs = []
            for s, queue in zip(pair, in_flight, strict=True):
                out, sampling = queue.pop(0)
                outputs.append(
                    _outputs(s.update_from_output(out, _runner_output(out, stops, sampling)))
                )
            assert outputs[1] == outputs[0], f"{what}: outputs"
            _same(pair, f"{what}: landed")
        outs = [s.schedule() for s in pair]
        assert _decisions(outs[1]) == _decisions(outs[0]), what
        assert _encoder(outs[1]) == _encoder(outs[0]), f"{what}: encoder"
        later_inputs += sum(
            1
            for i, inputs in outs[0].scheduled_encoder_inputs.items()
            for n in inputs
            if n >= first_items.get(i, 1 << 30)
        )
        requests = pair[0].requests
        sampling = {i for i in outs[0].num_scheduled_tokens if not requests[i].is_prefill_chunk}
        for queue, out in zip(in_flight, outs, strict=True):
            queue.append((out, sampling))
        _same(pair, f"{what}: scheduled")
    return later_inputs, hand_set_images if hand_set else 70


@pytest.mark.parametrize("seed", range(16))
def test_images_in_later_chunks_agree_with_vllm_step_by_step(seed: int) -> None:
    _stream(seed, async_scheduling=False)


@pytest.mark.parametrize("seed", range(16))
def test_images_in_later_chunks_agree_with_vllms_async_scheduler(seed: int) -> None:
    _stream(seed, async_scheduling=True)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_later_chunks_images_reach_the_v2_runner_as_vllm_sends_them(
    monkeypatch: pytest.MonkeyPatch, seed: int, async_scheduling: bool
) -> None:
    """Under the V2 model runner each step also carries ``encoder_input_updates`` (vLLM's
    ``_get_encoder_input_updates`` over ``_pending_encoder_input_ids``): a resumed
    session's new items are sent with their first encoding and released as vLLM does."""
    make_multimodal(monkeypatch, v2=True)
    _stream(100 + seed, async_scheduling)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_images_in_chunks_on_waits_set_by_hand_agree_with_vllm(
    seed: int, async_scheduling: bool
) -> None:
    """vLLM's ``add_request`` applies a chunk at once to a session whose streaming wait
    was set by hand on a queued request: its items go after the kept tokens, and the
    request, kept in its queue, is admitted from the computed tokens set (no lookup),
    its items past them scheduled (``_try_schedule_encoder_inputs``), the ones before
    never encoded."""
    _stream(200 + seed, async_scheduling, hand_set=True)


def test_the_streams_encode_images_of_later_chunks() -> None:
    """The streams exercise what they claim: over 8 seeds, a session's later chunks'
    images are encoded dozens of times, synchronously and asynchronously (36 and 45 on
    2026-11-28)."""
    assert sum(_stream(seed, False)[0] for seed in range(8)) >= 20
    assert sum(_stream(seed, True)[0] for seed in range(8)) >= 20


def test_an_image_in_the_next_chunk_is_encoded_after_the_kept_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 10-token session stops on its first output; its chunk of 3 text tokens and a
    16-token image makes the image start at 10 + 3 = 13 (the 42 dropped): the resumed
    session schedules its 20 new tokens from 10 computed with encoder input 0 (the V2
    runner gets its data with the request, none apart), and the update after the step
    frees it (its range computed)."""
    make_multimodal(monkeypatch, v2=True)
    pair = _pair(async_scheduling=False, budget=64, cache=128, num_blocks=64)
    _add(pair, "s", list(range(10)), [], 4)
    for s in pair:
        out = s.schedule()
        s.update_from_output(out, _runner_output(out, {"s": STOP}, {"s"}))
    prompt = [500, 501, 502] + [IMAGE_TOKEN] * 16 + [503]
    _add(pair, "s", prompt, [(3, 16, "cat")], 4)
    _same(pair, "resumed")
    assert pair[1].requests["s"].mm_features[0].mm_position.offset == 13
    outs = [s.schedule() for s in pair]
    assert _decisions(outs[1]) == _decisions(outs[0])
    assert _encoder(outs[1]) == _encoder(outs[0])
    assert _encoder(outs[1]) == ({"s": [0]}, [], {})
    assert outs[1].num_scheduled_tokens == {"s": 20}
    _same(pair, "image scheduled")
    for s, out in zip(pair, outs, strict=True):
        s.update_from_output(out, _runner_output(out, {}, {"s"}))
    _same(pair, "image freed")
    assert pair[1].encoder_cache_manager.freeable == {"cat": 16}


def test_an_image_past_the_budget_in_a_chunk_is_refused_by_name() -> None:
    """The core checks a chunk's items as add_request checks a prompt's: one needing more
    embeddings than the encoder budget could never be scheduled."""
    pair = _pair(async_scheduling=False, budget=16, cache=32, num_blocks=64)
    _add(pair, "s", list(range(10)), [], 4)
    for s in pair:
        out = s.schedule()
        s.update_from_output(out, _runner_output(out, {"s": STOP}, {"s"}))
    with pytest.raises(InputError) as info:
        _add(pair[1:], "s", [IMAGE_TOKEN] * 24, [(0, 24, "big")], 4)
    assert info.value.field == "mm_features"


class _CoreWithoutChunkItems:
    """The core behind an adapter that never tells it of a chunk's items."""

    def __init__(self, core: Any) -> None:
        self._inner = core

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def resume_session(self, *args: Any, mm_features: Any = None, **kwargs: Any) -> None:
        self._inner.resume_session(*args, **kwargs)

    def resume_unparked_session(self, *args: Any, mm_features: Any = None, **kw: Any) -> None:
        self._inner.resume_unparked_session(*args, **kw)


def test_the_streams_catch_a_core_not_told_of_the_chunks_images(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check can fail: with the chunk's items kept from the core, the resumed
    sessions' images are never encoded and the streams find it."""
    original = sessions_module.Sessions._resume_session

    def without_items(self: Any, session: Any, update: Any, **kwargs: Any) -> None:
        core = self._core
        self._core = _CoreWithoutChunkItems(core)
        try:
            original(self, session, update, **kwargs)
        finally:
            self._core = core

    monkeypatch.setattr(sessions_module.Sessions, "_resume_session", without_items)

    def streams() -> None:
        for seed in range(8):
            _stream(seed, async_scheduling=False)

    with pytest.raises(AssertionError):
        streams()


def test_the_hand_set_streams_carry_images_and_catch_a_core_not_told_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hand-set streams carry images (over 12 seeds each way), and with those chunks'
    items kept from the core the comparison fails."""
    images = sum(_stream(200 + seed, a, hand_set=True)[1] for seed in range(12) for a in (0, 1))
    assert images >= 10, images
    original = sessions_module.Sessions._resume_unparked

    def without_items(self: Any, session: Any, update: Any) -> None:
        core = self._core
        self._core = _CoreWithoutChunkItems(core)
        try:
            original(self, session, update)
        finally:
            self._core = core

    monkeypatch.setattr(sessions_module.Sessions, "_resume_unparked", without_items)

    def streams() -> None:
        for seed in range(12):
            _stream(200 + seed, async_scheduling=False, hand_set=True)

    with pytest.raises(AssertionError):
        streams()
