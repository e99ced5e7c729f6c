"""tokenyard.integrations.vllm with a Mamba ``align`` group beside full attention and a KV
connector, against vLLM 0.33's own ``Scheduler`` on the same steps: a 64-token prefix run a
block per step (both groups cache every boundary), some of its blocks evicted through
``kv_cache_manager.block_pool.evict_blocks``, the per-group hits read through
``coordinator.find_longest_cache_hit_per_group``, then a replay of the prefix admitted. Where
it resumes follows vLLM's ``_get_local_prefix_cache_hit`` and its ``hit_diverged`` fallback
(the cases of vLLM's ``test_hybrid_*_connector*``). Needs vLLM (the bench venv); skipped
elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)
from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm_compare import block_digest, compare_stream, runner_output, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler
from tokenyard.kv import MambaSpec as CoreMambaSpec

CONNECTOR = "TokenyardStateConnector"
BLOCK = 16


class StateConnector(KVConnectorBase_V1, SupportsHMA):
    """Scheduler side only: offers ``matched_tokens`` synchronously (0 while ``seeding``) and
    says whether it restores lagging recurrent states."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.matched_tokens = int(extra["matched_tokens"])
        self._divergent = bool(extra["divergent"])
        self.seeding = True

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return self._divergent

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return (0 if self.seeding else self.matched_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return False, None

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return False, None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


if CONNECTOR not in KVConnectorFactory._registry:
    KVConnectorFactory.register_connector(CONNECTOR, __name__, StateConnector.__name__)


def _groups() -> list[Any]:
    fa = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    mamba = MambaSpec(
        block_size=BLOCK, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"
    )
    return [KVCacheGroupSpec(["fa"], fa), KVCacheGroupSpec(["mamba"], mamba)]


def _build(cls: type, matched_tokens: int, divergent: bool) -> Any:
    peer = VllmSchedulerPeer(
        num_blocks=100, max_num_seqs=4, max_num_batched_tokens=BLOCK, max_model_len=512
    )
    config = peer.vllm_config
    config.cache_config.mamba_cache_mode = "align"
    config.kv_transfer_config = KVTransferConfig(
        kv_connector=CONNECTOR,
        kv_role="kv_both",
        kv_connector_extra_config={"matched_tokens": matched_tokens, "divergent": divergent},
    )
    kv_cache_config = KVCacheConfig(num_blocks=100, kv_cache_tensors=[], kv_cache_groups=_groups())
    scheduler = peer.build(cls, kv_cache_config)
    scheduler._peer = peer  # keeps the requests' block hasher
    return scheduler


def _request(scheduler: Any, request_id: str, num_blocks: int) -> Any:
    return scheduler._peer.make_request(request_id, list(range(num_blocks * BLOCK)), max_tokens=1)


def _seed(scheduler: Any) -> tuple[list[int], list[int]]:
    """vLLM's ``_seed_hybrid_prefix`` through the scheduler: a 64-token prompt, a block a
    step. Returns its FA blocks and each step's Mamba state block."""
    scheduler.add_request(_request(scheduler, "fill", 4))
    mamba = []
    for step in range(4):
        out = scheduler.schedule()
        fa, states = scheduler.kv_cache_manager.get_block_ids("fill")
        mamba.append(states[step])
        scheduler.update_from_output(out, runner_output(scheduler, out))
    assert "fill" not in scheduler.requests
    scheduler.connector.seeding = False
    return fa, mamba


def _resume(scheduler: Any, num_blocks: int) -> int:
    scheduler.add_request(_request(scheduler, "replay", num_blocks))
    [new] = scheduler.schedule().scheduled_new_reqs
    num_computed: int = new.num_computed_tokens
    return num_computed


@pytest.mark.parametrize(("matched_tokens", "expected"), [(0, 16), (16, 32)])
def test_a_mamba_hit_deeper_than_full_attention_resumes_where_both_groups_agree(
    matched_tokens: int, expected: int
) -> None:
    results = []
    for cls in (Scheduler, TokenyardScheduler):
        scheduler = _build(cls, matched_tokens, True)
        manager = scheduler.kv_cache_manager
        assert isinstance(manager.coordinator, HybridKVCacheCoordinator)
        fa, mamba = _seed(scheduler)
        manager.block_pool.evict_blocks({fa[2], fa[3], mamba[1], mamba[2]})
        replay = _request(scheduler, "probe", 5)
        _, hits = manager.coordinator.find_longest_cache_hit_per_group(
            replay.block_hashes, replay.num_tokens - 1
        )
        assert hits == (32, 64), cls.__name__
        results.append(_resume(scheduler, 5))
    assert results == [expected, expected]


@pytest.mark.parametrize(
    ("divergent", "matched_tokens", "num_blocks", "expected"),
    [(True, 0, 5, 16), (True, 16, 6, 80), (False, 16, 6, 32)],
)
def test_a_deeper_full_attention_hit_needs_a_capable_connector_that_loads_past_it(
    divergent: bool, matched_tokens: int, num_blocks: int, expected: int
) -> None:
    results = []
    for cls in (Scheduler, TokenyardScheduler):
        scheduler = _build(cls, matched_tokens, divergent)
        manager = scheduler.kv_cache_manager
        _, mamba = _seed(scheduler)
        manager.block_pool.evict_blocks(set(mamba[1:]))
        replay = _request(scheduler, "probe", num_blocks)
        _, hits = manager.coordinator.find_longest_cache_hit_per_group(
            replay.block_hashes, replay.num_tokens - 1
        )
        assert hits == (64, 16), cls.__name__
        results.append(_resume(scheduler, num_blocks))
    assert results == [expected, expected]


def test_the_state_blocks_match_vllms_step_by_step() -> None:
    # The seed's tables after each step: one new state block per step, the one before it
    # freed at the next allocation (vLLM's null gaps), block ids as vLLM numbers them.
    tables = []
    for cls in (Scheduler, TokenyardScheduler):
        scheduler = _build(cls, 0, True)
        scheduler.add_request(_request(scheduler, "fill", 4))
        steps = []
        for _ in range(4):
            out = scheduler.schedule()
            steps.append(scheduler.kv_cache_manager.get_block_ids("fill"))
            scheduler.update_from_output(out, runner_output(scheduler, out))
        tables.append(steps)
    assert tables[0] == tables[1]


def test_a_mamba_spec_mode_is_checked() -> None:
    assert CoreMambaSpec(mamba_cache_mode="align").mamba_cache_mode == "align"
    with pytest.raises(ConfigError, match="mamba_cache_mode"):
        CoreMambaSpec(mamba_cache_mode="all")


def _stream_pair(num_blocks: int, **options: Any) -> tuple[Any, Any, Any]:
    """vLLM's Scheduler and the adapter over FA + Mamba ``align`` (the split on, as vLLM
    sets it for such a model), no connector."""
    peer = VllmSchedulerPeer(num_blocks=num_blocks, max_num_seqs=4, max_model_len=512, **options)
    peer.vllm_config.cache_config.mamba_cache_mode = "align"
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=_groups()
    )
    theirs, ours = (peer.build(cls, kv_cache_config) for cls in (Scheduler, TokenyardScheduler))
    assert theirs.need_mamba_block_aligned_split
    assert ours.need_mamba_block_aligned_split
    return theirs, ours, peer


@pytest.mark.parametrize(
    ("seed", "num_blocks"), [*((i, 160) for i in range(6)), *((i, 40) for i in range(6, 12))]
)
def test_mamba_align_streams_match_vllm_step_by_step(seed: int, num_blocks: int) -> None:
    # Shared prefixes, arrivals over the first steps, a 64-token budget; 40 blocks put the
    # cache under pressure. Every step's blocks per group, and the tables after it, agree.
    theirs, ours, peer = _stream_pair(num_blocks, max_num_batched_tokens=64)
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
    assert stream is not None


@pytest.mark.parametrize("seed", range(6))
def test_connector_loads_beside_mamba_align_match_vllm(seed: int, monkeypatch: Any) -> None:
    # The seeded SupportsHMA connector of test_integrations_vllm_hybrid_connectors (offers
    # part of each request's tokens, loads asynchronously or not) beside FA + Mamba align:
    # every step, the requests waiting for loads, KV usage and block tables agree.
    from test_integrations_vllm_hybrid_connectors import _run

    build = VllmSchedulerPeer.build

    def align_build(self: Any, cls: type, config: Any, **kw: Any) -> Any:
        self.vllm_config.cache_config.mamba_cache_mode = "align"
        return build(self, cls, config, **kw)

    monkeypatch.setattr(VllmSchedulerPeer, "build", align_build)
    seen = _run(_groups(), seed, num_blocks=(40, 160)[seed % 2], loads_every_group=seed % 3 == 0)
    assert seen["loads"] > 0


def test_a_request_given_blocks_outside_the_scheduler_is_in_req_to_blocks() -> None:
    # vLLM's _seed_hybrid_prefix drives kv_cache_manager.allocate_slots for a request the
    # scheduler does not hold; vLLM's managers list it in req_to_blocks like any other.
    seen = []
    for cls in (Scheduler, TokenyardScheduler):
        scheduler = _build(cls, 0, True)
        manager = scheduler.kv_cache_manager
        fill = _request(scheduler, "fill", 4)
        steps = []
        for _ in range(4):
            assert manager.allocate_slots(fill, BLOCK) is not None
            fill.num_computed_tokens += BLOCK
            groups = manager.coordinator.single_type_managers
            steps.append(
                (
                    manager.get_block_ids("fill"),
                    [
                        {r: [b.block_id for b in bs] for r, bs in g.req_to_blocks.items()}
                        for g in groups
                    ],
                )
            )
        manager.free(fill)
        steps.append([dict(g.req_to_blocks) for g in manager.coordinator.single_type_managers])
        seen.append(steps)
    assert seen[0] == seen[1]
    assert list(seen[1][3][1][0]) == ["fill"]
