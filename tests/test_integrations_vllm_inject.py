"""State put in place by hand on ``tokenyard.integrations.vllm``'s scheduler, as an engine
author's model-runner harness (and vLLM 0.33's own tests) writes it: a request put into
``scheduler.requests`` and ``scheduler.running``, then ``update_from_output`` with a
``SchedulerOutput`` built by hand (``_vllm_adopt``); a remote-KV wait set on a request's
status, and a finished request put in ``requests``, beside a KV connector; and the encoder
cache's ``can_allocate`` replaced (``_vllm_hooks``). Each case does the same to vLLM 0.33's
own ``Scheduler`` and to the adapter and compares what they leave: statuses, output
tokens, stop reasons, the running list, finished ids, the next step. Needs vLLM (the bench
venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput, SamplingMaskLists
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from vllm_compare import Budget, build_pair, image_request, make_multimodal, runner_output

from tokenyard.errors import InputError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

EOS = 99


def _requests(prompt_lens: list[int], max_tokens: int, **params: Any) -> list[Request]:
    """Requests ``"0"``, ``"1"``, ... with prompts of those lengths, EOS 99, every prompt
    token counted as computed (a request whose prefill ran)."""
    requests = []
    for i, n in enumerate(prompt_lens):
        sampling = SamplingParams(max_tokens=max_tokens, **params)
        sampling.update_from_generation_config({}, EOS)
        request = Request(
            request_id=str(i),
            prompt_token_ids=[i * 100 + t for t in range(n)],
            sampling_params=sampling,
            pooling_params=None,
        )
        request.num_computed_tokens = request.num_tokens
        requests.append(request)
    return requests


def _place(scheduler: Any, requests: list[Request], status: RequestStatus | None) -> None:
    """vLLM's tests' hand placement: into ``requests`` and ``running``."""
    for request in requests:
        scheduler.requests[request.request_id] = request
        scheduler.running.append(request)
        if status is not None:
            request.status = status


def _step(counts: dict[str, int], drafts: dict[str, list[int]]) -> SchedulerOutput:
    return SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens=counts,
        total_num_scheduled_tokens=sum(counts.values()),
        scheduled_encoder_inputs={},
        scheduled_spec_decode_tokens=drafts,
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
    )


def _output(sampled: dict[str, list[int]], masks: Any = None) -> ModelRunnerOutput:
    ids = list(sampled)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[sampled[r] for r in ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
        sampling_masks=masks,
    )


def _state(scheduler: Any, requests: list[Request]) -> dict[str, Any]:
    return {
        "running": [r.request_id for r in scheduler.running],
        "finished": sorted(scheduler.finished_req_ids),
        "requests": [
            (r.status, list(r.output_token_ids), r.stop_reason, r.num_computed_tokens)
            for r in requests
        ],
    }


@pytest.mark.parametrize(
    ("case", "k", "counts", "drafts", "sampled", "params"),
    [
        # EOS stops request 0; request 1 accepts its draft and runs on.
        ("eos", 1, {"0": 1, "1": 2}, {"0": [], "1": [10]}, {"0": [EOS], "1": [10, 11]}, {}),
        # A stop token: accepted drafts after it are dropped (stop_reason 42).
        (
            "stop",
            2,
            {"0": 3, "1": 2},
            {"0": [10, 42], "1": [13]},
            {"0": [10, 42, 12], "1": [13, 14]},
            {"stop_token_ids": [42, 43]},
        ),
        # max_tokens 2: the third sampled token is cut off (length).
        (
            "length",
            2,
            {"0": 3, "1": 1},
            {"0": [10, 11], "1": []},
            {"0": [10, 11, 12], "1": [13]},
            {},
        ),
        # A rejected draft rolls the request's computed tokens back by one.
        ("rejected", 2, {"0": 3, "1": 1}, {"0": [10, 11], "1": []}, {"0": [10, 5], "1": [13]}, {}),
    ],
)
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_requests_placed_by_hand_update_and_run_on_as_in_vllm(
    async_scheduling: bool,
    case: str,
    k: int,
    counts: dict[str, int],
    drafts: dict[str, list[int]],
    sampled: dict[str, list[int]],
    params: dict[str, Any],
) -> None:
    max_tokens = 2 if case == "length" else 10
    classes = (AsyncScheduler, AsyncTokenyardScheduler) if async_scheduling else None
    options = {"classes": classes} if classes else {}
    pair = build_pair(num_blocks=40, num_speculative_tokens=k, **options)[:2]
    states = []
    steps = []
    for scheduler in pair:
        requests = _requests([20, 20], max_tokens, **params)
        _place(scheduler, requests, RequestStatus.RUNNING)
        scheduler.update_from_output(_step(counts, drafts), _output(sampled))
        states.append(_state(scheduler, requests))
        # The next step is the scheduler's own: the survivor catches up with its tokens.
        out = scheduler.schedule()
        steps.append(
            (out.num_scheduled_tokens, scheduler.kv_cache_manager.block_pool.get_num_free_blocks())
        )
    assert states[1] == states[0]
    assert steps[1] == steps[0]
    assert len(states[0]["running"]) == (2 if case == "rejected" else 1)


def test_a_request_placed_without_a_status_runs_as_vllm_runs_it() -> None:
    # vLLM's running list decides, not the status (left WAITING): ignore_eos carries the
    # request past EOS, and it stays running.
    pair = build_pair(num_blocks=40, num_speculative_tokens=2)[:2]
    states = []
    for scheduler in pair:
        requests = _requests([12], 10, ignore_eos=True)
        _place(scheduler, requests, None)
        step = _step({"0": 3}, {"0": [EOS, 10]})
        scheduler.update_from_output(step, _output({"0": [EOS, 10, 11]}))
        states.append(_state(scheduler, requests))
    assert states[1] == states[0]
    assert states[0]["requests"][0][1] == [EOS, 10, 11]


@pytest.mark.parametrize("asked", ["on the built scheduler", "in the model config"])
def test_sampling_masks_go_to_each_request_by_its_batch_index(asked: str) -> None:
    # Rows [0, 2), [2, 3), [3, 6) of the mask's tokens: one position per request.
    vllm_scheduler, adapter, peer = build_pair(num_blocks=40)
    pair = [vllm_scheduler, adapter]
    if asked == "in the model config":
        peer.vllm_config.model_config.return_sampling_mask = True
        kv_cache_config = vllm_scheduler.kv_cache_config
        pair = [peer.build(type(s), kv_cache_config) for s in pair]
    masks = []
    for scheduler in pair:
        if asked == "on the built scheduler":
            scheduler.return_sampling_mask = True
        requests = _requests([8, 8, 8], 10)
        _place(scheduler, requests, RequestStatus.RUNNING)
        mask = SamplingMaskLists(
            np.array([1, 2, 3, 4, 5, 6], dtype=np.int32), np.array([0, 2, 3, 6])
        )
        step = _step(dict.fromkeys(("0", "1", "2"), 1), {})
        result = scheduler.update_from_output(step, _output({"0": [1], "1": [3], "2": [4]}, mask))
        masks.append([o.new_sampling_mask.token_ids.tolist() for o in result[0].outputs])
    assert masks[1] == masks[0] == [[1, 2], [3], [4, 5, 6]]


def test_sampling_masks_stay_off_unless_asked() -> None:
    _, adapter, _ = build_pair(num_blocks=40)
    requests = _requests([8], 10)
    _place(adapter, requests, RequestStatus.RUNNING)
    mask = SamplingMaskLists(np.array([1, 2], dtype=np.int32), np.array([0, 2]))
    result = adapter.update_from_output(_step({"0": 1}, {}), _output({"0": [1]}, mask))
    assert result[0].outputs[0].new_sampling_mask is None


def test_an_adopted_request_holds_blocks_for_its_computed_tokens() -> None:
    # 20 computed tokens in blocks of 16: 2 of the 40 blocks (39 usable, the null block).
    _, adapter, _ = build_pair(num_blocks=40)
    free = adapter.kv_cache_manager.block_pool.get_num_free_blocks()
    _place(adapter, _requests([20], 10), RequestStatus.RUNNING)
    assert adapter.kv_cache_manager.block_pool.get_num_free_blocks() == free - 2
    assert adapter.get_request_counts() == (1, 0)
    adapter._core.check_invariants()


def test_placing_by_hand_refuses_what_the_core_cannot_adopt() -> None:
    _, adapter, peer = build_pair(num_blocks=40)
    # Not in scheduler.requests: vLLM's update_from_output would never find it.
    stray = _requests([8], 10)[0]
    with pytest.raises(InputError) as info:
        adapter.running.append(stray)
    assert info.value.field == "request_id"
    # A request the scheduler already holds (added through add_request).
    queued = peer.make_request("q", list(range(8)), 4)
    adapter.add_request(queued)
    with pytest.raises(InputError):
        adapter.running.append(queued)
    # More computed tokens than it has: refused by the core, and not kept there.
    over = _requests([8], 10)[0]
    over.request_id = "over"
    over.num_computed_tokens = 9
    adapter.requests["over"] = over
    with pytest.raises(InputError) as info:
        adapter.running.append(over)
    assert info.value.field == "num_computed_tokens"
    assert adapter.get_request_counts() == (0, 1)
    adapter._core.check_invariants()


def _connector_pair(tmp_path: Path) -> list[Any]:
    """vLLM's ``Scheduler`` and the adapter with vLLM's ``ExampleConnector`` (kv_both), as
    vLLM's tests build theirs with ``use_kv_connector``."""
    from vllm.config import KVTransferConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm_peer import VllmSchedulerPeer

    peer = VllmSchedulerPeer(
        num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256
    )
    # ExampleConnector has no HMA support (set after the config is built, as vLLM does).
    peer.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="ExampleConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"shared_storage_path": str(tmp_path)},
    )
    return [
        cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=peer.scheduler.kv_cache_config,
            structured_output_manager=StructuredOutputManager(peer.vllm_config),
            block_size=16,
        )
        for cls in (Scheduler, TokenyardScheduler)
    ]


def _report(**transfers: set[str]) -> ModelRunnerOutput:
    return ModelRunnerOutput(
        req_ids=[], req_id_to_index={}, kv_connector_output=KVConnectorOutput(**transfers)
    )


def test_an_abort_while_a_remote_kv_wait_is_set_by_hand_waits_for_the_load_report(
    tmp_path: Path,
) -> None:
    # vLLM's finish_requests reads the status: the request stays in `requests` (finished)
    # until the connector reports its load, then leaves.
    seen = []
    for scheduler in _connector_pair(tmp_path):
        request = _requests([8], 4)[0]
        request.num_computed_tokens = 0
        scheduler.add_request(request)
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        scheduler.finish_requests(("0",), RequestStatus.FINISHED_ABORTED)
        kept = ("0" in scheduler.requests, scheduler.has_finished_requests())
        scheduler.update_from_output(scheduler.schedule(), _report(finished_recving={"0"}))
        seen.append((kept, "0" in scheduler.requests, set(scheduler.finished_recving_kv_req_ids)))
    assert seen[1] == seen[0] == ((True, True), False, set())


def test_a_finished_request_placed_by_hand_leaves_when_its_send_is_reported(
    tmp_path: Path,
) -> None:
    # A finished request whose blocks a send holds (placed by hand): it keeps the scheduler
    # busy until the report frees it; a queued request is untouched.
    seen = []
    for scheduler in _connector_pair(tmp_path):
        queued, done = _requests([8, 8], 4)
        queued.num_computed_tokens = 0
        scheduler.add_request(queued)
        done.status = RequestStatus.FINISHED_STOPPED
        scheduler.requests["1"] = done
        before = (scheduler.has_finished_requests(), scheduler.has_requests())
        scheduler.update_from_output(_step({}, {}), _report(finished_sending={"1"}))
        seen.append((before, sorted(scheduler.requests), scheduler.has_finished_requests()))
    assert seen[1] == seen[0] == ((True, True), ["0"], False)


def test_a_replaced_encoder_can_allocate_is_asked_and_its_refusal_holds_the_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 110-token prompt with a 100-token image at 10 (budget and cache 600): refused, the
    # step schedules the 10 text tokens only, as vLLM's; once the replacement is deleted,
    # the image (input 0) and the rest of the prompt.
    make_multimodal(monkeypatch)
    Budget.compute, Budget.cache = 600, 600
    pair = build_pair(num_blocks=200, max_model_len=1024, max_num_batched_tokens=256)
    peer = pair[2]
    steps = []
    asked = []
    for scheduler in pair[:2]:
        request = image_request(peer._block_hasher, "0", list(range(110)), [(10, 100, "img")], 4)
        scheduler.add_request(request)

        def refuse(*args: Any, asked: list[Any] = asked) -> bool:
            asked.append(args[1:])
            return False

        scheduler.encoder_cache_manager.can_allocate = refuse
        first = scheduler.schedule()
        scheduler.update_from_output(first, runner_output(scheduler, first))
        del scheduler.encoder_cache_manager.can_allocate
        second = scheduler.schedule()
        steps.append(
            [
                (dict(out.num_scheduled_tokens), dict(out.scheduled_encoder_inputs))
                for out in (first, second)
            ]
        )
    assert steps[1] == steps[0] == [({"0": 10}, {}), ({"0": 100}, {"0": [0]})]
    # Each asked once, with the input index, the budget left and no embeddings picked yet.
    assert asked == [(0, 600, 0), (0, 600, 0)]


def test_the_views_can_allocate_answers_only_while_the_core_asks() -> None:
    _, adapter, _ = build_pair(num_blocks=40)
    with pytest.raises(InputError) as info:
        adapter.encoder_cache_manager.can_allocate(_requests([8], 4)[0], 0, 100, 0)
    assert info.value.field == "input_id"
