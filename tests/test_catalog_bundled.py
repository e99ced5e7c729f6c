"""Every config ``aiconfigurator-core`` bundles loads or is refused exactly as
docs/catalog.md's "Every bundled config" table says (issue 29): a model file loads with the
quantization scheme listed (or bf16), or is refused with a ConfigError naming the key
listed, for the reason listed; a ``*_hf_quant_config.json`` reads as the scheme listed (or
is refused by the key listed). A file added, removed or changing status fails here. Also
the catalog's readings checked against vLLM 0.33: the RoPE-scaled context length and the
MiniMax-M2 and MiMo mappings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import model_configs
import pytest

from tokenyard import catalog
from tokenyard.catalog.quant import read_quantization
from tokenyard.errors import ConfigError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "catalog.md"
ROW = re.compile(r"^\| `([^`]+\.json)` \| ([a-z ]+) \| `?([\w.]+)`? \| (.*) \|$")


class Row(NamedTuple):
    status: str  # loads, refused, quantization, quantization refused
    key: str  # the scheme (bf16 for none) or the refusing key
    why: str


def documented() -> dict[str, Row]:
    """The docs table, by file name."""
    text = DOCS.read_text()
    section = text[text.index("### Every bundled config") :]
    rows = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            name, status, key, why = match.groups()
            rows[name] = Row(status, key, why.strip())
    return rows


DOCUMENTED = documented()


def bundled_dir() -> Path:
    try:
        import aiconfigurator_core
    except ImportError:
        pytest.skip("aiconfigurator-core's bundled configs are not installed")
    return Path(aiconfigurator_core.__file__).parent / "model_configs"


def refusing_key(exc: ConfigError) -> str:
    """The config key a refusal names: ``model: <path>: [<file>: ]<dotted key>: why``."""
    match = re.match(r"[^:]+: [^:]+\.json: (?:[\w.-]+\.json: )?([\w.]+): ", str(exc))
    assert match, str(exc)
    return match.group(1).rsplit(".", 1)[-1]


def test_the_table_lists_every_bundled_file_and_nothing_else() -> None:
    files = sorted(p.name for p in bundled_dir().iterdir() if p.name.endswith(".json"))
    assert len(files) == 117  # aiconfigurator-core 0.12.0: 89 configs, 28 quantization files
    assert sorted(DOCUMENTED) == files


def test_the_docs_counts_match_the_table() -> None:
    statuses = [row.status for row in DOCUMENTED.values()]
    loads, refused = statuses.count("loads"), statuses.count("refused")
    text = DOCS.read_text()
    assert f"Of the {loads + refused} configs" in text
    assert f"bundles, {loads} load:" in text
    assert f"The other {refused} are refused" in text


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_each_bundled_file_does_what_the_table_says(name: str) -> None:
    path = bundled_dir() / name
    row = DOCUMENTED[name]
    if row.status.startswith("quantization"):
        config = path.with_name(name.removesuffix("hf_quant_config.json") + "config.json")
        assert config.is_file(), config
        if row.status == "quantization":
            quant = read_quantization({}, {}, config)  # the ModelOpt file alone
            assert quant is not None
            assert quant.scheme == row.key
            assert quant.source == name
        else:
            with pytest.raises(ConfigError) as err:
                read_quantization({}, {}, config)
            assert re.search(rf"\.{row.key}: ", str(err.value)), str(err.value)
        return
    repo = name.removesuffix("_config.json").replace("--", "/", 1)
    if row.status == "loads":
        spec = catalog.model(repo)
        assert (spec.quantization.scheme if spec.quantization else "bf16") == row.key
        return
    assert row.status == "refused"
    assert row.why  # the docs say why
    with pytest.raises(ConfigError) as err:
        catalog.model(repo, field="replica.model")
    assert err.value.field == "replica.model"
    assert refusing_key(err.value) == row.key


# ---- context length: vLLM 0.33's _get_and_verify_max_len --------------------------------

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_hidden_layers": 2,
    "num_key_value_heads": 8,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}


def context_of(tmp_path: Path, **extra: Any) -> int:
    folder = tmp_path / str(len(list(tmp_path.iterdir())))  # a new file each time
    folder.mkdir()
    path = model_configs.write_config(folder, {**LLAMA, **extra})
    return catalog.model(str(path)).context_length


@pytest.mark.parametrize(
    ("rope", "context"),
    [
        ({"type": "linear", "factor": 4.0}, 16384),  # the legacy "type" key
        ({"rope_type": "dynamic", "factor": 2.0}, 8192),
        # YaRN and Llama 3 configs give the scaled length already (vLLM skips the factor).
        ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512}, 4096),
        ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 512}, 4096),
        ({"rope_type": "default"}, 4096),
        ({"rope_type": "linear", "factor": None}, 4096),  # vLLM warns and takes 1.0
    ],
)
def test_context_length_takes_the_rope_scaling_factor_as_vllm_does(
    tmp_path: Path, rope: dict[str, Any], context: int
) -> None:
    assert context_of(tmp_path, rope_scaling=rope) == context
    assert context_of(tmp_path, rope_parameters=rope) == context


def test_context_length_is_the_smallest_length_key_as_vllm_derives_it(tmp_path: Path) -> None:
    # vLLM 0.33's derive_max_model_len_and_key: the smallest of the length keys, then
    # model_max_length in the config (Command-R) replaces them; the factor applies after.
    assert context_of(tmp_path, seq_length=2048) == 2048
    assert context_of(tmp_path, n_positions=8192) == 4096
    assert context_of(tmp_path, seq_length=2048, model_max_length=6000) == 6000
    linear = {"rope_type": "linear", "factor": 2.0}
    assert context_of(tmp_path, max_seq_len=1024, rope_scaling=linear) == 2048
    with pytest.raises(ConfigError, match=r"seq_length: must be an integer >= 1"):
        context_of(tmp_path, seq_length=0)


def test_a_nested_rope_config_scales_by_its_layer_types_factor(tmp_path: Path) -> None:
    nested = {"full_attention": {"rope_type": "linear", "factor": 2.0}, "sliding": {}}
    assert context_of(tmp_path, rope_parameters=nested) == 8192


def test_a_bad_rope_factor_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rope_scaling.factor: must be a number > 0, got 0"):
        context_of(tmp_path, rope_scaling={"rope_type": "linear", "factor": 0})


def test_the_bundled_configs_keep_max_position_embeddings() -> None:
    """No bundled config scales by a factor vLLM applies: DeepSeek's YaRN and Llama 3.1's
    llama3 keep max_position_embeddings."""
    bundled_dir()
    assert catalog.model("deepseek-ai/DeepSeek-V3").context_length == 163840
    assert catalog.model("meta-llama/Meta-Llama-3.1-8B").context_length == 131072


# ---- MiniMax-M2 and MiMo ------------------------------------------------------------------


def test_minimax_m2_is_a_qk_norm_moe_without_shared_experts() -> None:
    bundled_dir()
    spec = catalog.model("MiniMaxAI/MiniMax-M2.5")
    assert (spec.num_experts, spec.experts_per_token, spec.intermediate_size) == (256, 8, 1536)
    assert spec.qk_norm
    assert spec.num_shared_experts == 0
    assert spec.quantization is not None
    assert spec.quantization.scheme == "fp8_block"
    assert 228e9 < spec.num_parameters() < 230e9  # published: 229B
    nvfp4 = catalog.model("nvidia/MiniMax-M2.5-NVFP4").quantization
    assert nvfp4 is not None
    assert nvfp4.scheme == "nvfp4"


def test_minimax_m2_with_a_shared_expert_is_refused(tmp_path: Path) -> None:
    config = json.loads((bundled_dir() / "MiniMaxAI--MiniMax-M2.5_config.json").read_text())
    config["shared_intermediate_size"] = 1536
    path = model_configs.write_config(tmp_path, config)
    with pytest.raises(ConfigError, match=r"shared_intermediate_size: shared experts"):
        catalog.model(str(path))


def test_mimo_is_a_qwen2_without_its_mtp_layers() -> None:
    bundled_dir()
    spec = catalog.model("XiaomiMiMo/MiMo-7B-Base")
    assert spec.attention_bias
    assert spec.num_experts == 1
    assert 7.6e9 < spec.num_parameters() < 7.7e9
