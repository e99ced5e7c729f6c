"""tokenyard.integrations.vllm: request kinds (structured output, pooling) and KV-connector
behaviours (``requires_kv_delivery``, a KV consumer's deferred block free) as vLLM 0.33's
``Scheduler`` has them (``vllm/v1/core/sched/scheduler.py``), each case run on vLLM's own
scheduler and on ``TokenyardScheduler`` with the same vLLM arguments, and the answers
compared. Needs vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm.outputs import RequestError
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import TokenyardScheduler


class _Manager:
    """A stand-in for vLLM's ``StructuredOutputManager``: grammars accept every token but
    ``reject``; the bitmask is the ids it was asked for."""

    def __init__(self, reject: int = -1) -> None:
        self.reject = reject
        self.accepted: dict[str, list[int]] = {}
        self.bitmask_calls: list[list[str]] = []

    def accept_tokens(self, request: Request, tokens: list[int]) -> bool:
        if not request.use_structured_output:
            return True
        self.accepted.setdefault(request.request_id, []).extend(tokens)
        return self.reject not in tokens

    def grammar_bitmask(self, requests: Any, ids: list[str], spec: Any) -> list[str]:
        self.bitmask_calls.append(list(ids))
        return list(ids)

    def validate_tokens(self, request: Request, tokens: list[int]) -> list[int]:
        return tokens


def _both(manager_factory: Any = _Manager, **options: Any) -> dict[str, Any]:
    """vLLM's Scheduler and TokenyardScheduler over the same configs, each with its own
    stand-in manager."""
    config = {"num_blocks": 64, "max_num_seqs": 4, "max_num_batched_tokens": 64}
    config.update(options)
    peer = VllmSchedulerPeer(max_model_len=256, **config)
    ours = TokenyardScheduler(
        vllm_config=peer.vllm_config,
        kv_cache_config=peer.scheduler.kv_cache_config,
        structured_output_manager=manager_factory(),
        block_size=16,
        log_stats=True,
    )
    peer.scheduler.structured_output_manager = manager_factory()
    return {"vllm": peer.scheduler, "tokenyard": ours}


def _structured(request_id: str, num_tokens: int = 8, max_tokens: int = 4) -> Request:
    params = SamplingParams(
        max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(regex="[0-9]+")
    )
    return Request(request_id, list(range(num_tokens)), params, None)


def _plain(request_id: str, num_tokens: int = 8, max_tokens: int = 4) -> Request:
    return Request(request_id, list(range(num_tokens)), SamplingParams(max_tokens=max_tokens), None)


def _step(scheduler: Any, tokens: dict[str, list[int]] | None = None) -> tuple[Any, Any]:
    """One step; each request that ends its prefill samples token 5 (or ``tokens``)."""
    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for request_id in ids:
        request = scheduler.requests[request_id]
        done = request.num_computed_tokens >= request.num_tokens
        sampled.append((tokens or {}).get(request_id, [5]) if done else [])
    runner = ModelRunnerOutput(
        req_ids=ids, req_id_to_index={i: n for n, i in enumerate(ids)}, sampled_token_ids=sampled
    )
    return out, scheduler.update_from_output(out, runner)


def test_a_request_waits_for_its_grammar_deferred_then_runs() -> None:
    """Three requests, the first with a grammar still compiling: the other two run, the
    first stays waiting (and deferred) until the grammar is there, then runs."""
    for name, scheduler in _both().items():
        first = _structured("g")
        assert first.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        for request in (first, _plain("a"), _plain("b")):
            scheduler.add_request(request)
        out, _ = _step(scheduler)
        assert list(out.num_scheduled_tokens) == ["a", "b"], name
        assert [r.request_id for r in scheduler.waiting] == ["g"], name
        assert [r.request_id for r in scheduler.deferred_waiting] == ["g"], name
        assert scheduler.get_request_counts() == (2, 1), name
        first.structured_output_request.grammar = object()
        out, _ = _step(scheduler)
        assert out.num_scheduled_tokens == {"a": 1, "b": 1, "g": 8}, name
        assert first.status == RequestStatus.RUNNING, name
        assert not scheduler.deferred_waiting, name


def test_grammar_bitmask_covers_the_structured_requests_past_their_prefill() -> None:
    """``has_structured_output_requests`` is set by a step with a structured request past
    its prefill, and the bitmask is asked for exactly those requests, in step order."""
    for name, scheduler in _both().items():
        scheduler.add_request(_plain("a"))
        g = _structured("g")
        g.structured_output_request.grammar = object()
        scheduler.add_request(g)
        out, _ = _step(scheduler)
        assert out.has_structured_output_requests, name
        grammar = scheduler.get_grammar_bitmask(out)
        assert grammar.structured_output_request_ids == ["g"], name
        assert scheduler.structured_output_manager.bitmask_calls == [["g"]], name
        # Tokens sampled under the grammar advance it.
        assert scheduler.structured_output_manager.accepted == {"g": [5]}, name

    for name, scheduler in _both().items():
        scheduler.add_request(_plain("a"))
        out, _ = _step(scheduler)
        assert not out.has_structured_output_requests, name
        assert scheduler.get_grammar_bitmask(out) is None, name


def test_grammar_compile_error_finishes_that_request_with_a_validation_error() -> None:
    for name, scheduler in _both().items():
        bad = _structured("bad")
        bad.structured_output_request.grammar = RuntimeError("no grammar")
        scheduler.add_request(bad)
        out, outputs = _step(scheduler)
        assert not out.num_scheduled_tokens, name
        assert bad.status == RequestStatus.FINISHED_ERROR, name
        assert "bad" not in scheduler.requests, name
        (output,) = outputs[0].outputs
        assert output.request_id == "bad", name
        assert output.error == RequestError(
            code="validation_error", message="Invalid structured outputs: no grammar"
        ), name
        scheduler.add_request(_plain("ok"))
        out, _ = _step(scheduler)
        assert "bad" in out.finished_req_ids, name
        assert list(out.num_scheduled_tokens) == ["ok"], name


def test_a_token_the_grammar_rejects_finishes_the_request_with_an_error() -> None:
    for name, scheduler in _both(lambda: _Manager(reject=9)).items():
        g = _structured("g")
        g.structured_output_request.grammar = object()
        scheduler.add_request(g)
        scheduler.add_request(_plain("a"))
        _, outputs = _step(scheduler, {"g": [9], "a": [9]})
        by_id = {o.request_id: o for o in outputs[0].outputs}
        assert g.status == RequestStatus.FINISHED_ERROR, name
        assert str(by_id["g"].finish_reason) == "error", name
        assert by_id["g"].new_token_ids == [9], name
        assert by_id["a"].finish_reason is None, name
        out, _ = _step(scheduler)
        assert list(out.num_scheduled_tokens) == ["a"], name
        assert scheduler.get_request_counts() == (1, 0), name


def test_aborting_a_request_that_waits_for_its_grammar() -> None:
    for name, scheduler in _both().items():
        scheduler.add_request(_structured("g"))
        (done,) = scheduler.finish_requests("g", RequestStatus.FINISHED_ABORTED)
        assert done.status == RequestStatus.FINISHED_ABORTED, name
        assert not scheduler.has_request("g"), name
        assert scheduler.get_request_counts() == (0, 0), name
        out, _ = _step(scheduler)
        assert out.finished_req_ids == {"g"}, name


def test_no_connector_means_no_kv_delivery_and_no_deferred_free() -> None:
    for name, scheduler in _both().items():
        assert scheduler.requires_kv_delivery is False, name
        assert scheduler.defer_block_free is False, name


@pytest.mark.parametrize(
    ("kv_role", "expected"), [("kv_producer", True), ("kv_both", True), ("kv_consumer", False)]
)
def test_kv_delivery_is_required_of_a_kv_producer(
    kv_role: str, expected: bool, tmp_path: Path
) -> None:
    """vLLM's ``requires_kv_delivery``: the connector's, True for a role that hands KV
    off when a request completes."""
    from vllm.config import KVTransferConfig
    from vllm.v1.core.sched.scheduler import Scheduler

    peer = VllmSchedulerPeer(
        num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256
    )
    # ExampleConnector has no HMA support: vLLM turns HMA off when the config is built
    # with it; it is set after the build here.
    peer.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="ExampleConnector",
        kv_role=kv_role,
        kv_connector_extra_config={"shared_storage_path": str(tmp_path)},
    )
    for cls in (Scheduler, TokenyardScheduler):
        scheduler = cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=peer.scheduler.kv_cache_config,
            structured_output_manager=_Manager(),
            block_size=16,
        )
        assert scheduler.requires_kv_delivery is expected, cls.__name__
        scheduler.shutdown()


def _consumer_pair(tmp_path: Path) -> dict[str, Any]:
    """vLLM's AsyncScheduler and AsyncTokenyardScheduler with a KV-consumer connector and two
    batches in flight (vLLM's ``max_concurrent_batches``, which a CPU build keeps at 1:
    patched as vLLM's own tests patch it)."""
    from unittest.mock import PropertyMock, patch

    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from tokenyard.integrations.vllm import AsyncTokenyardScheduler

    peer = VllmSchedulerPeer(
        num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256
    )
    # ExampleConnector has no HMA support: vLLM turns HMA off when the config is built
    # with it; it is set after the build here.
    peer.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="ExampleConnector",
        kv_role="kv_consumer",
        kv_connector_extra_config={"shared_storage_path": str(tmp_path)},
    )
    pair = {}
    with patch.object(
        VllmConfig, "max_concurrent_batches", new_callable=PropertyMock, return_value=2
    ):
        for name, cls in (("vllm", AsyncScheduler), ("tokenyard", AsyncTokenyardScheduler)):
            pair[name] = cls(
                vllm_config=peer.vllm_config,
                kv_cache_config=peer.scheduler.kv_cache_config,
                structured_output_manager=_Manager(),
                block_size=16,
            )
    return pair


def _runner_output(out: Any, token: int) -> ModelRunnerOutput:
    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={i: n for n, i in enumerate(ids)},
        sampled_token_ids=[[token] for _ in ids],
    )


def test_a_kv_consumer_defers_a_finished_requests_free_past_its_step_in_flight(
    tmp_path: Path,
) -> None:
    """33-token prompt (3 blocks), stop token 42: it stops on its prefill's output while
    its next step is in flight; its 3 blocks stay taken until that step's output lands."""
    for name, scheduler in _consumer_pair(tmp_path).items():
        assert scheduler.defer_block_free, name
        pool = scheduler.kv_cache_manager.block_pool
        free_initially = pool.get_num_free_blocks()
        params = SamplingParams(max_tokens=5, stop_token_ids=[42])
        request = Request("r", list(range(33)), params, None)
        scheduler.add_request(request)
        out0 = scheduler.schedule()
        out1 = scheduler.schedule()
        assert out1.num_scheduled_tokens == {"r": 1}, name
        free_running = pool.get_num_free_blocks()
        assert free_running == free_initially - 3, name
        scheduler.update_from_output(out0, _runner_output(out0, 42))
        assert request.is_finished(), name
        assert len(scheduler.deferred_frees) == 1, name
        assert pool.get_num_free_blocks() == free_running, name
        scheduler.update_from_output(out1, _runner_output(out1, 0))
        assert not scheduler.deferred_frees, name
        assert pool.get_num_free_blocks() == free_initially, name
        scheduler.shutdown()


def test_a_kv_consumer_frees_at_once_when_no_step_is_in_flight(tmp_path: Path) -> None:
    for name, scheduler in _consumer_pair(tmp_path).items():
        pool = scheduler.kv_cache_manager.block_pool
        free_initially = pool.get_num_free_blocks()
        params = SamplingParams(max_tokens=5, stop_token_ids=[42])
        scheduler.add_request(Request("r", list(range(33)), params, None))
        out0 = scheduler.schedule()
        scheduler.update_from_output(out0, _runner_output(out0, 42))
        assert not scheduler.deferred_frees, name
        assert pool.get_num_free_blocks() == free_initially, name
        scheduler.shutdown()


def test_a_pooling_request_prefills_in_chunks_and_stops_at_its_pooler_output() -> None:
    """A 20-token pooling request under a 16-token budget: chunks of 16 and 4; the first
    step's pooler output is None, the second's ends the request (``FINISHED_STOPPED``, the
    output carries it and no token) and frees its blocks."""
    import torch
    from vllm.pooling_params import PoolingParams

    for name, scheduler in _both(max_num_batched_tokens=16).items():
        pool = scheduler.kv_cache_manager.block_pool
        free_initially = pool.get_num_free_blocks()
        request = Request("p", list(range(20)), None, PoolingParams(task="embed"))
        scheduler.add_request(request)
        embedding = torch.ones(4)
        for num_scheduled, pooled in ((16, None), (4, embedding)):
            out = scheduler.schedule()
            assert out.num_scheduled_tokens == {"p": num_scheduled}, name
            runner = ModelRunnerOutput(
                req_ids=["p"],
                req_id_to_index={"p": 0},
                sampled_token_ids=[],
                pooler_output=[pooled],
            )
            outputs = scheduler.update_from_output(out, runner)
        (output,) = outputs[0].outputs
        assert output.pooling_output is embedding, name
        assert output.new_token_ids == [], name
        assert str(output.finish_reason) == "stop", name
        assert request.status == RequestStatus.FINISHED_STOPPED, name
        assert pool.get_num_free_blocks() == free_initially, name
        assert scheduler.get_request_counts() == (0, 0), name
