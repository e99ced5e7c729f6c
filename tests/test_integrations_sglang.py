"""tokenyard.integrations.sglang: SGLang 0.5.23's RadixCache interface over tokenyard's tree.

Named behaviours with hand-checkable numbers, typed refusals, tensors when torch is there,
and a state machine against the pure-Python reference (kv_reference.RefRadixCache), which
itself agrees with SGLang's real RadixCache on random streams (benches/peers/). SGLang is
never imported: its parameter objects are imitated by duck-typed stand-ins.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kv_reference import RefRadixCache

from tokenyard.errors import ConfigError, InputError
from tokenyard.integrations.sglang import (
    EvictParams,
    InsertParams,
    MatchPrefixParams,
    RadixKey,
    SGLangRadixCache,
    TreeLock,
)


class RecordingAllocator:
    """SGLang's ``token_to_kv_pool_allocator`` as far as the cache uses it: ``free``."""

    def __init__(self) -> None:
        self.freed: list[int] = []
        self.calls = 0

    def free(self, free_index: Any) -> None:
        self.calls += 1
        self.freed += [int(i) for i in free_index]


@dataclass
class SGLangStyleKey:
    """What SGLang's own ``RadixKey`` looks like to the adapter (it is read by attribute)."""

    token_ids: array[int]
    extra_key: str | None = None
    cache_salt: str | None = None
    is_bigram: bool = False
    limit: int | None = None


def key(*tokens: int) -> RadixKey:
    return RadixKey(array("q", tokens))


def insert(cache: SGLangRadixCache, tokens: list[int], values: list[int]) -> int:
    return cache.insert(
        InsertParams(key=key(*tokens), value=np.array(values, dtype=np.int64))
    ).prefix_len


def sizes(cache: SGLangRadixCache) -> tuple[int, int, int]:
    return cache.evictable_size(), cache.protected_size(), cache.total_size()


# --- behaviour ---------------------------------------------------------------------------


def test_insert_reports_the_cached_prefix_and_match_returns_its_indices() -> None:
    cache = SGLangRadixCache.create_simulated(page_size=1)
    assert insert(cache, [1, 2, 3], [10, 11, 12]) == 0
    assert insert(cache, [1, 2, 4], [20, 21, 22]) == 2  # 20 and 21 are duplicates to free
    hit = cache.match_prefix(MatchPrefixParams(key=key(1, 2, 4, 9)))
    assert hit.device_prefix_len == 3
    assert hit.device_indices.tolist() == [10, 11, 22]
    assert hit.last_device_node == hit.last_host_node == hit.best_match_node
    assert hit.host_hit_length == 0
    assert sizes(cache) == (4, 0, 4)


def test_a_miss_returns_the_root_and_locking_it_changes_nothing() -> None:
    cache = SGLangRadixCache.create_simulated()
    insert(cache, [1, 2], [0, 1])
    miss = cache.match_prefix(MatchPrefixParams(key=key(7, 8)))
    assert miss.device_prefix_len == 0
    assert miss.device_indices.tolist() == []
    assert miss.last_device_node == cache.root_node
    assert cache.inc_lock_ref(miss.last_device_node).delta == 0
    assert sizes(cache) == (2, 0, 2)


def test_keys_are_cut_to_whole_pages_as_in_sglang() -> None:
    cache = SGLangRadixCache.create_simulated(page_size=2)
    # Five tokens store two pages; the fifth token and its value are dropped, not refused.
    assert insert(cache, [1, 1, 2, 2, 3], [0, 1, 2, 3, 4]) == 0
    assert sizes(cache) == (4, 0, 4)
    hit = cache.match_prefix(key(1, 1, 2, 2, 3))
    assert (hit.device_prefix_len, hit.device_indices.tolist()) == (4, [0, 1, 2, 3])
    # Diverging inside the second page matches the first page only.
    assert cache.match_prefix(key(1, 1, 2, 9)).device_prefix_len == 2


def test_an_insert_without_values_stores_the_token_ids() -> None:
    cache = SGLangRadixCache.create_simulated()
    assert cache.insert(InsertParams(key=key(5, 6, 7))).prefix_len == 0
    assert cache.match_prefix(key(5, 6, 7)).device_indices.tolist() == [5, 6, 7]


def test_sglang_shaped_objects_are_read_by_attribute() -> None:
    cache = SGLangRadixCache.create_simulated()
    sglang_key = SGLangStyleKey(array("q", [1, 2, 3, 4]), limit=3)
    cache.insert(InsertParams(key=sglang_key, value=np.array([7, 8, 9, 10])))
    assert sizes(cache) == (3, 0, 3), "limit=3 keeps the first three tokens"
    # A bare key or a bare token list works where a params object is expected.
    assert cache.match_prefix(SGLangStyleKey(array("q", [1, 2]))).device_prefix_len == 2
    assert cache.match_prefix([1, 2, 3]).device_indices.tolist() == [7, 8, 9]


def test_lock_deltas_are_the_change_in_evictable_tokens() -> None:
    cache = SGLangRadixCache.create_simulated()
    insert(cache, [1, 2, 3], [0, 1, 2])
    insert(cache, [1, 2, 4, 5], [0, 1, 3, 4])  # tree: [1 2] -> [3], [4 5]
    long = cache.match_prefix(key(1, 2, 4, 5)).last_device_node
    short = cache.match_prefix(key(1, 2, 3)).last_device_node
    assert cache.inc_lock_ref(long).delta == -4  # [1 2] and [4 5] become protected
    assert cache.inc_lock_ref(short).delta == -1  # only [3]: [1 2] already is
    assert sizes(cache) == (0, 5, 5)
    assert cache.dec_lock_ref(long).delta == 2  # [4 5]; [1 2] is still held by `short`
    assert cache.dec_lock_ref(short).delta == 3
    assert sizes(cache) == (5, 0, 5)


def test_lock_and_unlock_wrap_the_lock_counts() -> None:
    cache = SGLangRadixCache.create_simulated()
    insert(cache, [1, 2], [0, 1])
    held = cache.lock(cache.match_prefix(key(1, 2)).last_device_node)
    assert isinstance(held, TreeLock)
    assert cache.protected_size() == 2
    cache.unlock(held)
    cache.unlock(None)  # SGLang's no-op for a request that holds no lock
    assert sizes(cache) == (2, 0, 2)


def test_evict_frees_whole_lru_leaves_through_the_allocator() -> None:
    allocator = RecordingAllocator()
    cache = SGLangRadixCache.create_simulated(mock_allocator=allocator)
    insert(cache, [1, 2, 3], [0, 1, 2])
    insert(cache, [1, 2, 4], [0, 1, 12])
    insert(cache, [5], [20])
    cache.match_prefix(key(1, 2, 3))  # [3] becomes the most recently used leaf
    result = cache.evict(EvictParams(num_tokens=1))
    assert result.num_tokens_evicted == 1
    assert allocator.freed == [12]
    assert result.evicted_indices.tolist() == [12]
    # Two more tokens: [5], then [3]; asking for 2 still frees whole leaves, in LRU order.
    assert cache.evict(2).num_tokens_evicted == 2
    assert allocator.freed == [12, 20, 2]
    assert allocator.calls == 2
    assert cache.evict(EvictParams(num_tokens=0)).num_tokens_evicted == 0
    assert cache.evict(-3).num_tokens_evicted == 0, "SGLang's loop does not run below one"
    assert allocator.calls == 2, "nothing freed, nothing passed to the allocator"
    assert sizes(cache) == (2, 0, 2)


def test_locked_prefixes_are_not_evicted() -> None:
    cache = SGLangRadixCache.create_simulated()
    insert(cache, [1, 2, 3], [0, 1, 2])
    insert(cache, [1, 9], [0, 6])
    node = cache.match_prefix(key(1, 2, 3)).last_device_node
    cache.inc_lock_ref(node)
    evicted = cache.evict(100)
    assert evicted.evicted_indices.tolist() == [6]
    assert sizes(cache) == (0, 3, 3)


def test_reset_drops_everything_and_stales_nodes() -> None:
    cache = SGLangRadixCache.create_simulated()
    insert(cache, [1, 2], [0, 1])
    node = cache.match_prefix(key(1, 2)).last_device_node
    cache.inc_lock_ref(node)
    cache.reset()
    assert sizes(cache) == (0, 0, 0)
    with pytest.raises(InputError) as err:
        cache.dec_lock_ref(node)
    assert err.value.field == "handle"


def test_unlocking_an_unlocked_node_is_refused_where_sglang_goes_negative() -> None:
    cache = SGLangRadixCache.create_simulated()
    insert(cache, [1, 2], [0, 1])
    node = cache.match_prefix(key(1, 2)).last_device_node
    with pytest.raises(InputError):
        cache.dec_lock_ref(node)
    assert sizes(cache) == (2, 0, 2), "a refused call changes nothing"


@pytest.mark.parametrize(
    ("bad_key", "field"),
    [
        (SGLangStyleKey(array("q", [1]), extra_key="lora-1"), "key.extra_key"),
        (SGLangStyleKey(array("q", [1]), cache_salt="salt"), "key.cache_salt"),
        (SGLangStyleKey(array("q", [1, 2]), is_bigram=True), "key.is_bigram"),
    ],
)
def test_unsupported_key_fields_are_refused_by_name(bad_key: SGLangStyleKey, field: str) -> None:
    cache = SGLangRadixCache.create_simulated()
    for call in (
        lambda: cache.match_prefix(MatchPrefixParams(key=bad_key)),
        lambda: cache.insert(InsertParams(key=bad_key, value=np.array([0, 1]))),
    ):
        with pytest.raises(InputError) as err:
            call()
        assert err.value.field == field
        assert field.split(".")[1] in str(err.value)
    assert sizes(cache) == (0, 0, 0)


def test_bad_arguments_raise_typed_errors_naming_the_field() -> None:
    cache = SGLangRadixCache.create_simulated()
    with pytest.raises(InputError) as err:
        cache.insert(InsertParams(value=np.array([1])))
    assert err.value.field == "key"
    with pytest.raises(InputError) as err:
        cache.insert(InsertParams(key=key(1, 2, 3), value=np.array([1, 2])))
    assert err.value.field == "values"
    with pytest.raises(ConfigError) as cfg:
        SGLangRadixCache.create_simulated(disable=True)
    assert cfg.value.field == "disable"
    with pytest.raises(ConfigError) as cfg:
        SGLangRadixCache(page_size=0)
    assert cfg.value.field == "page_size"
    assert sizes(cache) == (0, 0, 0)


def test_tensors_in_and_out_with_a_device() -> None:
    torch = pytest.importorskip("torch")
    allocator = RecordingAllocator()
    cache = SGLangRadixCache(page_size=1, token_to_kv_pool_allocator=allocator, device="cpu")
    tokens = torch.tensor([1, 2, 3])
    cache.insert(InsertParams(key=RadixKey(tokens), value=torch.tensor([10, 11, 12])))
    hit = cache.match_prefix(RadixKey(tokens))
    assert isinstance(hit.device_indices, torch.Tensor)
    assert hit.device_indices.dtype == torch.int64
    assert hit.device_indices.tolist() == [10, 11, 12]
    evicted = cache.evict(3).evicted_indices
    assert isinstance(evicted, torch.Tensor)
    assert allocator.freed == [10, 11, 12]
    with pytest.raises(ConfigError) as err:
        SGLangRadixCache(device="no-such-device")
    assert err.value.field == "device"


def test_a_match_inside_an_edge_refreshes_the_remainder_as_sglang_does() -> None:
    cache = SGLangRadixCache.create_simulated()
    insert(cache, [1, 2, 3], [0, 1, 2])
    insert(cache, [9], [9])
    cache.match_prefix(key(1, 2))  # ends inside [1 2 3]; SGLang refreshes it, then splits
    insert(cache, [5], [5])
    # [9] < remainder [3] < its new parent [1 2] < [5]
    evicted = cache.evict(5).evicted_indices
    assert evicted.tolist() == [9, 2, 0, 1, 5]


@pytest.mark.parametrize("refresh_before_split", [True, False])
def test_the_reference_models_both_orders(refresh_before_split: bool) -> None:
    ref = RefRadixCache(1, refresh_before_split=refresh_before_split)
    ref.insert([1, 2, 3], [0, 1, 2])
    ref.insert([9], [9])
    ref.match_prefix([1, 2])
    ref.insert([5], [5])
    expected = [9, 2, 0, 1, 5] if refresh_before_split else [2, 9, 0, 1, 5]
    assert ref.evict(5) == expected


# --- against the reference ---------------------------------------------------------------

SETTINGS = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class AdapterMachine(RuleBasedStateMachine):
    """The adapter and RefRadixCache get the same SGLang-shaped calls; results, lock deltas,
    sizes and the allocator's frees (eviction order included) must agree at every step."""

    @precondition(lambda self: not hasattr(self, "cache"))
    @rule(page_size=st.sampled_from([1, 2, 4]))
    def build(self, page_size: int) -> None:
        self.allocator = RecordingAllocator()
        self.cache = SGLangRadixCache.create_simulated(
            mock_allocator=self.allocator, page_size=page_size
        )
        self.ref = RefRadixCache(page_size)
        self.next_value = 0
        self.locked: list[tuple[Any, Any]] = []

    def _tokens(self, pages: list[int], extra: int) -> list[int]:
        # A tiny page alphabet so keys share prefixes and edges split; `extra` leaves a
        # partial page, which SGLang cuts off.
        ps = self.ref.page_size
        return [p * 10 + i % 2 for p in pages for i in range(ps)] + list(range(extra))

    @precondition(lambda self: hasattr(self, "cache"))
    @rule(pages=st.lists(st.integers(0, 2), max_size=6), extra=st.integers(0, 3))
    def insert(self, pages: list[int], extra: int) -> None:
        tokens = self._tokens(pages, extra)
        values = list(range(self.next_value, self.next_value + len(tokens)))
        self.next_value += len(tokens)
        aligned = len(tokens) // self.ref.page_size * self.ref.page_size
        got = self.cache.insert(
            InsertParams(key=key(*tokens), value=np.array(values, dtype=np.int64))
        )
        assert got.prefix_len == self.ref.insert(tokens[:aligned], values[:aligned])

    @precondition(lambda self: hasattr(self, "cache"))
    @rule(
        pages=st.lists(st.integers(0, 2), max_size=6), extra=st.integers(0, 3), lock=st.booleans()
    )
    def match(self, pages: list[int], extra: int, lock: bool) -> None:
        tokens = self._tokens(pages, extra)
        got = self.cache.match_prefix(MatchPrefixParams(key=key(*tokens)))
        matched, values, node = self.ref.match_prefix(tokens)
        assert (got.device_prefix_len, got.device_indices.tolist()) == (matched, values)
        if lock:
            assert self.cache.inc_lock_ref(got.last_device_node).delta == self.ref.lock(node)
            self.locked.append((got.last_device_node, node))

    @precondition(lambda self: hasattr(self, "cache") and self.locked)
    @rule(i=st.integers(0, 10))
    def unlock(self, i: int) -> None:
        handle, node = self.locked.pop(i % len(self.locked))
        assert self.cache.dec_lock_ref(handle).delta == self.ref.unlock(node)

    @precondition(lambda self: hasattr(self, "cache"))
    @rule(num_tokens=st.integers(0, 12))
    def evict(self, num_tokens: int) -> None:
        self.allocator.freed.clear()
        got = self.cache.evict(EvictParams(num_tokens=num_tokens))
        expected = self.ref.evict(num_tokens)
        assert self.allocator.freed == expected
        assert got.num_tokens_evicted == len(expected)

    @precondition(lambda self: hasattr(self, "cache"))
    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.ref.reset()
        self.locked.clear()

    @invariant()
    def agree(self) -> None:
        if hasattr(self, "cache"):
            ref_sizes = (self.ref.evictable_size, self.ref.protected_size)
            assert sizes(self.cache) == (*ref_sizes, sum(ref_sizes))


TestAdapterAgainstReference = AdapterMachine.TestCase
TestAdapterAgainstReference.settings = SETTINGS
