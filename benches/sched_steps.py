"""The fake model loop the step-cost benches share (``sched_encoder_speed.py``,
``sched_mamba_align_speed.py``): one step of tokenyard's ``Scheduler`` with token 7 for
each request that caught up with its known tokens, and the time of one step with R
running decodes."""

from __future__ import annotations

import time

from tokenyard.sched import Scheduler


def run_step(s: Scheduler) -> int:
    """``schedule()`` and ``update_from_output``; returns the step's scheduled tokens."""
    out = s.schedule()
    sampled = {
        rid: [7]
        for rid in out.num_scheduled_tokens
        if s.num_computed_tokens(rid) >= s.num_tokens(rid)
    }
    s.update_from_output(sampled)
    return out.total_num_scheduled_tokens


def decode_step_times(s: Scheduler, running: int, steps: int) -> list[float]:
    """Runs ``s`` until its requests ``0 .. running - 1`` are all admitted and decoding,
    then times ``steps`` steps; returns each step's time in microseconds."""
    while s.stats().num_waiting or any(
        s.num_computed_tokens(i) < s.num_tokens(i) - 1 for i in range(running)
    ):
        run_step(s)
    times = []
    for _ in range(steps):
        t = time.perf_counter_ns()
        run_step(s)
        times.append((time.perf_counter_ns() - t) / 1e3)
    return times
