"""The core's HiSparse device residency (``tokenyard._core.HiSparseDeviceResidency``, Rust
``kv::DeviceResidency``) against the pure-Python reference model
(``hisparse_residency_model.DeviceResidency``, which agrees with vLLM 0.33's own
``KVCacheManager`` + ``HiSparseCoordinator``: tests/test_hisparse_residency_model.py, bench
venv) as a hypothesis state machine: prompts arrive whole or in chunks, decode, write-backs
are acknowledged in any order (some by two workers), requests finish or are preempted, on a
device pool small enough that hot regions are required, clean pages unpinned and unpinned
blocks handed out again. After every rule: the same answers, every request's tables, both
free queues in order and the planned write-backs; blocks conserved on both.
``ConnectorResidency`` runs the same machine on ``tokenyard._core.HiSparseConnectorPool``
(the same rules on the core's KV coordinator with its HiSparse pins), driven in vLLM's
scheduler order (``allocate_slots`` to the slots, then ``advance_scheduled``). Runs without
vLLM."""

from __future__ import annotations

import pytest
from hisparse_residency_model import DeviceResidency
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tokenyard import errors
from tokenyard._core import HiSparseConnectorPool, HiSparseDeviceResidency

BLOCK_SIZE = 4
MAX_MODEL_LEN = 32


class Residency(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model = DeviceResidency(
            24, 24, BLOCK_SIZE, max_model_len=MAX_MODEL_LEN, max_admission_blocks=3
        )
        self.core = HiSparseDeviceResidency(
            num_blocks=24,
            host_num_blocks=24,
            block_size=BLOCK_SIZE,
            blocks_per_request=2,
            max_admission_blocks_per_request=3,
            max_spill_pages=MAX_MODEL_LEN // BLOCK_SIZE,
        )
        self.next_id = 0
        self.known: set[int] = set()
        # transfer id -> workers that enqueued it (2 for some: both must complete it)
        self.workers: dict[int, int] = {}

    @rule(num_tokens=st.integers(1, 20), chunk=st.none() | st.integers(1, 8))
    def admit(self, num_tokens: int, chunk: int | None) -> None:
        self.next_id += 1
        request_id = f"r{self.next_id}"
        done = self.model.admit(request_id, [7] * num_tokens, chunk)
        assert self.core.admit(request_id, num_tokens, chunk) == done

    @rule(data=st.data(), chunk=st.integers(1, 8))
    def step(self, data: st.DataObject, chunk: int) -> None:
        prefilling = sorted(r for r, q in self.model.requests.items() if q.computed < len(q.tokens))
        if prefilling:
            request_id = data.draw(st.sampled_from(prefilling))
            assert self.core.step(request_id, chunk) == self.model.step(request_id, chunk)

    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        done = sorted(
            r
            for r, q in self.model.requests.items()
            if q.computed == len(q.tokens) < MAX_MODEL_LEN - 1
        )
        if done:
            request_id = data.draw(st.sampled_from(done))
            assert self.core.decode(request_id) == self.model.decode(request_id, 7)

    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        planned = sorted(self.model.transfers)
        if not planned:
            return
        done = data.draw(st.lists(st.sampled_from(planned), unique=True))
        # Transfers on two workers land only when both report; the rest at once.
        first = {t: self.workers[t] for t in done}
        self.core.acknowledge(first, dict.fromkeys(done, 1))
        landed = [t for t in done if self.workers[t] == 1]
        self.model.acknowledge(landed)
        rest = [t for t in done if t not in landed]
        self.core.acknowledge({}, dict.fromkeys(rest, 1))
        self.model.acknowledge(rest)
        for t in done:
            del self.workers[t]

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        if self.model.requests:
            request_id = data.draw(st.sampled_from(sorted(self.model.requests)))
            self.model.finish(request_id)
            self.core.free(request_id)

    @invariant()
    def the_core_is_the_model(self) -> None:
        planned = self.model.take_transfers()
        assert self.core.take_transfers() == planned
        for transfer_id, _, _ in planned:
            self.workers[transfer_id] = 1 + transfer_id % 2
        assert {r: self.core.tables(r) for r in self.model.requests} == {
            r: (q.host, q.indexer, q.resident, q.hot) for r, q in self.model.requests.items()
        }
        assert self.core.free_blocks() == list(self.model.free)
        assert self.core.host_free_blocks() == list(self.model.host_free)
        assert self.core.has_pending_work() == bool(self.model.transfers)
        assert self.core.has_pending_reclamation() == self.model.has_pending_reclamation()
        self.model.check()
        self.core.check()


class ConnectorResidency(Residency):
    """``Residency`` with the core's coordinator-backed pool, which vLLM's scheduler order
    drives: the tables grown to the slots, then ``advance_scheduled``."""

    def __init__(self) -> None:
        super().__init__()
        self.core = HiSparseConnectorPool(
            num_blocks=24,
            host_num_blocks=24,
            block_size=BLOCK_SIZE,
            blocks_per_request=2,
            max_admission_blocks_per_request=3,
            max_spill_pages=MAX_MODEL_LEN // BLOCK_SIZE,
        )

    def scheduled(self, request_id: str, num_tokens: int, done: bool) -> None:
        ok = self.core.allocate_slots(request_id, num_tokens)
        assert ok == done
        if ok:
            self.core.advance_scheduled(request_id, num_tokens)

    @rule(num_tokens=st.integers(1, 20), chunk=st.none() | st.integers(1, 8))
    def admit(self, num_tokens: int, chunk: int | None) -> None:
        self.next_id += 1
        request_id = f"r{self.next_id}"
        done = self.model.admit(request_id, [7] * num_tokens, chunk)
        self.scheduled(request_id, min(num_tokens, chunk or num_tokens), done)

    @rule(data=st.data(), chunk=st.integers(1, 8))
    def step(self, data: st.DataObject, chunk: int) -> None:
        prefilling = sorted(r for r, q in self.model.requests.items() if q.computed < len(q.tokens))
        if prefilling:
            request_id = data.draw(st.sampled_from(prefilling))
            q = self.model.requests[request_id]
            total = min(q.computed + chunk, len(q.tokens))
            self.scheduled(request_id, total, self.model.step(request_id, chunk))

    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        done = sorted(
            r
            for r, q in self.model.requests.items()
            if q.computed == len(q.tokens) < MAX_MODEL_LEN - 1
        )
        if done:
            request_id = data.draw(st.sampled_from(done))
            total = len(self.model.requests[request_id].tokens) + 1
            self.scheduled(request_id, total, self.model.decode(request_id, 7))


TestResidency = Residency.TestCase
TestConnectorResidency = ConnectorResidency.TestCase
for _case in (TestResidency, TestConnectorResidency):
    _case.settings = settings(
        max_examples=80,
        stateful_step_count=50,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def test_errors_name_the_field_and_value() -> None:
    with pytest.raises(errors.ConfigError, match="num_blocks"):
        HiSparseDeviceResidency(
            num_blocks=1,
            host_num_blocks=8,
            block_size=4,
            blocks_per_request=2,
            max_admission_blocks_per_request=2,
            max_spill_pages=8,
        )
    core = HiSparseDeviceResidency(
        num_blocks=8,
        host_num_blocks=8,
        block_size=4,
        blocks_per_request=2,
        max_admission_blocks_per_request=2,
        max_spill_pages=8,
    )
    with pytest.raises(errors.UnknownRequestError, match="'a'"):
        core.free("a")
    assert core.admit("a", 5)
    with pytest.raises(errors.InputError, match="request_id"):
        core.admit("a", 5)
