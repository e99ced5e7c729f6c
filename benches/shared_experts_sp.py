"""Sequence-parallel shared experts (vLLM 0.33's ``use_sequence_parallel_moe``: EP with
TP > 1 and DP > 1): DeepSeek-V3 on 8 H200s at TP 2 x DP 4, EP 8, FP8 block weights and
FP8 KV. Prints the memory plan per GPU and the measured predictor's shared-expert GEMMs
and step times, to compare across commits (run it in a worktree of each).

    .venv/bin/python benches/shared_experts_sp.py
"""

from __future__ import annotations

from tokenyard import catalog
from tokenyard.catalog.quant import resolve_quantization
from tokenyard.predictor import batch_features
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import SYSTEM_OF_DEVICE, package_root, resolve_source
from tokenyard.simulation import plan_memory

LAYOUT = {"tensor_parallel_size": 2, "expert_parallel_size": 8}


def step(tokens: int, decodes: int, context: int) -> dict[str, float]:
    """One prompt of ``tokens`` tokens, or ``decodes`` decodes over ``context`` keys."""
    return batch_features(
        num_requests=1 if tokens else decodes,
        num_prefill_tokens=tokens,
        num_decode_tokens=decodes,
        sum_decode_context=decodes * context,
        sum_prefill_context=tokens * tokens,
        sum_prefill_squared=tokens * tokens,
        num_padding_rows=0,
    )


def main() -> None:
    model = catalog.model("deepseek-ai/DeepSeek-V3")
    quant = resolve_quantization(model.quantization, "auto", "auto")
    assert quant is not None
    h200 = catalog.device("h200")
    plan = plan_memory(
        model,
        h200,
        num_pipeline_stages=1,
        memory_margin_fraction=0.1,
        max_request_tokens=8192,
        block_size=16,
        kv_cache_dtype="fp8",
        quantization=quant,
        **LAYOUT,
    )
    print(f"weights per GPU: {plan.parameter_bytes_per_device / 1e9:.2f} GB")
    print(f"KV tokens per DP rank: {plan.max_kv_tokens:,}")
    root = package_root()
    assert root is not None, "needs aiconfigurator-core (tokenyard[measured])"
    predictor = measured_predictor(
        model,
        h200,
        resolve_source(root, SYSTEM_OF_DEVICE["h200"], "vllm", "latest"),
        weight_dtype="auto",
        kv_cache_dtype="fp8",
        weight_bytes=quant.bytes_per_weight,
        kv_bytes=1.0,
        quantization=quant,
        data_parallel_size=4,
        **LAYOUT,
    )
    ops = {op.name: op.cost for op in predictor.ops}
    for tokens in (64, 4096):
        shared = sum(
            float(ops[name].time({"num_tokens": float(tokens)}))
            for name in ("shared_gate_up_proj", "shared_down_proj")
        )
        print(f"shared GEMMs per MoE layer at {tokens} tokens: {shared * 1e3:.4f} ms")
    prefill = float(predictor.stage_time(step(4096, 0, 0))[1]) * 1e3
    decode = float(predictor.stage_time(step(0, 128, 2048))[1]) * 1e3
    print(f"step: a 4096-token prompt {prefill:.1f} ms, 128 decodes over 2048 {decode:.2f} ms")


if __name__ == "__main__":
    main()
