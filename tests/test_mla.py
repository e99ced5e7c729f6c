"""Multi-head latent attention models (DeepSeek-V2/V3/R1, Kimi-K2): read from config.json,
counted, planned and priced (issue 29, item 1).

Hand-checkable numbers on a small MLA config the tests write, the published sizes of the
bundled DeepSeek-V3 and Kimi-K2 configs, and vLLM's KV arithmetic for DeepSeek-V3 on eight
H200s.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from measured_tables import attention_columns, gemm_columns, write
from model_configs import SMALL_DEEPSEEK, load_config, require_bundled
from step_shapes import decodes, prompt
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard import catalog
from tokenyard.catalog.quant import resolve_quantization
from tokenyard.errors import ConfigError
from tokenyard.predictor import roofline_predictor
from tokenyard.predictor.measured.build import MLA_MODULE_OPS, measured_predictor
from tokenyard.predictor.measured.data import resolve_source
from tokenyard.simulation import plan_memory, simulate

# Per layer, by hand (h 1024, 8 heads, r = 32 + 16 = 48):
Q_A, Q_B = 1024 * 256, 256 * 8 * 48  # 262 144, 98 304
KV_A, KV_B = 1024 * (128 + 16), 128 * 8 * (32 + 32)  # 147 456, 65 536
O_PROJ = 8 * 32 * 1024  # 262 144
ATTENTION = Q_A + Q_B + KV_A + KV_B + O_PROJ + 256 + 128  # + the two latent norms
DENSE_FFN = 3 * 1024 * 2048
EXPERT = 3 * 1024 * 256
ROUTER = 1024 * 8
EDGE = 2 * 1000 * 1024 + 1024  # embeddings, lm_head, final norm


def small(tmp_path: Path, **changes: Any) -> catalog.ModelSpec:
    return load_config(tmp_path, SMALL_DEEPSEEK, **changes)


def test_a_deepseek_config_reads_as_mla_layers_with_dense_then_moe_ffns(tmp_path: Path) -> None:
    spec = small(tmp_path)
    assert spec.mla is not None
    assert (spec.mla.latent_dim, spec.mla.qk_head_dim) == (144, 48)
    kinds = [(k.attention, k.ffn, k.intermediate_size, k.count) for k in spec.layer_kinds()]
    assert kinds == [("mla", "dense", 2048, 1), ("mla", "moe", 256, 3)]
    assert (spec.num_shared_experts, spec.num_mtp_layers) == (1, 1)


def test_parameters_of_the_small_config_by_hand(tmp_path: Path) -> None:
    spec = small(tmp_path)
    norms = 2 * 1024
    dense = ATTENTION + norms + DENSE_FFN
    moe = ATTENTION + norms + 9 * EXPERT + ROUTER  # 8 routed + 1 shared
    assert spec.num_parameters() == dense + 3 * moe + EDGE == 32_950_784
    active = ATTENTION + norms + 3 * EXPERT + ROUTER  # top-2 + the shared one
    assert spec.num_active_parameters() == dense + 3 * active + EDGE


def test_no_query_compression_is_one_q_proj(tmp_path: Path) -> None:
    """DeepSeek-V2-Lite's ``q_lora_rank: null``: queries straight from the hidden state."""
    spec = small(tmp_path, q_lora_rank=None)
    assert spec.mla is not None
    assert spec.mla.q_lora_rank == 0
    attention = 1024 * 8 * 48 + KV_A + KV_B + O_PROJ + 128
    with_q_lora = small(tmp_path)
    assert with_q_lora.num_parameters() - spec.num_parameters() == 4 * (ATTENTION - attention)


def test_moe_layer_freq_leaves_dense_layers_between(tmp_path: Path) -> None:
    spec = small(tmp_path, num_hidden_layers=6, moe_layer_freq=2)
    # HF's rule: layer i >= first_k_dense_replace is MoE when i % moe_layer_freq == 0.
    assert spec.num_moe_layers == 2  # layers 2 and 4; 0 (first_k), 1, 3 and 5 dense
    assert [k.count for k in spec.layer_kinds()] == [4, 2]


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [
        # deepseek-ai/DeepSeek-V3 model card: 671B total, 37B activated (MTP's 14B apart).
        ("deepseek-ai/DeepSeek-V3", 671e9, 37e9),
        ("deepseek-ai/DeepSeek-R1", 671e9, 37e9),
        # moonshotai/Kimi-K2-Instruct model card: 1T total (1.03T), 32B activated.
        ("moonshotai/Kimi-K2-Instruct", 1.03e12, 32e9),
    ],
)
def test_published_sizes(name: str, total: float, active: float) -> None:
    """Totals within 1%. The active figures are published rounded to a billion and our
    count includes the input embedding table (0.93B for DeepSeek-V3, 1.17B for Kimi-K2):
    within 3% (37.55B and 32.86B; 36.6B and 31.7B without the input embeddings)."""
    require_bundled(name)
    spec = catalog.model(name)
    assert spec.num_parameters() == pytest.approx(total, rel=0.01)
    assert spec.num_active_parameters() == pytest.approx(active, rel=0.03)


#: Every bundled DeepSeek/Kimi/GLM config: loads, or the key that refuses it.
BUNDLED = {
    "deepseek-ai/DeepSeek-V3": None,
    "deepseek-ai/DeepSeek-R1": None,
    "moonshotai/Kimi-K2-Instruct": None,
    "nvidia/DeepSeek-V3.1-NVFP4": None,
    "deepseek-ai/DeepSeek-V3.2": None,  # DSA sparse attention: ModelSpec.indexer
    "nvidia/DeepSeek-V3.2-NVFP4": None,
    "zai-org/GLM-5": None,
    "zai-org/GLM-5-FP8": None,
    "nvidia/GLM-5-NVFP4": None,
    "zai-org/GLM-5.2": "index_topk_freq",  # an indexer shared across layers
    "moonshotai/Kimi-K2.5": "architectures",  # a vision-language wrapper
    "deepseek-ai/DeepSeek-V4-Flash": "compress_ratios",  # compressed sparse attention
    "moonshotai/Kimi-K3": "architectures",
}


@pytest.mark.parametrize(("name", "key"), sorted(BUNDLED.items()))
def test_every_bundled_mla_config_loads_or_names_the_key(name: str, key: str | None) -> None:
    require_bundled(name)
    if key is None:
        spec = catalog.model(name)
        assert spec.mla is not None
        assert spec.num_shared_experts == 1
        return
    with pytest.raises(ConfigError) as err:
        catalog.model(name, field="replica.model")
    assert err.value.field == "replica.model"
    assert f": {key}: " in str(err.value)


def test_fp8_block_deepseek_checkpoints_take_the_quantization_path() -> None:
    require_bundled("deepseek-ai/DeepSeek-V3")
    for name in (
        "deepseek-ai/DeepSeek-V3",
        "deepseek-ai/DeepSeek-R1",
        "moonshotai/Kimi-K2-Instruct",
    ):
        quant = catalog.model(name).quantization
        assert quant is not None
        assert quant.scheme == "fp8_block"


# ---- memory ---------------------------------------------------------------------------


def test_mla_kv_is_one_latent_per_token_and_layer_not_split_by_tp(tmp_path: Path) -> None:
    spec = small(tmp_path)
    plans = [
        plan_memory(
            spec,
            catalog.device("h100-sxm"),
            tensor_parallel_size=tp,
            num_pipeline_stages=1,
            memory_margin_fraction=0.1,
            max_request_tokens=4096,
            block_size=16,
        )
        for tp in (1, 2)
    ]
    # (kv_lora 128 + rope 16) values x 2 bytes x 4 layers, on every TP rank.
    assert [p.kv_bytes_per_token for p in plans] == [1152, 1152]
    # TP 2, by hand: the a projections whole, q_b, kv_b and o at 4 heads, every expert's
    # intermediate halved, the router whole, the vocabulary halved.
    attention = Q_A + KV_A + 256 * 4 * 48 + 128 * 4 * 64 + 4 * 32 * 1024
    linear = 4 * attention + 3 * 1024 * 1024 + 3 * (3 * 1024 * 128 * 9)
    other = 4 * (384 + 2048) + 3 * ROUTER + 2 * 500 * 1024 + 1024
    assert plans[1].parameter_bytes_per_device == 2 * (linear + other) == 34_624_512


def test_deepseek_v3_on_eight_h200s_kv_tokens_by_vllms_arithmetic() -> None:
    """vLLM's MLAAttentionSpec: one KV head of kv_lora_rank + qk_rope_head_dim = 576
    values, at the KV dtype, in every layer, whole on every TP rank; a block of 16 tokens
    is 16 x 576 bytes per layer in FP8. Blocks = free bytes // (61 layers x page)."""
    require_bundled("deepseek-ai/DeepSeek-V3")
    spec = catalog.model("deepseek-ai/DeepSeek-V3")
    quant = resolve_quantization(spec.quantization, "auto", "auto")
    plan = plan_memory(
        spec,
        catalog.device("h200"),
        tensor_parallel_size=8,
        num_pipeline_stages=1,
        memory_margin_fraction=0.1,
        max_request_tokens=8192,
        block_size=16,
        weight_dtype="auto",
        kv_cache_dtype="fp8",
        quantization=quant,
    )
    assert plan.kv_bytes_per_token == 576 * 61 == 35_136
    h = 7168
    attention = h * 1536 + h * 576 + 1536 * 16 * 192 + 512 * 16 * 256 + 16 * 128 * h
    linear = 61 * attention + 3 * 3 * h * (18432 // 8) + 58 * 3 * h * (2048 // 8) * 257
    other = 61 * (1536 + 512 + 2 * h) + 58 * h * 256 + 2 * (129280 // 8) * h + h
    weights = math.ceil(linear * (1 + 4 / 16384) + 2 * other)
    assert plan.parameter_bytes_per_device == weights  # 85.1 GB: 79.3 GiB
    free = int(141 * 2**30 * 0.9) - weights
    assert plan.num_blocks == free // (16 * 576 * 61)
    assert plan.max_kv_tokens == plan.num_blocks * 16 == 1_454_848


# ---- step cost ------------------------------------------------------------------------


def test_roofline_prices_absorbed_decode_over_the_latent(tmp_path: Path) -> None:
    """Datasheet roofline, TP 1, 16 decodes over 1,000 keys each: per layer and key,
    8 heads x 2 x (2 x 128 + 16) FLOPs and 144 cached values of 2 bytes."""
    spec = small(tmp_path)
    device = catalog.device("h100-sxm")
    predictor = roofline_predictor(spec, device, tensor_parallel_size=1)
    shape = decodes(16, 999)
    keys = 16 * 1000
    flops = keys * 8 * 2 * (2 * 128 + 16)
    moved = keys * 144 * 2 + 16 * 8 * (144 + 128) * 2
    # attention FLOPs at 50% of the BF16 peak, bytes at 85% of the bandwidth
    per_layer = max(flops / (989e12 * 0.5), moved / (3350e9 * 0.85))
    assert predictor.op_times(shape)["attn_decode"] == pytest.approx(4 * per_layer)
    times = predictor.op_times(shape)
    assert times["kv_b_proj"] == 0.0  # prefill only: decode is absorbed
    assert times["mla_bmm_pre"] > 0.0
    assert times["mla_bmm_post"] > 0.0


# ---- measured MLA module tables, written by the test ----------------------------------

HEADS = [2, 4, 8]
POWERS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def module_ms(b: float, s: float, heads: float, generation: bool) -> float:
    if generation:
        return 0.05 + b * s * heads * 1e-6
    return 0.08 + b * s * s * heads * 1e-8


def module_columns(model: str, generation: bool) -> dict[str, list[Any]]:
    rows = [
        (h, b, s) for h in HEADS for b in [1, 2, 4, 8, 16, 32, 64] for s in POWERS if b * s <= 65536
    ]
    n = len(rows)
    return {
        "model": [model] * n,
        "num_heads": [r[0] for r in rows],
        "batch_size": [r[1] for r in rows],
        "isl": [1 if generation else r[2] for r in rows],
        "step": [r[2] if generation else 0 for r in rows],
        "tp_size": [1] * n,
        "mla_dtype": ["bfloat16"] * n,
        "kv_cache_dtype": ["bfloat16"] * n,
        "gemm_type": ["bfloat16"] * n,
        "kernel_source": ["FLASH_ATTN_MLA"] * n,
        "latency": [module_ms(r[1], r[2], r[0], generation) for r in rows],
    }


@pytest.fixture
def mla_tables(tmp_path: Path) -> tuple[Path, catalog.ModelSpec]:
    spec = small(tmp_path)
    root = tmp_path / "data"
    write(root / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet", gemm_columns())

    attention = root / "h100_sxm/attention/vllm/0.2.0"
    write(attention / "context_attention_perf.parquet", attention_columns(False))
    write(attention / "generation_attention_perf.parquet", attention_columns(True))
    mla = root / "h100_sxm/mla/vllm/0.2.0"
    write(mla / "mla_context_module_perf.parquet", module_columns(spec.source, False))
    write(mla / "mla_generation_module_perf.parquet", module_columns(spec.source, True))
    return root, spec


def test_one_module_row_prices_a_layers_whole_attention(
    mla_tables: tuple[Path, catalog.ModelSpec],
) -> None:
    root, spec = mla_tables
    source = resolve_source(root, "h100_sxm", "vllm", "latest")
    predictor = measured_predictor(spec, catalog.device("h100-sxm"), source, tensor_parallel_size=2)
    names = {op.name: op.source for op in predictor.ops}
    assert names["attn_decode"] == names["attn_prefill"] == "measured:mla_module (0.2.0)"
    assert not set(MLA_MODULE_OPS) & set(names)  # the projections are inside the module rows
    assert "MLA module (bfloat16, KV bfloat16, 4 heads per GPU)" in predictor.description["kernels"]
    # 32 decodes over 256 keys each: 4 layers x the 4-head row (b 32, step 256).
    expected = 4 * module_ms(32, 256, 4, True) * 1e-3
    assert predictor.op_times(decodes(32, 255))["attn_decode"] == pytest.approx(expected, rel=1e-3)
    # One 1,024-token prompt: 4 layers x the 4-head context row (b 1, isl 1024).
    expected = 4 * module_ms(1, 1024, 4, False) * 1e-3
    assert predictor.op_times(prompt(1024))["attn_prefill"] == pytest.approx(expected, rel=1e-3)


def test_a_module_measured_for_another_shape_falls_back_and_says_why(
    mla_tables: tuple[Path, catalog.ModelSpec], tmp_path: Path
) -> None:
    root, _ = mla_tables
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = small(other_dir, kv_lora_rank=256)
    source = resolve_source(root, "h100_sxm", "vllm", "latest")
    predictor = measured_predictor(other, catalog.device("h100-sxm"), source)
    names = {op.name: op.source for op in predictor.ops}
    assert names["attn_decode"] == "calibrated"
    assert names["q_b_proj"] == names["o_proj"] == "measured:gemm (0.2.0)"
    assert "not" in predictor.description["fallbacks"]["attn_decode"]
    assert "kv_lora_rank=256" in predictor.description["fallbacks"]["attn_decode"]


# ---- end to end -----------------------------------------------------------------------


def test_deepseek_v3_on_eight_h200s_simulates_with_mla_and_moe_measured() -> None:
    require_bundled("deepseek-ai/DeepSeek-V3")
    replica = {"model": "deepseek-ai/DeepSeek-V3", "device": "h200", "tensor_parallel_size": 8}
    workload = synthetic_workload(20, qps=2.0, prompt_tokens=(100, 2000), output_tokens=(10, 50))
    result = simulate(one_replica(replica, workload))
    execution = result.summary["config"]["execution"]
    assert execution["model"] == "measured"
    assert "MoE fp8_block, MLA module (fp8_block" in execution["label"]
    assert execution["op_sources"]["attn_decode"].startswith("measured:mla_module")
    assert execution["op_sources"]["moe_experts"].startswith("measured:moe")
    assert result.summary["num_requests"] == 20
