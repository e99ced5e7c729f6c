"""What a trace reader's chunks come to, for comparing a fast path with the row-by-row
reader: every column's dtype and bytes (``None`` for columns a chunk lacks), or the error
and how many chunks came before it."""

from __future__ import annotations

from tokenyard.errors import TokenyardError
from tokenyard.workload.chunk import RequestChunk

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
