"""The verification rule of ``tokenyard recommend``: a point is recommended only at a rate
at which a simulation of the WHOLE load (the whole trace, or the long synthetic load) met
every SLO.

Each point is first tried at ``(1 - margin) x`` its searched capacity. A run that breaks an
SLO there steps the rate down by the same factor, at most ``max_steps`` times (with a fixed
target rate, ``--rate``, it may not: the point is rejected). A point never held is
rejected, with the SLOs it broke. ``headroom`` says, per SLO, how far below its bound the
held run stayed: ``1 - value / bound`` (0.12 = 12% under); the binding SLO has the least.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from tokenyard.search.capacity import Probe
from tokenyard.search.config import SLO
from tokenyard.search.executors import Executor

__all__ = ["Verdict", "headroom", "verify_points"]


def headroom(bounds: Mapping[str, float], metrics: Mapping[str, float]) -> dict[str, float]:
    """``1 - value / bound`` per SLO key (negative: broken; ``-inf``: no finite value)."""
    out = {}
    for key, bound in bounds.items():
        value = metrics.get(key, math.nan)
        out[key] = 1.0 - value / bound if math.isfinite(value) and bound > 0 else -math.inf
    return out


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The whole-load run of one point. ``held``: every SLO met at ``rate``; ``tried``:
    every rate run, first to last; ``broken``: the SLOs broken at the first rate."""

    rate: float
    held: bool
    metrics: Mapping[str, float]
    headroom: Mapping[str, float]
    tried: tuple[float, ...]
    broken: tuple[str, ...]
    num_requests: int = 0
    requests_per_s: float = 0.0
    #: The rate is a number of users (a closed loop), not requests/s.
    closed_loop: bool = False
    error: str | None = None
    #: The summary of the run at ``rate`` (what the rows' cost and utilisation come from),
    #: kept so it is not simulated again.
    summary: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def binding(self) -> str:
        """The SLO with the least headroom."""
        return min(self.headroom, key=lambda k: self.headroom[k]) if self.headroom else ""

    @property
    def stepped_down(self) -> int:
        return len(self.tried) - 1

    def note(self, margin: float) -> str:
        if self.error:
            return f"rejected: the full run failed: {self.error}"
        if not self.held:
            rates = ", ".join(f"{r:.4g}" for r in self.tried)
            return f"rejected: the full run broke {', '.join(self.broken)} at {rates}"
        if self.stepped_down:
            return (
                f"stepped down {self.stepped_down}x by {margin:.0%}: the full run broke "
                f"{', '.join(self.broken)} at {self.tried[0]:.4g}"
            )
        return ""


def verify_points(
    points: Sequence[tuple[Hashable, Mapping[str, Any], float]],
    slo: SLO,
    executor: Executor,
    *,
    margin: float,
    step_down: bool = True,
    max_steps: int = 2,
    closed_loop: bool = False,
) -> dict[Hashable, Verdict]:
    """Runs each ``(tag, whole-load simulation, rate)`` at its rate, stepping down as the
    module docstring says; all runs of a round go to ``executor`` at once."""
    rates: dict[Hashable, list[float]] = {tag: [rate] for tag, _, rate in points}
    sims = {tag: sim for tag, sim, _ in points}
    first_broken: dict[Hashable, tuple[str, ...]] = {}
    verdicts: dict[Hashable, Verdict] = {}
    pending = [tag for tag, _, _ in points]
    while pending:
        in_flight = 0
        queue = list(pending)
        results: dict[Hashable, Probe] = {}
        summaries: dict[Hashable, Mapping[str, Any] | None] = {}
        while queue or in_flight:
            while queue and in_flight < executor.max_in_flight:
                tag = queue.pop(0)
                payload = {"simulation": sims[tag], "rate": rates[tag][-1], "keep_summary": True}
                executor.submit(tag, payload)
                in_flight += 1
            for tag, result in executor.wait():
                results[tag] = Probe.from_dict(result)
                summaries[tag] = result.get("summary")
                in_flight -= 1
        pending = []
        for tag, probe in results.items():
            broken = tuple(slo.violations(probe.metrics)) if probe.error is None else ()
            first_broken.setdefault(tag, broken)
            held = probe.error is None and not broken
            again = not held and probe.error is None and step_down
            if again and len(rates[tag]) <= max_steps:
                lower = rates[tag][-1] * (1.0 - margin)
                rates[tag].append(float(max(1, math.floor(lower))) if closed_loop else lower)
                pending.append(tag)
                continue
            verdicts[tag] = Verdict(
                rate=probe.rate,
                held=held,
                metrics=dict(probe.metrics),
                headroom=headroom(slo.bounds, probe.metrics) if probe.error is None else {},
                tried=tuple(rates[tag]),
                broken=first_broken[tag],
                num_requests=probe.num_requests,
                requests_per_s=probe.requests_per_s,
                closed_loop=closed_loop,
                error=probe.error,
                summary=summaries[tag],
            )
    return verdicts
