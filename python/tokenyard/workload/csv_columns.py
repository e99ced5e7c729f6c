"""The CSV readers' fast path: a trace's time and length columns read by pyarrow's CSV
reader in column batches (``Rows``), for the numpy pipeline of ``traces.py``.

It only ever reads what the row-by-row reader would read the same way: anything pyarrow
does not parse as a plain number (a blank or quoted-empty cell, ``12.0`` in a count, spaces,
a ragged row), a value out of range, text that is not UTF-8 anywhere in the file, or a
header it does not find raises ``Fallback``, and the row-by-row reader takes over from the
rows already given, with its own messages. pyarrow is imported only for traces of at least
``MIN_BYTES`` (its import costs more than reading a small trace row by row).
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from tokenyard._checks import UINT32_MAX
from tokenyard.workload.trace_rows import READ_BYTES, Fallback, Rows

#: Traces smaller than this (file bytes) are read row by row.
MIN_BYTES = 1 << 20


class _Utf8Checked:
    """A binary file whose reads fail (``UnicodeDecodeError``) on text that is not UTF-8:
    pyarrow does not decode the columns it skips, and the row reader decodes them all."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._decoder.decode(data, final=not data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def csv_columns(path: str, raw: BinaryIO, columns: tuple[str, str, str]) -> Iterator[Rows]:
    """The rows of the CSV ``raw`` (opened from ``path``) in batches: the time column in
    seconds (float64, parsed as Python's ``float`` parses it) and the prompt and output
    lengths (integers in their ranges). Raises ``Fallback`` as the module says; line
    numbers count one line per row (the row reader's errors name the real lines)."""
    if os.path.getsize(path) < MIN_BYTES:
        raise Fallback
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.csv as pa_csv  # type: ignore[import-untyped]

    time, prefill, decode = columns
    convert = pa_csv.ConvertOptions(
        include_columns=list(columns),
        column_types={time: pa.float64(), prefill: pa.int64(), decode: pa.int64()},
        null_values=[],
        strings_can_be_null=False,
    )
    read = pa_csv.ReadOptions(block_size=READ_BYTES, use_threads=False)
    line = 1
    try:
        for batch in pa_csv.open_csv(_Utf8Checked(raw), read_options=read, convert_options=convert):
            times, inputs, outputs = (batch.column(i).to_numpy() for i in range(3))
            in_range = (
                np.isfinite(times).all()
                and ((inputs >= 1) & (inputs <= UINT32_MAX)).all()
                and ((outputs >= 0) & (outputs <= UINT32_MAX)).all()
            )
            if not in_range:
                raise Fallback
            n = len(times)
            yield Rows(
                np.arange(line + 1, line + 1 + n, dtype=np.uint64),
                times,
                inputs.astype(np.uint32),
                outputs.astype(np.uint32),
                np.zeros(n + 1, dtype=np.uint64),
                np.zeros(0, dtype=np.uint64),
            )
            line += n
    except (pa.ArrowException, UnicodeDecodeError):
        raise Fallback from None
