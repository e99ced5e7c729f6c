"""What the tests that run vLLM 0.33's own scheduler beside tokenyard's adapter share
(``tests/test_integrations_vllm_*.py``): both schedulers built on one ``VllmConfig`` and
``KVCacheConfig``, seeded request streams, a model runner's output, digests of a step's
``SchedulerOutput`` and the step-by-step comparison loop.

It imports vLLM and the bench peer (``benches/peers/vllm_peer.py``): import it only after
``pytest.importorskip("vllm")``, so the tests skip cleanly outside the bench venv.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

import torch
import vllm.v1.core.sched.scheduler as vllm_scheduler_module
from vllm.config import ModelConfig, VllmConfig
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request
from vllm_peer import VllmSchedulerPeer, runner_output

import tokenyard.integrations.vllm as adapter_module
from tokenyard.integrations.vllm import TokenyardScheduler

BLOCK_SIZE = 16
IMAGE_TOKEN = 32000


def attention_spec(kind: str) -> Any:
    """``"full"``, ``"window<N>"`` (sliding window of N tokens; ``"window<N>r<E>"`` keeping
    E more tokens below it, vLLM's ``extra_retained_tokens``), ``"chunk<N>"`` (chunked
    local attention) or ``"fullwindow<N>"`` (a full-attention spec carrying an N-token
    window: vLLM's layout with its hybrid manager off), one head of size 1 (the scheduler
    reads only the kind and block size)."""
    common = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    if kind == "full":
        return FullAttentionSpec(**common)
    if kind.startswith("fullwindow"):
        return FullAttentionSpec(**common, sliding_window=int(kind[len("fullwindow") :]))
    if kind.startswith("window"):
        # "window<N>r<E>": the window retains E more tokens (extra_retained_tokens).
        window, _, extra = kind[len("window") :].partition("r")
        return SlidingWindowSpec(
            **common, sliding_window=int(window), extra_retained_tokens=int(extra or 0)
        )
    if kind.startswith("chunk"):
        return ChunkedLocalAttentionSpec(**common, attention_chunk_size=int(kind[len("chunk") :]))
    raise AssertionError(kind)


def kv_groups(kinds: Sequence[str], layer: str = "layers.{}.attn") -> list[Any]:
    """One ``KVCacheGroupSpec`` per kind (see ``attention_spec``), layer ``layer.format(i)``."""
    return [KVCacheGroupSpec([layer.format(i)], attention_spec(k)) for i, k in enumerate(kinds)]


def build_pair(
    *,
    num_blocks: int,
    groups: Sequence[Any] | None = None,
    classes: tuple[type, type] = (Scheduler, TokenyardScheduler),
    max_model_len: int = 512,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 64,
    **options: Any,
) -> tuple[Any, Any, VllmSchedulerPeer]:
    """vLLM's scheduler and the adapter (``classes``) on the peer's ``VllmConfig``, over a
    ``KVCacheConfig`` of ``groups`` (the peer's single full-attention group when None), and
    the peer that makes requests (with vLLM's block hasher). ``options`` go to the peer."""
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=BLOCK_SIZE,
        **options,
    )
    kv_cache_config = peer.scheduler.kv_cache_config
    if groups is not None:
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=list(groups)
        )
    schedulers = [peer.build(cls, kv_cache_config) for cls in classes]
    return schedulers[0], schedulers[1], peer


#: Each scheduler ``peer_pair`` built, by id: the block hasher its peer's engine gives
#: requests (``add_to_each``).
_BLOCK_HASHERS: dict[int, Any] = {}


def peer_pair(classes: Sequence[type], *, num_blocks: int, **config: Any) -> list[Any]:
    """One scheduler per class of ``classes`` (vLLM's, then the adapter), each built by its
    own peer on the same config, its block hasher kept for ``add_to_each``."""
    pair = []
    for cls in classes:
        peer = VllmSchedulerPeer(num_blocks=num_blocks, scheduler_cls=cls, **config)
        _BLOCK_HASHERS[id(peer.scheduler)] = peer._block_hasher
        pair.append(peer.scheduler)
    return pair


def add_to_each(
    pair: Sequence[Any],
    request_id: str,
    prompt: Sequence[int],
    params: SamplingParams,
    **request_options: Any,
) -> None:
    """The same request to each scheduler of a ``peer_pair``, with its peer's block hasher."""
    for s in pair:
        hasher = _BLOCK_HASHERS[id(s)]
        s.add_request(
            Request(request_id, list(prompt), params, None, block_hasher=hasher, **request_options)
        )


def sampling(scheduler: Any, out: Any) -> set[str]:
    """The requests of the step ``out`` just formed that reach their known tokens (they
    sample): ``schedule()`` advanced ``num_computed_tokens`` past the step's tokens."""
    return {
        r
        for r in out.num_scheduled_tokens
        if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens
    }


def add_both(schedulers: Sequence[Any], make: Callable[..., Any], *args: Any) -> list[Any]:
    """A request ``make(*args)`` added to each scheduler (each its own); returns them."""
    requests = [make(*args) for _ in schedulers]
    for scheduler, request in zip(schedulers, requests, strict=True):
        scheduler.add_request(request)
    return requests


def update_both(schedulers: Sequence[Any], outs: Sequence[Any]) -> None:
    """Each scheduler's step ``out`` lands with ``runner_output``'s tokens
    (``vllm_peer.runner_output``, which the tests import from here)."""
    for scheduler, out in zip(schedulers, outs, strict=True):
        scheduler.update_from_output(out, runner_output(scheduler, out))


def seeded_arrivals(
    rng: random.Random,
    *,
    tail_max: int,
    max_tokens: int,
    count: int = 8,
    prefix_tokens: int = 48,
    shared: Sequence[int] = (0, 16, 48),
    arrive_by: int = 6,
    lowest_token: int = 0,
    max_prompt: int | None = None,
) -> list[tuple[int, str, list[int], int]]:
    """``count`` text requests ``(step, "r<i>", prompt, max_tokens)``: a prefix of
    ``shared`` tokens (a choice) of one random ``prefix_tokens`` prefix, then a random tail
    of 1 to ``tail_max - 1`` tokens, cut at ``max_prompt``; arriving before ``arrive_by``."""
    prefix = [rng.randrange(lowest_token, 1000) for _ in range(prefix_tokens)]
    arrivals = []
    for i in range(count):
        tail = [rng.randrange(lowest_token, 1000) for _ in range(rng.randrange(1, tail_max))]
        prompt = (prefix[: rng.choice(shared)] + tail)[:max_prompt]
        arrivals.append((rng.randrange(arrive_by), f"r{i}", prompt, rng.randrange(1, max_tokens)))
    return arrivals


def image_arrivals(
    rng: random.Random, *, count: int, images: int, max_tokens: int
) -> list[tuple[int, str, list[int], list[tuple[int, int, str]], int]]:
    """``count`` requests ``(step, "r<i>", prompt, items, max_tokens)``: text with 0 to 2
    images of 48, 96 or 144 placeholder tokens (``IMAGE_TOKEN``), each followed by 8 text
    tokens; items ``(offset, length, identifier)`` drawn from ``images`` identifiers per
    length (so requests share some); arriving in the first 8 steps."""
    arrivals = []
    for i in range(count):
        text = [rng.randrange(1000) for _ in range(rng.randrange(4, 40))]
        prompt, items = list(text), []
        for _ in range(rng.randrange(0, 3)):
            length = rng.choice((48, 96, 144))
            items.append((len(prompt), length, f"img{rng.randrange(images)}-{length}"))
            prompt += [IMAGE_TOKEN] * length + [rng.randrange(1000) for _ in range(8)]
        arrivals.append((rng.randrange(8), f"r{i}", prompt, items, rng.randrange(1, max_tokens)))
    return arrivals


def image_request(
    hasher: Any,
    request_id: str,
    prompt: list[int],
    items: Sequence[tuple[int, int, str]],
    max_tokens: int,
    *,
    with_data: bool = False,
) -> Request:
    """A request with one image ``MultiModalFeatureSpec`` per item ``(offset, length,
    identifier)``; ``with_data`` gives each item data (only the V2 runner's
    ``encoder_input_updates`` carry it: vLLM sends an item's data unless it is None)."""
    features = [
        MultiModalFeatureSpec(
            data={"pixels": identifier} if with_data else None,  # type: ignore[arg-type]
            modality="image",
            identifier=identifier,
            mm_position=PlaceholderRange(offset=offset, length=length),
        )
        for offset, length, identifier in items
    ]
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens),
        pooling_params=None,
        mm_features=features or None,
        block_hasher=hasher,
    )


class Budget:
    """``MultiModalBudget`` as ``compute_mm_encoder_budget`` leaves it for a model whose
    largest item fits both; the numbers are the test's (set ``compute`` and ``cache``)."""

    compute = 0
    cache = 0

    def __init__(self, vllm_config: Any, mm_registry: Any) -> None:
        self.encoder_compute_budget = Budget.compute
        self.encoder_cache_size = Budget.cache


def make_multimodal(monkeypatch: pytest.MonkeyPatch, v2: bool | None = None) -> None:
    """The stub model takes images and both schedulers get ``Budget``; with ``v2`` set,
    ``VllmConfig.use_v2_model_runner`` says whether the V2 model runner is in use."""
    monkeypatch.setattr(ModelConfig, "supports_multimodal_inputs", property(lambda self: True))
    if v2 is not None:
        monkeypatch.setattr(VllmConfig, "use_v2_model_runner", property(lambda self: v2))
    monkeypatch.setattr(vllm_scheduler_module, "MultiModalBudget", Budget)
    monkeypatch.setattr(adapter_module, "MultiModalBudget", Budget)


def block_digest(out: Any, *, replay: bool = False, finished: bool = True) -> dict[str, Any]:
    """A step's decisions and block ids: new requests' block tuples and computed tokens
    (and ``replay_start`` with ``replay``), cached requests' new blocks and computed
    tokens, scheduled tokens, preemptions (and finished requests with ``finished``)."""
    cached = out.scheduled_cached_reqs
    digest = {
        "new": {
            r.req_id: (r.block_ids, r.num_computed_tokens) + ((r.replay_start,) if replay else ())
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
    }
    if finished:
        digest["finished"] = set(out.finished_req_ids)
    return digest


def encoder_digest(out: Any) -> dict[str, Any]:
    """A step's scheduled tokens and encoder work: encoder inputs, freed identifiers (in
    any order) and the V2 runner's ``encoder_input_updates``."""
    return {
        "tokens": dict(out.num_scheduled_tokens),
        "encoder_inputs": out.scheduled_encoder_inputs,
        "freed": sorted(out.free_encoder_mm_hashes),
        "updates": out.encoder_input_updates,
    }


@dataclass
class Stream:
    """What a compared stream exercised: tables (request by step) of the adapter that held
    vLLM's null block (a group stopped attending to some blocks), vLLM's preemptions in
    order, and the step it drained at."""

    tables_with_null: int = 0
    preempted: list[str] = field(default_factory=list)
    steps: int = 0


def compare_stream(
    theirs: Any,
    ours: Any,
    arrivals: Sequence[tuple[Any, ...]],
    make: Callable[..., Any],
    *,
    digest: Callable[[Any], Any] = block_digest,
    settle_steps: int = 6,
    max_steps: int = 3000,
    check_kv: bool = True,
    on_scheduled: Callable[[list[Any]], None] | None = None,
) -> Stream:
    """Run ``arrivals`` (``(step, request_id, *args)``; ``make(request_id, *args)`` builds
    each side's request) on vLLM's scheduler and the adapter until vLLM drains (after
    ``settle_steps``). Every step's ``digest`` must be equal; ``on_scheduled(outs)`` sees
    the outputs (vLLM's first) before they land with ``runner_output``'s tokens; with
    ``check_kv`` the KV usage and every request's block tables must then be equal.

    Raises:
        AssertionError: a step differs, or the stream does not drain in ``max_steps``.
    """
    seen = Stream()
    pair = (theirs, ours)
    for step in range(max_steps):
        for at, *args in arrivals:
            if at == step:
                add_both(pair, make, *args)
        outs = [scheduler.schedule() for scheduler in pair]
        assert digest(outs[1]) == digest(outs[0]), f"step {step}"
        seen.preempted.extend(outs[0].preempted_req_ids)
        if on_scheduled is not None:
            on_scheduled(outs)
        update_both(pair, outs)
        if check_kv:
            assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage())
            for request_id in ours.requests:
                table = ours.kv_cache_manager.get_block_ids(request_id)
                assert table == theirs.kv_cache_manager.get_block_ids(request_id), step
                seen.tables_with_null += any(0 in group for group in table)
        if step > settle_steps and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            seen.steps = step
            return seen
    raise AssertionError("the stream did not drain")
