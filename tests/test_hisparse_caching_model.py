"""The reference model of the HiSparse connector's scheduler side with prefix caching on
(``hisparse_caching_model``) against vLLM 0.33's own ``KVCacheManager`` (``enable_caching``)
and ``HiSparseCoordinator`` on its HiSparse layout (host source, indexer, one resident and
one hot group), driven as vLLM's scheduler and the connector drive them: each admission
looks its hit up (``get_computed_blocks``) and allocates with it, ``advance_scheduled``
after each allocation, the step's write-backs drained (``build_offload_command``), worker
acknowledgements through ``update_spills`` in a seeded random order, requests finished or
preempted (and admitted again: their own published pages are hit). Prompts share seeded
prefixes so admissions hit pages other requests published. After every operation: each
admission's hit, each request's host, indexer and hot tables and its resident row with
residency changes applied, both free queues in order, the step's write-backs (transfer id,
host block, resident block), the blocks held as GPU copies of published pages, and
``has_pending_reclamation``; vLLM plans no host copy-on-write. Needs vLLM (the bench
venv); skipped elsewhere."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from hisparse_caching_model import CachingResidency
from test_integrations_vllm_hisparse_groups import layout
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.hisparse.coordinator import get_hisparse_coordinator
from vllm.v1.request import RequestStatus
from vllm_compare import BLOCK_SIZE
from vllm_peer import VllmSchedulerPeer

MAX_MODEL_LEN = 128


class _Vllm:
    def __init__(self, num_blocks: int, host_num_blocks: int) -> None:
        self.manager = KVCacheManager(
            layout(num_blocks, host_num_blocks),
            max_model_len=MAX_MODEL_LEN,
            scheduler_block_size=BLOCK_SIZE,
            hash_block_size=BLOCK_SIZE,
            enable_caching=True,
        )
        self.coordinator = get_hisparse_coordinator(self.manager)
        self.host = self.coordinator.get_host_block_pool()
        self.resident = self.coordinator.resident_managers[0]
        self.peer = VllmSchedulerPeer(
            num_blocks=num_blocks,
            block_size=BLOCK_SIZE,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=8,
            max_num_batched_tokens=MAX_MODEL_LEN,
        )
        self.requests: dict[str, Any] = {}
        self.preempted: dict[str, Any] = {}

    def admit(self, request_id: str, tokens: list[int], max_new_tokens: int | None) -> int | None:
        request = self.preempted.pop(request_id, None)
        if request is None:
            request = self.peer.make_request(request_id, tokens, 1)
        request.status = RequestStatus.WAITING
        blocks, hit, _ = self.manager.get_computed_blocks(request)
        rest = request.num_tokens - hit
        new = rest if max_new_tokens is None else min(rest, max_new_tokens)
        if self.manager.allocate_slots(request, new, hit, blocks) is None:
            self.preempted[request_id] = request
            return None
        request.num_computed_tokens = hit + new
        self.requests[request_id] = request
        self._advance(request)
        return hit

    def step(self, request_id: str, num_new_tokens: int) -> bool:
        request = self.requests[request_id]
        new = min(num_new_tokens, request.num_tokens - request.num_computed_tokens)
        if self.manager.allocate_slots(request, new) is None:
            return False
        request.num_computed_tokens += new
        self._advance(request)
        return True

    def decode(self, request_id: str, token: int) -> bool:
        self.requests[request_id].append_output_token_ids(token)
        return self.step(request_id, 1)

    def _advance(self, request: Any) -> None:
        self.coordinator.advance_scheduled([(request.request_id, request.num_computed_tokens)])

    def take_transfers(self) -> list[tuple[int, int, int]]:
        command = self.coordinator.build_offload_command()
        return [
            (t.transfer_id, t.host_block_id, t.resident_block_ids[0])
            for t in command.page_transfers
        ]

    def acknowledge(self, transfer_ids: list[int]) -> None:
        counts = dict.fromkeys(transfer_ids, 1)
        self.coordinator.update_spills(counts, counts)

    def finish(self, request_id: str, *, finished: bool) -> None:
        request = self.requests.pop(request_id)
        request.status = RequestStatus.FINISHED_STOPPED if finished else RequestStatus.PREEMPTED
        self.manager.free(request)
        if not finished:
            request.num_computed_tokens = 0
            self.preempted[request_id] = request

    def state(self) -> dict[str, Any]:
        tables = {}
        for request_id in self.requests:
            source, indexer, _, hot = self.manager.get_block_ids(request_id)
            row = [b.block_id for b in self.resident.get_residency_row(request_id)]
            tables[request_id] = (list(source), list(indexer), row, list(hot))
        return {
            "tables": tables,
            "free": [
                b.block_id for b in self.manager.block_pool.free_block_queue.get_all_free_blocks()
            ],
            "host_free": [b.block_id for b in self.host.free_block_queue.get_all_free_blocks()],
            "copies": sorted(b.block_id for c in self.coordinator.copies.values() for b in c),
        }


def _model_state(model: CachingResidency) -> dict[str, Any]:
    return {
        "tables": {
            r: (list(q.host), list(q.indexer), list(q.resident), list(q.hot))
            for r, q in model.requests.items()
        },
        "free": list(model.device.free),
        "host_free": list(model.host.free),
        "copies": sorted(model.copies.values()),
    }


def _prompt(rng: random.Random, prefixes: list[list[int]]) -> list[int]:
    """A seeded shared prefix (or none), cut at a random length, then fresh tokens."""
    prefix = rng.choice(prefixes)[: rng.randrange(0, 97)] if rng.random() < 0.8 else []
    return prefix + [rng.randrange(1000, 5000) for _ in range(rng.randrange(1, 40))]


def run(
    seed: int, num_blocks: int, host_num_blocks: int, operations: int = 200, model: Any = None
) -> dict[str, int]:
    rng = random.Random(seed)
    theirs = _Vllm(num_blocks, host_num_blocks)
    ours = (model or CachingResidency)(
        num_blocks,
        host_num_blocks,
        BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        max_admission_blocks=theirs.resident.max_admission_blocks_per_request,
    )
    prefixes = [[rng.randrange(1000, 5000) for _ in range(96)] for _ in range(3)]
    planned: list[int] = []
    preempted: dict[str, list[int]] = {}
    seen = dict.fromkeys(("refused", "acks", "hits", "adopted", "preempted", "detached"), 0)
    next_id = 0
    for step in range(operations):
        op = rng.random()
        prefilling = sorted(r for r, q in ours.requests.items() if q.computed < len(q.tokens))
        decoding = sorted(
            r for r, q in ours.requests.items() if q.computed == len(q.tokens) < MAX_MODEL_LEN - 1
        )
        if op < 0.25:
            if preempted and rng.random() < 0.5:
                request_id = rng.choice(sorted(preempted))
                tokens = preempted.pop(request_id)
            else:
                tokens = _prompt(rng, prefixes)
                request_id = f"r{next_id}"
                next_id += 1
            chunk = rng.choice([None, None, 16, 24, 40])
            hit = theirs.admit(request_id, tokens, chunk)
            assert ours.admit(request_id, tokens, chunk) == hit, f"op {step}"
            if hit is None:
                preempted[request_id] = tokens
                seen["refused"] += 1
            else:
                seen["hits"] += hit > 0
        elif op < 0.4 and prefilling:
            request_id = rng.choice(prefilling)
            chunk = rng.choice([8, 16, 24, 40])
            done = theirs.step(request_id, chunk)
            assert ours.step(request_id, chunk) == done, f"op {step}"
        elif op < 0.6 and decoding:
            request_id = rng.choice(decoding)
            for _ in range(rng.randrange(1, 20)):
                if request_id not in ours.requests:
                    break
                request = ours.requests[request_id]
                if request.computed != len(request.tokens) or request.computed >= MAX_MODEL_LEN - 1:
                    break
                token = rng.randrange(1000, 5000)
                done = theirs.decode(request_id, token)
                assert ours.decode(request_id, token) == done, f"op {step}"
                transfers = theirs.take_transfers()
                assert ours.take_transfers() == transfers, f"op {step}"
                planned.extend(t for t, _, _ in transfers)
                if not done:
                    break
        elif op < 0.85 and planned:
            done_ids = sorted(rng.sample(planned, rng.randrange(1, len(planned) + 1)))
            planned = [t for t in planned if t not in done_ids]
            theirs.acknowledge(done_ids)
            ours.acknowledge(done_ids)
            seen["acks"] += len(done_ids)
        elif ours.requests:
            request_id = rng.choice(sorted(ours.requests))
            finished = rng.random() < 0.6
            if not finished:
                seen["preempted"] += 1
                preempted[request_id] = list(ours.requests[request_id].tokens)
            theirs.finish(request_id, finished=finished)
            ours.finish(request_id, finished=finished)
        transfers = theirs.take_transfers()
        assert ours.take_transfers() == transfers, f"op {step}"
        planned.extend(t for t, _, _ in transfers)
        ours.check()
        state = theirs.state()
        assert _model_state(ours) == state, f"op {step}"
        reclaim = theirs.coordinator.has_pending_reclamation()
        assert ours.has_pending_reclamation() == reclaim, f"op {step}"
        # Hits end on block boundaries (partial hash hits are off on this layout), so vLLM
        # plans no host copy-on-write, which the model leaves out.
        assert theirs.coordinator.take_host_block_copies() == (), f"op {step}"
    seen["adopted"] = ours.num_adopted
    seen["detached"] = ours.num_detached
    return seen


@pytest.mark.parametrize(("num_blocks", "host_num_blocks"), [(40, 40), (60, 30), (100, 60)])
@pytest.mark.parametrize("seed", range(8))
def test_the_caching_model_is_vllms(seed: int, num_blocks: int, host_num_blocks: int) -> None:
    seen = run(seed, num_blocks, host_num_blocks)
    # Every stream hits published pages, reads some of them from GPU copies again, and
    # keeps a finished request's publication past its free (summed over its operations).
    assert seen["hits"] > 0
    assert seen["adopted"] > 0
    assert seen["detached"] > 0
    assert seen["acks"] > 0


class _NoAdoption(CachingResidency):
    """Hits never read GPU copies again (their pages stay on host)."""

    def _adopt(self, request: Any) -> None:
        request.pages_to_adopt = 0


class _EagerPublication(CachingResidency):
    """The host publishes every computed page at once, not waiting for its write-back."""

    def _publish_ready(self, request: Any) -> None:
        request.ready = max(request.ready, request.computed // self.block_size)
        super()._publish_ready(request)


class _NoDetachedPublication(CachingResidency):
    """A finished request's publication goes with it, writes pending or not."""

    def finish(self, request_id: str, *, finished: bool) -> None:
        super().finish(request_id, finished=False)


class _HostOnlyHits(CachingResidency):
    """Hits as long as the host's published run, whatever the indexer still caches (the
    indexer's blocks past its own run are fresh ones)."""

    def _hit(self, request: Any) -> tuple[list[int], list[int]]:
        host: list[int] = []
        for page in range((len(request.tokens) - 1) // self.block_size):
            block = self.host.lookup(request.key(page, self.block_size))
            if block is None:
                break
            host.append(block)
        _, indexer = super()._hit(request)
        fresh = [b for b in self.device.free if b not in self.device.key]
        return host, indexer + fresh[: len(host) - len(indexer)]


class _NoHotAtResume(CachingResidency):
    """A hit does not ask for the hot region (only a full window or a low pool do)."""

    def _add_hit(self, request: Any, host_hit: list[int], indexer_hit: list[int]) -> None:
        required = request.hot_required
        super()._add_hit(request, host_hit, indexer_hit)
        request.hot_required = required
        request.hot_seen = True


@pytest.mark.parametrize(
    "variant", [_NoAdoption, _EagerPublication, _NoDetachedPublication, _NoHotAtResume]
)
def test_a_variant_of_the_model_parts_from_vllm(variant: Any) -> None:
    failures = 0
    for seed in range(3):
        try:
            run(seed, 40, 40, model=variant)
        except AssertionError:
            failures += 1
    assert failures == 3, f"{variant.__name__} agreed with vLLM on {3 - failures} of 3 streams"


def _host_outlives_indexer(model: Any) -> tuple[int | None, int]:
    """Request ``a`` publishes four pages and finishes; fresh requests admitted and finished
    one after another push its cached indexer blocks out of the device pool (hashed blocks
    queue at the tail) while its host pages stay published. Returns ``b``'s hit on ``a``'s
    prefix and the host's published run of it."""
    theirs = _Vllm(40, 60)
    ours = model(
        40,
        60,
        BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        max_admission_blocks=theirs.resident.max_admission_blocks_per_request,
    )

    def both(operation: str, *args: Any, **options: Any) -> Any:
        answer = getattr(theirs, operation)(*args, **options)
        assert getattr(ours, operation)(*args, **options) == answer, operation
        transfers = theirs.take_transfers()
        assert ours.take_transfers() == transfers, operation
        done = [t for t, _, _ in transfers]
        theirs.acknowledge(done)
        ours.acknowledge(done)
        assert _model_state(ours) == theirs.state(), operation
        return answer

    prefix = [1000 + i for i in range(4 * BLOCK_SIZE)]
    both("admit", "a", [*prefix, 1, 2, 3], None)
    both("finish", "a", finished=True)
    for i in range(6):
        both("admit", f"f{i}", [5000 + 200 * i + j for j in range(3 * BLOCK_SIZE + 3)], None)
        both("finish", f"f{i}", finished=True)
    keys = [tuple(prefix[: (page + 1) * BLOCK_SIZE]) for page in range(4)]
    host_run = sum(1 for key in keys if ours.host.lookup(key) is not None)
    return both("admit", "b", [*prefix, 7, 8, 9], None), host_run


def test_a_hit_is_as_long_as_both_the_host_and_the_indexer_keep() -> None:
    # vLLM's hit is the shorter of the host's published run and the indexer's cached run
    # (find_longest_cache_hit reconciles the two full-attention groups).
    hit, host_run = _host_outlives_indexer(CachingResidency)
    assert (hit, host_run) == (BLOCK_SIZE, 4)
    with pytest.raises(AssertionError):
        _host_outlives_indexer(_HostOnlyHits)
