"""Requests that arrive unlike a fresh generation prompt, through the Python API: under a
model that samples no token (``num_sampled_tokens_per_step=0``, vLLM 0.33's pooling
models) and with tokens already computed (``add_request(num_computed_tokens=...)``, a P/D
decode side's request)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tokenyard import _core
from tokenyard.errors import ConfigError, InputError
from tokenyard.sched import Scheduler, SchedulerConfig


def small(**overrides: Any) -> Scheduler:
    fields: dict[str, Any] = {
        "max_num_seqs": 0,
        "max_num_batched_tokens": 100,
        "block_size": 4,
        "num_blocks": 64,
        "max_model_len": 64,
        "reserve_null_block": False,
        "scheduler_reserve_full_isl": False,
    }
    fields.update(overrides)
    return Scheduler(SchedulerConfig(**fields))


def test_a_pooling_prompt_of_max_model_len_runs_in_chunks_of_4_and_4() -> None:
    scheduler = small(max_model_len=8, max_num_batched_tokens=4, num_sampled_tokens_per_step=0)
    scheduler.add_request("pool", np.arange(8), max_tokens=1)
    assert scheduler.schedule().num_scheduled_tokens == {"pool": 4}
    assert scheduler.schedule().num_scheduled_tokens == {"pool": 4}
    assert scheduler.update_from_output({"pool": [0]}) == [("pool", "length")]


def test_a_generation_model_refuses_a_prompt_of_max_model_len() -> None:
    scheduler = small(max_model_len=8, max_num_batched_tokens=4)
    with pytest.raises(InputError) as info:
        scheduler.add_request("gen", np.arange(8), max_tokens=1)
    assert info.value.field == "prompt_token_ids"
    scheduler.add_request("gen", np.arange(7), max_tokens=1)
    assert scheduler.schedule().num_scheduled_tokens == {"gen": 4}
    assert scheduler.schedule().num_scheduled_tokens == {"gen": 3}


@pytest.mark.parametrize("value", [2, -1, True])
def test_num_sampled_tokens_per_step_other_than_0_or_1_is_refused(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerConfig(num_sampled_tokens_per_step=value)
    assert info.value.field == "num_sampled_tokens_per_step"


def test_a_simulated_replica_refuses_a_model_that_samples_nothing() -> None:
    # Simulated requests decode: 0 would change nothing but the max_model_len edge.
    with pytest.raises(ConfigError) as info:
        _core.ReplicaSpec.vllm_v1(SchedulerConfig(num_sampled_tokens_per_step=0))
    assert info.value.field == "num_sampled_tokens_per_step"
    _core.ReplicaSpec.vllm_v1(SchedulerConfig(num_sampled_tokens_per_step=1))


def test_a_request_arriving_computed_schedules_its_last_token_with_blocks_for_all() -> None:
    scheduler = small()
    scheduler.add_request("pd", np.arange(10), max_tokens=4, num_computed_tokens=9)
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"pd": 1}
    assert out.scheduled_new_reqs[0].block_ids.tolist() == [0, 1, 2]
    assert scheduler.num_free_blocks == 61
    scheduler.update_from_output({"pd": [7]})
    # Its two full blocks were cached at allocation: the same prompt hits 8 tokens.
    scheduler.add_request("again", np.arange(10), max_tokens=4)
    assert scheduler.schedule().num_scheduled_tokens == {"pd": 1, "again": 2}


@pytest.mark.parametrize("value", [10, 11, -1, True, 1.5])
def test_num_computed_tokens_not_below_the_prompt_is_refused(value: Any) -> None:
    scheduler = small()
    with pytest.raises(InputError) as info:
        scheduler.add_request("pd", np.arange(10), max_tokens=4, num_computed_tokens=value)
    assert info.value.field == "num_computed_tokens"
    assert scheduler.waiting_ids() == []
