"""The step scheduler over KV groups of different block sizes (``SchedulerConfig.
kv_group_block_sizes``: vLLM 0.33's layouts for a model whose layer kinds have different page
sizes, e.g. Gemma 4). Numbers checkable by hand: full attention in blocks of 8, a window of 8
in blocks of 4, requests hashed every 4 tokens; hits land on 8 (the lcm)."""

from __future__ import annotations

from typing import Any

import pytest

from tokenyard.errors import ConfigError
from tokenyard.kv import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from tokenyard.sched import Scheduler, SchedulerConfig


def config(**extra: Any) -> SchedulerConfig:
    options: dict[str, Any] = {
        "num_blocks": 64,
        "block_size": 4,
        "max_model_len": 64,
        "max_num_batched_tokens": 32,
        "enable_prefix_caching": True,
        "kv_groups": (FullAttentionSpec(), SlidingWindowSpec(sliding_window=8)),
        "kv_group_block_sizes": (8, 4),
        **extra,
    }
    return SchedulerConfig(**options)


def test_each_group_holds_blocks_of_its_size_and_hits_land_on_the_lcm() -> None:
    s = Scheduler(config())
    s.add_request(0, list(range(20)), max_tokens=1)
    (new,) = s.schedule().scheduled_new_reqs
    # 20 tokens: ceil(20 / 8) = 3 blocks of 8, ceil(20 / 4) = 5 of 4.
    assert [len(t) for t in new.group_block_ids] == [3, 5]
    s.update_from_output({0: [7]})
    # The same 20 tokens and more: 19 could hit in blocks of 4 (16), but hits land on 8.
    s.add_request(1, [*range(20), 99], max_tokens=1)
    (new,) = s.schedule().scheduled_new_reqs
    assert new.num_computed_tokens == 16
    # Equal sizes: the hit is the hash block's (16 as well here, from 4-token blocks).
    uniform = Scheduler(config(kv_group_block_sizes=()))
    uniform.add_request(0, list(range(14)), max_tokens=1)
    uniform.schedule()
    uniform.update_from_output({0: [7]})
    uniform.add_request(1, [*range(14), 99], max_tokens=1)
    (new,) = uniform.schedule().scheduled_new_reqs
    assert new.num_computed_tokens == 12
    mixed = Scheduler(config())
    mixed.add_request(0, list(range(14)), max_tokens=1)
    mixed.schedule()
    mixed.update_from_output({0: [7]})
    mixed.add_request(1, [*range(14), 99], max_tokens=1)
    (new,) = mixed.schedule().scheduled_new_reqs
    assert new.num_computed_tokens == 8


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"kv_group_block_sizes": (8,)}, "kv_group_block_sizes"),
        ({"kv_group_block_sizes": (8, 6)}, "kv_group_block_sizes"),
        ({"kv_groups": (), "kv_group_block_sizes": (8,)}, "kv_group_block_sizes"),
        # A Mamba align state larger than the hash block under prefix caching: vLLM's
        # partial hash hits (copy-on-write), not served.
        (
            {
                "kv_groups": (FullAttentionSpec(), MambaSpec(mamba_cache_mode="align")),
                "kv_group_block_sizes": (4, 8),
            },
            "group_block_sizes",
        ),
    ],
)
def test_what_differing_sizes_do_not_serve_is_refused(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        Scheduler(config(**extra))
    assert err.value.field == field


def test_a_mamba_align_group_on_the_hash_block_is_served() -> None:
    # Full attention in blocks of 8 beside Mamba align states every 4 tokens (since branch
    # mambadiff), a 14-token prompt prefilled 4 tokens a step: the states after 4 and 8 are
    # cached below the lcm; its extension hits 8 tokens (full attention's first block and the
    # Mamba state after 8).
    groups = (FullAttentionSpec(), MambaSpec(mamba_cache_mode="align"))
    s = Scheduler(config(kv_groups=groups, max_num_batched_tokens=4))
    s.add_request(0, list(range(14)), max_tokens=1)
    for step in range(4):  # 4 + 4 + 4 + 2 prompt tokens; the last chunk samples
        assert s.schedule().num_scheduled_tokens == {0: 4 if step < 3 else 2}
        s.update_from_output({0: [7]} if step == 3 else {})
    s.add_request(1, [*range(14), 99], max_tokens=1)
    (new,) = s.schedule().scheduled_new_reqs
    assert new.num_computed_tokens == 8


@pytest.mark.parametrize(("drop", "hit"), [(False, 24), (True, 16)])
def test_eagles_drop_beside_differing_sizes_is_served(drop: bool, hit: int) -> None:
    # A 30-token prompt caches 24 tokens below the lcm (3 blocks of 8). Its extension hits
    # them all without the drop; with it full attention reads its 3 blocks (the 28 hashed
    # tokens allow it), drops one (16) and the window agrees on 16 (kv/coordinator_sizes_tail).
    s = Scheduler(config(eagle_block_drop=drop))
    s.add_request(0, list(range(30)), max_tokens=1)
    s.schedule()
    s.update_from_output({0: [7]})
    s.add_request(1, [*range(30), 99], max_tokens=1)
    (new,) = s.schedule().scheduled_new_reqs
    assert new.num_computed_tokens == hit
    Scheduler(config(num_hash_lookahead_tokens=1))  # look-ahead hashes too


def test_a_speculative_step_of_any_length_is_served() -> None:
    # 1 + 3 drafts = 4 slots fit the hash block of 4, 1 + 4 and 1 + 20 do not: vLLM's
    # per-group step reserve counts each group on its own size (1 + 4 slots: ceil(5 / 8) +
    # ceil(5 / 4) = 3 blocks), and so does the core.
    for k in (3, 4, 20):
        Scheduler(config(num_speculative_tokens=k))


class Offer:
    """Offers ``offer`` tokens (asynchronously unless ``sync``); keeps the tables it is
    given."""

    def __init__(self, offer: int, *, sync: bool = False) -> None:
        self.offer, self.load_async = offer, not sync
        self.allocated: list[tuple[Any, int]] = []

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return self.offer, self.load_async

    def update_state_after_alloc(self, request: Any, block_ids: Any, n: int) -> None:
        self.allocated.append((block_ids, n))

    def request_finished(self, request: Any, block_ids: Any) -> bool:
        return False


def test_loaded_tokens_take_blocks_of_each_groups_size() -> None:
    # 12 of 20 tokens loaded (synchronously): full attention holds ceil(20 / 8) = 3 blocks
    # of 8; the window (8 tokens, blocks of 4) skips (12 + 1 - 8) // 4 = 1 block (a null)
    # and holds ceil(20 / 4) = 5 in all.
    connector = Offer(12, sync=True)
    s = Scheduler(config(), connector=connector)
    s.add_request(0, list(range(20)), max_tokens=2)
    out = s.schedule()
    assert out.num_scheduled_tokens == {0: 8}
    ((tables, n),) = connector.allocated
    assert n == 12
    assert [len(t) for t in tables] == [3, 5]
    assert int(tables[1][0]) == 0
    assert all(int(b) != 0 for b in tables[1][1:])


@pytest.mark.parametrize(("loaded", "hit"), [(16, 16), (19, 0)])
def test_a_landed_load_caches_up_to_the_lcm(loaded: int, hit: int) -> None:
    # 16 of 20 tokens loaded asynchronously: once landed, blocks cache up to 16 (the lcm
    # boundary below 20), and the same prompt hits 16. Loaded to 19, the window's (8) nulls
    # reach below 16: (19 + 1 - 8) // 4 = 3 blocks of 4, and the hit at 16 would need
    # tokens 9..16, so nothing hits (vLLM 0.33's likewise). The landed request is told of
    # its next allocation, with nothing to load.
    connector = Offer(loaded)
    s = Scheduler(config(), connector=connector)
    s.add_request(0, list(range(20)), max_tokens=1)
    s.schedule()
    s.finish_kv_transfers(finished_recving=[0])
    s.schedule()
    assert [n for _, n in connector.allocated] == [loaded, 0]
    connector.offer = 0
    s.add_request(1, [*range(20), 5], max_tokens=1)
    (new,) = s.schedule().scheduled_new_reqs
    assert new.num_computed_tokens == hit
