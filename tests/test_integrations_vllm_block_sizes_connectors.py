"""tokenyard.integrations.vllm with a KV connector beside KV cache groups of different block
sizes (vLLM 0.33's layouts for a model whose layer kinds have different page sizes, e.g.
Gemma 4 under P/D disaggregation), against vLLM's own ``Scheduler`` and ``AsyncScheduler`` on
the same streams.

Both are built as vLLM's engine builds them: ``block_size`` the scheduler block size (the
groups' lcm), ``hash_block_size`` their gcd, requests hashed at it whether prefix caching is
on or not (``resolve_kv_cache_block_sizes`` and ``EngineCore.__init__`` hash when a connector
is on). vLLM's connector path has no rule of its own for the sizes: the local hit it shows the
connector lands on the lcm (``HybridKVCacheCoordinator.find_longest_cache_hit``), the
connector's tokens are taken as offered and count as computed in every group, each group
taking blocks of its own size for them (``allocate_new_computed_blocks`` and the managers'
``allocate_external_computed_blocks``: ``cdiv(total, manager.block_size)``), and a landed
load caches up to the lcm boundary below the computed tokens (``cache_blocks`` through
``get_num_cacheable_tokens``). A failed load (``failed_recving``) under
``kv_load_failure_policy="recompute"`` frees the request with no computed tokens and looks it
up anew, the connector asked again (``_handle_failed_recving``,
``_update_waiting_for_remote_kv``); block-level load failures (``invalid_block_ids``) raise
beside several groups, as vLLM's ``_handle_invalid_blocks`` does.

A seeded ``SupportsHMA`` connector (registered here) offers part of each request's tokens,
asynchronously or not; its asynchronous loads land (or fail) the step after they start.
Every step is compared: scheduled tokens, computed tokens, block ids per group, blocks to
zero, the requests waiting for their loads, KV usage and every request's block tables, and
the tables each finished request hands the connector. Needs vLLM (the bench venv,
``.venv-bench``); skipped elsewhere.
"""

from __future__ import annotations

import math
import random
import zlib
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
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from vllm_compare import block_digest, runner_output, sampling, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

CONNECTOR = "TokenyardSeededSizesConnector"

#: (kind, block size, sliding window) of each group.
GEMMA = [("full", 32, 0), ("window", 16, 64)]
THREE = [("full", 64, 0), ("window", 16, 48), ("window", 32, 100)]


class SeededSizesConnector(KVConnectorBase_V1, SupportsHMA):
    """Scheduler side only. For each lookup ``(request, num_computed_tokens)`` it offers a
    seeded share of the tokens left (a synchronous load leaves the last one), asynchronously
    or not; ``loads_every_group`` restores every group (a P/D transfer), else the
    prefix-cacheable ones (vLLM's default). Like vLLM's ``NixlConnector`` (which clears a
    request's ``do_remote_prefill`` once its blocks are allocated) it offers a request
    nothing once a load of it was allocated: vLLM asks again whenever a request counts no
    computed tokens, a one-token prompt loaded whole too (``_update_waiting_for_remote_kv``
    leaves it none), and an offer repeated for ever would never let it run. It keeps every
    ``update_state_after_alloc`` call and finished request's tables, for the test to
    compare."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._seed = int(extra["seed"])
        self._every_group = bool(extra["loads_every_group"])
        self.allocs: list[tuple[str, tuple[list[int], ...], int]] = []
        self._loaded: set[str] = set()
        self.finished_tables: dict[str, tuple[list[int], ...]] = {}

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        key = f"{self._seed}:{request.request_id}:{num_computed_tokens}".encode()
        rng = random.Random(zlib.crc32(key))
        load_async = rng.random() < 0.5
        most = request.num_tokens - num_computed_tokens - (0 if load_async else 1)
        if most <= 0 or rng.random() < 0.3 or request.request_id in self._loaded:
            return 0, False
        return rng.randrange(1, most + 1), load_async

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        if self._every_group:
            return self._kv_cache_config.transfer_group_ids
        return super().get_loaded_kv_cache_group_ids(request)

    def update_connector_output(self, connector_output: Any) -> None:
        # A failed load may be offered again (the next lookup asks anew).
        self._loaded -= connector_output.failed_recving

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.allocs.append((request.request_id, blocks.get_block_ids(), num_external_tokens))
        if num_external_tokens:
            self._loaded.add(request.request_id)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return False, None

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        self.finished_tables[request.request_id] = tuple(list(g) for g in block_ids)
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
    KVConnectorFactory.register_connector(CONNECTOR, __name__, SeededSizesConnector.__name__)


def _groups(layout: list[tuple[str, int, int]]) -> list[Any]:
    groups = []
    for i, (kind, size, window) in enumerate(layout):
        common = {"block_size": size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
        spec = (
            FullAttentionSpec(**common)
            if kind == "full"
            else SlidingWindowSpec(sliding_window=window, **common)
        )
        groups.append(KVCacheGroupSpec([f"layers.{i}"], spec))
    return groups


def build_pair(
    layout: list[tuple[str, int, int]],
    *,
    seed: int,
    asynchronous: bool = False,
    caching: bool = True,
    loads_every_group: bool = False,
    num_blocks: int = 160,
    policy: str = "fail",
    groups: list[Any] | None = None,
) -> tuple[list[Any], VllmSchedulerPeer]:
    """vLLM's scheduler and tokenyard's over ``layout`` with the seeded connector, built with
    vLLM's two block sizes, and the peer whose requests are hashed at the hash block size;
    ``groups`` (vLLM's ``KVCacheGroupSpec``s, of ``layout``'s block sizes) replaces the
    groups ``layout`` makes (a cross-attention group, which ``layout`` cannot name)."""
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=512,
        enable_prefix_caching=caching,
    )
    config = peer.vllm_config
    config.kv_transfer_config = KVTransferConfig(
        kv_connector=CONNECTOR,
        kv_role="kv_both",
        kv_load_failure_policy=policy,
        kv_connector_extra_config={"seed": seed, "loads_every_group": loads_every_group},
    )
    config.scheduler_config.async_scheduling = asynchronous
    sizes = [size for _, size, _ in layout]
    scheduler_block_size, hash_block_size = math.lcm(*sizes), math.gcd(*sizes)
    # EngineCore hashes requests whenever a connector is on, prefix caching or not.
    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    kv_cache_utils.init_none_hash(hash_fn)
    peer._block_hasher = kv_cache_utils.get_request_block_hasher(hash_block_size, hash_fn)
    classes = (
        (AsyncScheduler, AsyncTokenyardScheduler)
        if asynchronous
        else (Scheduler, TokenyardScheduler)
    )
    kv_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups or _groups(layout)
    )
    pair = [
        cls(
            vllm_config=config,
            kv_cache_config=kv_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=scheduler_block_size,
            hash_block_size=hash_block_size,
        )
        for cls in classes
    ]
    return pair, peer


class StreamStalled(AssertionError):
    """Every step agreed but the stream did not drain: vLLM 0.33 keeps a request whose load
    failed in ``_inflight_prefills`` (``_update_waiting_for_remote_kv`` frees its blocks and
    leaves it there), so the blocks its whole sequence needs stay reserved against every
    admission, its own included; with a tight cache nothing is admitted again. The core
    does the same, but where nothing runs its stall breaker frees the waiting requests'
    loaded blocks and goes on (``_stalled``)."""


def _stalled(theirs: Any, out: Any, seen: dict[str, int]) -> bool:
    """Whether vLLM's scheduler is stuck after a failed load (``StreamStalled``): a load
    failed in this stream, and the step runs nothing with nothing running. The core then
    preempts the waiting requests that hold loaded blocks (its stall breaker,
    ``sched::loads::release_landed_loads``), where vLLM waits for ever."""
    return seen["failed"] > 0 and not out.num_scheduled_tokens and not theirs.running


def _loading(scheduler: Any) -> set[str]:
    return {
        r.request_id
        for r in scheduler.requests.values()
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    }


def run_stream(
    layout: list[tuple[str, int, int]],
    seed: int,
    *,
    asynchronous: bool = False,
    caching: bool = True,
    loads_every_group: bool = False,
    num_blocks: int = 160,
    fail_share: float = 0.0,
) -> dict[str, int]:
    """A seeded stream on both schedulers, every step compared (see the module doc); a
    ``fail_share`` of the loads that land fail instead (``failed_recving``, among the
    finished ones as vLLM's ``KVOutputAggregator`` reports them; the
    ``kv_load_failure_policy`` is then ``"recompute"``). Returns what it exercised."""
    pair, peer = build_pair(
        layout,
        seed=seed,
        asynchronous=asynchronous,
        caching=caching,
        loads_every_group=loads_every_group,
        num_blocks=num_blocks,
        policy="recompute" if fail_share else "fail",
    )
    rng = random.Random(seed)
    arrivals = seeded_arrivals(
        rng,
        count=10,
        prefix_tokens=160,
        shared=(0, 16, 48, 100, 160),
        tail_max=100,
        arrive_by=12,
        max_tokens=12,
        lowest_token=1,
        max_prompt=300,
    )
    seen = {"loads": 0, "failed": 0, "hits": 0, "preemptions": 0, "external": 0}
    started: set[str] = set()
    # Steps formed whose outputs are not in yet: the asynchronous schedulers take a step's
    # output after forming the next one.
    pending: list[tuple[list[Any], list[set[str]], set[str], set[str]]] = []
    for step in range(400):
        for at, *args in arrivals:
            if at == step:
                for scheduler in pair:
                    scheduler.add_request(peer.make_request(*args))
        outs = [scheduler.schedule() for scheduler in pair]
        digests = [{**block_digest(out), "zero": out.new_block_ids_to_zero} for out in outs]
        if digests[1] != digests[0] and _stalled(pair[0], outs[0], seen):
            raise StreamStalled(f"vLLM stalled at step {step}; the core's stall breaker goes on")
        assert digests[1] == digests[0], f"step {step}"
        now_loading = [_loading(s) for s in pair]
        assert now_loading[1] == now_loading[0], f"step {step}"
        # What each step tells the connector, request by request (the order of the calls
        # within one step is not part of vLLM's contract: the connector builds its
        # metadata once the step is formed).
        told = [sorted(s.connector.allocs, key=lambda a: a[0]) for s in pair]
        assert told[1] == told[0], f"step {step}: {told}"
        seen["external"] += sum(n for _, _, n in told[0])
        for s in pair:
            s.connector.allocs.clear()
        # Each load lands (or fails) with the output of the step after the one that
        # started it (a request may load again after a failed load).
        landing = started & now_loading[0]
        started = {r for r, _, n in told[0] if n and r in now_loading[0]}
        seen["loads"] += len(started)
        seen["hits"] += sum(r.num_computed_tokens > 0 for r in outs[0].scheduled_new_reqs)
        seen["preemptions"] += len(outs[0].preempted_req_ids)
        failed = {r for r in sorted(landing) if rng.random() < fail_share}
        seen["failed"] += len(failed)
        samples = [sampling(s, out) for s, out in zip(pair, outs, strict=True)]
        pending.append((outs, samples, landing, failed))
        idle = not any(o.num_scheduled_tokens for o in outs)
        while pending and (not asynchronous or len(pending) == 2 or idle):
            outs, samples, landing, failed = pending.pop(0)
            for scheduler, out, sample in zip(pair, outs, samples, strict=True):
                output = runner_output(scheduler, out, sample)
                output.kv_connector_output = KVConnectorOutput(
                    finished_recving=set(landing), failed_recving=set(failed)
                )
                scheduler.update_from_output(out, output)
        ours, theirs = pair[1], pair[0]
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        for request_id in theirs.requests:
            table = ours.kv_cache_manager.get_block_ids(request_id)
            assert table == theirs.kv_cache_manager.get_block_ids(request_id), step
        if step > 12 and not pending and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            assert ours.connector.finished_tables == theirs.connector.finished_tables
            return seen
    raise StreamStalled(f"every step agreed, and after 400 {sorted(theirs.requests)} wait")


@pytest.mark.parametrize("seed", range(6))
def test_gemma_loads_match_vllm(seed: int) -> None:
    seen = run_stream(GEMMA, seed)
    assert seen["loads"] > 0


@pytest.mark.parametrize("seed", range(4))
def test_three_group_loads_match_vllm(seed: int) -> None:
    assert run_stream(THREE, seed)["loads"] > 0


@pytest.mark.parametrize("seed", range(4))
def test_loads_without_prefix_caching_match_vllm(seed: int) -> None:
    run_stream(GEMMA if seed % 2 else THREE, seed, caching=False)


@pytest.mark.parametrize("seed", range(6))
def test_loads_under_memory_pressure_match_vllm(seed: int) -> None:
    run_stream(GEMMA if seed % 2 else THREE, seed, num_blocks=24 if seed < 3 else 40)


def test_memory_pressure_preempts() -> None:
    seen = [run_stream(GEMMA if s % 2 else THREE, s, num_blocks=24) for s in range(3)]
    assert sum(s["preemptions"] for s in seen) > 0


@pytest.mark.parametrize("seed", range(4))
def test_failed_loads_match_vllm(seed: int) -> None:
    # kv_load_failure_policy="recompute": a failed load's request is freed with no computed
    # tokens and looked up anew, the connector asked again (_update_waiting_for_remote_kv).
    seen = run_stream(GEMMA if seed % 2 else THREE, seed, fail_share=0.5, num_blocks=40)
    assert seen["failed"] > 0


@pytest.mark.parametrize(
    "layout", [[("full", 16, 0)], [("full", 16, 0), ("window", 16, 64)]], ids=["one", "hybrid"]
)
def test_failed_loads_with_one_block_size_match_vllm(layout: list[tuple[str, int, int]]) -> None:
    # The failed-load rule is not the sizes': the single pool and one-size groups alike.
    assert sum(run_stream(layout, s, fail_share=0.5)["failed"] for s in range(2)) > 0


def test_block_level_load_failures_raise_as_in_vllm() -> None:
    # Beside several groups a block id names no request (each group numbers its own), and
    # vLLM 0.33's _handle_invalid_blocks raises; connectors report failed_recving instead.
    pair, peer = build_pair(GEMMA, seed=3)
    for scheduler in pair:
        scheduler.add_request(peer.make_request("a", list(range(1, 200)), 4))
    for scheduler in pair:
        out = scheduler.schedule()
        assert _loading(scheduler) == {"a"}
        output = runner_output(scheduler, out)
        output.kv_connector_output = KVConnectorOutput(invalid_block_ids={1})
        with pytest.raises(RuntimeError, match="multiple KV cache groups"):
            scheduler.update_from_output(out, output)


@pytest.mark.parametrize("seed", range(2))
def test_p_d_transfers_of_every_group_match_vllm(seed: int) -> None:
    run_stream(GEMMA if seed % 2 else THREE, seed, loads_every_group=True)


@pytest.mark.parametrize("seed", range(12))
def test_async_scheduler_loads_match_vllm(seed: int) -> None:
    run_stream(
        GEMMA if seed % 2 else THREE,
        seed,
        asynchronous=True,
        caching=seed % 3 != 2,
        num_blocks=40 if seed % 4 == 3 else 160,
        fail_share=0.5 if seed % 4 == 1 else 0.0,
    )
