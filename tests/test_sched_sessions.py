"""Streaming-input sessions and stale outputs through ``tokenyard.sched.Scheduler``'s
Python API (the core's ``sched::session`` and ``sched::stale``; vLLM 0.33's resumable
requests and ``drop_stale_output``): a session's turn that stops parks it with its blocks,
its next chunk resumes it from its computed tokens, and a preempted request waits for its
outputs in flight."""

from __future__ import annotations

import pytest

from tokenyard.errors import InputError
from tokenyard.sched import Scheduler, SchedulerConfig

STOP = 7


def scheduler(async_scheduling: bool = False, **options: int) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=options.get("max_num_seqs", 8),
        max_num_batched_tokens=64,
        block_size=4,
        num_blocks=64,
        max_model_len=64,
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
    )
    return Scheduler(config)


def test_a_session_parks_with_its_blocks_and_resumes_from_them() -> None:
    # 6 prompt tokens, then the stop token: parked with 6 computed and 2 blocks; a
    # 3-token chunk makes a 9-token prompt of which 3 are scheduled.
    s = scheduler()
    s.add_request(0, list(range(10, 16)), 4, stop_token_ids=[STOP], resumable=True)
    s.schedule()
    assert s.update_from_output({0: [STOP]}) == [(0, "stop")]
    assert (s.num_parked, s.num_running, s.num_computed_tokens(0)) == (1, 0, 6)
    assert len(s.block_ids(0)) == 2
    assert not s.has_unfinished_requests()
    s.resume_session(0, [20, 21, 22], 4, stop_token_ids=[STOP])
    out = s.schedule()
    assert out.num_scheduled_tokens == {0: 3}
    assert out.scheduled_new_reqs[0].num_computed_tokens == 6
    s.check_invariants()


def test_a_parked_session_holds_its_sequence_slot_until_it_ends() -> None:
    s = scheduler(max_num_seqs=1)
    s.add_request(0, [1, 2, 3, 4], 4, stop_token_ids=[STOP], resumable=True)
    s.schedule()
    s.update_from_output({0: [STOP]})
    s.add_request(1, [5, 6, 7, 8], 4)
    assert not s.schedule().num_scheduled_tokens
    s.abort(0)
    assert s.schedule().num_scheduled_tokens == {1: 4}


def test_an_ended_session_finishes_at_its_next_stop() -> None:
    s = scheduler()
    s.add_request(0, [1, 2, 3, 4], 4, stop_token_ids=[STOP], resumable=True)
    s.schedule()
    s.end_session(0)
    s.update_from_output({0: [STOP]})
    assert s.num_parked == 0
    with pytest.raises(InputError):
        s.num_computed_tokens(0)


def test_only_a_parked_session_resumes() -> None:
    s = scheduler()
    s.add_request(0, [1, 2, 3, 4], 4, resumable=True)
    with pytest.raises(InputError) as info:
        s.resume_session(0, [5], 4)
    assert info.value.field == "request_id"


def test_a_preempted_request_waits_for_its_stale_output() -> None:
    # Async: preempted from outside while its prefill's step is in flight: its output is
    # delivered (vLLM's `_preempt_request` default, whatever `drop_stale_output`, which
    # applies to preemptions within a step), so the next step skips it.
    for drop in (False, True):
        s = scheduler(async_scheduling=True)
        s.wait_for_stale_outputs = True
        s.drop_stale_output = drop
        s.add_request(0, [1, 2, 3, 4], 4)
        s.schedule()
        s.preempt_request(0)
        # An external preemption delivers its outputs whatever the setting (vLLM's).
        assert s.schedule().num_scheduled_tokens == {}
        s.update_from_output({0: [9]})
        s.update_from_output({})
        assert s.schedule().num_scheduled_tokens == {0: 5}


def test_a_drafts_update_is_no_steps_output() -> None:
    s = scheduler(async_scheduling=True)
    s.wait_for_stale_outputs = True
    s.add_request(0, [1, 2, 3, 4], 4)
    s.add_request(1, [5, 6], 4)
    s.schedule()
    s.preempt_request(0)
    s.update_draft_token_ids({1: [3]})
    assert 0 not in s.schedule().num_scheduled_tokens
