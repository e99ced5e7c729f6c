"""The measured predictor: table readers, version resolution, interpolation, compilation
(docs/predictor.md#measured); its place in the simulator is test_predictor_measured_simulation.py.

The tests write small tables of their own in aiconfigurator-core's schema, with times from
a known formula (``measured_tables``), so no extra is needed; a test on the real package data
skips without it.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from measured_tables import (
    DIMS,
    POWERS,
    attention_columns,
    context_ms,
    gemm_columns,
    gemm_ms,
    generation_ms,
    write,
    write_tables,
)
from step_shapes import decodes, prompt

from tokenyard import catalog
from tokenyard.errors import ConfigError
from tokenyard.predictor import ProfileError
from tokenyard.predictor.grids import prefill_shape
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import resolve_source
from tokenyard.predictor.measured.interpolate import Curve
from tokenyard.predictor.measured.ops import AttentionTimes, GemmTimes, NotMeasured
from tokenyard.predictor.measured.tables import read_table


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The formula tables of ``measured_tables.write_tables``."""
    return write_tables(tmp_path_factory.mktemp("measured") / "data")


# ---- readers --------------------------------------------------------------------------


def test_a_table_missing_a_column_names_the_key_the_file_and_the_column(tmp_path: Path) -> None:
    columns = gemm_columns()
    del columns["k"]
    path = tmp_path / "gemm_perf.parquet"
    write(path, columns)
    with pytest.raises(ProfileError) as err:
        read_table(path, field="execution.measured.data_dir")
    # field: the config key that named the tables; path: the file.
    assert (err.value.field, err.value.path) == ("execution.measured.data_dir", str(path))
    assert str(err.value).startswith(f"execution.measured.data_dir: {path}:k: missing column(s) k")


def test_text_where_a_number_belongs_names_the_column(tmp_path: Path) -> None:
    columns = gemm_columns()
    columns["m"] = [str(v) for v in columns["m"]]
    path = tmp_path / "gemm_perf.parquet"
    write(path, columns)
    with pytest.raises(ProfileError, match="must hold numbers") as err:
        read_table(path)
    assert err.value.field == "execution.measured"
    assert f"{path}:m: must hold numbers" in str(err.value)


def test_an_empty_grid_and_a_negative_latency_are_refused(tmp_path: Path) -> None:
    columns = {k: v[:0] for k, v in gemm_columns().items()}
    path = tmp_path / "gemm_perf.parquet"
    pq.write_table(pa.table(columns, schema=pa.table(gemm_columns()).schema), path)
    with pytest.raises(ProfileError, match="no rows"):
        read_table(path)
    columns = gemm_columns()
    columns["latency"][3] = -1.0
    write(path, columns)
    with pytest.raises(ProfileError, match="row 3") as err:
        read_table(path)
    assert err.value.path == str(path)
    assert f"{path}:latency: row 3" in str(err.value)


def test_an_unmeasured_dtype_lists_the_measured_ones(tables: Path) -> None:
    rows = read_table(tables / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet")
    with pytest.raises(ProfileError, match=r"gemm_dtype 'fp8'.*\['bfloat16'\]"):
        GemmTimes(rows, "fp8")


# ---- coverage: what the interpolation needs (issue 32) ---------------------------------


def rows_where(columns: dict[str, list[Any]], **equal: Any) -> dict[str, list[Any]]:
    """The rows whose columns equal the given values."""
    keep = [
        all(columns[c][i] == v for c, v in equal.items()) for i in range(len(columns["latency"]))
    ]
    return {c: [v for v, k in zip(vs, keep, strict=True) if k] for c, vs in columns.items()}


@pytest.mark.parametrize(
    ("kind", "equal", "axis"),
    [
        ("gemm", {"n": 4096}, "n"),
        ("gemm", {"k": 4096}, "k"),
        ("context", {"batch_size": 4}, "batch_size"),
        ("generation", {"step": 1023}, "isl + step"),
    ],
)
def test_an_axis_measured_at_one_value_is_too_sparse_to_interpolate(
    tmp_path: Path, kind: str, equal: dict[str, Any], axis: str
) -> None:
    columns = gemm_columns() if kind == "gemm" else attention_columns(kind == "generation")
    path = tmp_path / f"{kind}.parquet"
    write(path, rows_where(columns, **equal))
    rows = read_table(path, required=("latency",))

    def times() -> Any:
        if kind == "gemm":
            return GemmTimes(rows, "bfloat16")
        return AttentionTimes(
            rows,
            generation=kind == "generation",
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            kv_cache_dtype="bfloat16",
        )

    with pytest.raises(ProfileError) as err:
        times()
    assert not isinstance(err.value, NotMeasured)  # refused, not priced another way
    assert f"{path}:{axis}: too sparse: " in str(err.value)
    assert "needs at least two distinct values" in str(err.value)


def test_a_zero_on_an_axis_is_refused_not_a_math_error(tmp_path: Path) -> None:
    columns = gemm_columns()
    columns["m"] = [0 if m == 1 else m for m in columns["m"]]
    path = tmp_path / "gemm_perf.parquet"
    write(path, columns)
    with pytest.raises(ProfileError, match=r":m: gemm_dtype 'bfloat16': must be > 0"):
        GemmTimes(read_table(path), "bfloat16")


# ---- sources --------------------------------------------------------------------------


def test_latest_is_the_newest_version_and_an_old_one_can_be_named(tables: Path) -> None:
    latest = resolve_source(tables, "h100_sxm", "vllm", "latest")
    assert latest.version == "0.2.0"
    assert latest.folders["gemm"].name == "0.2.0"
    # 0.1.0 has GEMMs but no attention at or below it: never filled forward from 0.2.0.
    with pytest.raises(ConfigError, match=r"no attention tables at or below 0\.1\.0"):
        resolve_source(tables, "h100_sxm", "vllm", "0.1.0")


@pytest.mark.parametrize(
    ("system", "framework", "version", "field"),
    [
        ("b200_sxm", "vllm", "latest", "execution.measured.system"),
        ("h100_sxm", "sglang", "latest", "execution.measured.framework"),
        ("h100_sxm", "vllm", "9.9", "execution.measured.version"),
        ("h100_sxm", "tensorrt", "latest", "execution.measured.framework"),
    ],
)
def test_what_is_not_measured_is_a_config_error_listing_what_is(
    tables: Path, system: str, framework: str, version: str, field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_source(tables, system, framework, version)
    assert err.value.field == field
    listing = ("h100_sxm: vllm 0.1.0/0.2.0", "measured: 0.1.0, 0.2.0", "must be one of")
    assert any(text in str(err.value) for text in listing)


# ---- interpolation --------------------------------------------------------------------


increasing_points = st.lists(
    st.floats(min_value=1.0, max_value=1e6), min_size=1, max_size=12, unique=True
).map(sorted)


@settings(max_examples=200, deadline=None)
@given(xs=increasing_points, data=st.data(), log_log=st.booleans())
def test_a_curve_is_exact_at_its_points_positive_and_monotone_where_the_data_is(
    xs: list[float], data: st.DataObject, log_log: bool
) -> None:
    steps = data.draw(
        st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=len(xs), max_size=len(xs))
    )
    ys = list(np.cumsum(steps) + 1e-3)  # non-decreasing, positive
    ys = [float(y) for y in ys]
    curve = Curve(xs, ys, above_power=1.0, log_log=log_log)
    for x, y in zip(xs, ys, strict=True):
        assert curve(x) == y
    probes = sorted(data.draw(st.lists(st.floats(min_value=1e-3, max_value=1e7), max_size=20)))
    values = [curve(p) for p in probes]
    assert all(v > 0 for v in values)
    assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(values))


def test_a_gemm_off_the_grid_lies_between_its_neighbours_and_near_the_formula(
    tables: Path,
) -> None:
    gemm = GemmTimes(read_table(tables / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet"), "bfloat16")
    assert gemm(64, 4096, 4096) == pytest.approx(gemm_ms(64, 4096, 4096) * 1e-3, rel=1e-12)
    for m, n, k in [(48, 5120, 4096), (3000, 12288, 5120), (700, 4096, 20480)]:
        assert gemm(m, n, k) == pytest.approx(gemm_ms(m, n, k) * 1e-3, rel=0.06)
    # Past the largest n, time grows with n (the work).
    assert gemm(256, 131072, 4096) == pytest.approx(2 * gemm(256, 65536, 4096))


def test_prefill_grid_points_read_as_whole_prompts_or_a_chunk_over_a_prefix() -> None:
    assert prefill_shape(4096.0, 1024.5) == (2.0, 2048.0, 0.0)  # 2 prompts of 2048
    assert prefill_shape(2048.0, 1024.5) == (1.0, 2048.0, 0.0)  # where the readings meet
    batch, seq, prefix = prefill_shape(512.0, 4096.0 + 256.5)  # 512 tokens over 4096
    assert (batch, seq, prefix) == (1.0, 512.0, 4096.0)


# ---- the compiled predictor -----------------------------------------------------------


def llama_8b_measured(tables: Path, **kwargs: Any) -> Any:
    source = resolve_source(tables, "h100_sxm", "vllm", "latest")
    return measured_predictor(
        catalog.model("llama-3.1-8b"), catalog.device("h100-sxm"), source, **kwargs
    )


def test_measured_operations_follow_the_tables_and_the_rest_the_calibrated_roofline(
    tables: Path,
) -> None:
    predictor = llama_8b_measured(tables)
    sources = {op.name: op.source for op in predictor.ops}
    assert sources["qkv_proj"] == sources["down_proj"] == "measured:gemm (0.2.0)"
    assert sources["attn_decode"] == "measured:attention (0.2.0)"
    assert sources["input_norm"] == sources["rope"] == "calibrated"
    layers = 32
    # One decode of 64 requests over 2048 keys: qkv [64, 4096] x [4096, 6144] per layer.
    times = predictor.op_times(decodes(64, 2047))
    assert times["qkv_proj"] == pytest.approx(layers * gemm_ms(64, 6144, 4096) * 1e-3, rel=1e-9)
    assert times["attn_decode"] == pytest.approx(
        layers * generation_ms(64, 2048, 8) * 1e-3, rel=0.01
    )
    # A whole 2048-token prompt, and 512 tokens over 1536 cached: the whole prompt's
    # attention less the prefix's share of pairs.
    whole = predictor.op_times(prompt(2048))["attn_prefill"]
    assert whole == pytest.approx(layers * context_ms(1, 2048, 32) * 1e-3, rel=0.01)
    chunk = predictor.op_times(prompt(512, cached=1536))["attn_prefill"]
    share = (2048**2 - 1536**2) / 2048**2
    assert chunk == pytest.approx(whole * share, rel=0.02)


def test_tensor_parallelism_without_an_all_reduce_table_keeps_the_calibrated_ring(
    tables: Path,
) -> None:
    predictor = llama_8b_measured(tables, tensor_parallel_size=2)
    sources = {op.name: op.source for op in predictor.ops}
    assert sources["all_reduce"] == "calibrated"
    assert "all_reduce" in predictor.description["fallbacks"]
    one = llama_8b_measured(tables).op_times(decodes(8, 1000))["qkv_proj"]
    two = predictor.op_times(decodes(8, 1000))["qkv_proj"]
    assert two < one  # each worker's GEMM is half as wide


def test_a_layout_the_attention_tables_lack_is_a_config_error(tables: Path) -> None:
    source = resolve_source(tables, "h100_sxm", "vllm", "latest")
    narrow_heads = dataclasses.replace(catalog.model("llama-3.1-8b"), head_dim=64)
    with pytest.raises(ConfigError, match="do not cover its layout") as err:
        measured_predictor(narrow_heads, catalog.device("h100-sxm"), source)
    assert err.value.field == "replica.model"


# ---- GEMM kernels that split the grid; static FP8 (issue 29 fidelity findings) ---------


def test_gemm_kernels_that_split_the_grid_are_each_priced_where_measured(tmp_path: Path) -> None:
    """vLLM dispatches one GEMM dtype to several kernels by shape (block FP8 on an H100:
    FlashInfer up to 17 rows, DeepGEMM from 32): each kernel's rows price the points it
    measured, and only a point measured twice takes the kernel with the most rows."""
    small = [1, 2, 4, 8, 16]  # a kernel for few rows, measured slow
    large = [16, 32, 64, 128, 256, 512, 1024]  # the kernel with the most rows; 16 twice
    columns: dict[str, list[Any]] = {c: [] for c in ("m", "n", "k", "gemm_dtype", "latency")}
    columns["kernel_source"] = []
    for kernel, ms, scale in (("Small", small, 3.0), ("Large", large, 1.0)):
        for m, n, k in itertools.product(ms, (4096, 8192), (4096, 8192)):
            for name, value in zip(
                ("m", "n", "k", "gemm_dtype", "kernel_source", "latency"),
                (m, n, k, "fp8_block", kernel, scale * gemm_ms(m, n, k)),
                strict=True,
            ):
                columns[name].append(value)
    path = tmp_path / "gemm_perf.parquet"
    write(path, columns)
    gemm = GemmTimes(read_table(path), "fp8_block")
    assert gemm.m_grid == sorted(set(small) | set(large))
    for m in (1, 8):  # measured by the small kernel only: its own rows
        assert gemm(m, 4096, 8192) == pytest.approx(3e-3 * gemm_ms(m, 4096, 8192), rel=1e-12)
    for m in (16, 64):  # 16: measured by both, the kernel with the most rows wins
        assert gemm(m, 4096, 8192) == pytest.approx(1e-3 * gemm_ms(m, 4096, 8192), rel=1e-12)
    # Between the two kernels' ranges: linear in m between their edge points.
    edge8, edge16 = 3e-3 * gemm_ms(8, 4096, 4096), 1e-3 * gemm_ms(16, 4096, 4096)
    assert gemm(12, 4096, 4096) == pytest.approx((edge8 + edge16) / 2, rel=1e-12)


def test_the_h100_block_fp8_gemm_reads_flashinfer_below_32_rows_as_aiconfigurator() -> None:
    """Qwen3-32B-FP8 at TP 2, qkv_proj (5120 x 5120) on an H100, vLLM 0.24.0: 59.9 us at 8
    rows (FlashInfer's row, aiconfigurator's answer; DeepGEMM's 32-row time, 86.5 us, was
    priced before) and 166.9 us at 128 (DeepGEMM's)."""
    pytest.importorskip("aiconfigurator_core", reason="the measured tables need the package")
    from tokenyard.predictor.measured.data import package_root

    root = package_root()
    assert root is not None
    source = resolve_source(root, "h100_sxm", "vllm", "0.24.0")
    rows = read_table(source.folders["gemm"] / "gemm_perf.parquet")
    gemm = GemmTimes(rows, "fp8_block")
    assert gemm(8, 5120, 5120) * 1e6 == pytest.approx(59.9, abs=0.05)
    assert gemm(128, 5120, 5120) * 1e6 == pytest.approx(166.9, abs=0.05)
    flashinfer = rows.where(kernel_source="FlashInferFp8BlockScaledMMKernel")
    assert gemm(8, 5120, 5120) == GemmTimes(flashinfer, "fp8_block")(8, 5120, 5120)


def quantize_tables(root: Path, compute_scale_ms: float, scale_matrix_ms: float) -> None:
    """vLLM's quantize tables, at constant costs (a zero difference is allowed)."""
    grid = list(itertools.product(POWERS, DIMS))
    for name, value in (("computescale", compute_scale_ms), ("scale_matrix", scale_matrix_ms)):
        write(
            root / f"h100_sxm/quantize/vllm/0.2.0/{name}_perf.parquet",
            {
                "m": [m for m, _ in grid],
                "k": [k for _, k in grid],
                "quant_dtype": ["fp8"] * len(grid),
                "latency": [value] * len(grid),
            },
        )


def test_static_fp8_takes_off_the_quantize_tables_costs_or_says_it_cannot(tmp_path: Path) -> None:
    from tokenyard.catalog.quant import scheme

    root = tmp_path / "data"
    fp8 = gemm_columns()
    fp8["gemm_dtype"] = ["fp8"] * len(fp8["m"])
    both = {c: fp8[c] + gemm_columns()[c] for c in fp8}
    write(root / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet", both)
    attention = root / "h100_sxm/attention/vllm/0.2.0"
    write(attention / "context_attention_perf.parquet", attention_columns(False))
    write(attention / "generation_attention_perf.parquet", attention_columns(True))
    static = scheme("fp8", activation_scales="static", source="test")
    # Llama-3.1-8B, 64 decodes: qkv [64, 4096] x [4096, 6144], o [64, 4096] x [4096, 4096]
    qkv, o_proj = gemm_ms(64, 6144, 4096) * 1e-3, gemm_ms(64, 4096, 4096) * 1e-3
    # No quantize tables: the dynamic rows, said so.
    without = llama_8b_measured(root, quantization=static)
    assert without.description["fallbacks"]["gemm"].startswith(
        "static FP8 activations priced as dynamic: no quantize tables"
    )
    assert (
        "static fp8 activations priced at the dynamic fp8 rows" in (without.description["kernels"])
    )
    times = without.op_times(decodes(64, 2047))
    assert times["qkv_proj"] == pytest.approx(32 * qkv, rel=1e-9)
    # With them: less computescale everywhere, less scale_matrix too before o and down.
    quantize_tables(root, compute_scale_ms=0.0, scale_matrix_ms=0.001)
    assert "quantize" in resolve_source(root, "h100_sxm", "vllm", "latest").folders
    times = llama_8b_measured(root, quantization=static).op_times(decodes(64, 2047))
    assert times["qkv_proj"] == pytest.approx(32 * qkv, rel=1e-9)
    assert times["o_proj"] == pytest.approx(32 * (o_proj - 1e-6), rel=1e-9)
    quantize_tables(root, compute_scale_ms=0.0005, scale_matrix_ms=0.001)
    predictor = llama_8b_measured(root, quantization=static)
    assert "gemm" not in predictor.description["fallbacks"]
    times = predictor.op_times(decodes(64, 2047))
    assert times["qkv_proj"] == pytest.approx(32 * (qkv - 0.5e-6), rel=1e-9)
    assert times["o_proj"] == pytest.approx(32 * (o_proj - 1.5e-6), rel=1e-9)
    # Dynamic scales (the default for "fp8"): the rows as measured.
    dynamic = llama_8b_measured(root, quantization=scheme("fp8")).op_times(decodes(64, 2047))
    assert dynamic["o_proj"] == pytest.approx(32 * o_proj, rel=1e-9)
