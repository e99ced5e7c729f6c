"""The block pool's host-memory tier (docs/kv.md, "Host-memory tier"): behaviour tests
with hand-checkable numbers, typed errors, and a state machine driving the Rust pool and
the reference model (kv_reference.RefBlockPool) with the same operations."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kv_reference import RefBlockPool, RefHit
from test_kv_stateful import both

from tokenyard.errors import ConfigError, InputError, UnknownRequestError
from tokenyard.kv import BlockPool, block_hashes

PROMPT = list(range(9))


def prompt_evicted_to_host(host_num_blocks: int = 8) -> BlockPool:
    """Pool of 4 blocks of 4 tokens. Request "a" computes the 9-token PROMPT (blocks 0, 1
    full and cached) and is freed; request "b"'s 16 fresh tokens take all four blocks,
    evicting PROMPT's two hashes (block 1's, then block 0's) into the tier; "b" is freed,
    leaving its four cached blocks queued as [0, 1, 3, 2]."""
    pool = BlockPool(num_blocks=4, block_size=4, host_num_blocks=host_num_blocks)
    pool.allocate_slots("a", 9, token_ids=PROMPT)
    pool.free("a")
    pool.allocate_slots("b", 16, token_ids=range(100, 116))
    pool.free("b")
    assert pool.free_block_ids().tolist() == [0, 1, 3, 2]
    return pool


def test_evicted_prefix_blocks_are_offloaded_and_found_by_the_next_lookup() -> None:
    pool = prompt_evicted_to_host()
    h0, h1 = block_hashes(PROMPT, block_size=4)
    assert pool.host_block_hashes() == [h1, h0]
    assert (pool.num_host_blocks, pool.host_num_blocks) == (2, 8)
    hit = pool.get_computed_blocks(PROMPT)
    assert (hit.num_computed_tokens, hit.num_host_computed_tokens) == (0, 8)
    assert pool.host_block_hashes() == [h1, h0], "a lookup is not a use"
    stats = pool.stats()
    assert (stats.num_hit_tokens, stats.num_host_hit_tokens) == (0, 8)
    assert (stats.num_offloaded_blocks, stats.num_loaded_blocks) == (2, 0)
    assert "num_host_hit_tokens=8" in repr(stats)


def test_a_synchronous_load_takes_fresh_blocks_and_caches_them_at_once() -> None:
    pool = prompt_evicted_to_host()
    hit = pool.get_computed_blocks(PROMPT)
    # 8 loaded tokens + the last one computed: 3 blocks from the front of [0, 1, 3, 2].
    new = pool.allocate_slots("c", 1, token_ids=PROMPT, new_computed_blocks=hit)
    assert new is not None
    assert new.tolist() == [0, 1, 3]
    assert pool.num_computed_tokens("c") == 9
    again = pool.get_computed_blocks(PROMPT)
    assert again.block_ids.tolist() == [0, 1]
    assert again.num_host_computed_tokens == 0
    # The loads touched PROMPT's entries; then "b"'s three evicted hashes were offloaded.
    h0, h1 = block_hashes(PROMPT, block_size=4)
    g = block_hashes(range(100, 116), block_size=4)
    assert pool.host_block_hashes() == [h0, h1, g[3], g[2], g[1]]
    assert (pool.stats().num_loaded_blocks, pool.stats().num_offloaded_blocks) == (2, 5)
    pool.check_invariants()


def test_an_asynchronous_load_is_cached_only_once_it_lands() -> None:
    pool = prompt_evicted_to_host()
    hit = pool.get_computed_blocks(PROMPT)
    new = pool.allocate_slots_external("c", 0, token_ids=PROMPT, new_computed_blocks=hit)
    assert new is not None
    assert new.tolist() == [0, 1]
    assert pool.num_computed_tokens("c") == 8
    during = pool.get_computed_blocks(PROMPT)
    assert (during.num_computed_tokens, during.num_host_computed_tokens) == (0, 8)
    pool.cache_loaded_blocks("c")
    assert pool.get_computed_blocks(PROMPT).num_computed_tokens == 8
    assert pool.allocate_slots("c", 1) is not None
    assert pool.num_computed_tokens("c") == 9
    pool.check_invariants()


def test_a_load_that_does_not_fit_returns_none_and_changes_nothing() -> None:
    pool = prompt_evicted_to_host()
    pool.allocate_slots("hold", 8, token_ids=range(500, 508))  # 2 of the 4 blocks
    hit = pool.get_computed_blocks(PROMPT)
    assert hit.num_host_computed_tokens == 8
    before = pool.host_block_hashes()
    assert pool.allocate_slots("c", 1, token_ids=PROMPT, new_computed_blocks=hit) is None
    assert pool.host_block_hashes() == before
    assert pool.stats().num_loaded_blocks == 0
    assert "c" not in pool


def test_no_tier_by_default() -> None:
    pool = BlockPool(num_blocks=4, block_size=4)
    pool.allocate_slots("a", 9, token_ids=PROMPT)
    pool.free("a")
    pool.allocate_slots("b", 16, token_ids=range(100, 116))
    assert (pool.host_num_blocks, pool.num_host_blocks, pool.host_block_hashes()) == (0, 0, [])
    assert pool.get_computed_blocks(PROMPT).num_host_computed_tokens == 0
    assert pool.stats().num_offloaded_blocks == 0


def test_reset_prefix_cache_clears_the_tier() -> None:
    pool = prompt_evicted_to_host()
    assert pool.reset_prefix_cache()
    assert pool.num_host_blocks == 0
    assert pool.get_computed_blocks(PROMPT).num_host_computed_tokens == 0


@pytest.mark.parametrize(
    ("kwargs", "value"),
    [
        ({"host_num_blocks": 4, "enable_caching": False}, "4"),
        ({"host_num_blocks": -1}, "-1"),
        ({"host_num_blocks": True}, "True"),
        ({"host_num_blocks": 2.0}, "2.0"),
        ({"host_num_blocks": 2**31}, str(2**31)),
    ],
)
def test_bad_host_num_blocks_is_a_config_error(kwargs: dict[str, Any], value: str) -> None:
    with pytest.raises(ConfigError) as err:
        BlockPool(num_blocks=4, block_size=4, **kwargs)
    assert (err.value.field, err.value.value) == ("host_num_blocks", value)
    assert isinstance(err.value, ValueError)


def test_a_host_hit_evicted_since_the_lookup_is_stale() -> None:
    pool = prompt_evicted_to_host(host_num_blocks=2)
    hit = pool.get_computed_blocks(PROMPT)
    assert hit.num_host_computed_tokens == 8
    # Two more evictions push PROMPT's hashes out of the tier of 2.
    pool.allocate_slots("d", 8, token_ids=range(200, 208))
    for call in (
        lambda: pool.allocate_slots("c", 1, token_ids=PROMPT, new_computed_blocks=hit),
        lambda: pool.allocate_slots_external("c", 0, token_ids=PROMPT, new_computed_blocks=hit),
    ):
        with pytest.raises(InputError, match="stale") as err:
            call()
        assert err.value.field == "new_computed_blocks"
    assert "c" not in pool
    assert pool.stats().num_loaded_blocks == 0


def test_bad_external_loads_are_input_errors_and_change_nothing() -> None:
    pool = prompt_evicted_to_host()
    with pytest.raises(InputError) as err:
        pool.allocate_slots_external("c", -1, token_ids=PROMPT)
    assert (err.value.field, err.value.value) == ("num_external_tokens", "-1")
    with pytest.raises(InputError, match="at least 1"):
        pool.allocate_slots_external("c", 0, token_ids=PROMPT)  # nothing to load
    with pytest.raises(InputError) as err:
        pool.allocate_slots_external("c", 10, token_ids=PROMPT)
    assert err.value.field == "num_external_tokens"
    pool.allocate_slots("c", 1, token_ids=[1])
    with pytest.raises(InputError) as err:
        pool.allocate_slots_external("c", 1, token_ids=[2])
    assert err.value.field == "request_id"
    with pytest.raises(UnknownRequestError):
        pool.cache_loaded_blocks("nobody")
    with pytest.raises(InputError) as err:
        block_hashes(PROMPT, block_size=0)
    assert err.value.field == "block_size"
    assert pool.num_computed_tokens("c") == 1
    assert len(pool) == 1
    pool.check_invariants()


SETTINGS = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
REQUEST_IDS = st.sampled_from([0, 1, "a"])
# Shared leading tokens, so hits, evictions to the tier and loads back all happen.
BASE_PROMPTS = [list(range(100, 124)), list(range(100, 112)) + list(range(200, 212)), [7] * 20]


class HostTierMachine(RuleBasedStateMachine):
    @rule(block_size=st.integers(1, 3), num_blocks=st.integers(6, 12), host=st.integers(2, 8))
    @precondition(lambda self: not hasattr(self, "rust"))
    def build(self, block_size: int, num_blocks: int, host: int) -> None:
        self.rust = BlockPool(num_blocks=num_blocks, block_size=block_size, host_num_blocks=host)
        self.ref = RefBlockPool(num_blocks, block_size, True, host)
        self.next_token = 1000
        self.rust_hash: dict[int, int] = {}

    def _fresh_tokens(self, n: int) -> list[int]:
        self.next_token += n
        return list(range(self.next_token - n, self.next_token))

    def _finish(self, rid: Any) -> None:
        """Frees the request if it holds blocks: a new request arrives under its id. Keeps
        blocks cycling, so cached blocks are evicted to the tier and loaded back."""
        if rid in self.ref.requests:
            self.rust.free(rid)
            self.ref.free(rid)

    def _lookup(self, tokens: list[int], extra_key: int | None) -> tuple[Any, RefHit]:
        rust_hit = self.rust.get_computed_blocks(np.array(tokens), extra_key=extra_key)
        ref_hit = self.ref.get_computed_blocks(tokens, extra_key)
        assert rust_hit.block_ids.tolist() == ref_hit.block_ids
        assert rust_hit.num_computed_tokens == ref_hit.num_computed_tokens
        host_tokens = ref_hit.num_host_blocks * self.ref.block_size
        assert rust_hit.num_host_computed_tokens == host_tokens
        assert ref_hit.num_computed_tokens + host_tokens < len(tokens)
        return rust_hit, ref_hit

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(
        rid=REQUEST_IDS,
        prompt=st.sampled_from(BASE_PROMPTS),
        cut=st.integers(1, 12),
        suffix=st.integers(0, 2),
        chunk=st.integers(1, 6),
        extra_key=st.sampled_from([None, None, 5]),
        churn_between=st.sampled_from([0, 0, 0, 2, 6]),
    )
    def admit(
        self,
        rid: Any,
        prompt: list[int],
        cut: int,
        suffix: int,
        chunk: int,
        extra_key: int | None,
        churn_between: int,
    ) -> None:
        self._finish(rid)
        tokens = prompt[:cut] + self._fresh_tokens(suffix)
        rust_hit, ref_hit = self._lookup(tokens, extra_key)
        if churn_between:  # the hit may go stale, on the GPU or in the tier
            self.churn(churn_between)
        rust, ref = both(
            lambda: self.rust.allocate_slots(
                rid, chunk, token_ids=tokens, new_computed_blocks=rust_hit, extra_key=extra_key
            ),
            lambda: self.ref.allocate_slots(rid, chunk, 0, tokens, ref_hit, extra_key),
        )
        if not isinstance(rust, type):
            assert (None if rust is None else rust.tolist()) == ref

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(
        rid=REQUEST_IDS,
        prompt=st.sampled_from(BASE_PROMPTS),
        cut=st.integers(1, 12),
        num_external=st.integers(0, 3),
        use_hit=st.booleans(),
    )
    def load(self, rid: Any, prompt: list[int], cut: int, num_external: int, use_hit: bool) -> None:
        self._finish(rid)
        tokens = prompt[:cut]
        rust_hit, ref_hit = self._lookup(tokens, None)
        rust, ref = both(
            lambda: self.rust.allocate_slots_external(
                rid,
                num_external,
                token_ids=tokens,
                new_computed_blocks=rust_hit if use_hit else None,
            ),
            lambda: self.ref.allocate_slots_external(
                rid, num_external, tokens, ref_hit if use_hit else None
            ),
        )
        if not isinstance(rust, type):
            assert (None if rust is None else rust.tolist()) == ref

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(num_blocks=st.integers(1, 12))
    def churn(self, num_blocks: int) -> None:
        """Other traffic passes through: it takes free blocks from the front of the queue,
        evicting cached ones into the tier, and is freed. Always the same tokens, so its own
        hashes do not crowd the tier."""
        n = num_blocks * self.ref.block_size
        tokens = [9999] * n
        rust, ref = both(
            lambda: self.rust.allocate_slots("churn", n, token_ids=tokens),
            lambda: self.ref.allocate_slots("churn", n, 0, tokens),
        )
        assert (None if rust is None else rust.tolist()) == ref
        self._finish("churn")

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(rid=REQUEST_IDS, appended=st.integers(0, 4), n=st.integers(1, 5))
    def step(self, rid: Any, appended: int, n: int) -> None:
        tokens = self._fresh_tokens(appended)
        rust, ref = both(
            lambda: self.rust.allocate_slots(rid, n, token_ids=tokens),
            lambda: self.ref.allocate_slots(rid, n, 0, tokens),
        )
        if not isinstance(rust, type):
            assert (None if rust is None else rust.tolist()) == ref

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(rid=REQUEST_IDS)
    def cache_loaded_blocks(self, rid: Any) -> None:
        both(lambda: self.rust.cache_loaded_blocks(rid), lambda: self.ref.cache_loaded_blocks(rid))

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(rid=REQUEST_IDS)
    def free(self, rid: Any) -> None:
        both(lambda: self.rust.free(rid), lambda: self.ref.free(rid))

    @precondition(lambda self: hasattr(self, "rust"))
    @rule()
    def reset_prefix_cache(self) -> None:
        assert self.rust.reset_prefix_cache() == self.ref.reset_prefix_cache()

    def _rust_hash(self, ref_hash: int) -> int:
        if ref_hash not in self.rust_hash:
            tokens, extra_key = self.ref.prefix_of(ref_hash)
            bs = self.ref.block_size
            self.rust_hash[ref_hash] = block_hashes(tokens, block_size=bs, extra_key=extra_key)[-1]
        return self.rust_hash[ref_hash]

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
        assert self.rust.host_block_hashes() == [self._rust_hash(h) for h in self.ref.host]
        assert self.rust.num_host_blocks == len(self.ref.host) <= self.ref.host_num_blocks
        s = self.rust.stats()
        assert [s.num_lookups, s.num_query_tokens, s.num_hit_tokens] == self.ref.stats
        host_stats = [s.num_host_hit_tokens, s.num_offloaded_blocks, s.num_loaded_blocks]
        assert host_stats == self.ref.host_stats


TestHostTier = HostTierMachine.TestCase
TestHostTier.settings = SETTINGS
