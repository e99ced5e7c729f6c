"""tokenyard.integrations.vllm: a preempted request's outputs in flight under async
scheduling (vLLM 0.33's ``num_stale_output_tokens`` / ``drop_stale_output``), and what keeps
the engine alive (``has_requests``). vLLM's ``AsyncScheduler`` and tokenyard's are driven
through the same steps. Needs vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import AsyncTokenyardScheduler


def _pair(num_blocks: int) -> list[Any]:
    config = {"max_num_seqs": 8, "max_num_batched_tokens": 128, "max_model_len": 256}
    return [
        VllmSchedulerPeer(num_blocks=num_blocks, scheduler_cls=cls, **config).scheduler
        for cls in (AsyncScheduler, AsyncTokenyardScheduler)
    ]


def _output(out: Any, token: int = 5) -> ModelRunnerOutput:
    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={i: n for n, i in enumerate(ids)},
        sampled_token_ids=[[token] for _ in ids],
    )


def test_a_victim_waits_for_its_stale_output_before_resuming() -> None:
    """4 usable blocks of 16: two 32-token prompts fill them; the second step's decode of
    the first preempts the second while its prefill's output is in flight. The next step
    skips the victim (deferred); once that output lands (and the first finished, at 2
    tokens) it resumes with the token delivered (33 tokens), as in vLLM."""
    pair = _pair(num_blocks=5)
    for s in pair:
        for i in range(2):
            params = SamplingParams(max_tokens=2 + 3 * i, ignore_eos=True)
            s.add_request(Request(f"r{i}", list(range(100 * i, 100 * i + 32)), params, None))
    steps = [[s.schedule() for _ in range(3)] for s in pair]
    for s, (_, second, third) in zip(pair, steps, strict=True):
        assert second.preempted_req_ids == {"r1"}
        assert s.requests["r1"].num_stale_output_tokens == 32
        # Its prefill's output is still in flight: skipped, counted deferred.
        assert "r1" not in third.num_scheduled_tokens
        assert s.requests["r1"] in s.deferred_waiting
    for s, mine in zip(pair, steps, strict=True):
        for out in mine:
            s.update_from_output(out, _output(out))
        assert s.requests["r1"].status == RequestStatus.PREEMPTED
        assert s.requests["r1"].num_tokens == 33
    outs = [s.schedule() for s in pair]
    # Both resume it; vLLM recomputes all 33 tokens, the core hits its first block (16),
    # cached at its prefill's allocation (vLLM caches an async step's blocks only once it
    # lands, and this one's output was stale): a known difference (docs/integrations.md).
    assert set(outs[1].num_scheduled_tokens) == set(outs[0].num_scheduled_tokens) == {"r1"}


def test_pending_connector_push_work_keeps_the_engine_alive() -> None:
    """vLLM 0.33's ``has_requests``: a connector with push work still pending (a HiSparse
    host spill after the last request) keeps the scheduler busy."""
    scheduler = _pair(num_blocks=8)[1]
    assert not scheduler.has_requests()
    pending = [True]
    scheduler.connector = SimpleNamespace(has_pending_push_work=lambda: pending[0])
    assert scheduler.has_requests()
    pending[0] = False
    assert not scheduler.has_requests()
