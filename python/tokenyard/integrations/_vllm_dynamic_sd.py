"""vLLM 0.33's dynamic speculative decoding (``SpeculativeConfig.
num_speculative_tokens_per_batch_size``) for ``TokenyardScheduler``
(``tokenyard.integrations.vllm``).

The schedule maps the number of requests a step schedules to the drafts the runner proposes
for the next step. vLLM's ``Scheduler.__init__`` expands it into ``dynamic_sd_lookup`` (its
own ``build_dynamic_sd_schedule_lookup``, ``vllm/v1/spec_decode/dynamic/utils.py``, which
raises ``ValueError`` on a bad schedule), and ``schedule()`` reads it into
``SchedulerOutput.num_spec_tokens_to_schedule``: ``lookup[len(num_scheduled_tokens)]``
when the step schedules a request, the static ``num_spec_tokens`` otherwise. Its
``AsyncScheduler._update_after_schedule`` gives each sampling request that many placeholder
drafts for the step scheduled ahead. With a schedule set, vLLM does not pad one-token
admissions to ``1 + k`` (``_vllm_translate._pads_spec_decode`` reads the same field).
Nothing else of the scheduler changes: the admission reserve stays on the static ``k``
(``_spec_decode_step_blocks``). Imported only by that module, so vLLM is installed."""

from __future__ import annotations

from typing import Any

from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup


def dynamic_sd_lookup_of(vllm_config: Any, num_spec_tokens: int) -> list[int] | None:
    """vLLM 0.33's ``Scheduler.dynamic_sd_lookup``: index ``n`` holds the drafts for a step
    scheduling ``n`` requests, up to ``max_num_seqs``; ``None`` without a schedule (vLLM's
    ``VllmConfig`` clears it under data parallelism and for unsupported drafters).

    Raises:
        ValueError: the schedule is malformed (vLLM's messages: a first range not starting
            at 1, overlapping ranges, a negative ``k``, an empty list).
    """
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is None or not speculative.num_speculative_tokens_per_batch_size:
        return None
    lookup: list[int] = build_dynamic_sd_schedule_lookup(
        speculative.num_speculative_tokens_per_batch_size,
        vllm_max_batch_size=vllm_config.scheduler_config.max_num_seqs,
        vllm_num_speculative_tokens=num_spec_tokens,
    )
    return lookup


def num_spec_tokens_to_schedule(
    lookup: list[int] | None, num_spec_tokens: int, num_scheduled_requests: int
) -> int:
    """vLLM 0.33's ``schedule()``: the drafts the runner proposes after this step."""
    if lookup is not None and num_scheduled_requests > 0:
        return lookup[num_scheduled_requests]
    return num_spec_tokens
