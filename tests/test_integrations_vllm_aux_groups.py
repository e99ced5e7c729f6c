"""vLLM 0.33's auxiliary-output connector (``AuxOutputSchedulerConnector``) beside several
KV cache groups: the connector asks its block pool for the coordinator's
``full_attention_group_id`` (``vllm/distributed/aux_output_connector/connector.py``:
``getattr(coordinator, "full_attention_group_id", None) or 0``), which vLLM's
``HybridKVCacheCoordinator`` sets to the first full-attention group (its groups sorted full
attention first). With a window group first, that is group 1. vLLM's ``Scheduler`` and the
adapter each get one connector, run one seeded stream (shared prefixes, aborts, evictions)
and must agree step by step: scheduled tokens, new requests' hits, the connector's metadata
and the routed-expert shapes. Needs vLLM (the bench venv); skipped elsewhere."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from test_integrations_vllm_aux import _step
from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request, RequestStatus
from vllm_compare import build_pair, kv_groups


def _pair(kinds: list[str], num_blocks: int) -> tuple[list[Any], Any]:
    theirs, ours, peer = build_pair(
        num_blocks=num_blocks,
        groups=kv_groups(kinds),
        max_model_len=128,
        max_num_batched_tokens=64,
    )
    pair = [theirs, ours]
    for s in pair:
        s.aux_output_connector = AuxOutputSchedulerConnector(s.kv_cache_manager)
    return pair, peer


def _stream(kinds: list[str], seed: int, num_blocks: int) -> list[int]:
    rng = random.Random(seed)
    pair, peer = _pair(kinds, num_blocks)
    prefixes = [[1000 * p + t for t in range(48)] for p in range(3)]
    hits = []
    for step in range(60):
        if rng.random() < 0.5:
            prefix = rng.choice(prefixes)
            prompt = prefix[: rng.choice([17, 33, 48])] + [step + 1] * rng.randint(0, 20)
            params = SamplingParams(max_tokens=rng.randint(1, 4), ignore_eos=True)
            for s in pair:
                s.add_request(
                    Request(f"r{step}", prompt, params, None, block_hasher=peer._block_hasher)
                )
        if rng.random() < 0.15:
            live = sorted(pair[0].requests)
            if live:
                victim = rng.choice(live)
                for s in pair:
                    s.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
        vllm_seen, ty_seen = _step(pair)
        assert ty_seen == vllm_seen, f"step {step}"
        hits.extend(n for _, n in vllm_seen[1])
    return hits


@pytest.mark.parametrize("seed", range(3))
def test_a_window_first_layout_asks_the_full_attention_group(seed: int) -> None:
    assert _stream(["window32", "full"], seed, num_blocks=24)


@pytest.mark.parametrize("seed", range(3))
def test_a_full_attention_first_layout_agrees_with_vllm(seed: int) -> None:
    assert _stream(["full", "window32"], seed, num_blocks=24)


def test_the_group_asked_is_vllms_full_attention_group() -> None:
    pair, _ = _pair(["window32", "full"], num_blocks=24)
    theirs, ours = pair
    assert theirs.kv_cache_manager.coordinator.full_attention_group_id == 1
    assert ours.kv_cache_manager.coordinator.full_attention_group_id == 1
