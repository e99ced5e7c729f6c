"""Column batches of trace rows: what the readers' fast paths (``trace_pipeline.py``) hand their
numpy pipeline, and the exception that sends them back to the row-by-row reader."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from typing import BinaryIO, cast

import numpy as np
import numpy.typing as npt

#: A row as the row-by-row readers give it: line, time in seconds, the time as read,
#: prefill tokens, decode tokens, hash ids, LoRA adapter (-1: the base model; None: the
#: format has no adapters).
Record = tuple[int, float, object, int, int, "list[int] | None", "int | None"]

READ_BYTES = 1 << 22
"""Bytes of a trace read at a time by the fast paths."""
MAX_LINE_CHARS = 1 << 23
"""The longest trace line read (8 Mi characters, its terminator not counted); a longer one
is a ``TraceError`` naming its line, found after reading this much of it, so that a file
with one enormous line (a broken export, a ``.gz`` that expands a thousandfold) is refused
in bounded memory and time. Real lines are far shorter: the longest of Mooncake's
published conversation trace is 2,053 bytes (247 hash ids for 126,195 tokens), and a
1M-token prompt hashed in 16-token blocks with 20-digit ids writes about 1.4 MB. Traces
are ASCII, so this is also bytes; the fast paths, which see bytes, hand any line longer
than this in bytes to the row-by-row reader, which decides."""
BATCH_ROWS = 1 << 16
"""Rows per column batch of the Mooncake fast path."""


Index = npt.NDArray[np.int64]


class Fallback(Exception):
    """The fast path met what only the row-by-row reader reports exactly (an error)."""


@dataclass(frozen=True)
class Rows:
    """Consecutive rows of a trace as columns, in file order (no prefix identity: empty
    ``hash_ids`` and zero offsets)."""

    lines: npt.NDArray[np.uint64]
    times_s: npt.NDArray[np.float64]
    """The time as read, in seconds (before the offset, the shift and the scale)."""
    input_lengths: npt.NDArray[np.uint32]
    output_lengths: npt.NDArray[np.uint32]
    hash_offsets: npt.NDArray[np.uint64]
    hash_ids: npt.NDArray[np.uint64]

    @staticmethod
    def of(record: Record) -> Rows:
        """One row read by the row-by-row reader."""
        line, time, _, num_prefill, num_decode, hash_ids, _ = record
        ids = hash_ids or []
        return Rows(
            np.array([line], dtype=np.uint64),
            np.array([time], dtype=np.float64),
            np.array([num_prefill], dtype=np.uint32),
            np.array([num_decode], dtype=np.uint32),
            np.array([0, len(ids)], dtype=np.uint64),
            np.array(ids, dtype=np.uint64),
        )

    def head(self, n: int) -> Rows:
        """The first ``n`` rows."""
        end = int(self.hash_offsets[n])
        return Rows(
            self.lines[:n],
            self.times_s[:n],
            self.input_lengths[:n],
            self.output_lengths[:n],
            self.hash_offsets[: n + 1],
            self.hash_ids[:end],
        )

    def select(self, mask: npt.NDArray[np.bool_]) -> Rows:
        """The rows where ``mask`` is set (their ids kept, in order)."""
        counts = np.diff(self.hash_offsets)[mask]
        offsets = np.zeros(len(counts) + 1, dtype=np.uint64)
        np.cumsum(counts, out=offsets[1:])
        starts = self.hash_offsets[:-1][mask]
        ids = self.hash_ids[ranges(starts, counts)]
        return Rows(
            self.lines[mask],
            self.times_s[mask],
            self.input_lengths[mask],
            self.output_lengths[mask],
            offsets,
            ids,
        )


def ranges(starts: npt.NDArray[np.uint64], counts: npt.NDArray[np.uint64]) -> Index:
    """The indices ``starts[i] .. starts[i] + counts[i]`` for every ``i``, concatenated."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts.astype(np.int64))
    index = np.arange(total, dtype=np.int64)
    # Each position's offset from its run's start in the output, plus the run's source start.
    run = np.repeat(np.arange(len(counts)), counts.astype(np.int64))
    return index - (ends - counts.astype(np.int64))[run] + starts.astype(np.int64)[run]


def open_binary(path: str) -> BinaryIO:
    """A trace file's bytes, through ``gzip`` for a ``.gz`` name."""
    if path.endswith(".gz"):
        return cast(BinaryIO, gzip.open(path, "rb"))
    return open(path, "rb")
