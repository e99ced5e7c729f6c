"""Write the small sample traces shipped in ``tokenyard/workload/samples``::

    python -m tokenyard.workload.make_samples DIR

One file per format, ``NUM_REQUESTS`` requests each: ``vidur_sample.csv``,
``mooncake_sample.jsonl`` (shared system prompts, so hash ids repeat across requests) and
``azure_sample.csv`` (crossing midnight). The files are byte-identical on every machine and
numpy version: the randomness is a pure-Python splitmix64 stream, and every written value
is computed in integers (microseconds, milliseconds, 100 ns ticks). A test compares the
committed files with a fresh run.
"""

from __future__ import annotations

import argparse
import json
import math
from datetime import date
from pathlib import Path

__all__ = ["NUM_REQUESTS", "main", "write_samples"]

NUM_REQUESTS = 200
_MASK = 2**64 - 1


class _SplitMix64:
    """Steele, Lea and Flood's splitmix64: tiny, stable, good enough for samples."""

    def __init__(self, seed: int):
        self.state = seed & _MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """An int in ``[0, n)`` (the modulo bias is irrelevant here)."""
        return self.next() % n

    def small(self, n: int) -> int:
        """An int in ``[0, n)`` skewed to small values, like real length distributions."""
        return min(self.below(n), self.below(n))

    def gap(self, mean: int) -> int:
        """An exponential gap of mean ``mean`` ticks, rounded down to a tick."""
        return int(-mean * math.log1p(-(self.next() >> 11) / 2**53))


def vidur_sample() -> str:
    """Vidur CSV: ``arrived_at`` in seconds (6 decimals), Poisson at 4 requests/s."""
    rng = _SplitMix64(1)
    rows = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    micros = 0
    for i in range(NUM_REQUESTS):
        if i:
            micros += rng.gap(250_000)
        prefill, decode = 32 + rng.small(4000), 8 + rng.small(700)
        rows.append(f"{micros // 10**6}.{micros % 10**6:06d},{prefill},{decode}")
    return "\n".join(rows) + "\n"


def mooncake_sample() -> str:
    """Mooncake JSONL: ``timestamp`` in ms, 512-token hash blocks; 60% of the requests
    start with one of three system prompts (4, 2 and 8 blocks, popularity 3:2:1). Ids are
    numbered in order of first appearance, as in Mooncake's published traces."""
    rng = _SplitMix64(2)
    group_blocks = (4, 2, 8)
    group_ids: dict[int, list[int]] = {}
    next_id = 0
    lines = []
    millis = 0
    for i in range(NUM_REQUESTS):
        if i:
            millis += rng.gap(400)
        shared = rng.below(10) < 6
        group = (0, 0, 0, 1, 1, 2)[rng.below(6)]
        if shared:
            input_length = group_blocks[group] * 512 + 1 + rng.below(2000)
            if group not in group_ids:
                group_ids[group] = list(range(next_id, next_id + group_blocks[group]))
                next_id += group_blocks[group]
            prefix = group_ids[group]
        else:
            input_length = 64 + rng.small(6000)
            prefix = []
        num_own = -(-input_length // 512) - len(prefix)
        hash_ids = prefix + list(range(next_id, next_id + num_own))
        next_id += num_own
        row = {
            "timestamp": millis,
            "input_length": input_length,
            "output_length": 1 + rng.small(500),
            "hash_ids": hash_ids,
        }
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


def azure_sample() -> str:
    """Azure CSV: ``TIMESTAMP`` with 7 fractional digits from 23:59:20.6805900, about 3
    requests/s, so the trace crosses midnight."""
    rng = _SplitMix64(3)
    day = date(2023, 11, 16).toordinal()
    ticks_per_day = 86400 * 10**7
    ticks = (23 * 3600 + 59 * 60 + 20) * 10**7 + 6805900
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(NUM_REQUESTS):
        if i:
            ticks += rng.gap(3_000_000)
        days, in_day = divmod(ticks, ticks_per_day)
        seconds, fraction = divmod(in_day, 10**7)
        hours, rest = divmod(seconds, 3600)
        stamp = (
            f"{date.fromordinal(day + days).isoformat()} "
            f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{fraction:07d}"
        )
        rows.append(f"{stamp},{100 + rng.small(3000)},{1 + rng.small(400)}")
    return "\n".join(rows) + "\n"


SAMPLES = {
    "vidur_sample.csv": vidur_sample,
    "mooncake_sample.jsonl": mooncake_sample,
    "azure_sample.csv": azure_sample,
}


def write_samples(directory: str | Path) -> list[Path]:
    """Write the three samples into ``directory`` (created if needed); returns their paths."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in SAMPLES.items():
        path = folder / name
        path.write_text(make(), encoding="utf-8", newline="\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tokenyard.workload.make_samples",
        description="Write the sample traces (Vidur CSV, Mooncake JSONL, Azure CSV).",
    )
    parser.add_argument("directory", help="folder to write into (created if needed)")
    args = parser.parse_args(argv)
    for path in write_samples(args.directory):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
