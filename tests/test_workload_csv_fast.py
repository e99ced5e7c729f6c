"""The CSV readers' fast path (pyarrow reads the columns, the pipeline runs on numpy arrays;
issue 18) against their row-by-row reader, which stays the reference: the same chunks, or
the same error, for random traces full of odd cells and every reader option. Vidur's
reader, Azure's (its datetimes parsed in bulk), and ``ColumnTrace`` (any layout) with units,
TSV and filters."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from workload_outcomes import assert_fast_path_reads_as_rows, reader_options, write_trace

from tokenyard.workload import csv_columns
from tokenyard.workload.columns import ColumnFilter, ColumnTrace, TraceColumns
from tokenyard.workload.traces import AzureTrace, VidurTrace

HEADER = ["arrived_at", "num_prefill_tokens", "num_decode_tokens", "note"]


def _cell(rng: random.Random, good: str, odd: list[str], oddness: float) -> str:
    return rng.choice(odd) if rng.random() < oddness else good


def _row(rng: random.Random, stamp: float, oddness: float) -> list[str]:
    """A row, mostly plain, sometimes odd (quoted, spaced, integral floats, blanks, NA,
    out of range, ragged) or bad."""
    prefill = str(rng.choice([1, 5, 16, 4000]))
    decode = str(rng.choice([0, 1, 3, 9]) if rng.random() < 0.2 else rng.randint(1, 9))
    time = rng.choice([f"{stamp:.3f}", repr(stamp), f"{stamp:e}"])
    row = [
        _cell(rng, time, ["", " 1.5", "NA", "nan", "inf", "1e400", '"2.0"', "x"], oddness),
        _cell(rng, prefill, ["0", "12.0", "+3", " 7", "-1", "4294967296", '"8"', ""], oddness),
        _cell(rng, decode, ["2.0", "-2", "null", "4294967295", '"5"'], oddness),
        rng.choice(["", "a", " a ", "b", '"x, y"', "\u00e9"]),
    ]
    if rng.random() < oddness / 2:
        row = row[:2]  # too short
    elif rng.random() < oddness / 2:
        row = [*row, "extra"]
    return row


def _trace(rng: random.Random, delimiter: str = ",") -> bytes:
    # Half the traces are clean, so the fast path also runs to the end.
    oddness = rng.choice([0.0, 0.0, 0.005, 0.02])
    header = list(HEADER)
    rng.shuffle(header)
    if rng.random() < 0.02:
        header[0] = " " + header[0]
    order = [HEADER.index(name.strip()) for name in header]
    lines = [delimiter.join(header)]
    stamp = 10.0
    for _ in range(rng.randint(0, 60)):
        if rng.random() < 2 * oddness:
            lines.append(rng.choice(["", "   "]))
            continue
        stamp += rng.choice([0.0, 0.25, 1.0005, 3.0])
        if rng.random() < oddness / 2:
            stamp -= 5.0  # out of order
        row = _row(rng, stamp, oddness)
        lines.append(
            ",".join(row[i] for i in order if i < len(row)) if len(row) >= 4 else ",".join(row)
        )
    end = rng.choice(["\n", "\r\n"])
    text = end.join(lines) + (end if rng.random() < 0.7 else "")
    data = text.encode()
    if rng.random() < 0.1:
        data = b"\xef\xbb\xbf" + data
    if rng.random() < 0.1:
        # Not UTF-8, in the note column (which the fast path does not convert).
        data = data.replace("\u00e9".encode(), b"\xc3\x28", 1)
    return data


@pytest.mark.parametrize("seed", range(6))
def test_fast_path_reads_what_the_row_reader_reads(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(csv_columns, "MIN_BYTES", 0)  # every trace takes the fast path
    rng = random.Random(seed)
    for case in range(120):
        data = _trace(rng)
        path = write_trace(tmp_path / f"t{case}.csv", data, rng)
        options = reader_options(rng)
        reader = VidurTrace(path, **options)  # type: ignore[arg-type]
        assert_fast_path_reads_as_rows(reader, rng, (seed, case, options, data[:300]))


@pytest.mark.parametrize("seed", range(4))
def test_column_trace_fast_path_reads_what_the_row_reader_reads(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(csv_columns, "MIN_BYTES", 0)
    rng = random.Random(1000 + seed)
    for case in range(100):
        tsv = rng.random() < 0.3
        data = _trace(rng, "\t" if tsv else ",")
        path = tmp_path / f"t{case}.{'tsv' if tsv else 'csv'}"
        path.write_bytes(data)
        columns = TraceColumns(
            time="arrived_at",
            time_unit=rng.choice(["s", "ms", "us"]),
            input_tokens="num_prefill_tokens",
            output_tokens="num_decode_tokens",
        )
        filters = rng.choice(
            [
                (),
                (ColumnFilter("note", values=("a",)),),
                (ColumnFilter("note", values=("a", "b"), exclude=True),),
                (ColumnFilter("note", values=("zzz",)),),  # nothing selected
                (ColumnFilter("num_decode_tokens", values=("3",), exclude=True),),  # mapped
            ]
        )
        options = reader_options(rng)
        reader = ColumnTrace(path, columns=columns, filter=filters, **options)  # type: ignore[arg-type]
        assert_fast_path_reads_as_rows(reader, rng, (seed, case, filters, options, data[:300]))


def test_a_large_trace_takes_the_fast_path_and_a_small_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,2\n1.5,20,3\n")
    taken: list[int] = []
    original = csv_columns.Rows

    def counted(*args: object) -> object:
        taken.append(1)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(csv_columns, "Rows", counted)
    chunks = list(VidurTrace(path).chunks(8))
    assert taken == []
    assert [len(c) for c in chunks] == [2]
    monkeypatch.setattr(csv_columns, "MIN_BYTES", 0)
    again = list(VidurTrace(path).chunks(8))
    assert taken == [1]
    assert again[0].arrived_at.tolist() == [0.0, 1.0]
    assert again[0].hash_offsets is None  # no prefix identity, as row by row


def _datetime(rng: random.Random, seconds: float, zone: str, digits: int, oddness: float) -> str:
    """An Azure timestamp ``seconds`` after 2023-11-16 00:00 (in ``zone``, with ``digits``
    fractional digits), sometimes with a ``T``, odd or bad."""
    day, rest = divmod(int(seconds), 86400)
    text = f"2023-11-{16 + day:02d} {rest // 3600:02d}:{rest // 60 % 60:02d}:{rest % 60:02d}"
    if digits:  # truncated, so the times never go back
        text += "." + str(int((seconds % 1) * 10**digits)).zfill(digits)
    text += zone
    if rng.random() < 0.1:
        text = text.replace(" ", "T")
    if rng.random() < oddness:
        text = rng.choice(
            [
                text[:20] + str(rng.randrange(10**17, 10**18)) + zone,  # too long to read in bulk
                " " + text + " ",
                text.replace("2023-11", "2023-02").replace("-16", "-30"),  # not a date
                text[:11] + "24" + text[13:],  # hour 24
                text[:17] + "60" + text[19:],  # a leap second (accepted)
                "16/11/2023 " + text[11:],
                "",
            ]
        )
    return text


def _azure_trace(rng: random.Random) -> bytes:
    # Odd datetimes and odd counts apart, so each kind also meets the fast path alone.
    oddness, count_oddness = rng.choice([(0.0, 0.0), (0.0, 0.02), (0.03, 0.0), (0.03, 0.02)])
    zone = rng.choice(["", "", "Z", "+00:00", "-0130", "+05:30"])
    digits = rng.choice([0, 1, 3, 7, 7, 15])
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    seconds = rng.uniform(0, 86000)
    for _ in range(rng.randint(0, 60)):
        seconds += rng.choice([0.0, 0.123456789, 0.5, 30.0, 3000.0])
        row = _row(rng, seconds, count_oddness)
        lines.append(",".join([_datetime(rng, seconds, zone, digits, oddness), *row[1:3]]))
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("seed", range(4))
def test_azure_fast_path_reads_what_the_row_reader_reads(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(csv_columns, "MIN_BYTES", 0)
    rng = random.Random(2000 + seed)
    for case in range(100):
        data = _azure_trace(rng)
        path = tmp_path / f"t{case}.csv"
        path.write_bytes(data)
        options = reader_options(rng)
        reader = AzureTrace(path, **options)  # type: ignore[arg-type]
        assert_fast_path_reads_as_rows(reader, rng, (seed, case, options, data[:300]))
