"""Cross-attention KV groups (``tokenyard.kv.CrossAttentionSpec``, vLLM 0.33's
``CrossAttentionManager``) in the coordinator and in the step scheduler's
encoder-decoder mode (``Scheduler.set_encoder_decoder``): blocks for a request's encoder
tokens, allocated once and held to its end (docs/kv.md, docs/embedding.md)."""

from __future__ import annotations

import math

import pytest

from tokenyard.errors import ConfigError, InputError
from tokenyard.kv import CrossAttentionSpec, FullAttentionSpec, KvCoordinator
from tokenyard.sched import MmFeature, Scheduler, SchedulerConfig


def test_the_coordinator_sizes_a_cross_group_by_the_encoder_tokens_given() -> None:
    groups = [FullAttentionSpec(), CrossAttentionSpec()]
    kv = KvCoordinator(groups=groups, num_blocks=64, block_size=4, enable_caching=False)
    full, cross = kv.allocate_slots("a", 6, token_ids=list(range(6)), num_encoder_tokens=17)
    assert (len(full), len(cross)) == (2, 5)
    # Later allocations carry no encoder tokens: the cross group keeps its 5 blocks.
    full, cross = kv.allocate_slots("a", 4, token_ids=list(range(6, 10)))
    assert (len(full), len(cross)) == (1, 0)
    assert repr(CrossAttentionSpec()) == "CrossAttentionSpec()"
    with pytest.raises(ConfigError):
        KvCoordinator(groups=groups, num_blocks=64, block_size=4, enable_caching=True)


def _whisper(num_blocks: int = 1000) -> Scheduler:
    s = Scheduler(
        SchedulerConfig(
            block_size=16,
            num_blocks=num_blocks,
            max_num_batched_tokens=8192,
            max_model_len=8192,
            enable_prefix_caching=False,
            kv_groups=(FullAttentionSpec(), CrossAttentionSpec()),
        )
    )
    s.set_encoder_decoder(True)
    return s


@pytest.mark.parametrize("encoder_tokens", [1, 15, 16, 17, 160, 161, 1500])
def test_each_request_holds_ceil_encoder_tokens_over_block_size_cross_blocks(
    encoder_tokens: int,
) -> None:
    s = _whisper()
    s.add_request("r", list(range(100)), 3, mm_features=[MmFeature(0, encoder_tokens, "e")])
    out = s.schedule()
    assert out.scheduled_encoder_inputs == {"r": [0]}
    assert len(s.group_block_ids("r")[1]) == math.ceil(encoder_tokens / 16)


def test_without_the_mode_items_must_lie_in_the_prompt_and_the_mode_is_fixed_under_them() -> None:
    s = _whisper()
    s.set_encoder_decoder(False)
    assert not s.is_encoder_decoder
    with pytest.raises(InputError):
        s.add_request("r", list(range(100)), 3, mm_features=[MmFeature(0, 500, "e")])
    s.add_request("t", list(range(100)), 3, mm_features=[MmFeature(0, 50, "e")])
    with pytest.raises(InputError):
        s.set_encoder_decoder(True)
