"""tokenyard.integrations.vllm with multimodal requests beside a KV connector (a VLM behind
P/D disaggregation or a KV store), against vLLM 0.33's own ``Scheduler`` and
``AsyncScheduler`` on the same seeded streams.

vLLM has no rule of its own for the pair: the tokens a connector loads count as computed
(``schedule()``: ``num_computed_tokens`` is the local hit plus ``num_external_computed_tokens``),
and ``_try_schedule_encoder_inputs`` runs from them for the tokens still to compute, so an
item wholly inside the loaded prefix is never encoded and one the prefix ends inside is
encoded whole (``get_mm_features_in_window``). An asynchronous load schedules no token and
no encoder input (``load_kv_async`` sets ``num_new_tokens = 0``); once it lands
(``_update_waiting_for_remote_kv``) the request's waiting branch for computed tokens calls
``_try_schedule_encoder_inputs`` from them, skipping the request while the encoder budget
or cache is spent. A failed load cuts the computed tokens back
(``_update_requests_with_invalid_blocks``, ``_handle_failed_recving``) and the items past
the cut are encoded again.

Streams: ``vllm_compare.image_arrivals`` (text with 0 to 2 images of 48, 96 or 144
placeholder tokens, some shared between requests) with the seeded connector of
``test_integrations_vllm_block_sizes_connectors`` (a seeded share of each request's tokens,
asynchronously or not, so the loaded prefix ends before, inside and past the images), one
KV cache group, under roomy and tight encoder budgets and caches and KV pools, loads that
fail whole or leave invalid blocks. Every step is compared: scheduled tokens, block ids,
computed tokens, preemptions, ``scheduled_encoder_inputs``, ``free_encoder_mm_hashes``, the
V2 runner's ``encoder_input_updates``, the requests waiting for loads, what the connector
is told (``update_state_after_alloc``: request, block ids, loaded tokens), each update's
outputs, KV usage, every request's block table, status and computed tokens, and the
encoder cache (entries and their requests, freeable order, free slots). Needs vLLM (the
bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import test_integrations_vllm_block_sizes_connectors as sizes_connectors
from test_integrations_vllm_block_sizes_connectors import (
    StreamStalled,
    _loading,
    _stalled,
    build_pair,
)
from test_integrations_vllm_load_failures import _invalid_blocks, _outputs, _state
from vllm.v1.engine import FinishReason
from vllm.v1.outputs import KVConnectorOutput
from vllm_compare import (
    Budget,
    block_digest,
    encoder_digest,
    image_arrivals,
    image_request,
    make_multimodal,
    runner_output,
    sampling,
)

ONE = [("full", 16, 0)]


@pytest.fixture
def multimodal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub model takes images; both schedulers get ``vllm_compare.Budget``; V1 runner."""
    make_multimodal(monkeypatch, v2=False)


@pytest.fixture
def multimodal_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``multimodal``, on the V2 runner (its ``encoder_input_updates`` carry item data)."""
    make_multimodal(monkeypatch, v2=True)


@dataclass(frozen=True)
class Case:
    """One stream's settings: the encoder budget and cache (embeddings), the KV pool,
    async scheduling, and the share of landing loads that fail whole and of loading or
    scheduled requests with an invalid block (set on synchronous streams here; with two
    steps in flight they are compared in test_integrations_vllm_async_invalid)."""

    budget: int = 512
    cache: int = 1024
    num_blocks: int = 200
    asynchronous: bool = False
    fail_share: float = 0.0
    invalid_share: float = 0.0
    policy: str = "recompute"
    #: vLLM's ``scheduler_reserve_full_isl`` (its default; off, running requests outgrow
    #: the pool and are preempted).
    full_isl: bool = True


def _build_pair(case: Case, seed: int, policy: str) -> tuple[list[Any], Any]:
    """``build_pair`` of test_integrations_vllm_block_sizes_connectors over one group, its
    peer's ``scheduler_config.scheduler_reserve_full_isl`` set to ``case.full_isl`` before
    both schedulers are built from it (both read it at construction)."""
    base = sizes_connectors.VllmSchedulerPeer

    class Peer(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.vllm_config.scheduler_config.scheduler_reserve_full_isl = case.full_isl

    sizes_connectors.VllmSchedulerPeer = Peer
    try:
        return build_pair(
            ONE,
            seed=seed,
            asynchronous=case.asynchronous,
            num_blocks=case.num_blocks,
            policy=policy,
        )
    finally:
        sizes_connectors.VllmSchedulerPeer = base


def _encoder_cache(scheduler: Any) -> tuple[Any, ...]:
    """The encoder cache as vLLM's ``EncoderCacheManager`` names it (the adapter's view)."""
    manager = scheduler.encoder_cache_manager
    return (
        {h: set(r) for h, r in manager.cached.items()},
        list(manager.freeable.items()),
        manager.num_free_slots,
        manager.num_freeable_slots,
    )


def _where(items: list[tuple[int, int, str]], computed: int) -> list[str]:
    """Where each item lies against a prefix of ``computed`` tokens."""
    return [
        "inside" if offset + length <= computed else "straddling" if offset < computed else "past"
        for offset, length, _ in items
    ]


def run(seed: int, case: Case, *, data: bool = False, tamper: Any = None) -> dict[str, int]:
    """A seeded stream on vLLM's scheduler and the adapter, every step compared (see the
    module doc); ``data`` gives items data (the V2 runner's updates send it); ``tamper(ours)``
    changes the adapter after it is built (to show the comparison fails). Returns what the
    stream exercised."""
    Budget.compute, Budget.cache = case.budget, case.cache
    policy = case.policy if (case.fail_share or case.invalid_share) else "fail"
    pair, peer = _build_pair(case, seed, policy)
    theirs, ours = pair
    if tamper is not None:
        tamper(ours)
    rng = random.Random(seed)
    arrivals = image_arrivals(rng, count=10, images=4, max_tokens=12)
    items = {request_id: its for _, request_id, _, its, _ in arrivals}
    seen = {
        k: 0
        for k in (
            "loads",
            "encoded",
            "freed",
            "inside",
            "straddling",
            "past",
            "failed",
            "invalid",
            "cut",
            "errors",
            "preemptions",
        )
    }
    started: set[str] = set()
    # Requests a load was started for (the connector told of loaded tokens).
    loaded: set[str] = set()
    pending: list[tuple[list[Any], list[set[str]], set[str], set[str], set[int]]] = []
    for step in range(600):
        for at, request_id, prompt, its, n in arrivals:
            if at == step:
                for scheduler in pair:
                    scheduler.add_request(
                        image_request(
                            peer._block_hasher, request_id, prompt, its, n, with_data=data
                        )
                    )
        outs = [scheduler.schedule() for scheduler in pair]
        digests = [
            {**block_digest(out), **encoder_digest(out), "zero": out.new_block_ids_to_zero}
            for out in outs
        ]
        if digests[1] != digests[0] and _stalled(theirs, outs[0], seen):
            raise StreamStalled(f"vLLM stalled at step {step}; the core's stall breaker goes on")
        assert digests[1] == digests[0], f"step {step}"
        now_loading = [_loading(s) for s in pair]
        assert now_loading[1] == now_loading[0], f"step {step}"
        told = [sorted(s.connector.allocs, key=lambda a: a[0]) for s in pair]
        assert told[1] == told[0], f"step {step}: {told}"
        for s in pair:
            s.connector.allocs.clear()
        assert _encoder_cache(ours) == _encoder_cache(theirs), f"step {step}"
        seen["encoded"] += sum(map(len, outs[0].scheduled_encoder_inputs.values()))
        seen["freed"] += len(outs[0].free_encoder_mm_hashes)
        seen["preemptions"] += len(outs[0].preempted_req_ids)
        loaded |= {r for r, _, n in told[0] if n}
        for r in outs[0].scheduled_new_reqs:
            if r.num_computed_tokens > 0 and r.req_id in loaded:
                for where in _where(items[r.req_id], r.num_computed_tokens):
                    seen[where] += 1
        landing = started & now_loading[0]
        started = {r for r, _, n in told[0] if n and r in now_loading[0]}
        seen["loads"] += len(started)
        failed = {r for r in sorted(landing) if rng.random() < case.fail_share}
        one = policy == "fail"
        if one and len(failed) > 1:
            failed = {min(failed)}
        invalid: set[int] = set()
        if case.invalid_share and not (one and failed):
            invalid = _invalid_blocks(rng, theirs, outs[0], case.invalid_share, one=one)
        seen["failed"] += len(failed)
        seen["invalid"] += len(invalid)
        samples = [sampling(s, out) for s, out in zip(pair, outs, strict=True)]
        pending.append((outs, samples, landing, failed, invalid))
        idle = not any(o.num_scheduled_tokens for o in outs)
        while pending and (not case.asynchronous or len(pending) == 2 or idle):
            outs, samples, landing, failed, invalid = pending.pop(0)
            computed = {r.request_id: r.num_computed_tokens for r in theirs.requests.values()}
            results = []
            for scheduler, out, sample in zip(pair, outs, samples, strict=True):
                output = runner_output(scheduler, out, sample)
                output.kv_connector_output = KVConnectorOutput(
                    finished_recving=set(landing),
                    failed_recving=set(failed),
                    invalid_block_ids=set(invalid),
                )
                results.append(_outputs(scheduler.update_from_output(out, output)))
            assert results[1] == results[0], f"step {step}"
            seen["errors"] += sum(reason == FinishReason.ERROR for *_, reason in results[0])
            seen["cut"] += sum(
                r.num_computed_tokens < computed.get(r.request_id, 0)
                for r in theirs.requests.values()
            )
        assert _state(ours) == _state(theirs), f"step {step}"
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        assert _encoder_cache(ours) == _encoder_cache(theirs), f"step {step}"
        if step > 12 and not pending and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return seen
    raise StreamStalled(f"every step agreed, and after 600 {sorted(theirs.requests)} wait")


ROOMY = Case()
TIGHT = Case(budget=144, cache=300)
TIGHT_KV = Case(budget=192, cache=400, num_blocks=60)
PREEMPTING = Case(budget=192, cache=400, num_blocks=30, full_isl=False)
PREEMPTING_FAILING = Case(budget=192, cache=400, num_blocks=30, full_isl=False, fail_share=0.3)
FAILING = Case(budget=192, cache=400, fail_share=0.3, invalid_share=0.2)
FAILING_FAIL = Case(budget=192, cache=400, fail_share=0.3, invalid_share=0.15, policy="fail")


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "case",
    [ROOMY, TIGHT, TIGHT_KV, PREEMPTING, FAILING, FAILING_FAIL, PREEMPTING_FAILING],
    ids=["roomy", "tight", "tight-kv", "preempting", "failing", "failing-fail", "both"],
)
def test_image_requests_beside_a_connector_match_vllm(seed: int, case: Case) -> None:
    seen = run(seed, case)
    assert seen["encoded"] > 0


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "case",
    [
        Case(asynchronous=True),
        Case(budget=144, cache=300, asynchronous=True),
        Case(budget=192, cache=400, num_blocks=60, asynchronous=True, fail_share=0.3),
        Case(budget=192, cache=400, num_blocks=30, asynchronous=True, full_isl=False),
        Case(
            budget=192, cache=400, num_blocks=30, asynchronous=True, full_isl=False, fail_share=0.3
        ),
    ],
    ids=["roomy", "tight", "tight-kv-failing", "preempting", "preempting-failing"],
)
def test_image_requests_beside_a_connector_under_async_scheduling_match_vllm(
    seed: int, case: Case
) -> None:
    assert run(seed, case)["encoded"] > 0


@pytest.mark.usefixtures("multimodal_v2")
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_v2_runners_encoder_input_updates_beside_a_connector_match_vllm(
    seed: int, asynchronous: bool
) -> None:
    assert run(seed, Case(budget=192, cache=400, asynchronous=asynchronous), data=True)["encoded"]


@pytest.mark.usefixtures("multimodal")
def test_the_streams_put_images_inside_straddling_and_past_the_loaded_prefix() -> None:
    # The streams above exercise what they compare: loads, items on each side of a loaded
    # prefix's end, evictions, failed loads that cut the computed tokens back or finish the
    # request, preemptions.
    cases = (ROOMY, TIGHT_KV, FAILING, FAILING_FAIL, PREEMPTING_FAILING)
    seen = [run(s, c) for s in range(2) for c in cases]
    total = {k: sum(s[k] for s in seen) for k in seen[0]}
    assert all(total.values()), total


@pytest.mark.usefixtures("multimodal")
def test_the_comparison_fails_when_the_adapter_encodes_differently() -> None:
    # The same stream with the adapter's encoder budget at the largest item (144) where
    # vLLM's is 512: the step-by-step comparison finds the step where they part.
    def smaller_budget(ours: Any) -> None:
        ours.max_num_encoder_input_tokens = 144

    run(1, ROOMY)
    with pytest.raises(AssertionError, match="step 11"):
        run(1, ROOMY, tamper=smaller_budget)
