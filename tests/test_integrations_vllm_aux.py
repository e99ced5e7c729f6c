"""tokenyard.integrations.vllm: vLLM 0.33's auxiliary-output connector (routed experts,
``vllm/distributed/aux_output_connector/connector.py``, ``AuxOutputSchedulerConnector``)
beside the adapter. vLLM's ``Scheduler`` and tokenyard's each get one, built on their own
``kv_cache_manager``, and are driven through the same operations: each step's decisions,
prefix hits and the connector's metadata (hashes sent, finished requests, block hashes
retained and released as blocks are evicted) must be equal (vLLM 0.33 ``scheduler.py``:
``max_cache_hit`` capping ``get_computed_blocks``, ``build_connector_meta``,
``take_output`` into ``EngineCoreOutput.routed_experts``, ``request_finished`` on a finish
or a preemption). Needs vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm.distributed.aux_output_connector.connector import (
    AuxOutputSchedulerConnector,
    AuxRequestOutput,
)
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import RequestStatus
from vllm_compare import add_to_each, peer_pair

from tokenyard.integrations.vllm import TokenyardScheduler


def _pair(num_blocks: int = 12, **options: Any) -> list[Any]:
    """vLLM's scheduler and tokenyard's over the same config, each with vLLM's connector."""
    config = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 128}
    config.update(options)
    pair = peer_pair((Scheduler, TokenyardScheduler), num_blocks=num_blocks, **config)
    for s in pair:
        s.aux_output_connector = AuxOutputSchedulerConnector(s.kv_cache_manager)
    return pair


def _add(pair: list[Any], request_id: str, prompt: list[int], max_tokens: int = 3) -> None:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    add_to_each(pair, request_id, prompt, params)


def _runner_output(scheduler: Any, out: Any) -> ModelRunnerOutput:
    """Token 0 for each request that caught up with its tokens, with one routed-expert row
    per token it has computed."""
    ids = list(out.num_scheduled_tokens)
    sampled, aux = [], {}
    for request_id in ids:
        request = scheduler.requests[request_id]
        end = request.num_computed_tokens
        sampled.append([0] if end >= request.num_tokens else [])
        aux[request_id] = AuxRequestOutput(0, np.arange(end, dtype=np.uint8).reshape(end, 1, 1))
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={i: n for n, i in enumerate(ids)},
        sampled_token_ids=sampled,
        aux_output_connector_output=aux,
    )


def _meta(out: Any) -> tuple[Any, ...]:
    m = out.aux_output_connector_metadata
    packed = {i: list(h) for i, h in m.block_hashes.items()}
    retained = list(m.retained_block_hashes or ())
    released = list(m.released_block_hashes or ())
    return m.generation, m.requests, packed, sorted(m.finished_requests), retained, released


def _step(pair: list[Any]) -> list[Any]:
    """One step on each side; returns what must agree."""
    seen = []
    for s in pair:
        out = s.schedule()
        new = sorted((r.req_id, r.num_computed_tokens) for r in out.scheduled_new_reqs)
        outputs = s.update_from_output(out, _runner_output(s, out))
        experts = sorted(
            (o.request_id, None if o.routed_experts is None else o.routed_experts.shape)
            for eco in outputs.values()
            for o in eco.outputs
        )
        seen.append((dict(out.num_scheduled_tokens), new, _meta(out), experts))
    return seen


def test_a_random_stream_agrees_with_vllm_step_by_step() -> None:
    """Shared prefixes, aborts and evictions in a small pool: vLLM's connector, on either
    scheduler, sends the same metadata, caps the same hits, takes the same rows."""
    rng = random.Random(7)
    pair = _pair(num_blocks=12)
    prefixes = [[1000 * p + t for t in range(48)] for p in range(3)]
    for step in range(60):
        if rng.random() < 0.5:
            prefix = rng.choice(prefixes)
            prompt = prefix[: rng.choice([17, 33, 48])] + [step + 1] * rng.randint(0, 20)
            _add(pair, f"r{step}", prompt, max_tokens=rng.randint(1, 4))
        if rng.random() < 0.15:
            live = sorted(pair[0].requests)
            if live:
                victim = rng.choice(live)
                for s in pair:
                    s.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
        vllm_seen, ty_seen = _step(pair)
        assert ty_seen == vllm_seen, f"step {step}"


def test_a_hit_is_capped_where_the_connector_keeps_no_records() -> None:
    """vLLM's ``get_computed_blocks(request, max_cache_hit_length)``: a 40-token cap over an
    80-token cached prompt keeps two 16-token blocks."""
    for cap, expected_hit in ((79, 64), (40, 32), (0, 0)):
        pair = _pair(num_blocks=16, max_num_batched_tokens=128)
        prompt = list(range(80))
        _add(pair, "first", prompt)
        for s in pair:
            s.schedule()
            s.finish_requests("first", RequestStatus.FINISHED_ABORTED)
            s.aux_output_connector.max_cache_hit = Mock(return_value=cap)
        _add(pair, "second", prompt)
        for s in pair:
            out = s.schedule()
            assert out.num_scheduled_tokens["second"] == 80 - expected_hit, (type(s), cap)


def test_a_preempted_request_is_finished_for_the_connector() -> None:
    """vLLM's ``_preempt_request`` tells the connector (``request_finished``), and the
    request's stale output still takes its rows (``take_output``)."""
    s = _pair()[1]
    _add([s], "r", list(range(20)))
    out = s.schedule()
    s.aux_output_connector = Mock()
    s._preempt_request(s.requests["r"], 0.0)
    s.aux_output_connector.request_finished.assert_called_once_with(s.requests["r"])
    # The step sampled a token before the preemption: it is stale, and still delivered.
    stale = ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0}, sampled_token_ids=[[0]])
    s.update_from_output(out, stale)
    s.aux_output_connector.take_output.assert_called_once_with(s.requests["r"], None)


def test_the_connector_can_be_removed_and_a_bad_answer_is_a_typed_error() -> None:
    from tokenyard.errors import ConnectorError

    s = _pair()[1]
    s.aux_output_connector = None
    _add([s], "r", list(range(20)))
    out = s.schedule()
    assert out.aux_output_connector_metadata is None
    assert out.num_scheduled_tokens == {"r": 20}
    s.aux_output_connector = Mock()
    s.aux_output_connector.max_cache_hit = Mock(return_value="many")
    _add([s], "q", list(range(20)))
    with pytest.raises(ConnectorError, match="max_cache_hit"):
        s.schedule()
