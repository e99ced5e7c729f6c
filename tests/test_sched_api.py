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
        ({"max_model_len": 1}, "max_model_len"),  # above the KV capacity is accepted (vLLM)
        ({"enable_chunked_prefill": False}, "max_num_batched_tokens"),
        ({"num_speculative_tokens": -1}, "num_speculative_tokens"),
        ({"pad_spec_decode": 1}, "pad_spec_decode"),
        # A one-token admission padded to 1 + k = 3 tokens never fits a 2-token step.
        ({"num_speculative_tokens": 2, "max_num_batched_tokens": 2}, "max_num_batched_tokens"),
        ({"cache_accepted_drafts": "yes"}, "cache_accepted_drafts"),
        ({"prefill_schedule_interval": 0}, "prefill_schedule_interval"),
        ({"prefill_schedule_interval": 2.0}, "prefill_schedule_interval"),
    ],
)
def test_bad_config_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        small(**overrides)
    assert info.value.field == field


def test_prefill_cadence_interval_3_holds_a_prompt_behind_a_decode_for_two_steps() -> None:
    # vLLM 0.33's prefill_schedule_interval: r0's prefill is executed step 1; r1 waits
    # through steps 2 and 3 while r0 decodes, and is admitted on step 4.
    scheduler = small(prefill_schedule_interval=3)
    scheduler.add_request("r0", [1, 2, 3, 4], max_tokens=20)
    out = scheduler.schedule()
    scheduler.update_from_output({"r0": [7]})
    scheduler.add_request("r1", [5, 6, 7, 8], max_tokens=20)
    steps = []
    for _ in range(3):
        out = scheduler.schedule()
        steps.append(out.num_scheduled_tokens)
        scheduler.update_from_output({r: [7] for r in out.num_scheduled_tokens})
    assert steps == [{"r0": 1}, {"r0": 1}, {"r0": 1, "r1": 4}]
    assert (scheduler.num_executed_steps, scheduler.last_prefill_step) == (4, 4)


def test_throttle_prefills_defers_until_a_release_leaves_the_queue_undrained() -> None:
    scheduler = small()
    scheduler.add_request("a", range(10), max_tokens=20)
    scheduler.add_request("b", range(100, 110), max_tokens=20)
    assert scheduler.schedule(throttle_prefills=True).num_scheduled_tokens == {"a": 10}
    scheduler.update_from_output({"a": [7]})
    # The release step left b waiting: the throttle stands aside.
    assert scheduler.prefill_capacity_bound
    out = scheduler.schedule(throttle_prefills=True)
    assert out.num_scheduled_tokens == {"a": 1, "b": 9}
    scheduler.update_from_output({"a": [7]})
    assert scheduler.schedule(throttle_prefills=True).num_scheduled_tokens == {"a": 1}


def test_skipped_requests_are_reported_as_deferred() -> None:
    scheduler = small(max_loras=1)
    scheduler.add_request("a", [1, 2], max_tokens=4, lora_id=1)
    scheduler.add_request("b", [3, 4], max_tokens=4, lora_id=2)
    scheduler.schedule()
    assert scheduler.deferred_waiting_ids() == ["b"]
    assert scheduler.stats().num_deferred_waiting == 1


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


def _drive(scheduler: Scheduler, bulk: bool, seed: int) -> list[Any]:
    """Runs a random stream to completion through one of the two update paths; returns
    every step's decisions and finishes."""
    rng = np.random.default_rng(seed)
    for rid in range(12):
        prompt = rng.integers(0, 50, size=int(rng.integers(1, 30)))
        scheduler.add_request(rid, prompt, max_tokens=int(rng.integers(1, 12)), eos_token_id=7)
    computed: dict[int, int] = {}
    trace: list[Any] = []
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        ids, counts = out.num_scheduled_tokens_arrays()
        assert dict(zip(ids.tolist(), counts.tolist(), strict=True)) == out.num_scheduled_tokens
        cached = out.scheduled_cached_reqs
        cached_ids, cached_computed, num_new, new_blocks = out.scheduled_cached_reqs_arrays()
        assert cached_ids.tolist() == cached.req_ids
        assert cached_computed.tolist() == cached.num_computed_tokens.tolist()
        assert num_new.tolist() == [len(b) for b in cached.new_block_ids]
        assert new_blocks.tolist() == [b for bs in cached.new_block_ids for b in bs.tolist()]
        for rid in out.preempted_req_ids:
            computed.pop(rid, None)
        sampled: dict[int, list[int]] = {}
        for rid, n in zip(ids.tolist(), counts.tolist(), strict=True):
            done = computed.get(rid)
            computed[rid] = scheduler.num_computed_tokens(rid) if done is None else done + n
            if computed[rid] >= scheduler.num_tokens(rid):
                sampled[rid] = [int(rng.integers(0, 50))]
        if bulk:
            # Counts given for even seeds, implied (one each) for odd ones.
            num_sampled = np.array([len(ts) for ts in sampled.values()], dtype=np.int64)
            finished = scheduler.update_from_output_arrays(
                np.array(list(sampled), dtype=np.int64),
                np.array([t for ts in sampled.values() for t in ts], dtype=np.int64),
                num_sampled=num_sampled if seed % 2 == 0 else None,
            )
        else:
            finished = scheduler.update_from_output(sampled)
        trace.append((ids.tolist(), counts.tolist(), out.preempted_req_ids, finished))
    return trace


@pytest.mark.parametrize("seed", range(5))
def test_the_bulk_array_path_decides_as_the_dict_path(seed: int) -> None:
    # A tight pool: preemptions happen, and requests come back resumed.
    make = lambda: small(num_blocks=14, max_num_batched_tokens=24, max_model_len=48)  # noqa: E731
    assert _drive(make(), bulk=True, seed=seed) == _drive(make(), bulk=False, seed=seed)


def test_the_bulk_array_path_refuses_an_id_given_twice_and_applies_nothing() -> None:
    scheduler = small()
    for rid in (1, 2):
        scheduler.add_request(rid, np.arange(4), max_tokens=3)
    scheduler.schedule()
    with pytest.raises(InputError, match="appears twice"):
        scheduler.update_from_output_arrays([1, 2, 1], [5, 6, 7])
    assert (scheduler.num_tokens(1), scheduler.num_tokens(2)) == (4, 4)
    # The outputs kept from the refused call are not taken for the next one's.
    assert scheduler.update_from_output_arrays([2], [9]) == []
    assert (scheduler.num_tokens(1), scheduler.num_tokens(2)) == (4, 5)


def test_the_bulk_array_path_refuses_what_does_not_line_up() -> None:
    scheduler = small()
    scheduler.add_request(1, np.arange(4), max_tokens=3)
    scheduler.add_request("s", np.arange(4), max_tokens=3)
    out = scheduler.schedule()
    with pytest.raises(InputError, match="request_id"):
        out.num_scheduled_tokens_arrays()
    with pytest.raises(InputError, match="num_sampled"):
        scheduler.update_from_output_arrays([1], [5, 6], num_sampled=[1, 1])
    with pytest.raises(InputError, match="sampled_token_ids"):
        scheduler.update_from_output_arrays([1], [5, 6])
    with pytest.raises(InputError, match="num_sampled"):
        scheduler.update_from_output_arrays([1], [], num_sampled=[-1])
    with pytest.raises(UnknownRequestError):
        scheduler.update_from_output_arrays([2], [5])
    # Nothing was applied: the real update still works.
    assert scheduler.update_from_output_arrays([1], [5]) == []
    assert scheduler.num_tokens(1) == 5
    # A str id among the running requests: the cached requests' arrays refuse it too.
    scheduler.update_from_output({"s": [5]})
    with pytest.raises(InputError, match="request_id"):
        scheduler.schedule().scheduled_cached_reqs_arrays()
