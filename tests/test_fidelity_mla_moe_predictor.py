"""The measured predictor's MLA and MoE pricing fixes found by benches/fidelity_mla_moe.py
(issue 29): the MLA module follows the replica's dtype, a one-phase low-latency all-to-all
table is handled, the shared experts overlap the routed ones as vLLM runs them, and an
expert-parallel group wider than a node prices its all-to-all over the network."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from measured_tables import attention_columns, gemm_columns, write
from model_configs import SMALL_DEEPSEEK, load_config, require_bundled
from step_shapes import decodes
from synthetic_jobs import one_replica, synthetic_workload
from test_mla import module_columns

from tokenyard import catalog
from tokenyard.catalog.quant import Quantization, resolve_quantization, scheme
from tokenyard.errors import ConfigError
from tokenyard.predictor import roofline_predictor
from tokenyard.predictor.calibration import builtin_calibration
from tokenyard.predictor.compiled import TableCost
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import SYSTEM_OF_DEVICE, package_root, resolve_source
from tokenyard.predictor.measured.gemm import MLA_PROJECTIONS, modules_unquantized
from tokenyard.predictor.measured.moe import (
    SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD,
    a2a_ops,
    overlap_shared_experts,
)
from tokenyard.predictor.roofline_moe import network_a2a_seconds
from tokenyard.simulation import simulate


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


# ---- shared experts beside the routed ones ---------------------------------------------


def _flat(seconds: float) -> TableCost:
    return TableCost(x="num_tokens", xs=(1.0, 4096.0), values=(seconds, seconds))


def test_shared_experts_hide_behind_the_routed_path_up_to_256_tokens() -> None:
    """Shared path 3 + 1 us, routed path 0.5 + 2.5 us: up to 256 tokens the layer costs
    max(4, 3) = 4 us, the shared GEMMs keeping (4 - 3) / 4 of their time (0.75 and
    0.25 us); above 256 tokens, all of it (3 and 1 us)."""
    out: dict[str, Any] = {
        "router": (_flat(0.5e-6), "measured:gemm", ""),
        "moe_experts": (_flat(2.5e-6), "measured:moe", ""),
        "shared_gate_up_proj": (_flat(3e-6), "measured:gemm", ""),
        "shared_down_proj": (_flat(1e-6), "measured:gemm", ""),
    }
    words = overlap_shared_experts(out)
    assert words == "shared experts beside the routed ones up to 256 tokens"
    assert SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD == 256
    up, down = out["shared_gate_up_proj"][0], out["shared_down_proj"][0]
    for tokens, expected in ((8, (0.75e-6, 0.25e-6)), (256, (0.75e-6, 0.25e-6))):
        at = {"num_tokens": float(tokens)}
        assert (up.time(at), down.time(at)) == pytest.approx(expected, rel=1e-9)
    at = {"num_tokens": 512.0}
    assert (up.time(at), down.time(at)) == pytest.approx((3e-6, 1e-6), rel=1e-9)


def test_shared_experts_longer_than_nothing_routed_are_left_whole() -> None:
    """Unmeasured experts (the roofline prices them): nothing is rewritten."""
    out: dict[str, Any] = {
        "moe_experts": (None, "calibrated", "no MoE table"),
        "shared_gate_up_proj": (_flat(3e-6), "measured:gemm", ""),
        "shared_down_proj": (_flat(1e-6), "measured:gemm", ""),
    }
    assert overlap_shared_experts(out) == ""
    assert out["shared_gate_up_proj"][0].values == (3e-6, 3e-6)


def _bundled_predictor(name: str, device: str, **layout: Any) -> Any:
    require_bundled(name)
    root = package_root()
    if root is None:
        pytest.skip("aiconfigurator-core's tables are not installed")
    model = catalog.model(name)
    quant = resolve_quantization(model.quantization, "auto", "auto")
    return measured_predictor(
        model,
        catalog.device(device),
        resolve_source(root, SYSTEM_OF_DEVICE[device], "vllm", "latest"),
        weight_dtype="auto",
        kv_cache_dtype="bf16",
        weight_bytes=quant.bytes_per_weight if quant else 2.0,
        quantization=quant,
        **layout,
    )


def test_deepseek_v3_tp8_shared_experts_cost_little_until_257_tokens() -> None:
    """DeepSeek-V3 on 8 H200s: at 256 decodes the shared GEMMs run beside the routed
    experts and add only what outlasts them; at 257 vLLM runs them after, in full."""
    predictor = _bundled_predictor("deepseek-ai/DeepSeek-V3", "h200", tensor_parallel_size=8)
    assert "shared experts beside the routed ones" in predictor.description["kernels"]

    def shared(batch: int) -> float:
        ops = predictor.op_times(decodes(batch, 1023))
        return float(ops["shared_gate_up_proj"] + ops["shared_down_proj"])

    assert shared(256) < 0.25 * shared(257)


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
    assert words.startswith("deepep_ll (combine only) up to 128 tokens per GPU, deepep_ht above")
    combine, dispatch = out["moe_combine"][0], out["moe_dispatch"][0]
    assert combine is not None
    assert dispatch is not None
    # 64 tokens: combine from deepep_ll (10 + 64 us), dispatch from deepep_ht (128-token row).
    at = {"num_tokens": 64.0}
    assert combine.time(at) == pytest.approx(74e-6, rel=1e-3)
    assert dispatch.time(at) == pytest.approx(138e-6, rel=1e-3)


# ---- expert parallelism across nodes --------------------------------------------------


def test_kimi_k2_ep16_over_two_nodes_prices_deepep_from_the_inter_node_rows() -> None:
    """Kimi-K2 over TP 1 x DP 16 (EP 16) on H200s: two 8-GPU nodes. vLLM 0.24.0's own
    table measures one node only, so the all-to-all comes from DeepEP's 2-node rows
    (SGLang 0.5.6.post2: hidden 7168, top-8, 256 or 288 experts; 288 is nearest to
    Kimi's 384). 8 decodes per rank: the low-latency dispatch row at 8 tokens, 24.60 us,
    and combine 37.70 us, in each of the 60 MoE layers."""
    predictor = _bundled_predictor(
        "moonshotai/Kimi-K2-Instruct",
        "h200",
        tensor_parallel_size=1,
        expert_parallel_size=16,
        data_parallel_size=16,
    )
    sources = {op.name: op.source for op in predictor.ops}
    assert sources["moe_dispatch"] == sources["moe_combine"] == "measured:wideep_deepep"
    kernels = predictor.description["kernels"]
    assert "DeepEP over 2 nodes from sglang 0.5.6.post2" in kernels
    assert "at 288 experts (nearest)" in kernels
    ops = predictor.op_times(decodes(8, 1023))
    assert ops["moe_dispatch"] == pytest.approx(60 * 24.60e-6, rel=1e-3)
    assert ops["moe_combine"] == pytest.approx(60 * 37.70e-6, rel=1e-3)


def test_one_node_of_ep_keeps_the_frameworks_own_table() -> None:
    """EP 8 fits a node: vLLM's moe_a2a rows, not the inter-node ones."""
    predictor = _bundled_predictor(
        "deepseek-ai/DeepSeek-V3",
        "h200",
        tensor_parallel_size=1,
        expert_parallel_size=8,
        data_parallel_size=8,
    )
    assert {op.name: op.source for op in predictor.ops}["moe_dispatch"].startswith(
        "measured:moe_a2a"
    )


def test_without_inter_node_rows_the_network_prices_the_off_node_share() -> None:
    """B200: DeepEP's tables measure one node only, so EP 16 (two 8-GPU nodes) is priced
    over the network: half of each GPU's 8 tokens x 7168 x top-8 x 2 bytes leaves the node
    at 50 GB/s after 10 us, 10 + 9.175 = 19.175 us in each of the 60 MoE layers, the
    banner naming both tables it looked in. (The roofline's fallback prices it at NVLink's
    900 GB/s a direction.)"""
    predictor = _bundled_predictor(
        "moonshotai/Kimi-K2-Instruct",
        "b200",
        tensor_parallel_size=1,
        expert_parallel_size=16,
        data_parallel_size=16,
    )
    assert {op.name: op.source for op in predictor.ops}["moe_dispatch"] == "roofline:network"
    words = predictor.description["kernels"]
    assert "roofline over the network (50% of each GPU's tokens" in words
    assert "moe_a2a_perf" in words
    assert "no DeepEP inter-node table" in words
    assert predictor.description["a2a"].startswith("roofline over the network")
    ops = predictor.op_times(decodes(8, 1023))
    assert ops["moe_dispatch"] == pytest.approx(60 * 19.175e-6, rel=1e-3)
    assert ops["moe_combine"] == ops["moe_dispatch"]


def test_the_network_fallback_takes_the_longer_of_nic_and_nvlink_as_the_roofline() -> None:
    """One rule for both predictors: where no table measures the nodes, the measured
    predictor keeps the calibrated roofline's all-to-all, the longer of the off-node share
    over the NIC and the rest over NVLink. With a NIC faster than NVLink (a made-up B200
    at 20 TB/s) the NVLink half decides, which the off-node share alone would not price."""
    require_bundled("moonshotai/Kimi-K2-Instruct")
    root = package_root()
    if root is None:
        pytest.skip("aiconfigurator-core's tables are not installed")
    model = catalog.model("moonshotai/Kimi-K2-Instruct")
    fast_nic = dataclasses.replace(catalog.device("b200"), network_gbps=20_000.0)
    source = resolve_source(root, SYSTEM_OF_DEVICE["b200"], "vllm", "latest")
    layout: dict[str, Any] = dict(
        tensor_parallel_size=1, expert_parallel_size=16, data_parallel_size=16
    )
    measured = measured_predictor(model, fast_nic, source, **layout)
    roofline = roofline_predictor(
        model, fast_nic, calibration=builtin_calibration(fast_nic), **layout
    )
    assert {op.name: op.source for op in measured.ops}["moe_dispatch"] == "roofline:network"
    off_node = network_a2a_seconds(model, fast_nic, 1, 16)
    assert off_node is not None
    for tokens in (8, 2048):
        priced = measured.op_times(decodes(tokens, 1023))["moe_dispatch"]
        assert priced == pytest.approx(roofline.op_times(decodes(tokens, 1023))["moe_dispatch"])
    # 2,048 tokens a rank: NVLink's half outlasts the NIC's (8 tokens: the NIC's latency).
    assert priced > model.num_moe_layers * off_node(2048) * 1.5


# ---- checkpoints that keep the MLA projections 16-bit ---------------------------------


def _nvfp4(*kept: str) -> Quantization:
    return dataclasses.replace(scheme("nvfp4"), unquantized_modules=kept)


def test_which_exclude_lists_keep_the_mla_projections_16_bit(tmp_path: Path) -> None:
    """The small DeepSeek has 4 layers: a ``self_attn*`` wildcard, or the projections
    named in 2 of the 4 layers, keep them 16-bit; 1 of 4, or only the LM head, do not."""
    spec = load_config(tmp_path, SMALL_DEEPSEEK)
    assert modules_unquantized(_nvfp4("model.layers.*.self_attn*"), spec, "mla")
    two = [f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in MLA_PROJECTIONS]
    assert modules_unquantized(_nvfp4(*two), spec, "mla")
    assert not modules_unquantized(_nvfp4(*two[:4]), spec, "mla")
    assert not modules_unquantized(_nvfp4("lm_head"), spec, "mla")
    assert not modules_unquantized(None, spec, "mla")


def test_deepseek_v3_1_nvfp4_prices_its_16_bit_projections_with_the_bf16_module() -> None:
    """nvidia/DeepSeek-V3.1-NVFP4's hf_quant_config excludes q_a, kv_a, q_b and kv_b of
    every layer from NVFP4 (vLLM builds them unquantized): the MLA module's bfloat16
    rows, not its nvfp4 ones (which price NVFP4 projection GEMMs that never run), while
    the experts stay NVFP4. Before the fix the banner read ``MLA module (nvfp4``."""
    require_bundled("nvidia/DeepSeek-V3.1-NVFP4")
    quant = resolve_quantization(
        catalog.model("nvidia/DeepSeek-V3.1-NVFP4").quantization, "auto", "auto"
    )
    assert quant is not None
    assert "model.layers.0.self_attn.q_b_proj" in quant.unquantized_modules
    predictor = _bundled_predictor("nvidia/DeepSeek-V3.1-NVFP4", "b200", tensor_parallel_size=4)
    kernels = predictor.description["kernels"]
    assert "MLA module (bfloat16, KV bfloat16, 32 heads per GPU)" in kernels
    assert "(projections 16-bit in the checkpoint)" in kernels
    assert "MoE nvfp4" in kernels


def test_an_nvl72_rack_is_one_nvlink_domain_for_the_all_to_all() -> None:
    """GB200 NVL72: 72 GPUs in one NVLink domain, so EP 16 is one node there (no
    inter-node rows are looked for: the reason names 1 node), where 8-GPU H200 nodes
    make it two."""
    assert catalog.device("gb200").nvlink_domain == 72
    assert catalog.device("gb300").nvlink_domain == 72
    assert catalog.device("h200").nvlink_domain == 8
    predictor = _bundled_predictor(
        "moonshotai/Kimi-K2-Instruct",
        "gb200",
        tensor_parallel_size=1,
        expert_parallel_size=16,
        data_parallel_size=16,
    )
    why = predictor.description["fallbacks"]["moe_dispatch"]
    assert "EP 16 (1 node(s))" in why
    assert "inter-node" not in why


def test_nvlink_domain_must_be_a_positive_integer() -> None:
    h200 = catalog.device("h200")
    with pytest.raises(ConfigError, match=r"devices\.h200.*nvlink_domain"):
        dataclasses.replace(h200, nvlink_domain=0)


def test_under_deepep_the_shared_experts_overlap_the_combine_at_any_size() -> None:
    """With attention DP (DeepEP), vLLM's modular kernel runs the shared experts while the
    combine is in flight, at every token count: shared 3 + 1 us beside a 2.5 us combine
    keep (4 - 2.5) / 4 of their time at 8 tokens and at 4,096 alike; the experts (9 us)
    are not beside them."""
    out: dict[str, Any] = {
        "router": (_flat(0.5e-6), "measured:gemm", ""),
        "moe_experts": (_flat(9e-6), "measured:moe", ""),
        "moe_dispatch": (_flat(2e-6), "measured:moe_a2a", ""),
        "moe_combine": (_flat(2.5e-6), "measured:moe_a2a", ""),
        "shared_gate_up_proj": (_flat(3e-6), "measured:gemm", ""),
        "shared_down_proj": (_flat(1e-6), "measured:gemm", ""),
    }
    assert overlap_shared_experts(out) == "shared experts beside the all-to-all's combine"
    up, down = out["shared_gate_up_proj"][0], out["shared_down_proj"][0]
    for tokens in (8.0, 4096.0):
        at = {"num_tokens": tokens}
        assert (up.time(at), down.time(at)) == pytest.approx((1.125e-6, 0.375e-6), rel=1e-9)


def test_an_unmeasured_combine_leaves_the_shared_experts_whole() -> None:
    out: dict[str, Any] = {
        "moe_experts": (_flat(9e-6), "measured:moe", ""),
        "moe_combine": (None, "calibrated", "no rows"),
        "shared_gate_up_proj": (_flat(3e-6), "measured:gemm", ""),
        "shared_down_proj": (_flat(1e-6), "measured:gemm", ""),
    }
    assert overlap_shared_experts(out) == ""
    assert out["shared_gate_up_proj"][0].values == (3e-6, 3e-6)


def test_kimi_k2_ep16_over_two_nodes_simulates_end_to_end() -> None:
    require_bundled("moonshotai/Kimi-K2-Instruct")
    replica = {
        "model": "moonshotai/Kimi-K2-Instruct",
        "device": "h200",
        "tensor_parallel_size": 1,
        "expert_parallel_size": 16,
        "data_parallel_size": 16,
    }
    workload = synthetic_workload(40, qps=4.0, prompt_tokens=(100, 2000), output_tokens=(10, 50))
    result = simulate(one_replica(replica, workload))
    c = result.summary["config"]
    assert c["layout"] == "TP 1 x DP 16 (16 schedulers), EP 16, PP 1"
    assert c["execution"]["a2a"].startswith("measured: DeepEP over 2 nodes")
    assert c["execution"]["op_sources"]["moe_dispatch"] == "measured:wideep_deepep"
    assert result.summary["num_requests"] == 40
