"""Hugging Face config.json files as catalog models: each supported architecture against
hand-checked numbers, each refused kind of model named by its key, and the configs bundled
with aiconfigurator-core found by repo id."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tokenyard import catalog
from tokenyard.errors import ConfigError
from tokenyard.simulation.catalog import model_spec

# The keys that matter of each model's published config.json.
LLAMA_3_1_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}
QWEN2_5_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "vocab_size": 152064,
}
QWEN3_0_6B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "head_dim": 128,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
}
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "num_attention_heads": 128,
    "num_hidden_layers": 61,
    "vocab_size": 129280,
}


def write(tmp_path: Path, config: Any, filename: str = "config.json") -> Path:
    path = tmp_path / filename
    path.write_text(json.dumps(config))
    return path


def refusal(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        catalog.model(str(path), field="replica.model")
    assert info.value.field == "replica.model"
    assert info.value.value == repr(str(path))
    assert info.value.message.startswith(f"replica.model: {path.resolve()}: ")
    return info.value


def test_llama_3_1_8b_config_gives_the_built_in_shape_and_8_03b_parameters(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, LLAMA_3_1_8B)
    spec = catalog.model(str(path))
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (32, 32, 8, 128)
    assert (spec.intermediate_size, spec.vocab_size) == (14336, 128256)
    assert not spec.tied_embeddings
    assert not spec.attention_bias
    assert not spec.qk_norm
    assert (spec.num_experts, spec.experts_per_token) == (1, 1)
    assert spec.num_parameters() == 8_030_261_248
    assert spec.num_parameters() == catalog.model("llama-3.1-8b").num_parameters()


def test_the_name_is_what_was_typed_and_the_source_the_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, LLAMA_3_1_8B, "llama.json")
    monkeypatch.chdir(tmp_path)
    spec = catalog.model("llama.json")
    assert spec.name == "llama.json"
    assert spec.source == str(tmp_path.resolve() / "llama.json")


def test_an_existing_file_is_read_whatever_its_suffix(tmp_path: Path) -> None:
    path = write(tmp_path, LLAMA_3_1_8B, "config")
    assert catalog.model(str(path)).num_layers == 32


def test_qwen2_has_qkv_bias_without_a_key_and_ignores_an_unused_window(tmp_path: Path) -> None:
    spec = catalog.model(str(write(tmp_path, QWEN2_5_7B)))
    assert spec.attention_bias
    assert not spec.qk_norm
    # The built-in qwen2.5-7b, copied from the same config by hand.
    assert spec.num_parameters() == 7_615_616_512


def test_qwen3_has_qk_norm_its_own_head_dim_and_tied_embeddings(tmp_path: Path) -> None:
    spec = catalog.model(str(write(tmp_path, QWEN3_0_6B)))
    assert spec.qk_norm
    assert not spec.attention_bias
    assert spec.head_dim == 128  # not hidden_size / heads = 64
    assert spec.tied_embeddings
    # Per layer: q and o 2 * 1024 * 2048, k and v 2 * 1024 * 1024, MLP 3 * 1024 * 3072,
    # norms 2 * 1024 = 15_730_688; x 28 + final norm 1024 = 440_460_288 (the model card's
    # "0.44B non-embedding"); + 151936 * 1024 tied embeddings.
    assert spec.num_parameters() == 440_460_288 + 151936 * 1024 == 596_042_752


def test_mixtral_counts_num_local_experts_of_intermediate_size(tmp_path: Path) -> None:
    spec = catalog.model(str(write(tmp_path, MIXTRAL_8X7B)))
    assert (spec.num_experts, spec.experts_per_token, spec.intermediate_size) == (8, 2, 14336)
    assert spec.num_parameters() == 46_702_792_704
    assert spec.num_active_parameters() == 12_879_925_248


def test_qwen3_moe_counts_num_experts_of_moe_intermediate_size(tmp_path: Path) -> None:
    spec = catalog.model(str(write(tmp_path, QWEN3_30B_A3B)))
    assert (spec.num_experts, spec.experts_per_token, spec.intermediate_size) == (128, 8, 768)
    assert spec.qk_norm
    # Per layer: attention 2048 * (4096 + 2 * 512) + 4096 * 2048 = 18_874_368, experts
    # 3 * 2048 * 768 = 4_718_592 each, router 2048 * 128, norms 2 * 2048.
    layer = 18_874_368 + 2048 * 128 + 2 * 2048
    edges = 2 * 151936 * 2048 + 2048
    assert spec.num_parameters() == 48 * (layer + 128 * 4_718_592) + edges == 30_532_110_336
    assert spec.num_active_parameters() == 48 * (layer + 8 * 4_718_592) + edges


def test_a_decoder_nested_under_text_config_is_read(tmp_path: Path) -> None:
    text = {
        k: v for k, v in QWEN3_0_6B.items() if k not in ("architectures", "tie_word_embeddings")
    }
    wrapper = {"architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": True}
    spec = catalog.model(str(write(tmp_path, {**wrapper, "text_config": text})))
    assert spec.num_parameters() == 596_042_752


def test_without_architectures_the_model_type_says_the_family(tmp_path: Path) -> None:
    config = {k: v for k, v in QWEN2_5_7B.items() if k != "architectures"}
    assert catalog.model(str(write(tmp_path, config))).attention_bias


def test_layer_types_all_full_attention_is_accepted(tmp_path: Path) -> None:
    config = {**QWEN3_0_6B, "layer_types": ["full_attention"] * 28}
    assert catalog.model(str(write(tmp_path, config))).qk_norm


def test_built_in_names_win_over_a_file_of_the_same_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, QWEN3_0_6B, "llama-3.1-8b")
    monkeypatch.chdir(tmp_path)
    assert catalog.model("llama-3.1-8b") is catalog.builtin_models()["llama-3.1-8b"]


def test_a_config_is_parsed_once_and_again_when_edited(tmp_path: Path) -> None:
    path = write(tmp_path, LLAMA_3_1_8B)
    first = catalog.model(str(path))
    assert catalog.model(str(path)) is first
    write(tmp_path, {**LLAMA_3_1_8B, "num_hidden_layers": 16})
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 1_000_000_000))
    assert catalog.model(str(path)).num_layers == 16


def test_the_simulator_lookup_reads_a_config_under_replica_model(tmp_path: Path) -> None:
    path = write(tmp_path, DEEPSEEK_V3)
    assert model_spec(str(write(tmp_path, LLAMA_3_1_8B, "ok.json"))).num_layers == 32
    with pytest.raises(ConfigError) as info:
        model_spec(str(path))
    assert info.value.field == "replica.model"


def test_mla_outside_the_deepseek_architectures_is_refused_naming_kv_lora_rank(
    tmp_path: Path,
) -> None:
    """MLA is read for DeepseekV2/V3ForCausalLM (tests/test_mla.py); elsewhere it is
    not what the architecture's other keys describe."""
    error = refusal(write(tmp_path, {**LLAMA_3_1_8B, "kv_lora_rank": 512}))
    assert "kv_lora_rank: multi-head latent attention is read for" in error.message
    assert error.message.endswith("got 512 in a llama config")


def test_sparse_attention_is_refused_naming_index_topk(tmp_path: Path) -> None:
    error = refusal(write(tmp_path, {**DEEPSEEK_V3, "index_topk": 2048}))
    assert "index_topk: sparse attention" in error.message
    assert error.message.endswith("got 2048")


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({**QWEN2_5_7B, "use_sliding_window": True, "sliding_window": 4096}, "sliding_window"),
        (
            {**QWEN3_0_6B, "layer_types": ["sliding_attention", "full_attention"] * 14},
            "layer_types",
        ),
    ],
    ids=["qwen2-use_sliding_window", "layer_types-sliding"],
)
def test_sliding_window_attention_is_refused(
    tmp_path: Path, config: dict[str, Any], key: str
) -> None:
    error = refusal(write(tmp_path, config))
    assert f": {key}: " in error.message
    assert "sliding" in error.message


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"model_type": "nemotron_h"}, "model_type"),
        ({"model_type": "qwen3_next"}, "model_type"),
        ({"hybrid_override_pattern": "M-M-M*-"}, "hybrid_override_pattern"),
        ({"layer_types": ["linear_attention", "full_attention"] * 14}, "layer_types"),
    ],
)
def test_linear_attention_and_mamba_hybrids_are_refused(
    tmp_path: Path, extra: dict[str, Any], key: str
) -> None:
    error = refusal(write(tmp_path, {**QWEN3_0_6B, **extra}))
    assert f": {key}: " in error.message
    assert "not modelled" in error.message


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"architectures": ["Qwen2MoeForCausalLM"], "shared_expert_intermediate_size": 5632},
            "shared_expert_intermediate_size: shared experts are not modelled, got 5632",
        ),
        (
            {"decoder_sparse_step": 2},
            "decoder_sparse_step: dense layers between MoE layers are not modelled, got 2",
        ),
        (
            {"mlp_only_layers": [0, 47]},
            "mlp_only_layers: dense layers in a MoE are not modelled, got [0, 47]",
        ),
    ],
)
def test_shared_experts_and_dense_layers_in_a_moe_are_refused(
    tmp_path: Path, extra: dict[str, Any], message: str
) -> None:
    assert refusal(write(tmp_path, {**QWEN3_30B_A3B, **extra})).message.endswith(message)


def test_an_unsupported_architecture_is_refused_listing_the_supported(tmp_path: Path) -> None:
    error = refusal(write(tmp_path, {**LLAMA_3_1_8B, "architectures": ["Phi3ForCausalLM"]}))
    assert "architectures: unsupported 'Phi3ForCausalLM'" in error.message
    for supported in ("LlamaForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"):
        assert supported in error.message


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers: missing (required)"),
        ({"num_attention_heads": "32"}, "num_attention_heads: must be an integer >= 1, got '32'"),
        ({"vocab_size": 0}, "vocab_size: must be an integer >= 1, got 0"),
        ({"num_key_value_heads": 5}, "num_key_value_heads: must divide num_heads (32), got 5"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings: must be true or false, got 'no'"),
        ({"architectures": "LlamaForCausalLM"}, "architectures: must be a non-empty list"),
        (
            {"hidden_size": 4100},  # head_dim used to be floored to 128
            "hidden_size: must be a multiple of num_attention_heads (32) when no head_dim is "
            "given, got 4100",
        ),
    ],
)
def test_a_missing_or_bad_key_is_named(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    config = {k: v for k, v in {**LLAMA_3_1_8B, **change}.items() if v is not None}
    assert message in refusal(write(tmp_path, config)).message


@pytest.mark.parametrize(("head_dim", "expected"), [(128, 128), (None, 64)])
def test_an_explicit_head_dim_is_used_as_it_is_else_hidden_size_over_heads(
    tmp_path: Path, head_dim: int | None, expected: int
) -> None:
    # Qwen3.5-27B gives head_dim 256 with hidden_size 5120 and 24 heads (5120 / 24 is not
    # whole); Qwen3 and Gemma give one other than hidden_size / heads. Null is no head_dim.
    odd = {**QWEN3_0_6B, "hidden_size": 1000, "head_dim": head_dim}
    if head_dim is None:
        assert "hidden_size: must be a multiple of" in refusal(write(tmp_path, odd)).message
        odd["hidden_size"] = 1024
    assert catalog.model(str(write(tmp_path, odd))).head_dim == expected


def test_moe_keys_are_required_for_a_moe(tmp_path: Path) -> None:
    config = {k: v for k, v in QWEN3_30B_A3B.items() if k != "moe_intermediate_size"}
    assert "moe_intermediate_size: missing (required)" in refusal(write(tmp_path, config)).message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not a JSON file (Expecting value: line 1 column 1 (char 0))"),
        ("[1, 2]", "must be a JSON object (a config.json), got list"),
    ],
)
def test_a_file_that_is_not_a_json_object_is_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    assert refusal(path).message.endswith(message)


def test_json_nested_too_deep_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"  # 100,000 levels: json's decoder used to overflow the stack
    path.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    assert refusal(path).message.endswith("not a config.json (nested too deep to read)")
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert refusal(path).message.endswith("not a config.json (nested too deep to read)")


def test_a_missing_json_file_cannot_be_read(tmp_path: Path) -> None:
    message = refusal(tmp_path / "nope.json").message
    assert message.endswith("cannot read (No such file or directory)")


def test_without_aiconfigurator_core_the_unknown_model_error_says_how_to_get_configs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)  # import fails
    assert catalog.bundled_model_names() == []
    with pytest.raises(ConfigError) as info:
        catalog.model("meta-llama/Meta-Llama-3.1-8B", field="replica.model")
    assert info.value.field == "replica.model"
    assert "pip install tokenyard[measured]" in info.value.message
    assert "llama-3.1-8b" in info.value.message


def bundled() -> list[str]:
    pytest.importorskip("aiconfigurator_core", reason="the bundled configs need the package")
    return catalog.bundled_model_names()


def test_a_bundled_config_is_found_by_repo_id() -> None:
    assert "meta-llama/Meta-Llama-3.1-70B" in bundled()
    spec = catalog.model("meta-llama/Meta-Llama-3.1-70B")
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads) == (80, 64, 8)
    assert spec.num_parameters() == catalog.model("llama-3.1-70b").num_parameters()
    assert spec.source.endswith("meta-llama--Meta-Llama-3.1-70B_config.json")


def test_quantisation_files_are_not_bundled_models() -> None:
    assert not [name for name in bundled() if name.endswith("_hf_quant")]


def test_every_bundled_config_loads_or_is_refused_with_a_config_error() -> None:
    loaded, refused = [], []
    for name in bundled():
        try:
            loaded.append(catalog.model(name, field="replica.model"))
        except ConfigError as exc:
            refused.append(exc)
    assert loaded
    assert refused
    assert {error.field for error in refused} == {"replica.model"}


def test_an_unknown_repo_id_suggests_the_bundled_one() -> None:
    assert "meta-llama/Meta-Llama-3.1-8B" in bundled()
    with pytest.raises(ConfigError) as info:
        catalog.model("meta-llama/Llama-3.1-8B")
    assert "catalog.bundled_model_names()" in info.value.message
    assert info.value.message.endswith("did you mean 'meta-llama/Meta-Llama-3.1-8B'?")
