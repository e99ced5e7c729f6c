"""Trace readers (Vidur CSV, Mooncake JSONL, Azure CSV) and the committed sample traces."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from tokenyard.errors import ConfigError, InputError
from tokenyard.workload import (
    AzureTrace,
    MooncakeTrace,
    RequestChunk,
    TraceError,
    VidurTrace,
    load_workload,
    sample_path,
)
from tokenyard.workload.chunk import concat
from tokenyard.workload.make_samples import NUM_REQUESTS, main, write_samples

Reader = type[VidurTrace] | type[MooncakeTrace] | type[AzureTrace]
READERS: dict[str, Reader] = {"vidur": VidurTrace, "mooncake": MooncakeTrace, "azure": AzureTrace}

VIDUR_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def vidur(tmp_path: Path, rows: list[str], header: str = VIDUR_HEADER) -> Path:
    return write(tmp_path, header + "".join(row + "\n" for row in rows))


def mooncake(tmp_path: Path, rows: Sequence[object]) -> Path:
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    return write(tmp_path, "".join(line + "\n" for line in lines), "trace.jsonl")


def read(reader: VidurTrace | MooncakeTrace | AzureTrace, chunk_size: int = 65536) -> RequestChunk:
    return concat(list(reader.chunks(chunk_size)))


def trace_error(reader: VidurTrace | MooncakeTrace | AzureTrace) -> TraceError:
    with pytest.raises(TraceError) as caught:
        reader.validate()
    return caught.value


# --- the samples ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", READERS)
def test_sample_reads(fmt: str) -> None:
    reader = READERS[fmt](sample_path(fmt))
    chunk = read(reader)
    assert len(chunk) == NUM_REQUESTS
    assert chunk.arrived_at[0] == 0.0
    assert (np.diff(chunk.arrived_at) >= 0).all()
    assert chunk.num_prefill_tokens.min() >= 1
    assert chunk.num_decode_tokens.min() >= 1
    stats = reader.validate()
    assert stats.num_requests == NUM_REQUESTS
    assert stats.duration_s == pytest.approx(float(chunk.arrived_at[-1]))


def test_mooncake_sample_shares_prefix_blocks() -> None:
    reader = MooncakeTrace(sample_path("mooncake"))
    assert reader.hash_block_size == 512
    chunk = read(reader)
    assert chunk.hash_offsets is not None
    assert chunk.hash_ids is not None
    blocks = np.diff(chunk.hash_offsets.astype(np.int64))
    np.testing.assert_array_equal(blocks, -(-chunk.num_prefill_tokens.astype(np.int64) // 512))
    first_ids = chunk.hash_ids[chunk.hash_offsets[:-1].astype(np.int64)]
    _, counts = np.unique(first_ids, return_counts=True)
    assert counts.max() > 20  # system prompts: many requests start with the same block
    assert (counts == 1).sum() > 40  # and many start with their own


def test_azure_sample_crosses_midnight() -> None:
    text = sample_path("azure").read_text().splitlines()
    assert text[1].startswith("2023-11-16 23:59:20.6805900")
    assert text[-1].startswith("2023-11-17 00:00:")
    last = read(AzureTrace(sample_path("azure"))).arrived_at[-1]
    seconds = float(text[-1][17:27])  # "SS.fffffff" after midnight
    assert last == pytest.approx(60 - 20.6805900 + seconds, abs=1e-9)


def test_committed_samples_equal_a_fresh_generation(tmp_path: Path) -> None:
    for path in write_samples(tmp_path):
        committed = sample_path(path.name.split("_")[0])
        assert committed.name == path.name
        assert path.read_bytes() == committed.read_bytes(), (
            f"{committed} is stale: run python -m tokenyard.workload.make_samples "
            f"{committed.parent}"
        )


def test_make_samples_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "azure_sample.csv",
        "mooncake_sample.jsonl",
        "vidur_sample.csv",
    ]
    assert "vidur_sample.csv" in capsys.readouterr().out
    done = subprocess.run(
        [sys.executable, "-m", "tokenyard.workload.make_samples", str(tmp_path / "cli")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.count("\n") == 3


@pytest.mark.parametrize("fmt", READERS)
def test_readers_do_not_depend_on_chunk_size(fmt: str) -> None:
    reader = READERS[fmt](sample_path(fmt))
    reference = read(reader)
    for chunk_size in (1, 7, 199, 200):
        chunks = list(reader.chunks(chunk_size))
        assert all(len(c) == chunk_size for c in chunks[:-1])
        again = concat(chunks)
        np.testing.assert_array_equal(again.arrived_at, reference.arrived_at)
        np.testing.assert_array_equal(again.num_decode_tokens, reference.num_decode_tokens)
        if reference.hash_ids is not None:
            np.testing.assert_array_equal(again.hash_offsets, reference.hash_offsets)
            np.testing.assert_array_equal(again.hash_ids, reference.hash_ids)


@pytest.mark.parametrize("fmt", READERS)
def test_describe_round_trips(fmt: str) -> None:
    reader = READERS[fmt](sample_path(fmt), start_offset_s=1.5, limit=20, zero_output="skip")
    described = reader.describe()
    json.dumps(described)
    assert described["kind"] == "trace"
    assert described["format"] == fmt
    rebuilt = load_workload(described)
    assert isinstance(rebuilt, READERS[fmt])
    assert rebuilt.describe() == described


# --- hand-written files ---------------------------------------------------------------------


def test_vidur_reads_columns_by_name_and_shifts_to_zero(tmp_path: Path) -> None:
    path = vidur(
        tmp_path,
        ["100,10.5,20,x", "200,11.0,1,y", "", "300,12.25,5,z"],
        header="num_prefill_tokens,arrived_at,num_decode_tokens,note\n",
    )
    reader = VidurTrace(path)
    assert reader.hash_block_size is None
    chunk = read(reader)
    assert chunk.arrived_at.tolist() == [0.0, 0.5, 1.75]
    assert chunk.num_prefill_tokens.tolist() == [100, 200, 300]
    assert chunk.num_decode_tokens.tolist() == [20, 1, 5]
    assert chunk.hash_offsets is None
    assert chunk.hash_ids is None


def test_vidur_accepts_integral_floats(tmp_path: Path) -> None:
    chunk = read(VidurTrace(vidur(tmp_path, ["0,12.0,3.0", "1e-3,7,1"])))
    assert chunk.num_prefill_tokens.tolist() == [12, 7]
    assert chunk.arrived_at.tolist() == [0.0, 0.001]


def test_mooncake_milliseconds_and_hash_ids(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 1250, "input_length": 1025, "output_length": 6, "hash_ids": [1, 2, 9]},
        "",
        {"timestamp": 4000, "input_length": 10, "output_length": 7, "session": "ignored"},
    ]
    chunk = read(MooncakeTrace(mooncake(tmp_path, rows)))
    assert chunk.arrived_at.tolist() == [0.0, 0.25, 3.0]
    assert chunk.num_prefill_tokens.tolist() == [1024, 1025, 10]
    assert chunk.hash_offsets is not None
    assert chunk.hash_ids is not None
    assert chunk.hash_offsets.tolist() == [0, 2, 5, 5]  # no hash_ids: no prefix identity
    assert chunk.hash_ids.tolist() == [1, 2, 1, 2, 9]


def test_mooncake_hash_block_size_option(tmp_path: Path) -> None:
    path = mooncake(
        tmp_path, [{"timestamp": 0, "input_length": 40, "output_length": 1, "hash_ids": [4, 5, 6]}]
    )
    assert len(read(MooncakeTrace(path, hash_block_size=16))) == 1
    error = trace_error(MooncakeTrace(path, hash_block_size=32))
    assert error.field == "hash_ids"
    assert "3 ids for a prompt of 2 blocks or fewer" in str(error)


def test_azure_datetimes(tmp_path: Path) -> None:
    rows = [
        "2023-11-16 23:59:59.9999999,10,2",
        "2023-11-17 00:00:00.0000000,11,3",
        "2023-11-17T00:00:00.5,12,4",
        "2023-11-17 00:00:01Z,13,5",
        "2023-11-17 01:00:02+01:00,14,6",
        "2023-11-17 00:00:03.25-00:00,15,7",
    ]
    path = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows))
    chunk = read(AzureTrace(path))
    expected = [0.0, 1e-7, 0.5000001, 1.0000001, 2.0000001, 3.2500001]
    np.testing.assert_allclose(chunk.arrived_at, expected, rtol=0, atol=1e-12)
    assert chunk.num_prefill_tokens.tolist() == [10, 11, 12, 13, 14, 15]


def test_gzip_traces_are_read(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv.gz"
    with gzip.open(path, "wb") as out:
        out.write(sample_path("vidur").read_bytes())
    np.testing.assert_array_equal(
        read(VidurTrace(path)).arrived_at, read(VidurTrace(sample_path("vidur"))).arrived_at
    )


# --- options --------------------------------------------------------------------------------


def five_rows(tmp_path: Path) -> Path:
    return vidur(tmp_path, [f"{100 + t},{10 + t},{1 + t}" for t in (0, 1, 2, 4, 8)])


def test_time_scale_multiplies_gaps(tmp_path: Path) -> None:
    chunk = read(VidurTrace(five_rows(tmp_path), time_scale=0.5))
    assert chunk.arrived_at.tolist() == [0.0, 0.5, 1.0, 2.0, 4.0]


def test_target_qps_sets_the_mean_rate(tmp_path: Path) -> None:
    chunk = read(VidurTrace(five_rows(tmp_path), target_qps=2.0))
    # 5 requests over 8 s = 0.5 requests/s; gaps shrink 4 times to reach 2 requests/s.
    assert chunk.arrived_at.tolist() == [0.0, 0.25, 0.5, 1.0, 2.0]
    sample = VidurTrace(sample_path("vidur"), target_qps=12.5).validate()
    assert sample.mean_qps == pytest.approx(12.5, rel=1e-12)


def test_start_offset_counts_from_the_first_row(tmp_path: Path) -> None:
    chunk = read(VidurTrace(five_rows(tmp_path), start_offset_s=2.0))
    assert chunk.arrived_at.tolist() == [0.0, 2.0, 6.0]
    assert chunk.num_prefill_tokens.tolist() == [12, 14, 18]


def test_limit_stops_reading(tmp_path: Path) -> None:
    path = vidur(tmp_path, ["0,1,1", "1,2,2", "2,3,3", "oops,4,4"])
    chunk = read(VidurTrace(path, limit=3))
    assert chunk.num_prefill_tokens.tolist() == [1, 2, 3]


def test_offset_limit_and_target_qps_apply_to_the_window(tmp_path: Path) -> None:
    chunk = read(VidurTrace(five_rows(tmp_path), start_offset_s=1.0, limit=3, target_qps=1.0))
    # Window: times 101, 102, 104: 3 requests over 3 s = 2/3 requests/s, scaled to 1/s.
    np.testing.assert_allclose(chunk.arrived_at, [0.0, 2 / 3, 2.0])


def test_time_scale_and_target_qps_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"VidurTrace\.target_qps: cannot be combined with"):
        VidurTrace(five_rows(tmp_path), time_scale=2.0, target_qps=3.0)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"time_scale": 0}, "time_scale"),
        ({"target_qps": -1.0}, "target_qps"),
        ({"start_offset_s": -0.5}, "start_offset_s"),
        ({"limit": 1.5}, "limit"),
        ({"zero_output": "ignore"}, "zero_output"),
    ],
)
def test_invalid_options(tmp_path: Path, options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^VidurTrace.{field}: ") as caught:
        VidurTrace(five_rows(tmp_path), **options)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_missing_file_and_bad_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"AzureTrace\.path: no such file") as caught:
        AzureTrace(tmp_path / "absent.csv")
    assert caught.value.field == "path"
    with pytest.raises(ConfigError, match="must be a path, got int"):
        VidurTrace(3)  # type: ignore[arg-type]


def test_zero_output_error_clamp_skip(tmp_path: Path) -> None:
    path = vidur(tmp_path, ["0,5,2", "1,6,0", "2,7,3", "3,8,4"])
    error = trace_error(VidurTrace(path))
    assert str(error).startswith(f"{path}:3: num_decode_tokens: must be >= 1, got 0")
    assert (error.line, error.field) == (3, "num_decode_tokens")
    clamped = read(VidurTrace(path, zero_output="clamp"))
    assert clamped.num_decode_tokens.tolist() == [2, 1, 3, 4]
    skipped = read(VidurTrace(path, zero_output="skip", limit=3))
    assert skipped.num_prefill_tokens.tolist() == [5, 7, 8]
    assert skipped.arrived_at.tolist() == [0.0, 2.0, 3.0]


def test_azure_zero_generated_tokens(tmp_path: Path) -> None:
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    path = write(tmp_path, header + "2023-11-16 18:15:46.6805900,4,0\n")
    assert trace_error(AzureTrace(path)).field == "GeneratedTokens"
    assert read(AzureTrace(path, zero_output="clamp")).num_decode_tokens.tolist() == [1]


# --- errors name the file, the line and the field -------------------------------------------

CSV_ERRORS = [
    (["0,abc,1"], 2, "num_prefill_tokens", "not an integer: 'abc'"),
    (["0,5,1", "x,5,1"], 3, "arrived_at", "not a finite number: 'x'"),
    (["nan,5,1"], 2, "arrived_at", "not a finite number: 'nan'"),
    (["0,12.5,1"], 2, "num_prefill_tokens", "not an integer: '12.5'"),
    (["0,5,-1"], 2, "num_decode_tokens", "must not be negative, got '-1'"),
    (["0,0,1"], 2, "num_prefill_tokens", "must be >= 1, got '0'"),
    (["0,4294967296,1"], 2, "num_prefill_tokens", "must be <= 4294967295"),
    (["0,5,1", "2,5,1", "", "1.5,5,1"], 5, "arrived_at", "must not decrease: 1.5 is earlier"),
    (["0,5"], 2, "num_decode_tokens", "value missing (the row has 2 fields, the header 3)"),
]


@pytest.mark.parametrize(("rows", "line", "field", "message"), CSV_ERRORS)
def test_vidur_row_errors(
    tmp_path: Path, rows: list[str], line: int, field: str, message: str
) -> None:
    path = vidur(tmp_path, rows)
    error = trace_error(VidurTrace(path))
    assert isinstance(error, InputError)
    assert isinstance(error, ValueError)
    assert (error.path, error.line, error.field) == (str(path), line, field)
    assert str(error).startswith(f"{path}:{line}: {field}: ")
    assert message in str(error)


def test_missing_column_lists_the_columns_found(tmp_path: Path) -> None:
    path = vidur(tmp_path, ["0,5"], header="arrived_at,prompt_len\n")
    error = trace_error(VidurTrace(path))
    assert str(error) == (
        f"{path}:1: num_prefill_tokens: missing column (columns found: arrived_at, prompt_len)"
    )
    azure = write(tmp_path, "timestamp,ContextTokens,GeneratedTokens\n", "azure.csv")
    assert trace_error(AzureTrace(azure)).field == "TIMESTAMP"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file: no header row"),
        (VIDUR_HEADER, "empty trace: no requests"),
        (VIDUR_HEADER + "\n\n", "empty trace: no requests"),
    ],
)
def test_empty_traces(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    assert message in str(trace_error(VidurTrace(path)))


def test_nothing_selected(tmp_path: Path) -> None:
    error = trace_error(VidurTrace(five_rows(tmp_path), start_offset_s=9.0))
    selection = "start_offset_s=9.0, zero_output='error'"
    assert str(error) == f"{tmp_path / 'trace.csv'}: no requests selected ({selection})"
    path = vidur(tmp_path, ["0,5,0"])
    assert "no requests selected" in str(trace_error(VidurTrace(path, zero_output="skip")))


def test_target_qps_needs_two_distinct_times(tmp_path: Path) -> None:
    error = trace_error(VidurTrace(vidur(tmp_path, ["3,5,1", "3,6,1"]), target_qps=1.0))
    assert error.field == "target_qps"
    assert "got 2 spanning 0 s" in str(error)


def test_malformed_csv_and_bad_encoding(tmp_path: Path) -> None:
    path = vidur(tmp_path, ["0,5,1", '1,"' + "9" * 200_000 + '",1'])
    error = trace_error(VidurTrace(path))
    assert error.line == 3
    assert "malformed CSV: field larger than field limit" in str(error)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(VIDUR_HEADER.encode() + b"0,5,\xff\n")
    assert "not UTF-8 text" in str(trace_error(VidurTrace(binary)))


@pytest.mark.parametrize(
    ("line", "field", "message"),
    [
        ("{oops", None, "invalid JSON: Expecting property name"),
        ("[1, 2]", None, "expected a JSON object, got list"),
        ('{"timestamp": 1, "input_length": 3}', "output_length", "missing field (fields found: "),
        ('{"timestamp": "soon", "input_length": 3, "output_length": 1}', "timestamp", "'soon'"),
        ('{"timestamp": 1, "input_length": true, "output_length": 1}', "input_length", "True"),
        ('{"timestamp": 1, "input_length": 3, "output_length": 1.5}', "output_length", "1.5"),
        (
            '{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": 7}',
            "hash_ids",
            "list",
        ),
        (
            '{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": [-1]}',
            "hash_ids",
            "-1",
        ),
        (
            '{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": ["a"]}',
            "hash_ids",
            "'a'",
        ),
        (
            '{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": [1, 2]}',
            "hash_ids",
            "2 ids",
        ),
        (
            '{"timestamp": 0, "input_length": 3, "output_length": 1}',
            "timestamp",
            "must not decrease",
        ),
    ],
)
def test_mooncake_row_errors(tmp_path: Path, line: str, field: str | None, message: str) -> None:
    good = {"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": [0]}
    path = mooncake(tmp_path, [good, line])
    error = trace_error(MooncakeTrace(path))
    assert (error.line, error.field) == (2, field)
    prefix = f"{path}:2: " if field is None else f"{path}:2: {field}: "
    assert str(error).startswith(prefix)
    assert message in str(error)


@pytest.mark.parametrize(
    ("row", "field", "message"),
    [
        ("2023-13-01 00:00:00,5,1", "TIMESTAMP", "not a datetime like"),
        ("yesterday,5,1", "TIMESTAMP", "'yesterday'"),
        ("2023-11-16 24:00:00,5,1", "TIMESTAMP", "not a datetime"),
        ("2023-11-16 18:15:46.5,0,1", "ContextTokens", "must be >= 1, got '0'"),
        ("2023-11-16 18:15:45,5,1", "TIMESTAMP", "'2023-11-16 18:15:45' is earlier than line 2's"),
    ],
)
def test_azure_row_errors(tmp_path: Path, row: str, field: str, message: str) -> None:
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    path = write(tmp_path, header + "2023-11-16 18:15:46.6805900,4,2\n" + row + "\n")
    error = trace_error(AzureTrace(path))
    assert str(error).startswith(f"{path}:3: {field}: ")
    assert message in str(error)


def test_errors_surface_while_streaming_and_validate_fails_first(tmp_path: Path) -> None:
    path = vidur(tmp_path, ["0,1,1", "1,1,1", "2,1,1", "3,1,1", "4,-1,1"])
    reader = VidurTrace(path)
    chunks = reader.chunks(2)
    assert len(next(chunks)) == 2
    assert len(next(chunks)) == 2
    with pytest.raises(TraceError, match=":6: num_prefill_tokens: "):
        next(chunks)
    with pytest.raises(TraceError, match=":6: "):
        reader.validate()


def test_a_long_trace_streams_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    rows = (f"{i * 0.01:.2f},{100 + i % 900},{1 + i % 300}\n" for i in range(50_000))
    path.write_text(VIDUR_HEADER + "".join(rows))
    tracemalloc.start()
    try:
        count = 0
        for chunk in VidurTrace(path).chunks(1000):
            assert len(chunk) <= 1000
            count += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 50_000
    # Python lists of the whole trace would take ~6 MB; one chunk takes ~0.1 MB.
    assert peak < 1_500_000
