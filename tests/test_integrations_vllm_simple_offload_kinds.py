"""tokenyard.integrations.vllm with vLLM 0.33's ``SimpleCPUOffloadConnector`` beside KV
cache groups of other kinds than full attention and sliding windows, and beside groups of
different block sizes, against vLLM's own ``Scheduler`` and ``AsyncScheduler`` on the same
seeded streams (``test_integrations_vllm_pool_connectors._run``: every step's scheduled
tokens and block ids, the connector's metadata, its boundary-store counters, the requests
waiting for loads, outputs, CPU-tier KV events, usage, tables, the GPU free queue and ref
counts).

- A Mamba ``align`` group beside full attention (Qwen3-Next's layout): vLLM's
  ``MambaManager.has_positionally_stable_blocks`` is False there, so the connector's
  positional store scan skips the group and stores its states only from the scheduler's
  boundary-state hand-offs (``KVConnectorBlockState.boundary_state_offloads``, taken by
  ``schedule()`` from ``KVCacheManager.take_boundary_state_offloads``); its CPU lookup
  finds the group's last state (``MambaManager.find_longest_cache_hit``) and loads it.
- A chunked local attention group beside full attention (Llama 4's layout): its blocks
  before the current chunk are null in the GPU table; the connector's lookup refuses a
  local prefix that is not chunk-aligned.
- Groups of two block sizes (the scheduler's block size their lcm, the hash block size
  their gcd, requests hashed at it): the connector keys each group's blocks by that group's
  size (``resolve_block_hashes``), a smaller group's block by its last hash block's hash.

Needs vLLM (the bench venv); skipped elsewhere."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from test_integrations_vllm_pool_connectors import _run
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.structured_output import StructuredOutputManager
from vllm_compare import BLOCK_SIZE

from tokenyard.integrations._vllm_aux_outputs import BlockHashIndex
from tokenyard.integrations._vllm_boundary_offloads import BoundaryStateOffers
from tokenyard.integrations._vllm_coordinator_view import BlockPoolView


def _spec(kind: str, block_size: int) -> Any:
    common: dict[str, Any] = dict(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float16
    )
    if kind == "full":
        return FullAttentionSpec(**common)
    if kind == "window":
        return SlidingWindowSpec(**common, sliding_window=48)
    if kind == "chunked":
        return ChunkedLocalAttentionSpec(**common, attention_chunk_size=64)
    return MambaSpec(
        block_size=block_size,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
    )


@dataclass(frozen=True)
class Layout:
    """KV cache groups as ``(kind, block_size)``: ``full``, ``window`` (48 tokens),
    ``chunked`` (64-token chunks) or ``mamba`` (``align`` mode). Built as vLLM's engine
    builds them: the scheduler block size the groups' lcm, the hash block size their gcd,
    requests hashed at it; ``mamba_cache_mode="align"`` with a Mamba group. Every group's
    tensor overlays the one allocation (the connector sizes its CPU pool by the first's)."""

    groups: tuple[tuple[str, int], ...]

    def prepare(self, peer: Any, num_blocks: int) -> KVCacheConfig:
        config = peer.vllm_config
        if any(kind == "mamba" for kind, _ in self.groups):
            config.cache_config.mamba_cache_mode = "align"
        sizes = [size for _, size in self.groups]
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        kv_cache_utils.init_none_hash(hash_fn)
        peer._block_hasher = kv_cache_utils.get_request_block_hasher(math.gcd(*sizes), hash_fn)
        page = _spec("full", BLOCK_SIZE).page_size_bytes
        specs = [_spec(kind, size) for kind, size in self.groups]
        return KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[
                KVCacheTensor(
                    size=page * num_blocks,
                    layers=[f"l{g}"],
                    layer_stride=page * num_blocks,
                    block_stride=page,
                )
                for g in range(len(specs))
            ],
            kv_cache_groups=[KVCacheGroupSpec([f"l{g}"], s) for g, s in enumerate(specs)],
        )

    def build(self, peer: Any, cls: type, config: KVCacheConfig) -> Any:
        sizes = [size for _, size in self.groups]
        return cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=config,
            structured_output_manager=StructuredOutputManager(peer.vllm_config),
            block_size=math.lcm(*sizes),
            hash_block_size=math.gcd(*sizes),
        )


MAMBA = Layout((("full", BLOCK_SIZE), ("mamba", BLOCK_SIZE)))
CHUNKED = Layout((("full", BLOCK_SIZE), ("chunked", BLOCK_SIZE)))
TWO_SIZES = Layout((("full", 2 * BLOCK_SIZE), ("window", BLOCK_SIZE)))


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("seed", range(3))
def test_simple_cpu_offload_beside_mamba_align_matches_vllm(
    seed: int, lazy: bool, asynchronous: bool
) -> None:
    seen = _run(
        seed, num_blocks=60, cpu_blocks=400, lazy=lazy, asynchronous=asynchronous, layout=MAMBA
    )
    assert seen["stores"] > 0
    assert seen["loads"] > 0
    # Eager mode stores the Mamba states from the hand-offs alone; lazy mode walks the free
    # queue and stores whatever cached block nears eviction.
    assert seen["boundary_stores"] > 0 or lazy


# A pool so small that running requests are preempted: the hand-offs of a preempted
# request are dropped (``dropped_request_gone``) and the connector flushes.
@pytest.mark.parametrize("seed", range(2))
def test_simple_cpu_offload_beside_mamba_align_with_preemptions_matches_vllm(seed: int) -> None:
    assert _run(seed, num_blocks=20, cpu_blocks=400, layout=MAMBA)["preemptions"] > 0


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("seed", range(2))
def test_simple_cpu_offload_beside_chunked_local_attention_matches_vllm(
    seed: int, lazy: bool, asynchronous: bool
) -> None:
    seen = _run(
        seed, num_blocks=60, cpu_blocks=400, lazy=lazy, asynchronous=asynchronous, layout=CHUNKED
    )
    assert seen["stores"] > 0
    assert seen["loads"] > 0


# Eager mode, KV cache events off (lazy mode and events are refused by name beside
# differing sizes: test_integrations_vllm_pool_connectors.py).
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", range(3))
def test_simple_cpu_offload_over_two_block_sizes_matches_vllm(
    seed: int, asynchronous: bool
) -> None:
    seen = _run(
        seed,
        num_blocks=60,
        cpu_blocks=400,
        asynchronous=asynchronous,
        events=False,
        layout=TWO_SIZES,
    )
    assert seen["stores"] > 0
    assert seen["loads"] > 0


def _scheduler_block_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hash index as before: the scheduler block's last hash only (a window group's
    finer blocks then answer the core's hash, not vLLM's)."""
    init = BlockHashIndex.__init__

    def scheduler_blocks(self: Any, scheduler: Any) -> None:
        init(self, scheduler)
        self._unit = scheduler.block_size
        self._step = scheduler.block_size // scheduler.hash_block_size

    monkeypatch.setattr(BlockHashIndex, "__init__", scheduler_blocks)


# The checks can fail: without the adapter's boundary-state hand-offs the Mamba states are
# never stored; with vLLM's hashes indexed per scheduler block, not per hash block, the
# window group's blocks answer no vLLM hash; without the tables as an update's window began,
# a chunk the landed tokens crossed is not found where vLLM's connector stores it from at
# the request's finish (seed 1, asynchronous).
@pytest.mark.parametrize("broken", ["no_handoffs", "scheduler_blocks", "no_window_tables"])
def test_simple_cpu_offload_kinds_checks_can_fail(
    monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    seed, asynchronous = 0, False
    if broken == "no_handoffs":
        monkeypatch.setattr(BoundaryStateOffers, "take", lambda *_: {})
        layout = MAMBA
    elif broken == "scheduler_blocks":
        _scheduler_block_index(monkeypatch)
        layout = TWO_SIZES
    else:
        monkeypatch.setattr(BlockPoolView, "_live_tables", lambda _: {})
        seed, asynchronous, layout = 1, True, CHUNKED
    with pytest.raises((AssertionError, TypeError)):
        _run(
            seed,
            num_blocks=60,
            cpu_blocks=400,
            events=False,
            asynchronous=asynchronous,
            layout=layout,
        )
