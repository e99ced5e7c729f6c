"""tokenyard.integrations.vllm with a multi-module MTP drafter's re-prefillable tokens beside
a Mamba ``align`` group (refused before): vLLM 0.33's ``KVCacheCoordinator`` reads
``num_reprefillable_tokens = num_prefill_lookahead - 1`` once, and under EAGLE's drop every
group it flags (all of them, Mamba included, when the KV cache config flags none) caches
only finalized tokens, up to one block past their aligned part
(``HybridKVCacheCoordinator.get_num_cacheable_tokens``); the Mamba split and the drafter's
prefill look-ahead act as they do without the lag. Seeded streams with shared prefixes
against vLLM's ``Scheduler`` (``use_multi_module_mtp`` answering true over the EAGLE stub,
as tests/test_integrations_vllm_eagle_groups.py does), every step's blocks per group and the
tables after it compared. Bench venv only (vLLM 0.33); skipped elsewhere.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))
sys.path.insert(0, str(Path(__file__).parent))

import torch
from test_integrations_vllm_mamba_connector import _groups, _stream_pair
from vllm.config import SpeculativeConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm_compare import block_digest, compare_stream, seeded_arrivals
from vllm_peer import VllmSchedulerPeer, runner_output

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler

MTP = {
    "speculative_method": "eagle",
    "num_speculative_tokens": 3,
    "disable_lookahead_block_hashes": True,
}


@pytest.fixture(autouse=True)
def _multi_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SpeculativeConfig, "use_multi_module_mtp", lambda self: True)


@pytest.mark.parametrize(
    ("seed", "num_blocks"), [*((i, 160) for i in range(6)), *((i, 40) for i in range(6, 12))]
)
def test_reprefillable_tokens_beside_mamba_align_match_vllm(seed: int, num_blocks: int) -> None:
    theirs, ours, peer = _stream_pair(num_blocks, max_num_batched_tokens=64, **MTP)
    assert peer.vllm_config.num_prefill_lookahead_tokens == 3
    assert theirs.kv_cache_manager.coordinator.num_reprefillable_tokens == 2
    arrivals = seeded_arrivals(
        random.Random(seed),
        prefix_tokens=96,
        shared=(0, 16, 48, 96),
        tail_max=120,
        max_tokens=24,
        max_prompt=300,
    )
    stream = compare_stream(
        theirs,
        ours,
        arrivals,
        peer.make_request,
        digest=lambda out: block_digest(out, finished=False),
    )
    assert stream.steps > 0


@pytest.mark.parametrize("seed", range(6))
def test_reprefillable_tokens_beside_mamba_align_match_vllms_async_scheduler(seed: int) -> None:
    # The same under AsyncScheduler (each step updated before the next is formed), over a
    # tighter cache of 60 blocks.
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from tokenyard.integrations.vllm import AsyncTokenyardScheduler

    peer = VllmSchedulerPeer(
        num_blocks=60, max_num_seqs=4, max_model_len=512, max_num_batched_tokens=64, **MTP
    )
    peer.vllm_config.cache_config.mamba_cache_mode = "align"
    config = KVCacheConfig(num_blocks=60, kv_cache_tensors=[], kv_cache_groups=_groups())
    pair = [peer.build(cls, config) for cls in (AsyncScheduler, AsyncTokenyardScheduler)]
    arrivals = seeded_arrivals(
        random.Random(seed),
        prefix_tokens=96,
        shared=(0, 16, 48, 96),
        tail_max=120,
        max_tokens=24,
        max_prompt=300,
    )
    compare_stream(
        *pair, arrivals, peer.make_request, digest=lambda out: block_digest(out, finished=False)
    )


def _checkpoint_groups() -> list[Any]:
    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    mamba = MambaSpec(
        block_size=16,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=1,
        prefill_checkpoint_alignment=1,
    )
    return [KVCacheGroupSpec(["fa"], fa), KVCacheGroupSpec(["mamba"], mamba)]


def test_a_mamba_prefill_checkpoint_block_beside_the_lag_is_refused_by_name() -> None:
    # vLLM keys a Mamba prefill checkpoint block at its position whatever the lag
    # (MambaManager._cache_partial_tail_block's checkpoint branch ignores num_tokens); the
    # core caches it with the lag, and the two part on streams (seed 3 of the stream above
    # with such a group differs at step 20): refused, naming the field.
    peer = VllmSchedulerPeer(
        num_blocks=120, max_num_seqs=4, max_model_len=512, max_num_batched_tokens=64, **MTP
    )
    peer.vllm_config.cache_config.mamba_cache_mode = "align"
    config = KVCacheConfig(
        num_blocks=120, kv_cache_tensors=[], kv_cache_groups=_checkpoint_groups()
    )
    peer.build(Scheduler, config)
    with pytest.raises(ConfigError, match="num_prefill_lookahead") as err:
        peer.build(TokenyardScheduler, config)
    assert err.value.field == "num_prefill_lookahead"


def _hit_after(cls: type, prompt: list[int], mtp: bool) -> int:
    """The prefix hit of ``prompt`` once a request with it has run to its end."""
    options = MTP if mtp else {**MTP, "num_speculative_tokens": 1}
    theirs, ours, peer = _stream_pair(160, max_num_batched_tokens=256, **options)
    scheduler = theirs if cls is Scheduler else ours
    scheduler.add_request(peer.make_request("a", prompt, 1))
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        scheduler.update_from_output(out, runner_output(scheduler, out))
    hit: int = scheduler.kv_cache_manager.get_computed_blocks(peer.make_request("b", prompt, 1))[1]
    return hit


def test_the_lag_loses_the_mamba_state_at_the_chunk_end_as_vllm() -> None:
    # A 97-token prompt under the drop: the split ends its first chunk at 80 (the last
    # reusable state, a block back for the drop). Without the lag the state at 80 is cached
    # and the hit is 80; with 2 re-prefillable tokens only 78 tokens are finalized then, the
    # next chunk moves the state past 80 before it is cached, and no Mamba state hits (0).
    prompt = list(range(3000, 3097))
    with_lag = [_hit_after(cls, prompt, mtp=True) for cls in (Scheduler, TokenyardScheduler)]
    without = [_hit_after(cls, prompt, mtp=False) for cls in (Scheduler, TokenyardScheduler)]
    assert with_lag == [0, 0]
    assert without == [80, 80]
