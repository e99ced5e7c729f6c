"""What ``TokenyardScheduler`` (``tokenyard.integrations.vllm``) shows vLLM beside the
scheduler itself: its connector bridge (a vLLM KV connector as a tokenyard ``KvConnector``)
and the read-only views vLLM's callers read (``waiting``, ``kv_cache_manager``; its
``block_pool`` and ``coordinator`` are ``_vllm_coordinator_view``'s). Imported only by that
module, so vLLM is installed when this runs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import (
    BlockHashListWithBlockSize,
    KVCacheBlock,
    make_block_hash_with_group_id,
)
from vllm.v1.core.sched.output import KVConnectorBlockState, SchedulerOutput
from vllm.v1.kv_cache_interface import AttentionSpec, CrossAttentionSpec, EncoderOnlyAttentionSpec
from vllm.v1.metrics.stats import KV_FETCH_WAITING_TO_START, PrefixCacheStats
from vllm.v1.request import Request

from tokenyard.errors import ConfigError, InputError
from tokenyard.integrations._vllm_boundary_offloads import BoundaryStateOffers
from tokenyard.integrations._vllm_coordinator_view import BlockPoolView
from tokenyard.integrations._vllm_manager_views import CoordinatorView, HybridCoordinatorView
from tokenyard.integrations._vllm_outputs import keyed_prompt
from tokenyard.integrations._vllm_translate import vllm_block_ids


class AdapterState(Protocol):
    """What these views read of ``tokenyard.integrations.vllm.TokenyardScheduler`` (named
    here so that this module need not import the one that imports it)."""

    block_size: int
    hash_block_size: int
    kv_cache_config: Any
    cache_config: Any
    connector_prefix_cache_stats: PrefixCacheStats | None
    _core: Any
    _core_ids: dict[str, Any]
    _num_kv_blocks: int
    _kv_groups: int
    _prefix_caching: bool
    _prefix_cache_stats: PrefixCacheStats | None
    _block_hash_index: Any
    _index_hashes: bool
    _pool_view: Any
    requests: dict[str, Request]

    def _request_of(self, core_id: Any) -> Request: ...

    def _record_prefix_lookup(self, request: Request, num_hits: int) -> None: ...

    def _set_kv_fetch_stage(self, request: Request, stage: str | None) -> None: ...

    def _append_until_stop(self, request: Request, tokens: list[int]) -> list[int]: ...

    def get_kv_cache_usage(self) -> float: ...


class _ConnectorBridge:
    """A vLLM ``KVConnectorBase_V1`` (scheduler role) as a ``tokenyard.sched.KvConnector``:
    the core calls these three methods with its ``RequestView``; each calls the vLLM
    connector with the vLLM ``Request`` and vLLM's argument types, and keeps what the
    adapter reports back to vLLM (``kv_transfer_params``, the connector's prefix-cache
    lookups, the transfers in flight)."""

    def __init__(self, scheduler: AdapterState, connector: Any) -> None:
        self._scheduler = scheduler
        self.connector = connector
        # Requests whose asynchronous load is in flight / whose blocks a send holds.
        self.loading: set[str] = set()
        self.sending: set[str] = set()
        # Finished requests kept in `requests` for a transfer the core never had: aborted
        # while their status said WAITING_FOR_REMOTE_KVS, set by hand (_vllm_adopt).
        self.unheld: set[str] = set()
        # request_finished's kv_transfer_params, for the request's last EngineCoreOutput.
        self.transfer_params: dict[str, Any] = {}
        # (queries, hits) of the latest connector lookup, recorded once blocks are given.
        self._lookups: dict[str, tuple[int, int]] = {}
        # Tokens the connector gave an admitted request (not local prefix hits).
        self.external_hits: dict[str, int] = {}
        # Requests whose local prefix lookup was recorded when their blocks were given (an
        # asynchronous load: vLLM records lookups at admission, not when scheduled).
        self.lookups_recorded: set[str] = set()
        # Whether the latest lookup of a request offered an asynchronous load.
        self._load_async: dict[str, bool] = {}
        # A synchronous load was admitted in the step being formed (vLLM's
        # SchedulerOutput.has_sync_kv_loads).
        self.has_sync_kv_loads = False
        # The tokens of the update being applied, by request (set around the core's
        # update), and those appended here when the core finished a request in it.
        self.tokens_in_update: dict[str, list[int]] = {}
        self.appended_at_finish: dict[str, list[int]] = {}

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        """vLLM 0.33's connector capability (``KVConnectorBase_V1``, False by default): its
        loads restore a Mamba state lagging behind a deeper full-attention hit, so the core
        keeps that hit when the connector loads past it (``_get_local_prefix_cache_hit``).
        Read by the core when the connector is set."""
        return bool(getattr(self.connector, "supports_divergent_local_hybrid_hits", False))

    def get_num_new_matched_tokens(
        self, view: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        request = self._scheduler._request_of(view.request_id)
        # The landed loads vLLM's waiting pass promoted ahead of it cached their blocks.
        self._scheduler._pool_view.landed_before(request.request_id)
        num_tokens, load_async = self.connector.get_num_new_matched_tokens(
            request, num_computed_tokens
        )
        if request.skip_reading_prefix_cache:
            num_tokens, load_async = 0, False
        if num_tokens is not None:
            # vLLM 0.33's waiting loop, once the lookup is answered (_kv_fetch_stages).
            stage = KV_FETCH_WAITING_TO_START if load_async else None
            self._scheduler._set_kv_fetch_stage(request, stage)
            self._load_async[request.request_id] = bool(load_async)
            self._lookups[request.request_id] = (
                request.num_tokens - num_computed_tokens,
                num_tokens,
            )
        return num_tokens, bool(load_async)

    def update_state_after_alloc(self, view: Any, block_ids: Any, num_external_tokens: int) -> None:
        """vLLM 0.33's call in ``schedule()``'s waiting loop (and ``_drain_deferred_loads``):
        ``update_state_after_alloc(request, kv_cache_manager.get_blocks(request_id),
        num_external_computed_tokens)``, once ``allocate_slots`` gave the request its
        blocks: every group's whole table (not only the new blocks), the null block where a
        group does not attend (see ``_allocated_blocks`` for the blocks' hashes); the
        request's ``shared_prefix_boundary`` as the core's lookup set it."""
        scheduler = self._scheduler
        request = scheduler._request_of(view.request_id)
        # Set by vLLM's lookup before this call; the offloading connector's store planning
        # reads it (``_build_store_jobs``: a reachable boundary).
        request.shared_prefix_boundary = view.shared_prefix_boundary
        queries, _ = self._lookups.get(request.request_id, (0, 0))
        if queries:  # a lookup at admission: its local hit, and a synchronous load's tokens
            num_hashed_tokens = request.num_tokens - queries
            if not self._load_async.get(request.request_id, False):
                num_hashed_tokens += num_external_tokens
        else:
            num_hashed_tokens = request.num_computed_tokens
        blocks = _allocated_blocks(scheduler, request, block_ids, num_hashed_tokens)
        self.connector.update_state_after_alloc(request, blocks, num_external_tokens)
        queries, hits = self._lookups.pop(request.request_id, (0, 0))
        load_async = self._load_async.pop(request.request_id, False)
        if load_async and num_external_tokens:
            scheduler._record_prefix_lookup(request, request.num_tokens - queries)
            self.lookups_recorded.add(request.request_id)
            # vLLM 0.33's schedule() counts the local hit and the tokens being loaded as
            # computed while the request waits for them (WAITING_FOR_REMOTE_KVS).
            request.num_computed_tokens = request.num_tokens - queries + num_external_tokens
        if num_external_tokens:
            self.external_hits[request.request_id] = num_external_tokens
            if not load_async:
                self.has_sync_kv_loads = True
        stats = scheduler.connector_prefix_cache_stats
        if stats is not None and queries:
            preempted = request.num_preemptions > 0
            sources = None
            if hits and not preempted:
                sources = self.connector.get_external_cache_hit_sources(request, hits)
            stats.record(
                num_tokens=queries, num_hits=hits, preempted=preempted, hits_by_source=sources
            )

    def get_loaded_kv_cache_group_ids(self, view: Any) -> tuple[int, ...]:
        """The KV cache groups the connector's load restores (vLLM 0.33's
        ``get_loaded_kv_cache_group_ids``; its base class answers the prefix-cacheable
        groups, a P/D connector every transfer group)."""
        request = self._scheduler._request_of(view.request_id)
        return tuple(self.connector.get_loaded_kv_cache_group_ids(request))

    def finished(self, request: Request, tables: tuple[list[int], ...]) -> tuple[bool, Any]:
        """vLLM 0.33's connector call in ``_connector_finished``: every group's table to a
        connector that supports the hybrid allocator (``SupportsHMA``), the one table to
        one that does not (vLLM asserts there is one group then).

        Raises:
            ConfigError: several KV cache groups beside a connector without ``SupportsHMA``.
        """
        connector: Any = self.connector
        answer: tuple[bool, Any]
        if isinstance(connector, SupportsHMA):
            answer = connector.request_finished_all_groups(request, tables)
            return answer
        if len(tables) != 1:
            raise ConfigError(
                f"kv_transfer_config.kv_connector: {type(self.connector).__name__} does not "
                f"support the hybrid KV cache manager (SupportsHMA), and a request finished "
                f"with {len(tables)} KV cache groups (vLLM 0.33's _connector_finished "
                f"asserts one)"
            )
        answer = connector.request_finished(request, tables[0])
        return answer

    def request_finished(self, view: Any, block_ids: Any) -> bool:
        scheduler = self._scheduler
        request = scheduler._request_of(view.request_id)
        request_id = request.request_id
        tokens = self.tokens_in_update.get(request_id)
        if tokens is not None and not request.is_finished():
            # The core stopped it in an update: as vLLM's update_from_output, its tokens are
            # appended up to the stop and its status set (check_stop) before
            # _free_request asks the connector, which reads both (a P/D producer sends
            # only for FINISHED_LENGTH_CAPPED or FINISHED_STOPPED).
            self.appended_at_finish[request_id] = scheduler._append_until_stop(request, tokens)
        tables = _group_tables(block_ids)
        # vLLM's update_from_output caches the request's blocks before it frees the request
        # when outputs land late (async placeholders, speculative tokens).
        scheduler._pool_view.cached_by_update(request, tables)
        delay_free, params = self.finished(request, tables)
        if params is not None:
            self.transfer_params[request_id] = params
        if delay_free:
            self.sending.add(request_id)
            return True
        # Not held for a send: the core frees the blocks, or defers them past the steps in
        # flight (vLLM 0.33's defer_block_free).
        return False


def connector_meta(scheduler: Any, out: SchedulerOutput) -> Any:
    """The KV connector's metadata for the step ``out``, as vLLM 0.33's ``schedule()`` builds
    it: the connector reads, through ``out.kv_connector_block_state``, the block table of
    any request scheduled this step (a store's save lands on the step that fills a block,
    which allocated none), resolved when read; the call goes through the scheduler's
    ``_build_kv_connector_meta`` (vLLM's hook, which a plugin may replace); the block state
    is cleared after (it never goes to the workers). vLLM's Mamba ``align`` boundary-state
    hand-offs are taken once per step as vLLM's ``schedule()`` takes them
    (``take_boundary_state_offloads``, ``_vllm_boundary_offloads``), in the order its
    ``cache_blocks`` calls make them (``BoundaryStateOffers.cache_order``: the running
    requests, then the waiting pass, a landed load among them); the requests holding one
    are in the block state's ``req_ids`` too."""
    manager = scheduler.kv_cache_manager
    scheduled = out.num_scheduled_tokens
    offloads: dict[str, list[tuple[int, int, int]]] = {}
    offers = manager._boundary_offers
    if offers.groups:  # nothing to read (or pay) without an align group
        order = offers.cache_order(scheduled, scheduler.requests)
        offloads = manager.take_boundary_state_offloads(
            [r for r in order if r in scheduler.requests]
        )
    out.kv_connector_block_state = KVConnectorBlockState(
        req_ids={*scheduled, *offloads},
        resolve_block_ids=manager.get_block_ids,
        boundary_state_offloads=offloads,
    )
    try:
        with scheduler._pool_view.reading():
            return scheduler._build_kv_connector_meta(scheduler.connector, out)
    finally:
        out.kv_connector_block_state = None


def computed_block_tables(
    tables: tuple[list[int], ...], kv_cache_config: Any, num_computed_tokens: int
) -> tuple[list[int], ...]:
    """vLLM 0.33's ``KVCacheManager.get_block_ids_for_computed_tokens``, the tables its
    ``_connector_finished`` hands the connector: an attention group's table (not cross-
    or encoder-only attention) clipped to ``cdiv(num_computed_tokens, block_size)``
    blocks, so lookahead slots and rejected drafts' slots are not sent; any other group's
    (Mamba, HiSparse) whole. The core clips the same way (``connector_block_tables``)."""
    clipped: list[list[int]] = []
    for group, ids in zip(kv_cache_config.kv_cache_groups, tables, strict=False):
        spec = group.kv_cache_spec
        if not isinstance(spec, AttentionSpec) or isinstance(
            spec, (CrossAttentionSpec, EncoderOnlyAttentionSpec)
        ):
            clipped.append(ids)
            continue
        clipped.append(ids[: -(-num_computed_tokens // spec.block_size)])
    return tuple(clipped)


def _group_tables(block_ids: Any) -> tuple[list[int], ...]:
    """The core's block ids as vLLM's per-group tables: a tuple of arrays (several KV
    groups, vLLM's ids already) or one array (the single pool, renumbered)."""
    if isinstance(block_ids, tuple):
        return tuple(group.tolist() for group in block_ids)
    return (vllm_block_ids(block_ids),)


# vLLM's null block as its connectors see it (``BlockPool.null_block``: id 0, ``is_null``).
_NULL_BLOCK = KVCacheBlock(0, is_null=True)


def _allocated_blocks(
    scheduler: AdapterState, request: Request, block_ids: Any, num_hashed_tokens: int
) -> KVCacheBlocks:
    """The request's blocks as vLLM's ``get_blocks`` hands them to the connector right after
    ``allocate_slots``: the null block at id 0; each block below ``num_hashed_tokens`` (the
    request's prefix hit, and a synchronous load: both cached by then) carrying vLLM's hash
    of it (``make_block_hash_with_group_id`` over ``request.block_hashes`` at the group's
    block size, as ``BlockPool.cache_full_blocks`` sets it); the rest unhashed. An
    asynchronous load's blocks are unhashed in vLLM too (``delay_cache_blocks``). Where
    vLLM caches the full blocks a step computes at once (no load), those are shown unhashed:
    no vLLM 0.33 connector reads their hash (the offloading connector reads hashes for an
    asynchronous load only, NIXL's pull scheduler with external tokens only). The blocks
    are snapshots: their ref counts live in Rust."""
    groups = scheduler.kv_cache_config.kv_cache_groups
    hash_block_size = scheduler.hash_block_size
    tables = []
    for group_id, table in enumerate(_group_tables(block_ids)):
        block_size = groups[group_id].kv_cache_spec.block_size if group_id < len(groups) else 0
        hashes: Any = ()
        num_hashed = 0
        if num_hashed_tokens > 0 and block_size and request.block_hashes:
            hashes = request.block_hashes
            if block_size != hash_block_size and block_size % hash_block_size == 0:
                hashes = BlockHashListWithBlockSize(hashes, hash_block_size, block_size)
            num_hashed = min(num_hashed_tokens // block_size, len(hashes))
        group = []
        for i, block_id in enumerate(table):
            if block_id == 0:
                group.append(_NULL_BLOCK)
                continue
            block = KVCacheBlock(block_id)
            if i < num_hashed:
                block.set_block_hash(make_block_hash_with_group_id(hashes[i], group_id))
            group.append(block)
        tables.append(tuple(group))
    return KVCacheBlocks(tuple(tables))


class _WaitingView:
    """``scheduler.waiting`` as vLLM's callers read it: the waiting requests in scheduling
    order (requests holding KV blocks first), with ``len``, iteration, ``in`` and
    ``peek_request``. A snapshot: it does not change as the scheduler does."""

    __slots__ = ("_requests",)

    def __init__(self, requests: list[Request]) -> None:
        self._requests = requests

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)

    def __contains__(self, request: object) -> bool:
        return request in self._requests

    def __getitem__(self, index: int) -> Request:
        return self._requests[index]

    def peek_request(self) -> Request:
        if not self._requests:
            raise IndexError("peek from an empty queue")
        return self._requests[0]

    def __repr__(self) -> str:
        return f"WaitingView({[r.request_id for r in self._requests]})"


class _KVCacheManagerView:
    """``scheduler.kv_cache_manager`` as far as tokenyard can answer it: block tables, free
    blocks, usage, the prefix-cache stats being gathered, the prefix-cache reset, and
    read-only views of the block pool and the coordinator (``_vllm_coordinator_view``:
    per-block ref counts, each group's ``req_to_blocks`` and ``num_cached_block``, the null
    block), read from the core. vLLM's hash map, keyed by vLLM's block hashes, is not
    offered (the core hashes blocks its own way)."""

    def __init__(self, scheduler: AdapterState) -> None:
        self._scheduler = scheduler
        self.kv_cache_config = scheduler.kv_cache_config
        self.block_size = scheduler.block_size
        self.block_pool = BlockPoolView(scheduler)
        # vLLM builds its HybridKVCacheCoordinator for several groups with prefix caching.
        caching = bool(getattr(scheduler.cache_config, "enable_prefix_caching", False))
        hybrid = scheduler._kv_groups > 1 and caching
        view = HybridCoordinatorView if hybrid else CoordinatorView
        self.coordinator = view(scheduler, self.block_pool)
        self.num_kv_cache_groups = len(scheduler.kv_cache_config.kv_cache_groups)
        self._boundary_offers = BoundaryStateOffers(scheduler.kv_cache_config, caching)

    @property
    def enable_caching(self) -> bool:
        return self._scheduler._prefix_caching

    @property
    def usage(self) -> float:
        return self._scheduler.get_kv_cache_usage()

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        return self._scheduler._prefix_cache_stats

    def take_boundary_state_offloads(
        self, request_ids: Iterable[str] | None = None
    ) -> dict[str, list[tuple[int, int, int]]]:
        """vLLM's: drains the Mamba ``align`` boundary-state hand-offs since the last take,
        ``{request_id: [(group_id, block_id, boundary_tokens), ...]}``, empty without such
        a group or prefix caching (``_vllm_boundary_offloads``). ``request_ids`` orders the
        requests (the scheduler's, in arrival order, by default)."""
        scheduler = self._scheduler
        order = scheduler.requests if request_ids is None else request_ids
        return self._boundary_offers.take(self, scheduler._core, order)

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        scheduler = self._scheduler
        if scheduler._prefix_cache_stats is None:
            return None
        stats, scheduler._prefix_cache_stats = scheduler._prefix_cache_stats, PrefixCacheStats()
        return stats

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table, one list per KV cache group (null blocks, id 0, where
        a group no longer attends)."""
        scheduler = self._scheduler
        core_id = scheduler._core_ids.get(request_id)
        if core_id is None and scheduler._kv_groups:
            # A request given blocks outside the scheduler (allocate_slots).
            tables = scheduler._core.kv_block_tables(request_id)
            if tables is not None:
                return tuple(g.tolist() for g in tables)
        # An unknown id goes to the core as it is, which raises naming it.
        core_id = request_id if core_id is None else core_id
        if scheduler._kv_groups:
            groups = scheduler._core.group_block_ids(core_id)
            if not groups:  # no blocks yet: an empty table per group, as vLLM's
                return tuple([] for _ in range(scheduler._kv_groups))
            return tuple(g.tolist() for g in groups)
        return (vllm_block_ids(scheduler._core.block_ids(core_id)),)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """vLLM's ``get_blocks``: the request's blocks per KV cache group, as block views
        (``_vllm_coordinator_view``; the null block where a group no longer attends), an
        empty list per group for a request holding none."""
        managers = self.coordinator.single_type_managers
        return KVCacheBlocks(tuple(m.req_to_blocks.get(request_id) or [] for m in managers))

    def get_num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    # Set while the core asks a replaced allocate_slots (``_vllm_hooks``).
    _asked_by_core = False

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        *args: Any,
        **kwargs: Any,
    ) -> KVCacheBlocks | None:
        """vLLM's ``allocate_slots``. Asked by the core's step when a caller replaced it
        (``_vllm_hooks``): a replacement that calls this lets the core allocate, and gets
        the empty ``KVCacheBlocks`` (the core's blocks go out in the step's output). For a
        request this scheduler does not hold (vLLM's tests seed a prefix cache so), the
        core allocates outside its schedule (``Scheduler.kv_allocate_outside``, several KV
        groups): ``request.num_computed_tokens`` computed before, ``num_new_tokens`` more,
        full blocks cached; each group's new blocks, or None when they do not fit.

        Raises:
            InputError: a request the scheduler holds (its slots come from the core within
                ``schedule()``); outside the scheduler, a prefix hit to adopt
                (``num_new_computed_tokens``), lookahead slots or any of vLLM's later
                arguments (not served), a multimodal request, or computed tokens other than
                the blocks given so far.
            ConfigError: outside the scheduler with a single KV group.
        """
        if self._asked_by_core:
            return KVCacheBlocks(tuple(() for _ in range(self.num_kv_cache_groups)))
        request_id = request.request_id
        scheduler = self._scheduler
        if request_id in scheduler._core_ids:
            raise InputError(
                f"allocate_slots: {request_id!r} gets its slots from the core within "
                "schedule(); kv_cache_manager.allocate_slots is answered only there",
                field="request_id",
                value=str(request_id),
            )
        given, computed = scheduler._core.kv_outside_tokens(request_id) or (0, 0)
        asked = [
            ("num_new_computed_tokens", num_new_computed_tokens),
            ("num_lookahead_tokens", num_lookahead_tokens),
            *(("args", a) for a in args),
            *kwargs.items(),
        ]
        refused = [(field, value) for field, value in asked if value]
        if request.mm_features:
            refused.append(("mm_features", len(request.mm_features)))
        if request.num_computed_tokens != computed:
            refused.append(("num_computed_tokens", request.num_computed_tokens))
        if refused:
            field, value = refused[0]
            raise InputError(
                f"allocate_slots: {field}={value!r} for {request_id!r}, a request outside the "
                f"scheduler with {computed} computed tokens, is not served (blocks for its "
                "tokens only, no prefix hit adopted)",
                field=field,
                value=str(value),
            )
        lora = request.lora_request
        token_ids = list(request.all_token_ids[given:])
        new = scheduler._core.kv_allocate_outside(
            request_id,
            token_ids,
            num_new_tokens,
            lora_id=lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else None,
        )
        if new is None:
            return None
        # vLLM's hashes of its blocks, for the coordinator view's per-group lookup.
        scheduler._block_hash_index.index(request)
        return KVCacheBlocks(tuple(self.block_pool._blocks_of(g) for g in new))

    def free(self, request: Request) -> None:
        """vLLM's ``free`` for a request ``allocate_slots`` gave blocks outside the
        scheduler (InputError for any other: the scheduler frees its own requests')."""
        request_id = request.request_id
        if self._scheduler._core.kv_outside_tokens(request_id) is None:
            raise InputError(
                f"free: {request_id!r} holds no blocks given outside the scheduler (its own "
                "requests' blocks are freed when they finish or are aborted)",
                field="request_id",
                value=str(request_id),
            )
        self._scheduler._core.kv_free_outside(request_id)

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[None, int, int]:
        """The prefix-cache hit an admission of ``request`` would find now (a probe:
        nothing is allocated), as ``(blocks, num_computed_tokens, shared_prefix_boundary)``.
        The blocks themselves live in Rust and are not exposed (``None``); the boundary is
        always 0 (one full-attention group)."""
        if getattr(request, "skip_reading_prefix_cache", False):
            return None, 0, 0
        lora = request.lora_request
        token_ids = request.all_token_ids
        scheduler = self._scheduler
        if scheduler._prefix_caching:
            # The tokens the core keyed the request's blocks by.
            num_prompt = request.num_prompt_tokens
            prompt = keyed_prompt(
                request,
                list(token_ids[:num_prompt]),
                scheduler.hash_block_size,
                lookahead=scheduler._core.num_hash_lookahead_tokens,
            )
            token_ids = [*prompt, *token_ids[num_prompt:]]
        num_tokens = self._scheduler._core.num_cached_prefix_tokens(
            token_ids,
            lora_id=lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else None,
        )
        if max_cache_hit_length is not None and num_tokens > max_cache_hit_length:
            block_size = self._scheduler.block_size
            num_tokens = max_cache_hit_length // block_size * block_size
        return None, num_tokens, 0

    def evict_blocks(self, block_ids: set[int]) -> None:
        """vLLM's ``evict_blocks``: ``block_pool.evict_blocks`` (the adapter calls it where
        vLLM's ``_handle_invalid_blocks`` does, after the core evicted those blocks)."""
        self.block_pool.evict_blocks(block_ids)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """vLLM's ``cache_blocks``: the request's full blocks within its first
        ``num_computed_tokens`` tokens enter the prefix cache (nothing without prefix
        caching). The core caches a request's blocks as it computes them and a landed
        load's valid prefix when the load is promoted; the adapter calls this where vLLM's
        ``_update_waiting_for_remote_kv`` does, with vLLM's arguments, and it finds them
        cached.

        Raises:
            InputError: a request the scheduler does not hold, or blocks within
                ``num_computed_tokens`` the core has not cached (caching ahead of the core
                is not served).
        """
        scheduler = self._scheduler
        if not scheduler._prefix_caching:
            return
        wanted = num_computed_tokens // self.block_size
        if wanted == 0:
            return
        request_id = request.request_id
        core_id = scheduler._core_ids.get(request_id)
        counts = None if core_id is None else scheduler._core.num_cached_blocks_of(core_id)
        # With several KV groups each caches as the core's coordinator does (vLLM's
        # per-group managers); the full-attention group's count is the largest.
        cached = 0 if counts is None else max(counts)
        if cached < wanted:
            raise InputError(
                f"cache_blocks: {request_id!r} has {cached} blocks cached by the core; caching "
                f"{wanted} (num_computed_tokens={num_computed_tokens}) ahead of it is not served",
                field="num_computed_tokens",
                value=str(num_computed_tokens),
            )

    def reset_prefix_cache(self) -> bool:
        reset, _ = self._scheduler._core.reset_prefix_cache(preempt_running=False)
        return bool(reset)
