"""vLLM 0.33's HiSparse host page pool on ``tokenyard.sched.Scheduler``
(``set_hisparse_host_pages``): the settings it refuses, typed and named; the pending-frees
step hook; and a state machine whose reference model is the pool's rule (free host blocks =
blocks - the null block - one per device block a live request holds), checked after every
operation with the core's own invariants."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tokenyard.errors import ConfigError
from tokenyard.sched import Scheduler, SchedulerConfig


def _scheduler(**overrides: Any) -> Scheduler:
    options: dict[str, Any] = {
        "num_blocks": 64,
        "block_size": 4,
        "max_model_len": 64,
        "max_num_batched_tokens": 32,
        "scheduler_reserve_full_isl": True,
    }
    options.update(overrides)
    return Scheduler(SchedulerConfig(**options))


def _step(s: Scheduler) -> Any:
    out = s.schedule()
    s.update_from_output(
        {
            rid: [7]
            for rid in out.num_scheduled_tokens
            if s.num_computed_tokens(rid) >= s.num_tokens(rid)
        }
    )
    return out


@pytest.mark.parametrize(
    ("overrides", "num_blocks", "block_size", "field"),
    [
        ({}, 1, None, "hisparse_host_num_blocks"),
        ({}, 8, 16, "hisparse_block_size"),
        ({"scheduler_reserve_full_isl": False}, 8, None, "scheduler_reserve_full_isl"),
        ({"prefix_cache": "radix", "enable_prefix_caching": True}, 8, None, "hisparse_block_size"),
    ],
)
def test_settings_the_pool_cannot_serve_are_refused_by_name(
    overrides: dict[str, Any], num_blocks: int, block_size: int | None, field: str
) -> None:
    s = _scheduler(**overrides)
    with pytest.raises(ConfigError) as err:
        s.set_hisparse_host_pages(num_blocks, block_size)
    assert err.value.field == field
    assert s.hisparse_host_pages is None


@pytest.mark.parametrize("host", [False, True])
def test_with_the_pool_on_a_shared_prefix_hits_nothing(host: bool) -> None:
    # vLLM 0.33 looks the HiSparse source group up first, and it serves only host pages
    # published on the HiSparse connector's acknowledged write-backs: none here. Without
    # the pool, b hits a's first two blocks (8 tokens).
    s = _scheduler(enable_prefix_caching=True)
    if host:
        s.set_hisparse_host_pages(20)
    s.add_request("a", list(range(10)), max_tokens=4)
    _step(s)
    s.add_request("b", list(range(10)), max_tokens=4)
    out = _step(s)
    assert [d.num_computed_tokens for d in out.scheduled_new_reqs] == [0 if host else 8]


def test_the_pool_is_refused_once_requests_hold_blocks() -> None:
    s = _scheduler()
    s.add_request("a", [1, 2, 3, 4, 5], max_tokens=2)
    _step(s)
    with pytest.raises(ConfigError, match="hold KV blocks"):
        s.set_hisparse_host_pages(8)


def test_a_pending_block_free_stalls_the_request_that_finds_no_page() -> None:
    # Three usable pages: a (8 tokens, 2 pages) and b (4 tokens, 1 page) fill them; a's
    # first decode needs a third. Asked, the hook answers a reclamation is pending.
    s = _scheduler()
    s.set_hisparse_host_pages(4)
    s.add_request("a", list(range(8)), max_tokens=4)
    s.add_request("b", list(range(100, 104)), max_tokens=4)
    _step(s)
    asked: list[int] = []
    s.set_step_hooks(pending_block_frees=lambda: asked.append(1) or True)
    out = _step(s)
    assert out.num_scheduled_tokens == {}
    assert out.preempted_req_ids == []
    assert asked == [1]
    s.set_step_hooks()
    out = _step(s)
    assert out.preempted_req_ids == ["b"]
    assert out.num_scheduled_tokens == {"a": 1}


class HostPages(RuleBasedStateMachine):
    """Requests arrive, steps run and requests are aborted over a small host pool."""

    def __init__(self) -> None:
        super().__init__()
        self.host_blocks = 0
        self.s: Scheduler | None = None
        self.next_id = 0

    @rule(host_blocks=st.integers(2, 12))
    def start(self, host_blocks: int) -> None:
        if self.s is not None:
            return
        self.s = _scheduler(num_blocks=48)
        self.s.set_hisparse_host_pages(host_blocks)
        self.host_blocks = host_blocks

    @rule(num_tokens=st.integers(1, 30), max_tokens=st.integers(1, 12))
    def add(self, num_tokens: int, max_tokens: int) -> None:
        if self.s is None:
            return
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.s.add_request(rid, [self.next_id * 100 + t for t in range(num_tokens)], max_tokens)

    @rule()
    def step(self) -> None:
        if self.s is None:
            return
        _step(self.s)

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        if self.s is None:
            return
        # The scheduler's own lists: a request that finished is reported a step later.
        live = sorted([*self.s.running_ids(), *self.s.waiting_ids()])
        if not live:
            return
        self.s.abort(data.draw(st.sampled_from(live)))

    @invariant()
    def free_pages_match_the_blocks_held(self) -> None:
        if self.s is None:
            return
        self.s.check_invariants()
        held = 0
        for rid in self.s.kv_request_ids():
            tables = self.s.kv_block_tables(rid)
            assert tables is not None
            held += len(tables[0])
        pool = self.s.hisparse_host_pages
        assert pool is not None
        assert pool[2] == self.host_blocks - 1 - held


TestHostPages = HostPages.TestCase
TestHostPages.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
