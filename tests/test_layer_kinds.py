"""Windowed and linear-attention layer kinds (issue 29, item 1): sliding-window (gpt-oss,
Gemma, Mistral), chunked-local (Llama 4), gated DeltaNet (Qwen3-Next, Qwen3.5) and Mamba2
(Nemotron-H) layers read from config.json, planned and priced.

Hand-checkable memory on small configs the tests write: every attention layer's KV counted
as full attention (vLLM ``--disable-hybrid-kv-cache-manager``), the hybrid allocator's
figure on the banner, and the linear layers' state by vLLM's ``MambaStateShapeCalculator``
(``catalog.layers.LinearAttention``) reserved for ``max_num_seqs`` requests; one sliding
layer's decode by hand on the datasheet roofline; step time against the batch on the
measured tables; the bundled configs of these families; five of them simulated.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_configs import load_config, write_config
from step_shapes import decodes, prompt

from tokenyard import catalog
from tokenyard.catalog.quant import resolve_quantization
from tokenyard.errors import ConfigError
from tokenyard.predictor import roofline_predictor
from tokenyard.predictor.compiled import CompiledPredictor
from tokenyard.predictor.measured.ops import GemmTimes, LinearMixerTimes, NotMeasured, main_kernel
from tokenyard.predictor.measured.tables import read_table
from tokenyard.predictor.roofline import window_keys, window_pairs
from tokenyard.simulation import config_from_mapping, plan_memory, simulate
from tokenyard.simulation.cli import format_summary
from tokenyard.simulation.execution import build_predictor, choose_execution
from tokenyard.simulation.planner import MemoryPlan
from tokenyard.simulation.run import plan_for, planning_notes

DOCS = Path(__file__).resolve().parents[1] / "docs"

# ---- small configs, one per family ------------------------------------------------------

#: gpt-oss-like: sliding (window 128) and full attention alternating, 4 MoE layers.
GPT_OSS = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "intermediate_size": 256,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "sliding_window": 128,
    "attention_bias": True,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}

#: Gemma-3-like: five sliding layers (window 512) to one global, by sliding_window_pattern.
GEMMA = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 640,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "intermediate_size": 1024,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "vocab_size": 1000,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}

#: Gemma-4-like: the global layer with a KV shape of its own (1 head of 256, not 2 of 64).
GEMMA_4 = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {
        "model_type": "gemma4_text",
        "hidden_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_global_key_value_heads": 1,
        "global_head_dim": 256,
        "attention_k_eq_v": False,
        "intermediate_size": 1024,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "sliding_window": 512,
        "vocab_size": 1000,
        "max_position_embeddings": 32768,
    },
}

#: Mistral-7B-v0.1-like: the window on every layer.
MISTRAL = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 1024,
    "sliding_window": 4096,
    "vocab_size": 1000,
    "max_position_embeddings": 32768,
}

#: Llama-4-like: layers 0-2 chunked (8192), layer 3 NoPE global (no_rope_layers'
#: default); experts on every second layer (1 and 3), dense MLPs of intermediate_size_mlp
#: on the others.
LLAMA_4 = {
    "architectures": ["Llama4ForConditionalGeneration"],
    "model_type": "llama4",
    "text_config": {
        "model_type": "llama4_text",
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "attention_chunk_size": 8192,
        "interleave_moe_layer_step": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "intermediate_size": 256,
        "intermediate_size_mlp": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 65536,
    },
}

#: Qwen3-Next-like: three gated-DeltaNet layers to one full (full_attention_interval 4).
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_value_heads": 8,
    "linear_value_head_dim": 32,
    "linear_num_key_heads": 4,
    "linear_key_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 256,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "max_position_embeddings": 32768,
}

#: Nemotron-H-like: Mamba2, MLP, Mamba2, attention ("M-M*").
NEMOTRON_H = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "hybrid_override_pattern": "M-M*",
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "mamba_num_heads": 8,
    "mamba_head_dim": 32,
    "n_groups": 2,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    "intermediate_size": 1024,
    "mlp_hidden_act": "relu2",
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
}


def plan(
    spec: catalog.ModelSpec, *, tp: int = 1, request_tokens: int = 4096, max_num_seqs: int = 0
) -> MemoryPlan:
    return plan_memory(
        spec,
        catalog.device("h100-sxm"),
        tensor_parallel_size=tp,
        num_pipeline_stages=1,
        memory_margin_fraction=0.1,
        max_request_tokens=request_tokens,
        block_size=16,
        max_num_seqs=max_num_seqs,
    )


def notes_for(path: Path, request_tokens: int, **scheduler: Any) -> list[str]:
    config = config_from_mapping(
        {
            "replica": {
                "model": str(path),
                "device": "h100-sxm",
                "scheduler": {"max_request_tokens": request_tokens, **scheduler},
            }
        }
    )
    return planning_notes(config, plan_for(config))


def kv_bytes(layers: int, kv_heads: int, head_dim: int) -> int:
    """K and V of ``kv_heads`` heads in bf16, per token, over ``layers`` layers."""
    return layers * 2 * kv_heads * head_dim * 2


def hybrid_words(groups: list[tuple[str, int, int, int]], tokens: int) -> str:
    """The banner's KV-group sentence by hand: (mixer, layers, B/token, window); a window
    group holds at most window + one 16-token block under the hybrid allocator."""
    parts = [
        f"{m} {n} layers{f' (window {w})' if w else ''} {b:,} B/token" for m, n, b, w in groups
    ]
    full = sum(b for _, _, b, _ in groups) * tokens
    hybrid = sum(b * (min(tokens, w + 16) if w else tokens) for _, _, b, w in groups)
    return (
        f"KV groups: {'; '.join(parts)}. A {tokens:,}-token request holds "
        f"{full / 2**20:,.1f} MiB as planned (sliding/chunked layers allocated as full "
        f"attention, vLLM --disable-hybrid-kv-cache-manager), {hybrid / 2**20:,.1f} MiB under "
        "vLLM's hybrid allocator"
    )


# ---- sliding and chunked layers: KV planned as full attention -------------------------


def test_gpt_oss_like_alternates_sliding_and_full_layers(tmp_path: Path) -> None:
    spec = load_config(tmp_path, GPT_OSS)
    kinds = [(k.attention, k.ffn, k.count, k.window) for k in spec.layer_kinds()]
    assert kinds == [("sliding", "moe", 2, 128), ("gqa", "moe", 2, 0)]


@pytest.mark.parametrize("tp", [1, 2])
def test_gpt_oss_like_kv_counts_every_layer_as_full(tmp_path: Path, tp: int) -> None:
    """4 layers x K and V x ceil(2 KV heads / TP) x 64 x 2 bytes, the sliding ones too."""
    p = plan(load_config(tmp_path, GPT_OSS), tp=tp)
    per_group = kv_bytes(2, 2 // tp, 64)  # 1,024 at TP 1, 512 at TP 2
    assert p.kv_bytes_per_token == 2 * per_group == {1: 2048, 2: 1024}[tp]
    assert [(g.mixer, g.layers, g.bytes_per_token, g.window) for g in p.groups] == [
        ("sliding", 2, per_group, 128),
        ("gqa", 2, per_group, 0),
    ]
    assert p.num_blocks == p.available_kv_bytes // (p.kv_bytes_per_token * 16)
    assert p.state_bytes_per_request == p.reserved_state_bytes == 0


def test_gpt_oss_like_note_names_the_hybrid_allocators_figure(tmp_path: Path) -> None:
    """A 4,096-token request: 2,048 B x 4,096 = 8.0 MiB as planned; under the hybrid
    allocator the sliding group keeps 128 + 16 tokens: 1,024 x (4,096 + 144) B = 4.1 MiB."""
    (note,) = notes_for(write_config(tmp_path, GPT_OSS), 4096)
    assert note.startswith(
        "KV PLANNED AS vLLM --disable-hybrid-kv-cache-manager: sliding (window 128) layers "
        "hold every token's KV, as full attention"
    )
    words = hybrid_words([("sliding", 2, 1024, 128), ("gqa", 2, 1024, 0)], 4096)
    assert words.endswith(
        "holds 8.0 MiB as planned (sliding/chunked layers allocated as "
        "full attention, vLLM --disable-hybrid-kv-cache-manager), 4.1 MiB "
        "under vLLM's hybrid allocator"
    )
    assert note.endswith(words)


def test_gemma_like_five_sliding_layers_to_one_global(tmp_path: Path) -> None:
    """sliding_window_pattern 6: layer i global when (i + 1) % 6 == 0. KV: 6 layers x
    2 x 1 head x 128 x 2 B = 3,072 B/token; a 32,768-token request 96 MiB as planned,
    512 x 32,768 + 2,560 x 528 B = 17.3 MiB under the hybrid allocator."""
    path = write_config(tmp_path, GEMMA)
    spec = catalog.model(str(path))
    assert spec.mixers() == ("sliding",) * 5 + ("gqa",)
    p = plan(spec, request_tokens=32768)
    assert p.kv_bytes_per_token == kv_bytes(6, 1, 128) == 3072
    assert [(g.mixer, g.layers, g.bytes_per_token) for g in p.groups] == [
        ("sliding", 5, 2560),
        ("gqa", 1, 512),
    ]
    (note,) = notes_for(path, 32768)
    assert note.endswith(hybrid_words([("sliding", 5, 2560, 512), ("gqa", 1, 512, 0)], 32768))
    assert "96.0 MiB as planned" in note
    assert "17.3 MiB under vLLM's hybrid allocator" in note


def test_gemma_4_like_global_layers_keep_their_own_kv_shape(tmp_path: Path) -> None:
    """Sliding layers 2 KV heads of 64, the global one 1 head of 256: 5 x 512 + 1 x 1,024."""
    p = plan(load_config(tmp_path, GEMMA_4))
    assert [(g.mixer, g.bytes_per_token) for g in p.groups] == [
        ("sliding", kv_bytes(5, 2, 64)),
        ("gqa", kv_bytes(1, 1, 256)),
    ]
    assert p.kv_bytes_per_token == 2560 + 1024


def test_mistral_like_window_on_every_layer(tmp_path: Path) -> None:
    """Both layers sliding (4,096): 2 x 2 x 2 heads x 64 x 2 B = 1,024 B/token, all of it
    planned; 32 MiB per 32,768-token request against 1,024 x 4,112 B = 4.0 MiB."""
    path = write_config(tmp_path, MISTRAL)
    spec = catalog.model(str(path))
    assert [(k.attention, k.count, k.window) for k in spec.layer_kinds()] == [("sliding", 2, 4096)]
    p = plan(spec, request_tokens=32768)
    assert p.kv_bytes_per_token == kv_bytes(2, 2, 64) == 1024
    (note,) = notes_for(path, 32768)
    assert note.endswith(hybrid_words([("sliding", 2, 1024, 4096)], 32768))
    assert "32.0 MiB as planned" in note
    assert "4.0 MiB under" in note


@pytest.mark.parametrize("window", [None, 32768, 65536])
def test_mistral_without_a_shorter_window_is_full_attention(tmp_path: Path, window: Any) -> None:
    spec = load_config(tmp_path, MISTRAL, sliding_window=window)
    assert spec.mixers() == ("gqa", "gqa")
    assert plan(spec).groups[0].window == 0


def test_llama_4_like_chunked_layers_and_a_nope_global_one(tmp_path: Path) -> None:
    """KV: 4 layers x 2 x 2 x 64 x 2 B = 2,048 B/token (1,536 chunked, 512 global); a
    32,768-token request 64 MiB as planned, 512 x 32,768 + 1,536 x 8,208 B = 28.0 MiB."""
    path = write_config(tmp_path, LLAMA_4)
    spec = catalog.model(str(path))
    kinds = [(k.attention, k.ffn, k.intermediate_size, k.count) for k in spec.layer_kinds()]
    assert kinds == [
        ("chunked", "dense", 1024, 2),
        ("chunked", "moe", 256, 1),
        ("gqa", "moe", 256, 1),
    ]
    p = plan(spec, request_tokens=32768)
    assert p.kv_bytes_per_token == kv_bytes(4, 2, 64) == 2048
    (note,) = notes_for(path, 32768)
    assert "chunked (window 8192) layers hold every token's KV" in note
    assert note.endswith(hybrid_words([("chunked", 3, 1536, 8192), ("gqa", 1, 512, 0)], 32768))
    assert "64.0 MiB as planned" in note
    assert "28.0 MiB under" in note


# ---- linear layers: state per request, reserved for max_num_seqs ----------------------


def gdn_state(tp: int, ssm_bytes: int = 2) -> int:
    """vLLM's gated_delta_net_state_shape for QWEN3_NEXT, one layer on one TP rank:
    conv (2 x 4 key heads x 32 + 8 value heads x 32) / TP x (kernel 4 - 1) in bf16,
    state 8 / TP value heads x 32 (key dim) x 32 (value dim) at the SSM dtype."""
    conv = (2 * 4 * 32 + 8 * 32) // tp * (4 - 1) * 2
    return conv + 8 // tp * 32 * 32 * ssm_bytes


def test_qwen3_next_like_three_gdn_layers_to_one_full(tmp_path: Path) -> None:
    spec = load_config(tmp_path, QWEN3_NEXT)
    assert spec.mixers() == ("gdn", "gdn", "gdn", "gqa")
    p = plan(spec)
    assert p.kv_bytes_per_token == kv_bytes(1, 2, 64) == 512  # the one full layer
    assert gdn_state(1) == 3072 + 16384
    assert p.state_bytes_per_request == 3 * gdn_state(1) == 58_368
    assert plan(spec, tp=2).state_bytes_per_request == 3 * gdn_state(2) == 29_184


def test_gdn_state_at_the_configs_mamba_ssm_dtype(tmp_path: Path) -> None:
    """Qwen3.5's mamba_ssm_dtype float32: the recurrent state at 4 bytes, the conv not."""
    spec = load_config(tmp_path, QWEN3_NEXT, mamba_ssm_dtype="float32")
    assert plan(spec).state_bytes_per_request == 3 * gdn_state(1, 4) == 107_520


def mamba2_state(tp: int, ssm_bytes: int = 4) -> int:
    """vLLM's mamba2_state_shape for NEMOTRON_H, one layer on one TP rank: n_groups 2
    extended to TP where TP does not divide it (extra_groups_for_head_shards); conv
    (8 heads x 32 + 2 x groups x 16) / TP x (4 - 1) in bf16; state 8 / TP heads x 32 x 16
    at mamba_ssm_cache_dtype (vLLM's NemotronH default float32)."""
    groups = 2 if 2 % tp == 0 else tp
    conv = (8 * 32 + 2 * groups * 16) // tp * (4 - 1) * 2
    return conv + 8 // tp * 32 * 16 * ssm_bytes


def test_nemotron_h_like_pattern_and_mamba2_state(tmp_path: Path) -> None:
    spec = load_config(tmp_path, NEMOTRON_H)
    kinds = [(k.attention, k.ffn, k.count) for k in spec.layer_kinds()]
    assert kinds == [("mamba2", "none", 2), ("none", "dense", 1), ("gqa", "none", 1)]
    p = plan(spec)
    assert p.kv_bytes_per_token == kv_bytes(1, 2, 64) == 512
    assert mamba2_state(1) == 1920 + 16384
    assert p.state_bytes_per_request == 2 * mamba2_state(1) == 36_608
    # TP 4: the 2 groups become 4 (one per rank): conv (256 + 128) / 4 x 3 x 2 = 576.
    assert mamba2_state(4) == 576 + 4096
    assert plan(spec, tp=4).state_bytes_per_request == 2 * mamba2_state(4) == 9_344
    bf16 = load_config(tmp_path, NEMOTRON_H, mamba_ssm_cache_dtype="bfloat16")
    assert plan(bf16).state_bytes_per_request == 2 * mamba2_state(1, 2)


@pytest.mark.parametrize(("config", "state"), [(QWEN3_NEXT, 58_368), (NEMOTRON_H, 36_608)])
def test_linear_state_is_reserved_for_max_num_seqs(
    tmp_path: Path, config: dict[str, Any], state: int
) -> None:
    spec = load_config(tmp_path, config)
    one, many = plan(spec, max_num_seqs=1), plan(spec, max_num_seqs=64)
    assert many.reserved_state_bytes == 64 * state
    assert one.available_kv_bytes - many.available_kv_bytes == 63 * state
    assert many.num_blocks == many.available_kv_bytes // (512 * 16)
    assert plan(spec).reserved_state_bytes == state  # 0: at least one request's


def linear_config(path: Path, max_num_seqs: int, num_requests: int = 300) -> Any:
    return config_from_mapping(
        {
            "cluster": {"num_replicas": 1},
            "replica": {
                "model": str(path),
                "device": "h100-sxm",
                "scheduler": {
                    "max_request_tokens": 4096,
                    "vllm_v1": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 16384},
                },
            },
            "execution": {"model": "linear"},
            "workload": {
                "kind": "synthetic",
                "num_requests": num_requests,
                "arrival": {"kind": "poisson", "qps": 1e5},
                "prompt_tokens": {"kind": "uniform", "low": 8, "high": 16},
                "output_tokens": {"kind": "uniform", "low": 20, "high": 30},
            },
        }
    )


def started_before_any_finished(config: Any) -> int:
    columns = simulate(config).columns
    first = np.asarray(columns["first_token_at"])
    return int(np.sum(first < np.asarray(columns["completed_at"]).min()))


def test_an_unbounded_vllm_v1_runs_no_more_requests_than_have_state(tmp_path: Path) -> None:
    """300 short requests at once. vllm_v1.max_num_seqs 0 is unbounded: with full attention
    all 300 run together; with linear layers the plan reserves state for 256 (vLLM's
    default max_num_seqs), so the scheduler is held to 256 and says so."""
    linear = write_config(tmp_path, QWEN3_NEXT)
    full_dir = tmp_path / "full"
    full_dir.mkdir()
    full = write_config(full_dir, GPT_OSS, layer_types=["full_attention"] * 4)
    assert started_before_any_finished(linear_config(full, 0)) == 300
    config = linear_config(linear, 0)
    assert started_before_any_finished(config) == 256
    (note,) = planning_notes(config, plan_for(config))
    assert note.startswith(
        f"LINEAR-ATTENTION STATE RESERVED for 256 requests (gdn x 3 layers, {58_368:,} B per "
        "request"
    )
    assert note.endswith(
        "vllm_v1.max_num_seqs 0 (unbounded) is set to 256 per scheduler, as a request beyond "
        "the reservation would have no state memory"
    )


def test_a_set_max_num_seqs_is_the_reservation_and_the_bound(tmp_path: Path) -> None:
    config = linear_config(write_config(tmp_path, QWEN3_NEXT), 100)
    assert started_before_any_finished(config) == 100
    p = plan_for(config)
    assert p.reserved_state_bytes == 100 * 58_368
    (note,) = planning_notes(config, p)
    assert note.endswith("vllm_v1.max_num_seqs (100) keeps the running requests within it")


# ---- step cost on the datasheet roofline ----------------------------------------------


def decodes_over(batch: int, keys: int) -> dict[str, float]:
    """``batch`` decodes, each attending ``keys`` keys (its new token's among them)."""
    return decodes(batch, keys - 1)


def test_a_window_caps_the_keys_a_sliding_decode_reads(tmp_path: Path) -> None:
    """Datasheet roofline, TP 1, 16 decodes over 2,048 keys: a sliding layer (window 128)
    reads 128 keys a decode, a full layer all 2,048. Per layer, q = 8 x 64, kv = 2 x 64:
    4q FLOPs per key, 2 kv x 2 B per key read and 2q x 2 B of query and output per decode;
    FLOPs at 50% of 989 TFLOPS, bytes at 85% of 3,350 GB/s. Two layers of each kind."""
    spec = load_config(tmp_path, GPT_OSS)
    predictor = roofline_predictor(spec, catalog.device("h100-sxm"), tensor_parallel_size=1)
    q, kv = 8 * 64, 2 * 64

    def per_layer(keys: int) -> float:
        flops = 4 * q * 16 * keys
        moved = 2 * kv * 2 * 16 * keys + 2 * q * 2 * 16
        return max(flops / (989e12 * 0.5), moved / (3350e9 * 0.85))

    times = predictor.op_times(decodes_over(16, 2048))
    assert times["sliding_attn_decode"] == pytest.approx(2 * per_layer(128), rel=1e-9)
    assert times["attn_decode"] == pytest.approx(2 * per_layer(2048), rel=1e-9)
    # Within the window a sliding layer reads every key, as a full one.
    short = predictor.op_times(decodes_over(16, 100))
    assert short["sliding_attn_decode"] == pytest.approx(short["attn_decode"], rel=1e-9)
    ops = {op.name: op.source for op in predictor.ops}
    assert ops["sliding_attn_decode"] == ops["attn_decode"] == "roofline"


def test_window_pairs_and_keys_by_hand() -> None:
    # A 2,048-token prompt, window 128: the first 128 queries see 1..128 keys, the rest 128.
    assert window_pairs(2048, 0, 128) == 128 * 129 / 2 + (2048 - 128) * 128 == 254_016
    assert window_pairs(2048, 0, 0) == 2048 * 2049 / 2  # full attention
    # A 1,000-token chunk after 3,000 cached tokens, window 128: 128 keys each.
    assert window_pairs(1000, 3000, 128) == 1000 * 128
    # Chunked local attention (chunk 1,024): two whole chunks of 1,024 x 1,025 / 2 pairs.
    assert window_pairs(2048, 0, 1024, chunked=True) == 2 * 1024 * 1025 / 2
    assert window_keys(2048, 128) == 128
    assert window_keys(100, 128) == 100
    assert window_keys(10_000, 8192, chunked=True) == (8192 + 1) / 2


# ---- step time against the batch on the measured tables -------------------------------

#: Per layer kind: a bundled model with it, its layout, and the ops that price the kind.
KIND_MODELS = {
    "gqa": ("openai/gpt-oss-120b", "h100-sxm", 2),
    "sliding": ("openai/gpt-oss-120b", "h100-sxm", 2),
    "chunked": ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "h100-sxm", 4),
    "gdn": ("Qwen/Qwen3.5-35B-A3B", "h200", 2),
    "mamba2": ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "h100-sxm", 1),
}


def measured_available() -> bool:
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        return False
    return all(name in catalog.bundled_model_names() for name, _, _ in KIND_MODELS.values())


needs_tables = pytest.mark.skipif(
    not measured_available(), reason="aiconfigurator-core's tables and configs are not installed"
)


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


# ---- the bundled configs of these families --------------------------------------------

#: Every bundled gpt-oss, Gemma, Mistral, Llama 4, Qwen3-Next/3.5 and Nemotron-H config:
#: the layer kinds it loads with (mixer: layers), or the key that refuses it.
BUNDLED: dict[str, dict[str, int] | str] = {
    "openai/gpt-oss-20b": {"sliding": 12, "gqa": 12},
    "openai/gpt-oss-120b": {"sliding": 18, "gqa": 18},
    "google/gemma-4-26B-A4B": {"sliding": 25, "gqa": 5},
    "nvidia/Gemma-4-26B-A4B-NVFP4": {"sliding": 25, "gqa": 5},
    "nvidia/Gemma-4-31B-IT-NVFP4": {"sliding": 50, "gqa": 10},
    "mistralai/Mixtral-8x7B-v0.1": {"gqa": 32},  # sliding_window null
    "mistralai/Mixtral-8x22B-v0.1": {"gqa": 56},
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": {"chunked": 36, "gqa": 12},
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": {"chunked": 36, "gqa": 12},
    "Qwen/Qwen3.5-27B": {"gdn": 48, "gqa": 16},
    "Qwen/Qwen3.5-35B-A3B": {"gdn": 30, "gqa": 10},
    "Qwen/Qwen3.5-122B-A10B": {"gdn": 36, "gqa": 12},
    "Qwen/Qwen3.5-397B-A17B": {"gdn": 45, "gqa": 15},
    "nvidia/Qwen3.5-122B-A10B-NVFP4": {"gdn": 36, "gqa": 12},
    "nvidia/Qwen3.5-397B-A17B-NVFP4": {"gdn": 45, "gqa": 15},
    "nvidia/Qwen3.6-27B-NVFP4": "quant_algo",  # ModelOpt MIXED_PRECISION
    "nvidia/Qwen3.6-35B-A3B-NVFP4": "quant_algo",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": {"mamba2": 23, "none": 23, "gqa": 6},
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4": {"mamba2": 23, "none": 23, "gqa": 6},
    "nvidia/Nemotron-H-56B-Base-8K": {"mamba2": 54, "none": 54, "gqa": 10},
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8": "moe_latent_size",
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4": "moe_latent_size",
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": "moe_latent_size",
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8": "moe_latent_size",
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4": "moe_latent_size",
    "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4": "quant_algo",
}

#: How docs/catalog.md names the loading ones.
DOC_NAMES = {
    "openai/gpt-oss-20b": "gpt-oss-20b/120b",
    "openai/gpt-oss-120b": "gpt-oss-20b/120b",
    "google/gemma-4-26B-A4B": "Gemma-4-26B-A4B",
    "nvidia/Gemma-4-26B-A4B-NVFP4": "Gemma-4-26B-A4B (and its NVFP4)",
    "nvidia/Gemma-4-31B-IT-NVFP4": "Gemma-4-31B-NVFP4",
    "mistralai/Mixtral-8x7B-v0.1": "Mixtral 8x7B and 8x22B",
    "mistralai/Mixtral-8x22B-v0.1": "Mixtral 8x7B and 8x22B",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": "Llama 4 Scout and Maverick",
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": "Llama 4 Scout and Maverick",
    "Qwen/Qwen3.5-27B": "Qwen3.5 27B/35B-A3B/122B-A10B/397B-A17B",
    "Qwen/Qwen3.5-35B-A3B": "Qwen3.5 27B/35B-A3B/122B-A10B/397B-A17B",
    "Qwen/Qwen3.5-122B-A10B": "Qwen3.5 27B/35B-A3B/122B-A10B/397B-A17B",
    "Qwen/Qwen3.5-397B-A17B": "Qwen3.5 27B/35B-A3B/122B-A10B/397B-A17B",
    "nvidia/Qwen3.5-122B-A10B-NVFP4": "(and NVFP4s)",
    "nvidia/Qwen3.5-397B-A17B-NVFP4": "(and NVFP4s)",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "Nemotron-3\nNano 30B-A3B (BF16, NVFP4)",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4": "Nemotron-3\nNano 30B-A3B (BF16, NVFP4)",
    "nvidia/Nemotron-H-56B-Base-8K": "Nemotron-H-56B",
}

#: How docs/catalog.md says why the refused ones are refused.
DOC_REFUSALS = {
    "moe_latent_size": "Nemotron-3 Super and Ultra by `moe_latent_size`",
    "quant_algo": "(Qwen3.6 NVFP4s, Nemotron-3.5-Lightning) by `quant_algo`",
}


def bundled() -> list[str]:
    if "openai/gpt-oss-120b" not in catalog.bundled_model_names():
        pytest.skip("aiconfigurator-core's bundled configs are not installed")
    return catalog.bundled_model_names()


def test_the_families_bundled_configs_are_all_listed_here() -> None:
    family = re.compile(
        r"gpt-oss|gemma|mistral|mixtral|llama-4|qwen3[.-](5|6|next)|nemotron-(h|3)", re.I
    )
    assert sorted(n for n in bundled() if family.search(n)) == sorted(BUNDLED)


@pytest.mark.parametrize(("name", "expected"), sorted(BUNDLED.items()))
def test_every_bundled_config_of_these_families_loads_or_names_the_key(
    name: str, expected: dict[str, int] | str
) -> None:
    bundled()
    if isinstance(expected, dict):
        spec = catalog.model(name)
        counts: dict[str, int] = {}
        for mixer in spec.mixers():
            counts[mixer] = counts.get(mixer, 0) + 1
        assert counts == expected
        return
    with pytest.raises(ConfigError) as err:
        catalog.model(name, field="replica.model")
    assert err.value.field == "replica.model"
    assert re.search(rf": [\w.]*{expected}: ", str(err.value)), str(err.value)


def test_docs_catalog_lists_the_same_loads_and_refusals() -> None:
    bundled()
    text = (DOCS / "catalog.md").read_text()
    for name, expected in BUNDLED.items():
        if isinstance(expected, dict):
            assert DOC_NAMES[name] in text, name
        else:
            assert DOC_REFUSALS[expected] in text, name


def test_docs_catalog_counts_the_bundled_configs() -> None:
    names = bundled()
    loaded = 0
    for name in names:
        try:
            catalog.model(name)
            loaded += 1
        except ConfigError:
            pass
    text = (DOCS / "catalog.md").read_text()
    assert f"Of the {len(names)} configs" in text
    assert f"bundles, {loaded} load:" in text
    assert f"The other {len(names) - loaded} are refused" in text


# ---- end to end -----------------------------------------------------------------------

#: (model, device, TP): what must price each of its layer kinds, and the notes' words.
END_TO_END = {
    "openai/gpt-oss-120b": (
        "h100-sxm",
        2,
        {
            "sliding_attn_decode": "measured:attention window_size 128",
            "attn_decode": "measured:attention (",
        },
        "sliding attention measured:attention window_size 128",
        ["KV groups: sliding 18 layers (window 128) 18,432 B/token; gqa 18 layers 18,432 B/token"],
    ),
    "google/gemma-4-26B-A4B": (
        "h100-sxm",
        1,
        {
            "sliding_attn_decode": "measured:attention window_size 1024",
            "attn_decode": "measured:attention (",
        },
        "sliding attention measured:attention window_size 1024",
        ["sliding 25 layers (window 1024) 204,800 B/token; gqa 5 layers 20,480 B/token"],
    ),
    "Qwen/Qwen3.5-35B-A3B": (
        "h200",
        2,
        {
            "gdn_scan_decode": "measured:gdn_perf fused_recurrent_gated_delta_rule_packed_decode",
            "gdn_scan_prefill": "measured:gdn_perf chunk_gated_delta_rule_flashinfer",
            "gdn_conv_prefill": "measured:gdn_perf causal_conv1d_fn",
            "gdn_in_proj": "measured:gemm",
            "gdn_gated_norm": "calibrated",
            "attn_decode": "measured:",
        },
        "gdn measured:gdn_perf (conv, scan; 0.24.0)",
        ["LINEAR-ATTENTION STATE RESERVED for 256 requests (gdn x 30 layers, 32,194,560 B"],
    ),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (
        "h100-sxm",
        1,
        {
            "mamba2_scan_decode": "calibrated",
            "mamba2_conv_decode": "calibrated",
            "mamba2_out_proj": "measured:gemm",
            "attn_decode": "measured:",
        },
        "mamba2 calibrated roofline",
        ["LINEAR-ATTENTION STATE RESERVED for 256 requests (mamba2 x 23 layers, 49,082,368 B"],
    ),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": (
        "h100-sxm",
        4,
        {
            "chunked_attn_decode": "measured:attention window_size 8192",
            "attn_decode": "measured:attention (",
        },
        "chunked attention measured:attention window_size 8192",
        ["chunked 36 layers (window 8192) 36,864 B/token; gqa 12 layers 12,288 B/token"],
    ),
}


@needs_tables
@pytest.mark.parametrize("name", sorted(END_TO_END))
def test_bundled_models_simulate_and_the_banner_says_what_priced_each_kind(name: str) -> None:
    device, tp, sources, kernels, notes = END_TO_END[name]
    config = config_from_mapping(
        {
            "cluster": {"num_replicas": 1},
            "replica": {
                "model": name,
                "device": device,
                "tensor_parallel_size": tp,
                "scheduler": {"max_request_tokens": 32768},
            },
            "workload": {
                "kind": "synthetic",
                "num_requests": 8,
                "arrival": {"kind": "poisson", "qps": 2.0},
                "prompt_tokens": {"kind": "uniform", "low": 100, "high": 4000},
                "output_tokens": {"kind": "uniform", "low": 10, "high": 40},
            },
        }
    )
    result = simulate(config)
    assert result.summary["num_requests"] == 8
    execution = result.summary["config"]["execution"]
    assert execution["model"] == "measured"
    assert kernels in execution["label"]
    for op, source in sources.items():
        assert execution["op_sources"][op].startswith(source), (op, execution["op_sources"][op])
    banner = format_summary(result)
    assert f"execution model: {execution['label']}" in banner
    for words in notes:
        assert any(words in note for note in result.summary["config"]["notes"]), words
        assert words in banner
    if "gdn" in kernels or "mamba2" in kernels:
        fallbacks = execution["fallbacks"]
        assert "not a kernel the linear_attention tables measure" in next(
            why for op, why in fallbacks.items() if op.endswith("_gated_norm")
        )
        if "mamba2" in kernels:  # TRT-LLM's only, and only its conv kernels
            why = fallbacks["mamba2_scan_decode"]
            assert "no linear_attention/mamba2_perf.parquet for h100_sxm/vllm" in why
            assert "(measured for h100_sxm under trtllm 1.3.0rc20)" in why
        assert "vllm_v1.max_num_seqs (256) keeps the running requests within it" in banner
    else:
        assert "--disable-hybrid-kv-cache-manager" in banner


def test_quantization_of_gpt_oss_is_experts_only() -> None:
    bundled()
    quant = resolve_quantization(catalog.model("openai/gpt-oss-120b").quantization, "auto", "auto")
    assert quant is not None
    assert quant.scheme == "mxfp4"
    assert quant.experts_only


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
