"""The measured predictor: table readers, version resolution, interpolation, compilation,
and its place as the simulator's default (docs/predictor.md#measured).

Most tests write small tables of their own in aiconfigurator-core's schema, with times from
a known formula, so no extra is needed; tests on the real package data skip without it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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
from tokenyard.simulation import config_from_mapping, load_config, simulate
from tokenyard.simulation.execution import choose_execution

# ---- synthetic tables: times from known formulas (ms) ---------------------------------


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


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root with one system (``h100_sxm``), vllm 0.2.0 GEMM and attention, and an
    older 0.1.0 GEMM table; no all-reduce or MoE tables."""
    root = tmp_path_factory.mktemp("measured") / "data"
    write(root / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet", gemm_columns())
    old = gemm_columns()
    old["latency"] = [2 * v for v in old["latency"]]
    write(root / "h100_sxm/gemm/vllm/0.1.0/gemm_perf.parquet", old)
    attention = root / "h100_sxm/attention/vllm/0.2.0"
    write(attention / "context_attention_perf.parquet", attention_columns(False))
    write(attention / "generation_attention_perf.parquet", attention_columns(True))
    return root


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


# ---- in the simulator -----------------------------------------------------------------

SMALL_WORKLOAD = {
    "kind": "synthetic",
    "num_requests": 200,
    "arrival": {"kind": "poisson", "qps": 10.0},
    "prompt_tokens": {"kind": "uniform", "low": 100, "high": 2000},
    "output_tokens": {"kind": "uniform", "low": 10, "high": 100},
}


def run(execution: dict[str, Any], **replica: Any) -> Any:
    base = {"model": "llama-3.1-8b", "device": "h100-sxm", **replica}
    config = config_from_mapping(
        {
            "cluster": {"num_replicas": 1},
            "replica": base,
            "execution": execution,
            "workload": SMALL_WORKLOAD,
        }
    )
    return simulate(config)


def test_a_simulation_names_its_tables_and_every_op_source(tables: Path) -> None:
    result = run({"model": "measured", "measured": {"data_dir": str(tables)}})
    execution = result.summary["config"]["execution"]
    assert execution["model"] == "measured"
    assert execution["label"] == "measured: h100_sxm, vllm 0.2.0; GEMM bfloat16"
    assert execution["op_sources"]["attn_prefill"] == "measured:attention (0.2.0)"


def test_auto_falls_back_to_the_calibrated_roofline_and_says_why() -> None:
    config = config_from_mapping({"replica": {"model": "llama-3.1-8b", "device": "a10g"}})
    choice = choose_execution(config)
    assert choice.kind == "roofline"
    reasons = ("no measured system is known for 'a10g'", "measured tables are not installed")
    assert any(reason in choice.reason for reason in reasons)
    assert choice.calibration is not None
    assert choice.calibration.proxy_for == "l40s"
    assert choice.label() == "roofline calibrated to measured tables (curves of l40s)"


def test_auto_with_tables_named_refuses_to_fall_back(tables: Path) -> None:
    config = config_from_mapping(
        {
            "replica": {"model": "llama-3.1-8b", "device": "a10g"},
            "execution": {"measured": {"data_dir": str(tables)}},
        }
    )
    with pytest.raises(ConfigError, match="no measured system is known for 'a10g'") as err:
        choose_execution(config)
    assert err.value.field == "replica.device"


@pytest.mark.parametrize(
    ("execution", "field"),
    [
        ({"efficiency": {"gemm": 0.6}}, "execution.efficiency"),
        ({"model": "measured", "efficiency": {}}, "execution.efficiency"),
        ({"model": "roofline", "measured": {"system": "h100_sxm"}}, "execution.measured"),
        ({"model": "roofline", "constant_s": 0.01}, "execution.constant_s"),
        ({"model": "linear", "profiled": {"profiles": ["a.csv"]}}, "execution.profiled"),
        ({"measured": {"framework": "tgi"}}, "execution.measured.framework"),
        ({"model": "linear", "cpu": {"sample_s": 0.001}}, "execution.cpu"),
    ],
)
def test_a_setting_the_chosen_model_would_ignore_is_refused(
    execution: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"execution": execution})
    assert err.value.field == field


def test_measured_with_an_unmeasured_dtype_lists_the_measured_ones(tables: Path) -> None:
    with pytest.raises(ConfigError, match="measured: bfloat16") as err:
        run({"model": "measured", "measured": {"data_dir": str(tables)}}, dtype="fp8")
    assert err.value.field == "replica.dtype"


def copy_tables(tables: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(tables, tmp_path / "data"))


def measured_in(root: Path, **measured: Any) -> dict[str, Any]:
    return {"model": "measured", "measured": {"data_dir": str(root), **measured}}


@pytest.mark.parametrize("link", ["dangling", "looping"])
def test_a_broken_link_in_data_dir_is_a_profile_error_naming_the_key_and_the_file(
    tables: Path, tmp_path: Path, link: str
) -> None:
    root = copy_tables(tables, tmp_path)
    path = root / "h100_sxm/attention/vllm/0.2.0/generation_attention_perf.parquet"
    path.unlink()
    path.symlink_to(tmp_path / "moved.parquet" if link == "dangling" else path)
    with pytest.raises(ProfileError) as err:  # was a bare FileNotFoundError / OSError
        run(measured_in(root))
    assert (err.value.field, err.value.path) == ("execution.measured.data_dir", str(path))
    assert str(err.value).startswith(f"execution.measured.data_dir: {path}: cannot read the table")


def test_a_gemm_table_cut_to_one_row_is_refused_naming_the_table_and_the_axis(
    tables: Path, tmp_path: Path
) -> None:
    # It used to price every GEMM from that one launch-bound reading (issue 32: TTFT p50
    # 21.6 s where the whole table gives 0.010 s).
    root = copy_tables(tables, tmp_path)
    gemm = root / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet"
    write(gemm, {name: values[:1] for name, values in gemm_columns().items()})
    with pytest.raises(ProfileError) as err:
        run(measured_in(root))
    assert (err.value.field, err.value.path) == ("execution.measured.data_dir", str(gemm))
    assert f"{gemm}:m: too sparse: gemm_dtype 'bfloat16' has one measured m (1)" in str(err.value)


def moe_columns(distributions: tuple[str, ...], tokens: list[int]) -> dict[str, list[Any]]:
    """Mixtral-8x7B's MoE block at TP 1 (times from a simple formula, in ms)."""
    rows = [(t, d) for d in distributions for t in tokens]
    n = len(rows)
    shape = {"hidden_size": 4096, "inter_size": 14336, "topk": 2, "num_experts": 8}
    return {
        "num_tokens": [r[0] for r in rows],
        **{name: [value] * n for name, value in shape.items()},
        "moe_tp_size": [1] * n,
        "moe_ep_size": [1] * n,
        "moe_dtype": ["bfloat16"] * n,
        "distribution": [r[1] for r in rows],
        "latency": [0.05 + 1e-4 * r[0] for r in rows],
    }


def mixtral_measured(root: Path, **kwargs: Any) -> Any:
    source = resolve_source(root, "h100_sxm", "vllm", "latest")
    return measured_predictor(
        catalog.model("mixtral-8x7b"), catalog.device("h100-sxm"), source, **kwargs
    )


def test_an_moe_routing_the_tables_lack_is_refused_listing_the_measured_ones(
    tables: Path, tmp_path: Path
) -> None:
    root = copy_tables(tables, tmp_path)
    routings = ("power_law_1.01", "power_law_1.2")
    write(root / "h100_sxm/moe/vllm/0.2.0/moe_perf.parquet", moe_columns(routings, POWERS))
    predictor = mixtral_measured(root)
    assert {op.name: op.source for op in predictor.ops}["moe_experts"] == "measured:moe (0.2.0)"
    # It used to fall back to the calibrated roofline, changing the answer unasked.
    with pytest.raises(ConfigError) as err:
        mixtral_measured(root, moe_distribution="balanced")
    assert err.value.field == "execution.measured.moe_distribution"
    assert "under power_law_1.01, power_law_1.2, got 'balanced'" in str(err.value)


def test_an_moe_shape_measured_at_one_token_count_is_not_measured(
    tables: Path, tmp_path: Path
) -> None:
    # aiconfigurator-core's own vLLM tables hold a few such shapes (a collection that
    # stopped early): the calibrated roofline prices them, and says why.
    root = copy_tables(tables, tmp_path)
    write(root / "h100_sxm/moe/vllm/0.2.0/moe_perf.parquet", moe_columns(("power_law_1.2",), [1]))
    predictor = mixtral_measured(root)
    assert {op.name: op.source for op in predictor.ops}["gate_up_proj"] == "calibrated"
    assert "one point, too few to interpolate" in predictor.description["fallbacks"]["gate_up_proj"]


@pytest.mark.parametrize(
    ("measured", "field", "message"),
    [
        ({"system": ""}, "system", "must not be empty (leave it out for the default), got ''"),
        ({"framework": " "}, "framework", "must not be empty"),
        ({"data_dir": ""}, "data_dir", "must not be empty"),
        ({"version": ""}, "version", "must not be empty (name one, or 'latest')"),
        (
            {"moe_distribution": "x"},
            "moe_distribution",
            "must be one of balanced, power_law_1.01, power_law_1.2 (the routings the MoE "
            "tables measure), got 'x'",
        ),
    ],
)
def test_an_empty_or_unmeasured_measured_setting_is_refused_at_config_time(
    measured: dict[str, Any], field: str, message: str
) -> None:
    # An empty system used to mean the default, and an unknown routing to change the answer.
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"execution": {"measured": measured}})
    assert err.value.field == f"execution.measured.{field}"
    assert message in str(err.value)


def test_the_constant_efficiencies_still_price_the_datasheet_roofline() -> None:
    calibrated = run({"model": "roofline"})
    datasheet = run({"model": "roofline", "efficiency": {}})
    assert calibrated.summary["config"]["execution"]["label"].startswith("roofline calibrated")
    assert datasheet.summary["config"]["execution"]["label"].startswith("roofline: datasheet")
    assert calibrated.summary["latency_s"]["ttft"]["mean"] != pytest.approx(
        datasheet.summary["latency_s"]["ttft"]["mean"]
    )


def test_linear_says_what_it_ignores() -> None:
    execution = run({"model": "linear"}).summary["config"]["execution"]
    assert "ignores the replica's model, device" in execution["label"]
    assert "replica.device" in execution["ignores"]


# ---- the real tables (the tokenyard[measured] extra) ------------------------------------


@pytest.fixture
def package() -> None:
    pytest.importorskip(
        "aiconfigurator_core", reason="the measured tables need the tokenyard[measured] extra"
    )


@pytest.mark.usefixtures("package")
def test_the_default_run_prices_batches_from_measured_tables() -> None:
    config = config_from_mapping({})
    choice = choose_execution(config)
    assert choice.kind == "measured"
    assert choice.label().startswith("measured: a100_sxm, vllm ")
    assert choice.source is not None
    assert choice.source.field == "execution.measured"  # what errors about its tables name


@pytest.mark.usefixtures("package")
@pytest.mark.parametrize(
    "change",
    [
        {"device": "h200"},
        {"model": "mistral-7b"},
        {"tensor_parallel_size": 2},
        {"kv_cache_dtype": "fp8"},
        {"dtype": "fp8"},
    ],
)
def test_every_replica_setting_changes_the_answer(change: dict[str, Any]) -> None:
    base = run({})
    other = run({}, **change)
    assert base.summary["config"]["execution"]["model"] == "measured"
    assert other.summary["config"]["execution"]["model"] == "measured"
    assert other.summary["latency_s"]["tpot"]["mean"] != base.summary["latency_s"]["tpot"]["mean"]


@pytest.mark.usefixtures("package")
def test_a_big_model_on_a_fast_gpu_is_not_priced_like_a_small_one_on_a_slow_gpu() -> None:
    # The example: under the old linear default these two gave identical answers.
    big = run({}, model="llama-3.1-70b", device="h200", tensor_parallel_size=8)
    small = run({}, model="llama-2-7b", device="a100-80gb")
    assert big.summary["config"]["execution"]["label"].startswith("measured: h200_sxm")
    ratio = big.summary["latency_s"]["tpot"]["mean"] / small.summary["latency_s"]["tpot"]["mean"]
    assert not math.isclose(ratio, 1.0, rel_tol=0.05)


def test_a_qwen3_config_json_relative_to_the_config_file_runs(tmp_path: Path) -> None:
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_hidden_layers": 4,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 1000,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    }
    (tmp_path / "qwen3.json").write_text(json.dumps(config))
    (tmp_path / "sim.toml").write_text(
        '[replica]\nmodel = "qwen3.json"\ndevice = "h100-sxm"\n[execution]\nmodel = "roofline"\n'
    )
    loaded = load_config(tmp_path / "sim.toml", {"workload": SMALL_WORKLOAD})
    result = simulate(loaded)
    assert result.summary["config"]["execution"]["op_sources"]["qk_norm"] == "calibrated"


def test_predictor_show_names_each_operations_source(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tokenyard.cli import main as cli_main

    code = cli_main(
        ["predictor", "show", "--model", "llama-3.1-8b", "--device", "a10g", "--decode", "8"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("execution model: roofline calibrated to measured tables")
    assert "qkv_proj" in out
    assert "calibrated" in out


def test_predictor_show_refuses_a_negative_size(capsys: pytest.CaptureFixture[str]) -> None:
    from tokenyard.cli import main as cli_main

    with pytest.raises(SystemExit):
        cli_main(
            [
                "predictor",
                "show",
                "--model",
                "llama-3.1-8b",
                "--device",
                "a10g",
                "--prefill",
                "-5000",
            ]
        )
    assert "must be an integer in [0, 16777216], got -5000" in capsys.readouterr().err


def test_a_built_predictor_is_kept_on_disk_and_rebuilt_when_its_tables_change(
    tables: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from tokenyard.predictor.measured import build
    from tokenyard.simulation import execution as ex

    monkeypatch.setenv("TOKENYARD_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "data"
    shutil.copytree(tables, root)
    measured = {"model": "measured", "measured": {"data_dir": str(root)}}

    def columns() -> dict[str, bytes]:
        ex._cached_measured.cache_clear()  # the in-process caches: only the disk's is left
        build._read_version.cache_clear()
        result = run(measured)
        return {name: col.tobytes() for name, col in result.columns.items()}

    built = columns()
    kept = sorted((tmp_path / "cache/predictors").glob("measured-*.json"))
    assert len(kept) == 1

    def no_build(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("built again instead of read from the cache")

    with monkeypatch.context() as m:
        m.setattr(ex, "measured_predictor", no_build)
        assert columns() == built, "the kept predictor prices exactly as the built one"
    # Slower GEMMs: a new key, a new build, new times.
    gemm = root / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet"
    slower = gemm_columns()
    slower["latency"] = [3 * v for v in slower["latency"]]
    write(gemm, slower)
    assert columns() != built
    assert len(list((tmp_path / "cache/predictors").glob("measured-*.json"))) == 2
    # Rewritten during the session: the in-process caches answer by file version too, so
    # the original latencies price as at first without clearing anything.
    write(gemm, gemm_columns())
    restored = run(measured)
    assert {name: col.tobytes() for name, col in restored.columns.items()} == built
    # Another numpy (it interpolates the tables) is another key: built again.
    ex._cached_measured.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(np, "__version__", "0.0.0+another")
        m.setattr(ex, "measured_predictor", no_build)
        with pytest.raises(AssertionError, match="built again"):
            run(measured)
    ex._cached_measured.cache_clear()
    build._read_version.cache_clear()


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
