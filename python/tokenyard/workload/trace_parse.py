"""Row-by-row parsing shared by the trace readers (``traces.py``, ``columns.py``,
``session_traces.py``): text lines bounded by ``MAX_LINE_CHARS`` (a ``.gz`` file is read
through ``gzip``), CSV rows and JSON lines, and the checks of one field (a time, a token
count, hash ids, a datetime). Every problem is a ``TraceError`` naming path, line and
field.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import json
import math
import os
import re
from collections.abc import Iterator
from datetime import date
from typing import TextIO

from tokenyard._checks import UINT32_MAX, field_error
from tokenyard.workload.errors import TraceError
from tokenyard.workload.trace_rows import MAX_LINE_CHARS

UINT64_MAX = 2**64 - 1

_JSON = json.JSONDecoder()


def check_trace_path(owner: str, path: object) -> None:
    """``path`` must name a file (``ConfigError`` naming ``owner.path`` otherwise)."""
    if not isinstance(path, (str, os.PathLike)):
        raise field_error(owner, "path", f"must be a path, got {type(path).__name__}", path)
    if not os.path.isfile(path):
        name = os.fspath(path)
        raise field_error(owner, "path", f"no such file: {name!r}", name)


def json_lines(path: str) -> Iterator[tuple[int, object]]:
    """``(line, value)`` of each non-blank line of a JSON-lines file; ``TraceError`` for
    invalid JSON or text that is not UTF-8."""
    with _open_text(path) as lines:
        for line, text in enumerate(_decoded(path, lines), start=1):
            if text.isspace():
                continue
            try:
                row = _JSON.decode(text)
            except ValueError as error:
                message = getattr(error, "msg", str(error))
                raise TraceError(f"invalid JSON: {message}", path=path, line=line) from None
            yield line, row


def _open_text(path: str) -> TextIO:
    """The file as text for ``_decoded``: UTF-8 after an optional BOM, universal newlines
    kept as written, bytes that are not UTF-8 escaped (``surrogateescape``) so that
    ``_decoded`` reports them on their own line rather than where decoding got to."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="surrogateescape", newline="")
    return open(path, encoding="utf-8-sig", errors="surrogateescape", newline="")


#: The characters ``surrogateescape`` makes of bytes that are not UTF-8 (UTF-8 itself can
#: not encode them).
_ESCAPED = re.compile("[\udc80-\udcff]")


def _decoded(path: str, lines: TextIO) -> Iterator[str]:
    """Each line of ``lines`` (opened by ``_open_text``), with its terminator. Raises
    ``TraceError`` naming the line for one longer than ``MAX_LINE_CHARS`` (having read no
    more of it than that) or one that is not UTF-8."""
    readline = lines.readline
    line = 0
    while True:
        # Room for the longest line and a "\r\n", so that one is never split.
        text = readline(MAX_LINE_CHARS + 2)
        if not text:
            return
        line += 1
        if len(text) > MAX_LINE_CHARS and len(text.rstrip("\r\n")) > MAX_LINE_CHARS:
            raise TraceError(
                f"line longer than {MAX_LINE_CHARS} characters, the most a trace line may have",
                path=path,
                line=line,
            )
        if not text.isascii() and _ESCAPED.search(text):
            raise TraceError(_not_utf8(text), path=path, line=line)
        yield text


def _not_utf8(text: str) -> str:
    """What is wrong with a line that ``surrogateescape`` decoded, as UTF-8 says it."""
    try:
        text.encode("utf-8", "surrogateescape").decode("utf-8")
    except UnicodeDecodeError as error:
        return f"not UTF-8 text: {error.reason} at byte {error.start + 1} of the line"
    return "not UTF-8 text"


def _csv_rows(
    path: str,
    columns: tuple[str, ...],
    *,
    delimiter: str = ",",
    mapped_by: tuple[str, ...] | None = None,
) -> Iterator[tuple[int, list[str]]]:
    """``(line, [value of each column])`` for each non-blank data row. ``mapped_by`` names
    the config key of each column, for the missing-column message."""
    with _open_text(path) as text:
        reader = csv.reader(_decoded(path, text), delimiter=delimiter)
        try:
            header = [name.strip() for name in next(reader)]
        except StopIteration:
            raise TraceError("empty file: no header row", path=path, line=1) from None
        except csv.Error as error:
            raise TraceError(f"malformed CSV: {error}", path=path, line=1) from None
        index = []
        for i, column in enumerate(columns):
            if column not in header:
                key = "" if mapped_by is None else f", mapped by {mapped_by[i]}"
                raise TraceError(
                    f"missing column{key} (columns found: {', '.join(header)})",
                    path=path,
                    line=1,
                    field=column,
                )
            index.append(header.index(column))
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                raise TraceError(
                    f"malformed CSV: {error}", path=path, line=reader.line_num
                ) from None
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) <= max(index):
                short = next(c for c, i in zip(columns, index, strict=True) if i >= len(row))
                raise TraceError(
                    f"value missing (the row has {len(row)} fields, the header {len(header)})",
                    path=path,
                    line=reader.line_num,
                    field=short,
                )
            yield reader.line_num, [row[i] for i in index]


def _seconds(path: str, line: int, name: str, raw: object) -> float:
    """A finite number (a string from CSV, or a JSON number)."""
    number = math.nan
    if isinstance(raw, (int, float, str)) and not isinstance(raw, bool):
        with contextlib.suppress(ValueError):
            number = float(raw)
    if not math.isfinite(number):
        raise TraceError(
            f"not a finite number: {raw!r}", path=path, line=line, field=name, value=repr(raw)
        )
    return number


def _count(path: str, line: int, name: str, raw: object, minimum: int) -> int:
    """A token count in ``[minimum, 2**32 - 1]`` (a string, or a JSON number): integral
    floats such as ``"12.0"`` are accepted."""
    value = _as_int(raw)
    if value is None:
        raise TraceError(
            f"not an integer: {raw!r}", path=path, line=line, field=name, value=repr(raw)
        )
    if value < minimum or value > UINT32_MAX:
        if value > UINT32_MAX:
            rule = f"must be <= {UINT32_MAX}"
        else:
            rule = "must not be negative" if minimum == 0 else f"must be >= {minimum}"
        raise TraceError(f"{rule}, got {raw!r}", path=path, line=line, field=name, value=repr(raw))
    return value


def _as_int(raw: object) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw)
        except ValueError:
            pass
        try:
            raw = float(raw)
        except ValueError:
            return None
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return None


def _check_hash_ids(
    path: str, line: int, hash_ids: object, max_blocks: int, field: str = "hash_ids"
) -> None:
    """A list of at most ``max_blocks`` ints in ``[0, 2**64)``."""

    def fail(problem: str) -> TraceError:
        return TraceError(problem, path=path, line=line, field=field, value=repr(hash_ids))

    if not isinstance(hash_ids, list):
        raise fail(f"must be a list of ints, got {type(hash_ids).__name__}")
    if not hash_ids:
        return
    if not all(type(i) is int for i in hash_ids) or min(hash_ids) < 0 or max(hash_ids) > UINT64_MAX:
        bad = next(i for i in hash_ids if type(i) is not int or not 0 <= i <= UINT64_MAX)
        raise fail(f"ids must be ints in [0, 2**64), got {bad!r}")
    if len(hash_ids) > max_blocks:
        raise fail(
            f"{len(hash_ids)} ids for a prompt of {max_blocks} blocks or fewer "
            "(prompt tokens / hash_block_size, rounded up)"
        )


_DATETIME = re.compile(
    r"\s*(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?\s*"
    r"(Z|[+-]\d{2}:?\d{2})?\s*$"
)


def day_ordinal(day_text: str) -> int | None:
    """The proleptic Gregorian ordinal of ``YYYYMMDD`` (``None``: not a date)."""
    try:
        return date(int(day_text[:4]), int(day_text[4:6]), int(day_text[6:8])).toordinal()
    except ValueError:
        return None


class _DayClock:
    """Datetimes to seconds since midnight of the first row's day, so a float64 keeps every
    fractional digit (seconds since 1970 would lose the seventh)."""

    def __init__(self) -> None:
        self.first_day: int | None = None
        self.day_text = ""
        self.day = 0

    def seconds(self, text: str) -> float | None:
        match = _DATETIME.match(text)
        if match is None:
            return None
        year, month, day, hour, minute, second, fraction, zone = match.groups()
        day_text = year + month + day
        if day_text != self.day_text:  # rows come in order: one date lookup per day
            ordinal = day_ordinal(day_text)
            if ordinal is None:
                return None
            self.day = ordinal
            self.day_text = day_text
        if self.first_day is None:
            self.first_day = self.day
        hours, minutes, seconds = int(hour), int(minute), int(second)
        if hours > 23 or minutes > 59 or seconds > 60:
            return None
        whole = (self.day - self.first_day) * 86400 + hours * 3600 + minutes * 60 + seconds
        if zone and zone != "Z":
            sign = 1 if zone[0] == "+" else -1
            whole -= sign * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60)
        return whole + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)
