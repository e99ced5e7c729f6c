"""The core's fine-grained partial-hit finder (``tokenyard._core.fine_grained_hit``, vLLM
0.33's ``find_longest_cache_hit`` with partial hash hits on) against the reference model's
(``kv_coordinator_reference.fine_grained_hit``), on random caches of hash boundaries.
tests/test_integrations_vllm_partial_hits.py checks both rules against vLLM's own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kv_coordinator_reference import fine_grained_hit as reference_hit

from tokenyard._core import fine_grained_hit


@st.composite
def caches(draw: st.DrawFn) -> tuple[bool, int, int, list[int | None], int, bool]:
    hash_block = draw(st.sampled_from((1, 2, 4)))
    block = hash_block * draw(st.integers(2, 4))
    mamba = draw(st.booleans())
    num_hashes = draw(st.integers(0, 12))
    cached = draw(
        st.lists(st.one_of(st.none(), st.integers(1, 99)), min_size=num_hashes, max_size=num_hashes)
    )
    max_length = draw(st.integers(0, num_hashes * hash_block + hash_block))
    drop = not mamba and draw(st.booleans())
    return mamba, block, hash_block, cached, max_length, drop


@settings(max_examples=400, deadline=None)
@given(caches())
def test_the_finder_answers_as_the_reference_model(
    case: tuple[bool, int, int, list[int | None], int, bool],
) -> None:
    mamba, block, hash_block, cached, max_length, drop = case
    ours = fine_grained_hit(
        mamba=mamba,
        block_size=block,
        hash_block_size=hash_block,
        cached=cached,
        max_length=max_length,
        drop_eagle_block=drop,
    )
    assert ours == reference_hit(mamba, block, hash_block, cached, max_length, drop)


def test_a_hit_inside_a_mamba_block_as_in_vllms_own_case() -> None:
    # test_hybrid_mamba_align_partial_hash_hit: hash 2, Mamba block 4, a state at 6 tokens.
    cached = [None, None, 9, None]
    assert fine_grained_hit(
        mamba=True, block_size=4, hash_block_size=2, cached=cached, max_length=7
    ) == ([0, 9], 6)
