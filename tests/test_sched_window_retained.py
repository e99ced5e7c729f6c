"""SchedulerConfig.kv_window_extra_retained_tokens: vLLM 0.33's
``SlidingWindowSpec.extra_retained_tokens`` (a multi-module MTP drafter's re-prefill runway
below each window). Hand-checked numbers; the adapter's check against vLLM's own scheduler
is tests/test_integrations_vllm_hybrid.py (``window<N>r<E>`` layouts)."""

from __future__ import annotations

import pytest

from tokenyard.errors import ConfigError
from tokenyard.kv import FullAttentionSpec, SlidingWindowSpec
from tokenyard.sched import Scheduler, SchedulerConfig


def scheduler(groups: tuple[object, ...], extra: int) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            block_size=4,
            num_blocks=64,
            max_model_len=64,
            max_num_batched_tokens=32,
            kv_groups=groups,  # type: ignore[arg-type]
            kv_window_extra_retained_tokens=extra,
        )
    )


@pytest.mark.parametrize(("extra", "num_held"), [(0, 5 + 3), (5, 5 + 4)])
def test_a_window_keeps_its_blocks_the_extra_tokens_longer(extra: int, num_held: int) -> None:
    # Blocks of 4, a window of 8 beside full attention; a 16-token prompt, then a decode:
    # 16 computed skip max(0, 16 - 8 + 1 - extra) tokens, 9 (two blocks) or 4 (one): full
    # attention holds 5 blocks, the window 5 less those.
    s = scheduler((FullAttentionSpec(), SlidingWindowSpec(sliding_window=8)), extra)
    s.add_request("a", list(range(16)), 4)
    s.schedule()
    s.update_from_output({"a": [99]})
    s.schedule()
    assert s.num_free_blocks == 63 - num_held


def test_retaining_tokens_without_a_window_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        scheduler((FullAttentionSpec(), FullAttentionSpec()), 3)
    assert err.value.field == "kv_window_extra_retained_tokens"
    with pytest.raises(ConfigError) as err:
        scheduler((), 3)
    assert err.value.field == "kv_window_extra_retained_tokens"
