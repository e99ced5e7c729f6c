"""tokenyard.integrations.vllm beside an encoder-cache connector whose encoder outputs are in
transit, against vLLM 0.33's own ``Scheduler`` and ``AsyncScheduler``: before a request with
multimodal items is given tokens, vLLM asks ``ensure_cache_available(request,
num_computed_tokens)`` (the running loop with the landed frontier, computed less the
outputs in flight; the waiting loop through ``_ec_transfer_pending`` after the prefix
lookup, and first on its branch for requests with computed tokens) and skips the request
for the step if the answer is false (a waiting one keeps its place, ``skip_request``); at
each update the requests the connector can no longer serve (``take_unavailable_requests``)
finish with ``FINISHED_ERROR``; ``_free_request`` hands the connector's
``request_finished`` params to the finished output (``ec_transfer_params``). A seeded
connector answers from the asks it got; every step's decisions, encoder work, outputs and
the connector's log must be equal, its ``update_state_after_free`` calls (vLLM's
``_free_encoder_input``, from ``update_from_output`` once a request's computed tokens pass
an item) and ``request_finished`` calls in it. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm_compare import (
    Budget,
    build_pair,
    encoder_digest,
    image_arrivals,
    image_request,
    make_multimodal,
    runner_output,
)

from tokenyard.integrations._vllm_ec import EncoderConnectorBridge
from tokenyard.integrations.vllm import AsyncTokenyardScheduler


class TransitConnector:
    """An encoder-cache connector (scheduler side) whose outputs arrive late: asked for a
    request at ``num_computed_tokens`` in its ``step``-th step, it answers false while a
    seeded hash of the three says so (about ``transit`` of the asks); from step 6 it gives
    up on one request it was asked about (``take_unavailable_requests``). Its finished
    requests' params name them. Logs every ask, each item let go and each finish."""

    def __init__(self, seed: int, transit: float, give_up: bool) -> None:
        self.seed = seed
        self.transit = transit
        self.give_up = give_up
        self.steps = 0
        self.log: list[tuple[Any, ...]] = []
        self.asked: list[str] = []
        self.given_up: set[str] = set()

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        request_id = request.request_id
        key = f"{self.seed}/{request_id}/{num_computed_tokens}/{self.steps}".encode()
        available = zlib.crc32(key) % 1000 >= self.transit * 1000
        self.log.append(("ensure", request_id, num_computed_tokens, self.steps, available))
        if request_id not in self.asked:
            self.asked.append(request_id)
        return available

    def take_unavailable_requests(self) -> set[str]:
        if not self.give_up or self.steps < 6 or self.given_up:
            return set()
        pending = [r for r in self.asked if r not in self.given_up]
        if not pending:
            return set()
        self.given_up.add(pending[len(pending) // 2])
        self.log.append(("give up", sorted(self.given_up)))
        return set(self.given_up)

    def has_cache_item(self, identifier: str) -> bool:
        return False

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        self.log.append(("alloc", request.request_id, index))

    def update_state_after_free(self, request: Any, index: int) -> None:
        self.log.append(("free", request.request_id, index, request.num_computed_tokens))

    def has_pending_push_work(self) -> bool:
        return False

    def build_connector_meta(self, scheduler_output: Any) -> None:
        self.steps += 1

    def update_connector_output(self, output: Any) -> None:
        pass

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any]]:
        self.log.append(("finished", request.request_id, str(request.status)))
        return False, {"ec": request.request_id}

    def get_ec_connector_stats(self) -> None:
        return None

    def shutdown(self) -> None:
        pass


@pytest.fixture
def multimodal(monkeypatch: pytest.MonkeyPatch) -> None:
    make_multimodal(monkeypatch)


def _outputs(engine_outputs: dict[int, Any]) -> list[Any]:
    return sorted(
        (
            o.request_id,
            list(o.new_token_ids),
            str(o.finish_reason),
            o.ec_transfer_params,
        )
        for eco in engine_outputs.values()
        for o in eco.outputs
    )


def _run(seed: int, transit: float, give_up: bool, is_async: bool = False) -> list[Any]:
    """The seeded image stream on both; returns vLLM's connector log after checking each
    step agrees."""
    Budget.compute, Budget.cache = 400, 800
    options: dict[str, Any] = {}
    if is_async:
        options["classes"] = (AsyncScheduler, AsyncTokenyardScheduler)
    theirs, ours, peer = build_pair(
        max_model_len=1024,
        enable_prefix_caching=True,
        max_num_batched_tokens=128,
        num_blocks=200,
        **options,
    )
    connectors = [TransitConnector(seed, transit, give_up) for _ in range(2)]
    theirs.ec_connector, ours.ec_connector = connectors
    arrivals = image_arrivals(random.Random(seed), count=8, images=3, max_tokens=12)
    pair = (theirs, ours)
    in_flight: list[tuple[list[Any], set[str]]] = []
    for step in range(600):
        for at, request_id, *args in arrivals:
            if at == step:
                for s in pair:
                    s.add_request(image_request(peer._block_hasher, request_id, *args))
        outs = [s.schedule() for s in pair]
        assert encoder_digest(outs[1]) == encoder_digest(outs[0]), step
        # The requests that sample: those the step takes past their prompt (vLLM's).
        samples = {
            r for r in outs[0].num_scheduled_tokens if not theirs.requests[r].is_prefill_chunk
        }
        in_flight.append((outs, samples))
        depth = 2 if is_async else 1
        while in_flight and (len(in_flight) >= depth or not theirs.has_unfinished_requests()):
            landing, sampled = in_flight.pop(0)
            results = [
                _outputs(s.update_from_output(out, runner_output(theirs, landing[0], sampled)))
                for s, out in zip(pair, landing, strict=True)
            ]
            assert results[1] == results[0], step
            assert connectors[1].log == connectors[0].log, step
            for request_id, r in theirs.requests.items():
                assert ours.requests[request_id].status == r.status, (step, request_id)
        if step > 10 and not in_flight and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return connectors[0].log
    raise AssertionError("the stream did not drain")


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_requests_wait_for_inputs_in_transit_as_in_vllm(seed: int) -> None:
    log = _run(seed, transit=0.4, give_up=False)
    answers = [entry[-1] for entry in log if entry[0] == "ensure"]
    assert False in answers, "some asks found inputs in transit"
    assert True in answers
    assert any(entry[0] == "free" for entry in log), "items were let go, and reported"
    assert any(entry[0] == "finished" for entry in log)


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", [0, 3])
def test_requests_the_connector_gives_up_on_finish_with_an_error_as_in_vllm(seed: int) -> None:
    log = _run(seed, transit=0.3, give_up=True)
    assert any(entry[0] == "give up" for entry in log)


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", [0, 1])
def test_async_steps_wait_for_inputs_in_transit_as_in_vllm(seed: int) -> None:
    _run(seed, transit=0.4, give_up=True, is_async=True)


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("is_async", [False, True])
def test_the_log_check_fails_when_items_let_go_are_not_reported(
    monkeypatch: pytest.MonkeyPatch, is_async: bool
) -> None:
    """The check can fail: the adapter's bridge not passing ``update_state_after_free`` on
    makes the connector logs differ at the first item let go."""
    monkeypatch.setattr(EncoderConnectorBridge, "update_state_after_free", lambda *a: None)
    with pytest.raises(AssertionError):
        _run(0, transit=0.4, give_up=False, is_async=is_async)
