"""Reading CSV traces: the fast path (pyarrow's CSV reader, ``csv_columns.py``) against the
line-by-line reader it falls back to, on the same generated requests in three layouts: a
Vidur CSV, Azure's (datetimes with seven fractional digits), and a BurstGPT-like CSV read by
``format = "columns"`` with its two filters.

Each measurement is a fresh interpreter pinned to one core (``taskset -c 1`` where there is
one), the two alternating; a run reads every chunk of the trace (``chunks(4096)``) and
reports its wall time and a hash of the chunks, which must agree. Medians of ``--repeat``.

    .venv/bin/python benches/trace_read_speed.py                  # 1M rows, 3 rounds, ~2 min
    .venv/bin/python benches/trace_read_speed.py --rows 100000 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import hashlib, json, sys, time
from tokenyard.workload.columns import ColumnFilter, ColumnTrace, TraceColumns
from tokenyard.workload.traces import AzureTrace, VidurTrace, _TraceReader
path, side, kind = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
if kind == "vidur":
    reader = VidurTrace(path)
elif kind == "azure":
    reader = AzureTrace(path)
else:
    columns = TraceColumns(time="Timestamp", time_unit="s", input_tokens="Request tokens",
                           output_tokens="Response tokens")
    filters = (ColumnFilter("Model", values=("ChatGPT",)),
               ColumnFilter("Log Type", values=("Conversation log",)))
    reader = ColumnTrace(path, columns=columns, filter=filters)
chunks = reader.chunks(4096) if side == "fast" else _TraceReader._chunks(reader, 4096)
digest, rows = hashlib.sha256(), 0
for chunk in chunks:
    for column in (chunk.arrived_at, chunk.num_prefill_tokens, chunk.num_decode_tokens):
        digest.update(column.tobytes())
    rows += len(chunk)
wall = time.perf_counter() - start
print(json.dumps({"wall_s": wall, "rows": rows, "hash": digest.hexdigest()[:16]}))
"""


def write_traces(paths: dict[str, Path], rows: int) -> None:
    """The same requests as a Vidur CSV, an Azure CSV and in BurstGPT's layout (a fifth of
    them GPT-4 or API logs, which the filters drop)."""
    rng = random.Random(0)
    time = 0.0
    with (
        paths["vidur"].open("w") as v,
        paths["azure"].open("w") as a,
        paths["columns"].open("w") as b,
    ):
        v.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        a.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        b.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        for _ in range(rows):
            time += rng.expovariate(20.0)
            prompt, output = rng.randint(10, 4000), rng.randint(1, 1000)
            model = "GPT-4" if rng.random() < 0.1 else "ChatGPT"
            log = "API log" if rng.random() < 0.1 else "Conversation log"
            day, rest = divmod(time, 86400.0)
            clock = f"{int(rest) // 3600:02d}:{int(rest) // 60 % 60:02d}:{rest % 60:010.7f}"
            v.write(f"{time:.6f},{prompt},{output}\n")
            a.write(f"2023-11-{16 + int(day):02d} {clock},{prompt},{output}\n")
            b.write(f"{time:.6f},{model},{prompt},{output},{prompt + output},{log}\n")


def run(path: Path, side: str, kind: str) -> dict[str, float | str]:
    pin = ["taskset", "-c", "1"] if shutil.which("taskset") else []
    out = subprocess.run(
        [*pin, sys.executable, "-c", CHILD, str(path), side, kind],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float | str] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = {kind: Path(folder) / f"{kind}.csv" for kind in ("vidur", "azure", "columns")}
        write_traces(paths, args.rows)
        for kind, path in paths.items():
            measure(kind, path, args.rows, args.repeat)


def measure(kind: str, path: Path, rows: int, repeat: int) -> None:
    size_mb = path.stat().st_size / 1e6
    walls: dict[str, list[float]] = {"rows": [], "fast": []}
    hashes = set()
    for _ in range(repeat):
        for side in ("rows", "fast"):
            result = run(path, side, kind)
            walls[side].append(float(result["wall_s"]))
            hashes.add(result["hash"])
    medians = {side: statistics.median(values) for side, values in walls.items()}
    print(f"{kind}: {rows:,} rows ({size_mb:.0f} MB), medians of {repeat}:")
    for side, label in (("rows", "line by line"), ("fast", "fast path (pyarrow)")):
        runs = ", ".join(f"{v:.2f}" for v in walls[side])
        print(f"  {label}: {medians[side]:.2f} s (runs {runs})")
    print(f"  ratio: {medians['rows'] / medians['fast']:.1f}x; same chunks: {len(hashes) == 1}")


if __name__ == "__main__":
    main()
