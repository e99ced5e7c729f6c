"""Trace readers: Vidur CSV, Mooncake JSONL and Azure LLM inference CSV, streamed row by row
(stdlib ``csv``/``json``; a ``.gz`` file is read through ``gzip``).

Every format goes through one pipeline (``trace_pipeline.py``: the offset, the limit,
``zero_output``, the time scale, chunks), on rows parsed and checked by
``trace_parse.py``. ``columns.py``'s ``ColumnTrace`` (any layout, through a column
mapping) is one more reader of this pipeline. Each reader also has a fast path with the
same answers: the Rust core reads Mooncake's lines into columns, pyarrow a large Vidur or
Azure CSV (``csv_columns.py``). The names that moved to those two modules and that other
modules import from here are re-exported (``name as name``).
"""

from __future__ import annotations

import codecs
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, final

from tokenyard import _core
from tokenyard._checks import UINT32_MAX, check_choice, check_int
from tokenyard.workload.csv_columns import csv_batches, datetime_rows, plain_rows
from tokenyard.workload.errors import TraceError
from tokenyard.workload.trace_parse import _JSON as _JSON
from tokenyard.workload.trace_parse import (
    UINT64_MAX,
    _decoded,
    _open_text,
    _seconds,
    day_ordinal,
)
from tokenyard.workload.trace_parse import _check_hash_ids as _check_hash_ids
from tokenyard.workload.trace_parse import _count as _count
from tokenyard.workload.trace_parse import _csv_rows as _csv_rows
from tokenyard.workload.trace_parse import _DayClock as _DayClock
from tokenyard.workload.trace_parse import check_trace_path as check_trace_path
from tokenyard.workload.trace_parse import json_lines as json_lines
from tokenyard.workload.trace_pipeline import ZERO_OUTPUT
from tokenyard.workload.trace_pipeline import ZeroOutput as ZeroOutput
from tokenyard.workload.trace_pipeline import _ColumnTraceReader as _ColumnTraceReader
from tokenyard.workload.trace_pipeline import _TraceReader as _TraceReader
from tokenyard.workload.trace_rows import (
    BATCH_ROWS,
    MAX_LINE_CHARS,
    READ_BYTES,
    Fallback,
    Rows,
    open_binary,
)
from tokenyard.workload.trace_rows import Record as _Record

__all__ = [
    "TRACE_FORMATS",
    "ZERO_OUTPUT",
    "AzureTrace",
    "MooncakeTrace",
    "VidurTrace",
    "sample_path",
]

TRACE_FORMATS = ("vidur", "mooncake", "azure")

_LINE_END = re.compile(b"[\r\n]")


def sample_path(trace_format: str) -> Path:
    """The small sample trace of ``trace_format`` ("vidur", "mooncake" or "azure") shipped
    in the package (written by ``python -m tokenyard.workload.make_samples``)."""
    check_choice("sample_path", "trace_format", trace_format, TRACE_FORMATS)
    suffix = "jsonl" if trace_format == "mooncake" else "csv"
    return Path(__file__).resolve().parent / "samples" / f"{trace_format}_sample.{suffix}"


@final
@dataclass(frozen=True)
class VidurTrace(_ColumnTraceReader):
    """Vidur's request trace: CSV with ``arrived_at`` (seconds), ``num_prefill_tokens``,
    ``num_decode_tokens``; other columns are ignored. No prefix identity.

    Raises:
        ConfigError: an option out of range or a path that is not a file.
    """

    format: ClassVar[str] = "vidur"
    time_field: ClassVar[str] = "arrived_at"
    prefill_field: ClassVar[str] = "num_prefill_tokens"
    decode_field: ClassVar[str] = "num_decode_tokens"

    @property
    def hash_block_size(self) -> int | None:
        """Always ``None``: the trace has no prefix identity."""
        return None

    def _row_columns(self) -> Iterator[Rows]:
        """pyarrow's column batches for a large trace (``csv_columns.py``); a small one is
        read row by row (``Fallback`` at once)."""
        columns = (self.time_field, self.prefill_field, self.decode_field)
        return plain_rows(csv_batches(self._name, columns))

    def _records(self) -> Iterator[_Record]:
        name = self._name
        columns = (self.time_field, self.prefill_field, self.decode_field)
        for line, (written, prefill, decode) in _csv_rows(name, columns):
            try:
                time, num_prefill, num_decode = float(written), int(prefill), int(decode)
            except ValueError:
                time, num_prefill, num_decode = math.nan, 0, -1
            if not (
                math.isfinite(time)
                and 1 <= num_prefill <= UINT32_MAX
                and 0 <= num_decode <= UINT32_MAX
            ):
                time = _seconds(name, line, columns[0], written)
                num_prefill = _count(name, line, columns[1], prefill, 1)
                num_decode = _count(name, line, columns[2], decode, 0)
            yield line, time, written, num_prefill, num_decode, None, None


@final
@dataclass(frozen=True)
class MooncakeTrace(_ColumnTraceReader):
    """Mooncake's trace: JSON lines with ``timestamp`` (milliseconds), ``input_length``,
    ``output_length`` and ``hash_ids`` (block ids of the prompt, ``hash_block_size`` tokens
    each; optional, empty when absent). Blank lines are skipped; other keys are ignored.

    Raises:
        ConfigError: an option out of range or a path that is not a file.
    """

    hash_block_size: int = field(default=512, kw_only=True)
    """Tokens per hash id (512 in Mooncake's published traces)."""

    format: ClassVar[str] = "mooncake"
    time_field: ClassVar[str] = "timestamp"
    prefill_field: ClassVar[str] = "input_length"
    decode_field: ClassVar[str] = "output_length"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("MooncakeTrace", "hash_block_size", self.hash_block_size, low=1, high=UINT32_MAX)

    def _records(self) -> Iterator[_Record]:
        """Row by row (the reference the fast path of ``_chunks`` must agree with)."""
        with _open_text(self._name) as lines:
            for line, text in enumerate(_decoded(self._name, lines), start=1):
                record = self._row(line, text)
                if record is not None:
                    yield record

    def _row(self, line: int, text: str) -> _Record | None:
        """One line's row (``None``: a blank line)."""
        if text.isspace():
            return None
        name = self._name
        block = self.hash_block_size
        keys = (self.time_field, self.prefill_field, self.decode_field)
        try:
            row = _JSON.decode(text)
        except ValueError as error:
            message = getattr(error, "msg", str(error))
            raise TraceError(f"invalid JSON: {message}", path=name, line=line) from None
        try:
            stamp, prefill, decode = row[keys[0]], row[keys[1]], row[keys[2]]
            hash_ids = row.get("hash_ids", [])
        except (KeyError, TypeError, AttributeError):
            stamp = prefill = decode = hash_ids = None
        if (  # the common case, checked inline; anything else gets a precise error
            (type(stamp) is int or (type(stamp) is float and math.isfinite(stamp)))
            and type(prefill) is int
            and type(decode) is int
            and 1 <= prefill <= UINT32_MAX
            and 0 <= decode <= UINT32_MAX
            and type(hash_ids) is list
            and len(hash_ids) <= -(-prefill // block)
            and (
                not hash_ids
                or (
                    set(map(type, hash_ids)) == {int}
                    and min(hash_ids) >= 0
                    and max(hash_ids) <= UINT64_MAX
                )
            )
        ):
            return line, stamp / 1000.0, stamp, prefill, decode, hash_ids, None
        return self._checked(line, row)

    def _row_columns(self) -> Iterator[Rows]:
        """Every row of the file in column batches: lines read by the Rust core, and the
        ones it leaves read by ``_row``. Raises ``Fallback`` for text that is not UTF-8
        or a line longer than ``MAX_LINE_CHARS`` bytes (the row-by-row reader says
        where)."""
        block = self.hash_block_size
        with open_binary(self._name) as f:
            line = 0
            pending = b""
            at_start = True
            while True:
                data = f.read(READ_BYTES)
                if at_start and data.startswith(codecs.BOM_UTF8):
                    data = data[len(codecs.BOM_UTF8) :]  # utf-8-sig, as the text reader
                at_start = False
                is_final = not data
                buf = pending + data
                if (
                    len(buf) > MAX_LINE_CHARS
                    and _LINE_END.search(buf, 0, MAX_LINE_CHARS + 1) is None
                ):
                    # The first line is longer than the bound (every other line lies in
                    # `data`, READ_BYTES < MAX_LINE_CHARS): the row reader refuses it, or
                    # reads it if its characters are fewer than its bytes.
                    raise Fallback
                start = 0
                while True:
                    lines, times, inputs, outputs, offsets, ids, end, line, handed_back = (
                        _core.read_mooncake_lines(buf, start, line, block, BATCH_ROWS, is_final)
                    )
                    num_rows = len(lines)
                    if num_rows:
                        yield Rows(lines, times, inputs, outputs, offsets, ids)
                    start = end
                    if handed_back is not None:
                        line += 1
                        try:
                            text = buf[start:handed_back].decode("utf-8")
                        except UnicodeDecodeError:
                            raise Fallback from None
                        record = self._row(line, text)
                        if record is not None:
                            yield Rows.of(record)
                        start = handed_back
                    elif num_rows < BATCH_ROWS:
                        break
                pending = buf[start:]
                if is_final:
                    return

    def _checked(self, line: int, row: object) -> _Record:
        """A row off the fast path: normalised (integral floats are accepted), or a
        ``TraceError`` naming the first bad field."""
        name = self._name
        keys = (self.time_field, self.prefill_field, self.decode_field)
        if not isinstance(row, dict):
            raise TraceError(
                f"expected a JSON object, got {type(row).__name__}", path=name, line=line
            )
        for key in keys:
            if key not in row:
                raise TraceError(
                    f"missing field (fields found: {', '.join(map(str, row))})",
                    path=name,
                    line=line,
                    field=key,
                )
        stamp = row[keys[0]]
        time = _seconds(name, line, keys[0], stamp) / 1000.0
        num_prefill = _count(name, line, keys[1], row[keys[1]], 1)
        num_decode = _count(name, line, keys[2], row[keys[2]], 0)
        hash_ids = row.get("hash_ids", [])
        _check_hash_ids(name, line, hash_ids, -(-num_prefill // self.hash_block_size))
        return line, time, stamp, num_prefill, num_decode, hash_ids, None

    @staticmethod
    def _written(stamp: object) -> str:
        return f"{stamp!r} ms"


@final
@dataclass(frozen=True)
class AzureTrace(_ColumnTraceReader):
    """Azure's LLM inference trace (2023/2024): CSV with ``TIMESTAMP`` (a datetime such as
    ``2023-11-16 18:15:46.6805900``: any number of fractional digits, an optional ``T``
    separator and ``Z``/``±HH:MM`` offset), ``ContextTokens``, ``GeneratedTokens``. No
    prefix identity. Rows with ``GeneratedTokens=0`` exist in the published traces: pass
    ``zero_output="clamp"`` or ``"skip"`` to accept them.

    Raises:
        ConfigError: an option out of range or a path that is not a file.
    """

    format: ClassVar[str] = "azure"
    time_field: ClassVar[str] = "TIMESTAMP"
    prefill_field: ClassVar[str] = "ContextTokens"
    decode_field: ClassVar[str] = "GeneratedTokens"

    @property
    def hash_block_size(self) -> int | None:
        """Always ``None``: the trace has no prefix identity."""
        return None

    @staticmethod
    def _written(stamp: object) -> str:
        return repr(stamp)

    def _row_columns(self) -> Iterator[Rows]:
        """pyarrow's batches for a large trace, the datetimes parsed in bulk as ``_DayClock``
        parses them (``csv_columns.datetime_rows``); a small one row by row."""
        columns = (self.time_field, self.prefill_field, self.decode_field)
        return datetime_rows(csv_batches(self._name, columns, time_as_text=True), day_ordinal)

    def _records(self) -> Iterator[_Record]:
        name = self._name
        columns = (self.time_field, self.prefill_field, self.decode_field)
        clock = _DayClock()
        for line, (written, prefill, decode) in _csv_rows(name, columns):
            time = clock.seconds(written)
            if time is None:
                raise TraceError(
                    f"not a datetime like '2023-11-16 18:15:46.6805900': {written!r}",
                    path=name,
                    line=line,
                    field=columns[0],
                    value=written,
                )
            num_prefill = _count(name, line, columns[1], prefill, 1)
            num_decode = _count(name, line, columns[2], decode, 0)
            yield line, time, written, num_prefill, num_decode, None, None
