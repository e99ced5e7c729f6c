"""The unit a workload streams: a ``RequestChunk`` of up to ``chunk_size`` requests as numpy
arrays, and the ``Workload`` protocol the simulator consumes.

Invariant of a stream: arrival times never decrease, within a chunk and across chunks, and
every request has at least one prefill and one decode token. A chunk checks its own shape
and values when it is built; the order across chunks is its producer's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, final

import numpy as np
import numpy.typing as npt

from tokenyard.errors import InputError

__all__ = ["MAX_REQUESTS", "NO_SESSION", "RequestChunk", "Workload", "WorkloadStats", "summarize"]

DEFAULT_CHUNK_SIZE = 65536
#: The most requests (or sessions, or closed-loop users) one workload gives. A simulation
#: keeps ~200 bytes per request until it writes its results, so this bounds a run near
#: 20 GB; larger studies split the load across runs.
MAX_REQUESTS = 10**8
NO_SESSION = 2**64 - 1
"""``RequestChunk.session_ids`` of a request outside any session."""

F64 = npt.NDArray[np.float64]
U32 = npt.NDArray[np.uint32]
U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


@final
@dataclass(frozen=True)
class RequestChunk:
    """Consecutive requests of a workload, one array entry per request.

    Prefix identity (optional, both arrays or neither): request ``i``'s prompt starts with
    the blocks ``hash_ids[hash_offsets[i]:hash_offsets[i + 1]]``, each covering the
    workload's ``hash_block_size`` tokens of the prompt (the last may be partial). Equal ids
    mean identical token content, so a prefix cache hits on a common run of leading ids.

    LoRA adapters (optional): ``lora_ids[i]`` is the adapter request ``i`` runs with, -1 for
    the base model (``docs/lora.md``).

    Raises:
        InputError: an array has the wrong dtype or length, a length is 0, an arrival time
            is not finite or goes backwards, or the offsets are not a valid partition of
            ``hash_ids``.
    """

    arrived_at: F64
    """Arrival times in seconds (float64), non-decreasing across the whole stream."""
    num_prefill_tokens: U32
    """Prompt lengths (uint32, >= 1)."""
    num_decode_tokens: U32
    """Output lengths (uint32, >= 1)."""
    hash_offsets: U64 | None = None
    """uint64, length ``len(self) + 1``, starting at 0 and ending at ``len(hash_ids)``."""
    hash_ids: U64 | None = None
    """uint64 block ids, all requests' ids one after the other. A request's ids may reach
    past its prompt to cover its output: a conversation turn's output is repeated in the next
    turn's prompt, and those ids make the two share tokens."""
    session_ids: U64 | None = None
    """uint64 (< 2**63): the session each request is a turn of, ``NO_SESSION`` for one on
    its own (optional, with ``delay_s``). A later turn of a session is sent ``delay_s``
    after the previous turn completes, and never before its ``arrived_at`` (see
    docs/workloads.md, Sessions)."""
    delay_s: F64 | None = None
    """float64 >= 0: think / tool time before the turn (optional, with ``session_ids``)."""
    lora_ids: I64 | None = None
    """int64, one per request: its LoRA adapter (>= 0), or -1 for the base model."""

    def __post_init__(self) -> None:
        n = _check_array("arrived_at", self.arrived_at, np.float64, None)
        _check_array("num_prefill_tokens", self.num_prefill_tokens, np.uint32, n)
        _check_array("num_decode_tokens", self.num_decode_tokens, np.uint32, n)
        if n and not np.isfinite(self.arrived_at).all():
            raise _chunk_error("arrived_at", "must be finite")
        if n > 1 and (np.diff(self.arrived_at) < 0).any():
            raise _chunk_error("arrived_at", "must be non-decreasing")
        for name in ("num_prefill_tokens", "num_decode_tokens"):
            if n and getattr(self, name).min() == 0:
                raise _chunk_error(name, "every request needs >= 1 token")
        if (self.hash_offsets is None) != (self.hash_ids is None):
            raise _chunk_error("hash_offsets", "hash_offsets and hash_ids go together")
        if (self.session_ids is None) != (self.delay_s is None):
            raise _chunk_error("session_ids", "session_ids and delay_s go together")
        if self.session_ids is not None and self.delay_s is not None:
            _check_array("session_ids", self.session_ids, np.uint64, n)
            _check_array("delay_s", self.delay_s, np.float64, n)
            ids = self.session_ids
            if n and ((ids >= 2**63) & (ids != NO_SESSION)).any():
                raise _chunk_error("session_ids", "must be < 2**63 (or NO_SESSION)")
            if n and not (np.isfinite(self.delay_s).all() and self.delay_s.min() >= 0):
                raise _chunk_error("delay_s", "must be finite and >= 0")
        if self.hash_offsets is not None and self.hash_ids is not None:
            _check_array("hash_offsets", self.hash_offsets, np.uint64, n + 1)
            m = _check_array("hash_ids", self.hash_ids, np.uint64, None)
            offsets = self.hash_offsets
            if offsets[0] != 0 or offsets[-1] != m or (offsets[1:] < offsets[:-1]).any():
                raise _chunk_error(
                    "hash_offsets", f"must rise from 0 to len(hash_ids)={m} without going back"
                )
        if self.lora_ids is not None:
            _check_array("lora_ids", self.lora_ids, np.int64, n)
            if n and self.lora_ids.min() < -1:
                raise _chunk_error("lora_ids", "must be adapter ids >= 0 or -1 (base model)")

    def __len__(self) -> int:
        return len(self.arrived_at)

    def _slice(self, start: int, stop: int) -> RequestChunk:
        """Requests ``[start, stop)``; the id arrays are views, the offsets are rebased."""
        offsets = ids = None
        if self.hash_offsets is not None and self.hash_ids is not None:
            span = self.hash_offsets[start : stop + 1]
            offsets = span - span[0]
            ids = self.hash_ids[int(span[0]) : int(span[-1])]
        return RequestChunk(
            self.arrived_at[start:stop],
            self.num_prefill_tokens[start:stop],
            self.num_decode_tokens[start:stop],
            offsets,
            ids,
            None if self.session_ids is None else self.session_ids[start:stop],
            None if self.delay_s is None else self.delay_s[start:stop],
            lora_ids=None if self.lora_ids is None else self.lora_ids[start:stop],
        )


class Workload(Protocol):
    """What the simulator consumes: requests in arrival order, streamed in chunks."""

    @property
    def hash_block_size(self) -> int | None:
        """Tokens per hash id; ``None`` when the chunks carry no prefix identity."""
        ...

    def chunks(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[RequestChunk]:
        """The requests in chunks of exactly ``chunk_size`` (the last may be shorter).

        Each call starts again from the first request. Memory is bounded by the chunk size,
        not by the workload's length.
        """
        ...

    def describe(self) -> dict[str, object]:
        """A JSON-able description for run summaries; ``load_workload`` accepts it back."""
        ...


@dataclass(frozen=True, kw_only=True)
class WorkloadStats:
    """Totals of one streaming pass over a workload (see ``summarize``)."""

    num_requests: int
    duration_s: float
    """Last arrival minus first arrival."""
    mean_qps: float | None
    """``(num_requests - 1) / duration_s``; ``None`` when ``duration_s`` is 0."""
    mean_prefill_tokens: float
    mean_decode_tokens: float
    max_prefill_tokens: int
    max_decode_tokens: int
    num_hash_ids: int | None
    """Total hash ids over all requests; ``None`` without prefix identity."""


def summarize(workload: Workload, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> WorkloadStats:
    """Stream the whole workload once and total it, holding one chunk at a time.

    Raises:
        TraceError: from a trace reader, for the first bad row.
        InputError: the workload produced no requests.
    """
    n = 0
    first = last = 0.0
    prefill = decode = 0
    max_prefill = max_decode = 0
    num_ids: int | None = None
    for chunk in workload.chunks(chunk_size):
        if not len(chunk):
            continue
        if n == 0:
            first = float(chunk.arrived_at[0])
        last = float(chunk.arrived_at[-1])
        n += len(chunk)
        prefill += int(chunk.num_prefill_tokens.sum(dtype=np.uint64))
        decode += int(chunk.num_decode_tokens.sum(dtype=np.uint64))
        max_prefill = max(max_prefill, int(chunk.num_prefill_tokens.max()))
        max_decode = max(max_decode, int(chunk.num_decode_tokens.max()))
        if chunk.hash_ids is not None:
            num_ids = (num_ids or 0) + len(chunk.hash_ids)
    if n == 0:
        raise InputError("the workload produced no requests", field="workload")
    duration = last - first
    return WorkloadStats(
        num_requests=n,
        duration_s=duration,
        mean_qps=(n - 1) / duration if duration > 0 else None,
        mean_prefill_tokens=prefill / n,
        mean_decode_tokens=decode / n,
        max_prefill_tokens=max_prefill,
        max_decode_tokens=max_decode,
        num_hash_ids=num_ids,
    )


def check_chunk_size(chunk_size: object) -> int:
    """``chunk_size`` must be an int >= 1 (``InputError`` otherwise)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise InputError(
            f"chunk_size must be an int >= 1, got {chunk_size!r}",
            field="chunk_size",
            value=repr(chunk_size),
        )
    return chunk_size


def rechunk(pieces: Iterable[RequestChunk], chunk_size: int) -> Iterator[RequestChunk]:
    """Regroup a stream of chunks of any sizes into chunks of exactly ``chunk_size`` (the
    last may be shorter). Each input request is copied at most twice."""
    pending: list[RequestChunk] = []
    have = 0
    for piece in pieces:
        if not len(piece):
            continue
        pending.append(piece)
        have += len(piece)
        if have < chunk_size:
            continue
        merged = concat(pending)
        start = 0
        while have - start >= chunk_size:
            yield merged._slice(start, start + chunk_size)
            start += chunk_size
        pending = [merged._slice(start, have)] if start < have else []
        have -= start
    if have:
        yield concat(pending)


def concat(chunks: list[RequestChunk]) -> RequestChunk:
    """One chunk holding ``chunks`` in order (all with prefix identity, or none)."""
    if len(chunks) == 1:
        return chunks[0]
    offsets = ids = None
    if chunks[0].hash_offsets is not None:
        parts = [np.zeros(1, dtype=np.uint64)]
        base = 0
        id_parts: list[U64] = []
        for c in chunks:
            if c.hash_offsets is None or c.hash_ids is None:
                raise _chunk_error("hash_offsets", "cannot mix chunks with and without ids")
            parts.append(c.hash_offsets[1:] + np.uint64(base))
            id_parts.append(c.hash_ids)
            base += len(c.hash_ids)
        offsets = np.concatenate(parts)
        ids = np.concatenate(id_parts)
    sessions = delays = None
    if chunks[0].session_ids is not None:
        session_parts, delay_parts = [], []
        for c in chunks:
            if c.session_ids is None or c.delay_s is None:
                raise _chunk_error("session_ids", "cannot mix chunks with and without sessions")
            session_parts.append(c.session_ids)
            delay_parts.append(c.delay_s)
        sessions, delays = np.concatenate(session_parts), np.concatenate(delay_parts)
    return RequestChunk(
        np.concatenate([c.arrived_at for c in chunks]),
        np.concatenate([c.num_prefill_tokens for c in chunks]),
        np.concatenate([c.num_decode_tokens for c in chunks]),
        offsets,
        ids,
        sessions,
        delays,
        lora_ids=_concat_lora_ids(chunks),
    )


def _concat_lora_ids(chunks: list[RequestChunk]) -> I64 | None:
    """The chunks' adapter ids one after the other (all chunks with them, or none)."""
    parts = [c.lora_ids for c in chunks if c.lora_ids is not None]
    if not parts:
        return None
    if len(parts) != len(chunks):
        raise _chunk_error("lora_ids", "cannot mix chunks with and without adapter ids")
    return np.concatenate(parts)


def _check_array(name: str, array: object, dtype: type, length: int | None) -> int:
    if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != 1:
        got = (
            f"{array.dtype} array of shape {array.shape}"
            if isinstance(array, np.ndarray)
            else type(array).__name__
        )
        raise _chunk_error(name, f"must be a 1-D {np.dtype(dtype).name} array, got {got}")
    if length is not None and len(array) != length:
        raise _chunk_error(name, f"must have length {length}, got {len(array)}")
    return len(array)


def _chunk_error(name: str, reason: str) -> InputError:
    return InputError(f"RequestChunk.{name}: {reason}", field=name)
