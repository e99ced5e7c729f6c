"""The Mooncake reader's fast path (columns read by the Rust core, the pipeline on numpy
arrays; issue 18) against its row-by-row reader, which stays the reference: the same
chunks, or the same error, for random traces full of odd lines and every reader option."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from workload_outcomes import assert_fast_path_reads_as_rows, reader_options, write_trace

from tokenyard.errors import TokenyardError
from tokenyard.workload.traces import MooncakeTrace


def _line(rng: random.Random, stamp: float) -> str:
    """A row, mostly plain, sometimes odd (floats, extra keys, repeats, escapes) or bad."""
    prefill = rng.choice([1, 5, 16, 17, 40])
    row: dict[str, object] = {
        "timestamp": int(stamp),
        "input_length": prefill,
        "output_length": rng.choice([0, 1, 3, 9]) if rng.random() < 0.2 else rng.randint(1, 9),
    }
    if rng.random() < 0.8:
        row["hash_ids"] = [
            rng.randint(0, 2**64 - 1) if rng.random() < 0.1 else rng.randint(0, 9)
            for _ in range(rng.randint(0, -(-prefill // 16)))
        ]
    text = json.dumps(row, separators=rng.choice([(",", ":"), (", ", ": ")]))
    odd = rng.random()
    if odd < 0.03:
        text = text.replace(f'"timestamp": {int(stamp)}', f'"timestamp": {stamp / 1.0!r}')
    elif odd < 0.05:
        text = text[:-1] + ', "x": {"a": [null, true, false, -1.5e3, "s"], "b": {}}}'
    elif odd < 0.06:
        text = text[:-1] + ', "input_length": 7.0}'
    elif odd < 0.07:
        text = text[:-1] + ', "hash_ids": [1, 2, 3, 4, 5, 6]}'
    elif odd < 0.08:
        text = text[:-1] + ', "n\\u00e9": "\\u00e9"}'
    elif odd < 0.085:
        text = text[:-1] + ', "hash_ids": [true]}'
    elif odd < 0.09:
        text = text.replace("{", "[", 1)
    elif odd < 0.095:
        text = text[:-1] + ', "timestamp": NaN}'
    elif odd < 0.1:
        text = "  " + text + " \t"
    return text


def _trace(rng: random.Random) -> bytes:
    stamp = 1000.0
    lines = []
    for _ in range(rng.randint(0, 60)):
        if rng.random() < 0.05:
            lines.append(rng.choice(["", "   ", "\t"]))
            continue
        stamp += rng.choice([0.0, 250.0, 1000.5, 3000.0])
        if rng.random() < 0.01:
            stamp -= 5000.0  # out of order
        lines.append(_line(rng, stamp))
    ends = [rng.choice(["\n", "\n", "\r\n", "\r"]) for _ in lines]
    text = "".join(a + b for a, b in zip(lines, ends, strict=True))
    if text and rng.random() < 0.3:
        text = text.rstrip("\r\n")
    data = text.encode()
    if rng.random() < 0.1:
        data = b"\xef\xbb\xbf" + data
    if rng.random() < 0.02:
        data = data.replace(b'"t', b'"\xff', 1)
    return data


@pytest.mark.parametrize("seed", range(6))
def test_fast_path_reads_what_the_row_reader_reads(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    for case in range(120):
        data = _trace(rng)
        path = write_trace(tmp_path / f"t{case}.jsonl", data, rng)
        options = reader_options(rng)
        reader = MooncakeTrace(path, hash_block_size=16, **options)  # type: ignore[arg-type]
        assert_fast_path_reads_as_rows(reader, rng, (seed, case, options, data[:300]))


def test_rows_past_the_limit_are_never_read(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = '{"timestamp": 1, "input_length": 4, "output_length": 2}\n'
    path.write_text(good * 3 + "not json\n")
    chunks = list(MooncakeTrace(path, limit=3).chunks(2))
    assert [len(c) for c in chunks] == [2, 1]
    with pytest.raises(TokenyardError, match=r"t\.jsonl:4: invalid JSON"):
        list(MooncakeTrace(path).chunks(2))


def test_large_ids_and_float_times_read_exactly(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0.1, "input_length": 1024, "output_length": 1, '
        '"hash_ids": [18446744073709551615, 0]}\n'
        '{"timestamp": 9007199254740993, "input_length": 1, "output_length": 1}\n'
    )
    (chunk,) = MooncakeTrace(path).chunks()
    assert chunk.hash_ids is not None
    assert chunk.hash_ids.tolist() == [2**64 - 1, 0]
    assert chunk.arrived_at.tolist() == [0.0, 9007199254740993 / 1000.0 - 0.1 / 1000.0]
    assert np.array_equal(chunk.num_decode_tokens, [1, 1])
