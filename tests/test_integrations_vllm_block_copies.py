"""tokenyard.integrations.vllm: block copies (vLLM 0.33's ``SchedulerOutput.
kv_cache_block_copies``) queued through a manager's ``_pending_cow_copies`` between blocks
taken by ``block_pool.get_new_blocks``, as vLLM's
``test_cow_retentions_deferred_until_copy_step_processed`` does. vLLM's ``Scheduler`` /
``AsyncScheduler`` and tokenyard's are driven through the same operations (seeded); after
each, the copies each step carries, the free blocks, the deferred frees' fences and the
copied blocks' ref counts must be equal (vLLM 0.33 ``kv_cache_manager.py``:
``take_kv_cache_block_copies``; ``scheduler.py``: ``_free_cow_retained_blocks``,
``_drain_deferred_frees``). Needs vLLM (the bench venv, ``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm_compare import add_to_each, peer_pair

from tokenyard.errors import InputError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

STOP = 42


def _pair(*, async_scheduling: bool, defer: bool, num_blocks: int = 12) -> list[Any]:
    classes = (
        (AsyncScheduler, AsyncTokenyardScheduler)
        if async_scheduling
        else (Scheduler, TokenyardScheduler)
    )
    config = {"max_num_seqs": 8, "max_num_batched_tokens": 96, "max_model_len": 256}
    pair = peer_pair(classes, num_blocks=num_blocks, **config)
    for scheduler in pair:
        scheduler.defer_block_free = defer
    return pair


def _runner_output(out: Any, tokens: dict[str, int]) -> ModelRunnerOutput:
    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={i: n for n, i in enumerate(ids)},
        sampled_token_ids=[[tokens.get(i, 0)] for i in ids],
    )


def _pool(scheduler: Any) -> Any:
    return scheduler.kv_cache_manager.block_pool


def _manager(scheduler: Any) -> Any:
    return scheduler.kv_cache_manager.coordinator.single_type_managers[0]


def _state(scheduler: Any, held: list[int]) -> tuple[Any, ...]:
    blocks = _pool(scheduler).blocks
    return (
        _pool(scheduler).get_num_free_blocks(),
        [fence for fence, _ in scheduler.deferred_frees],
        [blocks[b].ref_cnt for b in held],
    )


def test_vllms_own_case_the_endpoints_wait_for_the_step_that_runs_the_copy() -> None:
    """vLLM's test, on both schedulers: a copy queued by hand rides the first step; with
    the pool otherwise exhausted, a request that fits exactly in the copy's endpoints is
    admitted only once that step is processed."""
    pair = _pair(async_scheduling=True, defer=True)
    add_to_each(pair, "r", list(range(33)), SamplingParams(max_tokens=5, stop_token_ids=[STOP]))
    outs: list[list[Any]] = [[] for _ in pair]
    endpoints = []
    for s, o in zip(pair, outs, strict=True):
        src, dst = _pool(s).get_new_blocks(2)
        endpoints.append((src, dst))
        _manager(s)._pending_cow_copies.append((src, dst))
        o.append(s.schedule())
        assert o[0].kv_cache_block_copies == [KVCacheBlockCopy(src.block_id, dst.block_id)]
        _pool(s).get_new_blocks(_pool(s).get_num_free_blocks())
    add_to_each(pair, "late", [500 + t for t in range(32)], SamplingParams(max_tokens=5))
    for s, o, (src, dst) in zip(pair, outs, endpoints, strict=True):
        o.append(s.schedule())
        assert (src.ref_cnt, dst.ref_cnt) == (1, 1)
        assert s.deferred_frees
        assert not o[1].scheduled_new_reqs
        s.update_from_output(o[0], _runner_output(o[0], {}))
        assert (src.ref_cnt, dst.ref_cnt) == (0, 0)
        assert not s.deferred_frees
        assert [r.req_id for r in s.schedule().scheduled_new_reqs] == ["late"]
    assert [(a.block_id, b.block_id) for a, b in endpoints[:1]] == [
        (a.block_id, b.block_id) for a, b in endpoints[1:]
    ]


def test_an_endpoint_without_a_loose_reference_is_refused() -> None:
    """A block of a request's table is not the copy's to release (vLLM's copy would free a
    reference the request holds); the copy stays queued in its group."""
    (ours,) = _pair(async_scheduling=False, defer=True)[1:]
    add_to_each([ours], "r", list(range(20)), SamplingParams(max_tokens=3))
    out = ours.schedule()
    held = out.scheduled_new_reqs[0].block_ids[0][0]
    (free,) = _pool(ours).get_new_blocks(1)
    manager = _manager(ours)
    manager._pending_cow_copies.append((_pool(ours).blocks[held], free))
    with pytest.raises(InputError, match="kv_cache_block_copies"):
        ours.schedule()
    assert len(manager._pending_cow_copies) == 1
    manager._pending_cow_copies.clear()
    _pool(ours).free_blocks([free])
    assert free.ref_cnt == 0
    with pytest.raises(InputError, match="block_ids"):
        _pool(ours).free_blocks([free])


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_random_copies_agree_with_vllm(async_scheduling: bool, defer: bool, seed: int) -> None:
    """Seeded streams of requests (stops, aborts), blocks taken and freed by hand and
    copies queued between them, with up to two steps in flight: every step's copies and,
    after each operation, the free blocks, fences and taken blocks' ref counts agree."""
    rng = random.Random(seed)
    pair = _pair(async_scheduling=async_scheduling, defer=defer)
    in_flight: list[list[Any]] = []
    loose: list[int] = []  # vLLM block ids with a reference taken by hand, one entry each
    held: set[int] = set()
    depth = 2 if async_scheduling else 1
    for step in range(40):
        op = rng.random()
        if op < 0.25:
            n = rng.randint(10, 50)
            prompt = [rng.randint(1, 40) if rng.random() < 0.5 else t for t in range(n)]
            params = SamplingParams(max_tokens=rng.randint(1, 6), stop_token_ids=[STOP])
            add_to_each(pair, f"r{step}", prompt, params)
        elif op < 0.45:
            free = _pool(pair[0]).get_num_free_blocks()
            n = rng.randint(0, min(4, free))
            taken = [[b.block_id for b in _pool(s).get_new_blocks(n)] for s in pair]
            assert taken[0] == taken[1], f"step {step}: blocks taken"
            loose += taken[0]
            held.update(taken[0])
        elif op < 0.6 and len(loose) >= 2:
            rng.shuffle(loose)
            src, dst = loose.pop(), loose.pop()
            if src != dst:
                for s in pair:
                    blocks = _pool(s).blocks
                    _manager(s)._pending_cow_copies.append((blocks[src], blocks[dst]))
            else:
                loose += [src, dst]
        elif op < 0.68 and loose:
            block = loose.pop(rng.randrange(len(loose)))
            for s in pair:
                _pool(s).free_blocks([_pool(s).blocks[block]])
        elif op < 0.72:
            running = [r for r in pair[0].requests if r in pair[1].requests]
            if running:
                victim = rng.choice(sorted(running))
                for s in pair:
                    s.finish_requests([victim], _aborted())
        if len(in_flight) < depth:
            outs = [s.schedule() for s in pair]
            copies = [o.kv_cache_block_copies for o in outs]
            assert copies[0] == copies[1], f"step {step}: copies"
            assert dict(outs[0].num_scheduled_tokens) == dict(outs[1].num_scheduled_tokens), (
                f"step {step}: scheduled"
            )
            in_flight.append(outs)
        if in_flight and (len(in_flight) >= depth or rng.random() < 0.5):
            outs = in_flight.pop(0)
            tokens = {r: STOP if rng.random() < 0.2 else 7 for r in outs[0].num_scheduled_tokens}
            for s, o in zip(pair, outs, strict=True):
                s.update_from_output(o, _runner_output(o, tokens))
        order = sorted(held)
        assert _state(pair[1], order) == _state(pair[0], order), f"step {step}: state"


def _aborted() -> Any:
    from vllm.v1.request import RequestStatus

    return RequestStatus.FINISHED_ABORTED


@pytest.mark.parametrize("defer", [False, True])
def test_a_paused_step_carries_the_copies_as_vllms_does(defer: bool) -> None:
    """vLLM 0.33's paused ``schedule()`` schedules nothing but still drains the queued
    copies into its empty output; their endpoints return as that step's would."""
    from vllm.v1.core.sched.interface import PauseState

    pair = _pair(async_scheduling=True, defer=defer)
    held: list[int] = []
    for s in pair:
        s.set_pause_state(PauseState.PAUSED_ALL)
        src, dst = _pool(s).get_new_blocks(2)
        held = [src.block_id, dst.block_id]
        _manager(s)._pending_cow_copies.append((src, dst))
    outs = [s.schedule() for s in pair]
    assert outs[0].kv_cache_block_copies == outs[1].kv_cache_block_copies
    assert outs[1].kv_cache_block_copies == [KVCacheBlockCopy(*held)]
    assert _state(pair[1], held) == _state(pair[0], held)
    add_to_each(pair, "r", list(range(20)), SamplingParams(max_tokens=3))
    for s in pair:
        s.set_pause_state(PauseState.UNPAUSED)
        out = s.schedule()
        s.update_from_output(out, _runner_output(out, {}))
    # Released (at once, or past the fence): the request just admitted may hold them.
    assert not pair[1].deferred_frees
    assert _state(pair[1], held) == _state(pair[0], held)


def test_a_block_held_by_hand_blocks_the_prefix_cache_reset() -> None:
    """vLLM's ``BlockPool.reset_prefix_cache`` refuses while any block is used (the null
    block aside): a block taken by ``get_new_blocks`` counts until ``free_blocks``."""
    pair = _pair(async_scheduling=False, defer=False)
    taken = [_pool(s).get_new_blocks(1) for s in pair]
    assert [s.reset_prefix_cache() for s in pair] == [False, False]
    for s, blocks in zip(pair, taken, strict=True):
        _pool(s).free_blocks(blocks)
    assert [s.reset_prefix_cache() for s in pair] == [True, True]


def _hybrid(cls: type, defer: bool) -> Any:
    """Full attention + a Mamba ``align`` group (block 16, 40 blocks, prefix caching), as
    ``test_integrations_vllm_mamba_connector.py`` builds it, without a connector."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )
    from vllm_peer import VllmSchedulerPeer

    peer = VllmSchedulerPeer(
        num_blocks=40, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512
    )
    peer.vllm_config.cache_config.mamba_cache_mode = "align"
    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    mamba = MambaSpec(
        block_size=16, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"
    )
    groups = [KVCacheGroupSpec(["fa"], fa), KVCacheGroupSpec(["mamba"], mamba)]
    config = KVCacheConfig(num_blocks=40, kv_cache_tensors=[], kv_cache_groups=groups)
    scheduler = peer.build(cls, config)
    scheduler._peer = peer
    scheduler.defer_block_free = defer
    return scheduler


@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_copies_beside_a_mamba_align_group_agree_with_vllm(defer: bool, seed: int) -> None:
    """Two KV groups (the coordinator, whose block 0 is the null block): copies appended to
    the Mamba group's queue between blocks taken by hand, beside requests; block ids,
    copies, free blocks and fences agree with vLLM's ``Scheduler`` step by step."""
    from vllm_compare import runner_output

    rng = random.Random(seed)
    pair = [_hybrid(cls, defer) for cls in (Scheduler, TokenyardScheduler)]
    loose: list[int] = []
    held: set[int] = set()
    for step in range(30):
        op = rng.random()
        if op < 0.3:
            prompt = [rng.randint(1, 30) for _ in range(rng.randint(16, 60))]
            for s in pair:
                s.add_request(s._peer.make_request(f"r{step}", prompt, max_tokens=3))
        elif op < 0.55:
            n = rng.randint(0, min(3, _pool(pair[0]).get_num_free_blocks()))
            taken = [[b.block_id for b in _pool(s).get_new_blocks(n)] for s in pair]
            assert taken[0] == taken[1], f"step {step}: blocks taken"
            loose += taken[0]
            held.update(taken[0])
        elif op < 0.75 and len(loose) >= 2:
            src, dst = loose.pop(rng.randrange(len(loose))), loose.pop(rng.randrange(len(loose)))
            for s in pair:
                blocks = _pool(s).blocks
                mamba = s.kv_cache_manager.coordinator.single_type_managers[1]
                mamba._pending_cow_copies.append((blocks[src], blocks[dst]))
        elif op < 0.85 and loose:
            block = loose.pop(rng.randrange(len(loose)))
            for s in pair:
                _pool(s).free_blocks([_pool(s).blocks[block]])
        outs = [s.schedule() for s in pair]
        assert outs[0].kv_cache_block_copies == outs[1].kv_cache_block_copies, f"step {step}"
        assert dict(outs[0].num_scheduled_tokens) == dict(outs[1].num_scheduled_tokens)
        for s, out in zip(pair, outs, strict=True):
            s.update_from_output(out, runner_output(s, out))
        order = sorted(held)
        assert _state(pair[1], order) == _state(pair[0], order), f"step {step}: state"
