"""Validation helpers for the workload configs: each raises ``ConfigError`` naming the owner,
the field and the value received, as ``"ArrivalProcess.qps: must be > 0, got -1"``.

``load_workload`` rewrites the ``Owner.field`` prefix into the config path
(``"workload.arrival.qps: ..."``), so every message is built here, by ``field_error``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from tokenyard.errors import ConfigError

UINT32_MAX = 2**32 - 1


def field_error(owner: str, name: str, reason: str, value: object) -> ConfigError:
    """``ConfigError`` with message ``"{owner}.{name}: {reason}"``, ``field=name``."""
    return ConfigError(f"{owner}.{name}: {reason}", field=name, value=repr(value))


def check_int(owner: str, name: str, value: object, *, low: int, high: int | None = None) -> int:
    """An int (not a bool) in ``[low, high]``."""
    bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        raise field_error(owner, name, f"must be an int {bounds}, got {value!r}", value)
    return value


def check_number(
    owner: str,
    name: str,
    value: object,
    *,
    low: float,
    low_open: bool = False,
    high: float | None = None,
) -> float:
    """A finite int or float (not a bool) ``> low`` (``low_open``) or ``>= low``, and
    ``<= high``."""
    parts = [f"> {low:g}" if low_open else f">= {low:g}"]
    if high is not None:
        parts.append(f"<= {high:g}")
    reason = f"must be a finite number {' and '.join(parts)}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise field_error(owner, name, reason, value)
    number = float(value)
    if (
        not math.isfinite(number)
        or number < low
        or (low_open and number == low)
        or (high is not None and number > high)
    ):
        raise field_error(owner, name, reason, value)
    return number


def check_choice(owner: str, name: str, value: object, choices: Iterable[str]) -> str:
    """One of ``choices``; the message lists them."""
    options = sorted(choices)
    if not isinstance(value, str) or value not in options:
        expected = ", ".join(repr(c) for c in options)
        raise field_error(
            owner, name, f"unknown value {value!r}; expected one of {expected}", value
        )
    return value


def check_unset(owner: str, name: str, value: object, kind: str, default: object = None) -> None:
    """A field that does not apply to this ``kind`` must keep its default."""
    if value is default:
        return
    if default is None or isinstance(value, bool) or value != default:
        raise field_error(
            owner, name, f"does not apply to kind={kind!r} (got {value!r}); leave it out", value
        )
