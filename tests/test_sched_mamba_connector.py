"""A Mamba ``align`` group beside full attention and a KV connector through the Python API
(vLLM 0.33's ``_get_local_prefix_cache_hit`` and its ``hit_diverged`` fallback): where an
admission resumes when the groups' own hits differ. Blocks of 16; a 64-token prefix seeded
a block per call outside the scheduler (``kv_allocate_outside``, as vLLM's tests drive its
``KVCacheManager``), some of its blocks evicted."""

from __future__ import annotations

from typing import Any

import pytest

from tokenyard.errors import ConfigError, InputError
from tokenyard.kv import FullAttentionSpec, MambaSpec, block_hashes
from tokenyard.sched import Scheduler, SchedulerConfig

BLOCK = 16


class StateConnector:
    """Offers ``offer`` tokens synchronously; ``divergent``: vLLM's
    ``supports_divergent_local_hybrid_hits``."""

    def __init__(self, offer: int, divergent: bool) -> None:
        self.offer = offer
        self.supports_divergent_local_hybrid_hits = divergent

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return self.offer, False

    def update_state_after_alloc(self, request: Any, block_ids: Any, n: int) -> None:
        pass

    def request_finished(self, request: Any, block_ids: Any) -> bool:
        return False


def tokens(num_blocks: int) -> list[int]:
    return list(range(num_blocks * BLOCK))


def seeded(offer: int, divergent: bool) -> tuple[Scheduler, list[int], list[int]]:
    config = SchedulerConfig(
        num_blocks=100,
        block_size=BLOCK,
        max_model_len=256,
        max_num_batched_tokens=256,
        enable_prefix_caching=True,
        kv_groups=(FullAttentionSpec(), MambaSpec(mamba_cache_mode="align")),
    )
    s = Scheduler(config, connector=StateConnector(offer, divergent))
    mamba = []
    for step in range(4):
        new = s.kv_allocate_outside("fill", tokens(4) if step == 0 else [], BLOCK)
        assert new is not None
        assert [len(g) for g in new] == [1, 1]
        mamba.append(int(new[1][0]))
        # vLLM's req_to_blocks holds it: the inspection calls list it.
        assert s.kv_request_ids() == ["fill"]
        assert s.kv_outside_tokens("fill") == (4 * BLOCK, (step + 1) * BLOCK)
    tables = s.kv_block_tables("fill")
    assert tables is not None
    fa = [int(b) for b in tables[0]]
    # The Mamba table: a slot per block, the last two states held, nulls before them.
    assert [int(b) for b in tables[1]] == [0, 0, mamba[2], mamba[3]]
    s.kv_free_outside("fill")
    return s, fa, mamba


def resume_at(s: Scheduler, num_blocks: int) -> int:
    s.add_request("replay", tokens(num_blocks), 1)
    (new,) = s.schedule().scheduled_new_reqs
    return new.num_computed_tokens


@pytest.mark.parametrize(("offer", "expected"), [(0, 16), (16, 32)])
def test_a_mamba_hit_deeper_than_full_attention_resumes_where_both_agree(
    offer: int, expected: int
) -> None:
    s, fa, mamba = seeded(offer, True)
    s.kv_evict_blocks([fa[2], fa[3], mamba[1], mamba[2]])
    _, hits = s.kv_hits_per_group(block_hashes(tokens(5), block_size=BLOCK), 79)
    assert hits == [32, 64]
    assert resume_at(s, 5) == expected


@pytest.mark.parametrize(
    ("divergent", "offer", "num_blocks", "expected"),
    [(True, 0, 5, 16), (True, 16, 6, 80), (False, 16, 6, 32)],
)
def test_a_deeper_full_attention_hit_is_kept_if_a_capable_connector_loads_past_it(
    divergent: bool, offer: int, num_blocks: int, expected: int
) -> None:
    s, _, mamba = seeded(offer, divergent)
    s.kv_evict_blocks(mamba[1:])
    _, hits = s.kv_hits_per_group(block_hashes(tokens(num_blocks), block_size=BLOCK), 79)
    assert hits == [64, 16]
    assert resume_at(s, num_blocks) == expected


def test_outside_requests_and_per_group_calls_are_checked() -> None:
    s, _, _ = seeded(0, True)
    s.add_request("held", tokens(2), 1)
    with pytest.raises(InputError, match="schedule"):
        s.kv_allocate_outside("held", [], 1)
    with pytest.raises(InputError):
        s.kv_free_outside("never")
    with pytest.raises(InputError, match="block_ids"):
        s.kv_evict_blocks([100])
    single = Scheduler(SchedulerConfig(num_blocks=8, block_size=BLOCK))
    with pytest.raises(ConfigError, match="kv_groups"):
        single.kv_evict_blocks([1])
    with pytest.raises(ConfigError, match="kv_groups"):
        single.kv_allocate_outside("x", tokens(1), 1)
