"""tokenyard.integrations.vllm: requests that arrive computed (a P/D decode side's,
``request.num_computed_tokens > 0`` at ``add_request``) over several KV groups, against
vLLM 0.33's own ``Scheduler`` step by step. vLLM admits such a request with no prefix lookup
(``Scheduler.schedule``'s waiting branch) and one ``allocate_slots`` with nothing to adopt:
every group's ``allocate_new_blocks`` gives new blocks for all its slots from 0 (a window's
below its window too, freed by the next step's ``remove_skipped_blocks``; a Mamba
``align`` group nulls the slots before its state), while ``get_num_blocks_to_allocate``
with ``total_computed_tokens`` the arrived tokens counts a window without the blocks it
has left. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.structured_output import StructuredOutputManager
from vllm_compare import (
    BLOCK_SIZE,
    add_both,
    attention_spec,
    block_digest,
    compare_stream,
    runner_output,
    sampling,
    seeded_arrivals,
)
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import CapacityError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

#: Each layout's groups as ``(kind, block_size)`` (``vllm_compare.attention_spec`` kinds,
#: ``"mamba"`` in align mode, ``"mambanone"`` in ``none`` mode, prefix caching then off,
#: with vLLM's block of ``max_model_len`` tokens or shorter ones).
LAYOUTS = {
    "full-window": [("full", 16), ("window32", 16)],
    "full-chunk": [("full", 16), ("chunk32", 16)],
    "full-window-chunk": [("full", 16), ("window48", 16), ("chunk64", 16)],
    "full-mamba": [("full", 16), ("mamba", 16)],
    "full-mambanone": [("full", 16), ("mambanone", 512)],
    # none-mode blocks shorter than max_model_len (512): a slot per block, all but the
    # last state nulled (vLLM's MambaManager outside align mode), one size or a larger one.
    "full-mambanone16": [("full", 16), ("mambanone", 16)],
    "full-mambanone64": [("full", 16), ("mambanone", 64)],
    "gemma-sizes": [("full", 32), ("window64", 16)],
}


def _spec(kind: str, block_size: int) -> Any:
    if kind.startswith("mamba"):
        mode = "none" if kind == "mambanone" else "align"
        return MambaSpec(
            block_size=block_size, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode=mode
        )
    return dataclasses.replace(attention_spec(kind), block_size=block_size)


def _pair(
    layout: str, num_blocks: int, *, asynchronous: bool = False, **options: Any
) -> tuple[Any, Any, Any]:
    """vLLM's Scheduler and the adapter over ``LAYOUTS[layout]``, prefix caching on (off
    beside a ``none``-mode Mamba group): the scheduler block size the groups' lcm (512
    beside a ``none``-mode Mamba group, whose block covers ``max_model_len``: full attention
    then takes blocks of 16 beside it, the layout of vLLM's
    ``test_async_load_does_not_double_reserve_mamba_spec_blocks[none-128-18]``), the hash
    block size 16, as vLLM's engine passes them (``resolve_kv_cache_block_sizes``)."""
    kinds = LAYOUTS[layout]
    caching = all(kind != "mambanone" for kind, _ in kinds)
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_num_seqs=4,
        max_model_len=512,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=caching,
        **options,
    )
    if any(kind == "mamba" for kind, _ in kinds):
        peer.vllm_config.cache_config.mamba_cache_mode = "align"
    # Under async scheduling two batches are in flight (`max_concurrent_batches`), which a
    # window's admission cap counts on both sides.
    peer.vllm_config.scheduler_config.async_scheduling = asynchronous
    classes = (
        (AsyncScheduler, AsyncTokenyardScheduler)
        if asynchronous
        else (Scheduler, TokenyardScheduler)
    )
    groups = [KVCacheGroupSpec([f"layers.{i}"], _spec(*k)) for i, k in enumerate(kinds)]
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    block_size = math.lcm(*(size for _, size in kinds))
    schedulers = [
        cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=config,
            structured_output_manager=StructuredOutputManager(peer.vllm_config),
            block_size=block_size,
            hash_block_size=BLOCK_SIZE,
            log_stats=True,
        )
        for cls in classes
    ]
    return schedulers[0], schedulers[1], peer


def _arrivals(seed: int) -> list[tuple[int, str, list[int], int, int]]:
    """``seeded_arrivals`` with half of the requests arriving computed: ``(step, id,
    prompt, max_tokens, num_computed_tokens)``, 0 to ``len(prompt) - 1`` computed."""
    rng = random.Random(seed)
    plain = seeded_arrivals(
        rng, prefix_tokens=96, shared=(0, 16, 48, 96), tail_max=120, max_tokens=24, max_prompt=300
    )
    return [
        (step, rid, prompt, max_tokens, rng.randrange(len(prompt)) if rng.random() < 0.5 else 0)
        for step, rid, prompt, max_tokens in plain
    ]


def _maker(peer: Any, *, only_first: bool = False) -> Any:
    """Builds each side's request, its computed tokens set (with ``only_first``, on vLLM's
    side alone: the failing variant)."""
    calls = [0]

    def make(request_id: str, prompt: list[int], max_tokens: int, computed: int) -> Any:
        request = peer.make_request(request_id, prompt, max_tokens)
        calls[0] += 1
        if not only_first or calls[0] % 2 == 1:
            request.num_computed_tokens = computed
        return request

    return make


CASES = [(layout, seed, blocks) for layout in LAYOUTS for seed in range(6) for blocks in (160, 48)]


@pytest.mark.parametrize(("layout", "seed", "num_blocks"), CASES)
def test_computed_arrivals_match_vllm_step_by_step(layout: str, seed: int, num_blocks: int) -> None:
    # Shared prefixes, half the requests computed up to any point of their prompt, a
    # 64-token budget; 48 blocks put the pool under pressure (blocking, preemption and
    # recompute from 0). Every step's blocks per group, computed tokens, KV usage and the
    # tables after it agree.
    theirs, ours, peer = _pair(layout, num_blocks, max_num_batched_tokens=64)
    raised = []
    try:
        compare_stream(theirs, ours, _arrivals(seed), _maker(peer))
    except ValueError as error:
        raised.append(str(error))
    if raised:
        # vLLM's count admitted an arrival its allocation cannot take (its
        # `BlockPool.get_new_blocks` raises), every step before agreeing: the adapter
        # raises at that step too (five streams of the 48-block pool reach it).
        assert "free blocks from the pool" in raised[0]
        with pytest.raises(CapacityError, match="num_computed_tokens"):
            ours.schedule()


def test_the_comparison_fails_when_the_adapter_misses_the_computed_tokens() -> None:
    theirs, ours, peer = _pair("full-window", 160, max_num_batched_tokens=64)
    arrivals = [(0, "pd", list(range(100, 200)), 4, 80)]
    with pytest.raises(AssertionError):
        compare_stream(theirs, ours, arrivals, _maker(peer, only_first=True))


def test_a_window_gets_blocks_for_the_tokens_it_has_left_then_frees_them() -> None:
    """100 tokens with 80 computed over full attention and a 32-token window: 20 scheduled,
    7 new blocks in each group (none null); the next step's allocation frees the window's
    first 4 (the next token attends to 68..100)."""
    theirs, ours, peer = _pair("full-window", 40, max_num_batched_tokens=64)
    seen = []
    for scheduler in (theirs, ours):
        request = peer.make_request("pd", list(range(100, 200)), 4)
        request.num_computed_tokens = 80
        scheduler.add_request(request)
        out = scheduler.schedule()
        assert out.num_scheduled_tokens == {"pd": 20}
        (new,) = out.scheduled_new_reqs
        assert [len(g) for g in new.block_ids] == [7, 7]
        assert 0 not in new.block_ids[1]
        from vllm_compare import runner_output

        scheduler.update_from_output(out, runner_output(scheduler, out))
        scheduler.schedule()
        seen.append((new.block_ids, scheduler.kv_cache_manager.get_block_ids("pd")))
    assert seen[0] == seen[1]
    assert seen[1][1][1][:4] == [0, 0, 0, 0]


def test_where_vllms_count_fits_but_its_allocation_does_not_both_raise() -> None:
    """14 blocks (13 free): vLLM counts 7 + 4 = 11 for the arrival above and then asks its
    pool for 14 (``BlockPool.get_new_blocks`` raises ``ValueError``); the adapter raises a
    ``CapacityError`` naming both numbers instead of serving it differently."""
    theirs, ours, peer = _pair("full-window", 14, max_num_batched_tokens=64)
    for scheduler, error in ((theirs, ValueError), (ours, CapacityError)):
        request = peer.make_request("pd", list(range(100, 200)), 4)
        request.num_computed_tokens = 80
        scheduler.add_request(request)
        with pytest.raises(error) as info:
            scheduler.schedule()
        if error is CapacityError:
            assert "requested 14, available 13" in str(info.value)


def _tables_agree(theirs: Any, ours: Any, step: int) -> None:
    assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
    for request_id in ours.requests:
        table = ours.kv_cache_manager.get_block_ids(request_id)
        assert table == theirs.kv_cache_manager.get_block_ids(request_id), step


ASYNC_CASES = [(layout, seed) for layout in LAYOUTS for seed in range(3)]


@pytest.mark.parametrize(("layout", "seed"), ASYNC_CASES)
def test_computed_arrivals_match_vllms_async_scheduler(layout: str, seed: int) -> None:
    # vLLM's AsyncScheduler and AsyncTokenyardScheduler, two steps in flight (each lands
    # a step later): the next allocation frees a window's blocks on the processed-token
    # basis, so an arrival's blocks below its window stay while its first step is in
    # flight. Every step's decisions, blocks, KV usage and tables agree.
    theirs, ours, peer = _pair(layout, 160, asynchronous=True, max_num_batched_tokens=64)
    make = _maker(peer)
    arrivals = _arrivals(seed)
    pending: list[tuple[Any, Any, set[str], set[str]]] = []
    for step in range(3000):
        for at, *args in arrivals:
            if at == step:
                add_both((theirs, ours), make, *args)
        out_v, out_t = theirs.schedule(), ours.schedule()
        assert block_digest(out_t) == block_digest(out_v), step
        _tables_agree(theirs, ours, step)
        pending.append((out_v, out_t, sampling(theirs, out_v), sampling(ours, out_t)))
        if len(pending) == 2 or not out_v.num_scheduled_tokens:
            old_v, old_t, sampling_v, sampling_t = pending.pop(0)
            assert sampling_t == sampling_v, step
            theirs.update_from_output(old_v, runner_output(theirs, old_v, sampling_v))
            ours.update_from_output(old_t, runner_output(ours, old_t, sampling_t))
            _tables_agree(theirs, ours, step)
        if step > 12 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return
    raise AssertionError("the stream did not drain")
