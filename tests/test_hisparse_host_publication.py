"""The reference model of vLLM 0.33's HiSparse host publication (``hisparse_publication_model``)
against vLLM's own ``KVCacheManager`` and ``HiSparseCoordinator`` with prefix caching on,
driven as the HiSparse connector's scheduler side drives them (``advance_scheduled`` after
each allocation, the step's transfers drained with ``build_offload_command``, worker
acknowledgements through ``update_spills``), with shared prefixes, chunked prefills, finishes
mid-prefill, decode steps, preemptions and admissions again, and acknowledgements in a
seeded random order. After every operation: each
request's host table, the host pool's free queue in order, the published host blocks, and
the hit of each admission. This checks the
rule docs/integrations.md writes down. The core's port of it
(``tokenyard._core.HiSparseHostPublication``, Rust ``kv::HostPublication``) runs beside
both, acknowledged with the same counts: its tables, free queue, published blocks, hits and
each step's planned write-backs (ids and host blocks) must be vLLM's too. The adapter does
not drive it yet (the HiSparse connector is refused). Needs vLLM (the bench venv); skipped
elsewhere."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from hisparse_publication_model import HostPublication
from test_hisparse_publication_core import acknowledge_core, core_state
from test_integrations_vllm_hisparse_groups import layout
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.hisparse.coordinator import get_hisparse_coordinator
from vllm.v1.request import RequestStatus
from vllm_compare import BLOCK_SIZE
from vllm_peer import VllmSchedulerPeer

from tokenyard._core import HiSparseHostPublication

MAX_MODEL_LEN = 128


class _Vllm:
    """vLLM's manager on the HiSparse layout, a device pool large enough never to evict."""

    def __init__(self, host_num_blocks: int) -> None:
        self.manager = KVCacheManager(
            layout(2000, host_num_blocks),
            max_model_len=MAX_MODEL_LEN,
            scheduler_block_size=BLOCK_SIZE,
            hash_block_size=BLOCK_SIZE,
            enable_caching=True,
        )
        self.coordinator = get_hisparse_coordinator(self.manager)
        self.host = self.coordinator.get_host_block_pool()
        self.peer = VllmSchedulerPeer(
            num_blocks=2000,
            block_size=BLOCK_SIZE,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=8,
            max_num_batched_tokens=MAX_MODEL_LEN,
        )
        self.requests: dict[str, Any] = {}
        self.preempted: dict[str, Any] = {}
        # transfer id -> the host block its write-back fills
        self.host_blocks: dict[int, int] = {}

    def admit(
        self, request_id: str, tokens: list[int], max_new_tokens: int | None
    ) -> tuple[int | None, list[int]]:
        request = self.preempted.pop(request_id, None)
        if request is None:
            request = self.peer.make_request(request_id, tokens, 1)
        request.status = RequestStatus.WAITING
        blocks, num_hit, _ = self.manager.get_computed_blocks(request)
        new = len(tokens) - num_hit
        if max_new_tokens is not None:
            new = min(new, max_new_tokens)
        allocated = self.manager.allocate_slots(
            request, new, num_new_computed_tokens=num_hit, new_computed_blocks=blocks
        )
        if allocated is None:
            self.preempted[request_id] = request
            return None, []
        request.num_computed_tokens = num_hit + new
        self.requests[request_id] = request
        return num_hit, self._advance(request)

    def step(self, request_id: str, num_new_tokens: int) -> tuple[bool, list[int]]:
        request = self.requests[request_id]
        new = min(num_new_tokens, request.num_tokens - request.num_computed_tokens)
        if self.manager.allocate_slots(request, new) is None:
            return False, []
        request.num_computed_tokens += new
        return True, self._advance(request)

    def decode(self, request_id: str, token: int) -> tuple[bool, list[int]]:
        # The token the last step sampled joins the request (its block hashes follow).
        request = self.requests[request_id]
        request.append_output_token_ids(token)
        return self.step(request_id, 1)

    def _advance(self, request: Any) -> list[int]:
        """The HiSparse connector's per-step work for the request (build_connector_meta)."""
        self.coordinator.advance_scheduled([(request.request_id, request.num_computed_tokens)])
        command = self.coordinator.build_offload_command()
        self.host_blocks.update((t.transfer_id, t.host_block_id) for t in command.page_transfers)
        return [t.transfer_id for t in command.page_transfers]

    def acknowledge(self, transfer_ids: list[int]) -> None:
        counts = dict.fromkeys(transfer_ids, 1)
        self.coordinator.update_spills(counts, counts)

    def finish(self, request_id: str, *, finished: bool = True) -> None:
        request = self.requests.pop(request_id)
        request.status = RequestStatus.FINISHED_STOPPED if finished else RequestStatus.PREEMPTED
        self.manager.free(request)
        if not finished:
            # vLLM's _preempt_request: the same Request waits again, computing from 0.
            request.num_computed_tokens = 0
            self.preempted[request_id] = request

    def state(self) -> dict[str, Any]:
        return {
            "tables": {r: list(self.manager.get_block_ids(r)[0]) for r in self.requests},
            "free": [b.block_id for b in self.host.free_block_queue.get_all_free_blocks()],
            "published": sorted(b.block_id for b in self.host.blocks if b.block_hash is not None),
        }


def _model_state(model: HostPublication) -> dict[str, Any]:
    return {
        "tables": {r: list(q.table) for r, q in model.requests.items()},
        "free": list(model.free),
        "published": sorted(b for b in range(model.num_blocks) if model.page_of[b]),
    }


def _prompt(rng: random.Random, prefixes: list[list[int]]) -> list[int]:
    prefix = rng.choice(prefixes)[: rng.choice([0, 16, 32, 48, 64])]
    return (prefix + [rng.randrange(1000, 5000) for _ in range(rng.randrange(1, 60))])[
        :MAX_MODEL_LEN
    ]


def run(seed: int, host_num_blocks: int, operations: int = 200) -> dict[str, int]:
    """Random admissions (whole or a first prefill chunk), later chunks, decode steps,
    acknowledgements, finishes (some mid-prefill) and preemptions (the request admitted
    again later) on both; returns what happened."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(64)] for _ in range(3)]
    theirs, ours = _Vllm(host_num_blocks), HostPublication(host_num_blocks, BLOCK_SIZE)
    core = HiSparseHostPublication(
        num_blocks=host_num_blocks,
        block_size=BLOCK_SIZE,
        max_spill_pages=MAX_MODEL_LEN // BLOCK_SIZE,
    )
    planned: list[int] = []
    seen = dict.fromkeys(
        ("hits", "refused", "acks", "evictable_hits", "chunks", "aborted_prefills"),
        0,
    ) | {"preempted": 0, "readmitted": 0, "decodes": 0}
    preempted: dict[str, list[int]] = {}
    next_id = 0
    for step in range(operations):
        op = rng.random()
        known = set(theirs.host_blocks)
        prefilling = sorted(r for r, q in ours.requests.items() if q.computed < len(q.tokens))
        decoding = sorted(
            r for r, q in ours.requests.items() if q.computed == len(q.tokens) < MAX_MODEL_LEN - 1
        )
        if op < 0.3:
            if preempted and rng.random() < 0.5:
                request_id = rng.choice(sorted(preempted))
                tokens = preempted.pop(request_id)
                seen["readmitted"] += 1
            else:
                tokens = _prompt(rng, prefixes)
                request_id = f"r{next_id}"
                next_id += 1
            chunk = rng.choice([None, None, 16, 24, 40])
            evictable = sum(ours.ref[b] == 0 for b in ours.hit_pages(tokens))
            hit, transfers = theirs.admit(request_id, tokens, chunk)
            assert core.hit_blocks(tokens) == ours.hit_pages(tokens), f"op {step}"
            assert ours.admit(request_id, tokens, chunk) == hit, f"op {step}"
            assert core.admit(request_id, tokens, chunk) == hit, f"op {step}"
            if hit is None:
                # Refused: it may be tried again later (vLLM keeps its Request waiting).
                preempted[request_id] = tokens
            planned.extend(transfers)
            seen["hits"] += bool(hit)
            seen["refused"] += hit is None
            seen["evictable_hits"] += bool(hit and evictable)
        elif op < 0.45 and prefilling:
            request_id = rng.choice(prefilling)
            chunk = rng.choice([8, 16, 24, 40])
            done, transfers = theirs.step(request_id, chunk)
            assert ours.step(request_id, chunk) == done, f"op {step}"
            assert core.step(request_id, chunk) == done, f"op {step}"
            planned.extend(transfers)
            seen["chunks"] += 1
        elif op < 0.55 and decoding:
            request_id = rng.choice(decoding)
            token = rng.randrange(1000, 5000)
            done, transfers = theirs.decode(request_id, token)
            assert ours.decode(request_id, token) == done, f"op {step}"
            assert core.decode(request_id, token) == done, f"op {step}"
            planned.extend(transfers)
            seen["decodes"] += 1
        elif op < 0.8 and planned:
            done_ids = sorted(rng.sample(planned, rng.randrange(1, len(planned) + 1)))
            planned = [t for t in planned if t not in done_ids]
            theirs.acknowledge(done_ids)
            ours.acknowledge(done_ids)
            counts = dict.fromkeys(done_ids, 1)
            acknowledge_core(core, counts, counts)
            seen["acks"] += len(done_ids)
        elif ours.requests:
            request_id = rng.choice(sorted(ours.requests))
            finished = rng.random() < 0.7
            if finished:
                seen["aborted_prefills"] += request_id in prefilling
            else:
                seen["preempted"] += 1
                preempted[request_id] = ours.requests[request_id].tokens
            theirs.finish(request_id, finished=finished)
            ours.finish(request_id, finished=finished)
            core.free(request_id, finished=finished)
        ours.check()
        core.check()
        assert _model_state(ours) == theirs.state(), f"op {step}"
        assert core_state(core, sorted(theirs.requests)) == theirs.state(), f"op {step}"
        transfers = core.take_transfers()
        new = sorted(set(theirs.host_blocks) - known)
        assert transfers == [(t, theirs.host_blocks[t]) for t in new], f"op {step}"
        assert core.has_pending_work() == theirs.coordinator.has_pending_work(), f"op {step}"
    return seen


@pytest.mark.parametrize("host_num_blocks", [12, 20, 40])
@pytest.mark.parametrize("seed", range(8))
def test_the_reference_model_is_vllms_host_publication(seed: int, host_num_blocks: int) -> None:
    seen = run(seed, host_num_blocks)
    assert seen["acks"] > 0
    if host_num_blocks == 40:
        assert seen["hits"] > 0


def test_write_backs_past_max_spill_pages_wait_for_the_next_step() -> None:
    """vLLM's ``plan_prefix_materialization`` plans at most ``max_model_len // block_size``
    (here 8) write-backs between two offload commands, over all the requests one step
    advances; the core's cap counts them the same way."""
    theirs = _Vllm(40)
    core = HiSparseHostPublication(
        num_blocks=40, block_size=BLOCK_SIZE, max_spill_pages=MAX_MODEL_LEN // BLOCK_SIZE
    )
    prompts = {f"r{i}": [1000 * i + t for t in range(70)] for i in range(3)}
    for request_id, tokens in prompts.items():
        request = theirs.peer.make_request(request_id, tokens, 1)
        assert theirs.manager.allocate_slots(request, len(tokens)) is not None
        request.num_computed_tokens = len(tokens)
        assert core.admit(request_id, tokens) == 0
    expected = []
    for _ in range(2):
        theirs.coordinator.advance_scheduled([(r, 70) for r in prompts])
        command = theirs.coordinator.build_offload_command()
        expected.append([(t.transfer_id, t.host_block_id) for t in command.page_transfers])
    assert [len(e) for e in expected] == [8, 4]
    assert core.take_transfers() == expected[0]
    # The next step: each scheduled request is advanced again (a decode, here a chunk of
    # nothing left), and the third one's pages are planned.
    for request_id in prompts:
        assert core.step(request_id, 1)
    assert core.take_transfers() == expected[1]
    assert core.has_pending_host_reclamation() is False
