"""A KV connector beside several KV groups through the Python API (vLLM 0.33 runs its
coordinator with a connector): per-group block tables to the connector, its
``get_loaded_kv_cache_group_ids``, zeroing of new blocks, and the processed-token prune
vLLM's ``_connector_finished`` makes. Numbers checkable by hand: blocks of 4, a window of 8."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tokenyard.errors import ConfigError, ConnectorError
from tokenyard.kv import FullAttentionSpec, SlidingWindowSpec
from tokenyard.sched import Scheduler, SchedulerConfig


def config(**extra: Any) -> SchedulerConfig:
    options: dict[str, Any] = {
        "num_blocks": 64,
        "block_size": 4,
        "max_model_len": 64,
        "max_num_batched_tokens": 32,
        "enable_prefix_caching": True,
        "kv_groups": (FullAttentionSpec(), SlidingWindowSpec(sliding_window=8)),
        **extra,
    }
    return SchedulerConfig(**options)


class GroupConnector:
    """Offers ``offer`` tokens (asynchronously unless ``sync``); keeps what it is given."""

    def __init__(self, offer: int, loaded: Any = None, *, sync: bool = False) -> None:
        self.offer = offer
        self.load_async = not sync
        self.loaded = loaded
        self.allocated: list[Any] = []
        self.finished: list[Any] = []

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return self.offer, self.load_async

    def update_state_after_alloc(self, request: Any, block_ids: Any, n: int) -> None:
        self.allocated.append(block_ids)

    def request_finished(self, request: Any, block_ids: Any) -> bool:
        self.finished.append(block_ids)
        return False

    def get_loaded_kv_cache_group_ids(self, request: Any) -> Any:
        return self.loaded


def test_the_connector_gets_a_table_per_group() -> None:
    # 16 of 20 tokens loaded (synchronously): the window group holds (16 + 1 - 8) // 4 = 2
    # nulls. Finished after its step (20 computed), the connector gets the tables without
    # what the window left: (20 + 1 - 8) // 4 = 3 nulls.
    connector = GroupConnector(16, sync=True)
    s = Scheduler(config(), connector=connector)
    s.add_request(0, list(range(20)), max_tokens=2)
    out = s.schedule()
    assert out.num_scheduled_tokens == {0: 4}
    (tables,) = connector.allocated
    assert isinstance(tables, tuple)
    assert [len(t) for t in tables] == [5, 5]
    assert list(tables[1][:2]) == [0, 0]
    assert tables[1][2] != 0
    s.update_from_output({0: [7]})
    s.abort([0])
    (finished,) = connector.finished
    assert isinstance(finished, tuple)
    assert list(finished[0]) == list(tables[0])
    assert [int(b) for b in finished[1][:3]] == [0, 0, 0]


def test_zeroing_skips_the_groups_a_load_restores() -> None:
    # Both groups restored: nothing the load writes is zeroed; once it landed, the 4
    # tokens to compute get one new block per group, zeroed.
    s = Scheduler(config(), connector=GroupConnector(16, loaded=[0, 1]))
    s.set_kv_cache_zeroing(True)
    s.add_request(0, list(range(20)), max_tokens=2)
    s.schedule()
    assert s.take_new_block_ids().size == 0
    s.finish_kv_transfers(finished_recving=[0])
    s.schedule()
    zeroed = s.take_new_block_ids()
    assert zeroed.dtype == np.uint32
    assert len(zeroed) == 2


def test_zeroing_is_refused_with_one_group() -> None:
    s = Scheduler(config(kv_groups=()))
    with pytest.raises(ConfigError, match="kv_cache_zeroing"):
        s.set_kv_cache_zeroing(True)


def test_a_bad_loaded_group_answer_is_a_connector_error() -> None:
    s = Scheduler(config(), connector=GroupConnector(16, loaded=[5]))
    s.add_request(0, list(range(20)), max_tokens=2)
    with pytest.raises(ConnectorError, match="get_loaded_kv_cache_group_ids"):
        s.schedule()


def test_prune_skipped_blocks_frees_what_the_window_left() -> None:
    s = Scheduler(config())
    s.add_request(0, list(range(20)), max_tokens=4)
    s.schedule()
    s.update_from_output({0: [7]})
    # 20 computed: the next token attends to 13..20, so blocks 0-2 (tokens 0..11) go.
    tables = s.prune_skipped_blocks(0)
    assert [int(b) for b in tables[1][:3]] == [0, 0, 0]
    assert all(int(b) != 0 for b in tables[0])
