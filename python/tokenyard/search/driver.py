"""Runs many capacity searches at once on an executor.

A ``PointJob`` holds the searches of one deployment (one per SLO set, plus one per SLO key
with ``refine_breaks``) and the probes they share: a rate simulated for one search is
reused by the others. ``run_jobs`` keeps the executor full: jobs in grid order, each
asking for the rates its searches need now. Each search's sequence of rates depends only
on its own outcomes, so the results are the same whatever the executor, the number of
workers or the order in which tasks finish.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from tokenyard.search.capacity import (
    CapacityResult,
    CapacitySearch,
    Probe,
    breaks_from_probes,
    is_closed_loop,
)
from tokenyard.search.config import SLO, SearchParams
from tokenyard.search.executors import Executor

__all__ = ["PointJob", "Progress", "run_jobs"]


def _single_name(key: str, bound: float) -> str:
    return f"{key}<={bound!r}"


class PointJob:
    """The capacity searches of one deployment and their shared probes."""

    def __init__(
        self,
        key: str,
        simulation: dict[str, Any],
        slos: Sequence[SLO],
        params: SearchParams,
    ):
        self.key, self.simulation, self.slos = key, simulation, tuple(slos)
        # A closed-loop workload's load is its number of users: a whole number.
        users = is_closed_loop(simulation)
        self.searches = {slo.name: CapacitySearch(slo, params, users) for slo in self.slos}
        self.singles: dict[str, CapacitySearch] = {}
        if params.refine_breaks:
            for slo in self.slos:
                for k, bound in slo.bounds.items():
                    name = _single_name(k, bound)
                    single = CapacitySearch(SLO(name, {k: bound}), params, users)
                    self.singles.setdefault(name, single)
        self.probes: dict[float, Probe] = {}
        self.in_flight: set[float] = set()

    def _all(self) -> list[CapacitySearch]:
        return [*self.searches.values(), *self.singles.values()]

    def wanted(self) -> list[float]:
        """Rates to simulate now: advances every search through the probes it already has."""
        out: list[float] = []
        for search in self._all():
            while (rate := search.next_rate()) is not None:
                if rate in self.probes:
                    search.record(self.probes[rate])
                    continue
                if rate not in self.in_flight and rate not in out:
                    out.append(rate)
                break
        return out

    def feed(self, probe: Probe) -> None:
        self.probes[probe.rate] = probe
        self.in_flight.discard(probe.rate)

    @property
    def done(self) -> bool:
        return not self.in_flight and all(s.done for s in self._all())

    def results(self) -> dict[str, CapacityResult]:
        return {name: s.result() for name, s in self.searches.items()}

    def breaks(self) -> dict[str, dict[str, dict[str, float | None]]]:
        """Per SLO set and key: the rate at which the key breaks (``break_qps``) and the
        highest rate below it at which it held (``held_qps``)."""
        if not self.singles:
            return {slo.name: breaks_from_probes(slo, self.probes) for slo in self.slos}
        out: dict[str, dict[str, dict[str, float | None]]] = {}
        for slo in self.slos:
            out[slo.name] = {}
            for k, bound in slo.bounds.items():
                r = self.singles[_single_name(k, bound)].result()
                out[slo.name][k] = {"held_qps": r.capacity_qps or None, "break_qps": r.hi_qps}
        return out


@dataclass
class Progress:
    """A one-line progress report on stderr (carriage return; only on a terminal unless
    ``force``)."""

    total_points: int
    enabled: bool = True
    force: bool = False

    def __post_init__(self) -> None:
        self.enabled = self.enabled and (self.force or sys.stderr.isatty())
        self.start = time.perf_counter()
        self.points = 0
        self.simulations = 0
        self._last = 0.0

    def update(self, *, point_done: bool = False, simulation_done: bool = False) -> None:
        self.points += point_done
        self.simulations += simulation_done
        now = time.perf_counter()
        if not self.enabled or (now - self._last < 0.2 and not point_done):
            return
        self._last = now
        elapsed = now - self.start
        eta = ""
        if 0 < self.points < self.total_points:
            eta = f", ~{elapsed / self.points * (self.total_points - self.points):.0f} s left"
        sys.stderr.write(
            f"\r{self.points}/{self.total_points} points, {self.simulations} simulations, "
            f"{elapsed:.1f} s{eta}   "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def run_jobs(
    jobs: Sequence[PointJob],
    executor: Executor,
    *,
    on_done: Callable[[PointJob], None] | None = None,
    progress: Progress | None = None,
) -> None:
    """Runs every job to the end; ``on_done(job)`` as each finishes (in completion order)."""
    pending = list(reversed(jobs))
    active: list[PointJob] = []
    in_flight: dict[Hashable, PointJob] = {}

    def finish(job: PointJob) -> None:
        if on_done is not None:
            on_done(job)
        if progress is not None:
            progress.update(point_done=True)

    def ask(job: PointJob, slots: int) -> int:
        """Submits what ``job`` wants (up to ``slots``); retires it when it is done."""
        for rate in job.wanted()[:slots]:
            job.in_flight.add(rate)
            in_flight[(job.key, rate)] = job
            executor.submit((job.key, rate), {"simulation": job.simulation, "rate": rate})
            slots -= 1
        if job.done:
            active.remove(job)
            finish(job)
        return slots

    try:
        while True:
            slots = executor.max_in_flight - len(in_flight)
            for job in [*active]:
                slots = ask(job, slots) if slots > 0 else slots
            while slots > 0 and pending:
                job = pending.pop()
                active.append(job)
                slots = ask(job, slots)
            if not in_flight:
                if not active and not pending:
                    return
                continue
            for tag, result in executor.wait():
                job = in_flight.pop(tag)
                job.feed(Probe.from_dict(result))
                if progress is not None:
                    progress.update(simulation_done=True)
    finally:
        executor.close()
