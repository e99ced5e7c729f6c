"""The scheduler through its Python API: named behaviours, typed errors, unchanged state."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tokenyard.errors import ConfigError, InputError, UnknownRequestError
from tokenyard.sched import Scheduler, SchedulerConfig


def small(**overrides: Any) -> Scheduler:
    fields: dict[str, Any] = {
        "max_num_seqs": 0,
        "max_num_batched_tokens": 10,
        "block_size": 4,
        "num_blocks": 64,
        "max_model_len": 64,
        "enable_prefix_caching": False,
    }
    fields.update(overrides)
    return Scheduler(SchedulerConfig(**fields))


def test_three_8_token_prompts_under_a_10_token_budget_schedule_8_2_0() -> None:
    scheduler = small()
    for i in range(3):
        scheduler.add_request(f"r{i}", np.arange(8) + 100 * i, max_tokens=4)
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"r0": 8, "r1": 2}
    assert out.total_num_scheduled_tokens == 10
    assert scheduler.waiting_ids() == ["r2"]
    assert [r.req_id for r in out.scheduled_new_reqs] == ["r0", "r1"]
    assert out.scheduled_new_reqs[0].block_ids.tolist() == [0, 1]


def test_forced_preemption_recomputes_and_every_request_finishes() -> None:
    # 12 blocks of 4 tokens; five 10-token prompts growing to 20 tokens cannot all fit.
    scheduler = small(num_blocks=12, max_model_len=40, max_num_batched_tokens=64)
    for i in range(5):
        scheduler.add_request(i, range(100 * i, 100 * i + 10), max_tokens=10)
    preempted = set()
    finished = {}
    for _ in range(500):
        if not scheduler.has_unfinished_requests():
            break
        out = scheduler.schedule()
        preempted.update(out.preempted_req_ids)
        sampled = {
            rid: [1]
            for rid in out.num_scheduled_tokens
            if scheduler.num_computed_tokens(rid) >= scheduler.num_tokens(rid)
        }
        finished.update(scheduler.update_from_output(sampled))
        scheduler.check_invariants()
    assert preempted, "the pool is small enough to force preemption"
    assert finished == dict.fromkeys(range(5), "length")
    assert scheduler.stats().num_preemptions >= len(preempted)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"policy": "lifo"}, "policy"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
        ({"block_size": 0}, "block_size"),
        ({"enable_prefix_caching": 1}, "enable_prefix_caching"),
        ({"prefix_cache": "lru"}, "prefix_cache"),
        ({"max_model_len": 10_000}, "max_model_len"),
        ({"enable_chunked_prefill": False}, "max_num_batched_tokens"),
        ({"num_speculative_tokens": -1}, "num_speculative_tokens"),
        ({"pad_spec_decode": 1}, "pad_spec_decode"),
        ({"cache_accepted_drafts": "yes"}, "cache_accepted_drafts"),
    ],
)
def test_bad_config_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        small(**overrides)
    assert info.value.field == field


def test_bad_calls_raise_and_change_nothing() -> None:
    scheduler = small()
    scheduler.add_request("a", [1, 2, 3], max_tokens=2)
    with pytest.raises(InputError, match="already queued"):
        scheduler.add_request("a", [1], max_tokens=2)
    with pytest.raises(InputError, match="must not be empty"):
        scheduler.add_request("b", [], max_tokens=2)
    with pytest.raises(InputError, match="max_tokens=0"):
        scheduler.add_request("b", [1], max_tokens=0)
    with pytest.raises(InputError, match="max_model_len=64"):
        scheduler.add_request("b", range(64), max_tokens=1)
    with pytest.raises(InputError, match="prompt_token_ids=-1"):
        scheduler.add_request("b", [-1], max_tokens=1)
    with pytest.raises(UnknownRequestError, match="'zz'"):
        scheduler.abort(["a", "zz"])
    assert scheduler.waiting_ids() == ["a"]
    scheduler.schedule()
    with pytest.raises(UnknownRequestError):
        scheduler.update_from_output({"a": [5], "zz": [6]})
    assert scheduler.num_computed_tokens("a") == 3
    finished = scheduler.update_from_output({"a": [5]})
    assert finished == []
    with pytest.raises(InputError, match="only 0 speculative tokens"):
        scheduler.update_from_output({}, num_rejected_tokens={"a": 2})
    scheduler.check_invariants()


def test_stop_tokens_and_eos() -> None:
    scheduler = small()
    scheduler.add_request("eos", [1, 2], max_tokens=9, eos_token_id=50)
    scheduler.add_request("stop", [1, 2], max_tokens=9, stop_token_ids=np.array([60]))
    scheduler.add_request("ignore", [1, 2], max_tokens=9, eos_token_id=50, ignore_eos=True)
    scheduler.schedule()
    finished = scheduler.update_from_output({"eos": [50], "stop": [60], "ignore": [50]})
    assert finished == [("eos", "stop"), ("stop", "stop")]
    assert scheduler.schedule().finished_req_ids == ["eos", "stop"]
