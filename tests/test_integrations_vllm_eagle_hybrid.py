"""tokenyard.integrations.vllm with EAGLE's trailing-block drop over hybrid KV cache groups of
one block size (gpt-oss's full attention beside a sliding window), against vLLM 0.33's own
``Scheduler``: ``HybridKVCacheCoordinator.find_longest_cache_hit`` with ``use_eagle`` has each
spec group read one of its blocks past the candidate hit and drop it (a window needing one
contiguous block more), each group at most once per candidate length (``eagle_verified``).
Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm_compare import block_digest  # noqa: F401  (puts benches/peers on the path)
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import TokenyardScheduler

BLOCK = 16


def _config(window: int, eagle_flags: tuple[bool, bool] = (False, False)) -> KVCacheConfig:
    common = {"block_size": BLOCK, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    specs = [FullAttentionSpec(**common), SlidingWindowSpec(sliding_window=window, **common)]
    groups = [
        KVCacheGroupSpec([f"layers.{i}"], s, is_eagle_group=flag)
        for i, (s, flag) in enumerate(zip(specs, eagle_flags, strict=True))
    ]
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)


def _peer() -> VllmSchedulerPeer:
    return VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        max_model_len=512,
        block_size=BLOCK,
        enable_prefix_caching=True,
        num_speculative_tokens=2,
        speculative_method="eagle",
        disable_lookahead_block_hashes=True,
    )


def _build(cls: type, peer: VllmSchedulerPeer, config: KVCacheConfig) -> Any:
    return cls(
        vllm_config=peer.vllm_config,
        kv_cache_config=config,
        structured_output_manager=peer.scheduler.structured_output_manager,
        block_size=BLOCK,
        hash_block_size=BLOCK,
    )


def _hasher(peer: VllmSchedulerPeer) -> Any:
    hash_fn = get_hash_fn_by_name(peer.vllm_config.cache_config.prefix_caching_hash_algo)
    kv_cache_utils.init_none_hash(hash_fn)
    return kv_cache_utils.get_request_block_hasher(BLOCK, hash_fn)


def _step(s: Any, request: Request) -> tuple[Any, int]:
    """Adds ``request``, schedules a step, runs it with one sampled token each; returns the
    new request's block ids and computed tokens (its prefix hit)."""
    s.add_request(request)
    out = s.schedule()
    new = {r.req_id: (r.block_ids, r.num_computed_tokens) for r in out.scheduled_new_reqs}
    ids = list(out.num_scheduled_tokens)
    s.update_from_output(
        out,
        ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        ),
    )
    return new[request.request_id]


@pytest.mark.parametrize("window", [32, 128])
def test_each_group_drops_eagles_block_as_vllm_does(window: int) -> None:
    # A 100-token prompt, then prompts sharing 80, 96 and all of it with more after: the
    # hits (computed tokens) and block tables agree with vLLM's at every admission.
    peer = _peer()
    hasher = _hasher(peer)
    ours = _build(TokenyardScheduler, peer, _config(window))
    theirs = _build(Scheduler, peer, _config(window))
    base = list(range(1000, 1100))
    prompts = [base, base[:80] + [5] * 30, base[:96] + [6] * 20, base + [8] * 40, list(base)]
    hits = []
    for i, prompt in enumerate(prompts):
        seen = [
            _step(
                s,
                Request(
                    request_id=f"r{i}",
                    prompt_token_ids=prompt,
                    sampling_params=SamplingParams(max_tokens=4),
                    pooling_params=None,
                    block_hasher=hasher,
                ),
            )
            for s in (theirs, ours)
        ]
        assert seen[0] == seen[1], f"prompt {i}"
        hits.append(seen[1][1])
    # Each hit is a block short of the plain rule's: the 80 shared tokens hit 64; the 96
    # shared, the 140-token extension and the resend of 100 (6 cached blocks each, read
    # whole thanks to the block's margin) hit 80, where without the drop they hit 96.
    assert hits == [0, 64, 80, 80, 80]


def test_the_bench_streams_agree_with_vllm_at_every_step(monkeypatch: Any) -> None:
    import vllm_adapter_diff
    import vllm_block_sizes_diff
    import vllm_peer

    peer = vllm_peer.VllmSchedulerPeer
    monkeypatch.setattr(peer, "build", peer.build)
    monkeypatch.setattr(peer, "__init__", peer.__init__)
    for layout in ("gptoss", "windows"):
        vllm_block_sizes_diff.install(layout, None)
        for seed in (2, 5, 9):
            scenario = vllm_adapter_diff.draw(seed, 120, "drop")
            assert scenario.config.disable_lookahead_block_hashes
            for is_async in (False, True):
                assert vllm_adapter_diff.run_scenario(scenario, 120, is_async) is None


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("k", [1, 3])
def test_full_attention_beside_a_mamba_align_group_drops_as_vllm(
    monkeypatch: Any, seed: int, k: int
) -> None:
    # vLLM's Mamba finder never drops (no margin either) while its group counts as verified;
    # its checkpoints move a block back (drop_eagle_checkpoint_block). The streams of
    # test_integrations_vllm_mamba_spec (prompts sharing 16, 48 or 96 tokens) with an EAGLE
    # drafter and look-ahead hashes off.
    import test_integrations_vllm_mamba_spec as mamba_spec

    def eagle_pair(case: Any) -> tuple[Any, Any, Any]:
        peer = VllmSchedulerPeer(
            num_blocks=case.num_blocks,
            max_num_seqs=4,
            max_model_len=mamba_spec.MAX_MODEL_LEN,
            max_num_batched_tokens=case.budget,
            num_speculative_tokens=case.k,
            enable_prefix_caching=True,
            block_size=BLOCK,
            speculative_method="eagle",
            disable_lookahead_block_hashes=True,
        )
        peer.vllm_config.cache_config.mamba_cache_mode = "align"
        config = KVCacheConfig(
            num_blocks=case.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=mamba_spec._groups(case),
        )
        theirs, ours = (peer.build(cls, config) for cls in (Scheduler, TokenyardScheduler))
        assert theirs.use_eagle_block_drop
        return theirs, ours, peer

    monkeypatch.setattr(mamba_spec, "_pair", eagle_pair)
    seen = mamba_spec.run_stream(mamba_spec.Case(seed=seed, k=k, num_blocks=(160, 48)[seed % 2]))
    assert seen.drafts > 0
