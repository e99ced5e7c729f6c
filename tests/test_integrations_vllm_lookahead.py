"""vLLM 0.33's EAGLE/EAGLE3 prefix caching through the adapter: the config's look-ahead
hashes and trailing-block drop reach the core, and seeded streams agree step by step with
vLLM's own ``Scheduler`` / ``AsyncScheduler`` (``benches/peers/vllm_adapter_diff.py
--eagle lookahead|drop`` runs hundreds). Bench venv only (vLLM 0.33); skipped elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm_adapter_diff import draw, run_scenario
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import InputError


def adapter(peer: VllmSchedulerPeer) -> Any:
    from tokenyard.integrations.vllm import TokenyardScheduler

    return peer.build(TokenyardScheduler, peer.scheduler.kv_cache_config)


def eagle_peer(**options: Any) -> VllmSchedulerPeer:
    config = {
        "num_blocks": 64,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
        "max_model_len": 256,
        "num_speculative_tokens": 2,
        "speculative_method": "eagle3",
        **options,
    }
    return VllmSchedulerPeer(**config)


def test_an_eagle_config_turns_on_vllms_lookahead_hashes_or_the_drop() -> None:
    peer = eagle_peer()
    assert peer.vllm_config.num_hash_lookahead_tokens == 1
    ours = adapter(peer)
    assert ours._core.num_hash_lookahead_tokens == 1
    assert ours.num_hash_lookahead_tokens == 1
    dropping = eagle_peer(disable_lookahead_block_hashes=True)
    assert dropping.vllm_config.num_hash_lookahead_tokens == 0
    assert dropping.scheduler.use_eagle_block_drop
    ours = adapter(dropping)
    assert ours._core.num_hash_lookahead_tokens == 0
    assert ours.use_eagle_block_drop


def _probe(scheduler: Any, peer: VllmSchedulerPeer, tokens: list[int]) -> int:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    probe = Request(
        request_id="probe",
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=peer._block_hasher,
    )
    hit: int = scheduler.kv_cache_manager.get_computed_blocks(probe)[1]
    return hit


@pytest.mark.parametrize("drop", [False, True])
def test_prefix_hits_are_vllms_under_eagle(drop: bool) -> None:
    # One 40-token prompt computed; probes sharing 33 tokens, then 32 and a different 33rd.
    peer = eagle_peer(disable_lookahead_block_hashes=drop)
    ours = adapter(peer)
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    prompt = list(range(1000, 1040))
    for scheduler in (peer.scheduler, ours):
        scheduler.add_request(
            Request(
                request_id="a",
                prompt_token_ids=prompt,
                sampling_params=SamplingParams(max_tokens=4),
                pooling_params=None,
                block_hasher=peer._block_hasher,
            )
        )
        scheduler.schedule()
    for probe in ([*prompt[:33], 7], [*prompt[:32], 5, 6], [*prompt, 1, 2]):
        theirs = _probe(peer.scheduler, peer, probe)
        assert _probe(ours, peer, probe) == theirs, probe
    # Look-ahead: the block [16, 32) needs token 32 to match; the drop loses a block.
    assert _probe(ours, peer, [*prompt[:32], 5, 6]) == 16


def test_a_request_hashed_with_another_lookahead_is_refused_while_blocks_are_held() -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    peer = eagle_peer()
    ours = adapter(peer)

    def request(request_id: str, lookahead: int) -> Any:
        return Request(
            request_id=request_id,
            prompt_token_ids=list(range(40)),
            sampling_params=SamplingParams(max_tokens=4),
            pooling_params=None,
            block_hasher=kv_cache_utils.get_request_block_hasher(16, hash, lookahead),
        )

    ours.add_request(request("a", 1))
    ours.schedule()
    with pytest.raises(InputError, match="block_hasher"):
        ours.add_request(request("b", 0))


@pytest.mark.parametrize("eagle", ["lookahead", "drop"])
@pytest.mark.parametrize("is_async", [False, True])
def test_seeded_eagle_streams_agree_with_vllm_step_by_step(eagle: str, is_async: bool) -> None:
    for seed in range(4):
        scenario = draw(seed, 120, eagle)
        assert run_scenario(scenario, 120, is_async) is None, (seed, eagle, is_async)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kinds", [("full", "window32"), ("full", "chunk64")])
def test_hybrid_groups_hash_with_the_lookahead_as_vllm(seed: int, kinds: tuple[str, ...]) -> None:
    import random

    from vllm_compare import build_pair, compare_stream, kv_groups, seeded_arrivals

    theirs, ours, peer = build_pair(
        num_blocks=80,
        groups=kv_groups(kinds),
        speculative_method="eagle3",
        num_speculative_tokens=1,
    )
    assert ours._core.num_hash_lookahead_tokens == 1
    arrivals = seeded_arrivals(
        random.Random(seed),
        prefix_tokens=64,
        shared=(0, 16, 33, 48, 64),
        tail_max=60,
        max_tokens=20,
    )
    compare_stream(theirs, ours, arrivals, peer.make_request)


def test_the_drop_with_hybrid_groups_is_refused() -> None:
    from vllm_compare import build_pair, kv_groups

    from tokenyard.errors import ConfigError

    with pytest.raises(ConfigError, match="eagle_block_drop"):
        build_pair(
            num_blocks=80,
            groups=kv_groups(("full", "window32")),
            speculative_method="eagle3",
            num_speculative_tokens=1,
            disable_lookahead_block_hashes=True,
        )
