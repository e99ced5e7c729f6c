"""Execution-time models for tests, loaded by the simulator as ``tests.exec_models:NAME``."""

from __future__ import annotations

#: A linear execution model (``[execution]`` keys) fast enough that small clusters run many
#: steps in a test: 10 ms a step, 0.1 ms per prompt token, 1 ms per decode token.
FAST_LINEAR = {
    "model": "linear",
    "constant_s": 0.01,
    "per_prefill_token_s": 1e-4,
    "per_decode_token_s": 1e-3,
    "per_decode_context_token_s": 0.0,
    "per_prefill_context_token_s": 0.0,
    "cpu_overhead_s": 0.0,
}


def step_model(
    *,
    num_requests: int,
    num_prefill_tokens: int,
    num_decode_tokens: int,
    sum_decode_context: int,
    sum_prefill_context: int,
    sum_prefill_squared: int,
    num_padding_rows: int,
    stage: int,
    num_stages: int,
) -> tuple[float, float]:
    """tests/test_simulate.py's STEP_MODEL, in Python."""
    model_s = (1.0 + 0.1 * num_prefill_tokens + 0.2 * (num_decode_tokens + num_padding_rows)) / (
        num_stages
    )
    return model_s, model_s


#: What ``lora_recording_model`` saw: each batch stage's distinct adapters.
LORA_ADAPTERS_SEEN: list[int] = []


def lora_recording_model(
    *, stage: int, num_stages: int, num_lora_adapters: int = 0, **shape: int
) -> float:
    """10 ms per batch stage plus 1 ms per adapter; records the adapters of each batch."""
    LORA_ADAPTERS_SEEN.append(num_lora_adapters)
    return 0.01 + 0.001 * num_lora_adapters
