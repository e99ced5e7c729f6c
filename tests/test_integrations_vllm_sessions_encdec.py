"""tokenyard.integrations.vllm: an encoder-decoder model's (Whisper's layout: full attention
and a ``CrossAttentionSpec`` group, ``is_encoder_decoder`` set as vLLM's tests set it)
streaming-input sessions whose later chunks carry encoder inputs.

vLLM 0.33's ``_update_request_as_session`` places a chunk's items after the kept tokens
(offset ``base`` and on) and appends them. Under ``is_encoder_decoder``,
``_try_schedule_encoder_inputs`` starts at item 0 and, once a token is computed, skips every
item after asserting it starts at 0: a resumed session's later item fails that assert
(``schedule()`` raises), and without asserts (``python -O``) it is skipped, never encoded,
never given cross-attention blocks; every update still frees all of a running session's
inputs in ``EncoderDecoderCacheManager``'s counter, the later ones included. A session
whose resume has nothing computed (it was preempted) encodes all its items in the window
with its first tokens, as any request. The adapter does what vLLM does without its
asserts. Streams are compared against vLLM's ``Scheduler`` / ``AsyncScheduler`` compiled
without asserts: after each operation the decisions, encoder inputs and freed
identifiers, each request's status, computed tokens, tokens, items and block tables (both
groups), and the counter. Needs vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from test_integrations_vllm_encdec import _groups, _patch
from test_integrations_vllm_sessions import _decisions, _outputs, _runner_output, _without_asserts
from test_integrations_vllm_sessions_mm import STOP, _add, _encoder
from vllm.v1.request import RequestStatus
from vllm_compare import _BLOCK_HASHERS, build_pair

from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler


def _pair(async_scheduling: bool, num_blocks: int, budget: int) -> list[Any]:
    sync_cls, async_cls = _without_asserts()
    classes = (
        (async_cls, AsyncTokenyardScheduler) if async_scheduling else (sync_cls, TokenyardScheduler)
    )
    theirs, ours, peer = build_pair(
        num_blocks=num_blocks,
        groups=_groups(),
        classes=classes,
        enable_prefix_caching=False,
        max_model_len=1024,
    )
    for s in (theirs, ours):
        _patch(s, budget, budget)
        _BLOCK_HASHERS[id(s)] = peer._block_hasher
    return [theirs, ours]


def _state(s: Any) -> tuple[Any, ...]:
    requests = {
        i: (
            r.status,
            r.num_computed_tokens,
            list(r.all_token_ids),
            [(f.mm_position.offset, f.mm_position.length, f.identifier) for f in r.mm_features],
            None if r.is_finished() else s.kv_cache_manager.get_block_ids(i),
        )
        for i, r in s.requests.items()
    }
    return requests, s.encoder_cache_manager.num_free_slots, s.get_num_unfinished_requests()


def _chunk(rng: random.Random, tag: int, share: float) -> tuple[list[int], list[Any]]:
    """1 to 12 text tokens and, with probability ``share``, an encoder input of 8 to 200
    tokens at offset 0 (an encoder-decoder model's input is not in the decoder prompt)."""
    prompt = [tag * 100 + t for t in range(rng.randint(1, 12))]
    items = [(0, rng.randint(8, 200), f"audio{tag}")] if rng.random() < share else []
    return prompt, items


def _stream(seed: int, async_scheduling: bool) -> int:
    """One seeded stream; returns the later chunks' encoder inputs it placed."""
    rng = random.Random(seed)
    pair = _pair(async_scheduling, num_blocks=rng.choice([30, 60, 200]), budget=400)
    in_flight: list[list[tuple[Any, set[str]]]] = [[], []]
    sessions: list[str] = []
    later = 0
    for step in range(60):
        what = f"seed {seed}, step {step}"
        roll = rng.random()
        if roll < 0.15:
            request_id = f"q{step}"
            prompt, items = _chunk(rng, step, 0.8)
            _add(pair, request_id, prompt, items, rng.randint(1, 8))
            sessions.append(request_id)
        elif roll < 0.45 and sessions:
            request_id = rng.choice(sessions)
            if request_id in pair[0].requests:
                if rng.random() < 0.1:
                    _add(pair, request_id, [1], [], 1, resumable=False)
                    sessions.remove(request_id)
                else:
                    prompt, items = _chunk(rng, step, 0.6)
                    later += len(items)
                    _add(pair, request_id, prompt, items, rng.randint(1, 8))
        assert _state(pair[1]) == _state(pair[0]), f"{what}: arrivals"
        depth = 2 if async_scheduling else 1
        if len(in_flight[0]) == depth or (in_flight[0] and rng.random() < 0.4):
            stops = {i: STOP for i in pair[0].requests if rng.random() < 0.3}
            outputs = []
            for s, queue in zip(pair, in_flight, strict=True):
                out, sampling = queue.pop(0)
                outputs.append(
                    _outputs(s.update_from_output(out, _runner_output(out, stops, sampling)))
                )
            assert outputs[1] == outputs[0], f"{what}: outputs"
            assert _state(pair[1]) == _state(pair[0]), f"{what}: landed"
        outs = [s.schedule() for s in pair]
        assert _decisions(outs[1]) == _decisions(outs[0]), what
        assert _encoder(outs[1]) == _encoder(outs[0]), f"{what}: encoder"
        requests = pair[0].requests
        sampling = {i for i in outs[0].num_scheduled_tokens if not requests[i].is_prefill_chunk}
        for queue, out in zip(in_flight, outs, strict=True):
            queue.append((out, sampling))
        assert _state(pair[1]) == _state(pair[0]), f"{what}: scheduled"
    return later


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_encoder_inputs_in_later_chunks_agree_with_vllm_without_asserts(
    seed: int, async_scheduling: bool
) -> None:
    _stream(seed, async_scheduling)


def test_the_streams_place_encoder_inputs_in_later_chunks() -> None:
    assert sum(_stream(seed, False) + _stream(seed, True) for seed in range(4)) >= 10


def test_with_asserts_vllm_fails_where_the_adapter_skips_a_later_input() -> None:
    """vLLM 0.33 as shipped: a session resumed with an encoder input in its chunk reaches
    ``assert start_pos == 0`` once it has computed tokens; the adapter skips the input."""
    from vllm.v1.core.sched.scheduler import Scheduler

    theirs, ours, peer = build_pair(
        num_blocks=100,
        groups=_groups(),
        classes=(Scheduler, TokenyardScheduler),
        enable_prefix_caching=False,
        max_model_len=1024,
    )
    pair = [theirs, ours]
    for s in pair:
        _patch(s, 400, 400)
        _BLOCK_HASHERS[id(s)] = peer._block_hasher
    _add(pair, "s", list(range(6)), [(0, 40, "a")], 4)
    for s in pair:
        out = s.schedule()
        s.update_from_output(out, _runner_output(out, {"s": STOP}, {"s"}))
        assert s.requests["s"].status == RequestStatus.WAITING_FOR_STREAMING_REQ
    _add(pair, "s", [7, 8, 9], [(0, 30, "b")], 4)
    with pytest.raises(AssertionError):
        theirs.schedule()
    out = ours.schedule()
    assert out.num_scheduled_tokens == {"s": 3}
    assert out.scheduled_encoder_inputs == {}
