"""Windowed and linear-attention layer kinds (issue 29, item 1) on aiconfigurator-core's
measured tables: step time against the batch per layer kind, gated DeltaNet and Mamba2 from
the linear_attention tables, and docs/predictor.md's gpt-oss figures. Skipped without the
tokenyard[measured] extra, but for the GDN table test, which writes its own table.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_configs import needs_measured
from step_shapes import decodes_over, prompt

from tokenyard import catalog
from tokenyard.predictor.compiled import CompiledPredictor
from tokenyard.predictor.measured.ops import GemmTimes, LinearMixerTimes, NotMeasured, main_kernel
from tokenyard.predictor.measured.tables import read_table
from tokenyard.simulation import config_from_mapping
from tokenyard.simulation.execution import build_predictor, choose_execution

DOCS = Path(__file__).resolve().parents[1] / "docs"

# ---- step time against the batch on the measured tables -------------------------------

#: Per layer kind: a bundled model with it, its layout, and the ops that price the kind.
KIND_MODELS = {
    "gqa": ("openai/gpt-oss-120b", "h100-sxm", 2),
    "sliding": ("openai/gpt-oss-120b", "h100-sxm", 2),
    "chunked": ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "h100-sxm", 4),
    "gdn": ("Qwen/Qwen3.5-35B-A3B", "h200", 2),
    "mamba2": ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "h100-sxm", 1),
}


needs_tables = needs_measured(*(name for name, _, _ in KIND_MODELS.values()))


def kind_config(kind: str) -> Any:
    name, device, tp = KIND_MODELS[kind]
    return config_from_mapping(
        {
            "replica": {
                "model": name,
                "device": device,
                "tensor_parallel_size": tp,
                "scheduler": {"max_request_tokens": 32768},
            },
            "workload": {"kind": "synthetic", "num_requests": 1},
        }
    )


def kind_ops(kind: str) -> tuple[str, ...]:
    if kind in ("gdn", "mamba2"):
        return tuple(
            f"{kind}_{op}"
            for op in ("in_proj", "conv_decode", "scan_decode", "gated_norm", "out_proj")
        )
    prefix = "" if kind == "gqa" else f"{kind}_"
    return (f"{prefix}kv_store", f"{prefix}attn_decode")


@functools.cache
def kind_predictor(kind: str) -> CompiledPredictor:
    config = kind_config(kind)
    choice = choose_execution(config)
    predictor = build_predictor(config, choice)
    assert predictor is not None
    return predictor


def largest_dip(times: np.ndarray) -> float:
    """The largest relative fall of ``times`` from any point to a later one."""
    peak = np.maximum.accumulate(times)
    return float(np.max((peak - times) / peak)) if len(times) else 0.0


@functools.cache
def attention_row_dip(kind: str) -> float:
    """The largest dip in the generation-attention rows that price ``kind``: the rows of
    its layout (head_dim, KV heads, window_size, bf16 KV, the main kernel), per head count
    and keys, taken in increasing batch size."""
    config = kind_config(kind)
    spec = catalog.model(config.replica.model)
    tp = config.replica.tensor_parallel_size
    choice = choose_execution(config)
    assert choice.source is not None
    rows = read_table(choice.source.folders["attention"] / "generation_attention_perf.parquet")
    kv_heads, head_dim = spec.kv_shape(kind)
    picked = rows.where(
        head_dim=head_dim,
        kv_cache_dtype="bfloat16",
        window_size=spec.window_of(kind),
        beam_width=1,
    )
    if picked.has("attn_dtype"):
        picked = picked.where(attn_dtype="bfloat16")
    mask = picked.col("num_key_value_heads") == math.ceil(kv_heads / tp)
    picked = main_kernel(picked.with_data({c: v[mask] for c, v in picked.data.items()}))
    assert len(picked) > 0
    keys = picked.col("isl") + picked.col("step")
    worst = 0.0
    for heads in set(picked.col("num_heads").tolist()):
        for k in set(keys.tolist()):
            at = (picked.col("num_heads") == heads) & (keys == k)
            batch, seconds = picked.col("batch_size")[at], picked.col("latency_s")[at]
            # Repeated points at their median, as the predictor reads them.
            medians = [float(np.median(seconds[batch == b])) for b in sorted(set(batch.tolist()))]
            worst = max(worst, largest_dip(np.asarray(medians)))
    return worst


@functools.cache
def linear_row_dip(kind: str) -> float:
    """The largest dip of what prices a linear layer's decode: its GEMMs (in_proj, out_proj)
    at the measured ``m`` of the GEMM rows up to 1,024, and its measured conv and scan
    decode rows (``linear_attention/<kind>_perf`` at the layer's shape per TP rank) in
    increasing batch size. The gated norm, and a kernel without rows, are a calibrated
    roofline, which only grows with the tokens."""
    config = kind_config(kind)
    spec = catalog.model(config.replica.model)
    tp = config.replica.tensor_parallel_size
    choice = choose_execution(config)
    assert choice.source is not None
    assert spec.linear is not None
    lin, h = spec.linear, spec.hidden_size
    gemm = GemmTimes(read_table(choice.source.folders["gemm"] / "gemm_perf.parquet"), "bfloat16")
    m = [x for x in gemm.m_grid if x <= 1024]
    inner = lin.num_heads // tp * lin.head_dim
    if kind == "gdn":
        qkvz = (2 * lin.inner + 2 * lin.num_groups * lin.group_dim) // tp
        ins = [gemm(x, qkvz, h) + gemm(x, 2 * lin.num_heads // tp, h) for x in m]
    else:
        ins = [gemm(x, lin.in_proj_width() // tp, h) for x in m]
    worst = max(
        largest_dip(np.asarray(ins)), largest_dip(np.asarray([gemm(x, h, inner) for x in m]))
    )
    path = choice.source.folders["linear_attention"] / f"{kind}_perf.parquet"
    if kind == "gdn":
        rows = read_table(path).where(
            phase="generation",
            d_model=h,
            num_k_heads=lin.num_groups // tp,
            num_v_heads=lin.num_heads // tp,
        )
        assert len(rows) > 0
        for kernel in rows.values("kernel_source"):
            picked = rows.where(kernel_source=kernel)
            order = np.argsort(picked.col("batch_size"), kind="stable")
            worst = max(worst, largest_dip(picked.col("latency_s")[order]))
    return worst


def allowed_dip(kind: str) -> float:
    return linear_row_dip(kind) if kind in ("gdn", "mamba2") else attention_row_dip(kind)


@needs_tables
@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(sorted(KIND_MODELS)),
    keys=st.integers(min_value=1, max_value=32768),
    batches=st.lists(st.integers(min_value=1, max_value=512), min_size=2, max_size=2, unique=True),
)
def test_step_time_grows_with_the_batch_but_for_the_tables_own_dips(
    kind: str, keys: int, batches: list[int]
) -> None:
    predictor = kind_predictor(kind)
    small, large = sorted(batches)
    ops = kind_ops(kind)
    times = [predictor.op_times(decodes_over(b, keys)) for b in (small, large)]
    assert all(name in times[0] for name in ops)
    kind_s = [sum(t[name] for name in ops) for t in times]
    assert kind_s[0] > 0
    tolerance = allowed_dip(kind)
    assert kind_s[1] >= kind_s[0] * (1 - tolerance) - 1e-15, (kind, keys, batches, tolerance)
    steps = [predictor.stage_time(decodes_over(b, keys))[0] for b in (small, large)]
    assert min(steps) > 0


@needs_tables
@pytest.mark.parametrize("kind", sorted(KIND_MODELS))
def test_the_kinds_ops_are_what_the_predictor_prices(kind: str) -> None:
    """The ops the property test sums are there, with the source the banner names."""
    sources = {op.name: op.source for op in kind_predictor(kind).ops}
    for name in kind_ops(kind):
        if name.endswith("attn_decode"):
            assert sources[name].startswith("measured:attention")
        elif name.endswith(("_in_proj", "_out_proj")):
            assert sources[name].startswith("measured:gemm")
        elif kind == "gdn" and not name.endswith("gated_norm"):
            assert sources[name].startswith("measured:gdn_perf")
        elif kind in ("gdn", "mamba2"):  # vLLM has no mamba2_perf; no table has the norm
            assert sources[name] == "calibrated"
    assert 0 <= allowed_dip(kind) < 0.5


# ---- gated DeltaNet and Mamba2 from the linear_attention tables ------------------------

GDN_KEY = {
    "d_model": 2048,
    "num_k_heads": 8,
    "head_k_dim": 128,
    "num_v_heads": 16,
    "head_v_dim": 128,
    "d_conv": 4,
}


def gdn_table(tmp_path: Path) -> Path:
    """A gated-DeltaNet table of one layer shape: the chunked scan at 0.01 ms per 128
    tokens, over 1 and 4 prompts of 128 and 1,024 tokens, and the recurrent decode step
    at 0.004 ms for one decode and 0.011 ms for eight."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for b in (1, 4):
        for s in (128, 1024):
            rows.append(
                dict(
                    phase="context",
                    kernel_source="chunk_gated_delta_rule",
                    batch_size=b,
                    seq_len=s,
                    latency=0.01 * b * s / 128,
                )
            )
    for b, ms in ((1, 0.004), (8, 0.011)):
        rows.append(
            dict(
                phase="generation",
                kernel_source="fused_recurrent_gated_delta_rule",
                batch_size=b,
                seq_len=1,
                latency=ms,
            )
        )
    columns = {name: [r[name] for r in rows] for name in rows[0]}
    columns["num_tokens"] = [r["batch_size"] * r["seq_len"] for r in rows]
    for name, value in GDN_KEY.items():
        columns[name] = [value] * len(rows)
    columns["model_name"] = ["Qwen/Qwen3.5-35B-A3B"] * len(rows)
    path = tmp_path / "gdn_perf.parquet"
    pq.write_table(pa.table(columns), path)
    return path


def test_a_gdn_row_is_one_layers_kernel_for_prompts_of_seq_len_or_one_step_decodes(
    tmp_path: Path,
) -> None:
    rows = read_table(gdn_table(tmp_path))
    scan = LinearMixerTimes(
        rows, kernel_source="chunk_gated_delta_rule", phase="context", key=GDN_KEY
    )
    assert scan(4, 1024) == pytest.approx(0.32e-3)  # a measured point: 4 x 1,024 tokens
    assert scan(2, 128) == pytest.approx(0.02e-3)  # linear in the batch between 1 and 4
    assert scan(1, 2048) == pytest.approx(0.16e-3)  # past the longest prompt: x tokens
    assert scan(0.5, 64) == pytest.approx(0.01e-3)  # below the grid: the edge holds
    decode = LinearMixerTimes(
        rows, kernel_source="fused_recurrent_gated_delta_rule", phase="generation", key=GDN_KEY
    )
    assert decode(4) == pytest.approx((0.004 + 3 / 7 * 0.007) * 1e-3)
    assert decode(16) == pytest.approx(0.022e-3)  # past the largest batch: x decodes
    with pytest.raises(NotMeasured, match=r"num_v_heads 32.*the table has \(d_model"):
        LinearMixerTimes(
            rows,
            kernel_source="chunk_gated_delta_rule",
            phase="context",
            key={**GDN_KEY, "num_v_heads": 32},
        )


@needs_tables
def test_qwen3_5_gdn_layers_take_the_rows_of_their_shape_per_tp_rank() -> None:
    """Qwen3.5-35B-A3B on an H200 at TP 2: 30 GDN layers of 8 key and 16 value heads per
    rank; a 4,096-token prompt is one row of 1 x 4,096 per kernel and layer, 64 decodes
    one row of batch 64 (vLLM 0.24.0's causal_conv1d_fn, chunk_gated_delta_rule_flashinfer,
    causal_conv1d_update, fused_recurrent_gated_delta_rule_packed_decode)."""
    predictor = kind_predictor("gdn")
    choice = choose_execution(kind_config("gdn"))
    assert choice.source is not None
    rows = read_table(choice.source.folders["linear_attention"] / "gdn_perf.parquet")
    rows = rows.where(**GDN_KEY)

    def row(kernel: str, batch: int, seq: int) -> float:
        at = rows.where(kernel_source=kernel, batch_size=batch, seq_len=seq)
        assert len(at) == 1
        return float(at.col("latency_s")[0])

    prefill = predictor.op_times(prompt(4096))
    for op, kernel in (
        ("gdn_conv_prefill", "causal_conv1d_fn"),
        ("gdn_scan_prefill", "chunk_gated_delta_rule_flashinfer"),
    ):
        assert prefill[op] == pytest.approx(30 * row(kernel, 1, 4096), rel=1e-3), op
    decode = predictor.op_times(decodes_over(64, 2048))
    for op, kernel in (
        ("gdn_conv_decode", "causal_conv1d_update"),
        ("gdn_scan_decode", "fused_recurrent_gated_delta_rule_packed_decode"),
    ):
        assert decode[op] == pytest.approx(30 * row(kernel, 64, 1), rel=1e-3), op
    assert decode["gdn_conv_prefill"] == decode["gdn_scan_prefill"] == 0.0


@needs_tables
def test_nemotron_mamba2_conv_is_measured_under_trtllm_and_its_scan_says_why_not() -> None:
    """aiconfigurator-core measures mamba2_perf under TRT-LLM only, and only its conv1d
    kernels (whole layers: all heads), so at TP 1 the conv is measured and the scan is not."""
    config = config_from_mapping(
        {
            "replica": {
                "model": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
                "device": "h100-sxm",
                "tensor_parallel_size": 1,
            },
            "execution": {"model": "measured", "measured": {"framework": "trtllm"}},
            "workload": {"kind": "synthetic", "num_requests": 1},
        }
    )
    predictor = build_predictor(config, choose_execution(config))
    assert predictor is not None
    sources = {op.name: op.source for op in predictor.ops}
    assert sources["mamba2_conv_prefill"] == "measured:mamba2_perf causal_conv1d_fn (1.3.0rc20)"
    assert sources["mamba2_conv_decode"].startswith("measured:mamba2_perf causal_conv1d_update")
    why = predictor.description["fallbacks"]["mamba2_scan_decode"]
    assert why.endswith(
        "measures only causal_conv1d_update for generation at this layer shape, no scan kernel"
    )
    assert (
        "mamba2 measured:mamba2_perf conv_prefill, conv_decode" in predictor.description["kernels"]
    )


@needs_tables
def test_docs_predictor_gpt_oss_figures() -> None:
    """docs/predictor.md's table: gpt-oss-120b, H100 TP 2, full against sliding layers."""
    predictor = kind_predictor("sliding")
    text = (DOCS / "predictor.md").read_text()
    rows = [
        (f"64 decodes over {keys:,} keys", predictor.op_times(decodes_over(64, keys)), "decode", 3)
        for keys in (2048, 8192)
    ]
    rows.append(("one 8,192-token prompt", predictor.op_times(prompt(8192)), "prefill", 2))
    for words, times, phase, digits in rows:
        full, sliding = times[f"attn_{phase}"], times[f"sliding_attn_{phase}"]
        line = f"| {words} | {full * 1e3:.{digits}f} ms | {sliding * 1e3:.{digits}f} ms |"
        assert line in text, line
