"""Bad input raises a typed error naming the argument and value, and changes nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tokenyard.errors import (
    CapacityError,
    ConfigError,
    InputError,
    TokenyardError,
    UnknownRequestError,
)
from tokenyard.kv import BlockPool, CountingAllocator, RadixCache


@pytest.mark.parametrize(
    ("make", "field", "value"),
    [
        (lambda: CountingAllocator(num_blocks=0), "num_blocks", "0"),
        (lambda: CountingAllocator(num_blocks=-5), "num_blocks", "-5"),
        (
            lambda: CountingAllocator(num_blocks=10, watermark_fraction=1.5),
            "watermark_fraction",
            "1.5",
        ),
        (lambda: CountingAllocator(num_blocks=2**40), "num_blocks", str(2**40)),
        (lambda: BlockPool(num_blocks=0, block_size=16), "num_blocks", "0"),
        (lambda: BlockPool(num_blocks=16, block_size=-1), "block_size", "-1"),
        (lambda: BlockPool(num_blocks=16, block_size=1 << 20), "block_size", str(1 << 20)),
        (lambda: RadixCache(page_size=0), "page_size", "0"),
    ],
)
def test_bad_config_names_field_and_value(make: Any, field: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert (info.value.field, info.value.value) == (field, value)
    assert field in str(info.value)
    assert value in str(info.value)
    assert isinstance(info.value, ValueError)


def test_options_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        BlockPool(16, 4)  # type: ignore[misc]


def test_counting_allocator_errors_leave_it_unchanged() -> None:
    alloc = CountingAllocator(num_blocks=4)
    alloc.allocate("r1", 3)
    with pytest.raises(CapacityError, match="requested 2, available 1"):
        alloc.allocate("r2", 2)
    with pytest.raises(InputError, match="num_blocks=0"):
        alloc.allocate("r2", 0)
    with pytest.raises(UnknownRequestError, match="'nope'"):
        alloc.free("r1", "nope")
    with pytest.raises(InputError, match="repeated"):
        alloc.free("r1", "r1")
    with pytest.raises(InputError, match="request_id"):
        alloc.allocate(1.5, 1)  # type: ignore[arg-type]
    assert (alloc.num_blocks_of("r1"), alloc.num_allocated_blocks, len(alloc)) == (3, 3, 1)
    assert alloc.free("r1") == 3  # the double free is next
    with pytest.raises(UnknownRequestError):
        alloc.free("r1")
    alloc.check_invariants()


def block_pool_state(pool: BlockPool) -> tuple[Any, ...]:
    return (
        pool.free_block_ids().tolist(),
        pool.num_cached_blocks,
        len(pool),
        [pool.ref_count(b) for b in range(pool.num_blocks)],
    )


def test_block_pool_errors_leave_it_unchanged() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    pool.allocate_slots(1, 6, token_ids=range(6))
    before = block_pool_state(pool)
    bad_calls = [
        (lambda: pool.allocate_slots(1, 0), InputError, "num_new_tokens=0"),
        (
            lambda: pool.allocate_slots(1, 1, -1, token_ids=[1]),
            InputError,
            "num_lookahead_tokens=-1",
        ),
        (lambda: pool.allocate_slots(2, 1, token_ids=[-3]), InputError, "token_ids=-3"),
        (lambda: pool.allocate_slots(2, 1, token_ids=[2**32]), InputError, "token_ids"),
        (
            lambda: pool.allocate_slots(2, 1, token_ids=np.zeros((2, 2), np.int64)),
            InputError,
            "2 dims",
        ),
        (lambda: pool.allocate_slots(2, 1, token_ids=np.array([1.0])), InputError, "float64"),
        (lambda: pool.allocate_slots(2, 1, token_ids="abc"), InputError, "token_ids"),
        (lambda: pool.allocate_slots(1, 1, token_ids=[1], extra_key=3), InputError, "extra_key"),
        (lambda: pool.free(5), UnknownRequestError, "request_id=5"),
        (lambda: pool.block_ids("x"), UnknownRequestError, "'x'"),
        (lambda: pool.ref_count(99), InputError, "block_id=99"),
    ]
    for call, error, message in bad_calls:
        with pytest.raises(error, match=message):
            call()
        assert block_pool_state(pool) == before
    pool.check_invariants()


def test_a_lookup_is_only_valid_for_the_tokens_it_looked_up() -> None:
    pool = BlockPool(num_blocks=8, block_size=2)
    hit = pool.get_computed_blocks([1, 2, 3])
    with pytest.raises(InputError, match="lookup over 3 tokens"):
        pool.allocate_slots("r", 2, token_ids=[1, 2], new_computed_blocks=hit)
    pool.allocate_slots("r", 3, token_ids=[1, 2, 3], new_computed_blocks=hit)
    with pytest.raises(InputError, match="first allocation"):
        pool.allocate_slots("r", 1, token_ids=[4], new_computed_blocks=hit)
    assert pool.num_computed_tokens("r") == 3


def test_radix_cache_errors_leave_it_unchanged() -> None:
    cache = RadixCache(page_size=4)
    cache.insert(list(range(8)), list(range(8)))
    match = cache.match_prefix(list(range(8)))
    before = (cache.total_size, cache.num_nodes, cache.evictable_size)
    with pytest.raises(InputError, match="multiple of page_size=4"):
        cache.insert(list(range(6)), list(range(6)))
    with pytest.raises(InputError, match="one value per token"):
        cache.insert(list(range(8)), list(range(7)))
    with pytest.raises(InputError, match="not locked"):
        cache.unlock(match.handle)
    with pytest.raises(InputError, match="num_tokens=-1"):
        cache.evict(-1)
    assert (cache.total_size, cache.num_nodes, cache.evictable_size) == before
    cache.evict(8)
    with pytest.raises(InputError, match="stale"):
        cache.lock(match.handle)
    cache.check_invariants()


def test_every_error_is_a_tokenyard_error() -> None:
    for cls in (ConfigError, InputError, UnknownRequestError, CapacityError):
        assert issubclass(cls, TokenyardError)
    assert issubclass(UnknownRequestError, KeyError)
    # KeyError normally repr-quotes its message; ours reads like the others.
    assert str(UnknownRequestError("unknown request_id=3")) == "unknown request_id=3"
