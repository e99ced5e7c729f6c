"""``Scheduler.ask_again_after_failed_load``: a request whose asynchronous KV load failed asks
the connector again when next admitted, as vLLM 0.33 does under
``kv_load_failure_policy = "recompute"`` (``_update_waiting_for_remote_kv`` frees it with no
computed tokens, and the next lookup asks anew); by default it recomputes its prompt without
the connector. Blocks of 4, prompts of 10 tokens."""

from __future__ import annotations

from typing import Any

import pytest

from tokenyard.sched import Scheduler, SchedulerConfig


class Offer:
    """Offers ``offer`` tokens asynchronously; counts the lookups."""

    def __init__(self, offer: int) -> None:
        self.offer = offer
        self.asked = 0

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        self.asked += 1
        return self.offer, True

    def update_state_after_alloc(self, request: Any, block_ids: Any, n: int) -> None:
        pass

    def request_finished(self, request: Any, block_ids: Any) -> bool:
        return False


def _scheduler(connector: Offer) -> Scheduler:
    config = SchedulerConfig(
        num_blocks=16, block_size=4, max_model_len=64, max_num_batched_tokens=32
    )
    return Scheduler(config, connector=connector)


def test_off_by_default() -> None:
    assert not _scheduler(Offer(8)).ask_again_after_failed_load


@pytest.mark.parametrize(("ask_again", "asked", "loads"), [(False, 1, 0), (True, 2, 1)])
def test_a_failed_load_asks_again_only_when_set(ask_again: bool, asked: int, loads: int) -> None:
    connector = Offer(8)
    s = _scheduler(connector)
    s.ask_again_after_failed_load = ask_again
    s.add_request("a", list(range(10)), max_tokens=2)
    assert len(s.schedule().kv_loads) == 1
    s.finish_kv_transfers(failed_recving=["a"])
    out = s.schedule()
    # Off: the prompt is recomputed, all 10 tokens. On: the connector offers the 8 again,
    # and the request waits for that load.
    assert connector.asked == asked
    assert len(out.kv_loads) == loads
    assert out.num_scheduled_tokens == ({} if ask_again else {"a": 10})
    s.check_invariants()
