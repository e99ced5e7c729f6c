"""Policy plugins through the Python API: the example plugin, and failures that leave the
scheduler unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from tokenyard.errors import ConfigError, PolicyError
from tokenyard.sched import RequestView, Scheduler, SchedulerConfig, ShortestPromptFirst


def config(**overrides: Any) -> SchedulerConfig:
    fields: dict[str, Any] = {
        "max_num_seqs": 0,
        "max_num_batched_tokens": 100,
        "block_size": 4,
        "num_blocks": 6,
        "max_model_len": 20,
        "enable_prefix_caching": False,
        # Hand-counted blocks: every block holds KV, admission checks only the chunk.
        "reserve_null_block": False,
        "scheduler_reserve_full_isl": False,
    }
    fields.update(overrides)
    return SchedulerConfig(**fields)


def test_shortest_prompt_first_admits_short_prompts_and_preempts_the_longest() -> None:
    scheduler = Scheduler(config(), plugin=ShortestPromptFirst())
    for rid, length in (("long", 12), ("short", 4), ("mid", 8)):
        scheduler.add_request(rid, range(length), max_tokens=5)
    out = scheduler.schedule()
    assert list(out.num_scheduled_tokens.items()) == [("short", 4), ("mid", 8), ("long", 12)]
    scheduler.update_from_output({"short": [1], "mid": [1], "long": [1]})
    # Every request now needs a fifth, ninth, thirteenth slot: one block each, none free.
    out = scheduler.schedule()
    assert out.preempted_req_ids == ["long"]
    scheduler.check_invariants()


class Recorder:
    """Keeps the views it was shown; FCFS answers."""

    def __init__(self) -> None:
        self.seen: list[RequestView] = []

    def order_waiting(self, waiting: list[RequestView]) -> list[Any]:
        self.seen += waiting
        return [r.request_id for r in waiting]

    def preemption_order(self, running: list[RequestView]) -> list[Any]:
        return [r.request_id for r in reversed(running)]


def test_plugins_see_request_views() -> None:
    recorder = Recorder()
    scheduler = Scheduler(config(), plugin=recorder)
    scheduler.add_request(7, [1, 2, 3], max_tokens=2, priority=3, arrival_time=1.5)
    scheduler.schedule()
    view = recorder.seen[0]
    assert (view.request_id, view.num_prompt_tokens, view.num_tokens) == (7, 3, 3)
    assert (view.priority, view.arrival_time, view.status) == (3, 1.5, "waiting")


class Raising(Recorder):
    def order_waiting(self, waiting: list[RequestView]) -> list[Any]:
        raise LookupError("plugin bug")


class Wrong(Recorder):
    def order_waiting(self, waiting: list[RequestView]) -> list[Any]:
        return ["someone else"]


class Partial(Recorder):
    def order_waiting(self, waiting: list[RequestView]) -> list[Any]:
        return [r.request_id for r in waiting][:1]


@pytest.mark.parametrize(
    ("plugin", "error", "message"),
    [
        (Raising(), LookupError, "plugin bug"),
        (Wrong(), PolicyError, "which it was not given"),
        (Partial(), PolicyError, "returned 1 requests, expected 2"),
    ],
)
def test_a_failing_plugin_changes_nothing(plugin: Any, error: type, message: str) -> None:
    scheduler = Scheduler(config(), plugin=plugin)
    scheduler.add_request("a", [1, 2], max_tokens=2)
    scheduler.add_request("b", [3, 4], max_tokens=2)
    with pytest.raises(error, match=message):
        scheduler.schedule()
    assert scheduler.waiting_ids() == ["a", "b"]
    assert scheduler.stats().num_steps == 0
    scheduler.check_invariants()


def test_an_object_without_the_methods_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="has no method order_waiting"):
        Scheduler(config(), plugin=object())
