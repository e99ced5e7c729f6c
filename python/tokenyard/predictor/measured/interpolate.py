"""Interpolation over measured grids.

A grid is read as nested curves: the innermost axis (a GEMM's rows, an attention kernel's
batch, an all-reduce's message, an MoE block's tokens) is a :class:`Curve` per value of the
outer axes, over that value's own points, and the outer axes (``n`` and ``k``, keys per
query, head counts) interpolate between the two neighbouring inner curves with
:func:`between`. Grids with holes (a collection that skipped the largest batch at the
longest context) therefore never invent a corner.

Inner curves are piecewise linear in ``x`` and ``y``: along those axes time is affine in the
work between two measured points (a fixed cost plus rows, batch or bytes), which linear
interpolation follows exactly, where log-log interpolation of ``a + b x`` bows away from it
(held out against the tables, linear halves the error of attention and all-reduce curves:
benches/RESULTS.md). The outer axes span decades with power-law growth between points
(causal attention grows with the square of the prompt), so :func:`between` interpolates in
log-log space. Either way a curve is exact at the measured points, monotone between two of
them, and never negative.

Outside the measured range a curve holds its edge value times ``(x / edge) ** power``, the
caller's statement of how the work grows (1 for rows, 2 for causal pairs, 0 to hold the
edge).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence

__all__ = ["Curve", "between"]


class Curve:
    """``y(x)`` through the points ``(xs[i], ys[i])`` (``xs`` strictly increasing, ``ys`` > 0),
    piecewise linear, or in log-log space with ``log_log``."""

    def __init__(
        self,
        xs: Sequence[float],
        ys: Sequence[float],
        *,
        below_power: float = 0.0,
        above_power: float = 1.0,
        log_log: bool = False,
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
        self.log_log = log_log

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
        if not self.log_log:
            return ys[i] + (ys[j] - ys[i]) * ((x - xs[i]) / (xs[j] - xs[i]))
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
