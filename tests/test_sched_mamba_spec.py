"""The step scheduler with Mamba speculative state blocks and the align prefill checkpoint
block (``MambaSpec(num_speculative_blocks=..., num_prefill_checkpoint_blocks=1,
prefill_checkpoint_alignment=...)``, vLLM 0.33's ``MambaManager``): hand-checked tables and
chunks. vLLM's own scheduler is the reference in
tests/test_integrations_vllm_mamba_spec.py."""

from __future__ import annotations

from typing import Any

from tokenyard.kv import FullAttentionSpec, MambaSpec
from tokenyard.sched import Scheduler, SchedulerConfig


def _scheduler(mamba: Any, k: int = 0, budget: int = 64) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=budget,
            block_size=4,
            num_blocks=80,
            enable_prefix_caching=True,
            kv_groups=(FullAttentionSpec(), mamba),
            mamba_align_block_size=4,
            num_speculative_tokens=k,
        )
    )


def _live(s: Scheduler, rid: int) -> int:
    return int((s.group_block_ids(rid)[1] != 0).sum())


def test_a_decode_step_with_two_drafts_holds_one_plus_two_state_blocks() -> None:
    # Blocks of 4, a 10-token prompt: one chunk to the last reusable boundary (8), then 2.
    s = _scheduler(MambaSpec(mamba_cache_mode="align", num_speculative_blocks=2), k=2)
    s.add_request(0, list(range(10)), 8)
    assert s.schedule().num_scheduled_tokens[0] == 8
    # cdiv(8, 4) + 2 slots: a null, the state after 8 tokens, 2 draft-token blocks.
    assert (len(s.group_block_ids(0)[1]), _live(s, 0)) == (4, 3)
    s.update_from_output({})
    s.schedule()
    s.update_from_output({0: [7]}, spec_token_ids={0: [7, 7]})
    out = s.schedule()
    assert out.num_scheduled_tokens[0] == 3  # the token and 2 drafts
    # 13 tokens: cdiv 4 + 2 slots; the state copied from, the state and 2 draft blocks.
    assert (len(s.group_block_ids(0)[1]), _live(s, 0)) == (6, 4)
    s.update_from_output({0: [7, 7, 7]}, spec_token_ids={0: [7, 7]})
    s.schedule()
    # The state it was copied from is freed at the next allocation: 1 + 2 stay.
    assert _live(s, 0) == 3


def test_without_speculative_blocks_the_same_steps_hold_two() -> None:
    s = _scheduler(MambaSpec(mamba_cache_mode="align"), k=2)
    s.add_request(0, list(range(10)), 8)
    s.schedule()
    s.update_from_output({})
    s.schedule()
    s.update_from_output({0: [7]}, spec_token_ids={0: [7, 7]})
    s.schedule()
    assert _live(s, 0) == 2


def _chunks(mamba: Any, prompt_len: int, budget: int) -> list[int]:
    s = _scheduler(mamba, budget=budget)
    s.add_request(0, list(range(prompt_len)), 2)
    chunks = []
    while s.num_computed_tokens(0) < prompt_len:
        chunks.append(s.schedule().num_scheduled_tokens[0])
        done = s.num_computed_tokens(0) >= s.num_tokens(0)
        s.update_from_output({0: [7]} if done else {})
    return chunks


def test_a_checkpoint_block_lets_the_final_chunk_run_past_the_last_boundary() -> None:
    # 23 tokens over blocks of 4: without a checkpoint block the prompt stops at the last
    # reusable state (20) first; with one the backend writes it from inside the chunk.
    plain = MambaSpec(mamba_cache_mode="align")
    checkpoint = MambaSpec(
        mamba_cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1
    )
    assert _chunks(plain, 23, 64) == [20, 3]
    assert _chunks(checkpoint, 23, 64) == [23]
    # An alignment the state at 20 is not a multiple of: no checkpoint, the stop stays.
    coarse = MambaSpec(
        mamba_cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=8
    )
    assert _chunks(coarse, 23, 64) == [20, 3]
    # A non-final chunk still ends on a block boundary (budget 10: 8, then 8, 7).
    assert _chunks(checkpoint, 23, 10) == [8, 8, 7]


def test_the_checkpoint_state_is_cached_for_the_next_request() -> None:
    checkpoint = MambaSpec(
        mamba_cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1
    )
    # One 23-token chunk, yet the state at 20 is cached (in the checkpoint block), as the
    # two chunks without one cache it: a second request hits 20 tokens either way.
    for spec in (checkpoint, MambaSpec(mamba_cache_mode="align")):
        s = _scheduler(spec)
        s.add_request(0, list(range(23)), 1)
        while s.has_unfinished_requests():
            s.schedule()
            done = s.num_computed_tokens(0) >= s.num_tokens(0)
            s.update_from_output({0: [7]} if done else {})
        s.add_request(1, list(range(23)), 1)
        new = s.schedule().scheduled_new_reqs[0]
        assert new.num_computed_tokens == 20, spec


def test_the_fields_read_back_and_print() -> None:
    spec = MambaSpec(
        mamba_cache_mode="align",
        num_speculative_blocks=3,
        num_prefill_checkpoint_blocks=1,
        prefill_checkpoint_alignment=16,
    )
    assert repr(spec) == (
        "MambaSpec(mamba_cache_mode='align', num_speculative_blocks=3, "
        "num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=16)"
    )
    assert repr(MambaSpec()) == "MambaSpec()"
    assert MambaSpec(num_speculative_blocks=2).num_speculative_blocks == 2
