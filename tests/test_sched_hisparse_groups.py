"""vLLM 0.33's HiSparse device groups on ``tokenyard.sched.Scheduler`` (``kv_groups`` with
``HiSparseResidentSpec`` and ``HiSparseHotSpec``) beside the host page pool placed among the
groups (``set_hisparse_host_pages(..., source_group=0)``): behaviour tests with numbers
checked by hand from vLLM's managers (``single_type_kv_cache_manager.py``), and a state
machine whose reference model is vLLM's host ``BlockPool`` without caching (a deque: new
blocks from its front, a request's blocks back to its front tail first)."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from hisparse_publication_model import HostPublication
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from test_hisparse_publication_core import acknowledge_core, core_state, model_state

from tokenyard._core import HiSparseHostPublication
from tokenyard.errors import ConfigError
from tokenyard.kv import FullAttentionSpec, HiSparseHotSpec, HiSparseResidentSpec
from tokenyard.sched import Scheduler, SchedulerConfig


def _scheduler(cap: int = 2, hot: int = 2, **overrides: Any) -> Scheduler:
    options: dict[str, Any] = {
        "num_blocks": 64,
        "block_size": 4,
        "max_model_len": 64,
        "max_num_batched_tokens": 8,
        "scheduler_reserve_full_isl": True,
        "reserve_null_block": True,
        "enable_prefix_caching": False,
        "kv_groups": (
            FullAttentionSpec(),
            HiSparseResidentSpec(max_admission_blocks=cap),
            HiSparseHotSpec(blocks_per_request=hot),
        ),
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


def _tables(s: Scheduler, rid: str) -> list[list[int]]:
    return [g.tolist() for g in s.group_block_ids(rid)]


def test_the_resident_group_is_capped_at_admission_only() -> None:
    # 32 tokens of 4: the indexer needs 8 blocks, the resident group 8 capped at 2 by the
    # full-sequence gate (vLLM's apply_admission_cap): 10 of the 11 usable blocks (12 with
    # the null block) admit it, where 16 would not.
    s = _scheduler(num_blocks=12)
    s.set_hisparse_host_pages(9, source_group=0)
    s.add_request("a", list(range(32)), max_tokens=2)
    out = _step(s)
    assert out.num_scheduled_tokens == {"a": 8}
    # The chunk's 8 tokens: 2 host pages, 2 indexer and 2 resident blocks, no hot region.
    assert _tables(s, "a") == [[1, 2], [1, 2], [3, 4], []]
    # Growing past the cap takes the resident group's blocks all the same (vLLM's
    # allocate_new_blocks): 4 + 4 after the second chunk, and the third chunk's 2 + 2 do
    # not fit in the 3 left, so the request preempts itself.
    _step(s)
    assert [len(t) for t in _tables(s, "a")] == [4, 4, 4, 0]
    out = _step(s)
    assert out.preempted_req_ids == ["a"]
    assert out.num_scheduled_tokens == {}


def test_a_request_without_a_load_takes_no_hot_region() -> None:
    s = _scheduler(hot=3)
    s.set_hisparse_host_pages(20, source_group=0)
    s.add_request("a", list(range(6)), max_tokens=3)
    while "a" in s.running_ids() or "a" in s.waiting_ids():
        _step(s)
        if "a" in s.kv_request_ids():
            assert _tables(s, "a")[3] == []


def test_the_host_table_sits_at_the_source_groups_place() -> None:
    s = _scheduler()
    s.set_hisparse_host_pages(9, source_group=2)
    s.add_request("a", list(range(6)), max_tokens=2)
    out = _step(s)
    # Indexer, resident, then the host table, then hot.
    assert [g.tolist() for g in out.scheduled_new_reqs[0].group_block_ids] == [
        [1, 2],
        [3, 4],
        [1, 2],
        [],
    ]


def test_freed_host_blocks_are_reused_first_tail_first() -> None:
    # vLLM's BlockPool.free_blocks prepends blocks without a hash: a finished request's
    # host blocks [1, 2] go back as 2, 1 ahead of the never-used 3..8.
    s = _scheduler()
    s.set_hisparse_host_pages(9, source_group=0)
    s.add_request("a", list(range(6)), max_tokens=2)
    _step(s)
    assert _tables(s, "a")[0] == [1, 2]
    while "a" in s.kv_request_ids():
        _step(s)
    s.add_request("b", list(range(100, 112)), max_tokens=2)
    _step(s)  # its first 8 tokens
    assert _tables(s, "b")[0] == [2, 1]
    _step(s)
    assert _tables(s, "b")[0] == [2, 1, 3]


def test_prefix_caching_caches_the_indexer_but_nothing_hits() -> None:
    # vLLM 0.33's host source group serves only pages its HiSparseCoordinator published,
    # on the HiSparse connector's acknowledged write-backs: none here, so the same prompt
    # again hits nothing. The indexer's two full blocks were cached, so they went to the
    # free queue's tail: the second request takes the freed uncached blocks first.
    s = _scheduler(enable_prefix_caching=True)
    s.set_hisparse_host_pages(9, source_group=0)
    s.add_request("a", list(range(9)), max_tokens=1)
    out = _step(s)
    assert [g.tolist() for g in out.scheduled_new_reqs[0].group_block_ids][1:3] == [
        [1, 2],
        [3, 4],
    ]
    while "a" in s.kv_request_ids():
        _step(s)
    s.add_request("b", list(range(9)), max_tokens=1)
    out = s.schedule()
    new = out.scheduled_new_reqs[0]
    assert new.num_computed_tokens == 0
    assert out.num_scheduled_tokens == {"b": 8}
    indexer = new.group_block_ids[1].tolist()
    assert not {1, 2} & set(indexer)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"max_admission_blocks": 0}, "max_admission_blocks"), ({"max_admission_blocks": -1}, None)],
)
def test_spec_values_are_checked(kwargs: dict[str, int], field: str | None) -> None:
    with pytest.raises((ConfigError, ValueError, OverflowError)) as err:
        HiSparseResidentSpec(**kwargs)
    if field is not None:
        assert getattr(err.value, "field", field) == field


def test_a_source_group_without_groups_or_past_them_is_refused() -> None:
    plain = Scheduler(
        SchedulerConfig(
            num_blocks=16, block_size=4, max_model_len=16, scheduler_reserve_full_isl=True
        )
    )
    with pytest.raises(ConfigError) as err:
        plain.set_hisparse_host_pages(9, source_group=0)
    assert err.value.field == "hisparse_source_group"
    with pytest.raises(ConfigError) as err:
        _scheduler().set_hisparse_host_pages(9, source_group=4)
    assert err.value.field == "hisparse_source_group"


def test_blocks_outside_the_scheduler_beside_the_host_pool_are_refused() -> None:
    # vLLM's KVCacheManager driven directly would take host pages too; not modelled.
    s = _scheduler()
    s.set_hisparse_host_pages(9, source_group=0)
    with pytest.raises(ConfigError) as err:
        s.kv_allocate_outside("x", list(range(8)), 8)
    assert err.value.field == "hisparse_host_num_blocks"


class HostPool(RuleBasedStateMachine):
    """Requests arrive, steps run and requests are aborted beside HiSparse groups, with
    prefix caching on or off; vLLM's host pool is modelled as a deque fed by what the
    device tables grow by, running requests first (vLLM allocates for them before it
    admits). The pools are sized so that nothing preempts (a preemption frees its victim
    in the middle of the running loop; the differential tests against vLLM cover that
    order). Prompts share prefixes, yet no admission hits: a host page is hit-able only once
    published, on the HiSparse connector's acknowledged write-back, which never comes here;
    with caching on the host blocks stay unhashed, so the deque model holds as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.s: Scheduler | None = None
        self.free: deque[int] = deque()
        self.tables: dict[str, list[int]] = {}
        self.next_id = 0

    @rule(host_blocks=st.integers(41, 60), caching=st.booleans())
    def start(self, host_blocks: int, caching: bool) -> None:
        if self.s is not None:
            return
        # At most 4 running requests of 10 pages: 40 host and 80 device blocks.
        self.s = _scheduler(num_blocks=90, max_num_seqs=4, enable_prefix_caching=caching)
        self.s.set_hisparse_host_pages(host_blocks, source_group=0)
        self.free = deque(range(1, host_blocks))

    @rule(
        prefix=st.integers(0, 2),
        shared=st.sampled_from([0, 4, 8, 12]),
        num_tokens=st.integers(1, 30),
        max_tokens=st.integers(1, 10),
    )
    def add(self, prefix: int, shared: int, num_tokens: int, max_tokens: int) -> None:
        if self.s is None:
            return
        rid = f"r{self.next_id}"
        self.next_id += 1
        # One of three prefixes' first `shared` tokens, then the request's own.
        prompt = [prefix * 1000 + t for t in range(shared)]
        prompt += [self.next_id * 100 + t for t in range(num_tokens)]
        self.s.add_request(rid, prompt[:30], max_tokens)

    @rule()
    def step(self) -> None:
        if self.s is None:
            return
        out = self.s.schedule()
        assert out.preempted_req_ids == []
        for rid in out.scheduled_cached_reqs.req_ids:
            self._grow(rid)
        for data in [*out.scheduled_resumed_reqs, *out.scheduled_new_reqs]:
            self._grow(data.req_id)
        # Never a hit: no host page was published.
        assert [d.num_computed_tokens for d in out.scheduled_new_reqs] == [0] * len(
            out.scheduled_new_reqs
        )
        self.s.update_from_output(
            {
                rid: [7]
                for rid in out.num_scheduled_tokens
                if self.s.num_computed_tokens(rid) >= self.s.num_tokens(rid)
            }
        )
        self._release_gone()

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        if self.s is None:
            return
        live = sorted([*self.s.running_ids(), *self.s.waiting_ids()])
        if not live:
            return
        self.s.abort(data.draw(st.sampled_from(live)))
        self._release_gone()

    def _grow(self, rid: str) -> None:
        assert self.s is not None
        device = len(self.s.group_block_ids(rid)[1])
        table = self.tables.setdefault(rid, [])
        while len(table) < device:
            table.append(self.free.popleft())

    def _release_gone(self) -> None:
        assert self.s is not None
        holding = set(self.s.kv_request_ids())
        for rid in [r for r in self.tables if r not in holding]:
            self.free.extendleft(self.tables.pop(rid))

    @invariant()
    def host_tables_are_vllms(self) -> None:
        if self.s is None:
            return
        self.s.check_invariants()
        for rid, table in self.tables.items():
            assert self.s.group_block_ids(rid)[0].tolist() == table
        pool = self.s.hisparse_host_pages
        assert pool is not None
        assert pool[2] == len(self.free)


TestHostPool = HostPool.TestCase
TestHostPool.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class SharedHostPages(RuleBasedStateMachine):
    """The reference model of vLLM 0.33's host pool with prefix caching under the HiSparse
    connector (``hisparse_publication_model``; it is checked against vLLM's own
    ``HiSparseCoordinator`` in ``test_hisparse_host_publication.py``, bench venv): requests
    sharing prefixes arrive, whole or in prefill chunks, and decode; write-backs are
    acknowledged in any order; requests finish (some mid-prefill) or are preempted.
    After every operation blocks are conserved (each free once or referenced as often as
    tables, transfers and leases name it), nothing is freed twice (the model raises), and no
    admission hits a page whose write-back has not been acknowledged (the model raises).
    The core's port (``tokenyard._core.HiSparseHostPublication``) runs beside it: the same
    answers, tables, free queue, published blocks, references and planned write-backs."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = HostPublication(16, 4)
        self.core = HiSparseHostPublication(num_blocks=16, block_size=4, max_spill_pages=10)
        self.known: set[int] = set()
        self.next_id = 0

    @rule(
        prefix=st.integers(0, 1),
        shared=st.sampled_from([0, 4, 8, 12]),
        own=st.integers(1, 9),
        chunk=st.none() | st.integers(1, 8),
    )
    def admit(self, prefix: int, shared: int, own: int, chunk: int | None) -> None:
        self.next_id += 1
        tokens = [prefix * 100 + t for t in range(shared)]
        tokens += [1000 * self.next_id + t for t in range(own)]
        hit = self.pool.admit(f"r{self.next_id}", tokens, chunk)
        assert self.core.admit(f"r{self.next_id}", tokens, chunk) == hit
        if hit is not None:
            assert hit % 4 == 0
            assert hit < len(tokens)

    @rule(data=st.data(), chunk=st.integers(1, 8))
    def step(self, data: st.DataObject, chunk: int) -> None:
        prefilling = sorted(r for r, q in self.pool.requests.items() if q.computed < len(q.tokens))
        if prefilling:
            request_id = data.draw(st.sampled_from(prefilling))
            assert self.core.step(request_id, chunk) == self.pool.step(request_id, chunk)

    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        planned = sorted(self.pool.transfers)
        if planned:
            done = data.draw(st.lists(st.sampled_from(planned), unique=True))
            self.pool.acknowledge(done)
            acknowledge_core(self.core, dict.fromkeys(done, 1), dict.fromkeys(done, 1))

    @rule(data=st.data(), token=st.integers(0, 9))
    def decode(self, data: st.DataObject, token: int) -> None:
        done = sorted(r for r, q in self.pool.requests.items() if q.computed == len(q.tokens) < 40)
        if done:
            request_id = data.draw(st.sampled_from(done))
            assert self.core.decode(request_id, 5000 + token) == self.pool.decode(
                request_id, 5000 + token
            )

    @rule(data=st.data(), finished=st.booleans())
    def finish(self, data: st.DataObject, finished: bool) -> None:
        # Finished, or preempted (its pending writes then publish nothing).
        if self.pool.requests:
            request_id = data.draw(st.sampled_from(sorted(self.pool.requests)))
            self.pool.finish(request_id, finished=finished)
            self.core.free(request_id, finished=finished)

    @invariant()
    def blocks_are_conserved(self) -> None:
        self.pool.check()
        self.core.check()

    @invariant()
    def the_core_is_the_model(self) -> None:
        new = sorted(set(self.pool.transfers) - self.known)
        self.known.update(new)
        assert self.core.take_transfers() == [(t, self.pool.transfers[t][2]) for t in new]
        assert core_state(self.core, sorted(self.pool.requests)) == model_state(self.pool)
        assert [self.core.ref_count(b) for b in range(16)] == self.pool.ref


TestSharedHostPages = SharedHostPages.TestCase
TestSharedHostPages.settings = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
