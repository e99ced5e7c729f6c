"""Repetition detection through ``tokenyard.sched.Scheduler``'s Python API (the core's
stop check, ``RepetitionDetection``): vLLM 0.33's ``check_sequence_repetition``
(``vllm/v1/core/sched/utils.py``) over the outputs, after EOS, the stop ids and the
length, from ``min_tokens`` outputs on. A pure-Python copy of vLLM's rule is checked
against the core on random token streams."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenyard.errors import InputError
from tokenyard.sched import Scheduler, SchedulerConfig


def scheduler(num_speculative_tokens: int = 0) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        block_size=4,
        num_blocks=64,
        max_model_len=128,
        num_speculative_tokens=num_speculative_tokens,
    )
    return Scheduler(config)


def vllm_rule(outputs: list[int], max_size: int, min_size: int, min_count: int) -> bool:
    """vLLM 0.33's ``check_sequence_repetition`` and ``_has_repeating_pattern``, as written."""
    min_size = max(min_size, 1)
    if max_size <= 0 or min_count < 2 or min_size > max_size:
        return False
    for pattern_len in range(min_size, max_size + 1):
        if pattern_len * min_count > len(outputs):
            return False
        if all(
            outputs[-(pattern_len * m + n)] == outputs[-n]
            for n in range(1, pattern_len + 1)
            for m in range(1, min_count)
        ):
            return True
    return False


def feed(s: Scheduler, tokens: list[int]) -> tuple[int, str] | None:
    """Feeds request 0 one token a step; the output count and reason it finished at."""
    for i, token in enumerate(tokens, 1):
        s.schedule()
        finished = s.update_from_output({0: [token]})
        if finished:
            return i, finished[0][1]
    return None


def test_pattern_of_two_thrice_stops_at_the_sixth_output() -> None:
    s = scheduler()
    s.add_request(0, [9] * 5, 30, repetition_detection=(2, 2, 3))
    assert feed(s, [1, 2, 1, 2, 1, 2, 1]) == (6, "repetition")


def test_min_tokens_defers_it() -> None:
    s = scheduler()
    s.add_request(0, [9] * 5, 30, repetition_detection=(2, 2, 3), min_tokens=8)
    assert feed(s, [1, 2] * 5) == (8, "repetition")


def test_a_speculative_step_is_cut_at_the_completing_token() -> None:
    # Outputs [4, 4], then a step of 3 accepted tokens [4, 5, 5]: [4] x 3 ends at its first.
    s = scheduler(num_speculative_tokens=2)
    s.add_request(0, [9] * 5, 30, repetition_detection=(1, 1, 3))
    s.schedule()
    s.update_from_output({0: [4]})
    s.schedule()
    s.update_from_output({0: [4]}, spec_token_ids={0: [1, 1]})
    s.schedule()
    assert s.update_from_output({0: [4, 5, 5]}) == [(0, "repetition")]


@pytest.mark.parametrize(
    ("rule", "min_tokens", "field"),
    [
        ((2, 3, 3), 0, "repetition_detection"),
        ((2, 1, 1), 0, "repetition_detection"),
        ((2, 1), 0, "repetition_detection"),
        ((-1, 0, 2), 0, "repetition_detection"),
        (None, 3, "min_tokens"),
    ],
)
def test_settings_vllm_refuses_are_refused(rule, min_tokens, field) -> None:
    s = scheduler()
    with pytest.raises(InputError) as err:
        s.add_request(0, [1, 2, 3], 8, repetition_detection=rule, min_tokens=min_tokens)
    assert err.value.field == field


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(1, 3), min_size=1, max_size=40),
    max_size=st.integers(1, 5),
    min_size=st.integers(0, 5),
    min_count=st.integers(2, 4),
    min_tokens=st.integers(0, 6),
)
def test_the_core_stops_where_vllms_rule_first_fires(
    tokens: list[int], max_size: int, min_size: int, min_count: int, min_tokens: int
) -> None:
    min_size = min(min_size, max_size)
    s = scheduler()
    s.add_request(
        0,
        [9] * 5,
        len(tokens) + 1,
        repetition_detection=(max_size, min_size, min_count),
        min_tokens=min_tokens,
    )
    expected = next(
        (
            (i, "repetition")
            for i in range(max(min_tokens, 1), len(tokens) + 1)
            if vllm_rule(tokens[:i], max_size, min_size, min_count)
        ),
        None,
    )
    assert feed(s, tokens) == expected
