"""Windowed and linear-attention layer kinds (issue 29, item 1): sliding-window (gpt-oss,
Gemma, Mistral), chunked-local (Llama 4), gated DeltaNet (Qwen3-Next, Qwen3.5) and Mamba2
(Nemotron-H) layers read from config.json and planned.

Hand-checkable memory on small configs the tests write: every attention layer's KV counted
as full attention (vLLM ``--disable-hybrid-kv-cache-manager``), the hybrid allocator's
figure on the banner, and the linear layers' state by vLLM's ``MambaStateShapeCalculator``
(``catalog.specs.LinearAttention``) reserved for ``max_num_seqs`` requests; one sliding
layer's decode by hand on the datasheet roofline. Their pricing on the measured tables is
test_layer_kinds_measured.py; the bundled configs of these families, and five of them
simulated, test_layer_kinds_bundled.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_configs import load_config, write_config
from step_shapes import decodes_over
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard import catalog
from tokenyard.errors import ConfigError
from tokenyard.predictor import roofline_predictor
from tokenyard.predictor.roofline import window_keys, window_pairs
from tokenyard.simulation import config_from_mapping, plan_memory, simulate
from tokenyard.simulation.planner import MemoryPlan
from tokenyard.simulation.run import plan_for, planning_notes

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


def notes_for(
    path: Path, request_tokens: int, hybrid: bool | None = False, **scheduler: Any
) -> list[str]:
    """The banner's notes; ``hybrid``: ``replica.hybrid_kv_cache_manager`` (``False``, the
    full-attention plan these tests check, unless said; tests/test_hybrid_kv.py has the
    hybrid one)."""
    replica: dict[str, Any] = {
        "model": str(path),
        "device": "h100-sxm",
        "scheduler": {"max_request_tokens": request_tokens, **scheduler},
    }
    if hybrid is not None:
        replica["hybrid_kv_cache_manager"] = hybrid
    config = config_from_mapping({"replica": replica})
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
        "KV PLANNED AS vLLM --disable-hybrid-kv-cache-manager (replica.hybrid_kv_cache_manager "
        "false): sliding (window 128) layers hold every token's KV, as full attention"
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
    # vLLM keeps one window group whatever its flag: the plan frees what leaves the window,
    # a request of 32,768 tokens holding ceil((4,095 + 2,048) / 16) + 1 = 385 blocks.
    (note,) = notes_for(path, 32768, hybrid=None)
    assert note.startswith("KV PLANNED WITH vLLM's HYBRID KV CACHE MANAGER")
    assert "1 KV groups of 2 layers (sliding (window 4096))" in note
    assert "holds 385 blocks" in note
    with pytest.raises(ConfigError, match="keeps its one window group"):
        notes_for(path, 32768, hybrid=False)


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


def linear_config(
    path: Path, max_running: int, num_requests: int = 300, *, policy: str = "sglang", **cluster: Any
) -> Any:
    """300 short requests at once on one replica. ``policy`` ``sglang`` reserves the
    linear-attention state out of the KV memory for ``max_running`` requests (a ``vllm_v1``
    replica runs Mamba groups instead: tests/test_hybrid_kv_state.py)."""
    limits = (
        {"sglang": {"max_running_requests": max_running}}
        if policy == "sglang"
        else {"vllm_v1": {"max_num_seqs": max_running, "max_num_batched_tokens": 16384}}
    )
    replica = {
        "model": str(path),
        "device": "h100-sxm",
        "scheduler": {"policy": policy, "max_request_tokens": 4096, **limits},
    }
    workload = synthetic_workload(
        num_requests, qps=1e5, prompt_tokens=(8, 16), output_tokens=(20, 30)
    )
    return one_replica(replica, workload, execution={"model": "linear"}, cluster=cluster)


def started_before_any_finished(config: Any) -> int:
    columns = simulate(config).columns
    first = np.asarray(columns["first_token_at"])
    return int(np.sum(first < np.asarray(columns["completed_at"]).min()))


def test_a_vllm_v1_linear_model_is_refused_what_keeps_its_mamba_groups_off(
    tmp_path: Path,
) -> None:
    """vLLM 0.33 starts a model with linear-attention state only on Mamba groups, which
    the simulator's coordinator runs without KV events: prefix_affinity routing is refused
    on the key to change (not planned as a reserved-state layout vLLM refuses), and
    without it the state comes from the pool, nothing reserved."""
    linear = write_config(tmp_path, QWEN3_NEXT)
    routing = {"global_scheduler": {"policy": "prefix_affinity"}}
    with pytest.raises(ConfigError, match="route otherwise") as err:
        plan_for(linear_config(linear, 0, policy="vllm_v1", **routing))
    assert (err.value.field, err.value.value) == (
        "cluster.global_scheduler.policy",
        "prefix_affinity",
    )
    plan = plan_for(linear_config(linear, 0, policy="vllm_v1"))
    assert plan.kv_cache_groups
    assert plan.reserved_state_bytes == 0


def test_a_set_max_running_requests_is_the_reservation_and_the_bound(tmp_path: Path) -> None:
    """sglang with linear layers: the plan reserves state for max_running_requests (100),
    and the scheduler runs no more at once; with full attention the same bound holds
    (sglang's own), so 100 either way, and the reservation is what changes."""
    config = linear_config(write_config(tmp_path, QWEN3_NEXT), 100)
    assert started_before_any_finished(config) == 100
    p = plan_for(config)
    assert p.reserved_state_bytes == 100 * 58_368
    (note,) = planning_notes(config, p)
    assert note.startswith(
        f"LINEAR-ATTENTION STATE RESERVED for 100 requests (gdn x 3 layers, {58_368:,} B per "
        "request"
    )
    assert note.endswith("sglang.max_running_requests (100) keeps the running requests within it")


# ---- step cost on the datasheet roofline ----------------------------------------------


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
