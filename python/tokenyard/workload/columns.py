"""``ColumnTrace``: a trace in any CSV, TSV or JSON-lines layout, read through a mapping of
its columns (which one holds the arrival time, in which unit; the prompt and output lengths;
optionally prefix hash ids) and optional row filters.

It is one more reader of ``trace_pipeline.py``'s pipeline (offset, limit, ``zero_output``, shift
to 0, scale, chunks; ``TraceError`` naming path, line and column). Rows a filter rejects
are as if absent, except that their gaps still add up when the time column holds gaps.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import PurePath
from typing import ClassVar, Literal, final

import numpy as np

from tokenyard._checks import UINT32_MAX, check_choice, check_int, field_error
from tokenyard.workload.csv_columns import csv_batches
from tokenyard.workload.errors import TraceError
from tokenyard.workload.trace_rows import Fallback, Rows
from tokenyard.workload.trace_rows import Record as _Record
from tokenyard.workload.traces import (
    _JSON,
    _check_hash_ids,
    _ColumnTraceReader,
    _count,
    _csv_rows,
    _DayClock,
    json_lines,
)

__all__ = ["FILE_FORMATS", "TIME_UNITS", "ColumnFilter", "ColumnTrace", "TraceColumns"]

TimeUnit = Literal["s", "ms", "us", "ns", "datetime"]
TIME_UNITS: tuple[TimeUnit, ...] = ("s", "ms", "us", "ns", "datetime")
FileFormat = Literal["csv", "tsv", "jsonl"]
FILE_FORMATS: tuple[FileFormat, ...] = ("csv", "tsv", "jsonl")
FilterValue = str | int

_EXACT_FLOAT = 2.0**53  # every integer below this is exact in a float64
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_SUFFIXES: dict[str, FileFormat] = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}


@final
@dataclass(frozen=True)
class TraceColumns:
    """Which column (CSV header name or top-level JSON key) holds what.

    Exactly one of ``time`` (an arrival timestamp) and ``gap`` (the time since the previous
    row) is mapped. ``time_unit`` has no default: a wrong guess would replay the trace
    1000 times too fast or too slow.

    Raises:
        ConfigError: a name that is not a non-empty string, neither or both of ``time`` and
            ``gap``, an unknown ``time_unit``, or ``gap`` with ``"datetime"``.
    """

    _: KW_ONLY
    time_unit: TimeUnit
    """``"s"``, ``"ms"``, ``"us"``, ``"ns"`` (numbers) or ``"datetime"`` (ISO-8601 text such
    as ``2023-11-16T18:15:46.68Z``; ``time`` only)."""
    input_tokens: str
    """The prompt length column (an integer >= 1)."""
    output_tokens: str
    """The output length column (an integer >= 0; 0 is handled by ``zero_output``)."""
    time: str | None = None
    """The arrival time column; timestamps must not decrease and need not start at 0."""
    gap: str | None = None
    """The inter-arrival gap column: the time since the previous row (>= 0)."""
    hash_ids: str | None = None
    """The prefix block ids column: a JSON list of ints (in CSV, a JSON list in the cell,
    as pandas writes a list column; an empty cell means no ids)."""
    lora: str | None = None
    """The LoRA adapter column: an integer id >= 0, or -1, an empty cell or JSON null for the
    base model (docs/lora.md)."""

    def __post_init__(self) -> None:
        owner = "TraceColumns"
        for name in ("input_tokens", "output_tokens", "time", "gap", "hash_ids", "lora"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise field_error(owner, name, f"must be a column name, got {value!r}", value)
        if self.time is None and self.gap is None:
            raise field_error(
                owner,
                "time",
                "missing: map the arrival time column (time = ...) or the gap since the "
                "previous row (gap = ...)",
                None,
            )
        if self.time is not None and self.gap is not None:
            raise field_error(
                owner, "gap", f"cannot be combined with time={self.time!r}; map one", self.gap
            )
        check_choice(owner, "time_unit", self.time_unit, TIME_UNITS)
        if self.gap is not None and self.time_unit == "datetime":
            raise field_error(
                owner, "time_unit", "'datetime' applies to time, not to gap", self.time_unit
            )

    @property
    def time_column(self) -> str:
        """The mapped time or gap column."""
        return self.time if self.time is not None else str(self.gap)

    def mapped(self) -> list[tuple[str, str]]:
        """``(config key, column)`` of each mapped column, in reading order."""
        found = [
            ("time" if self.time is not None else "gap", self.time_column),
            ("input_tokens", self.input_tokens),
            ("output_tokens", self.output_tokens),
        ]
        if self.hash_ids is not None:
            found.append(("hash_ids", self.hash_ids))
        if self.lora is not None:
            found.append(("lora", self.lora))
        return found

    def describe(self) -> dict[str, str]:
        names = ("time", "gap", "time_unit", "input_tokens", "output_tokens", "hash_ids", "lora")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


@final
@dataclass(frozen=True)
class ColumnFilter:
    """Keep only the rows whose ``column`` holds one of ``values`` (or, with ``exclude``,
    none of them). A CSV cell is compared as text (surrounding spaces ignored) with each
    value's text; a JSON value must equal a value of the same type (``1`` does not match
    ``"1"``). In a config: ``column`` and one of ``equals = v``, ``in = [...]`` or
    ``not_in = [...]``.

    Raises:
        ConfigError: an empty column name, no values, or a value that is not a string or
            an int.
    """

    column: str
    _: KW_ONLY
    values: tuple[FilterValue, ...]
    exclude: bool = False

    def __post_init__(self) -> None:
        owner = "ColumnFilter"
        if not isinstance(self.column, str) or not self.column:
            raise field_error(
                owner, "column", f"must be a column name, got {self.column!r}", self.column
            )
        if not isinstance(self.values, tuple) or not self.values:
            raise field_error(
                owner, "values", f"must be a non-empty tuple, got {self.values!r}", self.values
            )
        for value in self.values:
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise field_error(
                    owner, "values", f"must be strings or ints, got {value!r}", self.values
                )
        if not isinstance(self.exclude, bool):
            raise field_error(
                owner, "exclude", f"must be true or false, got {self.exclude!r}", self.exclude
            )

    def describe(self) -> dict[str, object]:
        if len(self.values) == 1 and not self.exclude:
            return {"column": self.column, "equals": self.values[0]}
        return {"column": self.column, "not_in" if self.exclude else "in": list(self.values)}


class _Match:
    """One filter, precomputed for a file type: a CSV cell is text, a JSON value typed."""

    def __init__(self, rule: ColumnFilter, typed: bool) -> None:
        self.exclude = rule.exclude
        self.typed = typed
        self.text = frozenset(str(v) for v in rule.values)
        self.keys = frozenset((type(v), v) for v in rule.values)

    def __call__(self, raw: object) -> bool:
        if self.typed:
            found = type(raw) in (str, int) and (type(raw), raw) in self.keys
        else:
            found = isinstance(raw, str) and raw.strip() in self.text
        return found != self.exclude


@final
@dataclass(frozen=True)
class ColumnTrace(_ColumnTraceReader):
    """A CSV (with a header row), TSV or JSON-lines trace of any layout, read through
    ``columns``; ``filter`` keeps the rows that match every filter. The file type is
    ``file_format``, or else the suffix (``.csv``, ``.tsv``, ``.jsonl``, ``.ndjson``, each
    optionally followed by ``.gz``). Other columns are ignored, as are blank lines.

    Raises:
        ConfigError: an option out of range, a path that is not a file, a file type that
            cannot be told, or ``hash_block_size`` set without ``columns.hash_ids`` (or
            missing with it).
    """

    columns: TraceColumns = field(kw_only=True)
    """Which column holds what."""
    filter: tuple[ColumnFilter, ...] = field(default=(), kw_only=True)
    """Rows must match every one of these."""
    file_format: FileFormat | None = field(default=None, kw_only=True)
    """``"csv"``, ``"tsv"`` or ``"jsonl"``; ``None`` tells it from the suffix."""
    hash_block_size: int | None = field(default=None, kw_only=True)
    """Tokens per hash id: required with ``columns.hash_ids``, refused without."""

    format: ClassVar[str] = "columns"

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "ColumnTrace"
        if not isinstance(self.columns, TraceColumns):
            raise field_error(
                owner, "columns", f"must be a TraceColumns, got {self.columns!r}", self.columns
            )
        if not isinstance(self.filter, tuple) or not all(
            isinstance(f, ColumnFilter) for f in self.filter
        ):
            raise field_error(
                owner,
                "filter",
                f"must be a tuple of ColumnFilter, got {self.filter!r}",
                self.filter,
            )
        if self.file_format is not None:
            check_choice(owner, "file_format", self.file_format, FILE_FORMATS)
        elif self._file_type is None:
            expected = ", ".join(repr(f) for f in sorted(FILE_FORMATS))
            raise field_error(
                owner,
                "file_format",
                f"cannot tell the file type from the name {PurePath(self._name).name!r} "
                f"(.csv, .tsv, .jsonl, .ndjson, optionally .gz); set it to one of {expected}",
                None,
            )
        if self.columns.hash_ids is None:
            if self.hash_block_size is not None:
                raise field_error(
                    owner,
                    "hash_block_size",
                    f"does not apply without columns.hash_ids (got {self.hash_block_size!r}); "
                    "leave it out",
                    self.hash_block_size,
                )
        elif self.hash_block_size is None:
            raise field_error(
                owner,
                "hash_block_size",
                "missing: columns.hash_ids is mapped, so say how many tokens each id covers",
                None,
            )
        else:
            check_int(owner, "hash_block_size", self.hash_block_size, low=1, high=UINT32_MAX)

    def describe(self) -> dict[str, object]:
        """The reader's options as a mapping ``load_workload`` accepts."""
        found = super().describe()
        found["columns"] = self.columns.describe()
        if self.filter:
            found["filter"] = [f.describe() for f in self.filter]
        else:
            del found["filter"]
        return found

    @property
    def _file_type(self) -> FileFormat | None:
        if self.file_format is not None:
            return self.file_format
        name = self._name.lower().removesuffix(".gz")
        return _SUFFIXES.get(PurePath(name).suffix)

    @property
    def _time_column(self) -> str:
        return self.columns.time_column

    @property
    def _output_column(self) -> str:
        return self.columns.output_tokens

    @staticmethod
    def _written(stamp: object) -> str:
        return repr(stamp)

    def _has_fast_path(self) -> bool:
        """A CSV or TSV with timestamps in a number unit, no hash ids or adapters, and
        filters on unmapped columns: what ``csv_columns.py`` reads (the column pipeline
        carries no LoRA ids)."""
        c = self.columns
        mapped = {c.time_column, c.input_tokens, c.output_tokens}
        return (
            self._file_type != "jsonl"
            and c.time is not None
            and c.time_unit != "datetime"
            and c.hash_ids is None
            and c.lora is None
            # A filter reads its cells as text; a mapped column is read as a number.
            and not any(f.column in mapped for f in self.filter)
        )

    def _row_columns(self) -> Iterator[Rows]:
        """pyarrow's batches of a large trace (filters asked once per distinct cell text;
        times in seconds from the first kept row, as ``_Clock``); ``Fallback`` for a time
        past 2**53 (which ``_Clock`` keeps exact)."""
        c = self.columns
        columns = (c.time_column, c.input_tokens, c.output_tokens)
        filters = tuple((f.column, _Match(f, typed=False)) for f in self.filter)
        delimiter = "\t" if self._file_type == "tsv" else ","
        per_second = _PER_SECOND.get(c.time_unit, 1)
        first = math.nan  # the first kept row's value
        for batch in csv_batches(self._name, columns, filters, delimiter):
            values = batch.times[batch.kept]
            if not len(values):
                continue
            if not (np.isfinite(values).all() and (np.abs(values) < _EXACT_FLOAT).all()):
                raise Fallback
            if math.isnan(first):
                first = float(values[0])
            yield batch.rows((values - first) / per_second)

    def _records(self) -> Iterator[_Record]:
        mapped = self.columns.mapped()
        names = tuple(column for _, column in mapped) + tuple(f.column for f in self.filter)
        keys = tuple(f"columns.{key}" for key, _ in mapped) + tuple(
            "filter.column" if len(self.filter) == 1 else f"filter[{i}].column"
            for i in range(len(self.filter))
        )
        typed = self._file_type == "jsonl"
        matches = [_Match(f, typed) for f in self.filter]
        rows: Iterator[tuple[int, Sequence[object]]]
        if typed:
            rows = _json_rows(self._name, names, keys)
        else:
            delimiter = "\t" if self._file_type == "tsv" else ","
            rows = _csv_rows(self._name, names, delimiter=delimiter, mapped_by=keys)
        clock = _Clock(self._name, self.columns)
        num_mapped = len(mapped)
        hash_column = self.columns.hash_ids
        lora_column = self.columns.lora
        for line, values in rows:
            # A gap adds up whether or not the row is kept, so the clock sees every row.
            time = clock.gap(line, values[0]) if clock.gaps else None
            if not all(match(raw) for match, raw in zip(matches, values[num_mapped:], strict=True)):
                continue
            if time is None:
                time = clock.time(line, values[0])
            prefill, decode = values[1], values[2]
            try:  # the common case inline; anything else gets _count's precise error
                if typed and (type(prefill) is not int or type(decode) is not int):
                    raise ValueError
                num_prefill, num_decode = int(prefill), int(decode)  # type: ignore[call-overload]
            except ValueError:
                num_prefill, num_decode = 0, -1
            if not (1 <= num_prefill <= UINT32_MAX and 0 <= num_decode <= UINT32_MAX):
                num_prefill = _count(self._name, line, mapped[1][1], prefill, 1)
                num_decode = _count(self._name, line, mapped[2][1], decode, 0)
            hash_ids = None
            if hash_column is not None:
                hash_ids = self._hash_ids(line, hash_column, values[3], num_prefill)
            lora = None
            if lora_column is not None:
                lora = self._lora(line, lora_column, values[num_mapped - 1])
            yield line, time, values[0], num_prefill, num_decode, hash_ids, lora

    def _lora(self, line: int, column: str, raw: object) -> int:
        """An adapter id (>= 0), or -1 for the base model (-1, an empty cell, null)."""
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return -1
        value: object = raw
        if isinstance(raw, str):
            try:
                value = int(raw.strip())
            except ValueError:
                value = raw
        if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value < 2**63:
            raise TraceError(
                f"must be an adapter id (an integer >= 0), or -1 or empty for the base model, "
                f"got {raw!r}",
                path=self._name,
                line=line,
                field=column,
                value=repr(raw),
            )
        return value

    def _hash_ids(self, line: int, column: str, raw: object, num_prefill: int) -> list[int]:
        if isinstance(raw, str):  # a CSV cell: a JSON list, or empty for none
            text = raw.strip()
            try:
                raw = _JSON.decode(text) if text else []
            except ValueError:
                raise TraceError(
                    f"must be a JSON list of ints such as [1, 2, 3], got {raw!r}",
                    path=self._name,
                    line=line,
                    field=column,
                    value=repr(raw),
                ) from None
        if raw is None:
            raw = []
        block = int(self.hash_block_size or 1)
        _check_hash_ids(self._name, line, raw, -(-num_prefill // block), field=column)
        return raw  # type: ignore[return-value]  # checked: a list of ints


class _Clock:
    """A time column's values to seconds, relative to the first value read so that integer
    nanoseconds since 1970 keep their precision (float64 would lose the last digits)."""

    def __init__(self, path: str, columns: TraceColumns) -> None:
        self.path = path
        self.column = columns.time_column
        self.unit = columns.time_unit
        self.gaps = columns.gap is not None
        self.per_second = _PER_SECOND.get(self.unit, 1)
        self.first: int | float | None = None
        self.total: int | float = 0
        self.day_clock = _DayClock()

    def time(self, line: int, raw: object) -> float:
        """A timestamp, in seconds since the first one read."""
        if self.unit == "datetime":
            seconds = self.day_clock.seconds(raw) if isinstance(raw, str) else None
            if seconds is None:
                raise TraceError(
                    f"not an ISO-8601 datetime like '2023-11-16T18:15:46.68Z': {raw!r}",
                    path=self.path,
                    line=line,
                    field=self.column,
                    value=repr(raw),
                )
            return seconds
        value = self._number(line, raw)
        if self.first is None:
            self.first = value
        return (value - self.first) / self.per_second

    def gap(self, line: int, raw: object) -> float:
        """The running sum of the gaps up to this row, in seconds."""
        value = self._number(line, raw)
        if value < 0:
            raise TraceError(
                f"a gap must not be negative, got {raw!r}",
                path=self.path,
                line=line,
                field=self.column,
                value=repr(raw),
            )
        # The first row's gap (from before the trace) only shifts every time alike, and
        # times are shifted to start at 0 anyway.
        self.total += value
        return self.total / self.per_second

    def _number(self, line: int, raw: object) -> int | float:
        """A finite number; an integer beyond 2**53 (where a float64 would round it) is
        kept as an int, so arithmetic on it stays exact."""
        value: int | float = math.nan
        if type(raw) is int or type(raw) is float:
            value = raw
        elif isinstance(raw, str):
            with contextlib.suppress(ValueError):
                value = float(raw)  # the common case first: no exception for "12.5"
            if abs(value) >= _EXACT_FLOAT and raw.strip().lstrip("+-").isdigit():
                value = int(raw)
        if not math.isfinite(value):
            raise TraceError(
                f"not a finite number: {raw!r}",
                path=self.path,
                line=line,
                field=self.column,
                value=repr(raw),
            )
        return value


def _json_rows(
    path: str, names: tuple[str, ...], keys: tuple[str, ...]
) -> Iterator[tuple[int, list[object]]]:
    """``(line, [value of each field])`` for each non-blank line; a missing field names
    the config key that mapped it and lists the fields found."""
    for line, row in json_lines(path):
        if not isinstance(row, dict):
            raise TraceError(
                f"expected a JSON object, got {type(row).__name__}", path=path, line=line
            )
        try:
            values = [row[name] for name in names]
        except KeyError:
            name, key = next((n, k) for n, k in zip(names, keys, strict=True) if n not in row)
            found = ", ".join(map(str, row))
            raise TraceError(
                f"missing field, mapped by {key} (fields found: {found})",
                path=path,
                line=line,
                field=name,
            ) from None
        yield line, values
