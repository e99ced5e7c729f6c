"""Named behaviours of the KV structures, with numbers that can be checked by hand."""

from __future__ import annotations

import numpy as np

from tokenyard.kv import BlockPool, CountingAllocator, RadixCache


def test_vidur_watermark_applies_to_admissions_not_growth() -> None:
    alloc = CountingAllocator(num_blocks=100, watermark_fraction=0.05)
    alloc.allocate(0, 90)
    assert alloc.watermark_blocks == 5
    assert alloc.can_admit(5)
    assert not alloc.can_admit(6)
    assert alloc.can_allocate(10)
    assert not alloc.can_allocate(11)


def test_ten_tokens_in_blocks_of_four_take_three_blocks_and_cache_two() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    blocks = pool.allocate_slots("r", 10, token_ids=np.arange(10))
    assert blocks is not None
    assert blocks.tolist() == [0, 1, 2]
    assert blocks.dtype == np.uint32
    assert pool.num_cached_blocks == 2
    assert pool.usage == 3 / 8


def test_a_fully_cached_prompt_still_recomputes_its_last_token() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    prompt = np.arange(8)
    pool.allocate_slots("first", 8, token_ids=prompt)
    pool.free("first")
    hit = pool.get_computed_blocks(prompt)
    # Both blocks are cached, but only the first is used: token 7 must produce logits.
    assert hit.num_computed_tokens == 4
    assert hit.block_ids.tolist() == [0]
    stats = pool.stats()
    assert (stats.num_query_tokens, stats.num_hit_tokens, stats.hit_rate) == (8, 4, 0.5)


def test_shared_prefix_blocks_are_shared_not_copied() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    system = list(range(8))
    pool.allocate_slots("a", 10, token_ids=[*system, 100, 101])
    hit = pool.get_computed_blocks([*system, 200, 201])
    assert hit.block_ids.tolist() == [0, 1]
    new = pool.allocate_slots("b", 2, token_ids=[*system, 200, 201], new_computed_blocks=hit)
    assert new is not None
    assert new.tolist() == [3]
    assert pool.block_ids("b").tolist() == [0, 1, 3]
    assert pool.ref_count(0) == 2
    assert pool.num_used_blocks == 4


def test_freed_requests_are_evicted_tail_first() -> None:
    pool = BlockPool(num_blocks=3, block_size=2)
    pool.allocate_slots("r", 6, token_ids=range(6))
    pool.free("r")
    assert pool.free_block_ids().tolist() == [2, 1, 0]
    assert pool.num_cached_free_blocks == 3


def test_uncached_blocks_are_reused_before_cached_ones() -> None:
    pool = BlockPool(num_blocks=4, block_size=2)
    pool.allocate_slots("r", 3, token_ids=range(3))  # block 0 cached, block 1 partial
    pool.free("r")
    assert pool.free_block_ids().tolist() == [1, 2, 3, 0]


def test_allocation_that_does_not_fit_returns_none() -> None:
    pool = BlockPool(num_blocks=2, block_size=4)
    assert pool.allocate_slots("r", 9, token_ids=range(9)) is None
    assert "r" not in pool
    assert pool.num_free_blocks == 2


def test_lookahead_slots_are_reserved_for_speculative_tokens() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    pool.allocate_slots("r", 4, token_ids=range(4))
    # 4 computed + 1 new + 4 lookahead = 9 slots = 3 blocks: 2 more.
    new = pool.allocate_slots("r", 1, 4, token_ids=[4])
    assert new is not None
    assert len(new) == 2


def test_radix_insert_returns_the_duplicate_prefix_length() -> None:
    cache = RadixCache()
    assert cache.insert([1, 2, 3, 4], np.array([10, 11, 12, 13])) == 0
    assert cache.insert([1, 2, 3, 9], np.array([20, 21, 22, 23])) == 3
    match = cache.match_prefix(np.array([1, 2, 3, 9, 7], dtype=np.uint32))
    assert match.matched_len == 4
    assert match.values.tolist() == [10, 11, 12, 23]
    assert cache.total_size == 5


def test_radix_locked_prefix_survives_eviction() -> None:
    cache = RadixCache(page_size=2)
    cache.insert([1, 2, 3, 4], [0, 1, 2, 3])
    cache.insert([5, 6], [4, 5])
    match = cache.match_prefix([1, 2, 3, 4, 9])
    assert match.matched_len == 4
    cache.lock(match.handle)
    assert (cache.protected_size, cache.evictable_size) == (4, 2)
    assert cache.evict(100).tolist() == [4, 5]
    cache.unlock(match.handle)
    assert cache.evict(100).tolist() == [0, 1, 2, 3]
    assert cache.total_size == 0


def test_radix_evicts_least_recently_used_first() -> None:
    cache = RadixCache()
    cache.insert([1], [1])
    cache.insert([2], [2])
    cache.insert([3], [3])
    cache.match_prefix([1])
    assert cache.evict(1).tolist() == [2]
    assert cache.evict(1).tolist() == [3]
    assert cache.evict(1).tolist() == [1]


def test_module_reports_version_and_build_profile() -> None:
    import tokenyard

    assert tokenyard.__version__ == "0.1.0"
    assert tokenyard.build_profile in {"debug", "release"}
