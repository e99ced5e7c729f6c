"""The block pool's references taken outside any request (vLLM 0.33's ``BlockPool.touch``
and ``free_blocks`` by block id, as a KV connector's scheduler side calls them) against the
pure-Python reference model: the operations of test_kv_stateful.py's block pool machine
plus touch and free_blocks, both sides agreeing after every step (free queue order, ref
counts, cached blocks, the prefix-cache reset refused while a reference is held)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from kv_reference import RefBlockPool
from test_kv_stateful import SETTINGS, BlockPoolMachine, both

from tokenyard.errors import InputError
from tokenyard.kv import BlockPool


class RefTouchPool(RefBlockPool):
    """``RefBlockPool`` with vLLM's ``touch`` and ``free_blocks`` (``v1/core/block_pool.py``)
    on references held outside any request."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loose: Counter[int] = Counter()

    def touch(self, block_ids: list[int]) -> None:
        if any(not 0 <= b < len(self.ref_cnt) for b in block_ids):
            raise InputError("block_ids")
        for b in block_ids:
            if self.ref_cnt[b] == 0:
                del self.free_queue[b]
            self.ref_cnt[b] += 1
            self.loose[b] += 1

    def free_blocks(self, block_ids: list[int]) -> None:
        if any(n > self.loose[b] for b, n in Counter(block_ids).items()):
            raise InputError("block_ids")
        evict_first = []
        for b in block_ids:
            self.loose[b] -= 1
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                if self.block_hash[b] is None:
                    evict_first.append(b)
                else:
                    self.free_queue[b] = None
        for b in reversed(evict_first):
            self.free_queue[b] = None
            self.free_queue.move_to_end(b, last=False)
        self.loose += Counter()  # drops the zero counts

    def reset_prefix_cache(self) -> bool:
        if self.loose:
            return False
        return super().reset_prefix_cache()


class TouchMachine(BlockPoolMachine):
    @rule(block_size=st.integers(1, 5), num_blocks=st.integers(4, 24), caching=st.booleans())
    @precondition(lambda self: not hasattr(self, "rust"))
    def build(self, block_size: int, num_blocks: int, caching: bool) -> None:
        self.rust = BlockPool(num_blocks=num_blocks, block_size=block_size, enable_caching=caching)
        self.ref = RefTouchPool(num_blocks, block_size, caching)
        self.next_token = 1000

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(picks=st.lists(st.integers(0, 25), max_size=4))
    def touch(self, picks: list[int]) -> None:
        both(lambda: self.rust.touch(picks), lambda: self.ref.touch(picks))

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(picks=st.lists(st.integers(0, 25), max_size=4), held=st.booleans())
    def free_blocks(self, picks: list[int], held: bool) -> None:
        if held:  # mostly blocks holding a reference, in a random order
            pool = sorted(self.ref.loose.elements())
            picks = [pool[i % len(pool)] for i in picks] if pool else []
        both(lambda: self.rust.free_blocks(picks), lambda: self.ref.free_blocks(picks))


TestTouch = TouchMachine.TestCase
TestTouch.settings = SETTINGS


def test_a_touched_block_outlives_its_request_at_the_back_of_the_queue() -> None:
    pool = BlockPool(num_blocks=4, block_size=4, enable_caching=True)
    prompt = list(range(9))
    assert pool.allocate_slots(1, 9, token_ids=prompt).tolist() == [0, 1, 2]
    pool.touch([0, 1])
    pool.free(1)
    assert pool.free_block_ids().tolist() == [2, 3]
    assert [pool.ref_count(b) for b in range(4)] == [1, 1, 0, 0]
    assert not pool.reset_prefix_cache()
    pool.free_blocks([0, 1])
    assert pool.free_block_ids().tolist() == [2, 3, 0, 1]
    assert pool.get_computed_blocks(prompt).block_ids.tolist() == [0, 1]
    with pytest.raises(InputError, match="block_ids"):
        pool.free_blocks([0])
    pool.check_invariants()
