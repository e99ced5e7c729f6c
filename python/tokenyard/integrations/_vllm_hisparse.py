"""vLLM 0.33's HiSparse host page tier through ``TokenyardScheduler``
(``tokenyard.integrations.vllm``), over the core's (``sched::hisparse``).

vLLM serves a sparse-attention MLA model (DeepSeek-V3.2-style) with a host page pool beside
the device blocks: ``KVCacheConfig.hisparse_host_num_blocks`` host blocks, block 0 the null
block, one per page a request holds slots for (``HiSparseSourceManager`` in
``v1/core/single_type_kv_cache_manager.py``: ``get_num_blocks_to_allocate`` refuses when the
host pool cannot back the pages). With ``scheduler_reserve_full_isl`` (vLLM's default) the
admission gate asks for the whole prompt's pages, so admitted async loads can always
finish. Here:

- a ``kv_cache_config`` with ``hisparse_host_num_blocks`` (assigned on a built scheduler, as
  vLLM's tests do) turns the core's host pool on, sized by it, with the HiSparse source
  group's block size (the core serves the scheduler's own); one without turns it off. An
  assigned config's device groups are not adopted: the core keeps the device groups it was
  built with.
- vLLM's HiSparse layout given at construction is served whole: the source group
  (``HISPARSE_SOURCE``) is the host pool, whose block ids (handed out in vLLM's host
  ``BlockPool`` order) the outputs and block tables carry at the source group's place; the
  indexer is a full-attention group; ``HiSparseResidentSpec`` and ``HiSparseHotSpec`` are
  the core's groups of those kinds (``kv::coordinator_hisparse``: a connector load keeps
  the loaded prefix on host but its last page and takes the hot region). With prefix
  caching on (vLLM's default) the indexer caches its blocks and nothing hits: vLLM's host
  source group serves only pages its ``HiSparseCoordinator`` published, which takes the
  HiSparse connector's acknowledged write-backs. The HiSparse connector itself is run by
  the core with prefix caching off (``_vllm_hisparse_step``). Refused
  (``refuse_unmodelled_hisparse``): that connector where the core does not run it, device
  groups without the host pool, hot groups without resident ones.
- a vLLM ``KVCacheManager`` assigned to ``kv_cache_manager``: its ``kv_cache_config`` is
  adopted as above, and ``kv_cache_manager`` stays the view of the core's KV; the assigned
  object's ``get_blocks`` and ``get_block_ids`` are bound to that view (vLLM's scheduler
  allocates through the manager assigned, so those reads show its allocations); the rest
  of the object is never consulted. Any other manager is refused (ConfigError): nothing of
  it would be used.
- the KV connector's ``has_pending_block_frees()`` (a HiSparse connector's
  ``coordinator.has_pending_reclamation()``) is asked, as vLLM 0.33's ``schedule()`` asks
  it, when a running request's allocation finds no room: ``True`` stalls the request (no
  preemption, nothing more of the running queue this step). Routed as a step hook
  (``_vllm_hooks``) whenever the bound connector overrides vLLM's base method.
- ``_inflight_prefills`` is the core's (admitted with prompt left, or loading).

Imported only by ``tokenyard.integrations.vllm``, so vLLM is installed when this runs.
"""

from __future__ import annotations

import weakref
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.request import Request

from tokenyard.errors import ConfigError
from tokenyard.integrations._vllm_hisparse_step import refuse_unserved_hisparse_connector
from tokenyard.integrations._vllm_state import AdapterBase
from tokenyard.integrations._vllm_translate import hisparse_source_group

_BASE_PENDING_FREES = KVConnectorBase_V1.has_pending_block_frees


def hisparse_host_pool(kv_cache_config: Any) -> tuple[int, int | None] | None:
    """``(hisparse_host_num_blocks, the HiSparse source group's block_size)`` of a vLLM 0.33
    ``KVCacheConfig`` (``None`` for the block size if it names no source group), or
    ``None`` without HiSparse."""
    num_blocks = getattr(kv_cache_config, "hisparse_host_num_blocks", None)
    if num_blocks is None:
        return None
    source = hisparse_source_group(kv_cache_config)
    if source is None:
        return int(num_blocks), None
    group = kv_cache_config.kv_cache_groups[source]
    return int(num_blocks), int(group.kv_cache_spec.block_size)


def refuse_unmodelled_hisparse(kv_cache_config: Any, vllm_config: Any = None) -> None:
    """Raises ConfigError for a vLLM 0.33 HiSparse setup the core does not serve: a
    HiSparse connector it does not run (``_vllm_hisparse_step``: inside a
    ``MultiConnector``, with prefix caching on or speculative decoding, or beside another
    layout), device groups (``HiSparseResidentSpec``, ``HiSparseHotSpec``) without a host
    pool (``hisparse_host_num_blocks`` and a ``HISPARSE_SOURCE`` group: vLLM's
    ``HiSparseCoordinator`` requires both), or hot groups without resident ones (vLLM's
    ``HiSparseHotManager`` then requires a hot region at every admission with a local hit,
    not modelled)."""
    if vllm_config is not None:
        refuse_unserved_hisparse_connector(vllm_config, kv_cache_config)
    kinds = [
        type(getattr(group, "kv_cache_spec", None)).__name__
        for group in getattr(kv_cache_config, "kv_cache_groups", ()) or ()
    ]
    device = [i for i, k in enumerate(kinds) if k in ("HiSparseResidentSpec", "HiSparseHotSpec")]
    if not device:
        return
    field = f"kv_cache_groups[{device[0]}].kv_cache_spec"
    pool = hisparse_host_pool(kv_cache_config)
    if pool is None or pool[1] is None:
        raise ConfigError(
            f"{field}: HiSparse device groups need the host pool (hisparse_host_num_blocks "
            "and a HISPARSE_SOURCE group), as vLLM's HiSparseCoordinator does",
            field=field,
            value=kinds[device[0]],
        )
    if "HiSparseResidentSpec" not in kinds:
        raise ConfigError(
            f"{field}: HiSparse hot groups without resident groups are not modelled",
            field=field,
            value=kinds[device[0]],
        )
    if getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        # A connector names the groups its load writes by vLLM's ids, the source group's
        # among them; the core's groups have no host one to skip.
        raise ConfigError(
            "kv_cache_config.needs_kv_cache_zeroing: zeroing new blocks beside HiSparse's "
            "layout (mixed-precision device groups) is not modelled",
            field="kv_cache_config.needs_kv_cache_zeroing",
            value="True",
        )


class HiSparseTier(AdapterBase):
    """The properties, mixed into ``TokenyardScheduler``."""

    scheduler_config: Any

    _kv_cache_config: Any = None
    # Whether the scheduler was built on vLLM's HiSparse layout: the core's per-group block
    # ids then carry the host tables at the source group's place.
    _hisparse_placed: bool = False
    _kv_cache_manager: Any = None
    # The HiSparse connector's step (_vllm_hisparse_step), when it is configured; assigned
    # first thing in TokenyardScheduler.__init__.
    _hisparse_step: Any
    connector: Any
    # The connector whose has_pending_block_frees was last routed, and the hook.
    _frees_routed: tuple[Any, Any] = (None, None)

    @property
    def kv_cache_config(self) -> Any:
        """vLLM's ``KVCacheConfig``; assigning one with ``hisparse_host_num_blocks`` on a
        built scheduler turns the core's host page pool on (without: off), before the first
        request holds blocks (ConfigError after, or for a pool the core cannot serve)."""
        return self._kv_cache_config

    @kv_cache_config.setter
    def kv_cache_config(self, config: Any) -> None:
        if "_core" in vars(self):
            self._adopt_host_pool(config)
        self._kv_cache_config = config

    @property
    def kv_cache_manager(self) -> Any:
        """The view of the core's KV (``_KVCacheManagerView``). Assigning a vLLM
        ``KVCacheManager`` adopts its ``kv_cache_config`` (HiSparse's host pool) and binds the
        object's ``get_blocks`` and ``get_block_ids`` to the view's, so they read the core's
        blocks as vLLM's would read the scheduler's (its other state is not consulted);
        anything else raises ConfigError."""
        return self._kv_cache_manager

    @kv_cache_manager.setter
    def kv_cache_manager(self, manager: Any) -> None:
        if self._kv_cache_manager is None or manager is self._kv_cache_manager:
            self._kv_cache_manager = manager
            return
        config = getattr(manager, "kv_cache_config", None)
        if not isinstance(manager, KVCacheManager) or hisparse_host_pool(config) is None:
            raise ConfigError(
                f"kv_cache_manager: {type(manager).__name__} assigned to tokenyard's "
                "scheduler would not be consulted (the KV blocks are the core's); only a "
                "vLLM KVCacheManager with a HiSparse host pool is taken, for its config",
                field="kv_cache_manager",
                value=type(manager).__name__,
            )
        self.kv_cache_config = config
        # vLLM's scheduler allocates through the manager assigned, so its block reads
        # (KVCacheManager.get_blocks / get_block_ids) show the scheduler's allocations: here
        # they answer from the core's KV (the view's).
        view = self._kv_cache_manager
        manager.get_blocks = view.get_blocks
        manager.get_block_ids = view.get_block_ids

    def _adopt_host_pool(self, config: Any) -> None:
        if self._hisparse_step is not None:
            raise ConfigError(
                "kv_cache_config: assigned beside the HiSparse connector, which holds the "
                "host pool from construction",
                field="kv_cache_config",
                value=type(config).__name__,
            )
        pool = hisparse_host_pool(config)
        if self._hisparse_placed and (pool is None or hisparse_source_group(config) is None):
            raise ConfigError(
                "kv_cache_config: a scheduler built on vLLM's HiSparse layout keeps its host "
                "pool (its outputs carry the source group's blocks); assign one with "
                "hisparse_host_num_blocks and a HISPARSE_SOURCE group",
                field="kv_cache_config",
                value=type(config).__name__,
            )
        # vLLM 0.33 (Scheduler.__init__): HiSparse reads a released page until the pool
        # reuses it, so its async loads also wait for the steps in flight.
        self._core.defer_async_loads = self._core.defer_block_free and pool is not None
        if pool is None:
            self._core.set_hisparse_host_pages(None)
            return
        num_blocks, block_size = pool
        # With vLLM's layout given at construction the core serves its device groups, and
        # the outputs' per-group block ids carry the host tables at the source group's place.
        source = hisparse_source_group(config) if self._hisparse_placed else None
        self._core.set_hisparse_host_pages(num_blocks, block_size, source_group=source)

    @property
    def _inflight_prefills(self) -> set[Request]:
        """vLLM 0.33's: the requests still prefilling (a chunk left, or an async load in
        flight). A snapshot."""
        vllm_ids = self._vllm_ids
        return {self.requests[vllm_ids[i]] for i in self._core.inflight_prefill_ids()}

    @property
    def scheduler_reserve_full_isl(self) -> bool:
        """vLLM 0.33's admission gate: a request's whole sequence must fit (the core's,
        from ``scheduler_config``; assigning another value raises ConfigError)."""
        return bool(getattr(self.scheduler_config, "scheduler_reserve_full_isl", True))

    @scheduler_reserve_full_isl.setter
    def scheduler_reserve_full_isl(self, value: bool) -> None:
        if bool(value) != self.scheduler_reserve_full_isl:
            raise ConfigError(
                f"scheduler_reserve_full_isl: {value!r} on a built scheduler (the core's "
                "admission gate is set at construction, from scheduler_config)",
                field="scheduler_reserve_full_isl",
                value=str(value),
            )

    def _pending_block_frees_hook(self) -> Any:
        """The step hook asking the bound connector's ``has_pending_block_frees`` (``None``
        when no connector is bound or it keeps vLLM's base answer, ``False``)."""
        connector = self.connector
        # A stand-in whose class lacks the method (a Mock assigned as the connector, as
        # vLLM's tests do) keeps the base answer.
        method = getattr(type(connector), "has_pending_block_frees", _BASE_PENDING_FREES)
        if connector is None or method is _BASE_PENDING_FREES:
            self._frees_routed = (None, None)
            return None
        if self._frees_routed[0] is not connector:
            ref = weakref.ref(self)

            def pending() -> bool:
                scheduler = ref()
                return scheduler is not None and bool(scheduler.connector.has_pending_block_frees())

            self._frees_routed = (connector, pending)
        return self._frees_routed[1]

    def _take_recorded_landings(self) -> None:
        """Loads recorded as landed in ``finished_recving_kv_req_ids`` by a caller (vLLM
        0.33's scheduler takes that set as the record, ``_update_waiting_for_remote_kv``)
        that the core still has in flight: the core is told, as if the connector had
        reported them."""
        bridge = self._bridge
        if bridge is None:
            return
        landed = [i for i in self.finished_recving_kv_req_ids if i in bridge.loading]
        if not landed:
            return
        self._core.finish_kv_transfers(
            finished_recving=[self._core_ids[i] for i in landed],
            finished_sending=[],
            failed_recving=[],
        )
        for request_id in landed:
            bridge.loading.discard(request_id)
