"""Interpolation over measured grids, in log-log space.

Operation sizes span decades (a GEMM of 1 to 32,768 rows, contexts of 1 to 131,072 keys) and
times follow power laws between the measured points, so a curve is piecewise linear in
``log x`` and ``log y``: exact at the measured points, monotone between two points, never
negative. Outside the measured range a curve holds its edge value times ``(x / edge) **
power``, the caller's statement of how the work grows (1 for rows, 2 for causal pairs, 0 to
hold the edge).

Grids with holes (a collection that skipped the largest batch at the longest context) are
evaluated as nested curves: the inner axis is a curve per outer grid value, over that
value's own points, and the outer axis interpolates between the two neighbouring inner
curves.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence

__all__ = ["Curve", "between"]


class Curve:
    """``y(x)`` through the points ``(xs[i], ys[i])`` (``xs`` strictly increasing, ``ys`` > 0)."""

    def __init__(
        self,
        xs: Sequence[float],
        ys: Sequence[float],
        *,
        below_power: float = 0.0,
        above_power: float = 1.0,
    ):
        if not xs or len(xs) != len(ys):
            raise ValueError("a curve needs as many values as points, at least one")
        if any(b <= a for a, b in itertools.pairwise(xs)):
            raise ValueError(f"curve points must increase strictly, got {list(xs)}")
        if any(not (y > 0 and math.isfinite(y)) for y in ys):
            raise ValueError("curve values must be finite and > 0")
        self.xs = [float(x) for x in xs]
        self.ys = [float(y) for y in ys]
        self._log_xs = [math.log(x) for x in self.xs]
        self._log_ys = [math.log(y) for y in self.ys]
        self.below_power = below_power
        self.above_power = above_power

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0] * math.pow(x / xs[0], self.below_power) if x > 0 else ys[0]
        if x >= xs[-1]:
            return ys[-1] * math.pow(x / xs[-1], self.above_power)
        j = bisect.bisect_left(xs, x)
        if xs[j] == x:
            return ys[j]
        i = j - 1
        w = (math.log(x) - self._log_xs[i]) / (self._log_xs[j] - self._log_xs[i])
        return math.exp(self._log_ys[i] + (self._log_ys[j] - self._log_ys[i]) * w)


def between(
    axis: Sequence[float],
    value: float,
    at: Callable[[float], float],
    *,
    below_power: float = 0.0,
    above_power: float = 1.0,
) -> float:
    """Interpolates ``at(axis value)`` to ``value`` along a sorted axis, in log-log space:
    the outer step of a nested evaluation. Outside the axis, the edge's value times
    ``(value / edge) ** power``."""
    if value <= axis[0]:
        return at(axis[0]) * math.pow(value / axis[0], below_power)
    if value >= axis[-1]:
        return at(axis[-1]) * math.pow(value / axis[-1], above_power)
    j = bisect.bisect_left(axis, value)
    if axis[j] == value:
        return at(axis[j])
    i = j - 1
    w = (math.log(value) - math.log(axis[i])) / (math.log(axis[j]) - math.log(axis[i]))
    low, high = at(axis[i]), at(axis[j])
    return math.exp(math.log(low) + (math.log(high) - math.log(low)) * w)
