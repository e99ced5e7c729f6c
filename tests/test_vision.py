"""Vision-language models (issue 29, item 1): the vision tower read from ``vision_config``,
its weights against the published sizes, images in synthetic workloads mapped to vision
tokens as the Qwen image processor does, the encoder priced per image, and images refused
for a text-only model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_configs import load_config, require_bundled, write_config
from synthetic_jobs import synthetic_workload

from tokenyard import catalog
from tokenyard.catalog.vision import smart_resize
from tokenyard.errors import ConfigError
from tokenyard.simulation.config import config_from_mapping
from tokenyard.simulation.run import simulate
from tokenyard.workload import load_workload

QWEN3_VL_8B = "Qwen/Qwen3-VL-8B-Instruct"

#: Qwen/Qwen2.5-VL-7B-Instruct's config.json (the keys that matter; not bundled).
QWEN2_5_VL_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 128000,
    "tie_word_embeddings": False,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
    },
}


@pytest.fixture
def qwen2_5_vl(tmp_path: Path) -> str:
    return str(write_config(tmp_path, QWEN2_5_VL_7B))


# ---- the tower and its weights ---------------------------------------------------------

#: Published sizes (Hugging Face model cards' safetensors counts), in billions.
PUBLISHED = {
    "Qwen/Qwen3-VL-2B-Instruct": 2.13,
    "Qwen/Qwen3-VL-4B-Instruct": 4.44,
    "Qwen/Qwen3-VL-8B-Instruct": 8.77,
    "Qwen/Qwen3-VL-32B-Instruct": 33.4,
    "Qwen/Qwen3-VL-30B-A3B-Instruct": 31.1,
    "Qwen/Qwen3-VL-235B-A22B-Instruct": 236.0,
}


@pytest.mark.parametrize(("name", "billions"), sorted(PUBLISHED.items()))
def test_qwen3_vl_parameters_match_the_published_sizes(name: str, billions: float) -> None:
    require_bundled(name)
    spec = catalog.model(name)
    assert spec.vision is not None
    assert spec.vision.kind == "qwen3_vl"
    assert spec.num_parameters() / 1e9 == pytest.approx(billions, rel=0.02)


def test_qwen3_vl_8b_tower_reads_its_vision_config() -> None:
    """27 blocks of 1152 (16 heads of 72), merge 2 -> 4608, three deepstack mergers:
    576.4M weights, 8.19B + 0.58B = 8.77B in all."""
    require_bundled(QWEN3_VL_8B)
    spec = catalog.model(QWEN3_VL_8B)
    v = spec.vision
    assert v is not None
    assert (v.depth, v.hidden_size, v.head_dim, v.merged_size) == (27, 1152, 72, 4608)
    assert v.deepstack_layers == (8, 16, 24)
    assert v.num_mergers == 4
    assert spec.qk_norm
    assert spec.hidden_size == 4096
    assert v.parameters() == 576_388_336


def test_qwen2_5_vl_7b_loads_with_its_windowed_tower(qwen2_5_vl: str) -> None:
    spec = catalog.model(qwen2_5_vl)
    v = spec.vision
    assert v is not None
    assert v.kind == "qwen2_5_vl"
    assert v.gated_mlp
    assert v.fullatt_blocks == (7, 15, 23, 31)
    assert v.window_size == 112
    assert spec.attention_bias  # a Qwen2 decoder
    assert spec.num_parameters() / 1e9 == pytest.approx(8.29, rel=0.02)  # published 8.29B


def test_vision_weights_are_in_the_memory_plan() -> None:
    from tokenyard.simulation.planner import parameters_per_device

    require_bundled(QWEN3_VL_8B)
    spec = catalog.model(QWEN3_VL_8B)
    assert parameters_per_device(spec, 1, 1) == spec.num_parameters()


def test_a_bad_vision_key_is_named(tmp_path: Path) -> None:
    config = json.loads(json.dumps(QWEN2_5_VL_7B))
    del config["vision_config"]["depth"]
    with pytest.raises(ConfigError, match=r"vision_config\.depth: missing"):
        load_config(tmp_path, config)


# ---- images to tokens ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        (1024, 1024, 1024),  # 32 x 32 multiples already: 64 x 64 patches / 4
        (1024, 768, 768),  # 64 x 48 patches / 4
        (500, 300, 144),  # rounded to 512 x 288: 32 x 18 patches / 4
        (100, 100, 64),  # below 65,536 px: scaled up to 256 x 256
        (8000, 8000, 16384),  # above 16,777,216 px: scaled down to 4096 x 4096
    ],
)
def test_qwen3_vl_vision_tokens_by_hand(width: int, height: int, tokens: int) -> None:
    require_bundled(QWEN3_VL_8B)
    vision = catalog.model(QWEN3_VL_8B).vision
    assert vision is not None
    assert vision.image_tokens(width, height) == tokens


def test_qwen2_5_vl_vision_tokens_by_hand(qwen2_5_vl: str) -> None:
    """Factor 28: 1024 -> 37 x 28 = 1036 a side, 74 x 74 patches / 4 = 1369; 500 x 300 ->
    504 x 308, 36 x 22 patches / 4 = 198."""
    vision = catalog.model(qwen2_5_vl).vision
    assert vision is not None
    assert vision.image_tokens(1024, 1024) == 1369
    assert vision.image_tokens(500, 300) == 198


def test_smart_resize_refuses_extreme_aspect_ratios() -> None:
    with pytest.raises(ConfigError, match="aspect ratio"):
        smart_resize(10, 2010, factor=28, min_pixels=3136, max_pixels=12845056)


def synthetic(images: dict[str, Any], n: int = 64) -> dict[str, Any]:
    return synthetic_workload(
        n, qps=4.0, prompt_tokens=200, output_tokens=50, seed=3, images=images
    )


def test_images_add_their_tokens_to_the_prompts() -> None:
    """Half the requests carry 1-3 images of 100 tokens: prompts are 200 + 100 k."""
    count = {"kind": "uniform", "low": 1, "high": 3}
    spec = synthetic({"share": 0.5, "count": count, "tokens_per_image": 100})
    workload = load_workload(spec)
    prompts = np.concatenate([c.num_prefill_tokens for c in workload.chunks()])
    images = (prompts.astype(np.int64) - 200) // 100
    assert set(np.unique(images).tolist()) <= {0, 1, 2, 3}
    assert ((prompts - 200) % 100 == 0).all()
    assert 0 < (images == 0).sum() < len(prompts)
    # The text and output draws do not move when images are added.
    plain = load_workload({k: v for k, v in spec.items() if k != "images"})
    assert (next(plain.chunks()).num_prefill_tokens == 200).all()
    assert load_workload(workload.describe()).describe() == workload.describe()


def test_images_in_pixels_need_the_model() -> None:
    workload = load_workload(synthetic({"width": 1024, "height": 1024}))
    with pytest.raises(ConfigError, match="vision tower"):
        next(workload.chunks())


def test_images_table_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"workload\.images\.tokens_per_image: give either"):
        load_workload(synthetic({"share": 1.0}))
    with pytest.raises(ConfigError, match=r"workload\.images\.share"):
        load_workload(synthetic({"share": 2.0, "tokens_per_image": 10}))


# ---- end to end ------------------------------------------------------------------------


def sim(model: str, images: dict[str, Any] | None, n: int = 64) -> Any:
    workload = synthetic(images or {}, n)
    if images is None:
        del workload["images"]
    config = config_from_mapping(
        {
            "replica": {"model": model, "device": "h100-sxm", "tensor_parallel_size": 1},
            "workload": workload,
        }
    )
    return simulate(config)


def test_qwen3_vl_8b_simulates_with_images_on_h100() -> None:
    """One 1024 x 1024 image per request: 1,024 vision tokens, the encoder priced from the
    encoder_attention and GEMM tables; the banner says how it is charged."""
    require_bundled(QWEN3_VL_8B)
    with_images = sim(QWEN3_VL_8B, {"width": 1024, "height": 1024}).summary
    without = sim(QWEN3_VL_8B, None).summary
    description = with_images["config"]
    vision = description["vision"]
    assert vision["vision_tokens_per_image"] == 1024
    assert vision["patches_per_image"] == 4096
    assert vision["encoder_source"].startswith("measured: encoder_attention")
    assert 2.0 < vision["encoder_ms_per_image"] < 50.0
    assert vision["sample"]["prefill_tokens"] == 64 * (200 + 1024)
    ops = description["execution"]["op_sources"]
    assert ops["vision_encoder"].startswith("measured: encoder_attention")
    note = next(n for n in description["notes"] if n.startswith("VISION ENCODER"))
    assert "measured: encoder_attention" in note
    assert "every prefill token" in note
    ttft = with_images["latency_s"]["ttft"]["mean"], without["latency_s"]["ttft"]["mean"]
    assert ttft[0] > ttft[1] + vision["encoder_ms_per_image"] / 1e3


def test_the_banner_names_the_encoder_pricing() -> None:
    from tokenyard.simulation.cli import format_summary

    require_bundled(QWEN3_VL_8B)
    lines = format_summary(sim(QWEN3_VL_8B, {"tokens_per_image": 256}, n=16)).splitlines()
    assert any(line.startswith("note: VISION ENCODER SPREAD") for line in lines)


def test_images_for_a_text_only_model_are_refused() -> None:
    with pytest.raises(ConfigError) as err:
        sim("llama-3.1-8b", {"tokens_per_image": 100})
    assert err.value.field == "workload.images"
    assert "text-only" in str(err.value)
