"""Comparing a trace reader's fast path with its row-by-row reader: what the chunks come
to (every column's dtype and bytes, ``None`` for columns a chunk lacks, or the error and how
many chunks came before it), random reader options, and the comparison itself."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from tokenyard.errors import TokenyardError
from tokenyard.workload.chunk import RequestChunk
from tokenyard.workload.traces import _TraceReader

COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens", "hash_offsets", "hash_ids")


def outcome(chunks: object) -> tuple[object, ...]:
    got: list[RequestChunk] = []
    try:
        for chunk in chunks:  # type: ignore[attr-defined]
            got.append(chunk)
    except TokenyardError as error:
        return ("error", type(error).__name__, str(error), len(got))
    return ("ok", [[_column(getattr(c, name)) for name in COLUMNS] for c in got])


def _column(values: object) -> object:
    if values is None:
        return None
    return (values.dtype.str, values.tobytes())  # type: ignore[attr-defined]


def write_trace(path: Path, data: bytes, rng: random.Random) -> Path:
    """``data`` at ``path``, or gzipped beside it (``.gz`` added) one time in seven."""
    if rng.random() < 0.15:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def reader_options(rng: random.Random) -> dict[str, object]:
    """One of the readers' option sets: limits, offsets, the zero-output rules, scales."""
    return dict(
        rng.choice(
            [
                {},
                {"limit": rng.randint(1, 30)},
                {"start_offset_s": rng.choice([0.5, 3.0, 50.0])},
                {"zero_output": "skip"},
                {"zero_output": "clamp", "limit": rng.randint(1, 30)},
                {"target_qps": 2.0, "zero_output": "clamp"},
                {"time_scale": 0.5, "zero_output": "skip", "start_offset_s": 2.0},
            ]
        )
    )


def assert_fast_path_reads_as_rows(reader: _TraceReader, rng: random.Random, case: object) -> None:
    """The reader's chunks (its fast path) and its row-by-row pipeline's come to the same,
    at a random chunk size."""
    size = rng.choice([1, 3, 64])
    fast = outcome(reader.chunks(size))
    rows = outcome(_TraceReader._chunks(reader, size))
    assert fast == rows, case
