"""tokenyard.integrations.vllm with EAGLE's trailing-block drop in some KV cache groups only,
against vLLM 0.33's own ``Scheduler``: ``KVCacheCoordinator.__init__`` drops in the groups
flagged ``KVCacheGroupSpec.is_eagle_group`` (``drop_eagle_group_ids``; all of them when none
is), a spec group when any member is (``HybridKVCacheCoordinator
.verify_and_split_kv_cache_groups``, ``SpecGroup.use_eagle``), and a chunked local attention
group stands beside the drop only unflagged (``ChunkedLocalAttentionManager
.find_longest_cache_hit`` asserts ``drop_eagle_block is False``). The layouts are
``benches/peers/vllm_eagle_layouts.py``'s. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm_compare import block_digest  # noqa: F401  (puts benches/peers on the path)
from vllm_eagle_layouts import LAYOUTS, groups_of
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler
from tokenyard.kv import block_hashes


def _peer(drop: bool = True) -> VllmSchedulerPeer:
    return VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        max_model_len=512,
        enable_prefix_caching=True,
        num_speculative_tokens=2,
        speculative_method="eagle",
        disable_lookahead_block_hashes=drop,
    )


def _config(groups: list[tuple[str, int, bool]]) -> KVCacheConfig:
    LAYOUTS["_test"] = groups
    try:
        return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups_of("_test"))
    finally:
        del LAYOUTS["_test"]


def _request(request_id: str, prompt: list[int], peer: VllmSchedulerPeer) -> Request:
    params = SamplingParams(max_tokens=2)
    return Request(request_id, prompt, params, None, block_hasher=peer._block_hasher)


def _run_prompt(s: Any, request: Request) -> None:
    """Admits ``request`` and runs its whole prefill in one step (one sampled token)."""
    s.add_request(request)
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    s.update_from_output(
        out,
        ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids],
        ),
    )


@pytest.mark.parametrize(
    ("flags", "lengths"),
    [
        ((True, True), (80, 80)),
        ((False, False), (80, 80)),
        ((True, False), (80, 96)),
        ((False, True), (96, 80)),
    ],
)
def test_only_flagged_groups_drop_eagles_block(
    flags: tuple[bool, bool], lengths: tuple[int, int]
) -> None:
    # A 100-token prompt cached in blocks of 16 (6 full blocks) over full attention and a
    # window of 32; each group's own hit over its hashes (find_longest_cache_hit_per_group):
    # a group that drops reads the 6 blocks and drops one (80), one that does not keeps
    # them (96); no flag is vLLM's fallback, every group.
    peer = _peer()
    config = _config([("full", 0, flags[0]), ("window", 32, flags[1])])
    prompt = list(range(1000, 1100))
    seen = []
    for cls in (Scheduler, TokenyardScheduler):
        s = peer.build(cls, config)
        _run_prompt(s, _request("a", prompt, peer))
        probe = _request("b", prompt, peer)
        if cls is Scheduler:
            coordinator = s.kv_cache_manager.coordinator
            _, found = coordinator.find_longest_cache_hit_per_group(probe.block_hashes, 100)
        else:
            # The core's own per-group lookup over its hashes of the prompt.
            _, found = s._core.kv_hits_per_group(block_hashes(prompt, block_size=16), 100)
        seen.append((tuple(found), s.kv_cache_manager.get_computed_blocks(probe)[1]))
    assert seen[0] == seen[1] == (lengths, 80)


def test_a_flagged_chunked_local_group_is_refused_and_an_unflagged_one_served() -> None:
    # vLLM's ChunkedLocalAttentionManager asserts it never drops: flagged (or no group
    # flagged, so every one), vLLM fails at the first lookup; the core refuses at once.
    peer = _peer()
    for flags in ((True, True), (False, False)):
        with pytest.raises(ConfigError, match="chunked local"):
            peer.build(
                TokenyardScheduler, _config([("full", 0, flags[0]), ("chunked", 64, flags[1])])
            )
    config = _config([("full", 0, True), ("chunked", 64, False)])
    prompt = list(range(2000, 2150))
    hits = []
    for cls in (Scheduler, TokenyardScheduler):
        s = peer.build(cls, config)
        _run_prompt(s, _request("a", prompt, peer))
        hits.append(s.kv_cache_manager.get_computed_blocks(_request("b", prompt, peer))[1])
    # 9 full blocks; full attention drops one (128), the chunk of 64 it ends in is cached.
    assert hits == [128, 128]


def test_look_ahead_hashes_ignore_the_flags() -> None:
    # Look-ahead hashes clear use_eagle: the groups stay flagged and none drops, so a
    # flagged chunked local group is served (vLLM's drop_eagle_group_ids is empty).
    peer = _peer(drop=False)
    config = _config([("full", 0, False), ("chunked", 64, True)])
    ours = peer.build(TokenyardScheduler, config)
    assert ours._core.num_hash_lookahead_tokens == 1


@pytest.mark.parametrize(
    ("flags", "lengths"), [((True, False), (64, 96)), ((False, True), (96, 64))]
)
def test_multi_module_mtp_holds_back_its_reprefillable_tokens_in_the_dropping_groups(
    monkeypatch: Any, flags: tuple[bool, bool], lengths: tuple[int, int]
) -> None:
    # Multi-module MTP with k = 3 (vLLM's num_prefill_lookahead_tokens, use_multi_module_mtp
    # answering true over the EAGLE stub): 2 re-prefillable tokens. A 97-token prompt
    # computed whole: a dropping group caches 95 finalized tokens (5 blocks of 16) and its
    # hit drops one (64); the other caches the aligned 96 (6 blocks: 96).
    from vllm.config import SpeculativeConfig

    monkeypatch.setattr(SpeculativeConfig, "use_multi_module_mtp", lambda self: True)
    peer = VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        max_model_len=512,
        enable_prefix_caching=True,
        num_speculative_tokens=3,
        speculative_method="eagle",
        disable_lookahead_block_hashes=True,
    )
    assert peer.vllm_config.num_prefill_lookahead_tokens == 3
    config = _config([("full", 0, flags[0]), ("window", 32, flags[1])])
    prompt = list(range(3000, 3097))
    seen = []
    for cls in (Scheduler, TokenyardScheduler):
        s = peer.build(cls, config)
        _run_prompt(s, _request("a", prompt, peer))
        probe = _request("b", prompt, peer)
        if cls is Scheduler:
            coordinator = s.kv_cache_manager.coordinator
            _, found = coordinator.find_longest_cache_hit_per_group(probe.block_hashes, 97)
        else:
            _, found = s._core.kv_hits_per_group(block_hashes(prompt, block_size=16), 97)
        seen.append((tuple(found), s.kv_cache_manager.get_computed_blocks(probe)[1]))
    assert seen[0] == seen[1] == (lengths, 64)


@pytest.mark.parametrize("layout", sorted(set(LAYOUTS) - {"_test"}))
@pytest.mark.parametrize("is_async", [False, True])
def test_bench_streams_agree_with_vllm_at_every_step(
    monkeypatch: Any, layout: str, is_async: bool
) -> None:
    # vllm_adapter_diff's EAGLE streams (the drop) over each layout, step by step.
    import vllm_adapter_diff
    import vllm_eagle_layouts

    monkeypatch.setattr(VllmSchedulerPeer, "build", VllmSchedulerPeer.build)
    vllm_eagle_layouts.install(layout)
    for seed in (1, 4, 7):
        scenario = vllm_adapter_diff.draw(seed, 120, "drop")
        assert vllm_adapter_diff.run_scenario(scenario, 120, is_async) is None, seed
