"""Async scheduling (vLLM V1's default) against the synchronous mode: with one step always
in flight, a deterministic model must produce the same tokens and the same finishes, with
ample KV memory and with so little that requests are preempted while their step is in
flight."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenyard.sched import Scheduler, SchedulerConfig

EOS = 3


def token_for(request_id: int, k: int, eos_at: dict[int, int]) -> int:
    """The k-th output of a request: deterministic, EOS where the test says."""
    return EOS if eos_at.get(request_id) == k else 10 + (request_id * 7 + k) % 50


def samples(
    scheduler: Scheduler, out: Any, num_sampled: dict[int, int], eos_at: dict[int, int]
) -> dict[int, list[int]]:
    """What the engine samples for a step: every request whose known tokens are all computed
    (in async mode the computed count runs ahead by the outputs in flight)."""
    sampled = {}
    for rid in out.num_scheduled_tokens:
        if scheduler.num_computed_tokens(rid) >= scheduler.num_tokens(rid):
            k = num_sampled.get(rid, 0)
            num_sampled[rid] = k + 1
            sampled[rid] = [token_for(rid, k, eos_at)]
    return sampled


def run(
    async_scheduling: bool,
    prompts: list[int],
    max_tokens: list[int],
    eos_at: dict[int, int],
    num_blocks: int = 256,
) -> tuple[dict[int, str], dict[int, list[int]]]:
    config = SchedulerConfig(
        max_num_batched_tokens=24,
        block_size=4,
        num_blocks=num_blocks,
        max_model_len=64,
        async_scheduling=async_scheduling,
    )
    scheduler = Scheduler(config)
    for rid, (length, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        scheduler.add_request(rid, range(100 * rid, 100 * rid + length), n, eos_token_id=EOS)
    finished: dict[int, str] = {}
    num_sampled: dict[int, int] = {}
    received: dict[int, list[int]] = {}

    def deliver(sampled: dict[int, list[int]]) -> None:
        # Tokens of a request count until it finishes; later ones are dropped in flight.
        for rid, tokens in sampled.items():
            if rid not in finished:
                received.setdefault(rid, []).extend(tokens)
        finished.update(scheduler.update_from_output(sampled))

    in_flight = None
    for _ in range(1000):
        if not scheduler.has_unfinished_requests() and in_flight is None:
            break
        out = scheduler.schedule()
        sampled = samples(scheduler, out, num_sampled, eos_at)
        if async_scheduling:
            # The previous step's results land only after this step was scheduled.
            if in_flight is not None:
                deliver(in_flight)
            in_flight = sampled if scheduler.has_unfinished_requests() or sampled else None
        else:
            deliver(sampled)
        scheduler.check_invariants()
    return finished, received


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    num_blocks=st.sampled_from([17, 256]),  # 16 hold KV with vLLM's null block
    data=st.data(),
)
def test_async_and_sync_agree_on_finishes(
    prompts: list[int], num_blocks: int, data: st.DataObject
) -> None:
    max_tokens = [data.draw(st.integers(1, 8)) for _ in prompts]
    eos_at = data.draw(st.dictionaries(st.integers(0, len(prompts) - 1), st.integers(0, 6)))
    sync_finished, sync_tokens = run(False, prompts, max_tokens, eos_at, num_blocks)
    async_finished, async_tokens = run(True, prompts, max_tokens, eos_at, num_blocks)
    assert async_finished == sync_finished
    assert async_tokens == sync_tokens
    for rid, n in enumerate(max_tokens):
        # EOS is checked before length (vLLM 0.33's check_stop): an EOS that is the n-th
        # token is "stop".
        stop = eos_at.get(rid)
        stops_early = stop is not None and stop + 1 <= n
        assert sync_finished[rid] == ("stop" if stops_early else "length")
        assert len(sync_tokens[rid]) == (stop + 1 if stops_early else n)


def test_requests_stopping_on_eos_with_a_step_in_flight_free_their_blocks_at_once() -> None:
    """Issue 30: three requests stopping on EOS while their next step is in flight left the
    KV usage at 0.9 (vLLM 0.33 returns to 0.0): their blocks waited for late outputs that
    the vLLM adapter never passed on. Freed when they stop, as vLLM frees them; the late
    outputs are still accepted, and dropped."""
    config = SchedulerConfig(
        max_num_batched_tokens=64,
        block_size=4,
        num_blocks=11,  # 10 KV blocks beside vLLM's null block
        max_model_len=32,
        async_scheduling=True,
    )
    scheduler = Scheduler(config)
    for rid in range(3):
        scheduler.add_request(rid, range(100 * rid, 100 * rid + 11), 8, eos_token_id=EOS)
    assert dict(scheduler.schedule().num_scheduled_tokens) == {0: 11, 1: 11, 2: 11}
    assert dict(scheduler.schedule().num_scheduled_tokens) == {0: 1, 1: 1, 2: 1}
    assert abs(scheduler.stats().kv_usage - 0.9) < 1e-9
    finished = scheduler.update_from_output({rid: [EOS] for rid in range(3)})
    assert sorted(finished) == [(0, "stop"), (1, "stop"), (2, "stop")]
    assert scheduler.stats().kv_usage == 0.0
    assert [scheduler.num_outputs_in_flight(rid) for rid in range(3)] == [1, 1, 1]
    assert scheduler.update_from_output({rid: [7] for rid in range(3)}) == []
    assert [scheduler.num_outputs_in_flight(rid) for rid in range(3)] == [0, 0, 0]
    scheduler.check_invariants()


def test_a_kv_cache_below_max_model_len_is_accepted_as_vllm_accepts_it() -> None:
    """Issue 30: the core refused (ConfigError) a KV cache holding less than max_model_len;
    vLLM 0.33's Scheduler runs, and a request too long for the cache never fits."""
    config = SchedulerConfig(block_size=4, num_blocks=4, max_model_len=64, async_scheduling=True)
    scheduler = Scheduler(config)  # 3 KV blocks: 12 tokens
    scheduler.add_request("long", range(20), 4)
    assert dict(scheduler.schedule().num_scheduled_tokens) == {}
    scheduler.add_request("short", range(6), 4)
    assert scheduler.num_waiting == 2  # FCFS: the long one blocks the queue, as in vLLM
    scheduler.abort(["long"])
    assert dict(scheduler.schedule().num_scheduled_tokens) == {"short": 6}
