"""tokenyard.integrations.vllm: dynamic speculative decoding
(``SpeculativeConfig.num_speculative_tokens_per_batch_size``) as vLLM 0.33's ``Scheduler``
and ``AsyncScheduler`` serve it: ``Scheduler.__init__`` expands the schedule
(``build_dynamic_sd_schedule_lookup``, raising on a bad one), ``schedule()`` sets
``num_spec_tokens_to_schedule`` from the number of requests the step schedules and pads no
one-token admission, and ``AsyncScheduler._update_after_schedule`` gives each sampling
request that many placeholder drafts. The seeded streams of ``vllm_adapter_diff`` run on
both with a schedule of 3, 1 and 0 drafts by batch size, every step's decisions (the
``num_spec_tokens_to_schedule`` included), outputs and request states compared. Needs vLLM
(the bench venv); skipped elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.structured_output import StructuredOutputManager
from vllm_compare import _BLOCK_HASHERS, peer_pair

from tokenyard.integrations.vllm import TokenyardScheduler

SCHEDULE = [(1, 1, 3), (2, 3, 1), (4, 4096, 0)]


def _with_schedule(pair: list[Any], schedule: Any) -> list[Any]:
    """Each scheduler of ``pair`` built again on its config with ``schedule`` set, as
    vLLM's own tests do (tests/v1/spec_decode/test_dynamic_sd.py)."""
    rebuilt = []
    for s in pair:
        s.vllm_config.speculative_config.num_speculative_tokens_per_batch_size = schedule
        scheduler = type(s)(
            vllm_config=s.vllm_config,
            kv_cache_config=s.kv_cache_config,
            block_size=s.block_size,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(s.vllm_config),
        )
        _BLOCK_HASHERS[id(scheduler)] = _BLOCK_HASHERS[id(s)]
        rebuilt.append(scheduler)
    return rebuilt


def _pair(schedule: Any, max_num_seqs: int = 8) -> list[Any]:
    pair = peer_pair(
        (Scheduler, TokenyardScheduler),
        num_blocks=64,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=256,
        max_model_len=256,
        num_speculative_tokens=3,
    )
    return _with_schedule(pair, schedule)


def test_the_lookup_is_vllms_and_k_follows_the_scheduled_requests() -> None:
    from vllm.sampling_params import SamplingParams
    from vllm_compare import add_to_each

    theirs, ours = _pair(SCHEDULE)
    assert ours.dynamic_sd_lookup == theirs.dynamic_sd_lookup
    assert ours.dynamic_sd_lookup[:6] == [0, 3, 1, 1, 0, 0]
    seen = []
    for n in range(1, 6):
        pair = _pair(SCHEDULE)
        for i in range(n):
            add_to_each(pair, f"r{i}", [i + 1] * 5, SamplingParams(max_tokens=4))
        seen.append([s.schedule().num_spec_tokens_to_schedule for s in pair])
    assert seen == [[3, 3], [1, 1], [1, 1], [0, 0], [0, 0]]
    # A step scheduling nothing keeps the static k.
    assert [s.schedule().num_spec_tokens_to_schedule for s in _pair(SCHEDULE)] == [3, 3]


def test_no_schedule_keeps_the_static_k_and_a_bad_one_raises_vllms_error() -> None:
    theirs, ours = _pair(None)
    assert ours.dynamic_sd_lookup is None is theirs.dynamic_sd_lookup
    with pytest.raises(ValueError, match="must start at 1"):
        _pair([(2, 16, 3)])
    with pytest.raises(ValueError, match="non-overlapping"):
        _pair([(1, 16, 3), (8, 32, 2)])


@pytest.mark.parametrize("is_async", [False, True])
def test_seeded_streams_agree_with_vllm_at_every_step(monkeypatch: Any, is_async: bool) -> None:
    # Without the lookup the adapter sent k = 3 (and 3 placeholder drafts under async) in
    # every step, and padded one-token admissions to 1 + k where vLLM does not.
    import vllm_adapter_diff
    from vllm import config as vllm_config_module

    real = vllm_config_module.SpeculativeConfig

    def with_schedule(*args: Any, **kwargs: Any) -> Any:
        spec = real(*args, **kwargs)
        spec.num_speculative_tokens_per_batch_size = SCHEDULE
        return spec

    monkeypatch.setattr(vllm_config_module, "SpeculativeConfig", with_schedule)
    fields = vllm_adapter_diff.schedule_fields

    def with_k(out: Any) -> dict[str, Any]:
        return {**fields(out), "k": out.num_spec_tokens_to_schedule}

    monkeypatch.setattr(vllm_adapter_diff, "schedule_fields", with_k)
    for seed in range(6):
        scenario = vllm_adapter_diff.draw(seed, 120)
        scenario.config.num_speculative_tokens = 3
        scenario.config.draft_accept_rate = 0.5
        scenario.config.max_num_batched_tokens = max(scenario.config.max_num_batched_tokens, 8)
        assert vllm_adapter_diff.run_scenario(scenario, 120, is_async) is None, seed
