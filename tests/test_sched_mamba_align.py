"""The step scheduler's Mamba ``align`` chunk split and drafter prefill look-ahead from
Python (``SchedulerConfig.mamba_align_block_size``, ``num_prefill_lookahead``,
``Scheduler.set_mamba_align``): each setting changes the chunks, and bad values are refused
by name. vLLM 0.33's own scheduler is the reference in
tests/test_integrations_vllm_mamba_align.py."""

from __future__ import annotations

import pytest

from tokenyard.errors import ConfigError
from tokenyard.sched import Scheduler, SchedulerConfig


def _chunks(config: SchedulerConfig, prompt_len: int, steps: int) -> list[int]:
    s = Scheduler(config)
    s.add_request(0, list(range(prompt_len)), 4)
    chunks = []
    for _ in range(steps):
        out = s.schedule()
        chunks.append(out.num_scheduled_tokens[0])
        done = s.num_computed_tokens(0) >= s.num_tokens(0)
        s.update_from_output({0: [7]} if done else {})
    return chunks


def test_the_split_ends_chunks_on_mamba_blocks() -> None:
    # Budget 10, blocks of 4, 23 tokens: 8, 8, 4 (the last reusable state, 20), 3.
    base = {"max_num_batched_tokens": 10, "block_size": 4, "num_blocks": 64}
    assert _chunks(SchedulerConfig(**base, mamba_align_block_size=4), 23, 4) == [8, 8, 4, 3]
    assert _chunks(SchedulerConfig(**base), 23, 3) == [10, 10, 3]


def test_the_lookahead_keeps_a_chunk_out_of_the_prompts_tail() -> None:
    # Budget 10, look-ahead 3, 12 tokens: 9 then 3 (10 would leave 2 < 3).
    base = {"max_num_batched_tokens": 10, "block_size": 4, "num_blocks": 64}
    assert _chunks(SchedulerConfig(**base, num_prefill_lookahead=3), 12, 2) == [9, 3]
    assert _chunks(SchedulerConfig(**base), 12, 2) == [10, 2]


def test_set_on_a_built_scheduler() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64))
    assert s.mamba_align is None
    assert s.num_prefill_lookahead == 0
    s.set_mamba_align(16, drop_eagle_block=True)
    assert s.mamba_align == (16, True, 0)
    s.set_mamba_align(0)
    assert s.mamba_align is None
    s.num_prefill_lookahead = 2
    assert s.num_prefill_lookahead == 2


@pytest.mark.parametrize("field", ["mamba_align_block_size", "num_prefill_lookahead"])
def test_a_negative_value_is_refused_by_name(field: str) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerConfig(**{field: -1})
    assert info.value.field == field


def test_the_split_reads_the_schedulers_one_lookahead() -> None:
    # The split's look-ahead is the scheduler's: set on a built scheduler, it moves the
    # split's last reusable state too, (100 - 1) / 16 * 16 = 96 -> (100 - 5) / 16 * 16 = 80.
    config = SchedulerConfig(
        num_blocks=64, enable_prefix_caching=True, block_size=16, max_num_batched_tokens=256
    )
    chunks = []
    for lookahead in (0, 5):
        s = Scheduler(config)
        s.set_mamba_align(16)
        s.num_hash_lookahead_tokens = lookahead
        assert s.mamba_align == (16, False, lookahead)
        s.add_request(0, list(range(100)), max_tokens=1)
        chunks.append(s.schedule().num_scheduled_tokens)
    assert chunks == [{0: 96}, {0: 80}]


def test_mtp_lookahead_hashes_over_smaller_blocks_are_refused_as_vllm() -> None:
    # vLLM 0.33's KVCacheCoordinator raises for multi-module MTP (k = 3 prefill look-ahead,
    # look-ahead hashes of 3) over blocks of 2 with prefix caching; blocks of 4 are served.
    base = {"enable_prefix_caching": True, "num_blocks": 64, "num_prefill_lookahead": 3}
    with pytest.raises(ConfigError, match="block_size") as info:
        Scheduler(SchedulerConfig(**base, block_size=2, num_hash_lookahead_tokens=3))
    assert info.value.field == "block_size"
    Scheduler(SchedulerConfig(**base, block_size=4, num_hash_lookahead_tokens=3))
