"""Token counts per request (``LengthDistribution``: a prompt's, an output's, a request's
images), drawn in whole blocks from a caller's generator; shared by the synthetic, session
and image generators, below all of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Literal, final

import numpy as np
import numpy.typing as npt

from tokenyard._checks import check_choice, check_int, check_number, check_unset, field_error

__all__ = ["LENGTH_KINDS", "MAX_REQUEST_TOKENS", "MAX_ZIPF_SIZE", "LengthDistribution"]

LengthKind = Literal["fixed", "uniform", "zipf", "lognormal"]
LENGTH_KINDS: tuple[LengthKind, ...] = ("fixed", "uniform", "zipf", "lognormal")

#: The longest request a workload draws (no replica serves more).
MAX_REQUEST_TOKENS = 1 << 24
#: Largest support of a zipf draw (its CDF is a table of this many float64).
MAX_ZIPF_SIZE = 1 << 22

I64 = npt.NDArray[np.int64]
Sampler = Callable[[np.random.Generator, int], I64]


@final
@dataclass(frozen=True, kw_only=True)
class LengthDistribution:
    """A token count per request (prompt or output).

    - ``"fixed"``: always ``value``.
    - ``"uniform"``: an integer uniform on ``[low, high]``.
    - ``"zipf"``: ``low + r`` with ``P(r) ∝ (r + 1) ** -theta`` for ``r`` in
      ``[0, high - low]``: ``low`` is the most frequent length (``theta=0`` is uniform).
      The support holds at most ``MAX_ZIPF_SIZE`` values.
    - ``"lognormal"``: ``median * exp(sigma * N(0, 1))`` rounded to the nearest integer;
      mean before the caps ``median * exp(sigma**2 / 2)``.

    Every draw is then clipped to ``[min_tokens, max_tokens]``.

    Raises:
        ConfigError: an unknown kind, a missing parameter of the kind, a parameter of
            another kind, or a value out of range.
    """

    kind: LengthKind
    value: int | None = None
    low: int | None = None
    high: int | None = None
    theta: float | None = None
    median: float | None = None
    sigma: float | None = None
    min_tokens: int = 1
    """Lower cap, >= 1."""
    max_tokens: int | None = None
    """Upper cap; ``None`` = the uint32 range."""

    def __post_init__(self) -> None:
        owner = "LengthDistribution"
        check_choice(owner, "kind", self.kind, LENGTH_KINDS)
        wanted = _LENGTH_PARAMS[self.kind]
        for name in ("value", "low", "high", "theta", "median", "sigma"):
            value = getattr(self, name)
            if name not in wanted:
                check_unset(owner, name, value, self.kind)
            elif value is None:
                raise field_error(owner, name, f"required when kind={self.kind!r}", None)
        if self.kind == "fixed":
            check_int(owner, "value", self.value, low=1, high=MAX_REQUEST_TOKENS)
        if self.kind in ("uniform", "zipf"):
            low = check_int(owner, "low", self.low, low=1, high=MAX_REQUEST_TOKENS)
            high = check_int(owner, "high", self.high, low=low, high=MAX_REQUEST_TOKENS)
            if self.kind == "zipf":
                check_number(owner, "theta", self.theta, low=0.0, high=100.0)
                if high - low + 1 > MAX_ZIPF_SIZE:
                    raise field_error(
                        owner,
                        "high",
                        f"zipf support high - low + 1 must be <= {MAX_ZIPF_SIZE}, got "
                        f"{high - low + 1}",
                        high,
                    )
        if self.kind == "lognormal":
            check_number(
                owner, "median", self.median, low=0.0, low_open=True, high=MAX_REQUEST_TOKENS
            )
            # exp(10 sigma) already spans every length a request can have.
            check_number(owner, "sigma", self.sigma, low=0.0, high=10.0)
        min_tokens = check_int(owner, "min_tokens", self.min_tokens, low=1, high=MAX_REQUEST_TOKENS)
        if self.max_tokens is not None:
            check_int(owner, "max_tokens", self.max_tokens, low=min_tokens, high=MAX_REQUEST_TOKENS)

    def describe(self) -> dict[str, object]:
        """The fields that apply to this kind, and the caps."""
        return set_fields(self)

    def _sampler(self) -> Sampler:
        """``draw(rng, n)``: n lengths as int64 (tables are built once, here)."""
        lo = self.min_tokens
        hi = MAX_REQUEST_TOKENS if self.max_tokens is None else self.max_tokens

        def capped(values: I64) -> I64:
            return np.clip(values, lo, hi)

        if self.kind == "fixed":
            value = int(self.value or 0)
            return lambda rng, n: capped(np.full(n, value, dtype=np.int64))
        if self.kind == "uniform":
            low, high = int(self.low or 0), int(self.high or 0)
            return lambda rng, n: capped(rng.integers(low, high, size=n, endpoint=True))
        if self.kind == "zipf":
            low = int(self.low or 0)
            draw_rank = zipf_ranks(int(self.high or 0) - low + 1, float(self.theta or 0.0))
            return lambda rng, n: capped(low + draw_rank(rng, n))
        log_median, sigma = math.log(float(self.median or 1.0)), float(self.sigma or 0.0)
        log_lo, log_hi = math.log(lo) - 1.0, math.log(hi) + 1.0

        def lognormal(rng: np.random.Generator, n: int) -> I64:
            # Clip in log space first: exp() never overflows and the cast never wraps.
            logs = np.clip(log_median + sigma * rng.standard_normal(n), log_lo, log_hi)
            return capped(np.rint(np.exp(logs)).astype(np.int64))

        return lognormal


_LENGTH_PARAMS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "zipf": ("low", "high", "theta"),
    "lognormal": ("median", "sigma"),
}


def set_fields(config: object) -> dict[str, object]:
    return {
        f.name: getattr(config, f.name)
        for f in fields(config)  # type: ignore[arg-type]
        if getattr(config, f.name) is not None
    }


def zipf_ranks(size: int, theta: float) -> Sampler:
    """``draw(rng, n)``: ranks in ``[0, size)`` with ``P(r) ∝ (r + 1) ** -theta``, by
    inverting a CDF table."""
    cdf = np.cumsum(np.arange(1, size + 1, dtype=np.float64) ** -theta)
    cdf /= cdf[-1]
    cdf[-1] = 1.0  # random() < 1, so every draw lands inside the table
    return lambda rng, n: np.searchsorted(cdf, rng.random(n), side="right").astype(np.int64)
