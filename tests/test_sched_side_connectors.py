"""The step scheduler's auxiliary-output connector (vLLM 0.33's
``AuxOutputSchedulerConnector``: a prefix hit capped where the records kept beside the KV
end) and encoder-cache connector (vLLM 0.33's ``ECConnectorBase``: items it holds take cache
room and no encoder budget) through the Python API, with numbers checkable by hand, and
their errors."""

from __future__ import annotations

from typing import Any

import pytest

from tokenyard.errors import ConfigError, ConnectorError
from tokenyard.kv import block_hashes
from tokenyard.sched import Scheduler, SchedulerConfig


def config(**overrides: Any) -> SchedulerConfig:
    fields: dict[str, Any] = {
        "max_num_seqs": 0,
        "max_num_batched_tokens": 32,
        "block_size": 4,
        "num_blocks": 16,
        "max_model_len": 64,
        "enable_prefix_caching": True,
        "reserve_null_block": False,
        "scheduler_reserve_full_isl": False,
    }
    fields.update(overrides)
    return SchedulerConfig(**fields)


PROMPT = list(range(100, 116))  # four 4-token blocks


class Kept:
    """Keeps the records of the first ``kept`` tokens; logs what it was asked."""

    def __init__(self, kept: Any) -> None:
        self.kept = kept
        self.asked: list[tuple[Any, list[int], list[int | None]]] = []

    def max_cache_hit(self, view: Any, hashes: list[int], ids: list[int | None]) -> Any:
        self.asked.append((view.request_id, hashes, ids))
        return self.kept

    def cap_external_hit(self, view: Any, local: int, external: int, *_: Any) -> int:
        return external if local + external <= self.kept else 0

    def request_loading(self, view: Any, num_tokens: int) -> None:
        pass


def seeded() -> Scheduler:
    """Request "a" computed PROMPT (its four blocks cached), then aborted."""
    s = Scheduler(config())
    s.add_request("a", PROMPT, 4)
    s.schedule()
    s.abort(["a"])
    return s


def test_the_hit_stops_at_the_last_whole_block_whose_records_are_kept() -> None:
    s = seeded()
    s.add_request("b", PROMPT, 4)
    assert s.schedule().scheduled_new_reqs[0].num_computed_tokens == 12  # 15 of 16, whole
    s = seeded()
    connector = Kept(9)
    s.set_aux_output_connector(connector)
    s.add_request("b", PROMPT, 4)
    out = s.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 8  # 9 -> two whole blocks
    [(request_id, hashes, ids)] = connector.asked
    # The connector was shown the request's blocks as the pool holds them.
    assert request_id == "b"
    assert hashes == block_hashes(PROMPT, block_size=4)
    assert all(i is not None for i in ids)
    assert ids == [s.cached_block_id(h) for h in hashes]


def test_cached_block_id_forgets_an_evicted_block() -> None:
    s = Scheduler(config(max_num_batched_tokens=64))
    s.add_request("a", PROMPT, 4)
    s.schedule()
    s.abort(["a"])
    first = block_hashes(PROMPT, block_size=4)[0]
    assert s.cached_block_id(first) is not None
    # Four other 16-token prompts take all 16 blocks, the cached ones last.
    for i in range(4):
        s.add_request(f"x{i}", [1000 * (i + 1) + t for t in range(16)], 4)
    s.schedule()
    assert s.cached_block_id(first) is None
    assert s.cached_block_id(first, 3) is None  # no such group: nothing cached there


def test_the_aux_connector_errors_are_typed() -> None:
    s = Scheduler(config())
    with pytest.raises(ConfigError, match="aux_output_connector"):
        s.set_aux_output_connector(object())
    s.set_aux_output_connector(Kept("many"))
    s.add_request("a", PROMPT, 4)
    with pytest.raises(ConnectorError, match="max_cache_hit"):
        s.schedule()
    radix = Scheduler(config(prefix_cache="radix"))
    with pytest.raises(ConfigError, match="prefix_cache"):
        radix.set_aux_output_connector(Kept(0))
    radix.set_aux_output_connector(None)


class Holds:
    """Holds the encoder outputs of ``held``; logs its calls."""

    def __init__(self, held: set[str]) -> None:
        self.held = held
        self.calls: list[Any] = []

    def has_cache_item(self, identifier: str) -> bool:
        self.calls.append(("has", identifier))
        return identifier in self.held

    def update_state_after_alloc(self, view: Any, input_id: int) -> None:
        self.calls.append(("alloc", view.request_id, input_id))


def test_an_item_the_encoder_connector_holds_takes_no_budget() -> None:
    # Budget 100: image "a" (100) is held, so "b" (100) is encoded in the same step.
    s = Scheduler(config(max_num_batched_tokens=256, max_model_len=512, num_blocks=128))
    s.encoder_budget = 100
    s.set_encoder_cache_size(300)
    connector = Holds({"a"})
    s.set_encoder_connector(connector)
    items = [(0, 100, "a"), (110, 100, "b")]
    s.add_request("r", list(range(220)), 2, mm_features=items)
    out = s.schedule()
    assert dict(out.num_scheduled_tokens) == {"r": 220}
    assert out.scheduled_encoder_inputs == {"r": [1]}
    assert connector.calls == [("has", "a"), ("has", "b"), ("alloc", "r", 1), ("alloc", "r", 0)]
    with pytest.raises(ConfigError, match="encoder_connector"):
        s.set_encoder_connector(object())
