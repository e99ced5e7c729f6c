"""What runs around a MoE layer's shared experts, as vLLM 0.33 runs it (issue 29): Gemma 4's
dense MLP is not overlapped with the experts, Qwen's sigmoid shared-expert gate is
priced, and so is the merge of the shared and routed outputs before the TP all-reduce;
the linears a ModelOpt checkpoint keeps 16-bit (attention, shared experts, GDN) take the
16-bit GEMM rows; the roofline's all-to-all over nodes crosses the NIC;
GDN decodes beside a prefill join its one causal conv.
Found by benches/fidelity_hybrid.py; the catalog and roofline parts need nothing, the
measured ones skip without aiconfigurator-core."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from model_configs import require_bundled
from step_shapes import decodes

from tokenyard import _core, catalog
from tokenyard.catalog.quant import Quantization, resolve_quantization, scheme
from tokenyard.predictor import batch_features
from tokenyard.predictor.compiled import FEATURES, RooflineCost
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import SYSTEM_OF_DEVICE, package_root, resolve_source
from tokenyard.predictor.measured.gemm import KEPT_MODULES, modules_unquantized
from tokenyard.predictor.roofline import roofline_predictor

GEMMA = "google/gemma-4-26B-A4B"
QWEN35 = "Qwen/Qwen3.5-35B-A3B"
QWEN35_NVFP4 = "nvidia/Qwen3.5-122B-A10B-NVFP4"
MINIMAX = "nvidia/MiniMax-M2.7-NVFP4"


def _measured(model: catalog.ModelSpec, device: str, tp: int) -> Any:
    root = package_root()
    if root is None:
        pytest.skip("aiconfigurator-core's tables are not installed")
    quant = resolve_quantization(model.quantization, "auto", "auto")
    return measured_predictor(
        model,
        catalog.device(device),
        resolve_source(root, SYSTEM_OF_DEVICE[device], "vllm", "latest"),
        tensor_parallel_size=tp,
        weight_dtype="auto",
        kv_cache_dtype="bf16",
        weight_bytes=quant.bytes_per_weight if quant else 2.0,
        quantization=quant,
    )


def _shared(predictor: Any, batch: int) -> float:
    ops = predictor.op_times(decodes(batch, 1023))
    return float(ops["shared_gate_up_proj"] + ops["shared_down_proj"])


# ---- Gemma 4: a dense MLP on the main stream, before the experts --------------------------


def test_gemma4_reads_its_dense_mlp_as_not_overlapped() -> None:
    """vLLM 0.33's Gemma4DecoderLayer.forward runs ``self.mlp`` then ``self.experts``; the
    model sets no shared experts (``num_shared_experts = 0``)."""
    require_bundled(GEMMA)
    spec = catalog.model(GEMMA)
    assert spec.num_shared_experts == 1
    assert not spec.shared_experts_overlap
    assert not spec.shared_expert_gate


def test_gemma4_dense_mlp_costs_in_full_at_8_decodes() -> None:
    """At 8 decodes on an H100 the MLP's GEMMs keep their whole time (before the fix
    they kept only what outlasted the router and experts, as if on vLLM's auxiliary
    stream): the same as the flag set to overlap would give above 256 tokens, and more
    than it gives at 8."""
    require_bundled(GEMMA)
    spec = catalog.model(GEMMA)
    alone = _measured(spec, "h100-sxm", 1)
    assert "dense MLP before the experts (not overlapped)" in alone.description["kernels"]
    overlapped = _measured(dataclasses.replace(spec, shared_experts_overlap=True), "h100-sxm", 1)
    assert _shared(alone, 8) > 1.5 * _shared(overlapped, 8)
    assert _shared(alone, 512) == pytest.approx(_shared(overlapped, 512), rel=1e-9)


# ---- Qwen3.5 / Qwen3-Next: the sigmoid gate and the merge ------------------------------------


def test_qwen35_reads_the_shared_expert_gate() -> None:
    require_bundled(QWEN35)
    spec = catalog.model(QWEN35)
    assert spec.shared_expert_gate
    assert spec.shared_experts_overlap


def _roofline_ops(spec: catalog.ModelSpec, tp: int) -> dict[str, Any]:
    predictor = roofline_predictor(spec, catalog.device("h200"), tensor_parallel_size=tp)
    return {op.name: op for op in predictor.ops}


def test_the_gate_and_merge_bytes_are_hand_checkable() -> None:
    """Qwen3.5-35B-A3B (h = 2048, bf16 activations), TP 2: the gate multiply reads and
    writes h values a token (8,192 bytes), the merge reads 2h and writes h (12,288 bytes),
    the gate a [T, 2048] x [2048, 1] GEMM (4,096 weight bytes). At TP 1 the merge is
    fused into the next norm by the compiled graph: not an op of its own."""
    require_bundled(QWEN35)
    spec = catalog.model(QWEN35)
    assert spec.hidden_size == 2048
    ops = _roofline_ops(spec, 2)
    mul, merge, gate = (
        ops["shared_gate_mul"].cost,
        ops["shared_merge"].cost,
        ops["shared_expert_gate"].cost,
    )
    assert isinstance(mul, RooflineCost)
    assert isinstance(merge, RooflineCost)
    assert mul.bytes["num_tokens"] == 8192.0
    assert merge.bytes["num_tokens"] == 12288.0
    assert isinstance(gate, RooflineCost)
    assert gate.bytes == {"one": 4096.0, "num_tokens": 2049 * 2.0}
    assert "shared_merge" not in _roofline_ops(spec, 1)
    assert "shared_expert_gate" in _roofline_ops(spec, 1)


def test_models_without_the_gate_price_no_gate() -> None:
    require_bundled("deepseek-ai/DeepSeek-V3")
    ops = _roofline_ops(catalog.model("deepseek-ai/DeepSeek-V3"), 8)
    assert "shared_expert_gate" not in ops
    assert "shared_gate_mul" not in ops
    assert "shared_merge" in ops


def test_qwen35_gate_hides_with_its_branch_and_costs_in_full_above_256_tokens() -> None:
    """Measured, H200 TP 2: the gate runs inside the shared branch, so at 8 decodes it
    keeps the same share of its time as the shared GEMMs (against the same model with
    the branch not overlapped), as does the branch's activation (before the fix it was
    added in full: 0.1 ms a step); at 2,048 tokens the gate, multiply and merge add 5 to 30
    us a layer (aiconfigurator's ElementWise and below-grid GEMM: 0.75 ms over 40
    layers, 19 us; tokenyard 0.87 ms)."""
    require_bundled(QWEN35)
    spec = catalog.model(QWEN35)
    predictor = _measured(spec, "h200", 2)
    whole = _measured(dataclasses.replace(spec, shared_experts_overlap=False), "h200", 2)
    sources = {op.name: op.source for op in predictor.ops}
    assert sources["shared_expert_gate"] == sources["shared_gate_mul"] == "calibrated"
    big = predictor.op_times(decodes(2048, 1023))
    extra_us = sum(big[op] for op in ("shared_expert_gate", "shared_gate_mul", "shared_merge"))
    assert 5.0 <= extra_us / spec.num_layers * 1e6 <= 30.0
    small, small_whole = predictor.op_times(decodes(8, 1023)), whole.op_times(decodes(8, 1023))
    share = small["shared_gate_up_proj"] / small_whole["shared_gate_up_proj"]
    assert share < 0.9
    for op in ("shared_act", "shared_expert_gate", "shared_gate_mul", "shared_down_proj"):
        assert small[op] / small_whole[op] == pytest.approx(share, rel=1e-6)


# ---- linears a ModelOpt checkpoint keeps 16-bit (exclude_modules) -------------------------


def _nvfp4(*kept: str) -> Quantization:
    return dataclasses.replace(scheme("nvfp4"), unquantized_modules=kept)


def test_which_exclude_lists_keep_attention_shared_experts_and_gdn_16_bit() -> None:
    """Qwen3.5-122B-A10B (48 layers: 36 GDN, 12 full attention, every one MoE with a shared
    expert) under the exclude patterns its NVFP4 release and others use."""
    require_bundled(QWEN35_NVFP4)
    spec = catalog.model(QWEN35_NVFP4)
    gqa = [i for i, m in enumerate(spec.mixers()) if m == "gqa"]
    gdn = [i for i, m in enumerate(spec.mixers()) if m == "gdn"]
    assert (len(gqa), len(gdn), spec.num_moe_layers) == (12, 36, 48)
    prefix = "model.language_model.layers"
    release = _nvfp4(
        *(f"{prefix}.{i}.self_attn*" for i in gqa),
        *(f"{prefix}.{i}.linear_attn*" for i in gdn),
        *(f"{prefix}.{i}.mlp.shared_expert*" for i in range(48)),
    )
    assert [m for m in KEPT_MODULES if modules_unquantized(release, spec, m)] == [
        "attention",
        "shared_experts",
        "linear_attention",
    ]
    # A global pattern (no layer number) covers every layer; Kimi's plural name too.
    assert modules_unquantized(_nvfp4("*.mlp.shared_expert.*"), spec, "shared_experts")
    # Half the attention layers is enough, fewer is not; the LM head alone keeps nothing.
    half = _nvfp4(*(f"{prefix}.{i}.self_attn*" for i in gqa[:6]))
    assert modules_unquantized(half, spec, "attention")
    assert not modules_unquantized(_nvfp4(*half.unquantized_modules[:5]), spec, "attention")
    assert not modules_unquantized(_nvfp4("lm_head"), spec, "attention")
    assert not modules_unquantized(None, spec, "attention")
    # Only the o_proj excluded: the qkv projection is still NVFP4, so not kept.
    only_o = _nvfp4(*(f"{prefix}.{i}.self_attn.o_proj" for i in gqa))
    assert not modules_unquantized(only_o, spec, "attention")


def test_minimax_m2_7_nvfp4_prices_its_16_bit_attention_at_the_bf16_rows() -> None:
    """nvidia/MiniMax-M2.7-NVFP4 excludes ``self_attn*`` of every layer (vLLM builds qkv
    and o unquantized): B200 TP 4, the projections at the bfloat16 GEMM rows, the experts
    NVFP4. Before the fix they took the nvfp4 rows (0.57 against 0.39 ms over 62 layers
    at 64 decodes) and the banner did not say."""
    require_bundled(MINIMAX)
    spec = catalog.model(MINIMAX)
    predictor = _measured(spec, "b200", 4)
    kernels = predictor.description["kernels"]
    assert "(attention 16-bit in the checkpoint, bfloat16 rows)" in kernels
    assert "MoE nvfp4" in kernels
    plain = dataclasses.replace(
        spec, quantization=dataclasses.replace(spec.quantization, unquantized_modules=())
    )
    nvfp4 = _measured(plain, "b200", 4)
    bf16 = _measured(dataclasses.replace(spec, quantization=None), "b200", 4)
    at = decodes(64, 1023)
    for op in ("qkv_proj", "o_proj"):
        assert predictor.op_times(at)[op] == pytest.approx(bf16.op_times(at)[op], rel=1e-9)
        assert predictor.op_times(at)[op] != pytest.approx(nvfp4.op_times(at)[op], rel=1e-3)
    assert predictor.op_times(at)["moe_experts"] == pytest.approx(
        nvfp4.op_times(at)["moe_experts"], rel=1e-9
    )


# ---- the roofline's all-to-all across nodes --------------------------------------------------


def test_the_roofline_all_to_all_sends_the_off_node_share_over_the_network() -> None:
    """Kimi-K2 (h 7168, top-8, 60 MoE layers of 61) at EP 16 = DP 16 on B200s without a
    calibration: 2,048 tokens a rank, each GPU sends 2,048 x 7168 x 8 x 2 bytes, half of
    them to the other 8-GPU node over the 50 GB/s NIC after 10 us: 10 + 2,348.8 us a
    layer and phase, the longer of it and NVLink's half. Before the fix the whole went at
    NVLink speed (900 GB/s a direction at the network efficiency): 378 us.
    One node (EP 8) and a 72-GPU NVLink domain (GB200) keep the NVLink price."""
    require_bundled("moonshotai/Kimi-K2-Instruct")
    spec = catalog.model("moonshotai/Kimi-K2-Instruct")
    predictor = roofline_predictor(
        spec,
        catalog.device("b200"),
        expert_parallel_size=16,
        data_parallel_size=16,
    )
    assert "leaving the 8-GPU NVLink domain at 50 GB/s" in predictor.description["a2a"]
    features = {"num_tokens": 2048.0}
    dispatch = next(op for op in predictor.ops if op.name == "moe_dispatch")
    assert dispatch.count == pytest.approx(60 / 61)
    expected = 10e-6 + 2048 * 7168 * 8 * 2 * 0.5 / 50e9
    assert dispatch.cost.time({**dict.fromkeys(FEATURES, 0.0), **features}) == pytest.approx(
        expected, rel=1e-3
    )
    for device, ep in (("b200", 8), ("gb200", 16)):
        other = roofline_predictor(
            spec, catalog.device(device), expert_parallel_size=ep, data_parallel_size=ep
        )
        op = next(op for op in other.ops if op.name == "moe_dispatch")
        assert isinstance(op.cost, RooflineCost)
        assert "NVLink domain" not in other.description["a2a"]


# ---- GDN: one varlen causal conv in a step with a prefill --------------------------------


def _mixed_shape(chunk: int, decodes_n: int, context: int) -> dict[str, int]:
    return {
        "num_requests": 1 + decodes_n,
        "num_prefill_tokens": chunk,
        "num_decode_tokens": decodes_n,
        "sum_decode_context": decodes_n * context,
        "sum_prefill_context": chunk * chunk,
        "sum_prefill_squared": chunk * chunk,
        "num_padding_rows": 0,
    }


def test_gdn_decodes_beside_a_prefill_join_its_causal_conv() -> None:
    """Qwen3.5-35B-A3B, H200 TP 2, 256 decodes beside a 256-token chunk: vLLM 0.33 runs one
    causal_conv1d_fn over all 512 tokens (qwen_gdn_linear_attn.py, _forward_core), so the
    decodes' conv costs what 256 more tokens add to the chunk's (the context rows at 512
    less at 256), not a causal_conv1d_update of its own (the whole of it alone: before
    the fix, in the mixed step too). Rust evaluates the two-feature table as Python."""
    require_bundled(QWEN35)
    predictor = _measured(catalog.model(QWEN35), "h200", 2)
    mixed = predictor.op_times(batch_features(**_mixed_shape(256, 256, 2047)))
    alone = predictor.op_times(decodes(256, 2047))
    prompt_256 = predictor.op_times(batch_features(**_mixed_shape(256, 0, 0)))
    prompt_512 = predictor.op_times(batch_features(**_mixed_shape(512, 0, 0)))
    assert mixed["gdn_conv_prefill"] == pytest.approx(prompt_256["gdn_conv_prefill"], rel=1e-9)
    extra = prompt_512["gdn_conv_prefill"] - prompt_256["gdn_conv_prefill"]
    assert mixed["gdn_conv_decode"] == pytest.approx(extra, rel=1e-2)  # the tables' grids
    assert mixed["gdn_conv_decode"] < 0.5 * alone["gdn_conv_decode"]
    shapes = [_mixed_shape(256, 256, 2047), _mixed_shape(0, 256, 2047), _mixed_shape(512, 8, 100)]
    arrays = {k: np.array([s[k] for s in shapes], dtype=np.uint64) for k in shapes[0]}
    total, _ = _core.evaluate_ops(predictor.to_core(), arrays, stage=0, num_stages=1)
    for i, shape in enumerate(shapes):
        assert total[i] == predictor(stage=0, num_stages=1, **shape)[0]
