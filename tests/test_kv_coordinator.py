"""tokenyard.kv.KvCoordinator: named behaviours with hand-checkable numbers, and a
hypothesis state machine driving it beside the pure-Python reference model
(kv_coordinator_reference.py, written from vLLM 0.33's coordinator) on random streams."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kv_coordinator_reference import NULL, Hit, RefCoordinator, Spec

from tokenyard.errors import ConfigError, InputError, TokenyardError, UnknownRequestError
from tokenyard.kv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KvCoordinator,
    MambaSpec,
    SlidingWindowSpec,
)


def tables(coord: KvCoordinator, rid: Any) -> list[list[int]]:
    return [t.tolist() for t in coord.block_ids(rid)]


def test_window_group_keeps_only_the_blocks_of_its_window() -> None:
    # Window 32, block 16: with 80 tokens computed, the next token attends to tokens
    # 49..80, so blocks 0-2 (tokens 0..48) are freed and the null block takes their place.
    coord = KvCoordinator(
        groups=[FullAttentionSpec(), SlidingWindowSpec(sliding_window=32)],
        num_blocks=16,
        block_size=16,
    )
    new = coord.allocate_slots("r", 80, token_ids=np.arange(80))
    assert new is not None
    assert [t.tolist() for t in new] == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    coord.allocate_slots("r", 1, token_ids=[80])
    assert tables(coord, "r") == [[1, 2, 3, 4, 5, 11], [0, 0, 0, 9, 10, 12]]
    # Freed last first; cached blocks go to the back of the free queue.
    assert coord.free_block_ids().tolist() == [13, 14, 15, 8, 7, 6]
    assert coord.num_free_blocks == 6
    assert coord.ref_count(6) == 0
    coord.check_invariants()


def test_prefix_hit_is_agreed_across_groups() -> None:
    coord = KvCoordinator(
        groups=[FullAttentionSpec(), SlidingWindowSpec(sliding_window=8)],
        num_blocks=9,
        block_size=4,
    )
    coord.allocate_slots(1, 12, token_ids=range(12))
    coord.allocate_slots(1, 1, token_ids=[100])
    coord.free(1)
    prompt = [*range(12), 200, 201, 202, 203]
    hit = coord.get_computed_blocks(prompt)
    # Full attention serves 3 blocks; the window (8 tokens, 2 blocks before the end) only
    # needs its last two, and its first one was freed: a null in its place.
    assert hit.num_computed_tokens == 12
    assert [t.tolist() for t in hit.block_ids] == [[1, 2, 3], [0, 5, 6]]
    new = coord.allocate_slots(2, 4, token_ids=prompt, new_computed_blocks=hit)
    assert new is not None
    assert [t.tolist() for t in new] == [[8], [7]]
    assert coord.stats().num_hit_tokens == 12
    coord.check_invariants()


def test_chunked_local_and_mamba_groups() -> None:
    coord = KvCoordinator(
        groups=[
            FullAttentionSpec(),
            ChunkedLocalAttentionSpec(attention_chunk_size=8),
            MambaSpec(),
        ],
        num_blocks=20,
        block_size=4,
        enable_caching=False,
    )
    coord.allocate_slots("r", 13, token_ids=range(13))
    coord.allocate_slots("r", 4, token_ids=range(13, 17))
    # 13 computed: token 13's chunk starts at 8, so the blocks of tokens 0..8 are freed
    # (uncached: to the front, reused at once); the Mamba state is one block throughout.
    assert tables(coord, "r") == [[1, 2, 3, 4, 6], [0, 0, 7, 8, 5], [9]]


def test_errors_are_typed_and_change_nothing() -> None:
    with pytest.raises(ConfigError, match="enable_caching"):
        KvCoordinator(groups=[MambaSpec()], num_blocks=8, block_size=4)
    with pytest.raises(ConfigError, match="groups"):
        KvCoordinator(groups=[], num_blocks=8, block_size=4)
    with pytest.raises(ConfigError, match="groups"):
        KvCoordinator(groups=["full"], num_blocks=8, block_size=4)  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="sliding_window"):
        SlidingWindowSpec(sliding_window=0)
    with pytest.raises(ConfigError, match="num_blocks"):
        KvCoordinator(groups=[FullAttentionSpec()], num_blocks=1, block_size=4)
    coord = KvCoordinator(groups=[FullAttentionSpec()], num_blocks=8, block_size=4)
    coord.allocate_slots("a", 9, token_ids=range(9))
    before = (tables(coord, "a"), coord.free_block_ids().tolist())
    hit = coord.get_computed_blocks(range(9))
    with pytest.raises(InputError, match="new_computed_blocks"):
        coord.allocate_slots("a", 1, new_computed_blocks=hit)
    with pytest.raises(InputError, match="new_computed_blocks"):
        coord.allocate_slots("b", 1, token_ids=range(5), new_computed_blocks=hit)
    with pytest.raises(InputError, match="num_new_tokens"):
        coord.allocate_slots("a", 0)
    with pytest.raises(UnknownRequestError):
        coord.free("zz")
    assert (tables(coord, "a"), coord.free_block_ids().tolist()) == before
    coord.check_invariants()


# --- the state machine -------------------------------------------------------------

SPECS = st.one_of(
    st.just(Spec("full")),
    st.builds(lambda w: Spec("window", w), st.integers(1, 14)),
    st.builds(lambda c: Spec("local", c), st.integers(1, 14)),
    st.just(Spec("align")),
)
PROMPTS = [list(range(100, 130)), list(range(100, 112)) + list(range(200, 218)), [7] * 26]
REQUEST_IDS = st.sampled_from([0, 1, 2, "a", "b"])
# none-mode Mamba: a block covering the request, or a slot per block (0 or 2 speculative).
NONE_MODE_MAMBA = [Spec("mamba"), Spec("mambablocks"), Spec("mambablocks", 2)]


def to_rust(spec: Spec) -> Any:
    if spec.kind == "full":
        return FullAttentionSpec()
    if spec.kind == "window":
        return SlidingWindowSpec(sliding_window=spec.size)
    if spec.kind == "local":
        return ChunkedLocalAttentionSpec(attention_chunk_size=spec.size)
    if spec.kind == "align":
        return MambaSpec(mamba_cache_mode="align")
    if spec.kind == "mambablocks":
        return MambaSpec(num_speculative_blocks=spec.size, block_covers_request=False)
    return MambaSpec()


def outcome(call: Any) -> Any:
    try:
        return call()
    except TokenyardError as err:
        return type(err)


def as_lists(result: Any) -> Any:
    if isinstance(result, tuple):
        return [t.tolist() for t in result]
    return result


class CoordinatorMachine(RuleBasedStateMachine):
    @rule(
        specs=st.lists(SPECS, min_size=1, max_size=3),
        mamba=st.sampled_from([None, *NONE_MODE_MAMBA]),
        caching=st.booleans(),
        block_size=st.integers(1, 5),
        num_blocks=st.integers(3, 40),
    )
    @precondition(lambda self: not hasattr(self, "rust"))
    def build(
        self, specs: list[Spec], mamba: Spec | None, caching: bool, block_size: int, num_blocks: int
    ) -> None:
        # A none-mode Mamba group is not prefix-cached (vLLM's MambaManager asserts it).
        if mamba is not None and not caching:
            specs = [*specs, mamba]
        self.rust = KvCoordinator(
            groups=[to_rust(s) for s in specs],
            num_blocks=num_blocks,
            block_size=block_size,
            enable_caching=caching,
        )
        self.ref = RefCoordinator(specs, num_blocks, block_size, caching)
        self.next_token = 1000
        # Per request: the end of its slots, for the live-block bound.
        self.slots_end: dict[Any, int] = {}
        self.last_added: dict[Any, int] = {}

    def built(self) -> bool:
        return hasattr(self, "rust")

    def lookup(self, prompt: list[int]) -> tuple[Any, Hit]:
        rust = self.rust.get_computed_blocks(prompt)
        ref = self.ref.get_computed_blocks(prompt)
        assert rust.num_computed_tokens == ref.num_tokens
        assert [t.tolist() for t in rust.block_ids] == ref.blocks
        # Agreed across groups: every group's table covers the same tokens.
        for t, size in zip(ref.blocks, self.ref.sizes, strict=True):
            assert len(t) == -(-ref.num_tokens // size)
        assert ref.num_tokens % self.ref.lcm == 0
        return rust, ref

    @rule(which=st.integers(0, 2), cut=st.integers(1, 30))
    @precondition(built)
    def lookup_only(self, which: int, cut: int) -> None:
        self.lookup(PROMPTS[which][:cut])

    @rule(
        rid=REQUEST_IDS, which=st.integers(0, 2), cut=st.integers(1, 30), chunk=st.integers(1, 30)
    )
    @precondition(built)
    def admit(self, rid: Any, which: int, cut: int, chunk: int) -> None:
        if rid in self.ref.requests:
            return
        prompt = PROMPTS[which][:cut]
        rust_hit, ref_hit = self.lookup(prompt)
        n = min(chunk, len(prompt) - ref_hit.num_tokens)
        rust = outcome(
            lambda: self.rust.allocate_slots(rid, n, token_ids=prompt, new_computed_blocks=rust_hit)
        )
        ref = outcome(lambda: self.ref.allocate_slots(rid, n, 0, prompt, ref_hit))
        assert as_lists(rust) == ref
        if ref is not None:
            self.slots_end[rid] = ref_hit.num_tokens + n
            self.last_added[rid] = n

    @rule(
        rid=REQUEST_IDS,
        n=st.integers(0, 10),
        lookahead=st.integers(0, 3),
        num_ids=st.integers(0, 10),
    )
    @precondition(built)
    def step(self, rid: Any, n: int, lookahead: int, num_ids: int) -> None:
        ids = list(range(self.next_token, self.next_token + num_ids))
        self.next_token += num_ids
        computed = self.ref.requests[rid].num_computed if rid in self.ref.requests else 0
        rust = outcome(lambda: self.rust.allocate_slots(rid, n, lookahead, token_ids=ids))
        ref = outcome(lambda: self.ref.allocate_slots(rid, n, lookahead, ids))
        assert as_lists(rust) == ref
        if isinstance(ref, list):
            end = max(self.slots_end.get(rid, 0), computed + n + lookahead)
            self.slots_end[rid] = end
            self.last_added[rid] = end - computed

    @rule(rid=REQUEST_IDS, num_ids=st.integers(0, 6))
    @precondition(built)
    def cache(self, rid: Any, num_ids: int) -> None:
        ids = list(range(self.next_token, self.next_token + num_ids))
        self.next_token += num_ids
        rust = outcome(lambda: self.rust.cache_blocks(rid, ids))
        ref = outcome(lambda: self.ref.cache_blocks(rid, ids))
        assert rust == ref

    @rule()
    @precondition(built)
    def new_step(self) -> None:
        self.rust.new_step_starts()
        self.ref.new_step_starts()

    @rule(rid=REQUEST_IDS)
    @precondition(built)
    def free(self, rid: Any) -> None:
        rust = outcome(lambda: self.rust.free(rid))
        ref = outcome(lambda: self.ref.free(rid))
        assert rust == ref
        self.slots_end.pop(rid, None)
        self.last_added.pop(rid, None)

    @invariant()
    def agree(self) -> None:
        if not self.built():
            return
        self.rust.check_invariants()
        assert self.rust.free_block_ids().tolist() == self.ref.free_queue
        assert len(self.rust) == len(self.ref.requests)
        held: list[set[int]] = [set() for _ in self.ref.specs]
        for rid, req in self.ref.requests.items():
            assert tables(self.rust, rid) == req.tables
            assert self.rust.num_computed_tokens(rid) == req.num_computed
            for g, (spec, table) in enumerate(zip(self.ref.specs, req.tables, strict=True)):
                live = [b for b in table if b != NULL]
                assert len(live) == len(set(live)), "a block held twice"
                held[g].update(live)
                bound = spec.max_live_blocks(self.last_added.get(rid, 0), self.ref.sizes[g])
                if bound is not None and rid in self.last_added:
                    assert len(live) <= bound, (spec, table, bound)
        # Blocks are conserved, and each belongs to one group.
        assert sum(len(h) for h in held) == len(set().union(*held))
        assert sum(len(h) for h in held) + self.rust.num_free_blocks == self.ref.num_blocks - 1


CoordinatorMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoordinatorMachine = CoordinatorMachine.TestCase


# Windows short beside the scheduler block size, so a window caches only the blocks a hit
# can reach (reachable_block_mask) in many examples.
MIXED_SPECS = st.one_of(
    st.just(Spec("full")),
    st.builds(lambda w: Spec("window", w), st.integers(1, 8)),
)


class MixedBlockSizesMachine(CoordinatorMachine):
    """The same rules over full-attention and window groups of different block sizes (vLLM's
    layouts for layer kinds of different page sizes), uncached a none-mode Mamba group with
    a slot per block of its own size, and a Mamba ``align`` group (on the hash block under
    prefix caching, where vLLM's partial hash hits stay off) or a chunked local group (on
    the lcm under prefix caching, vLLM's chunked manager asserting it): each group's block
    size a multiple (1, 2 or 4) of the hash block size."""

    @rule(
        specs=st.lists(MIXED_SPECS, min_size=1, max_size=3),
        scales=st.lists(st.sampled_from([1, 2, 4]), min_size=5, max_size=5),
        caching=st.booleans(),
        block_size=st.integers(1, 3),
        num_blocks=st.integers(3, 40),
        mamba=st.sampled_from([None, *NONE_MODE_MAMBA[1:]]),
        extra=st.sampled_from([None, Spec("align"), Spec("local", 5), Spec("local", 12)]),
    )
    @precondition(lambda self: not hasattr(self, "rust"))
    def build(  # type: ignore[override]
        self,
        specs: list[Spec],
        scales: list[int],
        caching: bool,
        block_size: int,
        num_blocks: int,
        mamba: Spec | None = None,
        extra: Spec | None = None,
    ) -> None:
        # A none-mode Mamba group with a slot per block of its own size, uncached.
        if mamba is not None and not caching:
            specs = [*specs, mamba]
        scales = scales[: len(specs) + (extra is not None)]
        if extra is not None:
            specs = [*specs, extra]
            if caching:
                # align: the hash block (a larger state turns partial hash hits on);
                # local: the lcm (every scale divides the largest of 1, 2 and 4).
                scales[-1] = 1 if extra.kind == "align" else max(scales)
        sizes = [scale * block_size for scale in scales]
        self.rust = KvCoordinator(
            groups=[to_rust(s) for s in specs],
            num_blocks=num_blocks,
            block_size=block_size,
            enable_caching=caching,
            group_block_sizes=sizes,
        )
        self.ref = RefCoordinator(specs, num_blocks, block_size, caching, sizes)
        assert self.rust.scheduler_block_size == self.ref.lcm
        self.next_token = 1000
        self.slots_end = {}
        self.last_added = {}


MixedBlockSizesMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMixedBlockSizesMachine = MixedBlockSizesMachine.TestCase


def test_group_block_sizes_are_checked() -> None:
    groups = [FullAttentionSpec(), SlidingWindowSpec(sliding_window=8)]
    coord = KvCoordinator(groups=groups, num_blocks=20, block_size=4, group_block_sizes=[8, 4])
    assert coord.group_block_sizes == (8, 4)
    assert coord.scheduler_block_size == 8
    with pytest.raises(ConfigError, match="group_block_sizes"):
        KvCoordinator(groups=groups, num_blocks=20, block_size=4, group_block_sizes=[8, 6])
    with pytest.raises(ConfigError, match="group_block_sizes"):
        KvCoordinator(groups=groups, num_blocks=20, block_size=4, group_block_sizes=[8])
    # A `none`-mode Mamba group holds one state block whatever its size, so it is served
    # beside differing sizes without prefix caching; with caching, or in align mode, not.
    mamba = [FullAttentionSpec(), MambaSpec()]
    KvCoordinator(
        groups=mamba, num_blocks=20, block_size=4, enable_caching=False, group_block_sizes=[8, 4]
    )
    with pytest.raises(ConfigError, match=r"groups\[1\]"):
        KvCoordinator(groups=mamba, num_blocks=20, block_size=4, group_block_sizes=[8, 4])
    # Mamba align: served without a prefill checkpoint block, on the hash block under
    # prefix caching; a larger state there is vLLM's partial hash hit (copy-on-write).
    align = [FullAttentionSpec(), MambaSpec(mamba_cache_mode="align")]
    KvCoordinator(groups=align, num_blocks=20, block_size=4, group_block_sizes=[8, 4])
    with pytest.raises(ConfigError, match=r"groups\[1\].*partial hash hit"):
        KvCoordinator(groups=align, num_blocks=20, block_size=4, group_block_sizes=[4, 8])
    checkpoint = MambaSpec(
        mamba_cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1
    )
    with pytest.raises(ConfigError, match=r"groups\[1\].*checkpoint"):
        KvCoordinator(
            groups=[FullAttentionSpec(), checkpoint],
            num_blocks=20,
            block_size=4,
            group_block_sizes=[8, 4],
        )
    # Chunked local attention under prefix caching: on the scheduler block size only.
    local = [FullAttentionSpec(), ChunkedLocalAttentionSpec(attention_chunk_size=16)]
    KvCoordinator(groups=local, num_blocks=20, block_size=4, group_block_sizes=[4, 8])
    with pytest.raises(ConfigError, match=r"groups\[1\].*scheduler block size"):
        KvCoordinator(groups=local, num_blocks=20, block_size=4, group_block_sizes=[8, 4])


class EagleMixedBlockSizesMachine(MixedBlockSizesMachine):
    """The mixed-size rules under EAGLE's trailing-block drop (vLLM's ``use_eagle`` over
    groups of different block sizes): each group's hit reads a block past the candidate
    and drops it, each caches a block past the lcm boundary, a window one block more, and
    full attention keys the block holding the prompt's last hash boundary, which is then
    freed as cached (the free queue is compared at every step)."""

    @rule(
        specs=st.lists(MIXED_SPECS, min_size=1, max_size=3),
        scales=st.lists(st.sampled_from([1, 2, 4]), min_size=3, max_size=3),
        block_size=st.integers(1, 3),
        num_blocks=st.integers(3, 40),
    )
    @precondition(lambda self: not hasattr(self, "rust"))
    def build(  # type: ignore[override]
        self, specs: list[Spec], scales: list[int], block_size: int, num_blocks: int
    ) -> None:
        sizes = [scale * block_size for scale in scales[: len(specs)]]
        self.rust = KvCoordinator(
            groups=[to_rust(s) for s in specs],
            num_blocks=num_blocks,
            block_size=block_size,
            group_block_sizes=sizes,
            eagle_block_drop=True,
        )
        assert self.rust.eagle_block_drop
        self.ref = RefCoordinator(specs, num_blocks, block_size, True, sizes, eagle_drop=True)
        self.next_token = 1000
        self.slots_end = {}
        self.last_added = {}

    @rule(
        rid=REQUEST_IDS,
        which=st.integers(0, 2),
        cut=st.integers(1, 30),
        chunk=st.integers(1, 30),
        prompt_len=st.one_of(st.none(), st.integers(1, 30)),
    )
    @precondition(lambda self: self.built())
    def admit_with_prompt_length(
        self, rid: Any, which: int, cut: int, chunk: int, prompt_len: int | None
    ) -> None:
        """A request whose prompt length is set (the step scheduler's), or not (the tokens
        known when first cached); a resumed one's is shorter than its known tokens."""
        if rid in self.ref.requests:
            return
        if prompt_len is not None:
            self.rust.set_num_prompt_tokens(rid, prompt_len)
            self.ref.set_num_prompt_tokens(rid, prompt_len)
        self.admit(rid, which, cut, chunk)


EagleMixedBlockSizesMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEagleMixedBlockSizesMachine = EagleMixedBlockSizesMachine.TestCase
