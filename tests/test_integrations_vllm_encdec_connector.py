"""tokenyard.integrations.vllm for an encoder-decoder model (Whisper's layout: full attention
and a ``CrossAttentionSpec`` group) beside a KV connector, against vLLM 0.33's own
``Scheduler`` and ``AsyncScheduler`` on the same seeded streams.

vLLM's ``Scheduler.__init__`` asserts that an encoder-decoder model has no KV connector,
but ``is_encoder_decoder`` assigned on a built scheduler (as its tests do,
``_create_encoder_decoder_scheduler``) runs the pair, and this is what it does: the tokens
a connector loads count as computed, and ``_try_schedule_encoder_inputs`` under
``is_encoder_decoder`` skips every item once a token is computed, so a request with a
loaded prefix encodes nothing and gets no cross-attention blocks (``num_encoder_tokens``
is 0; ``CrossAttentionManager.allocate_external_computed_blocks`` allocates nothing for
the loaded tokens). An asynchronous load schedules no token and no input; once it lands
the waiting branch for computed tokens skips the items too, unless the load covered a
one-token prompt whole (``_update_waiting_for_remote_kv`` leaves it no computed token):
that request is looked up again and encodes its items with its first token, its
cross-attention blocks taken beside the blocks it holds. A request the connector offers
nothing (or whose load failed under ``recompute``: freed, looked up again) is encoded and
given cross-attention blocks as without a connector. Every update frees all of a running
request's inputs once it has a computed token (``EncoderDecoderCacheManager``'s counter,
quirks included), a loaded request's too, which never allocated them.

Streams: 10 requests with decoder prompts of 1 to 40 tokens and, for most, one encoder
input at offset 0 of 1 to 300 tokens, beside the seeded connector of
test_integrations_vllm_block_sizes_connectors (a seeded share of each request's tokens,
asynchronously or not), prefix caching off (vLLM's cross-attention manager has none),
under roomy and tight encoder budgets and KV pools, preemptions, and loads failing whole
under ``recompute`` (block-level failures raise in vLLM beside two groups). Every step is
compared: scheduled tokens, block ids of both groups, computed tokens, preemptions,
``scheduled_encoder_inputs``, ``free_encoder_mm_hashes``, the requests waiting for loads,
what the connector is told (``update_state_after_alloc``: request, block ids of both
groups, loaded tokens), each update's outputs, KV usage, every request's status, computed
tokens and block tables, and the encoder counter (``num_free_slots``). Needs vLLM (the
bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import test_integrations_vllm_block_sizes_connectors as sizes_connectors
from test_integrations_vllm_block_sizes_connectors import StreamStalled, _loading, _stalled
from test_integrations_vllm_encdec import _groups, _patch
from test_integrations_vllm_load_failures import _outputs, _state
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus
from vllm_compare import block_digest, encoder_digest, image_request, runner_output, sampling

ONE = [("full", 16, 0)]


@dataclass(frozen=True)
class Case:
    """One stream's settings: the encoder budget and counter size (embeddings), the KV
    pool, async scheduling, vLLM's ``scheduler_reserve_full_isl`` (off, running requests
    outgrow the pool and are preempted) and the share of landing loads that fail."""

    budget: int = 2048
    cache: int = 2048
    num_blocks: int = 200
    asynchronous: bool = False
    full_isl: bool = True
    fail_share: float = 0.0
    #: Output tokens at most per request (more make running requests grow).
    max_tokens: int = 16


def _build_pair(case: Case, seed: int) -> tuple[list[Any], Any]:
    """``build_pair`` of test_integrations_vllm_block_sizes_connectors over full attention
    and a cross-attention group, prefix caching off, both schedulers patched as vLLM's
    ``_create_encoder_decoder_scheduler`` patches one."""
    base = sizes_connectors.VllmSchedulerPeer

    class Peer(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.vllm_config.scheduler_config.scheduler_reserve_full_isl = case.full_isl

    sizes_connectors.VllmSchedulerPeer = Peer
    try:
        pair, peer = sizes_connectors.build_pair(
            ONE,
            seed=seed,
            asynchronous=case.asynchronous,
            caching=False,
            num_blocks=case.num_blocks,
            policy="recompute" if case.fail_share else "fail",
            groups=_groups(),
        )
    finally:
        sizes_connectors.VllmSchedulerPeer = base
    for scheduler in pair:
        _patch(scheduler, case.budget, case.cache)
    return pair, peer


def audio_arrivals(rng: random.Random, count: int, max_tokens: int) -> list[tuple[Any, ...]]:
    """``count`` requests arriving over the first 8 steps: a decoder prompt of 1 to 40
    tokens (one token in about one of six), for most one encoder input at offset 0 of 1 to
    300 tokens, and up to ``max_tokens`` outputs."""
    arrivals = []
    for i in range(count):
        length = 1 if rng.random() < 0.15 else rng.randrange(2, 41)
        prompt = [rng.randrange(1, 1000) for _ in range(length)]
        items = [(0, rng.randrange(1, 301), f"audio{i}")] if rng.random() < 0.8 else []
        arrivals.append((rng.randrange(8), f"r{i}", prompt, items, rng.randrange(1, max_tokens)))
    return arrivals


def run(seed: int, case: Case, *, tamper: Any = None) -> dict[str, int]:
    """A seeded stream on vLLM's scheduler and the adapter, every step compared (see the
    module doc); ``tamper(theirs)`` changes vLLM's scheduler after it is built (to show the
    comparison fails). Returns what the stream exercised."""
    pair, peer = _build_pair(case, seed)
    theirs, ours = pair
    if tamper is not None:
        tamper(theirs)
    rng = random.Random(seed)
    arrivals = audio_arrivals(rng, 10, case.max_tokens)
    has_items = {request_id for _, request_id, _, items, _ in arrivals if items}
    seen = dict.fromkeys(
        ("loads", "encoded", "loaded_items", "freed", "failed", "preemptions", "cross", "again"),
        0,
    )
    started: set[str] = set()
    # Requests a load was allocated for (the connector told of loaded tokens).
    loaded: set[str] = set()
    pending: list[tuple[list[Any], list[set[str]], set[str], set[str]]] = []
    for step in range(600):
        for at, request_id, prompt, items, n in arrivals:
            if at == step:
                for scheduler in pair:
                    scheduler.add_request(
                        image_request(peer._block_hasher, request_id, prompt, items, n)
                    )
        outs = [scheduler.schedule() for scheduler in pair]
        digests = [{**block_digest(out), **encoder_digest(out)} for out in outs]
        if digests[1] != digests[0] and _stalled(theirs, outs[0], seen):
            raise StreamStalled(f"vLLM stalled at step {step}; the core's stall breaker goes on")
        assert digests[1] == digests[0], f"step {step}"
        now_loading = [_loading(s) for s in pair]
        assert now_loading[1] == now_loading[0], f"step {step}"
        told = [sorted(s.connector.allocs, key=lambda a: a[0]) for s in pair]
        assert told[1] == told[0], f"step {step}: {told}"
        for s in pair:
            s.connector.allocs.clear()
        counters = [s.encoder_cache_manager.num_free_slots for s in pair]
        assert counters[1] == counters[0], f"step {step}"
        seen["encoded"] += sum(map(len, outs[0].scheduled_encoder_inputs.values()))
        seen["freed"] += len(outs[0].free_encoder_mm_hashes)
        seen["preemptions"] += len(outs[0].preempted_req_ids)
        seen["loaded_items"] += sum(1 for r, _, n in told[0] if n and r in has_items)
        seen["cross"] += sum(1 for r in outs[0].scheduled_new_reqs if r.block_ids[1])
        # Encoded after a load: looked up again (a one-token prompt, a failed load).
        seen["again"] += len(loaded & set(outs[0].scheduled_encoder_inputs))
        loaded |= {r for r, _, n in told[0] if n}
        landing = started & now_loading[0]
        started = {r for r, _, n in told[0] if n and r in now_loading[0]}
        seen["loads"] += len(started)
        failed = {r for r in sorted(landing) if rng.random() < case.fail_share}
        seen["failed"] += len(failed)
        samples = [sampling(s, out) for s, out in zip(pair, outs, strict=True)]
        pending.append((outs, samples, landing, failed))
        idle = not any(o.num_scheduled_tokens for o in outs)
        while pending and (not case.asynchronous or len(pending) == 2 or idle):
            outs, samples, landing, failed = pending.pop(0)
            results = []
            for scheduler, out, sample in zip(pair, outs, samples, strict=True):
                output = runner_output(scheduler, out, sample)
                output.kv_connector_output = KVConnectorOutput(
                    finished_recving=set(landing), failed_recving=set(failed)
                )
                results.append(_outputs(scheduler.update_from_output(out, output)))
            assert results[1] == results[0], f"step {step}"
        assert _state(ours) == _state(theirs), f"step {step}"
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        counters = [s.encoder_cache_manager.num_free_slots for s in pair]
        assert counters[1] == counters[0], f"step {step}"
        if step > 8 and not pending and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return seen
    raise StreamStalled(f"every step agreed, and after 600 {sorted(theirs.requests)} wait")


ROOMY = Case()
TIGHT = Case(budget=400, cache=500, num_blocks=60)
PREEMPTING = Case(budget=400, cache=600, num_blocks=28, full_isl=False, max_tokens=60)
FAILING = Case(budget=400, cache=600, fail_share=0.3)
CASES = [ROOMY, TIGHT, PREEMPTING, FAILING]
IDS = ["roomy", "tight", "preempting", "failing"]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_encoder_decoder_requests_beside_a_connector_match_vllm(seed: int, case: Case) -> None:
    assert run(seed, case)["loads"] > 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_encoder_decoder_requests_beside_a_connector_under_async_scheduling_match_vllm(
    seed: int, case: Case
) -> None:
    async_case = Case(**{**case.__dict__, "asynchronous": True})
    assert run(seed, async_case)["loads"] > 0


def test_the_streams_load_encode_again_fail_and_preempt() -> None:
    # The streams above exercise what they compare: loads of requests with encoder inputs
    # (never encoded then), inputs encoded with cross-attention blocks, requests encoded
    # after a load (a one-token prompt loaded whole, a failed load), failed loads and
    # preemptions, under both schedulers.
    seen = [
        run(s, Case(**{**c.__dict__, "asynchronous": a}))
        for s in range(2)
        for c in CASES
        for a in (False, True)
    ]
    total = {k: sum(s[k] for s in seen) for k in seen[0]}
    assert all(total.values()), total


def test_the_comparison_fails_where_a_loaded_request_would_encode() -> None:
    # A variant of vLLM's rule: its scheduler made to encode a request's inputs from 0 even
    # with a loaded prefix (as if ``num_computed_tokens > 0`` did not skip them), giving it
    # cross-attention blocks. The adapter keeps vLLM 0.33's rule and the comparison parts.
    def encode_loaded(theirs: Any) -> None:
        original = theirs._try_schedule_encoder_inputs

        def from_zero(request: Any, num_computed: int, num_new: int, *args: Any, **kw: Any) -> Any:
            # Running requests keep the rule (they encoded with their first tokens).
            admitted = request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            return original(request, 0 if admitted else num_computed, num_new, *args, **kw)

        theirs._try_schedule_encoder_inputs = from_zero

    run(0, ROOMY)
    with pytest.raises(AssertionError, match="step"):
        run(0, ROOMY, tamper=encode_loaded)
