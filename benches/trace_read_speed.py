"""Reading a Vidur CSV trace: the fast path (pyarrow's CSV reader, ``csv_columns.py``)
against the line-by-line reader it falls back to, on the same generated trace.

Each measurement is a fresh interpreter pinned to one core (``taskset -c 1`` where there is
one), the two alternating; a run reads every chunk of the trace (``chunks(4096)``) and
reports its wall time and a hash of the chunks, which must agree. Medians of ``--repeat``.

    .venv/bin/python benches/trace_read_speed.py                  # 1M rows, 3 rounds, ~25 s
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
from tokenyard.workload.traces import VidurTrace, _TraceReader
path, side = sys.argv[1], sys.argv[2]
start = time.perf_counter()
reader = VidurTrace(path)
chunks = reader.chunks(4096) if side == "fast" else _TraceReader._chunks(reader, 4096)
digest, rows = hashlib.sha256(), 0
for chunk in chunks:
    for column in (chunk.arrived_at, chunk.num_prefill_tokens, chunk.num_decode_tokens):
        digest.update(column.tobytes())
    rows += len(chunk)
wall = time.perf_counter() - start
print(json.dumps({"wall_s": wall, "rows": rows, "hash": digest.hexdigest()[:16]}))
"""


def write_trace(path: Path, rows: int) -> None:
    rng = random.Random(0)
    time = 0.0
    with path.open("w") as f:
        f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        for _ in range(rows):
            time += rng.expovariate(20.0)
            f.write(f"{time:.6f},{rng.randint(10, 4000)},{rng.randint(1, 1000)}\n")


def run(path: Path, side: str) -> dict[str, float | str]:
    pin = ["taskset", "-c", "1"] if shutil.which("taskset") else []
    out = subprocess.run(
        [*pin, sys.executable, "-c", CHILD, str(path), side],
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
        path = Path(folder) / "trace.csv"
        write_trace(path, args.rows)
        size_mb = path.stat().st_size / 1e6
        walls: dict[str, list[float]] = {"rows": [], "fast": []}
        hashes = set()
        for _ in range(args.repeat):
            for side in ("rows", "fast"):
                result = run(path, side)
                walls[side].append(float(result["wall_s"]))
                hashes.add(result["hash"])
    medians = {side: statistics.median(values) for side, values in walls.items()}
    print(f"Vidur CSV, {args.rows:,} rows ({size_mb:.0f} MB), medians of {args.repeat}:")
    for side, label in (("rows", "line by line"), ("fast", "fast path (pyarrow)")):
        runs = ", ".join(f"{v:.2f}" for v in walls[side])
        rate = args.rows / medians[side] / 1e6
        print(f"  {label}: {medians[side]:.2f} s ({rate:.2f}M rows/s; runs {runs})")
    print(f"  ratio: {medians['rows'] / medians['fast']:.1f}x; same chunks: {len(hashes) == 1}")


if __name__ == "__main__":
    main()
