"""The model and GPU catalog: built-in entries against their published sizes, lookups,
and catalog files (user entries, and every kind of bad entry named by file, entry and
field)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenyard import catalog
from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.errors import ConfigError
from tokenyard.simulation.catalog import DEVICES, MODELS, device_spec, model_spec
from tokenyard.simulation.planner import plan_memory


@pytest.fixture(autouse=True)
def _builtin_catalog() -> Iterator[None]:
    catalog.reset_catalog()
    yield
    catalog.reset_catalog()


# Published sizes: the model cards (Llama 2 paper table 1 for 7B/13B/70B; the Hugging Face
# "Model size" of each repo for the others). Mixtral: 46.7B total, 12.9B active.
PUBLISHED_PARAMETERS = {
    "llama-2-7b": 6.74e9,
    "llama-2-13b": 13.0e9,
    "llama-2-70b": 68.98e9,
    "llama-3-8b": 8.03e9,
    "llama-3.1-8b": 8.03e9,
    "llama-3.1-70b": 70.6e9,
    "llama-3.1-405b": 405.8e9,
    "mistral-7b": 7.24e9,
    "qwen2.5-7b": 7.62e9,
    "qwen2.5-32b": 32.8e9,
    "qwen2.5-72b": 72.7e9,
    "mixtral-8x7b": 46.7e9,
}


def test_the_built_in_models_are_the_listed_ones() -> None:
    assert set(catalog.models()) == set(PUBLISHED_PARAMETERS)


@pytest.mark.parametrize(("name", "published"), PUBLISHED_PARAMETERS.items())
def test_parameter_count_is_within_2_percent_of_the_published_size(
    name: str, published: float
) -> None:
    assert catalog.model(name).num_parameters() == pytest.approx(published, rel=0.02)


def test_llama_2_7b_parameters_by_hand() -> None:
    h, inter, vocab, layers = 4096, 11008, 32000, 32
    attention = 4 * h * h  # q, k, v, o: 32 heads x 128 = 4096 each
    mlp = 3 * h * inter  # gate, up, down
    per_layer = attention + mlp + 2 * h  # two RMSNorms
    total = layers * per_layer + 2 * vocab * h + h  # embeddings, lm_head, final norm
    assert total == 6_738_415_616  # the count the checkpoint reports
    assert catalog.model("llama-2-7b").num_parameters() == total


def test_qwen_counts_the_qkv_bias() -> None:
    qwen = catalog.model("qwen2.5-7b")
    no_bias = ModelSpec(**{**vars(qwen), "attention_bias": False})
    # q bias 28 heads x 128, k and v bias 4 heads x 128 each, in 28 layers.
    assert qwen.num_parameters() - no_bias.num_parameters() == 28 * (28 * 128 + 2 * 4 * 128)


def test_mixtral_active_parameters_use_two_of_eight_experts() -> None:
    mixtral = catalog.model("mixtral-8x7b")
    assert mixtral.num_active_parameters() == pytest.approx(12.9e9, rel=0.02)
    one_expert = 3 * 4096 * 14336
    assert mixtral.num_parameters() - mixtral.num_active_parameters() == 32 * 6 * one_expert
    dense = catalog.model("mistral-7b")
    assert dense.num_active_parameters() == dense.num_parameters()


def test_every_built_in_entry_cites_its_source() -> None:
    for spec in catalog.models().values():
        assert spec.source.startswith("https://huggingface.co/")
        assert spec.source.endswith("/blob/main/config.json")
    for dev in catalog.devices().values():
        assert dev.source.startswith("https://")
        assert "illustrative" in dev.price_source
        assert dev.price_per_hour > 0


def test_device_datasheet_values() -> None:
    h100 = catalog.device("h100-sxm")
    assert (h100.memory_gib, h100.dense_bf16_tflops, h100.memory_bandwidth_gbps) == (
        80.0,
        989.0,
        3350.0,
    )
    assert h100.interconnect_gbps == 900.0
    assert catalog.device("a100-80gb").memory_bandwidth_gbps == 2039.0
    assert catalog.device("h200").memory_gib == 141.0
    assert catalog.device("mi300x").interconnect_gbps == 896.0
    assert catalog.device("l40s").interconnect_gbps == 64.0


def test_old_device_name_is_an_alias() -> None:
    assert catalog.device("h100-80gb") is catalog.device("h100-sxm")
    assert device_spec("h100-80gb").name == "h100-sxm"
    assert "h100-80gb" not in catalog.devices()


def test_unknown_names_list_the_known_ones_under_the_callers_field() -> None:
    with pytest.raises(ConfigError) as info:
        catalog.model("llama-9", field="replica.model")
    assert info.value.field == "replica.model"
    assert "llama-2-7b" in str(info.value)
    assert "'llama-9'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        catalog.device("tpu")
    assert info.value.field == "device"
    assert "h100-sxm" in str(info.value)
    assert "h100-80gb" in str(info.value)


def test_simulation_catalog_keeps_its_old_interface() -> None:
    assert MODELS["llama-2-7b"] is catalog.model("llama-2-7b")
    assert DEVICES["a10g"].memory_gib == 24.0
    with pytest.raises(ConfigError) as info:
        model_spec("nope")
    assert info.value.field == "replica.model"
    with pytest.raises(ConfigError) as info:
        device_spec("nope")
    assert info.value.field == "replica.device"


USER_TOML = """
[models.tiny-llama]
num_layers = 4
hidden_size = 512
num_heads = 8
num_kv_heads = 2
intermediate_size = 1024
vocab_size = 1000
context_length = 8192
source = "made up for a test"

[devices.my-gpu]
memory_gib = 16.0
dense_bf16_tflops = 100.0
memory_bandwidth_gbps = 500.0
interconnect_gbps = 64.0
price_per_hour = 0.5
aliases = ["mine"]
"""


def test_a_user_file_adds_a_model_and_a_gpu_that_then_plan(tmp_path: Path) -> None:
    path = tmp_path / "extra.toml"
    path.write_text(USER_TOML)
    added = catalog.load_catalog_file(path)
    assert set(added.models) == {"tiny-llama"}
    assert set(added.devices) == {"my-gpu"}
    tiny = catalog.model("tiny-llama")
    assert tiny.head_dim == 512 // 8  # defaults to hidden_size / num_heads
    assert catalog.device("mine").name == "my-gpu"
    assert MODELS["tiny-llama"] is tiny  # the simulator's view follows the registry
    plan = plan_memory(
        tiny,
        catalog.device("my-gpu"),
        tensor_parallel_size=1,
        num_pipeline_stages=1,
        memory_margin_fraction=0.0,
        max_request_tokens=1000,
        block_size=16,
    )
    # K and V, 2 bytes, head_dim 64, 2 KV heads, 4 layers.
    assert plan.kv_bytes_per_token == 2 * 2 * 64 * 2 * 4
    assert plan.parameter_bytes_per_device == 2 * tiny.num_parameters()
    catalog.reset_catalog()
    with pytest.raises(ConfigError):
        catalog.model("tiny-llama")


def test_a_simulation_config_names_its_catalog_files(tmp_path: Path) -> None:
    """``catalog = [...]`` in a config file: the user's GPU and model, then the roofline."""
    (tmp_path / "extra.toml").write_text(USER_TOML)
    config = tmp_path / "sim.toml"
    config.write_text(
        """
catalog = ["extra.toml"]
[replica]
model = "tiny-llama"
device = "my-gpu"
[execution]
model = "roofline"
[workload]
kind = "synthetic"
num_requests = 50
arrival = { kind = "poisson", qps = 5.0 }
prompt_tokens = { kind = "fixed", value = 100 }
output_tokens = { kind = "fixed", value = 10 }
"""
    )
    from tokenyard.simulation import load_config, simulate

    result = simulate(load_config(config))
    assert result.summary["config"]["device"] == "my-gpu"
    assert result.summary["num_requests"] == 50


def test_a_user_entry_overrides_a_built_in_one(tmp_path: Path) -> None:
    a10g = catalog.device("a10g")
    path = tmp_path / "prices.json"
    entry = {k: v for k, v in vars(a10g).items() if k != "name"}
    entry["aliases"] = list(a10g.aliases)
    entry["price_per_hour"] = 0.75
    path.write_text(json.dumps({"devices": {"a10g": entry}}))
    catalog.load_catalog_file(path)
    assert catalog.device("a10g").price_per_hour == 0.75
    assert catalog.builtin_devices()["a10g"].price_per_hour == a10g.price_per_hour


def test_a_yaml_catalog_file(tmp_path: Path) -> None:
    path = tmp_path / "extra.yaml"
    path.write_text(
        "models:\n  yaml-model:\n    num_layers: 2\n    hidden_size: 64\n    num_heads: 4\n"
        "    num_kv_heads: 4\n    intermediate_size: 128\n    vocab_size: 10\n"
        "    context_length: 1024\n    tied_embeddings: true\n"
    )
    catalog.load_catalog_file(path)
    assert catalog.model("yaml-model").tied_embeddings


GOOD_MODEL = (
    "num_layers = 2\nhidden_size = 64\nnum_heads = 4\nnum_kv_heads = 2\n"
    "intermediate_size = 128\nvocab_size = 10\ncontext_length = 2048\n"
)
GOOD_DEVICE = (
    "memory_gib = 8.0\ndense_bf16_tflops = 10.0\nmemory_bandwidth_gbps = 100.0\n"
    "interconnect_gbps = 10.0\n"
)


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (
            "[models.m]\n" + GOOD_MODEL + "num_hedas = 4\n",
            "models.m.num_hedas",
            ["unknown field", "num_heads", "experts_per_token"],
        ),
        (
            "[models.m]\n" + GOOD_MODEL.replace("vocab_size = 10\n", ""),
            "models.m.vocab_size",
            ["missing", "vocab_size"],
        ),
        (
            "[models.m]\n" + GOOD_MODEL.replace("num_layers = 2", 'num_layers = "2"'),
            "models.m.num_layers",
            ["must be an integer", "'2'"],
        ),
        (
            "[models.m]\n" + GOOD_MODEL.replace("num_heads = 4", "num_heads = 0"),
            "models.m.num_heads",
            ["models.m.num_heads: must be an integer >= 1, got 0"],
        ),
        (
            "[models.m]\n" + GOOD_MODEL.replace("num_kv_heads = 2", "num_kv_heads = 3"),
            "models.m.num_kv_heads",
            ["must divide num_heads (4)", "got 3"],
        ),
        (
            "[models.m]\n" + GOOD_MODEL + "num_experts = 2\nexperts_per_token = 3\n",
            "models.m.experts_per_token",
            ["<= num_experts (2)"],
        ),
        (
            "[models.m]\n" + GOOD_MODEL + "tied_embeddings = 1\n",
            "models.m.tied_embeddings",
            ["true or false"],
        ),
        (
            "[devices.d]\n" + GOOD_DEVICE.replace("= 100.0", "= 0.0"),
            "devices.d.memory_bandwidth_gbps",
            ["must be a number > 0", "got 0.0"],
        ),
        (
            "[devices.d]\n"
            + GOOD_DEVICE.replace("interconnect_gbps = 10.0", "interconnect_gbps = -1"),
            "devices.d.interconnect_gbps",
            ["> 0", "got -1"],
        ),
        (
            "[devices.d]\n" + GOOD_DEVICE + 'aliases = ["a10g"]\n',
            "devices.d.aliases",
            ["'a10g' is already the name of a device"],
        ),
        ("[models.m\nnum_layers = 2\n", "catalog", ["bad.toml"]),
        ("[gpus.d]\nmemory_gib = 8.0\n", "gpus", ["unknown table"]),
    ],
)
def test_a_bad_catalog_file_names_file_entry_and_field(
    tmp_path: Path, text: str, field: str, words: list[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    before = (catalog.models(), catalog.devices())
    with pytest.raises(ConfigError) as info:
        catalog.load_catalog_file(path)
    assert info.value.field == field
    message = str(info.value)
    assert message.startswith(str(path))
    for word in words:
        assert word in message
    assert (catalog.models(), catalog.devices()) == before  # all or nothing


def test_a_missing_file_or_unknown_format_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml") as info:
        catalog.load_catalog_file(tmp_path / "nope.toml")
    assert info.value.field == "catalog"
    ini = tmp_path / "x.ini"
    ini.write_text("")
    with pytest.raises(ConfigError, match="unknown catalog format"):
        catalog.load_catalog_file(ini)


def test_specs_validate_when_built_directly() -> None:
    with pytest.raises(ConfigError) as info:
        DeviceSpec(
            name="g",
            memory_gib=-1.0,
            dense_bf16_tflops=1.0,
            memory_bandwidth_gbps=1.0,
            interconnect_gbps=1.0,
        )
    assert info.value.field == "devices.g.memory_gib"
