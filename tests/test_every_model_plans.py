"""Every flagship model plans end to end on H100, H200 and B200 (issue 29): ``tokenyard
simulate`` of a tiny workload and ``tokenyard search deployments`` of a tiny grid, both
with ``execution.model = "measured"``, so each run is priced from aiconfigurator-core's
measured tables or refused. Where the model fits, the banner names the kernel families
that priced it (a quantized checkpoint's own scheme, never silently BF16) and every GEMM,
attention, MoE and collective comes from a table, except the fallbacks docs/predictor.md
lists for that model; where it does not fit, the ConfigError says so; where the tables
lack its kernels (NVFP4 on Hopper), the ConfigError lists what they measure.

The simulations of every cell and two models' searches run by default (9 s on this 2-core
machine with the measured tables cached, 25 s without); the other eight searches only with
``TOKENYARD_SLOW_TESTS=1`` (all 40 tests: 14 s cached, 34 s cold).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from model_configs import require_bundled

from tokenyard import catalog
from tokenyard.cli import main

SLOW = pytest.mark.skipif(
    os.environ.get("TOKENYARD_SLOW_TESTS") != "1",
    reason="slow (a deployment search per model): TOKENYARD_SLOW_TESTS=1 runs it",
)

DEVICES = ("h100-sxm", "h200", "b200")
MAMBA2 = ("conv_decode", "conv_prefill", "gated_norm", "scan_decode", "scan_prefill")


class Plan(NamedTuple):
    """One model: the TP tried on each device (negative: it does not fit at that TP), the
    banner's words, and the ops the measured tables may leave to the calibrated roofline
    (docs/predictor.md says why)."""

    tp: dict[str, int]
    words: tuple[str, ...]
    fallbacks: frozenset[str] = frozenset()
    images: bool = False


FP8_BLOCK_MLA = (
    "GEMM fp8_block (LM head, router bfloat16)",
    "MoE fp8_block",
    "MLA module (fp8_block",
)
PLANS: dict[str, Plan] = {
    "deepseek-ai/DeepSeek-V3": Plan({"h100-sxm": -8, "h200": 8, "b200": 4}, FP8_BLOCK_MLA),
    "moonshotai/Kimi-K2-Instruct": Plan({"h100-sxm": -8, "h200": 8, "b200": 8}, FP8_BLOCK_MLA),
    "openai/gpt-oss-120b": Plan(
        {"h100-sxm": 1, "h200": 1, "b200": 1},
        ("GEMM bfloat16", "MoE w4a16_mxfp4", "sliding attention measured:attention"),
    ),
    "Qwen/Qwen3-235B-A22B-FP8": Plan(
        {"h100-sxm": 4, "h200": 2, "b200": 2},
        ("GEMM fp8_block (LM head, router bfloat16)", "MoE fp8_block"),
    ),
    "Qwen/Qwen3.5-35B-A3B": Plan(
        {"h100-sxm": 2, "h200": 1, "b200": 1},
        ("GEMM bfloat16", "MoE bfloat16", "gdn measured:gdn_perf"),
        frozenset({"gdn_gated_norm"}),
    ),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": Plan(
        {"h100-sxm": 1, "h200": 1, "b200": 1},
        ("GEMM bfloat16", "MoE bfloat16"),
        frozenset(f"mamba2_{op}" for op in MAMBA2),
    ),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": Plan(
        {"h100-sxm": 4, "h200": 2, "b200": 2},
        ("GEMM bfloat16", "MoE bfloat16", "chunked attention measured:attention"),
    ),
    "google/gemma-4-26B-A4B": Plan(
        {"h100-sxm": 1, "h200": 1, "b200": 1},
        ("GEMM bfloat16", "MoE bfloat16", "sliding attention measured:attention"),
    ),
    "Qwen/Qwen3-VL-8B-Instruct": Plan(
        {"h100-sxm": 1, "h200": 1, "b200": 1}, ("GEMM bfloat16",), images=True
    ),
    # NVFP4 kernels are measured on Blackwell only: on Hopper the measured tables refuse.
    "nvidia/DeepSeek-V3.1-NVFP4": Plan(
        {"h100-sxm": 8, "h200": 4, "b200": 4},
        # Its MLA projections are 16-bit in the checkpoint (ModelOpt exclude_modules).
        (
            "GEMM nvfp4 (LM head, router bfloat16)",
            "MoE nvfp4",
            "MLA module (bfloat16",
            "(projections 16-bit in the checkpoint)",
        ),
    ),
}
#: Gemma 4's KV as vLLM 0.33 plans it (hybrid_kv_pages; 10% of memory free, 50,465,226,240
#: B of weights): 6 groups of 5 layers, 655,360 B a block; an 8,192-token request holds 256
#: full blocks of 32 and 5 x (ceil((1,023 + 2,048) / 16) + 1) = 965 window blocks: 1,221.
#: Device: (KV bytes // 655,360 blocks, blocks // 1,221 requests at once).
GEMMA4_KV = {"h100-sxm": (40_960, 33), "h200": (130_909, 107), "b200": (188_416, 154)}
NOT_MEASURED = {("nvidia/DeepSeek-V3.1-NVFP4", "h100-sxm"), ("nvidia/DeepSeek-V3.1-NVFP4", "h200")}
#: Ops no table prices (norms, activations, RoPE, the KV store, the embedding lookup): the
#: calibrated roofline's, by design; every other op is a GEMM, attention, MoE, collective,
#: conv/scan or the vision encoder.
#: (The shared experts' merge and Qwen's sigmoid gate, a GEMV below every GEMM table's
#: ``n``, are memory-bound on the calibrated roofline too.)
ELEMENTWISE = ("norm", "act", "rope", "kv_store", "embedding", "merge", "gate_mul", "expert_gate")
#: The models whose deployment search runs in the default (fast) test run.
FAST_SEARCH = ("Qwen/Qwen3-235B-A22B-FP8", "nvidia/DeepSeek-V3.1-NVFP4")


def simulation(model: str, device: str, tp: int) -> dict[str, Any]:
    plan = PLANS[model]
    workload: dict[str, Any] = {
        "kind": "synthetic",
        "num_requests": 6,
        "seed": 1,
        "arrival": {"kind": "poisson", "qps": 2.0},
        "prompt_tokens": {"kind": "uniform", "low": 100, "high": 1000},
        "output_tokens": {"kind": "uniform", "low": 4, "high": 12},
    }
    if plan.images:
        workload["images"] = {"width": 448, "height": 448}
    return {
        "cluster": {"num_replicas": 1},
        "replica": {
            "model": model,
            "device": device,
            "tensor_parallel_size": tp,
            "scheduler": {"max_request_tokens": 8192},
        },
        "execution": {"model": "measured"},
        "workload": workload,
    }


def toml(value: Any, prefix: str = "") -> str:
    """A mapping as TOML tables (only what these configs hold)."""
    scalars = {k: v for k, v in value.items() if not isinstance(v, dict)}
    lines = [f"[{prefix}]"] if prefix and scalars else []
    lines += [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in scalars.items()]
    for key, table in value.items():
        if isinstance(table, dict):
            lines.append(toml(table, f"{prefix}.{key}" if prefix else key))
    return "\n".join(lines)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


CELLS = [(m, d) for m in PLANS for d in DEVICES]


@pytest.mark.parametrize(("model", "device"), CELLS, ids=[f"{m}@{d}" for m, d in CELLS])
def test_simulate_plans_from_measured_tables_or_says_why_not(
    model: str, device: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_bundled(model)
    plan, tp = PLANS[model], PLANS[model].tp[device]
    config = tmp_path / "sim.toml"
    config.write_text(toml(simulation(model, device, abs(tp))))
    code, summary, err = run(["simulate", str(config), "--json", "--no-progress"], capsys)
    if tp < 0:
        assert code == 2
        assert "does not fit" in err or "not enough for one request" in err, err
        quant = catalog.model(model).quantization
        if quant is not None:
            assert f"{quant.scheme} weights" in err, err
        return
    if (model, device) in NOT_MEASURED:
        assert code == 2
        assert "replica.quantization" in err, err
        assert "does not measure; measured: " in err, err
        return
    assert code == 0, err
    execution = summary["config"]["execution"]
    assert execution["model"] == "measured"
    label = execution["label"]
    for words in plan.words:
        assert words in label, (words, label)
    quant = catalog.model(model).quantization
    if quant is not None:  # the checkpoint's own scheme priced it, never silent BF16
        assert f"; {quant.scheme} from " in label, label
    fallbacks = set(execution.get("fallbacks") or {})
    assert fallbacks <= plan.fallbacks, fallbacks - plan.fallbacks
    sources = execution["op_sources"]
    for op, source in sources.items():
        if not op.endswith(ELEMENTWISE) and op not in plan.fallbacks:
            assert source.startswith("measured"), (op, source)
    if plan.images:
        assert sources["vision_encoder"].startswith("measured: encoder_attention")
    if model == "google/gemma-4-26B-A4B":
        blocks, held = GEMMA4_KV[device]
        (note,) = [n for n in summary["config"]["notes"] if n.startswith("KV PLANNED WITH")]
        assert "6 KV groups of 5 layers (5 x sliding (window 1024) in blocks of 16 + gqa" in note
        assert f"{blocks:,} blocks; a 8,192-token request holds 1221 blocks, so {held} " in note


def search_config(model: str) -> dict[str, Any]:
    """One point per device at its TP (a variant each), two rates per point."""
    plan = PLANS[model]
    base = simulation(model, DEVICES[0], 1)
    for key in ("device", "tensor_parallel_size"):
        del base["replica"][key]
    config: dict[str, Any] = {
        "simulation": base,
        "slo": {"ttft_p99_s": 30.0},
        "search": {"initial_qps": 2.0, "max_simulations": 2},
    }
    variants = [
        {"name": d, "replica.device": d, "replica.tensor_parallel_size": abs(plan.tp[d])}
        for d in DEVICES
    ]
    return {"config": config, "variants": variants}


def search_toml(model: str) -> str:
    found = search_config(model)
    text = toml(found["config"])
    for variant in found["variants"]:
        text += "\n[[variants]]\n" + "\n".join(
            f"{json.dumps(k)} = {json.dumps(v)}" for k, v in variant.items()
        )
    return text


@pytest.mark.parametrize(
    "model", [m if m in FAST_SEARCH else pytest.param(m, marks=SLOW) for m in PLANS]
)
def test_deployment_search_plans_every_device_or_skips_it_saying_why(
    model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_bundled(model)
    config = tmp_path / "search.toml"
    config.write_text(search_toml(model))
    argv = ["search", "deployments", str(config), "--json", "--no-progress", "--workers", "1"]
    code, found, err = run(argv, capsys)
    assert code == 0, err
    rows = {row["device"]: row for row in found["rows"]}
    assert sorted(rows) == sorted(DEVICES)
    for device, row in rows.items():
        tp = PLANS[model].tp[device]
        assert row["tensor_parallel_size"] == abs(tp)
        if tp < 0:
            assert row["status"] == "skipped"
            assert row["reason"].startswith("does not fit: "), row["reason"]
            quant = catalog.model(model).quantization
            if quant is not None:  # planned at the checkpoint's bytes, not BF16's
                assert f"{quant.scheme} weights" in row["reason"], row["reason"]
        elif (model, device) in NOT_MEASURED:
            assert row["status"] != "ok"
            assert "does not measure; measured: " in row["reason"], row["reason"]
        else:
            assert row["status"] == "ok", row["reason"]
            assert row["capacity_qps"] > 0
