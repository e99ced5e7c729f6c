"""Session traces: conversations and agent runs recorded turn by turn, streamed from JSONL
(a ``.gz`` file is read through ``gzip``).

- ``SessionTrace`` (format ``"sessions"``), tokenyard's documented format: one object per
  turn with ``session_id`` (string or integer), ``timestamp`` (seconds) and/or ``delay``
  (think time after the previous turn completes, seconds), ``input_length`` (the turn's
  whole prompt), ``output_length`` and optionally ``hash_ids``.
- ``BailianTrace`` (format ``"bailian"``): Alibaba's public Qwen-Bailian usage traces, one
  object per request with ``chat_id``, ``parent_chat_id`` (-1 for a first turn),
  ``timestamp`` (seconds), ``input_length``, ``output_length``, ``turn`` and ``hash_ids``
  (16-token blocks). A session is the chain of chats from a root.

A turn with a timestamp is sent at that time, or when its previous turn completes if that is
later; a turn with a delay is sent that long after its previous turn completes. Times are
shifted so that the first turn arrives at 0 and scaled by ``time_scale``. The readers keep
one small entry per session (its id and start), and the Bailian reader one per chat (its
root), so memory grows with the trace's sessions (or chats), not with the chunk size.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar, final

import numpy as np

from tokenyard._checks import check_int, check_number
from tokenyard.workload.chunk import (
    DEFAULT_CHUNK_SIZE,
    MAX_REQUESTS,
    RequestChunk,
    check_chunk_size,
)
from tokenyard.workload.errors import TraceError
from tokenyard.workload.traces import _count, check_trace_path, json_lines

__all__ = ["BailianTrace", "SessionTrace"]

#: Ids given to turns whose session has no ids of its own start here (far from trace ids).
_SYNTHETIC_IDS = 1 << 62


@dataclass
class _Turn:
    at: float
    prompt: int
    output: int
    session: int
    delay: float
    ids: list[int]


@dataclass
class _Session:
    number: int
    start: float
    #: Without trace ids: the conversation's id run, and the context the last turn left.
    first_id: int = 0
    context: int = 0


@dataclass(frozen=True)
class _SessionReader(ABC):
    """Options shared by the session readers."""

    path: str | os.PathLike[str]
    _: KW_ONLY
    time_scale: float = 1.0
    """Multiplies every time and delay (2.0 = half the rate)."""
    limit: int | None = None
    """Read at most this many turns."""
    hash_block_size: int = 16
    """Tokens per hash id (the trace's, or the ids generated for a trace without any)."""

    format: ClassVar[str]

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_trace_path(owner, self.path)
        check_number(owner, "time_scale", self.time_scale, low=0.0, low_open=True)
        if self.limit is not None:
            check_int(owner, "limit", self.limit, low=1, high=MAX_REQUESTS)
        check_int(owner, "hash_block_size", self.hash_block_size, low=1, high=1 << 24)

    @property
    def _name(self) -> str:
        return os.fspath(self.path)

    def describe(self) -> dict[str, object]:
        """The config as a mapping ``load_workload`` accepts."""
        found: dict[str, object] = {
            "kind": "trace",
            "format": self.format,
            "path": self._name,
            "time_scale": self.time_scale,
            "hash_block_size": self.hash_block_size,
        }
        if self.limit is not None:
            found["limit"] = self.limit
        return found

    def chunks(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[RequestChunk]:
        """The turns in file order, in chunks of ``chunk_size``.

        Raises:
            TraceError: the first bad row (path, line and field), or an empty trace.
            InputError: ``chunk_size`` is not an int >= 1.
        """
        size = check_chunk_size(chunk_size)
        batch: list[_Turn] = []
        count = 0
        for turn in self._turns():
            batch.append(turn)
            count += 1
            if len(batch) == size:
                yield _chunk(batch)
                batch = []
            if self.limit is not None and count >= self.limit:
                break
        if count == 0:
            raise TraceError("empty trace: no requests", path=self._name)
        if batch:
            yield _chunk(batch)

    def _rows(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for line, row in json_lines(self._name):
            if not isinstance(row, dict):
                raise TraceError("each line must be a JSON object", path=self._name, line=line)
            yield line, row

    @abstractmethod
    def _turns(self) -> Iterator[_Turn]:
        """Every turn of the file, checked, in file order (one per format)."""

    def _error(self, line: int, field: str, problem: str, value: object) -> TraceError:
        return TraceError(problem, path=self._name, line=line, field=field, value=repr(value))

    def _int(self, row: dict[str, Any], line: int, field: str, low: int) -> int:
        if field not in row:
            raise self._error(line, field, "missing", None)
        return _count(self._name, line, field, row[field], low)

    def _seconds(self, row: dict[str, Any], line: int, field: str) -> float:
        value = row[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e12:
            raise self._error(
                line, field, f"must be a number of seconds >= 0, got {value!r}", value
            )
        return float(value)

    def _ids(self, row: dict[str, Any], line: int, prompt: int, output: int) -> list[int] | None:
        if row.get("hash_ids") is None:
            return None
        ids = row["hash_ids"]
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < _SYNTHETIC_IDS for i in ids
        ):
            raise self._error(line, "hash_ids", "must be a list of integers in [0, 2**62)", ids)
        most = -(-(prompt + output) // self.hash_block_size)
        if len(ids) > most:
            raise self._error(
                line,
                "hash_ids",
                f"{len(ids)} ids for {prompt} + {output} tokens: at most {most} blocks of "
                f"{self.hash_block_size}",
                len(ids),
            )
        return ids

    def _turn_ids(
        self, row: dict[str, Any], line: int, session: _Session, runs: _IdRuns
    ) -> list[int]:
        """The trace's ids, or else the conversation's: one run of ids per session, covering
        each turn's prompt and output; a turn whose prompt is shorter than the previous
        turn's context (a truncated history) starts a new run."""
        prompt, output = int(row["input_length"]), int(row["output_length"])
        ids = self._ids(row, line, prompt, output)
        if ids is not None:
            return ids
        if session.context == 0 or prompt < session.context:
            session.first_id = runs.next_run()
        session.context = prompt + output
        num_ids = -(-(prompt + output) // self.hash_block_size)
        return list(range(session.first_id, session.first_id + num_ids))


class _IdRuns:
    """Hands out disjoint runs of generated ids (each long enough for any conversation)."""

    def __init__(self) -> None:
        self.next_id = _SYNTHETIC_IDS

    def next_run(self) -> int:
        first = self.next_id
        self.next_id += 1 << 24
        return first


@final
@dataclass(frozen=True)
class SessionTrace(_SessionReader):
    """tokenyard's session JSONL (see the module docstring and docs/workloads.md).

    Raises:
        ConfigError: a bad option or a missing file.
    """

    format: ClassVar[str] = "sessions"

    def _turns(self) -> Iterator[_Turn]:
        sessions: dict[object, _Session] = {}
        runs = _IdRuns()
        origin: float | None = None
        last = 0.0
        for line, row in self._rows():
            key = row.get("session_id")
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise self._error(
                    line, "session_id", f"must be a string or integer, got {key!r}", key
                )
            prompt = self._int(row, line, "input_length", 1)
            output = self._int(row, line, "output_length", 1)
            stamp = self._seconds(row, line, "timestamp") if "timestamp" in row else None
            delay = self._seconds(row, line, "delay") if "delay" in row else 0.0
            session = sessions.get(key)
            if session is None and stamp is None:
                raise self._error(line, "timestamp", "a session's first turn needs one", None)
            if stamp is None:
                # Only a lower bound: the turn is sent `delay` after the previous completes.
                at = last
            else:
                origin = stamp if origin is None else origin
                at = (stamp - origin) * self.time_scale
                if at < last:
                    raise self._error(
                        line, "timestamp", "timestamps must not decrease down the file", stamp
                    )
            last = at
            if session is None:
                session = sessions[key] = _Session(len(sessions), at)
            ids = self._turn_ids(row, line, session, runs)
            yield _Turn(at, prompt, output, session.number, delay * self.time_scale, ids)


@final
@dataclass(frozen=True)
class BailianTrace(_SessionReader):
    """Alibaba's Qwen-Bailian usage trace (see the module docstring).

    Raises:
        ConfigError: a bad option or a missing file.
    """

    format: ClassVar[str] = "bailian"

    def _turns(self) -> Iterator[_Turn]:
        root_of: dict[int, int] = {}
        sessions: dict[int, _Session] = {}
        runs = _IdRuns()
        origin: float | None = None
        last = 0.0
        for line, row in self._rows():
            chat = self._int(row, line, "chat_id", 0)
            parent = row.get("parent_chat_id", -1)
            if isinstance(parent, bool) or not isinstance(parent, int):
                raise self._error(
                    line, "parent_chat_id", f"must be an integer, got {parent!r}", parent
                )
            if "timestamp" not in row:
                raise self._error(line, "timestamp", "missing", None)
            stamp = self._seconds(row, line, "timestamp")
            origin = stamp if origin is None else origin
            at = (stamp - origin) * self.time_scale
            if at < last:
                raise self._error(line, "timestamp", "timestamps must not decrease", stamp)
            last = at
            prompt = self._int(row, line, "input_length", 1)
            output = self._int(row, line, "output_length", 1)
            # A parent outside the trace's window: the chat starts a session of its own.
            root = root_of.get(parent, chat) if parent >= 0 else chat
            root_of[chat] = root
            session = sessions.get(root)
            if session is None:
                session = sessions[root] = _Session(len(sessions), at)
            ids = self._turn_ids(row, line, session, runs)
            yield _Turn(at, prompt, output, session.number, 0.0, ids)


def _chunk(turns: list[_Turn]) -> RequestChunk:
    offsets = np.zeros(len(turns) + 1, dtype=np.uint64)
    np.cumsum([len(t.ids) for t in turns], out=offsets[1:])
    return RequestChunk(
        np.array([t.at for t in turns], dtype=np.float64),
        np.array([t.prompt for t in turns], dtype=np.uint32),
        np.array([t.output for t in turns], dtype=np.uint32),
        offsets,
        np.array([i for t in turns for i in t.ids], dtype=np.uint64),
        np.array([t.session for t in turns], dtype=np.uint64),
        np.array([t.delay for t in turns], dtype=np.float64),
    )
