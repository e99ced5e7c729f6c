"""docs/predictor.md's "GPU time per step" table under expert parallelism: DeepSeek-V3 on
8 H200s (TP 8 against TP 1 x DP 8, EP 8) and Qwen3-235B-A22B-FP8 on 4 H100s (TP 4 against
TP 4, EP 4), FP8 checkpoints and FP8 KV, the measured predictor on aiconfigurator-core's
vLLM tables (``latest``). A DP layout's step is one rank's, at its share of the batch.

    .venv/bin/python benches/ep_step_table.py
"""

from __future__ import annotations

import subprocess
from typing import Any

from tokenyard import catalog
from tokenyard.catalog.quant import resolve_quantization
from tokenyard.predictor import batch_features
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import SYSTEM_OF_DEVICE, package_root, resolve_source


def decodes(batch: int, keys: int = 2048) -> dict[str, float]:
    """``batch`` decodes, each attending ``keys`` keys (its new token's among them)."""
    return batch_features(
        num_requests=batch,
        num_prefill_tokens=0,
        num_decode_tokens=batch,
        sum_decode_context=batch * (keys - 1),
        sum_prefill_context=0,
        sum_prefill_squared=0,
        num_padding_rows=0,
    )


def prompts(count: int, tokens: int = 4096) -> dict[str, float]:
    """``count`` whole prompts of ``tokens`` tokens in one step."""
    return batch_features(
        num_requests=count,
        num_prefill_tokens=count * tokens,
        num_decode_tokens=0,
        sum_decode_context=0,
        sum_prefill_context=count * tokens * tokens,
        sum_prefill_squared=count * tokens * tokens,
        num_padding_rows=0,
    )


def predictor(name: str, device: str, **layout: Any) -> Any:
    root = package_root()
    if root is None:
        raise SystemExit("aiconfigurator-core's tables are not installed")
    model = catalog.model(name)
    quant = resolve_quantization(model.quantization, "auto", "auto")
    return measured_predictor(
        model,
        catalog.device(device),
        resolve_source(root, SYSTEM_OF_DEVICE[device], "vllm", "latest"),
        weight_dtype="auto",
        kv_cache_dtype="fp8",
        weight_bytes=quant.bytes_per_weight if quant else 2.0,
        kv_bytes=1.0,
        quantization=quant,
        **layout,
    )


def ms(p: Any, features: dict[str, float]) -> str:
    value = float(p.stage_time(features)[1]) * 1e3
    return f"{value:,.1f} ms" if value < 1000 else f"{value:,.0f} ms"


def main() -> None:
    ds_tp = predictor("deepseek-ai/DeepSeek-V3", "h200", tensor_parallel_size=8)
    ds_ep = predictor(
        "deepseek-ai/DeepSeek-V3",
        "h200",
        tensor_parallel_size=1,
        expert_parallel_size=8,
        data_parallel_size=8,
    )
    qw_tp = predictor("Qwen/Qwen3-235B-A22B-FP8", "h100-sxm", tensor_parallel_size=4)
    qw_ep = predictor(
        "Qwen/Qwen3-235B-A22B-FP8", "h100-sxm", tensor_parallel_size=4, expert_parallel_size=4
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"commit {commit}\n")
    print("| model, GPUs | step | TP | EP |")
    print("|---|---|---|---|")
    ds = "DeepSeek-V3, 8 H200 (TP 8 / TP 1 x DP 8, EP 8)"
    print(
        f"| {ds} | 64 decodes over 2,048 keys (8 a rank) "
        f"| {ms(ds_tp, decodes(64))} | {ms(ds_ep, decodes(8))} |"
    )
    print(
        f"| | 1,024 decodes (128 a rank) | {ms(ds_tp, decodes(1024))} | {ms(ds_ep, decodes(128))} |"
    )
    print(
        f"| | eight 4,096-token prompts (one a rank) | {ms(ds_tp, prompts(8))} "
        f"| {ms(ds_ep, prompts(1))} |"
    )
    qw = "Qwen3-235B-A22B-FP8, 4 H100 (TP 4 / TP 4, EP 4)"
    print(
        f"| {qw} | 256 decodes over 2,048 keys | {ms(qw_tp, decodes(256))} "
        f"| {ms(qw_ep, decodes(256))} |"
    )
    print(f"| | 1,024 decodes | {ms(qw_tp, decodes(1024))} | {ms(qw_ep, decodes(1024))} |")
    print(f"| | one 4,096-token prompt | {ms(qw_tp, prompts(1))} | {ms(qw_ep, prompts(1))} |")


if __name__ == "__main__":
    main()
