"""Images in a simulation: the model's vision tower for a workload that carries images
(refused for a text-only model), and the encoder's cost added to the predictor as the
documented spread over prefill tokens (``predictor/vision.py``), with the banner's words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tokenyard.catalog.vision import VisionEncoder
from tokenyard.errors import ConfigError
from tokenyard.predictor.compiled import CompiledPredictor
from tokenyard.predictor.vision import encoder_cost, with_vision_encoder
from tokenyard.simulation.catalog import catalog_for
from tokenyard.simulation.config import SimulationConfig
from tokenyard.simulation.execution import ExecutionChoice
from tokenyard.workload.chunk import Workload
from tokenyard.workload.synthetic import BLOCK, SyntheticWorkload

__all__ = ["vision_for", "with_images"]


def vision_for(config: SimulationConfig) -> VisionEncoder | None:
    """The model's vision tower when the workload gives ``images``; None without images.

    Raises:
        ConfigError: images for a model without a vision tower (field ``workload.images``).
    """
    spec = config.seeded_workload()
    if not isinstance(spec, Mapping) or spec.get("images") is None:
        return None
    model = catalog_for(config).model(config.model_name(), field="replica.model")
    if model.vision is None:
        raise ConfigError(
            f"workload.images: {model.name} is a text-only model (no vision_config that "
            "tokenyard reads: Qwen2.5-VL, Qwen3-VL); images need a vision-language model, "
            "or give their tokens in prompt_tokens",
            field="workload.images",
            value=repr(spec["images"]),
        )
    return model.vision


def _synthetic(workload: Any) -> SyntheticWorkload | None:
    """The synthetic workload inside LoRA and closed-loop wrappers."""
    for _ in range(4):
        if isinstance(workload, SyntheticWorkload):
            return workload
        workload = getattr(workload, "inner", None) or getattr(workload, "workload", None)
    return None


def with_images(
    config: SimulationConfig,
    predictor: CompiledPredictor | None,
    workload: Workload,
    vision: VisionEncoder,
    choice: ExecutionChoice,
) -> tuple[CompiledPredictor | None, dict[str, Any], str]:
    """``predictor`` with the encoder's ``vision_encoder`` op, the summary's ``vision``
    record and the banner's note."""
    synthetic = _synthetic(workload)
    if synthetic is None or synthetic.images is None:  # vision_for found the key: unreachable
        raise ConfigError("workload.images: only synthetic workloads carry images")
    images = synthetic.images
    device = catalog_for(config).device(config.replica.device, field="replica.device")
    tp = config.replica.tensor_parallel_size
    source = choice.source if choice.kind == "measured" else None
    cost = encoder_cost(vision, device, images.patches(), tensor_parallel_size=tp, source=source)
    size = min(BLOCK, synthetic.num_requests)
    counts = synthetic.image_counts(0, size)
    prefill = next(iter(synthetic.chunks(BLOCK))).num_prefill_tokens.astype(np.int64)
    num_images, num_prefill = int(counts.sum()), int(prefill.sum())
    rate = num_images * cost.seconds / num_prefill
    record: dict[str, Any] = {
        "vision_tokens_per_image": images.tokens(),
        "patches_per_image": cost.patches,
        "encoder_ms_per_image": cost.seconds * 1e3,
        "encoder_parts_ms": {k: v * 1e3 for k, v in cost.parts_s.items()},
        "encoder_source": cost.source,
        "sample": {"requests": size, "images": num_images, "prefill_tokens": num_prefill},
        "encoder_s_per_prefill_token": rate,
    }
    if predictor is None:
        note = (
            f"IMAGES: {images.tokens()} vision tokens per image added to the prompts; the "
            f"vision encoder is NOT priced ({config.execution.model} execution model)"
        )
        return predictor, record, note
    predictor = with_vision_encoder(predictor, rate, cost.source)
    note = (
        f"VISION ENCODER SPREAD OVER PREFILL TOKENS: {images.tokens()} vision tokens per image "
        f"added to the prompts; the encoder ({cost.seconds * 1e3:.2f} ms per image, "
        f"{cost.source}) is charged as {rate * 1e6:.3f} us on every prefill token (the "
        f"workload's {num_images:,} images over {num_prefill:,} prefill tokens in its first "
        f"{size:,} requests), not at the step that schedules each image (the core has no "
        "per-request encoder cost or encoder budget yet)"
    )
    return predictor, record, note
