"""The reads ``SimpleCPUOffloadConnector`` makes of the adapter's GPU block pool view
(``_vllm_coordinator_view.BlockPoolView``) once they are answered from arrays and kept
(branch ``offspeed``): ``blocks`` (one sequence of the pool's views), ``ref_cnt`` in a
reading stretch (read once, dropped by the connector's ``touch`` and ``free_blocks``),
``free_block_queue.iter_blocks_after`` (found in the free ids) and ``block_hash`` (vLLM's
hash of a core hash, kept while the hash index's answers stay). Each is checked against the
core read afresh, on a pool part way through the seeded SimpleCPUOffloadConnector stream of
test_integrations_vllm_pool_connectors.py. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import test_integrations_vllm_pool_connectors as stream
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm_compare import runner_output

from tokenyard.integrations.vllm import TokenyardScheduler


def _midway(steps: int = 60, lazy: bool = False) -> Any:
    """The adapter with the connector after ``steps`` steps of the seed-0 stream."""
    peer = stream._peer(stream._simple_cpu(400, lazy), 40, events=False)
    scheduler = peer.build(TokenyardScheduler, stream._kv_cache_config(40))
    worker = stream._Worker()
    rng = random.Random(3)
    arrivals = stream._waves(0)
    for step in range(steps):
        for at, *args in arrivals:
            if at == step:
                scheduler.add_request(peer.make_request(*args))
        out = scheduler.schedule()
        worker.submit(out, step, (rng.randrange(3), rng.randrange(3)))
        output = runner_output(scheduler, out)
        output.kv_connector_output = worker.report(step)
        scheduler.update_from_output(out, output)
    return scheduler


def _core_refs(pool: Any) -> list[int]:
    return [int(c) for c in pool._scheduler._core.block_ref_counts()]


def test_blocks_is_one_sequence_of_the_pools_views() -> None:
    pool = _midway(steps=5).kv_cache_manager.block_pool
    blocks = pool.blocks
    assert blocks is pool.blocks
    assert len(blocks) == pool.num_gpu_blocks
    assert blocks[0] is pool.null_block
    assert blocks[-1] is blocks[len(blocks) - 1]
    assert [b.block_id for b in blocks[2:5]] == [2, 3, 4]
    assert list(blocks) == blocks[:]
    for i in (len(blocks), -len(blocks) - 1):
        with pytest.raises(IndexError, match="out of range"):
            blocks[i]


def test_ref_counts_in_a_reading_stretch_follow_touch_and_free() -> None:
    pool = _midway().kv_cache_manager.block_pool
    refs = _core_refs(pool)
    block = next(b for b in pool.blocks[1:] if refs[b.block_id - 1] == 0)
    with pool.reading():
        assert block.ref_cnt == 0
        pool.touch([block])
        assert block.ref_cnt == 1 == _core_refs(pool)[block.block_id - 1]
        pool.free_blocks([block])
        assert block.ref_cnt == 0
    assert [b.ref_cnt for b in pool.blocks[1:]] == _core_refs(pool)


def test_iter_blocks_after_walks_the_free_queue_from_a_cursor() -> None:
    pool = _midway(lazy=True).kv_cache_manager.block_pool
    queue = pool.free_block_queue
    free = queue.get_all_free_blocks()
    assert len(free) > 3
    assert list(queue.iter_blocks_after(None)) == free
    for i, cursor in enumerate(free):
        assert list(queue.iter_blocks_after(cursor)) == free[i + 1 :]
    held = next(b for b in pool.blocks[1:] if b not in free)
    assert list(queue.iter_blocks_after(held)) == []


def test_block_hash_follows_the_index_when_a_hash_is_entered_anew() -> None:
    scheduler = _midway()
    pool = scheduler.kv_cache_manager.block_pool
    index = scheduler._block_hash_index
    hashes = scheduler._core.block_hashes()
    at, core_hash = next((i, h) for i, h in enumerate(hashes) if h is not None)
    block = pool.blocks[at + 1]
    vllm_hash, num_tokens = index.vllm_hash(core_hash)
    assert block.block_hash == make_block_hash_with_group_id(vllm_hash, 0)
    # Another request's vLLM hash for the same core block (a request entered later wins).
    other = b"\x01" * len(vllm_hash)
    whole = num_tokens // scheduler.block_size
    index.index(
        SimpleNamespace(block_hashes=[b"\x02" * len(vllm_hash)] * (whole - 1) + [other]),
        [0] * (whole - 1) + [core_hash],
    )
    assert block.block_hash == make_block_hash_with_group_id(other, 0)
    with pool.reading():
        assert block.block_hash == make_block_hash_with_group_id(other, 0)
        assert block.block_hash_num_tokens == num_tokens
