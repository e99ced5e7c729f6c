"""tokenyard.sched.Scheduler's waits its caller decides (``wait_outside``, the
``waiting_ready`` step hook; vLLM 0.33's blocked waiting statuses, ``sched::outside_wait``):
a waiting request keeps its place and is skipped until the hook ends its wait when admission
reaches it; a remote-KV wait is served with the block holders."""

from __future__ import annotations

import pytest

from tokenyard.errors import InputError
from tokenyard.sched import Scheduler, SchedulerConfig


def _scheduler(**options: int) -> Scheduler:
    return Scheduler(SchedulerConfig(num_blocks=64, block_size=4, max_model_len=64, **options))


def test_a_wait_is_counted_skipped_and_ended_by_hand() -> None:
    s = _scheduler()
    s.add_request("a", [1, 2, 3], max_tokens=1)
    s.add_request("b", [4, 5], max_tokens=1)
    s.wait_outside("a", False)
    assert s.waits_outside("a")
    assert s.deferred_waiting_ids() == ["a"]
    # No hook: the wait lasts; "b" goes past it, "a" keeps its place.
    assert s.schedule().num_scheduled_tokens == {"b": 2}
    assert s.waiting_ids() == ["a"]
    assert s.end_outside_wait("a") is True
    assert s.end_outside_wait("a") is False
    assert s.schedule().num_scheduled_tokens == {"a": 3}
    s.check_invariants()


def test_the_hook_is_asked_in_queue_order_holders_first() -> None:
    asked: list[str] = []

    def ready(request_id: str) -> bool:
        asked.append(request_id)
        return request_id == "g"

    s = _scheduler(max_num_seqs=2)
    s.set_step_hooks(waiting_ready=ready)
    for request_id in ("g", "r", "t"):
        s.add_request(request_id, [1, 2], max_tokens=1)
    s.wait_outside("g", False)
    s.wait_outside("r", True)
    s.requeue_waiting("r", True)
    assert s.holding_waiting_ids() == ["r"]
    assert s.schedule().num_scheduled_tokens == {"g": 2, "t": 2}
    assert asked == ["r", "g"]
    assert s.holding_waiting_ids() == ["r"]


def test_a_hook_error_is_raised_and_the_queue_kept() -> None:
    def ready(request_id: str) -> bool:
        raise RuntimeError(f"no answer for {request_id}")

    s = _scheduler()
    s.set_step_hooks(waiting_ready=ready)
    s.add_request("a", [1, 2], max_tokens=1)
    s.add_request("b", [3, 4], max_tokens=1)
    s.wait_outside("b", False)
    with pytest.raises(RuntimeError, match="no answer for b"):
        s.schedule()
    assert sorted(s.waiting_ids() + s.running_ids()) == ["a", "b"]
    s.check_invariants()


def test_only_waiting_requests_without_blocks_wait_outside() -> None:
    s = _scheduler()
    s.add_request("a", [1, 2], max_tokens=1)
    s.schedule()
    with pytest.raises(InputError, match="request_id") as err:
        s.wait_outside("a", False)
    assert "Running" in str(err.value)
    with pytest.raises(InputError, match="request_id"):
        s.requeue_waiting("a", True)
    assert not s.waits_outside("nobody")
