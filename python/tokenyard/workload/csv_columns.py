"""The CSV readers' fast path: a trace's time, length and filter columns read by pyarrow's
CSV reader in batches, for the numpy pipeline of ``traces.py``.

It only ever reads what the row-by-row reader would read the same way: anything pyarrow
does not parse as a plain number (a blank or quoted-empty cell, ``12.0`` in a count, spaces,
a ragged row), text that is not UTF-8 anywhere in the file, a line longer than
``MAX_LINE_CHARS`` bytes, or a header it does not find raises ``Fallback``, and so does a
reader's own check on the numbers; the row-by-row reader then takes over from the rows
already given, with its own messages. pyarrow is imported only for traces of at least
``MIN_BYTES`` (its import costs more than reading a small trace row by row).
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from tokenyard._checks import UINT32_MAX
from tokenyard.workload.trace_rows import (
    MAX_LINE_CHARS,
    READ_BYTES,
    Fallback,
    Rows,
    open_binary,
)

#: Traces smaller than this (file bytes) are read row by row.
MIN_BYTES = 1 << 20


@dataclass(frozen=True)
class CsvBatch:
    """Consecutive data rows: the time column as float64 (parsed as Python's ``float``
    parses it) or, for a reader that parses it itself, as pyarrow text (``time_text``,
    ``times`` then empty); the two lengths as int64; whether each row passes the filters."""

    first_line: int
    times: npt.NDArray[np.float64]
    inputs: npt.NDArray[np.int64]
    outputs: npt.NDArray[np.int64]
    kept: npt.NDArray[np.bool_]
    time_text: object = None

    def rows(self, times_s: npt.NDArray[np.float64]) -> Rows:
        """The kept rows, with these times (one per kept row), as ``Rows``; ``Fallback``
        for a length out of its range."""
        inputs, outputs = self.inputs[self.kept], self.outputs[self.kept]
        in_range = ((inputs >= 1) & (inputs <= UINT32_MAX)).all() and (
            (outputs >= 0) & (outputs <= UINT32_MAX)
        ).all()
        if not in_range:
            raise Fallback
        n = len(inputs)
        lines = np.arange(self.first_line, self.first_line + len(self.kept), dtype=np.uint64)
        return Rows(
            lines[self.kept],
            times_s,
            inputs.astype(np.uint32),
            outputs.astype(np.uint32),
            np.zeros(n + 1, dtype=np.uint64),
            np.zeros(0, dtype=np.uint64),
        )


class _Checked:
    """A binary file whose reads fail on text that is not UTF-8 (``UnicodeDecodeError``:
    pyarrow does not decode the columns it skips, and the row reader decodes them all) and
    on a line longer than ``MAX_LINE_CHARS`` bytes (``Fallback``: pyarrow would read on
    for tens of MB before it gave up on the row)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._line_bytes = 0  # of the last line read, so far
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._decoder.decode(data, final=not data)
        end = data.rfind(b"\n")
        if end < 0:
            end = data.rfind(b"\r")
        self._line_bytes = len(data) - 1 - end if end >= 0 else self._line_bytes + len(data)
        if self._line_bytes > MAX_LINE_CHARS:
            raise Fallback
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


#: A filter: its column and whether a cell's text keeps the row.
TextFilter = tuple[str, Callable[[str], bool]]


def csv_batches(
    path: str,
    columns: tuple[str, str, str],
    filters: tuple[TextFilter, ...] = (),
    delimiter: str = ",",
    time_as_text: bool = False,
) -> Iterator[CsvBatch]:
    """The data rows of the CSV at ``path`` (gzip for ``.gz``) in batches: ``columns`` are
    the time, prompt-length and output-length columns; a row is kept when every filter
    keeps its cell's text. Raises ``Fallback`` as the module says; line numbers count one
    line per row (the row reader's errors name the real lines)."""
    if os.path.getsize(path) < MIN_BYTES:
        raise Fallback
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.csv as pa_csv  # type: ignore[import-untyped]

    time, prefill, decode = columns
    texts = [column for column, _ in filters if column not in columns]
    types = {name: pa.string() for name in texts}
    time_type = pa.string() if time_as_text else pa.float64()
    types.update({time: time_type, prefill: pa.int64(), decode: pa.int64()})
    convert = pa_csv.ConvertOptions(
        include_columns=[*columns, *texts],
        column_types=types,
        null_values=[],
        strings_can_be_null=False,
    )
    read = pa_csv.ReadOptions(block_size=READ_BYTES, use_threads=False)
    parse = pa_csv.ParseOptions(delimiter=delimiter)
    line = 2
    try:
        with open_binary(path) as raw:
            for batch in pa_csv.open_csv(_Checked(raw), read, parse, convert):
                n = batch.num_rows
                kept = np.ones(n, dtype=np.bool_)
                for column, keeps in filters:
                    kept &= _per_distinct(batch.column(column), keeps, np.bool_)
                cells = batch.column(time)
                yield CsvBatch(
                    line,
                    np.zeros(0) if time_as_text else cells.to_numpy(),
                    batch.column(prefill).to_numpy(),
                    batch.column(decode).to_numpy(),
                    kept,
                    cells if time_as_text else None,
                )
                line += n
    except (pa.ArrowException, UnicodeDecodeError):
        raise Fallback from None


def plain_rows(batches: Iterator[CsvBatch]) -> Iterator[Rows]:
    """Batches as ``Rows``, their times as read (seconds), for a reader without filters or
    units (Vidur's); ``Fallback`` for a time that is not finite."""
    for batch in batches:
        if not len(batch.times):
            continue
        if not np.isfinite(batch.times).all():
            raise Fallback
        yield batch.rows(batch.times)


#: ``trace_parse._DATETIME`` with named groups, for pyarrow (RE2: its ``\\d`` and ``\\s`` are
#: ASCII, a subset of Python's, so it matches a subset of what the row reader matches).
_DATETIME = (
    r"^\s*(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})[T ](?P<H>\d{2}):(?P<M>\d{2}):(?P<S>\d{2})"
    r"(?:\.(?P<f>\d+))?\s*(?P<z>Z|[+-]\d{2}:?\d{2})?\s*$"
)

#: Fractional digits read exactly (an int64 numerator below 2**53, a power of ten exact).
_MAX_FRACTION_DIGITS = 15


def datetime_rows(
    batches: Iterator[CsvBatch], day_ordinal: Callable[[str], int | None]
) -> Iterator[Rows]:
    """Batches whose time column holds datetimes (Azure's) as ``Rows`` with the row
    reader's seconds: since midnight of the first row's day, the whole seconds in integers
    plus ``int(fraction) / 10 ** len(fraction)``, less the zone's offset. ``day_ordinal``
    is the row reader's date rule (``None``: not a date). ``Fallback`` for anything else:
    a cell the pattern does not match, a field out of range, a long fraction."""
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    first_day: int | None = None
    for batch in batches:
        if not len(batch.kept):
            continue
        try:
            times, first_day = _datetime_seconds(batch.time_text, first_day, day_ordinal, pc)
        except pa.ArrowException:
            raise Fallback from None
        yield batch.rows(times)


def _datetime_seconds(
    cells: object, first_day: int | None, day_ordinal: Callable[[str], int | None], pc: Any
) -> tuple[npt.NDArray[np.float64], int]:
    """The seconds of one batch's datetimes (``datetime_rows``), and the first row's day."""
    parts = pc.extract_regex(cells, pattern=_DATETIME)
    if parts.null_count:
        raise Fallback

    day_text = pc.binary_join_element_wise(parts.field("y"), parts.field("m"), parts.field("d"), "")
    days = _per_distinct(day_text, day_ordinal, np.int64)
    if first_day is None:
        first_day = int(days[0])
    hours, minutes, seconds = (_integers(parts.field(name)) for name in "HMS")
    if (hours > 23).any() or (minutes > 59).any() or (seconds > 60).any():
        raise Fallback
    whole = (days - first_day) * 86400 + hours * 3600 + minutes * 60 + seconds
    whole -= _per_distinct(parts.field("z"), _zone_seconds, np.int64)
    fraction = parts.field("f")
    digits = np.asarray(pc.utf8_length(fraction).to_numpy(), dtype=np.int64)
    if (digits > _MAX_FRACTION_DIGITS).any():
        raise Fallback
    padded = pc.if_else(pc.equal(pc.utf8_length(fraction), 0), "0", fraction)
    numerator = _integers(padded).astype(np.float64)
    fractions = np.where(digits > 0, numerator / np.power(10.0, digits), 0.0)
    return whole.astype(np.float64) + fractions, first_day


def _integers(digits: object) -> npt.NDArray[np.int64]:
    """Cells of ASCII digits (the pattern's) as int64."""
    import pyarrow as pa

    values: npt.NDArray[np.int64] = np.asarray(
        digits.cast(pa.int64()).to_numpy(),  # type: ignore[attr-defined]
        dtype=np.int64,
    )
    return values


def _zone_seconds(zone: str) -> int:
    """The row reader's zone offset in seconds (``""`` and ``Z``: 0)."""
    if not zone or zone == "Z":
        return 0
    sign = 1 if zone[0] == "+" else -1
    return sign * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60)


def _per_distinct(cells: object, rule: Callable[[str], Any], dtype: type) -> npt.NDArray[Any]:
    """``rule`` of each cell's text as an array of ``dtype``, asked once per distinct text
    (a trace's filter columns and dates hold a few values), so the rule is the row reader's
    own; ``Fallback`` where it answers ``None``."""
    encoded = cells.dictionary_encode()  # type: ignore[attr-defined]
    answers = [rule(text) for text in encoded.dictionary.to_pylist()]
    if any(answer is None for answer in answers):
        raise Fallback
    indices = encoded.indices.to_numpy().astype(np.int64)
    values: npt.NDArray[Any] = np.asarray(answers, dtype=dtype)[indices]
    return values
