"""The pipeline every trace reader goes through: parse a row (``TraceError`` naming path,
line and field) → timestamps must not decrease → a zero output is handled by
``zero_output`` → rows earlier than ``start_offset_s`` after the first row are skipped →
reading stops after ``limit`` requests → times are shifted so the first kept request
arrives at 0 and multiplied by the scale (``time_scale``, or the one that makes the mean
rate ``target_qps``) → requests are batched into chunks. Only one chunk is held at a time.

The readers have a fast path with the same answers (issue 18): the Rust core reads
Mooncake's lines into columns (``_core.read_mooncake_lines``; a line it cannot vouch for
is read row by row by ``MooncakeTrace._row``), pyarrow reads a large Vidur or Azure CSV
(``csv_columns.py``), and the pipeline runs on numpy arrays. Whatever would raise, it
hands to the row-by-row pipeline, which raises exactly as before.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass, fields
from typing import ClassVar, Literal, cast

import numpy as np

from tokenyard._checks import check_choice, check_int, check_number, field_error
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
from tokenyard.workload.errors import TraceError
from tokenyard.workload.trace_parse import check_trace_path
from tokenyard.workload.trace_rows import Fallback, Rows
from tokenyard.workload.trace_rows import Record as _Record

ZeroOutput = Literal["error", "clamp", "skip"]
ZERO_OUTPUT: tuple[ZeroOutput, ...] = ("error", "clamp", "skip")


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
