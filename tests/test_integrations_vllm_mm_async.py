"""tokenyard.integrations.vllm with multimodal requests under async scheduling, on the V1
and the V2 model runner. Each case runs vLLM's ``AsyncScheduler`` and
``AsyncTokenyardScheduler`` on the same configs (the stub model made multimodal,
``MultiModalBudget`` giving both one budget), two steps in flight, and compares every
step's scheduled tokens, encoder inputs, freed identifiers and (V2) encoder input updates,
with a roomy encoder budget and with tight ones. A tight cache shows when a request lets go
of an item: vLLM 0.33's ``update_from_output`` runs ``_free_encoder_inputs`` over the
requests of the step it updates, one behind the latest under async scheduling. Needs vLLM
(the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

import vllm.v1.core.sched.scheduler as vllm_scheduler_module
from vllm.config import ModelConfig, VllmConfig
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm_peer import VllmSchedulerPeer

import tokenyard.integrations.vllm as adapter_module
from tokenyard.integrations.vllm import AsyncTokenyardScheduler

BLOCK_SIZE = 16


class _Budget:
    """``MultiModalBudget`` with the test's numbers."""

    compute = 0
    cache = 0

    def __init__(self, vllm_config: Any, mm_registry: Any) -> None:
        self.encoder_compute_budget = _Budget.compute
        self.encoder_cache_size = _Budget.cache


def _multimodal(monkeypatch: pytest.MonkeyPatch, v2: bool) -> None:
    monkeypatch.setattr(ModelConfig, "supports_multimodal_inputs", property(lambda self: True))
    monkeypatch.setattr(VllmConfig, "use_v2_model_runner", property(lambda self: v2))
    monkeypatch.setattr(vllm_scheduler_module, "MultiModalBudget", _Budget)
    monkeypatch.setattr(adapter_module, "MultiModalBudget", _Budget)


@pytest.fixture
def multimodal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub model takes images; both schedulers get ``_Budget``; the V1 runner."""
    _multimodal(monkeypatch, v2=False)


@pytest.fixture
def multimodal_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``multimodal``, on the V2 runner (its ``encoder_input_updates`` carry the items'
    data, sent once and released once the request's confirmed tokens pass them)."""
    _multimodal(monkeypatch, v2=True)


def _both(budget: int, cache: int) -> tuple[Any, Any, Any]:
    _Budget.compute, _Budget.cache = budget, cache
    peer = VllmSchedulerPeer(
        num_blocks=200,
        max_num_seqs=4,
        max_num_batched_tokens=256,
        max_model_len=1024,
        block_size=BLOCK_SIZE,
    )
    schedulers = [
        cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=peer.scheduler.kv_cache_config,
            structured_output_manager=StructuredOutputManager(peer.vllm_config),
            block_size=BLOCK_SIZE,
            hash_block_size=BLOCK_SIZE,
            log_stats=True,
        )
        for cls in (AsyncScheduler, AsyncTokenyardScheduler)
    ]
    return schedulers[0], schedulers[1], peer


def _request(peer: Any, request_id: str, prompt: list[int], items: list[Any], n: int) -> Request:
    # Data only the V2 runner's updates carry (vLLM sends an item's data unless it is None
    # or a shared-memory address).
    features = [
        MultiModalFeatureSpec(
            data={"pixels": identifier},  # type: ignore[arg-type]
            modality="image",
            identifier=identifier,
            mm_position=PlaceholderRange(offset=offset, length=length),
        )
        for offset, length, identifier in items
    ]
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=n),
        pooling_params=None,
        mm_features=features or None,
        block_hasher=peer._block_hasher,
    )


def _runner(scheduler: Any, out: Any, sampling: set[str]) -> ModelRunnerOutput:
    """A token for each request of ``out`` that samples in it (decided at schedule time)."""
    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: k for k, r in enumerate(ids)},
        sampled_token_ids=[[7] if r in sampling else [] for r in ids],
    )


def _sampling(scheduler: Any, out: Any) -> set[str]:
    """The requests of the step just formed that reach their known tokens (they sample)."""
    return {
        r
        for r in out.num_scheduled_tokens
        if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens
    }


def _run(seed: int, budget: int, cache: int) -> int:
    """A seeded stream of image requests, two steps in flight on both; every step's
    scheduled tokens, encoder inputs and freed identifiers compared. Returns the encoder
    inputs scheduled."""
    theirs, ours, peer = _both(budget, cache)
    rng = random.Random(seed)
    arrivals = []
    for i in range(8):
        text = [rng.randrange(1000) for _ in range(rng.randrange(4, 40))]
        prompt, items = list(text), []
        for _ in range(rng.randrange(0, 3)):
            length = rng.choice((48, 96, 144))
            items.append((len(prompt), length, f"img{rng.randrange(4)}-{length}"))
            prompt += [32000] * length + [rng.randrange(1000) for _ in range(8)]
        arrivals.append((rng.randrange(8), f"r{i}", prompt, items, rng.randrange(1, 20)))
    pending: list[tuple[Any, Any, set[str], set[str]]] = []
    updates = 0
    for step in range(1000):
        for at, request_id, prompt, items, n in arrivals:
            if at == step:
                for scheduler in (theirs, ours):
                    scheduler.add_request(_request(peer, request_id, prompt, items, n))
        mine, theirs_out = ours.schedule(), theirs.schedule()
        assert dict(mine.num_scheduled_tokens) == dict(theirs_out.num_scheduled_tokens), step
        assert mine.scheduled_encoder_inputs == theirs_out.scheduled_encoder_inputs, step
        assert sorted(mine.free_encoder_mm_hashes) == sorted(theirs_out.free_encoder_mm_hashes), (
            step
        )
        assert mine.encoder_input_updates == theirs_out.encoder_input_updates, step
        updates += sum(map(len, theirs_out.scheduled_encoder_inputs.values()))
        pending.append((theirs_out, mine, _sampling(theirs, theirs_out), _sampling(ours, mine)))
        if len(pending) == 2 or not theirs_out.num_scheduled_tokens:
            out_v, out_t, sampling_v, sampling_t = pending.pop(0)
            assert sampling_t == sampling_v, step
            theirs.update_from_output(out_v, _runner(theirs, out_v, sampling_v))
            ours.update_from_output(out_t, _runner(ours, out_t, sampling_t))
        if step > 10 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return updates
    raise AssertionError("the stream did not drain")


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize("seed", [0, 1])
def test_image_requests_under_async_scheduling_match_vllm(seed: int) -> None:
    assert _run(seed, budget=512, cache=512) > 0


@pytest.mark.usefixtures("multimodal")
def test_a_tight_encoder_budget_under_async_scheduling_matches_vllm() -> None:
    # Seed 2 failed before 2026-11-27: at step 10 the core had let go of r0's item at the
    # update of the step after r0's chunk passed it (the latest step's requests), vLLM
    # holds it until the update of that chunk's own step, so the adapter freed the entry
    # and scheduled r0's 152 tokens where vLLM holds r0.
    assert _run(2, budget=144, cache=200) > 0


@pytest.mark.usefixtures("multimodal")
@pytest.mark.parametrize(("budget", "cache"), [(144, 144), (144, 200), (192, 300)])
@pytest.mark.parametrize("seed", range(3, 9))
def test_tight_encoder_budgets_under_async_scheduling_match_vllm(
    seed: int, budget: int, cache: int
) -> None:
    assert _run(seed, budget=budget, cache=cache) > 0


@pytest.mark.usefixtures("multimodal_v2")
@pytest.mark.parametrize(("budget", "cache"), [(512, 512), (144, 144), (144, 200), (192, 300)])
@pytest.mark.parametrize("seed", range(4))
def test_image_requests_on_the_v2_runner_under_async_scheduling_match_vllm(
    seed: int, budget: int, cache: int
) -> None:
    # Refused by name before 2026-11-27; vLLM's _get_encoder_input_updates reads
    # num_in_flight_tokens, which the adapter keeps on its requests.
    assert _run(seed, budget=budget, cache=cache) > 0
