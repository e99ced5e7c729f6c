"""tokenyard.integrations.vllm: requests that arrive unlike a fresh generation prompt, on
vLLM 0.33's ``Scheduler`` and on ``TokenyardScheduler`` with the same vLLM arguments, the
answers compared: a pooling model's prompt of exactly ``max_model_len`` (vLLM's
``num_sampled_tokens_per_step`` is 0 for ``runner_type == "pooling"``), and a P/D decode
side's request added with ``num_computed_tokens`` (vLLM admits it with no prefix lookup and
new blocks for its computed tokens). Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import TokenyardScheduler


def _both(runner_type: str = "generate", **options: Any) -> dict[str, Any]:
    """vLLM's Scheduler and TokenyardScheduler over the same configs."""
    peer = VllmSchedulerPeer(**options)
    peer.vllm_config.model_config.runner_type = runner_type
    built = {}
    for name, cls in (("vllm", Scheduler), ("tokenyard", TokenyardScheduler)):
        built[name] = cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=peer.scheduler.kv_cache_config,
            structured_output_manager=StructuredOutputManager(peer.vllm_config),
            block_size=16,
            log_stats=True,
        )
    return built


def _runner(out: Any, tokens: dict[str, list[int]], pooled: Any = None) -> ModelRunnerOutput:
    req_ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[tokens.get(r, []) for r in req_ids],
        pooler_output=[pooled] * len(req_ids) if pooled is not None else [],
    )


def test_a_pooling_prompt_of_max_model_len_finishes_in_chunks_of_4_and_4() -> None:
    """vLLM's ``test_pooling_chunked_prefill_can_finish_at_max_model_len``, run to the end."""
    import torch
    from vllm.pooling_params import PoolingParams

    both = _both(
        "pooling", num_blocks=64, max_num_seqs=1, max_num_batched_tokens=4, max_model_len=8
    )
    for name, scheduler in both.items():
        request = Request("pool", [1] * 8, None, PoolingParams(task="embed"))
        scheduler.add_request(request)
        out = scheduler.schedule()
        assert out.num_scheduled_tokens == {"pool": 4}, name
        scheduler.update_from_output(out, _runner(out, {}))
        out = scheduler.schedule()
        assert out.num_scheduled_tokens == {"pool": 4}, name
        scheduler.update_from_output(out, _runner(out, {}, pooled=torch.ones(2)))
        assert request.status == RequestStatus.FINISHED_STOPPED, name
        assert scheduler.get_request_counts() == (0, 0), name


def test_a_generation_models_prompt_stops_a_token_short_of_max_model_len() -> None:
    both = _both(num_blocks=64, max_num_seqs=1, max_num_batched_tokens=4, max_model_len=8)
    for name, scheduler in both.items():
        params = SamplingParams(max_tokens=1, ignore_eos=True)
        params.update_from_generation_config({}, None)
        scheduler.add_request(Request("gen", [1] * 7, params, None))
        assert scheduler.schedule().num_scheduled_tokens == {"gen": 4}, name
        assert scheduler.schedule().num_scheduled_tokens == {"gen": 3}, name


def test_a_request_arriving_computed_gets_blocks_for_all_its_tokens() -> None:
    """A 40-token prompt with 39 computed (a P/D decode side): one token scheduled, three
    blocks of 16, the two full ones cached: a later request with that prompt hits 32."""
    both = _both(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256)
    seen = {}
    for name, scheduler in both.items():
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        prompt = list(range(100, 140))
        arrived = Request("pd", prompt, params, None, block_hasher=_hasher())
        arrived.num_computed_tokens = 39
        scheduler.add_request(arrived)
        out = scheduler.schedule()
        assert out.num_scheduled_tokens == {"pd": 1}, name
        (new,) = out.scheduled_new_reqs
        seen[name] = [list(new.block_ids[0])]
        scheduler.update_from_output(out, _runner(out, {"pd": [7]}))
        scheduler.add_request(Request("again", prompt, params, None, block_hasher=_hasher()))
        out = scheduler.schedule()
        assert out.num_scheduled_tokens == {"pd": 1, "again": 8}, name
        seen[name].append(list(out.scheduled_new_reqs[0].block_ids[0]))
    assert seen["tokenyard"] == seen["vllm"]
    assert len(seen["vllm"][0]) == 3


def _hasher() -> Any:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    return kv_cache_utils.get_request_block_hasher(16, hash_fn)


def test_a_request_the_core_refuses_is_not_kept() -> None:
    from tokenyard.errors import InputError

    scheduler = _both(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256)[
        "tokenyard"
    ]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    request = Request("pd", list(range(10)), params, None)
    request.num_computed_tokens = 10
    with pytest.raises(InputError) as info:
        scheduler.add_request(request)
    assert info.value.field == "num_computed_tokens"
    assert not scheduler.has_request("pd")
    assert scheduler.get_request_counts() == (0, 0)
