"""SchedulerConfig.kv_group_is_eagle: EAGLE's trailing-block drop in the flagged KV groups only
(vLLM 0.33's ``KVCacheGroupSpec.is_eagle_group``, ``KVCacheCoordinator.drop_eagle_group_ids``;
all groups when none is flagged). Hand-checked numbers; the adapter's check against vLLM's own
scheduler is tests/test_integrations_vllm_eagle_groups.py."""

from __future__ import annotations

import pytest

from tokenyard.errors import ConfigError
from tokenyard.kv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
    block_hashes,
)
from tokenyard.sched import Scheduler, SchedulerConfig

_WINDOW = SlidingWindowSpec(sliding_window=4)
_CHUNKED = ChunkedLocalAttentionSpec(attention_chunk_size=8)


def scheduler(groups: tuple[object, ...], **options: object) -> Scheduler:
    config = {
        "block_size": 2,
        "num_blocks": 64,
        "max_model_len": 64,
        "max_num_batched_tokens": 16,
        "enable_prefix_caching": True,
        "eagle_block_drop": True,
        "kv_groups": groups,
        **options,
    }
    return Scheduler(SchedulerConfig(**config))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("flags", "lengths"),
    [((), [8, 8]), ((False, False), [8, 8]), ((True, False), [8, 10]), ((False, True), [10, 8])],
)
def test_only_the_flagged_groups_drop_a_block(flags: tuple[bool, ...], lengths: list[int]) -> None:
    # Blocks of 2, full attention beside a window of 4; an 11-token prompt cached (5 full
    # blocks). Each group's own hit over the prompt: a dropping group reads the 5 blocks and
    # drops one (8), the window needing 3 in a row then; one that does not keeps 5 (10).
    s = scheduler((FullAttentionSpec(), _WINDOW), kv_group_is_eagle=flags)
    prompt = list(range(11))
    s.add_request("a", prompt, 1)
    s.schedule()
    s.update_from_output({"a": [99]})
    _, found = s.kv_hits_per_group(block_hashes(prompt, block_size=2), 11)
    assert list(found) == lengths


def test_a_chunked_local_group_stands_beside_the_drop_only_unflagged() -> None:
    # vLLM's ChunkedLocalAttentionManager asserts it never drops.
    with pytest.raises(ConfigError, match="chunked local"):
        scheduler((FullAttentionSpec(), _CHUNKED))
    with pytest.raises(ConfigError, match="chunked local"):
        scheduler((FullAttentionSpec(), _CHUNKED), kv_group_is_eagle=(True, True))
    s = scheduler((FullAttentionSpec(), _CHUNKED), kv_group_is_eagle=(True, False))
    s.add_request("a", list(range(12)), 1)
    assert dict(s.schedule().num_scheduled_tokens) == {"a": 12}


@pytest.mark.parametrize(
    ("groups", "flags", "field"),
    [
        ((), (True,), "kv_group_is_eagle"),
        ((FullAttentionSpec(),), (True,), "kv_group_is_eagle"),
        ((FullAttentionSpec(), _WINDOW), (True,), "kv_group_is_eagle"),
        ((FullAttentionSpec(), _WINDOW), (True, 1), "kv_group_is_eagle[1]"),
        ((FullAttentionSpec(), _WINDOW), "tt", "kv_group_is_eagle"),
    ],
)
def test_flags_that_cannot_apply_are_refused(
    groups: tuple[object, ...], flags: object, field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        scheduler(groups, kv_group_is_eagle=flags)
    assert err.value.field == field


def test_a_multi_module_mtp_drafter_caches_less_in_the_dropping_groups() -> None:
    # num_prefill_lookahead 2: one re-prefillable token (vLLM's num_reprefillable_tokens).
    # Blocks of 2, full attention beside a window of 8, prompt 0..7 computed: the dropping
    # groups cache 7 finalized tokens (3 full blocks), so a 10-token query finds 3 and
    # drops one (4 tokens), where a one-module drafter caches 4 blocks and hits 6.
    def hit(num_prefill_lookahead: int) -> int:
        groups = (FullAttentionSpec(), SlidingWindowSpec(sliding_window=8))
        s = scheduler(groups, num_prefill_lookahead=num_prefill_lookahead)
        s.add_request("a", list(range(8)), 3, ignore_eos=True)
        s.schedule()
        return s.num_cached_prefix_tokens(list(range(10)))

    assert (hit(0), hit(2)) == (6, 4)


def test_re_prefillable_tokens_beside_a_mamba_checkpoint_block_are_refused() -> None:
    # Served beside a Mamba align group (tests/test_integrations_vllm_mamba_mtp.py); beside
    # one with a prefill checkpoint block (vLLM keys it whatever the lag), refused.
    scheduler(
        (FullAttentionSpec(), MambaSpec(mamba_cache_mode="align")),
        num_prefill_lookahead=2,
        mamba_align_block_size=2,
    )
    checkpoint = MambaSpec(
        mamba_cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1
    )
    with pytest.raises(ConfigError) as err:
        scheduler(
            (FullAttentionSpec(), checkpoint), num_prefill_lookahead=2, mamba_align_block_size=2
        )
    assert err.value.field == "num_prefill_lookahead"
