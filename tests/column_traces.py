"""Helpers of the ``format = "columns"`` tests: BurstGPT-shaped files written on the fly
(no real data in the repository) and small readers of them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tokenyard.errors import ConfigError
from tokenyard.workload import ColumnTrace, RequestChunk, TraceError, load_workload
from tokenyard.workload.chunk import concat

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"

# BurstGPT's layout (columns and kinds of values), with made-up rows.
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BURST_ROWS = [
    "5,ChatGPT,472,18,490,Conversation log",
    "45,GPT-4,1087,0,1087,Conversation log",
    "118,ChatGPT,417,10,427,API log",
    "130,ChatGPT,1360,0,1360,Conversation log",
    "131,GPT-4,88,41,129,API log",
    "140.5,ChatGPT,20,7,27,Conversation log",
]
BURST_COLUMNS = {
    "time": "Timestamp",
    "time_unit": "s",
    "input_tokens": "Request tokens",
    "output_tokens": "Response tokens",
}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as out:
            out.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def burst(tmp_path: Path, name: str = "burstgpt.csv") -> Path:
    return write(tmp_path, name, BURST_HEADER + "".join(row + "\n" for row in BURST_ROWS))


def jsonl(tmp_path: Path, rows: list[object], name: str = "log.jsonl") -> Path:
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    return write(tmp_path, name, "".join(line + "\n" for line in lines))


def spec(path: Path, columns: dict[str, str] | None = None, **options: object) -> dict[str, Any]:
    return {
        "kind": "trace",
        "format": "columns",
        "path": str(path),
        "columns": BURST_COLUMNS if columns is None else columns,
        **options,
    }


def load(path: Path, columns: dict[str, str] | None = None, **options: object) -> ColumnTrace:
    reader = load_workload(spec(path, columns, **options))
    assert isinstance(reader, ColumnTrace)
    return reader


def read(reader: Any, chunk_size: int = 65536) -> RequestChunk:
    return concat(list(reader.chunks(chunk_size)))


def trace_error(reader: ColumnTrace) -> TraceError:
    with pytest.raises(TraceError) as caught:
        reader.validate()
    return caught.value


def config_error(spec: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_workload(spec)
    return caught.value
