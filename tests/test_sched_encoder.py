"""Multimodal items in the step scheduler (vLLM 0.33's encoder budget and encoder cache):
behaviours with hand-checkable numbers through ``tokenyard.sched.Scheduler``, and a state
machine checking ``tokenyard.sched.EncoderCache`` against the reference model
(encoder_reference.py) call by call."""

from __future__ import annotations

from typing import Any

import pytest
from encoder_reference import RefEncoderCache
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tokenyard.errors import ConfigError, InputError
from tokenyard.sched import EncoderCache, MmFeature, Scheduler, SchedulerConfig


def scheduler(budget: int, cache: int, **kw: Any) -> Scheduler:
    fields: dict[str, Any] = dict(
        max_num_batched_tokens=2048,
        num_blocks=1024,
        max_model_len=4096,
        enable_prefix_caching=False,
        max_num_encoder_input_tokens=budget,
        encoder_cache_size=cache,
    )
    fields.update(kw)
    return Scheduler(SchedulerConfig(**fields))


def prompt(rid: int, n: int) -> list[int]:
    return [rid * 10_000 + i for i in range(n)]


def step(s: Scheduler) -> Any:
    """One step with a fake model: token 7 for each request that caught up."""
    out = s.schedule()
    sampled = {
        rid: [7]
        for rid in out.num_scheduled_tokens
        if s.num_computed_tokens(rid) >= s.num_tokens(rid)
    }
    s.update_from_output(sampled)
    s.check_invariants()
    return out


def test_an_image_past_the_encoder_budget_left_schedules_only_the_text_before_it() -> None:
    # Budget 600: request 0's 100-token image leaves 500 < request 1's 576-token image at
    # offset 10, so request 1 computes its 10 text tokens only; the image comes next step.
    s = scheduler(600, 4096)
    s.add_request(0, prompt(0, 110), 2, mm_features=[MmFeature(0, 100, "a")])
    s.add_request(1, prompt(1, 600), 2, mm_features=[MmFeature(10, 576, "b")])
    out = step(s)
    assert out.num_scheduled_tokens == {0: 110, 1: 10}
    assert out.scheduled_encoder_inputs == {0: [0]}
    out = step(s)
    assert out.num_scheduled_tokens == {0: 1, 1: 590}
    assert out.scheduled_encoder_inputs == {1: [0]}


def test_two_requests_with_the_same_image_hash_share_one_encoder_output() -> None:
    s = scheduler(1000, 1000)
    s.add_request("a", prompt(0, 600), 2, mm_features=[(10, 576, "cat")])
    s.add_request("b", prompt(1, 600), 2, mm_features=[(20, 576, "cat")])
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 600, "b": 600}
    assert out.scheduled_encoder_inputs == {"a": [0]}  # encoded once
    assert s.encoder_cache_refs("cat") == 2
    assert s.encoder_cache_usage() == (424, 424, 1000)
    s.update_from_output({"a": [7], "b": [7]})
    # Both passed it: unreferenced, still cached (freeable).
    assert s.encoder_cache_refs("cat") == 0
    assert s.encoder_cache_usage() == (424, 1000, 1000)


def test_a_full_cache_waits_for_a_freeable_entry_and_reports_its_eviction() -> None:
    s = scheduler(600, 600, max_num_batched_tokens=300)
    s.add_request(0, prompt(0, 590), 2, mm_features=[MmFeature(0, 576, "big")])
    s.add_request(1, prompt(1, 120), 2, mm_features=[MmFeature(5, 100, "small")])
    assert step(s).num_scheduled_tokens == {0: 300}
    out = step(s)
    # 24 free, nothing freeable: request 1 stops before its image.
    assert out.num_scheduled_tokens == {0: 290, 1: 5}
    out = step(s)
    assert out.num_scheduled_tokens == {0: 1, 1: 115}
    assert out.scheduled_encoder_inputs == {1: [0]}
    assert out.free_encoder_mm_hashes == ["big"]
    assert s.encoder_cache_refs("big") is None


def test_disable_chunked_mm_input_never_splits_an_image() -> None:
    def first_two_steps(disable: bool) -> list[dict[Any, int]]:
        s = scheduler(600, 600, max_num_batched_tokens=32, disable_chunked_mm_input=disable)
        s.add_request(0, prompt(0, 50), 2, mm_features=[MmFeature(20, 20, "a")])
        return [step(s).num_scheduled_tokens for _ in range(2)]

    assert first_two_steps(False) == [{0: 32}, {0: 18}]
    assert first_two_steps(True) == [{0: 20}, {0: 30}]


def test_is_embed_positions_without_embeddings_need_no_encoder_yet() -> None:
    s = scheduler(600, 600, max_num_batched_tokens=16)
    mask = (False,) * 6 + (True,) * 4
    s.add_request(0, prompt(0, 30), 2, mm_features=[MmFeature(10, 10, "m", is_embed=mask)])
    out = step(s)
    assert (out.num_scheduled_tokens, out.scheduled_encoder_inputs) == ({0: 16}, {})
    out = step(s)
    assert (out.num_scheduled_tokens, out.scheduled_encoder_inputs) == ({0: 14}, {0: [0]})
    assert s.encoder_cache_usage()[0] == 596  # 4 embeddings, not 10


def test_an_identifier_reused_with_another_size_finishes_with_error() -> None:
    s = scheduler(600, 600)
    s.add_request(0, prompt(0, 30), 2, mm_features=[(0, 10, "dup")])
    s.add_request(1, prompt(1, 30), 2, mm_features=[(0, 12, "dup")])
    assert s.schedule().num_scheduled_tokens == {0: 30}
    assert s.update_from_output({0: [7]}) == [(1, "error")]


def test_encoder_settings_change_the_answer() -> None:
    def tokens(**kw: Any) -> dict[Any, int]:
        s = scheduler(**kw)
        s.add_request(0, prompt(0, 110), 2, mm_features=[MmFeature(0, 100, "a")])
        s.add_request(1, prompt(1, 120), 2, mm_features=[MmFeature(10, 100, "b")])
        return s.schedule().num_scheduled_tokens

    assert tokens(budget=200, cache=200) == {0: 110, 1: 120}
    assert tokens(budget=150, cache=200) == {0: 110, 1: 10}
    assert tokens(budget=200, cache=150) == {0: 110, 1: 10}


def test_items_that_could_never_run_are_refused_by_field() -> None:
    s = scheduler(500, 600)
    with pytest.raises(InputError, match="max_num_encoder_input_tokens=500"):
        s.add_request(0, prompt(0, 600), 2, mm_features=[MmFeature(10, 576, "a")])
    with pytest.raises(InputError, match="encoder_cache_size=400"):
        scheduler(500, 400).add_request(0, prompt(0, 600), 2, mm_features=[(0, 450, "a")])
    with pytest.raises(InputError, match="inside the 20-token prompt"):
        s.add_request(1, prompt(1, 20), 2, mm_features=[(10, 11, "a")])
    with pytest.raises(InputError, match="sorted by offset and disjoint"):
        s.add_request(2, prompt(2, 40), 2, mm_features=[(0, 10, "a"), (5, 10, "b")])
    with pytest.raises(InputError, match="mm_features"):
        s.add_request(3, prompt(3, 40), 2, mm_features=[(0, "ten", "a")])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="encoder_cache_size"):
        SchedulerConfig(encoder_cache_size=-1)
    with pytest.raises(ConfigError, match="disable_chunked_mm_input"):
        SchedulerConfig(disable_chunked_mm_input=1)  # type: ignore[arg-type]


def test_vllm_feature_specs_are_accepted_as_they_are() -> None:
    class Position:
        offset, length, is_embed = 2, 4, None

    class Spec:  # vLLM's MultiModalFeatureSpec shape: identifier + mm_position
        identifier = "v"
        mm_position = Position()

    s = scheduler(100, 100)
    s.add_request(0, prompt(0, 10), 2, mm_features=[Spec()])
    assert s.schedule().scheduled_encoder_inputs == {0: [0]}


# --- the cache against the reference model ---------------------------------------------

SIZES = {"a": 3, "b": 5, "c": 8, "d": 13, "e": 4}
# Each request's items by input id, as its mm_features fix them (request 0 and 2 repeat one).
ITEMS: dict[Any, list[str]] = {
    0: ["a", "b", "a", "c"],
    1: ["b", "c", "d", "e"],
    2: ["a", "a", "e", "d"],
    "x": ["c", "d", "b", "a"],
}
REQUESTS = list(ITEMS)


class EncoderCacheMachine(RuleBasedStateMachine):
    @precondition(lambda self: not hasattr(self, "rust"))
    @rule(size=st.integers(13, 40))
    def build(self, size: int) -> None:
        self.rust = EncoderCache(size)
        self.ref = RefEncoderCache(size)
        self.evicted: set[str] = set()

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(
        request=st.sampled_from(REQUESTS),
        input_id=st.integers(0, 3),
        budget=st.sampled_from([4, 8, 100]),
    )
    def schedule_input(self, request: Any, input_id: int, budget: int) -> None:
        """What the scheduler does for one item: a hit, or room for it and its allocation."""
        mm_hash = ITEMS[request][input_id]
        hit = self.rust.check_and_update_cache(request, input_id, mm_hash)
        assert hit == self.ref.check_and_update_cache(request, input_id, mm_hash)
        if hit:
            return
        fits = self.rust.can_allocate(SIZES[mm_hash], budget, 0)
        assert fits == self.ref.can_allocate(SIZES[mm_hash], budget, 0)
        if fits:
            self.rust.allocate(request, input_id, mm_hash, SIZES[mm_hash])
            self.ref.allocate(request, input_id, mm_hash, SIZES[mm_hash])

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(
        num_embeds=st.integers(0, 20),
        budget=st.integers(0, 30),
        promised=st.integers(0, 20),
    )
    def can_allocate(self, num_embeds: int, budget: int, promised: int) -> None:
        got = self.rust.can_allocate(num_embeds, budget, promised)
        assert got == self.ref.can_allocate(num_embeds, budget, promised)

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(request=st.sampled_from(REQUESTS), input_id=st.integers(0, 3))
    def free_encoder_input(self, request: Any, input_id: int) -> None:
        mm_hash = ITEMS[request][input_id]
        self.rust.free_encoder_input(request, input_id, mm_hash)
        self.ref.free_encoder_input(request, input_id, mm_hash)

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(request=st.sampled_from(REQUESTS))
    def free(self, request: Any) -> None:
        for input_id in self.ref.get_cached_input_ids(request):
            mm_hash = self.ref.inputs[request][input_id]
            self.rust.free_encoder_input(request, input_id, mm_hash)
            self.ref.free_encoder_input(request, input_id, mm_hash)
        assert self.rust.get_cached_input_ids(request) == []

    @precondition(lambda self: hasattr(self, "rust"))
    @rule()
    def take_freed(self) -> None:
        freed = self.rust.get_freed_mm_hashes()
        # The same list as the model's, repeats included: as in vLLM 0.33's
        # EncoderCacheManager.get_freed_mm_hashes, an identifier evicted, encoded again and
        # evicted again between two calls is reported twice.
        assert freed == self.ref.get_freed_mm_hashes()
        for mm_hash in freed:
            assert mm_hash not in self.rust.entries()

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "rust"):
            return
        r, ref = self.rust, self.ref
        self.rust.check_invariants()
        assert (r.num_free_slots, r.num_freeable_slots) == (
            ref.num_free_slots,
            ref.num_freeable_slots,
        )
        assert 0 <= r.num_free_slots <= r.num_freeable_slots <= r.cache_size
        assert r.entries() == sorted(ref.refs)
        assert r.freeable() == list(ref.freeable)
        # Entries conserved: what they hold is exactly the space taken.
        assert sum(SIZES[h] for h in ref.refs) == r.cache_size - r.num_free_slots
        for request in REQUESTS:
            assert r.get_cached_input_ids(request) == ref.get_cached_input_ids(request)
        for mm_hash in SIZES:
            assert r.num_refs(mm_hash) == len(ref.refs.get(mm_hash, ()))


TestEncoderCacheMachine = EncoderCacheMachine.TestCase
TestEncoderCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_allocating_an_identifier_already_cached_is_refused_and_changes_nothing() -> None:
    """allocate -> free -> allocate of one hash once left a referenced entry on the freeable
    list (a later eviction panicked); a cached identifier is referenced, never allocated."""
    cache = EncoderCache(20)
    cache.allocate(0, 0, "a", 4)
    cache.free_encoder_input(0, 0, "a")
    with pytest.raises(InputError) as caught:
        cache.allocate(1, 0, "a", 4)
    assert caught.value.field == "mm_hash"
    assert cache.num_refs("a") == 0
    assert cache.check_and_update_cache(1, 0, "a")  # the way in: a hit, referenced again
    assert cache.num_refs("a") == 1
    assert cache.can_allocate(16, 100, 0)  # 16 slots left; the entry is held, not freeable
    assert not cache.can_allocate(17, 100, 0)
    cache.check_invariants()
