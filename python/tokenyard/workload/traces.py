"""Trace readers: Vidur CSV, Mooncake JSONL and Azure LLM inference CSV, streamed row by row
(stdlib ``csv``/``json``; a ``.gz`` file is read through ``gzip``).

Every format goes through one pipeline: parse a row (``TraceError`` naming path, line and
field) → timestamps must not decrease → a zero output is handled by ``zero_output`` → rows
earlier than ``start_offset_s`` after the first row are skipped → reading stops after
``limit`` requests → times are shifted so the first kept request arrives at 0 and
multiplied by the scale (``time_scale``, or the one that makes the mean rate
``target_qps``) → requests are batched into chunks. Only one chunk is held at a time.
``columns.py``'s ``ColumnTrace`` (any layout, through a column mapping) is one more reader
of this pipeline.

The readers have a fast path with the same answers (issue 18): the Rust core reads
Mooncake's lines into columns (``_core.read_mooncake_lines``; a line it cannot vouch for
is read here, row by row), pyarrow reads a large Vidur or Azure CSV
(``csv_columns.py``), and the pipeline runs on numpy arrays. Whatever would raise, it
hands to the row-by-row pipeline, which raises exactly as before.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import gzip
import json
import math
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass, field, fields
from datetime import date
from pathlib import Path
from typing import ClassVar, Literal, TextIO, cast, final

import numpy as np

from tokenyard import _core
from tokenyard._checks import (
    UINT32_MAX,
    check_choice,
    check_int,
    check_number,
    field_error,
)
from tokenyard.workload.chunk import (
    DEFAULT_CHUNK_SIZE,
    MAX_REQUESTS,
    RequestChunk,
    Workload,
    WorkloadStats,
    check_chunk_size,
    rechunk,
    summarize,
)
from tokenyard.workload.csv_columns import csv_batches, datetime_rows, plain_rows
from tokenyard.workload.errors import TraceError
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

ZeroOutput = Literal["error", "clamp", "skip"]
ZERO_OUTPUT: tuple[ZeroOutput, ...] = ("error", "clamp", "skip")
TRACE_FORMATS = ("vidur", "mooncake", "azure")
UINT64_MAX = 2**64 - 1

_JSON = json.JSONDecoder()
_LINE_END = re.compile(b"[\r\n]")


def sample_path(trace_format: str) -> Path:
    """The small sample trace of ``trace_format`` ("vidur", "mooncake" or "azure") shipped
    in the package (written by ``python -m tokenyard.workload.make_samples``)."""
    check_choice("sample_path", "trace_format", trace_format, TRACE_FORMATS)
    suffix = "jsonl" if trace_format == "mooncake" else "csv"
    return Path(__file__).resolve().parent / "samples" / f"{trace_format}_sample.{suffix}"


@dataclass(frozen=True)
class _TraceReader(ABC):
    """Options shared by the readers; see the module docstring for the pipeline."""

    path: str | os.PathLike[str]
    _: KW_ONLY
    time_scale: float = 1.0
    """Multiplies every gap (2.0 = half the rate). Exclusive with ``target_qps``."""
    target_qps: float | None = None
    """Rescale the gaps so that ``(n - 1) / (last - first arrival)`` over the selected
    requests is this. Costs a first streaming pass over the selected rows."""
    start_offset_s: float = 0.0
    """Skip requests earlier than this many seconds (trace time, before scaling) after
    the trace's first row."""
    limit: int | None = None
    """Read at most this many requests (after the offset); later rows are not read."""
    zero_output: ZeroOutput = "error"
    """A request with 0 output tokens: ``"error"`` (``TraceError``), ``"clamp"`` (1 token)
    or ``"skip"`` (dropped; does not count towards ``limit``)."""

    format: ClassVar[str]
    time_field: ClassVar[str]
    prefill_field: ClassVar[str]
    decode_field: ClassVar[str]

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_trace_path(owner, self.path)
        check_number(owner, "time_scale", self.time_scale, low=0.0, low_open=True)
        if self.target_qps is not None:
            check_number(owner, "target_qps", self.target_qps, low=0.0, low_open=True)
            if self.time_scale != 1.0:
                raise field_error(
                    owner,
                    "target_qps",
                    f"cannot be combined with time_scale={self.time_scale!r}; give one",
                    self.target_qps,
                )
        check_number(owner, "start_offset_s", self.start_offset_s, low=0.0)
        if self.limit is not None:
            check_int(owner, "limit", self.limit, low=1, high=MAX_REQUESTS)
        check_choice(owner, "zero_output", self.zero_output, ZERO_OUTPUT)

    def chunks(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[RequestChunk]:
        """The selected requests in chunks of ``chunk_size`` (the last may be shorter).

        Raises:
            InputError: ``chunk_size`` is not an int >= 1 (at once).
            TraceError: while streaming, at the first bad row; chunks before it have been
                yielded already (call ``validate()`` first to fail before any output).
        """
        return self._chunks(check_chunk_size(chunk_size))

    def validate(self) -> WorkloadStats:
        """Read the selected rows once, checking every one, and total them.

        Raises:
            TraceError: the first bad row, or no requests selected.
        """
        return summarize(cast(Workload, self))

    def describe(self) -> dict[str, object]:
        """The reader's options as a mapping ``load_workload`` accepts."""
        found: dict[str, object] = {"kind": "trace", "format": self.format, "path": self._name}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "path" and value is not None:
                found[f.name] = value
        return found

    @property
    def _name(self) -> str:
        return os.fspath(self.path)

    @property
    def _time_column(self) -> str:
        """The column (or JSON field) of the arrival time, for messages."""
        return self.time_field

    @property
    def _output_column(self) -> str:
        """The column (or JSON field) of the output length, for messages."""
        return self.decode_field

    @abstractmethod
    def _records(self) -> Iterator[_Record]:
        """Every row of the file, parsed and checked, in file order (one per format)."""

    @staticmethod
    def _written(stamp: object) -> str:
        """A timestamp as the trace wrote it, for messages."""
        return str(stamp)

    def _kept(self) -> Iterator[_Record]:
        """Validated rows after the offset, the zero-output rule and the limit, with their
        original times."""
        first: float | None = None
        previous, previous_line = 0.0, 0
        kept = 0
        for record in self._records():
            line, time, written, num_prefill, num_decode, hash_ids, lora = record
            if first is None:
                first = time
            elif time < previous:
                raise TraceError(
                    f"timestamps must not decrease: {self._written(written)} is earlier than "
                    f"line {previous_line}'s",
                    path=self._name,
                    line=line,
                    field=self._time_column,
                    value=repr(written),
                )
            previous, previous_line = time, line
            if num_decode == 0:
                if self.zero_output == "error":
                    raise TraceError(
                        "must be >= 1, got 0 (zero_output='clamp' makes it 1, 'skip' drops "
                        "the request)",
                        path=self._name,
                        line=line,
                        field=self._output_column,
                        value="0",
                    )
                if self.zero_output == "skip":
                    continue
                record = (line, time, written, num_prefill, 1, hash_ids, lora)
            if time - first < self.start_offset_s:
                continue
            yield record
            kept += 1
            if kept == self.limit:
                return
        if first is None:
            raise TraceError("empty trace: no requests", path=self._name)
        if kept == 0:
            raise TraceError(
                f"no requests selected (start_offset_s={self.start_offset_s!r}, "
                f"zero_output={self.zero_output!r})",
                path=self._name,
            )

    def _scale(self) -> float:
        if self.target_qps is None:
            return float(self.time_scale)
        count, first, last = 0, 0.0, 0.0
        for _, time, *_ in self._kept():
            if count == 0:
                first = time
            last = time
            count += 1
        return self._qps_scale(count, first, last)

    def _qps_scale(self, count: int, first: float, last: float) -> float:
        """The time scale that replays ``count`` selected requests spanning ``first`` to
        ``last`` at ``target_qps``."""
        assert self.target_qps is not None
        if count < 2 or last <= first:
            raise TraceError(
                f"target_qps needs at least two selected requests at different times; "
                f"got {count} spanning {last - first:g} s",
                path=self._name,
                field="target_qps",
            )
        return (count - 1) / (last - first) / float(self.target_qps)

    def _chunks(self, chunk_size: int) -> Iterator[RequestChunk]:
        scale = self._scale()
        first: float | None = None
        arrived: list[float] = []
        prefill: list[int] = []
        decode: list[int] = []
        offsets: list[int] | None = None
        ids: list[int] = []
        loras: list[int] = []
        for _, time, _, num_prefill, num_decode, hash_ids, lora in self._kept():
            if first is None:
                first = time
            arrived.append((time - first) * scale)
            prefill.append(num_prefill)
            decode.append(num_decode)
            if hash_ids is not None:
                ids.extend(hash_ids)
                offsets = offsets or [0]
                offsets.append(len(ids))
            if lora is not None:
                loras.append(lora)
            if len(arrived) == chunk_size:
                yield _chunk(arrived, prefill, decode, offsets, ids, loras)
                arrived, prefill, decode, ids, loras = [], [], [], [], []
                offsets = None
        if arrived:
            yield _chunk(arrived, prefill, decode, offsets, ids, loras)


@dataclass(frozen=True)
class _ColumnTraceReader(_TraceReader):
    """A reader with a fast path: its rows come in column batches (``_row_columns``) and the
    pipeline runs on numpy arrays, with the same answers as the row-by-row pipeline, which
    stays the reference. Whatever would raise goes to the row-by-row pipeline (``Fallback``)
    past the rows already given, which raises exactly as before."""

    @property
    @abstractmethod
    def hash_block_size(self) -> int | None:
        """Tokens per hash id; ``None`` for a format without prefix identity."""

    @abstractmethod
    def _row_columns(self) -> Iterator[Rows]:
        """Every row of the file in column batches, in file order; raises ``Fallback``
        for anything only the row-by-row reader reports exactly."""

    def _has_fast_path(self) -> bool:
        """Whether these options can take the fast path at all (else the row-by-row
        pipeline reads the file, as ``_TraceReader``)."""
        return True

    def _kept_columns(self) -> Iterator[Rows]:
        """``_kept`` on column batches: the same rows with the same (original) times. Rows
        that would raise, and an empty selection, go to ``_kept`` row by row (past the rows
        already given), which raises its own error."""
        yielded = 0
        try:
            for rows in self._fast_kept():
                yield rows
                yielded += len(rows.times_s)
            return
        except Fallback:
            pass
        for i, record in enumerate(self._kept()):
            if i >= yielded:
                yield Rows.of(record)

    def _fast_kept(self) -> Iterator[Rows]:
        first: float | None = None
        previous = -math.inf
        kept = 0
        skip_zero = self.zero_output == "skip"
        for rows in self._row_columns():
            times = rows.times_s
            if first is None:
                first = float(times[0])
            keep = ~(times - first < self.start_offset_s)
            zero = rows.output_lengths == 0
            if skip_zero:
                keep &= ~zero
            if self.limit is not None:
                # Rows after the one that completes the limit are never read.
                count = kept + np.cumsum(keep)
                reached = np.flatnonzero(count == self.limit)
                if len(reached):
                    n = int(reached[0]) + 1
                    rows, times, keep, zero = rows.head(n), times[:n], keep[:n], zero[:n]
            out_of_order = times[0] < previous or bool((times[1:] < times[:-1]).any())
            if out_of_order or (self.zero_output == "error" and zero.any()):
                raise Fallback
            previous = float(times[-1])
            if not skip_zero and zero.any():
                rows.output_lengths[zero] = 1  # clamp
            if keep.any():
                selected = rows if keep.all() else rows.select(keep)
                kept += len(selected.times_s)
                yield selected
            if kept == self.limit:
                return
        if kept == 0:
            raise Fallback  # an empty trace or none selected: the row reader's messages

    def _scale(self) -> float:
        if not self._has_fast_path():
            return super()._scale()
        if self.target_qps is None:
            return float(self.time_scale)
        count, first, last = 0, 0.0, 0.0
        for rows in self._kept_columns():
            if count == 0:
                first = float(rows.times_s[0])
            last = float(rows.times_s[-1])
            count += len(rows.times_s)
        return self._qps_scale(count, first, last)

    def _chunks(self, chunk_size: int) -> Iterator[RequestChunk]:
        if not self._has_fast_path():
            yield from super()._chunks(chunk_size)
            return
        yield from rechunk(self._pieces(self._scale()), chunk_size)

    def _pieces(self, scale: float) -> Iterator[RequestChunk]:
        first: float | None = None
        identity = self.hash_block_size is not None
        for rows in self._kept_columns():
            if first is None:
                first = float(rows.times_s[0])
            yield RequestChunk(
                (rows.times_s - first) * scale,
                rows.input_lengths,
                rows.output_lengths,
                rows.hash_offsets if identity else None,
                rows.hash_ids if identity else None,
            )


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


def _chunk(
    arrived: list[float],
    prefill: list[int],
    decode: list[int],
    offsets: list[int] | None,
    ids: list[int],
    loras: list[int],
) -> RequestChunk:
    """A chunk of the rows; ``loras`` is empty, or one adapter per row (-1: none)."""
    with_ids = offsets is not None
    return RequestChunk(
        np.array(arrived, dtype=np.float64),
        np.array(prefill, dtype=np.uint32),
        np.array(decode, dtype=np.uint32),
        np.array(offsets, dtype=np.uint64) if with_ids else None,
        np.array(ids, dtype=np.uint64) if with_ids else None,
        lora_ids=np.array(loras, dtype=np.int64) if loras else None,
    )


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
