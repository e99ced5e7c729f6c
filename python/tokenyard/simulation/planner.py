"""The memory planner (seed 000 §12): how much KV cache a replica has once its share of the
weights is loaded, and so how many requests it can hold.

Per device: ``available = memory x (1 - margin) - parameter bytes / (TP x PP)``. KV bytes
per token on a device = ``2 (K and V) x 2 bytes (fp16) x head_dim x ceil(kv_heads / TP) x
layers / PP``. A request may grow to ``max_request_tokens``, so ``max_batch_size =
available // (kv per token x max_request_tokens)`` and the replica's KV pool is
``num_blocks = available // (kv per token x block_size)`` blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenyard.errors import ConfigError
from tokenyard.simulation.catalog import DeviceSpec, ModelSpec

__all__ = ["MemoryPlan", "plan_memory"]

BYTES_PER_VALUE = 2  # fp16 / bf16


@dataclass(frozen=True)
class MemoryPlan:
    parameter_bytes_per_device: int
    kv_bytes_per_token: int
    available_kv_bytes: int
    max_batch_size: int
    num_blocks: int


def plan_memory(
    model: ModelSpec,
    device: DeviceSpec,
    *,
    tensor_parallel_size: int,
    num_pipeline_stages: int,
    memory_margin_fraction: float,
    max_request_tokens: int,
    block_size: int,
) -> MemoryPlan:
    """Raises ConfigError when the layout does not divide the model or nothing fits."""
    tp, pp = tensor_parallel_size, num_pipeline_stages
    if model.num_layers % pp:
        raise ConfigError(
            f"replica.num_pipeline_stages={pp} must divide the {model.num_layers} layers of "
            f"{model.name}",
            field="replica.num_pipeline_stages",
            value=str(pp),
        )
    if model.num_heads % tp:
        raise ConfigError(
            f"replica.tensor_parallel_size={tp} must divide the {model.num_heads} attention "
            f"heads of {model.name}",
            field="replica.tensor_parallel_size",
            value=str(tp),
        )
    parameter_bytes = model.num_parameters() * BYTES_PER_VALUE // (tp * pp)
    kv_heads_per_worker = math.ceil(model.num_kv_heads / tp)
    kv_per_token = (
        2 * BYTES_PER_VALUE * model.head_dim * kv_heads_per_worker * (model.num_layers // pp)
    )
    total = int(device.memory_gib * 1024**3 * (1 - memory_margin_fraction))
    available = total - parameter_bytes
    max_batch_size = available // (kv_per_token * max_request_tokens) if available > 0 else 0
    if max_batch_size < 1:
        raise ConfigError(
            f"{model.name} on {device.name} (TP {tp}, PP {pp}): "
            f"{parameter_bytes / 1024**3:.1f} GiB of weights per device leave "
            f"{max(available, 0) / 1024**3:.1f} GiB of the {total / 1024**3:.1f} GiB usable, "
            f"not enough for one request of {max_request_tokens} tokens "
            f"({kv_per_token * max_request_tokens / 1024**3:.2f} GiB of KV)",
            field="replica.device",
            value=device.name,
        )
    return MemoryPlan(
        parameter_bytes_per_device=parameter_bytes,
        kv_bytes_per_token=kv_per_token,
        available_kv_bytes=available,
        max_batch_size=int(max_batch_size),
        num_blocks=int(available // (kv_per_token * block_size)),
    )
