"""The reference model of vLLM 0.33's partial hash hits with copy-on-write
(tests/kv_cow_reference.py) under vLLM's own ``Scheduler`` and ``AsyncScheduler``: each
scheduler runs seeded multi-turn conversations (each turn's prompt extends the last, so
hits end inside blocks) on full attention + Mamba ``align`` groups hashed at
``hash_block_size`` 4 below their block of 16, and every call the scheduler makes to its
``KVCacheManager`` (``get_computed_blocks``, ``allocate_slots``, ``cache_blocks``,
``remove_skipped_blocks``, ``free``, ``take_kv_cache_block_copies``, the retained
endpoints' release in ``_free_cow_retained_blocks``) is made on the model too with the
scheduler's own arguments: each hit, each allocation's new block ids per group (or its
refusal), each step's ``kv_cache_block_copies``, the running requests' tables and
computed tokens and the free queue in order must be the model's. Needs vLLM (the bench
venv); skipped elsewhere."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import sys
from pathlib import Path

from kv_cow_reference import CowHit, RefCowCoordinator
from test_kv_cow_reference import KINDS, _spec
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm.sampling_params import SamplingParams
from vllm_peer import VllmSchedulerPeer, runner_output

BLOCK, HASH_BLOCK = 16, 4


class Mirror:
    """Makes each of the scheduler's KV cache manager calls on the model as well, and
    checks the answers agree."""

    def __init__(self, scheduler: Any, num_blocks: int) -> None:
        self.manager = manager = scheduler.kv_cache_manager
        self.model = RefCowCoordinator(KINDS, num_blocks, BLOCK, HASH_BLOCK)
        self.retained: list[int] = []
        self.stats = {
            "partial_hits": 0,
            "copies": 0,
            "refused": 0,
            "allocations": 0,
            "in_flight": 0,
            "output_caching": 0,
        }
        for name in (
            "new_step_starts",
            "get_computed_blocks",
            "allocate_slots",
            "cache_blocks",
            "remove_skipped_blocks",
            "free",
            "take_kv_cache_block_copies",
        ):
            setattr(manager, name, self._wrap(getattr(manager, name), getattr(self, name)))
        original_release = scheduler._free_cow_retained_blocks

        def release(blocks: list[Any], fence_seq: int) -> None:
            assert not scheduler.defer_block_free
            original_release(blocks, fence_seq)
            assert [b.block_id for b in blocks] == self.retained
            self.model.free_blocks(self.retained)

        scheduler._free_cow_retained_blocks = release

    @staticmethod
    def _wrap(real: Any, mirror: Any) -> Any:
        return lambda *args, **kwargs: mirror(real, *args, **kwargs)

    def new_step_starts(self, real: Any) -> None:
        real()
        self.model.new_step_starts()

    def get_computed_blocks(self, real: Any, request: Request, max_length: Any = None) -> Any:
        blocks, num_hit, boundary = real(request, max_length)
        ours = self.model.get_computed_blocks(request.all_token_ids, max_length)
        theirs = [list(ids) for ids in blocks.get_block_ids()] if num_hit else []
        assert (ours.num_tokens, [b for b in ours.blocks if num_hit]) == (num_hit, theirs)
        return blocks, num_hit, boundary

    def allocate_slots(self, real: Any, request: Request, num_new: int, **kw: Any) -> Any:
        assert not kw.get("num_lookahead_tokens")
        assert not kw.get("num_external_computed_tokens")
        assert not kw.get("delay_cache_blocks")
        assert not kw.get("reserved_blocks")
        num_hit = kw.get("num_new_computed_tokens", 0)
        given = kw.get("new_computed_blocks")
        hit = None
        if given is not None and num_hit:
            hit = CowHit([list(ids) for ids in given.get_block_ids()], num_hit)
        total = request.num_computed_tokens + num_hit
        processed = max(0, total - request.num_in_flight_tokens)
        self.stats["in_flight"] += request.num_in_flight_tokens > 0
        ours = self.model.allocate_slots(
            request.request_id,
            num_new,
            request.all_token_ids,
            request.num_prompt_tokens,
            request.num_computed_tokens,
            hit,
            processed,
            bool(kw.get("full_sequence_must_fit")),
        )
        out = real(request, num_new, **kw)
        theirs = None if out is None else [list(ids) for ids in out.get_block_ids()]
        assert ours == theirs, (request.request_id, num_new, num_hit, ours, theirs)
        self.stats["allocations"] += 1
        self.stats["refused"] += out is None
        self.stats["partial_hits"] += out is not None and num_hit % BLOCK != 0
        if out is not None:
            tables = [list(t) for t in self.manager.get_block_ids(request.request_id)]
            assert self.model.requests[request.request_id].tables == tables
        return out

    def cache_blocks(self, real: Any, request: Request, num_tokens: int) -> None:
        real(request, num_tokens)
        self.stats["output_caching"] += 1
        if request.request_id in self.model.requests:
            self.model.cache_blocks(request.request_id, request.all_token_ids, num_tokens)

    def remove_skipped_blocks(self, real: Any, request_id: str, processed: int, *a: Any) -> None:
        real(request_id, processed, *a)
        if request_id in self.model.requests:
            self.model.remove_skipped_blocks(request_id, processed)

    def free(self, real: Any, request: Request) -> None:
        real(request)
        if request.request_id in self.model.requests:
            self.model.free(request.request_id)

    def take_kv_cache_block_copies(self, real: Any) -> Any:
        copies, retained = real()
        ours, self.retained = self.model.take_copies()
        assert ours == [(c.src_block_id, c.dst_block_id) for c in copies]
        assert self.retained == [b.block_id for b in retained]
        self.stats["copies"] += len(copies)
        return copies, retained

    def check_state(self) -> None:
        free = self.manager.block_pool.free_block_queue.get_all_free_blocks()
        assert self.model.free_queue == [b.block_id for b in free]
        for rid in self.model.requests:
            tables = [list(t) for t in self.manager.get_block_ids(rid)]
            assert self.model.requests[rid].tables == tables, rid


def _scheduler(cls: type, num_blocks: int, budget: int) -> Any:
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_num_seqs=4,
        max_num_batched_tokens=budget,
        max_model_len=1024,
        block_size=BLOCK,
        enable_prefix_caching=True,
    )
    groups = [KVCacheGroupSpec([f"l{i}"], _spec(k, BLOCK)) for i, k in enumerate(KINDS)]
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    scheduler = cls(
        vllm_config=peer.vllm_config,
        kv_cache_config=config,
        structured_output_manager=peer.scheduler.structured_output_manager,
        block_size=BLOCK,
        hash_block_size=HASH_BLOCK,
    )
    # The peer's stand-in model is not hybrid: turn on the split a hybrid model gets.
    scheduler.need_mamba_block_aligned_split = True
    scheduler.mamba_partial_cache_hit = True
    return scheduler


def run_conversations(cls: type, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    num_blocks = rng.choice((30, 60, 120))
    scheduler = _scheduler(cls, num_blocks, rng.choice((32, 48, 64)))
    mirror = Mirror(scheduler, num_blocks)
    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    hasher = kv_cache_utils.get_request_block_hasher(HASH_BLOCK, hash_fn, 0)
    conversations = [[rng.randrange(1000) for _ in range(rng.randrange(9, 70))] for _ in range(3)]
    # Under AsyncScheduler a step may be formed before the last one's output lands (two in
    # flight at most, as an engine with async scheduling runs them).
    depth = 2 if cls is AsyncScheduler else 1
    in_flight: list[tuple[Any, set[str]]] = []
    for step in range(rng.randrange(60, 120)):
        if rng.random() < 0.3:
            c = rng.randrange(len(conversations))
            conversations[c] += [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]
            params = SamplingParams(max_tokens=rng.randrange(1, 8))
            scheduler.add_request(
                Request(f"s{step}", list(conversations[c]), params, None, block_hasher=hasher)
            )
        out = scheduler.schedule()
        mirror.check_state()
        for rid, n in out.num_scheduled_tokens.items():
            request = scheduler.requests[rid]
            assert request.num_computed_tokens == mirror.model.requests[rid].num_computed, rid
            assert n > 0
        samples = {
            rid
            for rid in out.num_scheduled_tokens
            if scheduler.requests[rid].num_computed_tokens >= scheduler.requests[rid].num_tokens
        }
        in_flight.append((out, samples))
        while in_flight and (len(in_flight) >= depth or rng.random() < 0.5):
            done, sampled = in_flight.pop(0)
            scheduler.update_from_output(done, runner_output(scheduler, done, sampled))
            mirror.check_state()
    return mirror.stats


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("cls", [Scheduler, AsyncScheduler], ids=["sync", "async"])
def test_the_model_follows_vllms_schedulers_call_by_call(cls: type, seed: int) -> None:
    stats = run_conversations(cls, seed)
    assert stats["allocations"] > 0


@pytest.mark.parametrize("cls", [Scheduler, AsyncScheduler], ids=["sync", "async"])
def test_the_streams_hit_inside_blocks_and_copy(cls: type) -> None:
    """The comparisons above reach the rule under test: hits ending inside a block and the
    copies they make (review: the per-seed checks assert only that something ran)."""
    totals = [run_conversations(cls, seed) for seed in range(3)]
    assert sum(stats["partial_hits"] for stats in totals) > 0
    assert sum(stats["copies"] for stats in totals) > 0
