"""tokenyard.integrations.vllm beside an encoder-cache connector (disaggregated encode):
vLLM 0.33's ``Scheduler`` asks its ``ECConnectorBase`` whether it holds each item's encoder
output (``has_cache_item`` in ``_try_schedule_encoder_inputs``: an item it holds takes cache
room, no budget, and is not encoded) and reports each item given room
(``update_state_after_alloc`` in ``_allocate_encoder_inputs``). vLLM's scheduler and the
adapter each get a connector holding the same items and run the same seeded image streams;
every step's encoder work and the connector's calls must be equal. An encoder-only instance
stops a request once its prompt is consumed. Needs vLLM (the bench venv, ``.venv-bench``);
skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import RequestStatus
from vllm_compare import (
    Budget,
    build_pair,
    compare_stream,
    encoder_digest,
    image_arrivals,
    image_request,
    make_multimodal,
)

from tokenyard.errors import ConnectorError


class HoldingConnector:
    """An encoder-cache connector (scheduler side) holding the encoder outputs of the
    identifiers in ``held``; logs ``update_state_after_alloc``. The other methods answer
    as vLLM's base class does."""

    def __init__(self, held: set[str]) -> None:
        self.held = held
        self.allocated: list[tuple[str, int]] = []

    def has_cache_item(self, identifier: str) -> bool:
        return identifier in self.held

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        self.allocated.append((request.request_id, index))

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        return True

    def update_state_after_free(self, request: Any, index: int) -> None:
        pass

    def take_unavailable_requests(self) -> set[str]:
        return set()

    def has_pending_push_work(self) -> bool:
        return False

    def build_connector_meta(self, scheduler_output: Any) -> None:
        return None

    def update_connector_output(self, output: Any) -> None:
        pass

    def request_finished(self, request: Any) -> tuple[bool, None]:
        return False, None

    def get_ec_connector_stats(self) -> None:
        return None

    def shutdown(self) -> None:
        pass


@pytest.fixture
def multimodal(monkeypatch: pytest.MonkeyPatch) -> None:
    make_multimodal(monkeypatch)


def _run(seed: int, held: set[str], budget: int, cache: int) -> tuple[int, list[Any]]:
    Budget.compute, Budget.cache = budget, cache
    theirs, ours, peer = build_pair(
        max_model_len=1024, enable_prefix_caching=True, max_num_batched_tokens=256, num_blocks=200
    )
    connectors = [HoldingConnector(held), HoldingConnector(held)]
    theirs.ec_connector, ours.ec_connector = connectors
    arrivals = image_arrivals(random.Random(seed), count=10, images=4, max_tokens=20)
    encoded = 0

    def count(outs: list[Any]) -> None:
        nonlocal encoded
        encoded += sum(len(v) for v in outs[0].scheduled_encoder_inputs.values())

    compare_stream(
        theirs,
        ours,
        arrivals,
        lambda *args: image_request(peer._block_hasher, *args),
        digest=encoder_digest,
        settle_steps=8,
        max_steps=1000,
        check_kv=False,
        on_scheduled=count,
    )
    assert connectors[1].allocated == connectors[0].allocated
    return encoded, connectors[0].allocated


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", [0, 1])
def test_items_the_connector_holds_are_loaded_not_encoded_as_in_vllm(seed: int) -> None:
    held = {f"img{i}-{n}" for i in (0, 2) for n in (48, 96, 144)}
    encoded, allocated = _run(seed, held, budget=160, cache=600)
    assert allocated, "the stream gave items cache room"
    # Without the connector holding anything, more is encoded.
    encoded_alone, _ = _run(seed, set(), budget=160, cache=600)
    assert encoded < encoded_alone


@pytest.mark.usefixtures("multimodal")
def test_an_encoder_only_instance_stops_a_request_once_its_prompt_is_consumed() -> None:
    """vLLM's ``update_from_output`` with ``is_mm_encoder_only``: no token is sampled; the
    request stops with no tokens once its computed tokens reach the prompt's end."""
    Budget.compute, Budget.cache = 1024, 2048
    theirs, ours, peer = build_pair(
        max_model_len=1024, enable_prefix_caching=False, max_num_batched_tokens=256, num_blocks=200
    )
    for scheduler in (theirs, ours):
        scheduler.is_mm_encoder_only = True
        scheduler.ec_connector = HoldingConnector(set())
        items = [(8, 96, "img0-96")]
        prompt = [1] * 8 + [9] * 96 + [2] * 200
        request = image_request(peer._block_hasher, "r", prompt, items, 16)
        scheduler.add_request(request)
        seen = []
        while not request.is_finished():
            out = scheduler.schedule()
            ids = list(out.num_scheduled_tokens)
            empty = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={i: n for n, i in enumerate(ids)},
                sampled_token_ids=[[]] * len(ids),
            )
            outputs = scheduler.update_from_output(out, empty)
            emitted = [
                (o.request_id, o.new_token_ids, o.finish_reason)
                for e in outputs.values()
                for o in e.outputs
            ]
            seen.append((dict(out.num_scheduled_tokens), out.scheduled_encoder_inputs, emitted))
        assert request.status == RequestStatus.FINISHED_STOPPED
        assert request.num_output_tokens == 0
        if scheduler is theirs:
            expected = seen
    assert seen == expected
    assert len(seen) == 2, "a 304-token prompt in 256-token chunks"


@pytest.mark.usefixtures("multimodal")
def test_a_connector_exception_is_a_typed_error_and_the_step_comes_next() -> None:
    Budget.compute, Budget.cache = 1024, 2048
    _, ours, peer = build_pair(
        max_model_len=1024, enable_prefix_caching=True, max_num_batched_tokens=256, num_blocks=200
    )
    connector = HoldingConnector(set())

    def store_down(identifier: str) -> bool:
        raise RuntimeError("store down")

    connector.has_cache_item = store_down  # type: ignore[method-assign]
    ours.ec_connector = connector
    prompt = [1] * 8 + [9] * 48 + [2] * 8
    ours.add_request(image_request(peer._block_hasher, "r", prompt, [(8, 48, "img0-48")], 4))
    with pytest.raises(ConnectorError, match="has_cache_item") as raised:
        ours.schedule()
    assert isinstance(raised.value.__cause__, RuntimeError)
    out = ours.schedule()
    assert out.num_scheduled_tokens == {"r": 64}
    assert out.scheduled_encoder_inputs == {"r": [0]}
