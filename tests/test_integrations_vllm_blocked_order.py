"""Admission order with requests blocked for different reasons, as vLLM 0.33's
``Scheduler.schedule()`` has it (``vllm/v1/core/sched/scheduler.py``): a request whose
status is blocked (``_is_blocked_waiting_status``: a grammar compiling,
``WAITING_FOR_STREAMING_REQ`` or ``WAITING_FOR_REMOTE_KVS`` set by hand) is queued where it
arrives (``_enqueue_waiting_request``; a remote-KV wait in ``kv_holding_waiting`` by its
status alone, ``_holds_kv_blocks``), the holders are drained first, and
``_handle_blocked_waiting_request`` is asked each time the admission loop reaches one: not
ready, it is skipped and put back ahead of those skipped after it (``skip_request``,
``prepend_requests``); ready, it is admitted in its turn, a received remote-KV wait through
``_update_waiting_for_remote_kv``. Each rule is a case run on vLLM's own scheduler and on
``TokenyardScheduler`` with the same arguments, and a seeded differential test mixes the
kinds at random and compares every step. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import InputError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

GRAMMAR = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
REMOTE = RequestStatus.WAITING_FOR_REMOTE_KVS
STREAMING = RequestStatus.WAITING_FOR_STREAMING_REQ


class _Manager:
    """A stand-in for vLLM's ``StructuredOutputManager``: every token accepted."""

    def accept_tokens(self, request: Request, tokens: list[int]) -> bool:
        return True

    def grammar_bitmask(self, requests: Any, ids: list[str], spec: Any) -> list[str]:
        return list(ids)

    def validate_tokens(self, request: Request, tokens: list[int]) -> list[int]:
        return tokens


class _Landings:
    """``_update_waiting_for_remote_kv`` replaced as vLLM's tests replace it (its own
    asserts a connector): records each call and takes the landing off the record."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.calls: list[str] = []

    def __call__(self, request: Request) -> None:
        self.calls.append(request.request_id)
        self.scheduler.finished_recving_kv_req_ids.discard(request.request_id)


def _both(async_scheduling: bool = False, **options: Any) -> dict[str, Any]:
    """vLLM's Scheduler and TokenyardScheduler (their async variants with
    ``async_scheduling``) over the same configs, each with its own stand-in grammar manager
    and recorded ``_update_waiting_for_remote_kv``."""
    config = {"num_blocks": 64, "max_num_seqs": 4, "max_num_batched_tokens": 64}
    config.update(options)
    peer = VllmSchedulerPeer(max_model_len=256, **config)
    kv_cache_config = peer.scheduler.kv_cache_config
    if async_scheduling:
        classes = (AsyncScheduler, AsyncTokenyardScheduler)
    else:
        classes = (Scheduler, TokenyardScheduler)
    schedulers = {
        name: peer.build(cls, kv_cache_config)
        for name, cls in zip(("vllm", "tokenyard"), classes, strict=True)
    }
    for scheduler in schedulers.values():
        scheduler.structured_output_manager = _Manager()
        scheduler._update_waiting_for_remote_kv = _Landings(scheduler)
    return schedulers


def _request(request_id: str, kind: str, num_tokens: int = 4) -> Request:
    """A request of ``kind``: ``plain``, ``grammar`` (compiling), ``ready`` (a grammar
    compiled before it arrives), ``streaming`` or ``remote`` (that status set by hand)."""
    structured = kind in ("grammar", "ready")
    params = SamplingParams(
        max_tokens=3,
        structured_outputs=StructuredOutputsParams(regex="[0-9]+") if structured else None,
    )
    # Prompts share no prefix: these requests carry no block hasher, so vLLM caches none.
    base = zlib.crc32(request_id.encode()) % 100_000 * 100
    request = Request(request_id, [base + t for t in range(num_tokens)], params, None)
    if kind == "ready":
        request.structured_output_request.grammar = object()
    elif kind == "streaming":
        request.status = STREAMING
    elif kind == "remote":
        request.status = REMOTE
    return request


def _update(scheduler: Any, out: Any) -> None:
    """The model's answer: token 5 for each request whose prefill the step completes."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for request_id in ids:
        request = scheduler.requests[request_id]
        sampled.append([5] if request.num_computed_tokens >= request.num_tokens else [])
    runner = ModelRunnerOutput(
        req_ids=ids, req_id_to_index={i: n for n, i in enumerate(ids)}, sampled_token_ids=sampled
    )
    scheduler.update_from_output(out, runner)


def _ids(queue: Any) -> list[str]:
    return [r.request_id for r in queue]


def _state(scheduler: Any, out: Any) -> dict[str, Any]:
    """What a step leaves, as vLLM's callers read it."""
    return {
        "new": [r.req_id for r in out.scheduled_new_reqs],
        "tokens": dict(out.num_scheduled_tokens),
        "running": _ids(scheduler.running),
        "waiting": _ids(scheduler.waiting),
        "kv_holding": _ids(scheduler.kv_holding_waiting),
        "deferred": sorted(r.request_id for r in scheduler.deferred_waiting),
        "statuses": {i: str(r.status) for i, r in sorted(scheduler.requests.items())},
        "counts": scheduler.get_request_counts(),
        "landings": list(scheduler._update_waiting_for_remote_kv.calls),
    }


def _each(kinds: dict[str, str], **options: Any) -> dict[str, tuple[Any, dict[str, Request]]]:
    """Both schedulers, each given its own copies of the requests (in ``kinds`` order)."""
    out = {}
    for name, scheduler in _both(**options).items():
        requests = {i: _request(i, kind) for i, kind in kinds.items()}
        for request in requests.values():
            scheduler.add_request(request)
        out[name] = (scheduler, requests)
    return out


def _agree(runs: dict[str, tuple[Any, dict[str, Request]]]) -> dict[str, Any]:
    """One step on each; the two states must agree. Returns vLLM's."""
    states = {}
    for name, (scheduler, _) in runs.items():
        out = scheduler.schedule()
        states[name] = _state(scheduler, out)
        _update(scheduler, out)
    assert states["tokenyard"] == states["vllm"]
    return states["vllm"]


def test_a_remote_kv_wait_given_by_status_is_queued_with_the_block_holders() -> None:
    runs = _each({"a": "plain", "r": "remote", "b": "plain"})
    for scheduler, _ in runs.values():
        assert _ids(scheduler.kv_holding_waiting) == ["r"]
        assert _ids(scheduler.waiting) == ["a", "b"]
        assert _ids(scheduler.deferred_waiting) == ["r"]
    state = _agree(runs)
    assert state["new"] == ["a", "b"]
    assert state["kv_holding"] == ["r"]


def test_a_received_remote_kv_drains_before_a_grammar_ready_in_the_same_step() -> None:
    """One slot: the received remote-KV wait takes it, the grammar requests stay, their
    status unread (the loop stops before them)."""
    runs = _each({"g": "grammar", "r": "remote", "t": "plain"}, max_num_seqs=1)
    for scheduler, requests in runs.values():
        requests["g"].structured_output_request.grammar = object()
        scheduler.finished_recving_kv_req_ids.add("r")
    state = _agree(runs)
    assert state["new"] == ["r"]
    assert state["waiting"] == ["g", "t"]
    assert state["statuses"]["g"] == str(GRAMMAR)
    assert state["landings"] == ["r"]


def test_blocked_requests_keep_their_places_while_later_ones_run() -> None:
    runs = _each({"g": "grammar", "s": "streaming", "a": "plain", "b": "plain"}, max_num_seqs=4)
    state = _agree(runs)
    assert state["new"] == ["a", "b"]
    assert state["waiting"] == ["g", "s"]
    for _, requests in runs.values():
        requests["s"].status = RequestStatus.WAITING
        requests["g"].structured_output_request.grammar = object()
    state = _agree(runs)
    assert state["new"] == ["g", "s"]


def test_a_failed_grammar_finishes_with_an_error_once_reached() -> None:
    runs = _each({"g": "grammar", "a": "plain"})
    for _, requests in runs.values():
        requests["g"].structured_output_request.grammar = ValueError("bad regex")
    state = _agree(runs)
    assert state["new"] == ["a"]
    assert state["statuses"]["g"] == str(GRAMMAR)
    for scheduler, requests in runs.values():
        # Finished by that step's update with a validation error (vLLM's).
        assert "g" not in scheduler.requests
        assert requests["g"].status == RequestStatus.FINISHED_ERROR


def test_a_remote_kv_wait_not_received_stays_first_in_line() -> None:
    runs = _each({"r": "remote", "a": "plain"}, max_num_seqs=1)
    state = _agree(runs)
    assert state["new"] == ["a"]
    assert state["kv_holding"] == ["r"]
    assert state["landings"] == []


def test_requests_moved_between_queues_by_hand_are_admitted_from_there() -> None:
    """vLLM's test_prepend_skipped_requests_order, on both: two queued requests set to
    remote-KV waits and moved to ``kv_holding_waiting`` by hand are skipped, keeping their
    order ahead of the rest."""
    runs = _each({str(i): "plain" for i in range(4)}, max_num_seqs=1)
    for scheduler, requests in runs.values():
        moved = [requests["0"], requests["1"]]
        for request in moved:
            request.status = REMOTE
        scheduler.waiting.remove_requests(moved)
        for request in moved:
            scheduler.kv_holding_waiting.add_request(request)
    state = _agree(runs)
    assert state["new"] == ["2"]
    assert state["kv_holding"] + state["waiting"] == ["0", "1", "3"]


def test_moving_a_request_between_queues_by_hand_defers_nothing() -> None:
    # vLLM's RequestQueue.add_request and remove_requests never touch deferred_waiting:
    # only arrival with a blocked status (_enqueue_waiting_request) and a skip add to it.
    runs = _each({"0": "plain", "1": "plain"})
    for scheduler, requests in runs.values():
        moved = requests["0"]
        scheduler.waiting.remove_requests([moved])
        moved.status = REMOTE
        scheduler.kv_holding_waiting.add_request(moved)
    seen = {
        name: (sorted(r.request_id for r in s.deferred_waiting), s.get_request_counts())
        for name, (s, _) in runs.items()
    }
    assert seen["tokenyard"] == seen["vllm"]
    assert seen["vllm"][0] == []


def test_a_request_taken_out_of_the_queues_is_not_admitted() -> None:
    ours = _both()["tokenyard"]
    a, b = _request("a", "plain"), _request("b", "plain")
    ours.add_request(a)
    ours.add_request(b)
    ours.waiting.remove_requests([a])
    assert _ids(ours.waiting) == ["b"]
    assert list(ours.schedule().num_scheduled_tokens) == ["b"]
    ours.waiting.add_request(a)
    assert [r.req_id for r in ours.schedule().scheduled_new_reqs] == ["a"]
    with pytest.raises(InputError, match="not a request of this scheduler"):
        ours.waiting.add_request(_request("c", "plain"))
    with pytest.raises(InputError, match="request_id"):
        ours.kv_holding_waiting.add_request(a)  # running: not waiting
    # vLLM's remove_requests passes over a request in no queue.
    ours.waiting.remove_requests([b])
    assert _ids(ours.running) == ["b", "a"]


def test_a_replaced_update_waiting_for_remote_kv_is_called_when_reached() -> None:
    ours = _both(max_num_seqs=1)["tokenyard"]
    ours.add_request(_request("a", "plain"))
    ours.add_request(_request("r", "remote"))
    ours.finished_recving_kv_req_ids.add("r")
    # The holders first: r is reached and promoted, then a waits for the slot.
    out = ours.schedule()
    assert list(out.num_scheduled_tokens) == ["r"]
    assert ours._update_waiting_for_remote_kv.calls == ["r"]


def test_a_transfer_report_lands_a_remote_kv_wait_without_a_connector() -> None:
    # vLLM's update_from_output runs _update_from_kv_xfer_finished whenever the runner's
    # output carries kv_connector_output, connector or not.
    from vllm.v1.outputs import KVConnectorOutput

    for scheduler in _both().values():
        scheduler.add_request(_request("a", "plain"))
        scheduler.add_request(_request("r", "remote"))
        out = scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        runner = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={i: n for n, i in enumerate(ids)},
            sampled_token_ids=[[5] for _ in ids],
            kv_connector_output=KVConnectorOutput(finished_recving={"r"}),
        )
        scheduler.update_from_output(out, runner)
        assert scheduler.finished_recving_kv_req_ids == {"r"}
        out = scheduler.schedule()
        assert [r.req_id for r in out.scheduled_new_reqs] == ["r"]


KINDS = ("plain", "plain", "grammar", "ready", "streaming", "remote")


def _scenario(seed: int) -> list[dict[str, Any]]:
    """A seeded script: arrivals of random kinds and lengths, and per step the blocked
    requests whose wait ends (grammar compiled or failed, streaming set to WAITING, remote
    KV received) and the plain requests aborted."""
    rng = random.Random(seed)
    script = []
    live: dict[str, str] = {}
    for step in range(10):
        events: dict[str, Any] = {"arrive": [], "ready": [], "abort": []}
        for k in range(rng.randint(0, 3)):
            request_id = f"{step}-{k}"
            kind = rng.choice(KINDS)
            events["arrive"].append((request_id, kind, rng.randint(1, 24)))
            live[request_id] = kind
        for request_id, kind in list(live.items()):
            if kind in ("grammar", "streaming", "remote") and rng.random() < 0.3:
                fails = kind == "grammar" and rng.random() < 0.2
                events["ready"].append((request_id, kind, fails))
                live[request_id] = "plain"
            elif kind == "plain" and rng.random() < 0.05:
                events["abort"].append(request_id)
                del live[request_id]
        script.append(events)
    return script


def _play(scheduler: Any, script: list[dict[str, Any]]) -> list[dict[str, Any]]:
    requests: dict[str, Request] = {}
    states = []
    for events in script:
        for request_id, kind, num_tokens in events["arrive"]:
            requests[request_id] = _request(request_id, kind, num_tokens)
            scheduler.add_request(requests[request_id])
        for request_id, kind, fails in events["ready"]:
            request = requests[request_id]
            if request.is_finished():
                continue
            if kind == "grammar":
                grammar = ValueError("bad regex") if fails else object()
                request.structured_output_request.grammar = grammar
            elif kind == "streaming":
                if request.status == STREAMING:
                    request.status = RequestStatus.WAITING
            else:
                scheduler.finished_recving_kv_req_ids.add(request_id)
        if events["abort"]:
            scheduler.finish_requests(events["abort"], RequestStatus.FINISHED_ABORTED)
        out = scheduler.schedule()
        states.append(_state(scheduler, out))
        _update(scheduler, out)
    return states


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", range(24))
def test_mixed_blocked_kinds_agree_with_vllm_step_by_step(
    seed: int, async_scheduling: bool
) -> None:
    """Random mixes of grammar (compiling, compiled, failed), streaming and remote-KV waits
    set by hand, plain requests and aborts, under a random sequence cap and budget: every
    step's admissions, queues, statuses and landings are vLLM's (its async scheduler's too,
    each step's output applied before the next)."""
    rng = random.Random(1000 + seed)
    options = {
        "max_num_seqs": rng.choice((1, 2, 3, 6)),
        "max_num_batched_tokens": rng.choice((16, 24, 64)),
    }
    script = _scenario(seed)
    schedulers = _both(async_scheduling, **options)
    played = {name: _play(s, script) for name, s in schedulers.items()}
    for step, (theirs, ours) in enumerate(zip(played["vllm"], played["tokenyard"], strict=True)):
        assert ours == theirs, f"seed {seed} {options}: first difference at step {step}"
