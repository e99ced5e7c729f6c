"""The core's HiSparse host publication (``tokenyard._core.HiSparseHostPublication``, Rust
``kv::HostPublication``) against the pure-Python reference model
(``hisparse_publication_model.HostPublication``, which agrees with vLLM 0.33's own
``KVCacheManager`` + ``HiSparseCoordinator``: tests/test_hisparse_host_publication.py, which
runs the core beside both). Seeded streams of admissions (whole or a first prefill chunk,
shared prefixes), later chunks, decode steps, acknowledgements in a random order, finishes
(some mid-prefill) and preemptions with admissions again; after every operation each
request's host table, the free queue in order, the published blocks, every block's
references and the write-backs planned must be equal. Runs without vLLM."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hisparse_publication_model import HostPublication

from tokenyard import errors
from tokenyard._core import HiSparseHostPublication

BLOCK_SIZE = 16
MAX_MODEL_LEN = 128


def acknowledge_core(
    core: HiSparseHostPublication, enqueued: dict[int, int], completed: dict[int, int]
) -> None:
    """vLLM's ``update_spills``: the live requests with landed pages publish in the order
    of a Python set of their ids built in transfer order (``_complete_host_writes``'s
    ``completed_request_ids``), which the core leaves to its caller."""
    order: set[str] = set()
    for request_id in core.acknowledge(enqueued, completed):
        order.add(request_id)
    core.publish_ready(list(order))


def core_state(core: HiSparseHostPublication, request_ids: list[str]) -> dict[str, Any]:
    return {
        "tables": {r: core.table(r) for r in request_ids},
        "free": core.free_blocks(),
        "published": core.published_blocks(),
    }


def model_state(model: HostPublication) -> dict[str, Any]:
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


def run(seed: int, host_num_blocks: int, operations: int = 300) -> dict[str, int]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(64)] for _ in range(3)]
    model = HostPublication(host_num_blocks, BLOCK_SIZE)
    core = HiSparseHostPublication(
        num_blocks=host_num_blocks,
        block_size=BLOCK_SIZE,
        max_spill_pages=MAX_MODEL_LEN // BLOCK_SIZE,
    )
    planned: list[int] = []
    preempted: dict[str, list[int]] = {}
    seen = dict.fromkeys(("hits", "refused", "acks", "finished_pending", "preempted"), 0)
    next_id = 0
    for step in range(operations):
        op = rng.random()
        before = set(model.transfers)
        prefilling = sorted(r for r, q in model.requests.items() if q.computed < len(q.tokens))
        decoding = sorted(
            r for r, q in model.requests.items() if q.computed == len(q.tokens) < MAX_MODEL_LEN - 1
        )
        if op < 0.3:
            if preempted and rng.random() < 0.5:
                request_id = rng.choice(sorted(preempted))
                tokens = preempted.pop(request_id)
            else:
                tokens = _prompt(rng, prefixes)
                request_id = f"r{next_id}"
                next_id += 1
            chunk = rng.choice([None, None, 16, 24, 40])
            hit = model.admit(request_id, tokens, chunk)
            assert core.admit(request_id, tokens, chunk) == hit, f"op {step}"
            if hit is None:
                preempted[request_id] = tokens
            seen["hits"] += bool(hit)
            seen["refused"] += hit is None
        elif op < 0.45 and prefilling:
            request_id = rng.choice(prefilling)
            chunk = rng.choice([8, 16, 24, 40])
            assert core.step(request_id, chunk) == model.step(request_id, chunk), f"op {step}"
        elif op < 0.55 and decoding:
            request_id = rng.choice(decoding)
            token = rng.randrange(1000, 5000)
            assert core.decode(request_id, token) == model.decode(request_id, token), f"op {step}"
        elif op < 0.8 and planned:
            done = sorted(rng.sample(planned, rng.randrange(1, len(planned) + 1)))
            planned = [t for t in planned if t not in done]
            model.acknowledge(done)
            counts = dict.fromkeys(done, 1)
            acknowledge_core(core, counts, counts)
            seen["acks"] += len(done)
        elif model.requests:
            request_id = rng.choice(sorted(model.requests))
            finished = rng.random() < 0.7
            if finished:
                seen["finished_pending"] += bool(model.requests[request_id].pending)
            else:
                seen["preempted"] += 1
                preempted[request_id] = model.requests[request_id].tokens
            model.finish(request_id, finished=finished)
            core.free(request_id, finished=finished)
        new = sorted(set(model.transfers) - before)
        transfers = core.take_transfers()
        assert [t for t, _ in transfers] == new, f"op {step}"
        assert [b for _, b in transfers] == [model.transfers[t][2] for t in new], f"op {step}"
        planned.extend(new)
        model.check()
        core.check()
        assert core_state(core, sorted(model.requests)) == model_state(model), f"op {step}"
        assert [core.ref_count(b) for b in range(host_num_blocks)] == model.ref, f"op {step}"
        assert core.has_pending_work() == bool(model.transfers), f"op {step}"
    return seen


@pytest.mark.parametrize("host_num_blocks", [12, 20, 40])
@pytest.mark.parametrize("seed", range(8))
def test_the_core_is_the_reference_model(seed: int, host_num_blocks: int) -> None:
    seen = run(seed, host_num_blocks)
    assert seen["acks"] > 0
    if host_num_blocks == 40:
        assert seen["hits"] > 0


def test_the_streams_reach_every_rule() -> None:
    totals: dict[str, int] = {}
    for seed in range(8):
        for host_num_blocks in (12, 20, 40):
            for key, value in run(seed, host_num_blocks).items():
                totals[key] = totals.get(key, 0) + value
    assert all(totals[k] > 0 for k in totals), totals


def test_a_transfer_waits_for_every_worker_it_was_enqueued_on() -> None:
    # vLLM's update_spills: the first enqueued count is what a transfer waits for, and
    # completions add up across reports (HiSparseConnectorWorkerMetadata.aggregate sums).
    core = HiSparseHostPublication(num_blocks=8, block_size=4, max_spill_pages=8)
    core.admit("a", list(range(9)))
    assert [t for t, _ in core.take_transfers()] == [0, 1]
    acknowledge_core(core, {0: 2, 1: 2}, {0: 1, 1: 2})
    assert core.published_blocks() == []
    acknowledge_core(core, {0: 9}, {0: 1})
    assert core.published_blocks() == [1, 2]
    assert core.hit_blocks(list(range(12))) == [1, 2]


def test_errors_name_the_field_and_value() -> None:
    with pytest.raises(errors.ConfigError, match="hisparse_host_num_blocks"):
        HiSparseHostPublication(num_blocks=1, block_size=4, max_spill_pages=8)
    core = HiSparseHostPublication(num_blocks=8, block_size=4, max_spill_pages=8)
    with pytest.raises(errors.UnknownRequestError, match="'b'"):
        core.step("b", 1)
    core.admit("a", [1, 2, 3])
    with pytest.raises(errors.InputError, match="request_id"):
        core.admit("a", [1, 2, 3])
    with pytest.raises(errors.InputError, match="enqueued"):
        core.acknowledge({-1: 1}, {})
