"""Chunked local attention priced at the chunk-local shapes vLLM runs (issue 29), and the
step-time-against-the-batch property for the MLA and MoE kinds (the windowed and linear
kinds' is in ``test_layer_kinds_measured.py``). The piece arithmetic needs nothing; the
rest skips without the tokenyard[measured] extra.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_configs import needs_measured
from step_shapes import decodes_over, prompt

from tokenyard.predictor.compiled import CompiledPredictor
from tokenyard.predictor.measured.attention import chunk_pieces
from tokenyard.predictor.measured.tables import read_table
from tokenyard.simulation import config_from_mapping
from tokenyard.simulation.execution import build_predictor, choose_execution

SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"

# ---- the virtual requests of a chunked prefill -------------------------------------------


def test_chunk_pieces_are_vllms_virtual_requests() -> None:
    # vLLM 0.33's make_local_attention_virtual_batches docstring: chunk 4, query lengths
    # [4, 10, 5] over key lengths [6, 17, 9] -> local query lengths [2, 2], [1, 4, 4, 1],
    # [4, 1], each local request over its own chunk's cached part.
    assert chunk_pieces(4, 2, 4) == [(1.0, 2, 2.0), (1.0, 2, 0.0)]
    assert chunk_pieces(10, 7, 4) == [(1.0, 1, 3.0), (2.0, 4, 0.0), (1.0, 1, 0.0)]
    assert chunk_pieces(5, 4, 4) == [(1.0, 4, 0.0), (1.0, 1, 0.0)]


@settings(max_examples=200, deadline=None)
@given(
    seq=st.integers(min_value=1, max_value=100_000),
    prefix=st.integers(min_value=0, max_value=100_000),
    chunk=st.sampled_from([4, 128, 8192]),
)
def test_chunk_pieces_cover_the_chunk_once_and_stay_in_their_chunk(
    seq: int, prefix: int, chunk: int
) -> None:
    pieces = chunk_pieces(seq, prefix, chunk)
    assert sum(n * c for n, c, _ in pieces) == pytest.approx(seq)
    assert all(c > 0 and p + c <= chunk for _, c, p in pieces)
    assert pieces[0][2] == prefix % chunk


# ---- chunked attention on the measured tables ---------------------------------------------


def _predictor(model: str, device: str, tp: int) -> CompiledPredictor:
    config = config_from_mapping(
        {
            "replica": {"model": model, "device": device, "tensor_parallel_size": tp},
            "workload": {"kind": "synthetic", "num_requests": 1},
        }
    )
    predictor = build_predictor(config, choose_execution(config))
    assert predictor is not None
    return predictor


@functools.cache
def scout() -> CompiledPredictor:
    return _predictor(SCOUT, "h100-sxm", 4)


@needs_measured(SCOUT)
def test_a_chunked_decode_past_the_chunk_reads_half_a_chunk_not_a_window() -> None:
    at = {
        keys: scout().op_times(decodes_over(32, keys))["chunked_attn_decode"]
        for keys in (4097, 8192, 32768)
    }
    # A sliding window of 8192 would read 8192 keys at 32768; a chunked query reads its
    # own chunk's, (8192 + 1) / 2 on average over a batch.
    assert at[32768] == pytest.approx(at[4097], rel=0.05)
    assert at[32768] < 0.8 * at[8192]
    assert "chunk-local shapes" in scout().description["kernels"]


@needs_measured(SCOUT)
def test_a_two_chunk_prompt_is_two_one_chunk_prompts_not_a_window_sweep() -> None:
    one = scout().op_times(prompt(8192))["chunked_attn_prefill"]
    two = scout().op_times(prompt(16384))["chunked_attn_prefill"]
    # vLLM splits the 16,384 tokens into two local requests of 8,192 (twice the work of
    # one); a sliding window of 8,192 has ~3x the pairs, full attention 4x.
    assert 1.6 * one < two < 2.3 * one


# ---- MLA and MoE: step time against the batch ---------------------------------------------

#: Per kind: a bundled model, its layout, the ops that price the kind.
KINDS: dict[str, tuple[str, str, int, tuple[str, ...]]] = {
    "mla": ("deepseek-ai/DeepSeek-V3", "h200", 8, ("attn_decode",)),
    "moe": ("Qwen/Qwen3-30B-A3B", "h100-sxm", 1, ("router", "moe_experts")),
}


@functools.cache
def kind_predictor(kind: str) -> CompiledPredictor:
    model, device, tp, _ = KINDS[kind]
    return _predictor(model, device, tp)


def largest_dip(times: Any) -> float:
    times = np.asarray(times, dtype=float)
    peak = np.maximum.accumulate(times)
    return float(np.max((peak - times) / peak)) if len(times) else 0.0


def _dip_over(rows: Any, group: tuple[str, ...], axis: str) -> float:
    """The largest dip of the rows' median latency along ``axis``, per ``group`` slice."""
    columns = {c: rows.col(c) for c in (*group, axis, "latency_s")}
    keys = list(zip(*(columns[c].tolist() for c in group), strict=True))
    worst = 0.0
    for key in set(keys):
        at = np.array([k == key for k in keys])
        xs, ts = columns[axis][at], columns["latency_s"][at]
        medians = [float(np.median(ts[xs == x])) for x in sorted(set(xs.tolist()))]
        worst = max(worst, largest_dip(medians))
    return worst


@functools.cache
def table_dip(kind: str) -> float:
    """The largest dip, in increasing batch, of the measured rows that price ``kind``: for
    MLA the generation-module rows at the model's heads per GPU (every dtype and kernel:
    a bound at least as loose as the slice the predictor reads), for MoE the rows at the
    model's expert shape."""
    model, device, tp, _ = KINDS[kind]
    config = config_from_mapping(
        {"replica": {"model": model, "device": device, "tensor_parallel_size": tp}}
    )
    source = choose_execution(config).source
    assert source is not None
    if kind == "mla":
        rows = read_table(source.folders["mla"] / "mla_generation_module_perf.parquet")
        rows = rows.where(num_heads=128 // tp)
        assert len(rows) > 0
        return _dip_over(
            rows, ("mla_dtype", "kv_cache_dtype", "kernel_source", "isl"), "batch_size"
        )
    rows = read_table(source.folders["moe"] / "moe_perf.parquet")
    rows = rows.where(hidden_size=2048, inter_size=768, num_experts=128, topk=8)
    assert len(rows) > 0
    return _dip_over(rows, ("moe_dtype", "distribution", "kernel_source"), "num_tokens")


@needs_measured("deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-30B-A3B")
@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    keys=st.integers(min_value=1, max_value=32768),
    batches=st.lists(st.integers(min_value=1, max_value=512), min_size=2, max_size=2, unique=True),
)
def test_mla_and_moe_step_time_grows_with_the_batch_but_for_the_tables_own_dips(
    kind: str, keys: int, batches: list[int]
) -> None:
    predictor = kind_predictor(kind)
    ops = KINDS[kind][3]
    small, large = sorted(batches)
    times = [predictor.op_times(decodes_over(b, keys)) for b in (small, large)]
    kind_s = [sum(t[name] for name in ops) for t in times]
    assert kind_s[0] > 0
    tolerance = table_dip(kind)
    assert kind_s[1] >= kind_s[0] * (1 - tolerance) - 1e-15, (kind, keys, batches, tolerance)
    assert min(predictor.stage_time(decodes_over(b, keys))[0] for b in (small, large)) > 0
