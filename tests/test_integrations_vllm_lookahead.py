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


def test_the_lookahead_attribute_is_the_cores_one_setting() -> None:
    # vLLM's Scheduler.num_hash_lookahead_tokens (read by its Mamba split and its resumable
    # re-hash) is the core's: assigning it moves the core's hashes and split together, and
    # while a request holds blocks the core refuses it by name.
    from tokenyard.errors import ConfigError

    peer = eagle_peer()
    ours = adapter(peer)
    assert ours.num_hash_lookahead_tokens == ours._core.num_hash_lookahead_tokens == 1
    ours.num_hash_lookahead_tokens = 2
    assert ours._core.num_hash_lookahead_tokens == 2
    ours.need_mamba_block_aligned_split = True
    assert ours._core.mamba_align == (16, False, 2)
    ours.num_hash_lookahead_tokens = 1
    assert ours._core.mamba_align == (16, False, 1)
    ours.add_request(peer.make_request("r0", list(range(40)), max_tokens=4))
    ours.schedule()
    with pytest.raises(ConfigError, match="num_hash_lookahead_tokens") as info:
        ours.num_hash_lookahead_tokens = 0
    assert info.value.field == "num_hash_lookahead_tokens"
    assert ours.num_hash_lookahead_tokens == 1


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


@pytest.mark.parametrize("seed", range(3))
def test_hybrid_groups_drop_eagles_block_as_vllm(seed: int) -> None:
    # Served since branch edrop: each group drops one of its blocks (vLLM's
    # HybridKVCacheCoordinator.find_longest_cache_hit with use_eagle).
    import random

    from vllm_compare import build_pair, compare_stream, kv_groups, seeded_arrivals

    theirs, ours, peer = build_pair(
        num_blocks=80,
        groups=kv_groups(("full", "window32")),
        speculative_method="eagle3",
        num_speculative_tokens=1,
        disable_lookahead_block_hashes=True,
    )
    arrivals = seeded_arrivals(
        random.Random(seed),
        prefix_tokens=64,
        shared=(0, 16, 33, 48, 64),
        tail_max=60,
        max_tokens=20,
    )
    compare_stream(theirs, ours, arrivals, peer.make_request)


def test_the_drop_beside_chunked_local_attention_is_refused() -> None:
    # vLLM's ChunkedLocalAttentionManager asserts no EAGLE drop.
    from vllm_compare import build_pair, kv_groups

    from tokenyard.errors import ConfigError

    with pytest.raises(ConfigError, match="eagle_block_drop"):
        build_pair(
            num_blocks=80,
            groups=kv_groups(("full", "chunk64")),
            speculative_method="eagle3",
            num_speculative_tokens=1,
            disable_lookahead_block_hashes=True,
        )


@pytest.mark.parametrize("recovery", ["resident", "preempt", "reset"])
def test_a_streaming_session_keeps_its_stale_lookahead_hash_as_vllm(recovery: str) -> None:
    # vLLM's test_streaming_lookahead_hashes_follow_recomputed_kv over EAGLE3 (its own needs
    # a Qwen3-Next MTP checkpoint): the hash a dropped sampled token completed stays cached
    # until the session is recomputed, and the recomputation hashes the new tokens.
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    peer = eagle_peer(num_speculative_tokens=1, max_num_batched_tokens=128, max_model_len=128)
    ours = adapter(peer)
    logs = []
    for scheduler in (peer.scheduler, ours):

        def request(tokens: list[int], max_tokens: int) -> Any:
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            return Request(
                request_id="session",
                prompt_token_ids=tokens,
                sampling_params=params,
                pooling_params=None,
                block_hasher=peer._block_hasher,
                resumable=True,
            )

        session = request(list(range(1, 16)), 2)
        scheduler.add_request(session)
        log: list[Any] = []

        def step(token: int, sched: Any = scheduler, log: list[Any] = log) -> None:
            out = sched.schedule()
            log.append(dict(out.num_scheduled_tokens))
            sampled = ModelRunnerOutput(
                req_ids=["session"], req_id_to_index={"session": 0}, sampled_token_ids=[[token]]
            )
            sched.update_from_output(out, sampled)

        step(16)
        step(17)
        old = [*range(1, 18), 100]
        log.append(_probe(scheduler, peer, old))
        scheduler.add_request(request([42, 43, 44], 16))
        step(99)
        current = list(session.all_token_ids)
        log.append(_probe(scheduler, peer, current))
        if recovery == "reset":
            log.append(scheduler.reset_prefix_cache(reset_running_requests=True))
        elif recovery == "preempt":
            scheduler.running.remove(session)
            scheduler._preempt_request(session, 0.0)
        if recovery != "resident":
            log.append(dict(scheduler.schedule().num_scheduled_tokens))
            log.append((_probe(scheduler, peer, current), _probe(scheduler, peer, old)))
        logs.append(log)
    assert logs[1] == logs[0]
    # Block [0, 16) was cached with token 17 past it: the old continuation hits it, the
    # session's new one ([.., 16, 42, ..]) does not.
    assert (logs[0][2], logs[0][4]) == (16, 0)
