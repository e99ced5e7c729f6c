"""The measured predictor's MLA and MoE pricing fixes found by benches/fidelity_mla_moe.py
(issue 29): the MLA module follows the replica's dtype, a one-phase low-latency all-to-all
table is handled, the shared experts overlap the routed ones as vLLM runs them, and an
expert-parallel group wider than a node prices its all-to-all over the network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from measured_tables import attention_columns, gemm_columns, write
from model_configs import SMALL_DEEPSEEK, load_config
from step_shapes import decodes
from test_mla import module_columns

from tokenyard import catalog
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import resolve_source
from tokenyard.predictor.measured.moe import a2a_ops


def _gemm_bf16_and_fp8() -> dict[str, list[Any]]:
    """The synthetic GEMM rows twice: bfloat16, and fp8 at half the time."""
    bf16 = gemm_columns()
    fp8 = {**bf16, "gemm_dtype": ["fp8"] * len(bf16["m"])}
    fp8["latency"] = [v / 2 for v in bf16["latency"]]
    return {k: bf16[k] + fp8[k] for k in bf16}


def _gemm_and_attention(root: Path) -> Path:
    write(root / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet", _gemm_bf16_and_fp8())
    attention = root / "h100_sxm/attention/vllm/0.2.0"
    write(attention / "context_attention_perf.parquet", attention_columns(False))
    write(attention / "generation_attention_perf.parquet", attention_columns(True))
    return root


@pytest.fixture
def bf16_module_tables(tmp_path: Path) -> tuple[Path, catalog.ModelSpec]:
    """GEMM rows in bfloat16 and fp8; MLA module rows for the small DeepSeek in bfloat16
    only (``gemm_type`` bfloat16)."""
    spec = load_config(tmp_path, SMALL_DEEPSEEK)
    root = _gemm_and_attention(tmp_path / "data")
    mla = root / "h100_sxm/mla/vllm/0.2.0"
    write(mla / "mla_context_module_perf.parquet", module_columns(spec.source, False))
    write(mla / "mla_generation_module_perf.parquet", module_columns(spec.source, True))
    return root, spec


def test_the_mla_module_follows_replica_dtype_fp8(
    bf16_module_tables: tuple[Path, catalog.ModelSpec], tmp_path: Path
) -> None:
    """``replica.dtype = "fp8"`` on an unquantized model: the module tables measure only
    bfloat16 GEMMs, so the projections are priced at the fp8 GEMM rows (half the bf16
    time here) and the attention by the fallback, with the reason; before the fix the
    bfloat16 module rows priced it as if the setting were absent."""
    root, spec = bf16_module_tables
    source = resolve_source(root, "h100_sxm", "vllm", "latest")
    h100 = catalog.device("h100-sxm")
    bf16 = measured_predictor(spec, h100, source, tensor_parallel_size=2)
    fp8 = measured_predictor(
        spec, h100, source, tensor_parallel_size=2, weight_dtype="fp8", weight_bytes=1.0
    )
    assert "MLA module (bfloat16" in bf16.description["kernels"]
    assert "MLA module" not in fp8.description["kernels"]
    names = {op.name: op.source for op in fp8.ops}
    assert names["attn_decode"] == "calibrated"
    assert "gemm_type 'fp8'" in fp8.description["fallbacks"]["attn_decode"]
    assert names["q_b_proj"] == names["o_proj"] == "measured:gemm (0.2.0)"
    # The bf16 projections, from the same GEMM rows without module tables beside them.
    plain = _gemm_and_attention(tmp_path / "plain")
    plain_source = resolve_source(plain, "h100_sxm", "vllm", "latest")
    projections = measured_predictor(spec, h100, plain_source, tensor_parallel_size=2)
    shape = decodes(16, 511)
    ratio = fp8.op_times(shape)["q_b_proj"] / projections.op_times(shape)["q_b_proj"]
    assert ratio == pytest.approx(0.5, rel=1e-6)


# ---- the all-to-all -------------------------------------------------------------------


def _a2a_columns(phases: dict[str, tuple[str, ...]]) -> dict[str, list[Any]]:
    rows = [
        (backend, phase, tokens)
        for backend, kept in phases.items()
        for phase in kept
        for tokens in ((1, 2, 4, 8, 16, 32, 64, 128) if backend == "deepep_ll" else (128, 4096))
    ]
    n = len(rows)
    return {
        "op_name": ["moe_a2a"] * n,
        "kernel_source": ["deepep"] * n,
        "comm_backend": [r[0] for r in rows],
        "phase": [r[1] for r in rows],
        "ep_size": [2] * n,
        "node_num": [1] * n,
        "hidden_size": [1024] * n,
        "topk": [2] * n,
        "num_experts": [8] * n,
        "num_tokens": [r[2] for r in rows],
        "latency": [10.0 + r[2] for r in rows],  # microseconds
    }


def test_a_low_latency_table_measuring_only_combine_is_handled(tmp_path: Path) -> None:
    """deepep_ll measures combine only, deepep_ht both phases: dispatch takes deepep_ht,
    combine deepep_ll up to 128 tokens per GPU; before the fix the banner's limit read
    the missing deepep_ll dispatch rows and raised an uncaught NotMeasured."""
    spec = load_config(tmp_path, SMALL_DEEPSEEK)
    root = _gemm_and_attention(tmp_path / "data")
    columns = _a2a_columns({"deepep_ll": ("combine",), "deepep_ht": ("dispatch", "combine")})
    write(root / "h100_sxm/comm/vllm/0.2.0/moe_a2a_perf.parquet", columns)
    source = resolve_source(root, "h100_sxm", "vllm", "latest")
    out, words = a2a_ops(source, spec, 1, 2)
    assert words.startswith("deepep_ll up to 128 tokens per GPU, deepep_ht above")
    combine, dispatch = out["moe_combine"][0], out["moe_dispatch"][0]
    assert combine is not None
    assert dispatch is not None
    # 64 tokens: combine from deepep_ll (10 + 64 us), dispatch from deepep_ht (128-token row).
    at = {"num_tokens": 64.0}
    assert combine.time(at) == pytest.approx(74e-6, rel=1e-3)
    assert dispatch.time(at) == pytest.approx(138e-6, rel=1e-3)
