"""The bundled configs of the windowed and linear-attention families (issue 29, item 1):
each loads with its layer kinds or names the key that refuses it, as docs/catalog.md says;
five of them simulated end to end, the banner naming what priced each layer kind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from model_configs import needs_measured, require_bundled
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard import catalog
from tokenyard.catalog.quant import resolve_quantization
from tokenyard.errors import ConfigError
from tokenyard.simulation import simulate
from tokenyard.simulation.cli import format_summary

DOCS = Path(__file__).resolve().parents[1] / "docs"

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
    require_bundled("openai/gpt-oss-120b")
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
        # vLLM 0.33's default: its hybrid KV cache manager (tests/test_hybrid_kv.py).
        [
            "KV CACHE MANAGER (replica.hybrid_kv_cache_manager unset: vLLM 0.33 default): 2 KV "
            "groups of 18 layers (sliding (window 128) + gqa)"
        ],
    ),
    "google/gemma-4-26B-A4B": (
        "h100-sxm",
        1,
        {
            "sliding_attn_decode": "measured:attention window_size 1024",
            "attn_decode": "measured:attention (",
        },
        "sliding attention measured:attention window_size 1024",
        ["(5 x sliding (window 1024) in blocks of 16 + gqa in blocks of 32"],
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
        [
            "HYBRID KV CACHE MANAGER (replica.hybrid_kv_cache_manager unset: vLLM 0.33 default): "
            "4 KV groups of 10 layers (gdn + gdn + gdn + gqa)"
        ],
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
        [
            "HYBRID KV CACHE MANAGER (replica.hybrid_kv_cache_manager unset: vLLM 0.33 default): "
            "5 KV groups of 6 layers (mamba2 + mamba2 + mamba2 + mamba2 + gqa)"
        ],
    ),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": (
        "h100-sxm",
        4,
        {
            "chunked_attn_decode": "measured:attention (0.24.0) window_size 8192 rows at "
            "8192-token chunk-local shapes",
            "attn_decode": "measured:attention (",
        },
        "chunked attention measured:attention (0.24.0) window_size 8192 rows at 8192-token "
        "chunk-local shapes",
        ["chunked 36 layers (window 8192) 36,864 B/token; gqa 12 layers 12,288 B/token"],
    ),
}


@needs_measured(*END_TO_END)
@pytest.mark.parametrize("name", sorted(END_TO_END))
def test_bundled_models_simulate_and_the_banner_says_what_priced_each_kind(name: str) -> None:
    device, tp, sources, kernels, notes = END_TO_END[name]
    replica = {
        "model": name,
        "device": device,
        "tensor_parallel_size": tp,
        "scheduler": {"max_request_tokens": 32768},
    }
    workload = synthetic_workload(8, qps=2.0, prompt_tokens=(100, 4000), output_tokens=(10, 40))
    result = simulate(one_replica(replica, workload))
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
        # vLLM's Mamba groups hold the state in the pool (tests/test_hybrid_kv_state.py),
        # in align mode with prefix caching on (vLLM's default, whatever the workload).
        assert "holds 2 pages per request" in banner
    else:
        assert "--disable-hybrid-kv-cache-manager" in banner


def test_quantization_of_gpt_oss_is_experts_only() -> None:
    bundled()
    quant = resolve_quantization(catalog.model("openai/gpt-oss-120b").quantization, "auto", "auto")
    assert quant is not None
    assert quant.scheme == "mxfp4"
    assert quant.experts_only
