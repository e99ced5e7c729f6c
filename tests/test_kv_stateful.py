"""Differential state machines: each Rust structure and its pure-Python reference model
(kv_reference.py) get the same random operation stream and must agree after every step."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule
from kv_reference import RefBlockPool, RefCountingAllocator, RefRadixCache

from tokenyard.errors import TokenyardError
from tokenyard.kv import BlockPool, CountingAllocator, RadixCache

SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
REQUEST_IDS = st.sampled_from([0, 1, 2, "a", "b"])


def both(rust_call: Any, ref_call: Any) -> Any:
    """Runs the same operation on both sides; they must raise the same error class or
    return equal results."""
    try:
        rust_result = rust_call()
    except TokenyardError as err:
        rust_result = type(err)
    try:
        ref_result = ref_call()
    except TokenyardError as err:
        ref_result = type(err)
    if isinstance(rust_result, type) or isinstance(ref_result, type):
        assert rust_result is ref_result, (rust_result, ref_result)
    return rust_result, ref_result


class CountingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rust = CountingAllocator(num_blocks=40, watermark_fraction=0.1)
        self.ref = RefCountingAllocator(40, 0.1)

    @rule(rid=REQUEST_IDS, n=st.integers(-1, 12))
    def allocate(self, rid: Any, n: int) -> None:
        both(lambda: self.rust.allocate(rid, n), lambda: self.ref.allocate(rid, n))

    @rule(rids=st.lists(REQUEST_IDS, max_size=3))
    def free(self, rids: list[Any]) -> None:
        rust, ref = both(lambda: self.rust.free(*rids), lambda: self.ref.free(*rids))
        assert rust == ref

    @rule(n=st.integers(0, 45))
    def ask(self, n: int) -> None:
        assert self.rust.can_allocate(n) == self.ref.can_allocate(n)
        assert self.rust.can_admit(n) == self.ref.can_admit(n)

    @invariant()
    def agree(self) -> None:
        self.rust.check_invariants()
        assert self.rust.num_allocated_blocks == self.ref.num_allocated_blocks
        for rid, n in self.ref.allocation.items():
            assert self.rust.num_blocks_of(rid) == n
        assert len(self.rust) == len(self.ref.allocation)


# Prompts share leading tokens so prefix hits, shared blocks and evictions all happen.
BASE_PROMPTS = [list(range(100, 124)), list(range(100, 112)) + list(range(200, 212)), [7] * 20]


class BlockPoolMachine(RuleBasedStateMachine):
    @rule(block_size=st.integers(1, 5), num_blocks=st.integers(4, 24), caching=st.booleans())
    @precondition(lambda self: not hasattr(self, "rust"))
    def build(self, block_size: int, num_blocks: int, caching: bool) -> None:
        self.rust = BlockPool(num_blocks=num_blocks, block_size=block_size, enable_caching=caching)
        self.ref = RefBlockPool(num_blocks, block_size, caching)
        self.next_token = 1000

    def _fresh_tokens(self, n: int) -> list[int]:
        self.next_token += n
        return list(range(self.next_token - n, self.next_token))

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(
        rid=REQUEST_IDS,
        prompt=st.sampled_from(BASE_PROMPTS),
        cut=st.integers(1, 24),
        suffix=st.integers(0, 6),
        chunk=st.integers(1, 30),
        use_hit=st.booleans(),
        extra_key=st.sampled_from([None, None, 5]),
    )
    def admit(
        self,
        rid: Any,
        prompt: list[int],
        cut: int,
        suffix: int,
        chunk: int,
        use_hit: bool,
        extra_key: int | None,
    ) -> None:
        tokens = prompt[:cut] + self._fresh_tokens(suffix)
        rust_hit = self.rust.get_computed_blocks(np.array(tokens), extra_key=extra_key)
        ref_hit = self.ref.get_computed_blocks(tokens, extra_key)
        assert rust_hit.block_ids.tolist() == ref_hit.block_ids
        assert rust_hit.num_computed_tokens == ref_hit.num_computed_tokens
        n = min(chunk, len(tokens) - ref_hit.num_computed_tokens) if use_hit else chunk
        rust, ref = both(
            lambda: self.rust.allocate_slots(
                rid,
                n,
                token_ids=tokens,
                new_computed_blocks=rust_hit if use_hit else None,
                extra_key=extra_key,
            ),
            lambda: self.ref.allocate_slots(
                rid, n, 0, tokens, ref_hit if use_hit else None, extra_key
            ),
        )
        if not isinstance(rust, type):
            assert (None if rust is None else rust.tolist()) == ref

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(
        rid=REQUEST_IDS,
        appended=st.integers(0, 4),
        n=st.integers(0, 5),
        lookahead=st.integers(0, 3),
    )
    def step(self, rid: Any, appended: int, n: int, lookahead: int) -> None:
        tokens = self._fresh_tokens(appended)
        rust, ref = both(
            lambda: self.rust.allocate_slots(rid, n, lookahead, token_ids=tokens),
            lambda: self.ref.allocate_slots(rid, n, lookahead, tokens),
        )
        if not isinstance(rust, type):
            assert (None if rust is None else rust.tolist()) == ref

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(rid=REQUEST_IDS)
    def free(self, rid: Any) -> None:
        both(lambda: self.rust.free(rid), lambda: self.ref.free(rid))

    @precondition(lambda self: hasattr(self, "rust"))
    @rule()
    def reset_prefix_cache(self) -> None:
        assert self.rust.reset_prefix_cache() == self.ref.reset_prefix_cache()

    @invariant()
    def agree(self) -> None:
        if not hasattr(self, "rust"):
            return
        self.rust.check_invariants()
        assert self.rust.free_block_ids().tolist() == list(self.ref.free_queue)
        assert self.rust.num_cached_blocks == self.ref.num_cached_blocks
        assert [self.rust.ref_count(b) for b in range(self.rust.num_blocks)] == self.ref.ref_cnt
        assert len(self.rust) == len(self.ref.requests)
        for rid, request in self.ref.requests.items():
            assert self.rust.block_ids(rid).tolist() == request.block_ids
            assert self.rust.num_computed_tokens(rid) == request.num_computed_tokens
        stats = self.rust.stats()
        assert [stats.num_lookups, stats.num_query_tokens, stats.num_hit_tokens] == self.ref.stats
        # Conservation: free (cached or not) + used = total.
        assert self.rust.num_free_blocks + self.rust.num_used_blocks == self.rust.num_blocks


PAGE_ALPHABET = st.integers(0, 2)


class RadixMachine(RuleBasedStateMachine):
    seen = Bundle("handles")

    @rule(page_size=st.integers(1, 3))
    @precondition(lambda self: not hasattr(self, "rust"))
    def build(self, page_size: int) -> None:
        self.rust = RadixCache(page_size=page_size)
        self.ref = RefRadixCache(page_size)
        self.next_value = 0
        self.locked: list[tuple[Any, Any, list[int]]] = []

    def _key(self, pages: list[int], extra: int) -> list[int]:
        # Pages drawn from a tiny alphabet share prefixes; `extra` makes unaligned lengths.
        ps = self.ref.page_size
        tokens = [p * 10 + i % 2 for p in pages for i in range(ps)]
        return tokens + list(range(extra))

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(pages=st.lists(PAGE_ALPHABET, max_size=6), extra=st.integers(0, 1))
    def insert(self, pages: list[int], extra: int) -> None:
        tokens = self._key(pages, extra if self.ref.page_size > 1 else 0)
        values = list(range(self.next_value, self.next_value + len(tokens)))
        self.next_value += len(tokens)
        rust, ref = both(
            lambda: self.rust.insert(np.array(tokens, dtype=np.int32), values),
            lambda: self.ref.insert(tokens, values),
        )
        assert rust == ref

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(
        target=seen,
        pages=st.lists(PAGE_ALPHABET, max_size=6),
        extra=st.integers(0, 2),
        lock=st.booleans(),
    )
    def match(self, pages: list[int], extra: int, lock: bool) -> tuple[Any, Any]:
        tokens = self._key(pages, extra)
        found = self.rust.match_prefix(tokens)
        matched, values, node = self.ref.match_prefix(tokens)
        assert (found.matched_len, found.values.tolist()) == (matched, values)
        if lock:
            self.rust.lock(found.handle)
            self.ref.lock(node)
            self.locked.append((found.handle, node, values))
        return found.handle, node

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(pair=seen)
    def relock(self, pair: tuple[Any, Any]) -> None:
        handle, node = pair
        rust, _ = both(lambda: self.rust.lock(handle), lambda: self.ref.lock(node))
        if not isinstance(rust, type):
            self.locked.append((handle, node, []))

    @precondition(lambda self: hasattr(self, "rust") and self.locked)
    @rule(i=st.integers(0, 10))
    def unlock(self, i: int) -> None:
        handle, node, _ = self.locked.pop(i % len(self.locked))
        self.rust.unlock(handle)
        self.ref.unlock(node)

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(n=st.integers(0, 12))
    def evict(self, n: int) -> None:
        freed = self.rust.evict(n).tolist()
        assert freed == self.ref.evict(n)
        in_use = {v for _, _, values in self.locked for v in values}
        assert not in_use.intersection(freed), "a locked prefix was evicted"

    @precondition(lambda self: hasattr(self, "rust"))
    @rule()
    def reset(self) -> None:
        self.rust.reset()
        self.ref.reset()
        self.locked.clear()

    @invariant()
    def agree(self) -> None:
        if not hasattr(self, "rust"):
            return
        self.rust.check_invariants()
        assert self.rust.evictable_size == self.ref.evictable_size
        assert self.rust.protected_size == self.ref.protected_size
        assert self.rust.total_size == self.rust.evictable_size + self.rust.protected_size
        assert self.rust.num_nodes == self.ref.num_nodes


TestCountingAllocator = CountingMachine.TestCase
TestCountingAllocator.settings = SETTINGS
TestBlockPool = BlockPoolMachine.TestCase
TestBlockPool.settings = SETTINGS
TestRadixCache = RadixMachine.TestCase
TestRadixCache.settings = SETTINGS
