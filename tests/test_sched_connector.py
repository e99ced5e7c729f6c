"""KV connectors through the Python API: behaviours with numbers checkable by hand, the
errors, and a state machine driving a scheduler with a random connector and a fake engine
that reports transfers late."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tokenyard.errors import ConfigError, ConnectorError, InputError
from tokenyard.sched import KvConnector, RequestView, Scheduler, SchedulerConfig


def config(**overrides: Any) -> SchedulerConfig:
    fields: dict[str, Any] = {
        "max_num_seqs": 0,
        "max_num_batched_tokens": 10,
        "block_size": 4,
        "num_blocks": 8,
        "max_model_len": 32,
        # Hand-counted blocks: every block holds KV, admission checks only the chunk.
        "reserve_null_block": False,
        "scheduler_reserve_full_isl": False,
    }
    fields.update(overrides)
    return SchedulerConfig(**fields)


class FakeConnector:
    """Offers ``offer`` tokens (``None``: every one after the local hit), loads them
    asynchronously or not, keeps finished requests' blocks when ``delay_free``; logs calls."""

    def __init__(
        self,
        offer: int | None = None,
        *,
        load_async: bool = False,
        delay_free: bool = False,
        undecided: Any = False,
    ) -> None:
        self.offer = offer
        self.load_async = load_async
        self.delay_free = delay_free
        # What "cannot tell yet" looks like (None, or vLLM's (None, False)); False: decide.
        self.undecided = undecided
        self.calls: list[tuple[Any, ...]] = []

    def get_num_new_matched_tokens(self, request: RequestView, num_computed_tokens: int) -> Any:
        self.calls.append(("match", request.request_id, num_computed_tokens, request.status))
        if self.undecided is not False:
            return self.undecided
        rest = request.num_tokens - num_computed_tokens
        num_tokens = rest if self.offer is None else min(self.offer, rest)
        return (num_tokens, self.load_async)

    def update_state_after_alloc(
        self, request: RequestView, block_ids: npt.NDArray[np.uint32], num_external_tokens: int
    ) -> None:
        self.calls.append(("alloc", request.request_id, block_ids.tolist(), num_external_tokens))

    def request_finished(self, request: RequestView, block_ids: npt.NDArray[np.uint32]) -> bool:
        self.calls.append(("finished", request.request_id, block_ids.tolist(), request.status))
        return self.delay_free

    def asked(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "match"]


def run_step(scheduler: Scheduler, token: int = 7) -> tuple[Any, list[tuple[Any, str]]]:
    """One step with a fake model: each request that caught up samples ``token``."""
    out = scheduler.schedule()
    sampled = {
        rid: [token]
        for rid in out.num_scheduled_tokens
        if scheduler.num_computed_tokens(rid) == scheduler.num_tokens(rid)
    }
    finished = scheduler.update_from_output(sampled)
    scheduler.check_invariants()
    return out, finished


def test_the_connector_protocol_is_satisfied_by_the_fake() -> None:
    connector: KvConnector = FakeConnector()
    assert Scheduler(config(), connector=connector).num_kv_transfers == (0, 0)


def test_an_async_load_parks_the_request_and_is_reported_once() -> None:
    scheduler = Scheduler(config(), connector=FakeConnector(load_async=True))
    scheduler.add_request("a", range(10), max_tokens=2)
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {}
    [load] = out.kv_loads
    assert (load.request_id, load.num_external_tokens, load.num_host_tokens) == ("a", 10, 0)
    assert scheduler.waiting_ids() == ["a"]
    assert scheduler.num_kv_transfers == (1, 0)
    assert scheduler.num_free_blocks == 8 - 3  # ceil(10 / 4) blocks for the load
    out = scheduler.schedule()
    assert (out.num_scheduled_tokens, out.kv_loads) == ({}, [])
    scheduler.check_invariants()


def test_a_landed_load_runs_only_its_last_token() -> None:
    scheduler = Scheduler(config(), connector=FakeConnector(load_async=True))
    scheduler.add_request("a", range(10), max_tokens=2)
    scheduler.schedule()
    scheduler.finish_kv_transfers(finished_recving=["a"])
    out, _ = run_step(scheduler)
    # All 10 tokens landed; the 10th is recomputed for its logits (vLLM does the same).
    assert out.num_scheduled_tokens == {"a": 1}
    [new] = out.scheduled_new_reqs
    assert (new.num_computed_tokens, len(new.block_ids)) == (9, 3)
    assert scheduler.num_tokens("a") == 11
    assert scheduler.num_kv_transfers == (0, 0)


def test_a_sync_load_counts_as_computed_and_the_rest_shares_the_budget() -> None:
    scheduler = Scheduler(config(), connector=FakeConnector(6))
    scheduler.add_request("a", range(10), max_tokens=2)
    scheduler.add_request("b", range(100, 110), max_tokens=2)
    out = scheduler.schedule()
    # 6 of each prompt are loaded: "a" computes 4 of the budget of 10, "b" the other 4.
    assert out.num_scheduled_tokens == {"a": 4, "b": 4}
    assert [r.num_computed_tokens for r in out.scheduled_new_reqs] == [6, 6]
    assert out.kv_loads == []


def test_a_failed_load_recomputes_the_whole_prompt_without_asking_again() -> None:
    connector = FakeConnector(load_async=True)
    scheduler = Scheduler(config(), connector=connector)
    scheduler.add_request("a", range(10), max_tokens=2)
    scheduler.schedule()
    scheduler.finish_kv_transfers(failed_recving=["a"])
    out, _ = run_step(scheduler)
    assert out.num_scheduled_tokens == {"a": 10}
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    assert len(connector.asked()) == 1


def test_request_finished_true_keeps_the_blocks_until_the_send_is_reported() -> None:
    connector = FakeConnector(0, delay_free=True)
    scheduler = Scheduler(config(), connector=connector)
    scheduler.add_request("a", range(10), max_tokens=1)
    _, finished = run_step(scheduler)
    assert finished == [("a", "length")]
    assert connector.calls[-1] == ("finished", "a", [0, 1, 2], "running")
    assert scheduler.num_free_blocks == 5
    assert scheduler.num_kv_transfers == (0, 1)
    assert scheduler.schedule().finished_req_ids == ["a"]
    assert scheduler.num_free_blocks == 5, "a step does not release a send"
    scheduler.finish_kv_transfers(finished_sending=["a"])
    assert scheduler.num_free_blocks == 8
    assert scheduler.num_kv_transfers == (0, 0)


@pytest.mark.parametrize("undecided", [None, (None, False)])
def test_an_undecided_connector_leaves_the_request_waiting_and_is_asked_again(
    undecided: Any,
) -> None:
    connector = FakeConnector(undecided=undecided)
    scheduler = Scheduler(config(), connector=connector)
    scheduler.add_request("a", range(4), max_tokens=2)
    scheduler.add_request("b", range(100, 104), max_tokens=2)
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {}
    assert scheduler.waiting_ids() == ["a", "b"]
    scheduler.schedule()
    assert [c[1] for c in connector.asked()] == ["a", "b", "a", "b"]
    connector.undecided = False
    connector.offer = 0
    assert scheduler.schedule().num_scheduled_tokens == {"a": 4, "b": 4}


def test_aborting_a_loading_request_holds_its_blocks_until_its_load_is_reported() -> None:
    scheduler = Scheduler(config(), connector=FakeConnector(load_async=True))
    scheduler.add_request("a", range(10), max_tokens=2)
    scheduler.schedule()
    scheduler.abort("a")
    assert not scheduler.has_unfinished_requests()
    assert scheduler.num_free_blocks == 5, "the load may still be writing into them"
    assert scheduler.num_kv_transfers == (0, 1)
    assert scheduler.schedule().finished_req_ids == ["a"]
    scheduler.finish_kv_transfers(finished_recving=["a"])
    assert scheduler.num_free_blocks == 8
    scheduler.check_invariants()


def test_aborting_a_request_whose_load_was_reported_frees_its_blocks_at_once() -> None:
    scheduler = Scheduler(config(), connector=FakeConnector(load_async=True))
    scheduler.add_request("a", range(10), max_tokens=2)
    scheduler.schedule()
    scheduler.finish_kv_transfers(finished_recving=["a"])
    scheduler.abort("a")
    assert (scheduler.num_free_blocks, scheduler.num_kv_transfers) == (8, (0, 0))


def test_update_state_after_alloc_sees_the_whole_block_table() -> None:
    connector = FakeConnector(0)
    scheduler = Scheduler(config(), connector=connector)
    scheduler.add_request("a", range(8), max_tokens=1)
    out, _ = run_step(scheduler)
    cached = out.scheduled_new_reqs[0].block_ids.tolist()
    # "b" shares a's 8 tokens (two cached blocks), then the connector loads 2 more.
    connector.offer = 2
    scheduler.add_request("b", [*range(8), 50, 51, 52, 53], max_tokens=1)
    out = scheduler.schedule()
    assert connector.asked()[-1] == ("match", "b", 8, "waiting")
    [new] = out.scheduled_new_reqs
    assert connector.calls[-1] == ("alloc", "b", new.block_ids.tolist(), 2)
    assert new.block_ids.tolist()[:2] == cached
    assert (new.num_computed_tokens, out.num_scheduled_tokens) == (10, {"b": 2})


# --- errors ---------------------------------------------------------------------------


class Raising(FakeConnector):
    """Raises in the method named ``fail`` (until it is cleared)."""

    def __init__(self, fail: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail = fail

    def check(self, method: str) -> None:
        if self.fail == method:
            raise LookupError(f"{method} bug")

    def get_num_new_matched_tokens(self, request: RequestView, num_computed_tokens: int) -> Any:
        self.check("get_num_new_matched_tokens")
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: RequestView, block_ids: npt.NDArray[np.uint32], num_external_tokens: int
    ) -> None:
        self.check("update_state_after_alloc")
        super().update_state_after_alloc(request, block_ids, num_external_tokens)

    def request_finished(self, request: RequestView, block_ids: npt.NDArray[np.uint32]) -> Any:
        self.check("request_finished")
        return super().request_finished(request, block_ids)


def drain(scheduler: Scheduler) -> None:
    for _ in range(100):
        if not scheduler.has_unfinished_requests():
            return
        run_step(scheduler)
    raise AssertionError("requests left unfinished")


def test_an_exception_while_admitting_names_the_method_and_keeps_the_step() -> None:
    connector = Raising(None, offer=0)
    scheduler = Scheduler(config(), connector=connector)
    scheduler.add_request("a", range(4), max_tokens=3)
    run_step(scheduler)
    connector.fail = "get_num_new_matched_tokens"
    scheduler.add_request("b", range(100, 104), max_tokens=3)
    with pytest.raises(ConnectorError, match="get_num_new_matched_tokens") as caught:
        scheduler.schedule()
    assert caught.value.field == "get_num_new_matched_tokens"
    assert caught.value.value == "LookupError: get_num_new_matched_tokens bug"
    assert isinstance(caught.value.__cause__, LookupError)
    scheduler.check_invariants()
    # The step planned before "b" was reached ("a"'s decode) comes with the next call.
    connector.fail = None
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 1}
    assert scheduler.waiting_ids() == ["b"]
    scheduler.update_from_output({"a": [7]})
    drain(scheduler)
    assert scheduler.num_free_blocks == 8


def test_an_exception_after_allocating_keeps_the_admission() -> None:
    connector = Raising("update_state_after_alloc", offer=6)
    scheduler = Scheduler(config(), connector=connector)
    scheduler.add_request("a", range(10), max_tokens=2)
    with pytest.raises(ConnectorError, match="update_state_after_alloc") as caught:
        scheduler.schedule()
    assert isinstance(caught.value.__cause__, LookupError)
    scheduler.check_invariants()
    connector.fail = None
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 4}
    assert out.scheduled_new_reqs[0].num_computed_tokens == 6


@pytest.mark.parametrize("how", ["update", "abort"])
def test_an_exception_in_request_finished_still_finishes_and_frees(how: str) -> None:
    connector = Raising("request_finished", offer=0, delay_free=True)
    scheduler = Scheduler(config(), connector=connector)
    scheduler.add_request("a", range(4), max_tokens=1)
    scheduler.add_request("b", range(100, 104), max_tokens=1)
    scheduler.schedule()
    finish = {
        "update": lambda: scheduler.update_from_output({"a": [7], "b": [7]}),
        "abort": lambda: scheduler.abort(["a", "b"]),
    }[how]
    with pytest.raises(ConnectorError, match="request_finished"):
        finish()
    scheduler.check_invariants()
    assert not scheduler.has_unfinished_requests()
    assert (scheduler.num_free_blocks, scheduler.num_kv_transfers) == (8, (0, 0))
    assert scheduler.schedule().finished_req_ids == ["a", "b"]


@pytest.mark.parametrize(
    "answer",
    ["5", 5, (-1, True), (1.5, False), (True, False), (3, "yes"), (3, None), (1, 2, 3), [3, False]],
)
def test_a_bad_answer_to_get_num_new_matched_tokens_is_refused(answer: Any) -> None:
    connector = FakeConnector(undecided=answer)
    scheduler = Scheduler(config(), connector=connector)
    scheduler.add_request("a", range(4), max_tokens=2)
    with pytest.raises(ConnectorError, match="get_num_new_matched_tokens") as caught:
        scheduler.schedule()
    assert caught.value.value == repr(answer)
    assert scheduler.waiting_ids() == ["a"]
    assert scheduler.num_free_blocks == 8
    scheduler.check_invariants()


@pytest.mark.parametrize("answer", [None, "yes", 1, (1,), (True, None, None)])
def test_a_bad_answer_to_request_finished_is_refused(answer: Any) -> None:
    class Answering(FakeConnector):
        def request_finished(self, request: RequestView, block_ids: Any) -> Any:
            return answer

    scheduler = Scheduler(config(), connector=Answering(0))
    scheduler.add_request("a", range(4), max_tokens=1)
    scheduler.schedule()
    with pytest.raises(ConnectorError, match="request_finished") as caught:
        scheduler.update_from_output({"a": [7]})
    assert caught.value.value == repr(answer)
    assert (scheduler.has_unfinished_requests(), scheduler.num_free_blocks) == (False, 8)


@pytest.mark.parametrize("answer", [True, (True, {"remote_host": "p0"})])
def test_request_finished_may_answer_in_vllms_shape(answer: Any) -> None:
    class Answering(FakeConnector):
        def request_finished(self, request: RequestView, block_ids: Any) -> Any:
            return answer

    scheduler = Scheduler(config(), connector=Answering(0))
    scheduler.add_request("a", range(4), max_tokens=1)
    run_step(scheduler)
    assert scheduler.num_kv_transfers == (0, 1)


@pytest.mark.parametrize(("load_async", "offer"), [(False, 10), (True, 11)])
def test_offering_more_tokens_than_the_request_has_is_refused(load_async: bool, offer: int) -> None:
    class Greedy(FakeConnector):
        def get_num_new_matched_tokens(self, request: RequestView, n: int) -> Any:
            return (offer, load_async)

    scheduler = Scheduler(config(), connector=Greedy())
    scheduler.add_request("a", range(10), max_tokens=2)
    # A synchronous load must leave the last token to compute; an asynchronous one may
    # cover the prompt (the last token is recomputed when it lands), no more.
    with pytest.raises(ConnectorError, match="at most") as caught:
        scheduler.schedule()
    assert (caught.value.field, caught.value.value) == (
        "get_num_new_matched_tokens",
        f"{offer} tokens",
    )
    scheduler.check_invariants()


def test_unknown_ids_in_finish_kv_transfers_apply_nothing() -> None:
    scheduler = Scheduler(config(), connector=FakeConnector(load_async=True))
    scheduler.add_request("a", range(10), max_tokens=2)
    scheduler.schedule()
    with pytest.raises(InputError, match="'zz'"):
        scheduler.finish_kv_transfers(finished_recving=["a", "zz"])
    with pytest.raises(InputError, match="'zz'"):
        scheduler.finish_kv_transfers(finished_recving=["a"], finished_sending=["zz"])
    assert scheduler.schedule().num_scheduled_tokens == {}, "the load was not marked landed"
    assert scheduler.num_kv_transfers == (1, 0)


def test_finished_sending_for_a_live_request_is_refused() -> None:
    scheduler = Scheduler(config(), connector=FakeConnector(0))
    scheduler.add_request("a", range(4), max_tokens=3)
    run_step(scheduler)
    with pytest.raises(InputError, match="no KV transfer in flight"):
        scheduler.finish_kv_transfers(finished_sending=["a"])
    with pytest.raises(InputError, match="no KV transfer in flight"):
        scheduler.finish_kv_transfers(finished_recving=["a"])


@pytest.mark.parametrize("ids", ["a", 3, 1.5])
def test_finish_kv_transfers_takes_iterables_of_ids(ids: Any) -> None:
    scheduler = Scheduler(config(), connector=FakeConnector(0))
    with pytest.raises(InputError, match="finished_recving"):
        scheduler.finish_kv_transfers(finished_recving=ids)


def test_a_connector_needs_the_block_hash_pool() -> None:
    with pytest.raises(ConfigError, match="prefix_cache") as caught:
        Scheduler(config(prefix_cache="radix"), connector=FakeConnector())
    assert caught.value.field == "prefix_cache"


def test_an_object_without_the_methods_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="has no method get_num_new_matched_tokens"):
        Scheduler(config(), connector=object())


def test_a_connector_calling_back_into_the_scheduler_is_refused() -> None:
    class Meddling(FakeConnector):
        scheduler: Scheduler

        def get_num_new_matched_tokens(self, request: RequestView, n: int) -> Any:
            self.scheduler.abort(request.request_id)
            return (0, False)

    connector = Meddling()
    scheduler = Scheduler(config(), connector=connector)
    connector.scheduler = scheduler
    scheduler.add_request("a", range(4), max_tokens=2)
    with pytest.raises(ConnectorError, match="call back into the Scheduler"):
        scheduler.schedule()
    assert scheduler.waiting_ids() == ["a"]


class LoadsFor(FakeConnector):
    """Loads asynchronously, for each request it names, that many tokens after the local
    hit (``None``: all of them); nothing for the others or after a preemption."""

    def __init__(self, loads: dict[str, int | None]) -> None:
        super().__init__()
        self.loads = loads

    def get_num_new_matched_tokens(self, request: RequestView, n: int) -> Any:
        if request.request_id not in self.loads or request.status != "waiting":
            return (0, False)
        offer = self.loads[request.request_id]
        rest = request.num_tokens - n
        return (rest if offer is None else min(offer, rest), True)


def test_a_landed_load_is_served_before_waiting_requests_that_hold_nothing() -> None:
    """vLLM 0.33's ``kv_holding_waiting``: requests holding KV blocks are admitted before the
    rest, so a landed load never waits behind a head that needs the memory it holds."""
    scheduler = Scheduler(config(max_num_batched_tokens=32), connector=LoadsFor({"b": None}))
    scheduler.add_request("a", range(20), max_tokens=8)  # 5 blocks
    scheduler.add_request("b", range(100, 112), max_tokens=1)  # its 3 blocks load
    out, _ = run_step(scheduler)
    assert (out.num_scheduled_tokens, len(out.kv_loads)) == ({"a": 20}, 1)
    run_step(scheduler)  # "a" needs a 6th block: none free, it preempts itself
    assert scheduler.waiting_ids() == ["b", "a"]  # the block holder first
    scheduler.finish_kv_transfers(finished_recving=["b"])
    out, _ = run_step(scheduler)
    assert (out.num_scheduled_tokens, out.preempted_req_ids) == ({"b": 1}, [])
    out, _ = run_step(scheduler)
    assert out.num_scheduled_tokens == {"a": 1}  # "b" is done; "a"'s 20 tokens hit
    drain(scheduler)
    assert scheduler.num_free_blocks == 8


def test_a_second_load_waits_for_the_first_prefill_instead_of_wedging_it() -> None:
    """vLLM 0.33 starts a load only beside the blocks in-flight prefills still need
    (``_inflight_prefill_reserved_blocks``): "p" loads 8 of its 20 tokens and still needs 3
    blocks, so "q"'s 5-block load waits (5 + 3 > 6 free) and "p" is never starved."""
    connector = LoadsFor({"p": 8, "q": None})
    scheduler = Scheduler(config(max_num_batched_tokens=32), connector=connector)
    scheduler.add_request("p", range(20), max_tokens=2)  # loads 8 tokens: 2 blocks
    scheduler.add_request("q", range(100, 120), max_tokens=2)  # would load 20: 5 blocks
    out, _ = run_step(scheduler)
    assert (out.num_scheduled_tokens, [load.request_id for load in out.kv_loads]) == ({}, ["p"])
    assert scheduler.num_kv_transfers == (1, 0)  # only "p" loads; "q" holds nothing
    scheduler.finish_kv_transfers(finished_recving=["p"])
    out, _ = run_step(scheduler)
    assert out.preempted_req_ids == []
    assert out.num_scheduled_tokens == {"p": 12}
    for _ in range(100):
        if not scheduler.has_unfinished_requests():
            break
        out, _ = run_step(scheduler)
        scheduler.finish_kv_transfers(finished_recving=[load.request_id for load in out.kv_loads])
    assert scheduler.num_free_blocks == 8


# --- a random connector against an engine that reports transfers late ------------------


class RandomConnector:
    """Seeded random answers: undecided, synchronous or asynchronous offers, delayed frees.
    Records the blocks it was shown, as a real connector would to move them."""

    def __init__(self, seed: int, *, load_async: bool) -> None:
        self.rng = random.Random(seed)
        self.load_async = load_async
        self.decisive = False
        self.allocated: dict[Any, list[int]] = {}
        self.sending: dict[Any, list[int]] = {}

    def get_num_new_matched_tokens(self, request: RequestView, num_computed_tokens: int) -> Any:
        if request.status not in ("waiting", "preempted"):
            raise AssertionError(f"asked about {request!r}")
        if not self.decisive and self.rng.random() < 0.2:
            return self.rng.choice([None, (None, False)])
        rest = request.num_tokens - num_computed_tokens
        if not self.load_async or self.rng.random() < 0.5:
            return (self.rng.randint(0, rest - 1), False)
        return (self.rng.randint(1, rest), True)

    def update_state_after_alloc(
        self, request: RequestView, block_ids: npt.NDArray[np.uint32], num_external_tokens: int
    ) -> None:
        self.allocated[request.request_id] = block_ids.tolist()

    def request_finished(self, request: RequestView, block_ids: npt.NDArray[np.uint32]) -> Any:
        if self.rng.random() < 0.5:
            return False
        self.sending[request.request_id] = block_ids.tolist()
        return self.rng.choice([True, (True, None)])


#: Requests take at most 20 + 6 tokens: 7 blocks of 4.
MAX_BLOCKS_PER_REQUEST = 7


class ConnectorMachine(RuleBasedStateMachine):
    """The engine's view, kept from the outputs and the connector's calls: which blocks each
    request holds, which loads and sends it has not reported yet.

    Memory is tight (preemptions), with synchronous or asynchronous loads: block holders go
    first, and a landed load that holds memory a blocked head needs while nothing runs is
    preempted."""

    @initialize(
        seed=st.integers(0, 2**32 - 1),
        load_async=st.booleans(),
        spare_blocks=st.integers(0, 8),
        budget=st.integers(1, 40),
        max_num_seqs=st.integers(0, 3),
        caching=st.booleans(),
    )
    def build(
        self,
        seed: int,
        load_async: bool,
        spare_blocks: int,
        budget: int,
        max_num_seqs: int,
        caching: bool,
    ) -> None:
        num_blocks = MAX_BLOCKS_PER_REQUEST + 1 + spare_blocks
        self.num_blocks = num_blocks
        self.connector = RandomConnector(seed, load_async=load_async)
        self.scheduler = Scheduler(
            config(
                num_blocks=num_blocks,
                max_num_batched_tokens=budget,
                max_num_seqs=max_num_seqs,
                enable_prefix_caching=caching,
            ),
            connector=self.connector,
        )
        self.live: set[Any] = set()
        self.tables: dict[Any, list[int]] = {}  # running requests' block tables
        self.loading: dict[Any, list[int]] = {}  # loads begun, not reported
        self.aborted_loading: dict[Any, list[int]] = {}  # their request was aborted
        self.landed: dict[Any, list[int]] = {}  # reported landed, not yet scheduled
        # Reported failed, not yet scheduled: the scheduler frees these blocks when the
        # request next reaches the head of the queue, which the engine cannot see.
        self.failed: dict[Any, list[int]] = {}
        self.sending: dict[Any, list[int]] = {}  # finished, blocks kept for a send
        self.next_id = 0
        self.next_token = 1000

    @rule(length=st.integers(1, 20), max_tokens=st.integers(1, 6), shared=st.booleans())
    def add(self, length: int, max_tokens: int, shared: bool) -> None:
        rid: Any = self.next_id if self.next_id % 2 else f"r{self.next_id}"
        self.next_id += 1
        prompt = list(range(length)) if shared else [self.next_id * 100 + t for t in range(length)]
        self.scheduler.add_request(rid, prompt, max_tokens)
        self.live.add(rid)

    @rule()
    def step(self) -> None:
        out = self.scheduler.schedule()
        scheduled = out.num_scheduled_tokens
        for rid in out.preempted_req_ids:
            event("preempted")
            if self.landed.pop(rid, None) is not None:
                event("landed load preempted in place")
            else:
                del self.tables[rid]
        for req in out.scheduled_new_reqs + out.scheduled_resumed_reqs:
            assert req.req_id not in self.loading, f"{req.req_id!r} scheduled while loading"
            self.landed.pop(req.req_id, None)
            self.failed.pop(req.req_id, None)
            self.tables[req.req_id] = req.block_ids.tolist()
        cached = out.scheduled_cached_reqs
        for rid, blocks in zip(cached.req_ids, cached.new_block_ids, strict=True):
            self.tables[rid] += blocks.tolist()
        for load in out.kv_loads:
            event("asynchronous load")
            assert load.request_id not in scheduled
            assert load.num_external_tokens > 0
            self.loading[load.request_id] = self.connector.allocated[load.request_id]
        assert not set(scheduled) & set(self.loading)
        assert set(scheduled) <= set(self.tables)
        sampled = {}
        for rid in scheduled:
            if self.scheduler.num_computed_tokens(rid) == self.scheduler.num_tokens(rid):
                self.next_token += 1
                sampled[rid] = [self.next_token]
        for rid, _ in self.scheduler.update_from_output(sampled):
            self.end(rid)

    def end(self, rid: Any) -> None:
        """A request finished or was aborted: what it held goes where the scheduler put it."""
        self.live.discard(rid)
        self.tables.pop(rid, None)
        self.landed.pop(rid, None)
        self.failed.pop(rid, None)
        if rid in self.loading:
            self.aborted_loading[rid] = self.loading.pop(rid)
        if rid in self.connector.sending:
            self.sending[rid] = self.connector.sending.pop(rid)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live, key=str)))
        self.scheduler.abort(rid)
        self.end(rid)

    @precondition(lambda self: self.loading or self.aborted_loading or self.sending)
    @rule(data=st.data())
    def report(self, data: st.DataObject) -> None:
        """Some transfers end: loads land or fail, sends complete."""

        def some(ids: Any) -> list[Any]:
            return data.draw(st.lists(st.sampled_from(sorted(ids, key=str)), unique=True))

        loads = (
            some([*self.loading, *self.aborted_loading])
            if self.loading or self.aborted_loading
            else []
        )
        failed = [rid for rid in loads if data.draw(st.booleans())]
        # A request aborted while loading whose connector also kept its blocks for a send
        # (vLLM asks the connector about every finished request) is freed by whichever
        # report comes first: one of the two per call.
        unsent = [rid for rid in self.sending if rid not in loads]
        sends = some(unsent) if unsent else []
        held_before = self.scheduler.num_kv_transfers[1]
        self.scheduler.finish_kv_transfers(
            finished_recving=[rid for rid in loads if rid not in failed],
            finished_sending=sends,
            failed_recving=failed,
        )
        released = 0
        for rid in loads:
            event("load reported")
            if rid in self.aborted_loading:
                del self.aborted_loading[rid]
                self.sending.pop(rid, None)
                released += 1
            elif rid in failed:
                self.failed[rid] = self.loading.pop(rid)
            else:
                self.landed[rid] = self.loading.pop(rid)
        for rid in sends:
            event("send reported")
            del self.sending[rid]
            self.aborted_loading.pop(rid, None)
        assert self.scheduler.num_kv_transfers[1] == held_before - released - len(sends)

    @invariant()
    def blocks_are_conserved(self) -> None:
        self.scheduler.check_invariants()
        held = set()
        for owner in (self.tables, self.loading, self.aborted_loading, self.landed, self.sending):
            for blocks in owner.values():
                held.update(blocks)
        maybe = {b for blocks in self.failed.values() for b in blocks}
        free = self.scheduler.num_free_blocks
        assert free + len(held) <= self.num_blocks <= free + len(held | maybe)
        loading, kept = self.scheduler.num_kv_transfers
        assert kept == len(self.aborted_loading.keys() | self.sending.keys())
        assert (
            len(self.loading) <= loading <= len(self.loading) + len(self.landed) + len(self.failed)
        )

    def teardown(self) -> None:
        # Once every transfer is reported, every request finishes and every block is freed.
        self.connector.decisive = True
        # Many live requests under a one-token budget take a step per token.
        for _ in range(20_000):
            if not self.scheduler.has_unfinished_requests():
                break
            self.step()
            self.report_everything()
            self.blocks_are_conserved()
        assert not self.scheduler.has_unfinished_requests(), self.scheduler.waiting_ids()
        self.report_everything()
        assert self.scheduler.num_kv_transfers == (0, 0)
        assert self.scheduler.num_free_blocks == self.num_blocks

    def report_everything(self) -> None:
        self.scheduler.finish_kv_transfers(
            finished_recving=[*self.loading, *self.aborted_loading],
            finished_sending=list(self.sending),
        )
        self.landed.update(self.loading)
        self.loading.clear()
        self.aborted_loading.clear()
        self.sending.clear()


TestConnectorMachine = ConnectorMachine.TestCase
TestConnectorMachine.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
