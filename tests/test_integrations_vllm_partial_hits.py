"""vLLM 0.33's fine-grained partial hash hits (``cache_config.prefix_match_unit`` below a
Mamba ``align`` block: ``partial_hash_hits_enabled`` in vllm/v1/core/kv_cache_utils.py)
against tokenyard: the core's pure pieces of the rule checked against vLLM's own functions
and managers, and the adapter's refusal of the layout by name (its KV groups do not serve
the copy-on-write yet), with vLLM's copies on that layout shown so the refusal is seen to
guard a real difference. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name, sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import (
    FullAttentionManager,
    MambaManager,
    SlidingWindowManager,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm_peer import VllmSchedulerPeer, runner_output

import tokenyard.kv as ty_kv
from tokenyard._core import fine_grained_hit, partial_hash_hits_enabled
from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler


def _vllm_spec(kind: str, block_size: int) -> Any:
    common = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1}
    if kind == "full":
        return FullAttentionSpec(dtype=torch.float16, **common)
    if kind == "window":
        return SlidingWindowSpec(sliding_window=64, dtype=torch.float16, **common)
    mode = "align" if kind == "mamba" else "none"
    return MambaSpec(
        block_size=block_size, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode=mode
    )


def _core_spec(kind: str) -> Any:
    if kind == "full":
        return ty_kv.FullAttentionSpec()
    if kind == "window":
        return ty_kv.SlidingWindowSpec(sliding_window=64)
    return ty_kv.MambaSpec(mamba_cache_mode="align" if kind == "mamba" else "none")


_MANAGERS = {"full": FullAttentionManager, "window": SlidingWindowManager, "mamba": MambaManager}


def test_the_on_rule_agrees_with_vllms_partial_hash_hits_enabled() -> None:
    rng = random.Random(7)
    seen = {True: 0, False: 0}
    for _ in range(300):
        kinds = [rng.choice(("full", "window", "mamba")) for _ in range(rng.randrange(1, 4))]
        hash_block = rng.choice((2, 4, 8))
        sizes = [hash_block * rng.choice((1, 2, 4)) for _ in kinds]
        groups = [
            KVCacheGroupSpec([f"layers.{i}"], _vllm_spec(k, s))
            for i, (k, s) in enumerate(zip(kinds, sizes, strict=True))
        ]
        managers = [_MANAGERS[k] for k in kinds]
        theirs = kv_cache_utils.partial_hash_hits_enabled(groups, hash_block, 1, managers)
        ours = partial_hash_hits_enabled([_core_spec(k) for k in kinds], sizes, hash_block)
        assert ours == theirs, (kinds, sizes, hash_block)
        seen[theirs] += 1
    assert min(seen.values()) >= 30, seen


def _request(prompt: list[int], hash_block: int) -> Request:
    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(hash_block, sha256)
    return Request("r", prompt, SamplingParams(max_tokens=1), None, block_hasher=hasher)


@pytest.mark.parametrize("seed", range(6))
def test_fine_grained_hits_agree_with_vllms_finders(seed: int) -> None:
    # A cache of random hash boundaries (each in its own block, as vLLM's
    # cache_partial_block registers them), looked up by vLLM's managers with
    # alignment_tokens the hash block size and by the core.
    rng = random.Random(seed)
    cases = 0
    for _ in range(60):
        hash_block = rng.choice((1, 2, 4))
        block = hash_block * rng.choice((2, 3, 4))
        mamba = rng.random() < 0.5
        drop = not mamba and rng.random() < 0.3
        prompt = [rng.randrange(50) for _ in range(rng.randrange(1, 8 * block))]
        request = _request(prompt, hash_block)
        num_hashes = len(request.block_hashes)
        pool = BlockPool(
            num_gpu_blocks=2 * num_hashes + 4, enable_caching=True, hash_block_size=hash_block
        )
        density = rng.choice((0.3, 0.7, 1.0))
        for i in range(num_hashes):
            if rng.random() < density:
                block_obj = pool.get_new_blocks(1)[0]
                pool.cache_partial_block(request, block_obj, (i + 1) * hash_block, 0, block)
        cached = []
        for h in request.block_hashes:
            found = pool.get_cached_block(h, [0])
            cached.append(found[0].block_id if found else None)
        max_length = rng.randrange(0, len(prompt) + 1)
        spec = _vllm_spec("mamba" if mamba else "full", block)
        manager = MambaManager if mamba else FullAttentionManager
        blocks, hit = manager.find_longest_cache_hit(
            block_hashes=request.block_hashes,
            max_length=max_length,
            kv_cache_group_ids=[0],
            block_pool=pool,
            kv_cache_spec=spec,
            drop_eagle_block=drop,
            alignment_tokens=hash_block,
        )
        ours = fine_grained_hit(
            mamba=mamba,
            block_size=block,
            hash_block_size=hash_block,
            cached=cached,
            max_length=max_length,
            drop_eagle_block=drop,
        )
        assert ours == ([b.block_id for b in blocks[0]], hit), (seed, mamba, block, hash_block)
        cases += hit % block != 0
    # Hits that end inside a block: what the rule adds.
    assert cases >= 5


def test_fine_grained_hit_refuses_a_block_not_finer_than_the_hash() -> None:
    with pytest.raises(ConfigError, match="block_size"):
        fine_grained_hit(mamba=True, block_size=4, hash_block_size=4, cached=[], max_length=0)


_HYBRID = ("full", "mamba")


def _pair(hash_block: int, block: int = 16) -> tuple[Any, ...]:
    """vLLM's Scheduler over full attention + Mamba align groups of ``block`` tokens, hashed
    at ``hash_block`` (the engine's ``prefix_match_unit``), and the peer."""
    peer = VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=4,
        max_num_batched_tokens=40,
        max_model_len=512,
        block_size=block,
        enable_prefix_caching=True,
    )
    groups = [
        KVCacheGroupSpec([f"layers.{i}"], _vllm_spec(k, block)) for i, k in enumerate(_HYBRID)
    ]
    config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)

    def build(cls: type) -> Any:
        return cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=config,
            structured_output_manager=peer.scheduler.structured_output_manager,
            block_size=block,
            hash_block_size=hash_block,
        )

    return build, peer


def test_a_prefix_match_unit_below_the_mamba_block_is_refused_by_name() -> None:
    build, _ = _pair(hash_block=4)
    with pytest.raises(ConfigError, match=r"hash_block_size: 4 .*partial_hash_hits_enabled") as e:
        build(TokenyardScheduler)
    assert e.value.field == "hash_block_size"
    assert "prefix_match_unit=16" in str(e.value)
    # At the Mamba block size vLLM hashes as before, and the adapter serves the layout.
    build, _ = _pair(hash_block=16)
    build(TokenyardScheduler)


def test_vllm_copies_shared_blocks_on_the_refused_layout() -> None:
    # What the refusal guards: on this layout vLLM 0.33 admits later turns of a
    # conversation with hits ending inside blocks and copies the shared blocks
    # (SchedulerOutput.kv_cache_block_copies); a scheduler without the rule would not.
    build, _ = _pair(hash_block=4)
    theirs = build(Scheduler)
    theirs.need_mamba_block_aligned_split = True
    theirs.mamba_partial_cache_hit = True
    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    hasher = kv_cache_utils.get_request_block_hasher(4, hash_fn, 0)
    rng = random.Random(1)
    # The first prompt's last hash boundary, 52, lies inside its fourth block.
    first = [rng.randrange(1000) for _ in range(55)]
    turns = [first, first + [rng.randrange(1000) for _ in range(20)]]
    copies, partial_hits = [], 0
    for step in range(60):
        if step in (0, 8):
            prompt = turns[step // 8]
            theirs.add_request(
                Request(f"t{step}", prompt, SamplingParams(max_tokens=3), None, block_hasher=hasher)
            )
        out = theirs.schedule()
        copies += list(out.kv_cache_block_copies or [])
        partial_hits += sum(r.num_computed_tokens % 16 != 0 for r in out.scheduled_new_reqs)
        theirs.update_from_output(out, runner_output(theirs, out))
    assert partial_hits == 1
    assert copies
