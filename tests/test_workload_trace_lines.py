"""Every line-oriented trace reader names the exact line of a bad line, and refuses a line
longer than ``MAX_LINE_CHARS`` having read no more than about that much of it (issue 32,
items 4 and 7): Mooncake, Vidur, Azure, session and Bailian traces, and ``ColumnTrace``'s
CSV and JSON lines, through the fast paths and the row-by-row readers alike."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tokenyard.workload import (
    AzureTrace,
    BailianTrace,
    ColumnTrace,
    MooncakeTrace,
    SessionTrace,
    TraceColumns,
    TraceError,
    VidurTrace,
    csv_columns,
)
from tokenyard.workload.trace_rows import MAX_LINE_CHARS
from tokenyard.workload.traces import _TraceReader

#: Where a format puts a free-text cell: the text before and after it on its line.
Row = Callable[[int, bytes], bytes]


def _json_row(fields: Callable[[int], dict[str, object]]) -> Row:
    def row(i: int, note: bytes) -> bytes:
        head = json.dumps(fields(i))[:-1].encode()
        return head + b', "note": "' + note + b'"}'

    return row


def _csv_row(fields: Callable[[int], str]) -> Row:
    return lambda i, note: fields(i).encode() + b"," + note


def _clock(i: int) -> str:
    return f"2023-11-16 10:{i // 60:02d}:{i % 60:02d}.5"


#: format → (file suffix, header line or None, row, reader of a path)
FORMATS: dict[str, tuple[str, bytes | None, Row, Callable[[Path], object]]] = {
    "mooncake": (
        ".jsonl",
        None,
        _json_row(lambda i: {"timestamp": i, "input_length": 4, "output_length": 2}),
        MooncakeTrace,
    ),
    "sessions": (
        ".jsonl",
        None,
        _json_row(
            lambda i: {"session_id": i, "timestamp": i, "input_length": 4, "output_length": 2}
        ),
        SessionTrace,
    ),
    "bailian": (
        ".jsonl",
        None,
        _json_row(
            lambda i: {
                "chat_id": i,
                "parent_chat_id": -1,
                "timestamp": i,
                "input_length": 4,
                "output_length": 2,
                "turn": 1,
            }
        ),
        BailianTrace,
    ),
    "vidur": (
        ".csv",
        b"arrived_at,num_prefill_tokens,num_decode_tokens,note",
        _csv_row(lambda i: f"{i},4,2"),
        VidurTrace,
    ),
    "azure": (
        ".csv",
        b"TIMESTAMP,ContextTokens,GeneratedTokens,note",
        _csv_row(lambda i: f"{_clock(i)},4,2"),
        AzureTrace,
    ),
    "columns-csv": (
        ".csv",
        b"ts,prompt,answer,note",
        _csv_row(lambda i: f"{i},4,2"),
        lambda path: ColumnTrace(
            path,
            columns=TraceColumns(
                time="ts", time_unit="s", input_tokens="prompt", output_tokens="answer"
            ),
        ),
    ),
    "columns-jsonl": (
        ".jsonl",
        None,
        _json_row(lambda i: {"ts": i, "prompt": 4, "answer": 2}),
        lambda path: ColumnTrace(
            path,
            columns=TraceColumns(
                time="ts", time_unit="s", input_tokens="prompt", output_tokens="answer"
            ),
        ),
    ),
}


def _lines(name: str, num_lines: int, odd_line: int, odd: Iterator[bytes]) -> Iterator[bytes]:
    """The file's bytes, line by line (the header counts), with ``odd``'s pieces as the
    note of line ``odd_line``."""
    _, header, row, _ = FORMATS[name]
    first = 1
    if header is not None:
        yield header + b"\n"
        first = 2
    for line in range(first, num_lines + 1):
        if line == odd_line:
            pieces = list(row(line, b"\0").split(b"\0"))
            yield pieces[0]
            yield from odd
            yield pieces[1] + b"\n"
        else:
            yield row(line, b"fine") + b"\n"


def _write(tmp_path: Path, name: str, pieces: Iterator[bytes], gz: bool) -> Path:
    """The pieces as the format's file; gzipped, as one gzip member each (a reader reads
    their concatenation), so that a gigabyte of one repeated piece costs nothing to write."""
    suffix = FORMATS[name][0]
    path = tmp_path / f"{name}{suffix}{'.gz' if gz else ''}"
    members: dict[bytes, bytes] = {}
    with path.open("wb") as out:
        for piece in pieces:
            if gz:
                if piece not in members:
                    members[piece] = gzip.compress(piece, compresslevel=1)
                piece = members[piece]
            out.write(piece)
    return path


def _outcomes(name: str, path: Path) -> Iterator[TraceError]:
    """The error of each way the format's reader reads ``path``: its chunks (the fast path,
    where it has one) and, for the column readers, the row-by-row pipeline."""
    reader = FORMATS[name][3](path)
    ways: list[Callable[[], object]] = [lambda: list(reader.chunks(64))]  # type: ignore[attr-defined]
    if isinstance(reader, _TraceReader):
        ways.append(lambda: list(_TraceReader._chunks(reader, 64)))
    for way in ways:
        with pytest.raises(TraceError) as caught:
            way()
        yield caught.value


#: Each format, and again each CSV format through pyarrow's fast path (which takes a trace
#: of 1 MB or more, here any).
CASES = [(name, False) for name in FORMATS] + [
    (name, True) for name, (suffix, *_) in FORMATS.items() if suffix == ".csv"
]


def _case_id(case: tuple[str, bool]) -> str:
    return f"{case[0]}-pyarrow" if case[1] else case[0]


@pytest.fixture(params=CASES, ids=_case_id)
def name(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    name, fast = request.param
    if fast:
        monkeypatch.setattr(csv_columns, "MIN_BYTES", 0)
    return str(name)


@pytest.mark.parametrize("bad_line", [6, 3001])
def test_text_that_is_not_utf8_is_reported_on_its_line(
    tmp_path: Path, name: str, bad_line: int
) -> None:
    # A Latin-1 "é" in a cell the readers otherwise ignore, far from the end of the file.
    path = _write(tmp_path, name, _lines(name, 5000, bad_line, iter([b"caf\xe9"])), gz=False)
    for error in _outcomes(name, path):
        assert error.line == bad_line
        assert str(error).startswith(f"{path}:{bad_line}: not UTF-8 text: ")
        assert "invalid continuation byte at byte" in str(error)


def test_an_enormous_line_is_refused_having_read_about_the_bound(tmp_path: Path, name: str) -> None:
    # Line 3 is 1 GiB (128 times the bound) in a 1 MB .gz file: refused without holding
    # more than a few times the bound in memory.
    block = b"a" * (1 << 20)
    path = _write(tmp_path, name, _lines(name, 4, 3, iter([block] * 1024)), gz=True)
    list(_outcomes(name, path))  # once untraced: the readers' lazy imports (pyarrow's)
    tracemalloc.start()
    try:
        errors = list(_outcomes(name, path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for error in errors:
        assert error.line == 3
        assert str(error) == (
            f"{path}:3: line longer than {MAX_LINE_CHARS} characters, the most a trace line "
            "may have"
        )
    assert peak < 8 * MAX_LINE_CHARS


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_a_line_of_exactly_the_bound_is_read(tmp_path: Path, end: bytes) -> None:
    # Line 1 has MAX_LINE_CHARS characters before its terminator, line 3 one more.
    row = FORMATS["mooncake"][2]
    short = row(1, b"")
    at_bound = row(1, b"a" * (MAX_LINE_CHARS - len(short)))
    assert len(at_bound) == MAX_LINE_CHARS
    path = tmp_path / "bound.jsonl"
    path.write_bytes(at_bound + end + row(2, b"") + end)
    reader = MooncakeTrace(path)
    assert reader.validate().num_requests == 2
    assert sum(map(len, _TraceReader._chunks(reader, 64))) == 2
    over = row(3, b"a" * (MAX_LINE_CHARS + 1 - len(row(3, b""))))
    assert len(over) == MAX_LINE_CHARS + 1
    path.write_bytes(at_bound + end + row(2, b"") + end + over + end)
    for error in _outcomes("mooncake", path):
        assert error.line == 3
