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
