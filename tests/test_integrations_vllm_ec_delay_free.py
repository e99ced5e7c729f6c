"""tokenyard.integrations.vllm beside an encoder-cache connector whose ``request_finished``
answers delay-free ``True``, against vLLM 0.33's own ``Scheduler`` and ``AsyncScheduler``.

vLLM's ``_free_request`` ORs the connector's answer into the KV connector's (none here):
the request's encoder-cache entries are freed at once, but its KV blocks stay allocated and
the request stays in ``requests`` (finished) until a KV connector output lists it in
``finished_sending`` (``_update_from_kv_xfer_finished``, last in ``update_from_output``).
The core asks the connector as it finishes a request and keeps its blocks as for a KV
connector's send.

Streams: ``vllm_compare.image_arrivals`` on a small KV pool (held blocks delay admissions
and preempt), with ``test_integrations_vllm_ec_transit``'s connector (inputs in transit,
its log of calls) answering ``True`` for a seeded share of the requests; each held request's
send is reported done a seeded 1 to 4 updates later. Every step is compared: scheduled
tokens, block ids, preemptions, encoder inputs, each update's outputs (tokens, finish
reasons, ``ec_transfer_params``), the connector's log, the requests held (ids and statuses
of ``requests``), KV usage and the block tables of the live requests. Needs vLLM (the bench
venv); skipped elsewhere.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from test_integrations_vllm_ec_transit import TransitConnector, _outputs
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.outputs import KVConnectorOutput
from vllm_compare import (
    Budget,
    block_digest,
    build_pair,
    encoder_digest,
    image_arrivals,
    image_request,
    make_multimodal,
    runner_output,
)

from tokenyard.integrations._vllm_ec import EncoderConnectorBridge
from tokenyard.integrations.vllm import AsyncTokenyardScheduler


class HoldingConnector(TransitConnector):
    """Answers delay-free ``True`` from ``request_finished`` for about ``share`` of the
    requests (a seeded hash of the id), logged."""

    def __init__(self, seed: int, share: float) -> None:
        super().__init__(seed, transit=0.2, give_up=False)
        self.share = share

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any]]:
        super().request_finished(request)
        key = f"{self.seed}/{request.request_id}".encode()
        hold = zlib.crc32(key) % 1000 < self.share * 1000
        self.log.append(("hold", request.request_id, hold))
        return hold, {"ec": request.request_id}


@pytest.fixture
def multimodal(monkeypatch: pytest.MonkeyPatch) -> None:
    make_multimodal(monkeypatch)


def _held(scheduler: Any) -> list[tuple[str, str]]:
    """The finished requests still in ``requests`` (held for a send), with their status."""
    return sorted(
        (request_id, str(r.status))
        for request_id, r in scheduler.requests.items()
        if r.is_finished()
    )


def _tables(scheduler: Any) -> dict[str, Any]:
    return {
        request_id: scheduler.kv_cache_manager.get_block_ids(request_id)
        for request_id, r in scheduler.requests.items()
        if not r.is_finished()
    }


def _run(seed: int, *, is_async: bool, share: float = 0.5) -> dict[str, int]:
    """The seeded stream on both (see the module doc); returns what it exercised."""
    Budget.compute, Budget.cache = 400, 800
    options: dict[str, Any] = {}
    if is_async:
        options["classes"] = (AsyncScheduler, AsyncTokenyardScheduler)
    theirs, ours, peer = build_pair(
        max_model_len=1024,
        enable_prefix_caching=True,
        max_num_batched_tokens=128,
        num_blocks=24,
        **options,
    )
    connectors = [HoldingConnector(seed, share) for _ in range(2)]
    theirs.ec_connector, ours.ec_connector = connectors
    rng = random.Random(seed)
    arrivals = image_arrivals(rng, count=10, images=3, max_tokens=12)
    pair = (theirs, ours)
    in_flight: list[tuple[list[Any], set[str]]] = []
    # Held request -> the update that reports its send done.
    sends: dict[str, int] = {}
    seen = {"held": 0, "released": 0, "max_held": 0, "preemptions": 0}
    updates = 0
    for step in range(600):
        for at, request_id, *args in arrivals:
            if at == step:
                for s in pair:
                    s.add_request(image_request(peer._block_hasher, request_id, *args))
        outs = [s.schedule() for s in pair]
        assert block_digest(outs[1]) == block_digest(outs[0]), step
        assert encoder_digest(outs[1]) == encoder_digest(outs[0]), step
        seen["preemptions"] += len(outs[0].preempted_req_ids)
        samples = {
            r for r in outs[0].num_scheduled_tokens if not theirs.requests[r].is_prefill_chunk
        }
        in_flight.append((outs, samples))
        depth = 2 if is_async else 1
        while in_flight and (len(in_flight) >= depth or not theirs.has_unfinished_requests()):
            landing, sampled = in_flight.pop(0)
            updates += 1
            done = {r for r, at in sends.items() if at <= updates}
            for request_id in done:
                del sends[request_id]
            seen["released"] += len(done)
            results = []
            for s, out in zip(pair, landing, strict=True):
                output = runner_output(theirs, landing[0], sampled)
                output.kv_connector_output = KVConnectorOutput(finished_sending=set(done))
                results.append(_outputs(s.update_from_output(out, output)))
            assert results[1] == results[0], step
            assert connectors[1].log == connectors[0].log, step
            held = _held(theirs)
            assert _held(ours) == held, step
            for request_id, _ in held:
                if request_id not in sends:
                    sends[request_id] = updates + rng.randrange(1, 5)
                    seen["held"] += 1
            seen["max_held"] = max(seen["max_held"], len(held))
        assert _tables(ours) == _tables(theirs), step
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        idle = not theirs.has_unfinished_requests() and not in_flight
        if step > 10 and idle and not sends:
            assert not ours.has_unfinished_requests()
            assert not theirs.requests
            assert not ours.requests
            return seen
    raise AssertionError("the stream did not drain")


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_delay_free_holds_match_vllm(seed: int) -> None:
    seen = _run(seed, is_async=False)
    assert seen["held"] > 0
    assert seen["released"] == seen["held"]


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", [0, 1])
def test_delay_free_holds_match_vllm_async(seed: int) -> None:
    seen = _run(seed, is_async=True)
    assert seen["held"] > 0
    assert seen["released"] == seen["held"]


@pytest.mark.usefixtures("multimodal")
def test_the_streams_hold_several_requests_and_preempt() -> None:
    # Held blocks press on the small pool: several held at once, and preemptions.
    seen = [_run(seed, is_async=mode) for seed in range(2) for mode in (False, True)]
    assert max(s["max_held"] for s in seen) > 1
    assert sum(s["preemptions"] for s in seen) > 0


@pytest.mark.usefixtures("multimodal")
def test_the_check_fails_when_the_answer_is_not_passed_to_the_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The comparison can fail: a bridge that asks the connector but tells the core
    ``False`` (the blocks are freed at once) differs from vLLM."""
    asked = EncoderConnectorBridge.request_finished

    def not_held(self: EncoderConnectorBridge, view: Any) -> bool:
        asked(self, view)
        self.held.clear()
        self.answers = {r: (False, params) for r, (_, params) in self.answers.items()}
        return False

    monkeypatch.setattr(EncoderConnectorBridge, "request_finished", not_held)
    with pytest.raises(AssertionError):
        _run(0, is_async=False)


class RaisingConnector(TransitConnector):
    """Raises from ``request_finished``."""

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any]]:
        raise RuntimeError(f"request_finished refused {request.request_id}")


@pytest.mark.usefixtures("multimodal")
def test_an_update_that_raises_closes_the_update_lists() -> None:
    """The items an update let go are kept in ``_ec_frees`` until told; an update that
    raises (here the connector's ``request_finished``) still closes it, so the next
    update starts afresh (it was left open before, no ``finally``)."""
    Budget.compute, Budget.cache = 400, 800
    _, ours, peer = build_pair(
        max_model_len=1024, enable_prefix_caching=False, max_num_batched_tokens=256, num_blocks=64
    )
    ours.ec_connector = RaisingConnector(0, transit=0.0, give_up=False)
    prompt = [1] * 8 + [9] * 48 + [2] * 8
    ours.add_request(image_request(peer._block_hasher, "r", prompt, [(8, 48, "img0-48")], 1))
    out = ours.schedule()
    with pytest.raises(Exception, match="request_finished") as raised:
        ours.update_from_output(out, runner_output(ours, out))
    assert "refused r" in repr(raised.value) + repr(raised.value.__cause__)
    assert ours._ec_frees is None
    assert ours._ec_bridge.tokens_in_update == {}
    # The item the update let go was told before the error surfaced.
    assert ("free", "r", 0, 64) in ours.ec_connector.log
