"""vLLM 0.33's prefix-cache rules for EAGLE/EAGLE3/MTP drafters through the public API:
hash look-ahead (``SchedulerConfig.num_hash_lookahead_tokens``), the trailing-block drop
(``eagle_block_drop``) and the re-prefillable lag (``num_prefill_lookahead``), with
hand-checkable numbers and the typed refusals (docs/integrations.md, "EAGLE/MTP prefix
caching")."""

from __future__ import annotations

import pytest

from tokenyard.errors import ConfigError, InputError
from tokenyard.kv import block_hashes
from tokenyard.sched import Scheduler, SchedulerConfig


def scheduler(**options: object) -> Scheduler:
    config = {
        "block_size": 2,
        "num_blocks": 64,
        "max_model_len": 64,
        "max_num_batched_tokens": 16,
        "enable_prefix_caching": True,
        **options,
    }
    return Scheduler(SchedulerConfig(**config))  # type: ignore[arg-type]


def test_a_lookahead_block_is_published_once_the_token_after_it_exists() -> None:
    # Block size 2, L = 1, prompt [0, 1, 2, 3]: after the first step a probe [0,1,2,3,5,7]
    # hits 2 tokens; after token 5 is sampled and the next step allocates, it hits 4;
    # [0,1,2,3,6,7] hits 2 (vLLM's test_scheduler_publishes_lookahead_blocks_at_allocation).
    s = scheduler(num_hash_lookahead_tokens=1)
    s.add_request("a", [0, 1, 2, 3], 3, ignore_eos=True)
    s.schedule()
    assert s.num_cached_prefix_tokens([0, 1, 2, 3, 5, 7]) == 2
    s.update_from_output({"a": [5]})
    assert s.num_cached_prefix_tokens([0, 1, 2, 3, 5, 7]) == 2
    s.schedule()
    assert s.num_cached_prefix_tokens([0, 1, 2, 3, 5, 7]) == 4
    assert s.num_cached_prefix_tokens([0, 1, 2, 3, 6, 7]) == 2


def test_without_lookahead_the_blocks_own_tokens_decide() -> None:
    s = scheduler()
    s.add_request("a", [0, 1, 2, 3], 3, ignore_eos=True)
    s.schedule()
    assert s.num_cached_prefix_tokens([0, 1, 2, 3, 6, 7]) == 4


def test_the_trailing_block_drop_recomputes_the_last_hit_block() -> None:
    s = scheduler(eagle_block_drop=True)
    s.add_request("a", list(range(8)), 1)
    s.schedule()
    s.update_from_output({"a": [9]})
    # Four blocks match [0..12); the last is dropped.
    assert s.num_cached_prefix_tokens(list(range(12))) == 6
    s.add_request("b", list(range(12)), 1)
    out = s.schedule()
    assert dict(out.num_scheduled_tokens) == {"b": 6}


def test_reprefillable_tokens_of_a_multi_module_mtp_drafter_stay_uncached() -> None:
    # num_prefill_lookahead = 3: vLLM's num_reprefillable_tokens = 2.
    s = scheduler(num_prefill_lookahead=3)
    s.add_request("a", list(range(8)), 4)
    s.schedule()
    assert s.num_cached_prefix_tokens(list(range(12))) == 6


def test_lookahead_hashes_are_tokenyards_block_hashes_with_the_tokens_after() -> None:
    with_next = block_hashes([0, 1, 2, 3, 5], block_size=2, num_hash_lookahead_tokens=1)
    other_next = block_hashes([0, 1, 2, 3, 6], block_size=2, num_hash_lookahead_tokens=1)
    assert len(with_next) == 2
    assert with_next[0] == other_next[0]
    assert with_next[1] != other_next[1]
    assert with_next[0] != block_hashes([0, 1], block_size=2)[0]
    with pytest.raises(InputError, match="num_hash_lookahead_tokens"):
        block_hashes([0, 1], block_size=2, num_hash_lookahead_tokens=-1)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"num_hash_lookahead_tokens": -1}, "num_hash_lookahead_tokens"),
        ({"num_hash_lookahead_tokens": 1, "enable_prefix_caching": False}, "num_hash_lookahead"),
        ({"num_hash_lookahead_tokens": 1, "prefix_cache": "radix"}, "num_hash_lookahead_tokens"),
        ({"eagle_block_drop": True, "enable_prefix_caching": False}, "eagle_block_drop"),
        ({"eagle_block_drop": True, "num_hash_lookahead_tokens": 1}, "eagle_block_drop"),
        ({"eagle_block_drop": True, "num_prefill_lookahead": 3}, "block_size"),
        ({"eagle_block_drop": 1}, "eagle_block_drop"),
    ],
)
def test_settings_that_cannot_apply_are_refused(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        scheduler(**options)


def test_the_lookahead_changes_only_while_no_request_holds_blocks() -> None:
    s = scheduler()
    s.num_hash_lookahead_tokens = 1
    assert s.num_hash_lookahead_tokens == 1
    s.add_request("a", [0, 1, 2, 3], 3, ignore_eos=True)
    s.schedule()
    with pytest.raises(ConfigError, match="num_hash_lookahead_tokens"):
        s.num_hash_lookahead_tokens = 2
    with pytest.raises(ConfigError, match="num_hash_lookahead_tokens"):
        s.num_hash_lookahead_tokens = -1
    assert s.num_hash_lookahead_tokens == 1
