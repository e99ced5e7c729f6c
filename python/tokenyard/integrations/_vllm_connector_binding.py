"""vLLM 0.33's ``Scheduler.__init__`` (``v1/core/sched/scheduler.py``), once its KV cache
manager is built: ``self.connector.bind_kv_cache_manager(self.kv_cache_manager)``, whose base method
(``kv_connector/v1/base.py``) keeps the manager as ``_kv_cache_manager`` and passes its
``block_pool`` to ``bind_gpu_block_pool``. ``TokenyardScheduler`` binds its
``_KVCacheManagerView`` the same way, after refusing by name the connectors whose scheduler
side would use what the view does not offer:

- a class overriding ``bind_gpu_block_pool`` keeps vLLM's GPU ``BlockPool`` object and
  changes it. ``SimpleCPUOffloadConnector`` is served: its scheduler manager
  (``vllm/v1/simple_kv_offload/manager.py``, ``SimpleCPUOffloadScheduler``) ``touch``-es
  the GPU blocks it stores from and loads into, frees them with ``free_blocks``, reads
  ``blocks[i]`` (``block_hash``, ``block_hash_num_tokens``, ``is_null``, ``ref_cnt``),
  ``get_cached_block``, ``cached_block_hashes_by_block`` and, in lazy mode, walks
  ``free_block_queue.iter_blocks_after``: the pool view answers each with vLLM's meaning
  from the core (its references are the core's loose blocks, vLLM's hashes the adapter's
  index), checked against vLLM's ``Scheduler`` by
  ``tests/test_integrations_vllm_pool_connectors.py`` and
  ``..._simple_offload_kinds.py``. It is served beside full-attention, sliding-window,
  chunked local attention and Mamba ``align`` KV cache groups (the last stored from the
  boundary-state hand-offs the adapter makes, ``_vllm_boundary_offloads``), prefix caching
  on or off, and beside groups of different block sizes in eager mode with KV cache
  events off (refused by name otherwise: ``_unserved_sizes``).
  ``MooncakeStoreConnector`` is served too (``_vllm_pool_connectors``: its store jobs pin
  blocks with ``touch`` and ``free_blocks``; beside a Mamba ``align`` group it stores the
  states handed off; refused beside a Mamba group in ``none`` mode);
- a class overriding ``bind_kv_cache_manager`` builds on vLLM's manager object itself.
  ``UMBPStoreConnector`` is served beside attention and Mamba ``align`` groups
  (``_vllm_pool_connectors.refuse_umbp_layout``: its store events pin blocks as the
  Mooncake store's jobs do; with several groups its lookup probes the local cache per
  group, answered from vLLM's hashes the adapter indexes); HiSparse's is bound to the
  core's coordinator instead, with prefix caching off (``_vllm_hisparse_step``), and
  refused otherwise (``_vllm_hisparse.refuse_unmodelled_hisparse``).

``MultiConnector`` forwards both to each connector it holds (``multi_connector.py``), so
those are judged one by one. A class reading ``_kv_cache_manager`` through the base method
(``OffloadingConnector._max_loadable_tokens``: ``coordinator
.find_longest_cache_hit_per_group``, answered by the coordinator view) is bound, beside
one KV cache group or several: the blocks the adapter hands its ``update_state_after_alloc``
are vLLM's ``get_blocks`` (null blocks where a sliding window no longer attends, the prefix
hit hashed: ``_vllm_views._allocated_blocks``), which its per-group load planning reads.
Imported only by ``tokenyard.integrations.vllm``, so vLLM is installed when this runs."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
)

from tokenyard.errors import ConfigError
from tokenyard.integrations._vllm_pool_connectors import (
    mooncake_store_served,
    refuse_mooncake_store_layout,
    refuse_umbp_layout,
    umbp_probes_local_cache,
    umbp_served,
)

_FIELD = "kv_transfer_config.kv_connector"
_BINDS = ("bind_gpu_block_pool", "bind_kv_cache_manager")
# Connectors overriding bind_gpu_block_pool whose use of vLLM's pool the view serves (by
# class name: vLLM imports each only where it is used).
_POOL_SERVED = ("SimpleCPUOffloadConnector",)
# The KV cache group kinds beside which their stores and loads are checked against vLLM's
# (tests/test_integrations_vllm_pool_connectors.py, ..._simple_offload_kinds.py); a Mamba
# group in ``align`` mode only.
_POOL_SERVED_SPECS = (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec)


def _leaves(connector: Any) -> list[Any]:
    """The connectors ``bind_kv_cache_manager`` reaches: a ``MultiConnector``'s own, each
    judged by itself (nested ones opened too), else the connector."""
    if isinstance(connector, MultiConnector):
        return [leaf for inner in connector._connectors for leaf in _leaves(inner)]
    return [connector]


def _overridden_bind(cls: type) -> str | None:
    """The first of vLLM's bind methods ``cls`` defines over ``KVConnectorBase_V1``'s."""
    for name in _BINDS:
        if getattr(cls, name, None) is not getattr(KVConnectorBase_V1, name):
            return name
    return None


def _pool_served(cls: type[Any]) -> bool:
    """Whether ``cls`` is a connector whose use of vLLM's GPU pool the view serves: one of
    ``_POOL_SERVED`` overriding only ``bind_gpu_block_pool`` of vLLM's binds, and not
    subclassed (a subclass may read more of the pool)."""
    return (
        cls.__name__ in _POOL_SERVED
        and cls.__module__.startswith("vllm.")
        and cls.bind_kv_cache_manager is KVConnectorBase_V1.bind_kv_cache_manager
    )


def binds_gpu_block_pool(connector: Any) -> bool:
    """Whether a served connector (alone or in a ``MultiConnector``) reads vLLM's hashes of
    the GPU block pool (one that keeps it, or UMBP's lookup probing the local cache per
    group): the adapter then indexes vLLM's block hashes of its requests, which the pool
    view's blocks and ``get_cached_block`` answer with."""
    if connector is None:
        return False
    return any(
        _pool_served(type(leaf)) or umbp_probes_local_cache(leaf) for leaf in _leaves(connector)
    )


def _unserved_group(view: Any) -> str | None:
    """The first KV cache group kind the pool connectors are not checked beside: another
    class than ``_POOL_SERVED_SPECS`` (subclasses too: MLA's), or a Mamba group outside
    ``align`` mode (served with prefix caching off only, where the connector stores
    nothing: not checked)."""
    for group in view.kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        if type(spec) not in _POOL_SERVED_SPECS:
            return type(spec).__name__
        if isinstance(spec, MambaSpec) and spec.mamba_cache_mode != "align":
            return f"MambaSpec (mamba_cache_mode={spec.mamba_cache_mode!r})"
    return None


def _unserved_sizes(manager: Any, view: Any) -> str | None:
    """Why groups of different block sizes are not served beside this connector, or
    ``None``. vLLM's ``FullAttentionManager.cache_blocks`` then registers the prompt's last
    hash boundary inside a block as a partial entry (``_cache_partial_tail_block``: the
    block's ``block_hash`` while it is not full, else one of its
    ``cached_block_hashes_by_block``); the connector copies those keys to its CPU cache
    and announces them (``_process_store_completion``), and in lazy mode stores a free
    block keyed so. The core records such entries for KV cache events only (since branch
    ``kvevents``), not in the pool view the connector reads, so KV cache events and lazy
    mode are refused; eager stores of whole blocks (which the positional scan alone picks) are
    checked against vLLM's."""
    if manager.block_size == manager.hash_block_size:
        return None
    sizes = f"with block_size {manager.block_size} over hash_block_size {manager.hash_block_size}"
    if manager._lazy_mode:
        return f"{sizes} in lazy_offload mode (served in eager mode)"
    if manager.enable_kv_cache_events:
        return f"{sizes} with KV cache events on (served with them off)"
    return None


def _refuse_pool_layout(leaf: Any, where: str, view: Any) -> None:
    """A served pool connector beside what its use of the pool is not checked with."""
    cls = type(leaf)
    manager = leaf.scheduler_manager
    if manager is None:  # a worker-side connector: nothing of the pool is used
        return
    unserved = _unserved_group(view)
    reason = None
    if unserved is not None:
        reason = (
            f"beside a {unserved} KV cache group (served beside FullAttentionSpec, "
            "SlidingWindowSpec, ChunkedLocalAttentionSpec and align-mode MambaSpec groups)"
        )
    else:
        reason = _unserved_sizes(manager, view)
    if reason is not None:
        raise ConfigError(
            f"{_FIELD}: {cls.__name__}{where} is not served {reason}",
            field=_FIELD,
            value=cls.__name__,
        )


def bind_kv_cache_manager(connector: Any, view: Any) -> None:
    """vLLM's bind of ``view`` (the adapter's ``kv_cache_manager``) into ``connector``.

    Raises:
        ConfigError (field ``kv_transfer_config.kv_connector``): a connector (alone or in
            a ``MultiConnector``) whose class overrides ``bind_gpu_block_pool`` or
            ``bind_kv_cache_manager``: it would keep and change vLLM's own block pool or
            manager, which the core's KV is not (``SimpleCPUOffloadConnector`` served,
            refused beside a KV cache group of another kind than full attention, a
            sliding window, chunked local attention or Mamba ``align``, and beside groups
            of different block sizes in lazy mode or with KV cache events on;
            ``MooncakeStoreConnector`` and ``UMBPStoreConnector`` served, refused as
            ``_vllm_pool_connectors``'s ``refuse_mooncake_store_layout`` and
            ``refuse_umbp_layout`` say). Nothing is
            bound then.
    """
    for leaf in _leaves(connector):
        cls = type(leaf)
        where = "" if leaf is connector else f" (inside {type(connector).__name__})"
        method = _overridden_bind(cls)
        if method == "bind_gpu_block_pool" and _pool_served(cls):
            _refuse_pool_layout(leaf, where, view)
            view.block_pool.kept_by_connector = True
            continue
        if method == "bind_gpu_block_pool" and mooncake_store_served(cls):
            refuse_mooncake_store_layout(leaf, where, view)
            view.block_pool.kept_by_connector = True
            continue
        if method is not None and umbp_served(cls):
            refuse_umbp_layout(leaf, where, view)
            view.block_pool.kept_by_connector = True
            continue
        if method is not None:
            raise ConfigError(
                f"{_FIELD}: {cls.__name__}{where} is not served: its scheduler side "
                f"overrides {method} and would keep and change vLLM's GPU BlockPool or "
                "KVCacheManager object itself, which tokenyard's scheduler does not have "
                "(its KV blocks are the core's; the pool view it binds is read-only)",
                field=_FIELD,
                value=cls.__name__,
            )
    connector.bind_kv_cache_manager(view)
