"""Measured tables in aiconfigurator-core's schema, with times from known formulas (ms), so
the measured predictor can be tested without the ``tokenyard[measured]`` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def gemm_ms(m: float, n: float, k: float) -> float:
    return 0.005 + 2 * m * n * k / 500e12 * 1e3 + 2 * n * k / 2e12 * 1e3


def context_ms(b: float, s: float, heads: float) -> float:
    return 0.004 + b * s * s * heads * 128 * 2 / 300e12 * 1e3


def generation_ms(b: float, kv_len: float, kv_heads: float) -> float:
    return 0.003 + b * kv_len * kv_heads * 128 * 4 / 2e12 * 1e3


POWERS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
DIMS = [1024, 2048, 4096, 6144, 8192, 14336, 16384, 28672, 32768, 65536]
HEADS = [8, 16, 32, 64]


def write(path: Path, columns: dict[str, list[Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def gemm_columns() -> dict[str, list[Any]]:
    rows = [(m, n, k) for m in POWERS for n in DIMS for k in DIMS]
    return {
        "m": [r[0] for r in rows],
        "n": [r[1] for r in rows],
        "k": [r[2] for r in rows],
        "gemm_dtype": ["bfloat16"] * len(rows),
        "kernel_source": ["torch"] * len(rows),
        "latency": [gemm_ms(*r) for r in rows],
    }


def attention_columns(generation: bool) -> dict[str, list[Any]]:
    rows = []
    for kv in (4, 8):
        for heads in HEADS:
            for b in [1, 2, 4, 8, 16, 32, 64, 128, 256]:
                for s in POWERS:
                    if generation:
                        rows.append((b, 1, s - 1, heads, kv, generation_ms(b, s, kv)))
                    else:
                        rows.append((b, s, 0, heads, kv, context_ms(b, s, heads)))
    n = len(rows)
    return {
        "batch_size": [r[0] for r in rows],
        "isl": [r[1] for r in rows],
        "step": [r[2] for r in rows],
        "num_heads": [r[3] for r in rows],
        "num_key_value_heads": [r[4] for r in rows],
        "head_dim": [128] * n,
        "kv_cache_dtype": ["bfloat16"] * n,
        "attn_dtype": ["bfloat16"] * n,
        "window_size": [0] * n,
        "beam_width": [1] * n,
        "latency": [r[5] for r in rows],
    }


def write_tables(root: Path) -> Path:
    """A data root with one system (``h100_sxm``), vllm 0.2.0 GEMM and attention, and an
    older 0.1.0 GEMM table; no all-reduce or MoE tables."""
    write(root / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet", gemm_columns())
    old = gemm_columns()
    old["latency"] = [2 * v for v in old["latency"]]
    write(root / "h100_sxm/gemm/vllm/0.1.0/gemm_perf.parquet", old)
    attention = root / "h100_sxm/attention/vllm/0.2.0"
    write(attention / "context_attention_perf.parquet", attention_columns(False))
    write(attention / "generation_attention_perf.parquet", attention_columns(True))
    return root
