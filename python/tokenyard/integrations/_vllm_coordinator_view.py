"""vLLM's KV block pool as ``TokenyardScheduler`` (``tokenyard.integrations.vllm``) shows
it: ``kv_cache_manager.block_pool`` with its blocks and free queue (the coordinator and its
single-type managers over it are ``_vllm_manager_views``). vLLM 0.33's names and meaning
(``vllm/v1/core/block_pool.py``), read from the Rust core each time they are read:
nothing here is a copy that could drift from it, and nothing can be written through them.

Block ids are vLLM's: the core's single pool numbers its blocks from 0 and vLLM's from 1
(vLLM's block 0 is the null block), so its ids are shifted by one here; with several KV
groups the core's coordinator numbers them as vLLM does, null block included. A block's
``block_hash`` is vLLM's (``BlockHashWithGroupId`` bytes) when the adapter indexes vLLM's
hashes of its requests (``_vllm_aux_outputs.BlockHashIndex``: beside a connector that binds
vLLM's GPU block pool, or a Mamba ``align`` group), else the core's own 128-bit hash (an
``int``). The pool's references taken by a KV connector's scheduler side (``touch``,
``get_new_blocks``) and dropped by it (``free_blocks``) are the core's (its loose blocks):
they keep a block out of the free queue as vLLM's ref counts do. Imported only by
``_vllm_views`` and ``_vllm_manager_views``, so vLLM is installed when this runs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

from tokenyard._core import group_block_hashes
from tokenyard.errors import InputError


class CoreState(Protocol):
    """What these views read of ``TokenyardScheduler`` (named here so that this module
    need not import the one that imports it)."""

    kv_cache_config: Any
    block_size: int
    hash_block_size: int
    _core: Any
    _core_ids: dict[str, Any]
    _num_kv_blocks: int
    _kv_groups: int
    _prefix_caching: bool
    _block_hash_index: Any
    _index_hashes: bool
    requests: dict[str, Any]

    def get_kv_cache_usage(self) -> float: ...


class KVCacheBlockView:
    """One KV block as vLLM's ``KVCacheBlock`` presents it: ``block_id``, ``ref_cnt`` (the
    requests holding it), ``block_hash`` (the core's hash it caches, or ``None``) and
    ``is_null``. Its fields are read from the core when read (each read copies the pool's
    per-block state: O(blocks), for inspection, not for a loop over a large pool; in a
    reading stretch ``ref_cnt`` is read once, and dropped by the stretch's touches and
    frees); the pool
    hands out one object per block, so ``is`` compares blocks as it does in vLLM (the null
    block included)."""

    __slots__ = ("_pool", "block_id")

    def __init__(self, pool: BlockPoolView, block_id: int) -> None:
        self._pool = pool
        self.block_id = block_id

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    @property
    def ref_cnt(self) -> int:
        if self.block_id == 0:
            return 0
        pool = self._pool
        return int(pool._ref_counts()[pool._core_index(self.block_id)])

    @property
    def block_hash(self) -> Any:
        """vLLM's ``BlockHashWithGroupId`` of the block's cached prefix where the adapter
        indexes vLLM's hashes (else the core's ``int``), or ``None`` when it caches none."""
        found = self._pool._vllm_hash_of(self.block_id)
        return found[0] if isinstance(found, tuple) else found

    @property
    def block_hash_num_tokens(self) -> int | None:
        """vLLM's: the prefix tokens ``block_hash`` covers (a whole block's end), or
        ``None`` (no vLLM hash known for it)."""
        found = self._pool._vllm_hash_of(self.block_id)
        return found[1] if isinstance(found, tuple) else None

    # vLLM's field behind the properties, which its tests read.
    _block_hash = block_hash
    _block_hash_num_tokens = block_hash_num_tokens

    def __repr__(self) -> str:
        return f"KVCacheBlockView(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class _FreeBlockQueueView:
    """vLLM's ``FreeKVCacheBlockQueue``: ``num_free_blocks`` (which vLLM's tests force; the
    core then reads a forced count, see the setter), the free blocks in eviction order
    (``get_all_free_blocks``) and those after a free block (``iter_blocks_after``)."""

    __slots__ = ("_pool",)

    def __init__(self, pool: BlockPoolView) -> None:
        self._pool = pool

    @property
    def num_free_blocks(self) -> int:
        return int(self._pool._scheduler._core.num_free_blocks)

    @num_free_blocks.setter
    def num_free_blocks(self, num_free_blocks: int) -> None:
        """vLLM's tests force the queue's count (``free_block_queue.num_free_blocks = 0``)
        to make ``allocate_slots`` fail and preempt. vLLM's ``FreeKVCacheBlockQueue``
        (``vllm/v1/core/kv_cache_utils.py``) keeps every free block linked in order while
        ``num_free_blocks`` is a plain counter: ``popleft``/``popleft_n``/``remove`` take one
        (n) from both, ``append``/``append_n``/``prepend_n`` add to both, so the gap forced
        stays; ``BlockPool.get_num_free_blocks`` (read by ``get_new_blocks``,
        ``get_usage``, ``KVCacheManager.allocate_slots`` and the external-load checks) is
        the counter, the pops walk the list. The core keeps the same gap
        (``force_num_free_blocks``): its fit checks, free count and usage read the queue's
        length less it; its queue keeps its blocks and order.

        Raises:
            InputError: ``num_free_blocks`` not an int, negative, or above the blocks the
                queue holds (vLLM's pops would then walk onto its list's sentinel).
        """
        if isinstance(num_free_blocks, bool) or not isinstance(num_free_blocks, int):
            raise InputError(
                f"free_block_queue.num_free_blocks={num_free_blocks!r}: must be an int",
                field="num_free_blocks",
                value=repr(num_free_blocks),
            )
        if num_free_blocks < 0:
            raise InputError(
                f"free_block_queue.num_free_blocks={num_free_blocks!r}: must be >= 0",
                field="num_free_blocks",
                value=str(num_free_blocks),
            )
        self._pool._scheduler._core.force_num_free_blocks(num_free_blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlockView]:
        pool = self._pool
        return pool._blocks_of(pool._scheduler._core.free_block_ids())

    def iter_blocks_after(self, cursor: KVCacheBlockView | None) -> Iterator[KVCacheBlockView]:
        """vLLM's: the free blocks in eviction order after ``cursor`` (from the front for
        ``None``; none after a block no longer free, whose links vLLM clears). Read once,
        when iteration starts."""
        pool = self._pool
        free = (pool._scheduler._core.free_block_ids() + pool._offset).tolist()
        if cursor is not None:
            # A lazy offloader walks from its cursor each step (SimpleCPUOffloadScheduler):
            # found in the ids, not by a view per free block.
            if cursor is not pool._block(cursor.block_id) or cursor.block_id not in free:
                return iter(())
            free = free[free.index(cursor.block_id) + 1 :]
        # Each view made as the walk reaches it (a walk stops after a few).
        return map(pool._block, free)


class _BlockList(Sequence[KVCacheBlockView]):
    """``BlockPool.blocks`` as vLLM's list reads: ``len``, an index (negative ones too), a
    slice, iteration. The pool keeps one, made when first read, with every block's view
    (a connector reads ``blocks[i]`` per block it stores, several times a step)."""

    __slots__ = ("_pool", "_views")

    def __init__(self, pool: BlockPoolView) -> None:
        self._pool = pool
        self._views = [pool._block(j) for j in range(pool.num_gpu_blocks)]

    def __len__(self) -> int:
        return len(self._views)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self._views[i]
        n = len(self._views)
        if not -n <= i < n:
            raise IndexError(f"block index {i} out of range ({n} blocks)")
        return self._views[i]

    def __eq__(self, other: object) -> bool:
        return list(self) == other if isinstance(other, list | _BlockList) else NotImplemented

    __hash__ = None  # type: ignore[assignment]


class _BlockHashToBlockView:
    """vLLM's ``BlockHashToBlockMap`` (``BlockPool.cached_block_hash_to_block``) read-only:
    each cached hash (``block_hash`` of the blocks caching one) to its block, or to a dict
    of block id to block where several cache it (vLLM's ``_cache``); built from the core
    when read."""

    __slots__ = ("_pool",)

    def __init__(self, pool: BlockPoolView) -> None:
        self._pool = pool

    @property
    def _cache(self) -> dict[Any, Any]:
        pool = self._pool
        cache: dict[Any, Any] = {}
        for index, core_hash in enumerate(pool._scheduler._core.block_hashes()):
            if core_hash is None:
                continue
            block = pool._block(index + pool._offset)
            key = block.block_hash
            found = cache.get(key)
            if found is None:
                cache[key] = block
            elif isinstance(found, dict):
                found[block.block_id] = block
            else:
                cache[key] = {found.block_id: found, block.block_id: block}
        return cache

    def get_one_block(self, key: Any) -> KVCacheBlockView | None:
        """vLLM's: a block caching ``key`` (the first entered, for several), or ``None``."""
        found = self._cache.get(key)
        block: KVCacheBlockView | None = (
            next(iter(found.values())) if isinstance(found, dict) else found
        )
        return block

    def __len__(self) -> int:
        return len(self._cache)


class BlockPoolView:
    """vLLM's ``BlockPool``: its size, free blocks, usage, ``blocks`` (every block, the
    null block first), ``null_block`` and ``free_block_queue``, read from the core; and the
    references a KV connector's scheduler side takes and drops (``touch``,
    ``get_new_blocks``, ``free_blocks``), which the core keeps. The hash map
    (``cached_block_hash_to_block``) is read-only, keyed by the blocks' ``block_hash``
    (vLLM's where the adapter indexes vLLM's hashes, else the core's). The core
    registers no partial-prefix entries, so ``cached_block_hashes_by_block`` (vLLM's
    secondary hashes per block) is always empty."""

    cached_block_hashes_by_block: Mapping[int, Any] = MappingProxyType({})

    def __init__(self, scheduler: CoreState) -> None:
        self._scheduler = scheduler
        # Set when a served KV connector keeps this pool (_vllm_connector_binding): the core
        # calls then run in `asking` windows.
        self.kept_by_connector = False
        # Inside such a window (the core is busy asking the connector): the blocks' cached
        # hashes as the window began, and the references taken and dropped meanwhile.
        self._window_hashes: list[Any] | None = None
        self._window_blocks: dict[int, int] | None = None  # its blocks by key, when read
        # vLLM's hashes of the blocks a step's update caches meanwhile (cached_by_update).
        self._window_cached: dict[int, tuple[Any, int]] = {}
        self._window_keys: dict[Any, int] = {}  # the same by key: its first block
        # Beside a chunked local attention group: the live requests' tables (vLLM's ids)
        # as the window began, read by cached_by_update (see there).
        groups = scheduler.kv_cache_config.kv_cache_groups
        self._chunked = any(
            type(g.kv_cache_spec).__name__ == "ChunkedLocalAttentionSpec" for g in groups
        )
        self._window_tables: dict[str, list[list[int]]] = {}
        self._finished_in_window: list[Any] = []  # their requests, indexed after
        # The hashes the last window checked the index knows (unchanged: not again).
        self._checked_hashes: list[Any] | None = None
        # Outside windows, in a reading stretch: the core's hashes once read, and inside
        # either, each block's answer once given (the window's or stretch's).
        self._read_hashes: list[Any] | None = None
        self._answers: dict[int, Any] | None = None
        # In a reading stretch, the ref counts once read (its touches and frees drop them).
        self._read_refs: np.ndarray | None = None
        # vLLM's hash of each core key resolved so far, while the hash index's answers
        # stay (its version): a block keeps its answer across windows and stretches.
        self._resolved: dict[int, tuple[Any, int]] = {}
        self._resolved_version = -1
        self._deferred: list[tuple[str, list[int]]] = []
        # In a schedule's window: the landed loads its waiting pass caches as it reaches
        # them (expect_landings), each with its place in the waiting order and its tables.
        self._landings: list[tuple[int, Any, list[list[int]]]] = []
        self._waiting_place: dict[str, int] = {}
        # The core's single pool numbers blocks from 0, vLLM's from 1.
        self._offset = 0 if scheduler._kv_groups else 1
        self._views: dict[int, KVCacheBlockView] = {}
        self._block_list: _BlockList | None = None
        self.null_block = self._block(0)
        self._window_cm = _Window(self)
        self._stretch_cm = _Stretch(self)
        self.free_block_queue = _FreeBlockQueueView(self)
        self.hash_block_size = scheduler.hash_block_size

    @property
    def enable_caching(self) -> bool:
        return self._scheduler._prefix_caching

    @property
    def num_gpu_blocks(self) -> int:
        return self._scheduler._num_kv_blocks + 1

    @property
    def cached_block_hash_to_block(self) -> _BlockHashToBlockView:
        return _BlockHashToBlockView(self)

    @property
    def blocks(self) -> _BlockList:
        """Every block in id order, the null block (id 0) first (one list of the pool's
        views, built at the first read and kept: a connector reads ``blocks[i]`` per
        block)."""
        if self._block_list is None:
            self._block_list = _BlockList(self)
        return self._block_list

    def get_num_free_blocks(self) -> int:
        """Blocks free for allocation, cached blocks no request holds included (vLLM's
        count, a forced one as ``free_block_queue.num_free_blocks`` set it; the null block
        is never free)."""
        return int(self._scheduler._core.num_free_blocks)

    def get_usage(self) -> float:
        return self._scheduler.get_kv_cache_usage()

    def get_cached_block(
        self, block_hash: Any, kv_cache_group_ids: list[int]
    ) -> list[KVCacheBlockView] | None:
        """The blocks caching vLLM's ``block_hash`` in each group, or ``None`` (vLLM's;
        answered for the hashes of requests the auxiliary-output connector was asked about,
        ``_vllm_aux_outputs.BlockHashIndex``; ``None`` for any other hash)."""
        if self._window_hashes is not None:
            core_ids = self._cached_in_window(block_hash, kv_cache_group_ids)
        else:
            core_ids = self._scheduler._block_hash_index.cached_block_ids(
                block_hash, kv_cache_group_ids
            )
        if core_ids is None:
            return None
        return [self._block(b + self._offset) for b in core_ids]

    def _cached_in_window(self, block_hash: Any, group_ids: Iterable[int]) -> list[int] | None:
        """``get_cached_block`` inside an ``asking`` window (the core cannot be asked
        then): the blocks caching the hash as the window began, else those the update
        caches meanwhile (``cached_by_update``), in the core's ids."""
        window = self._window_hashes
        scheduler = self._scheduler
        core = scheduler._block_hash_index.core_hashes([block_hash])
        if window is None:
            return None
        if not core:
            return self._cached_by_update_in(block_hash, group_ids)
        if self._window_blocks is None:
            # Each key's lowest block (a key two blocks cache, computed twice at once, is
            # not told apart here as the core's map would).
            blocks: dict[int, int] = {}
            for block, cached in enumerate(window):
                if cached is not None:
                    blocks.setdefault(cached, block)
            self._window_blocks = blocks
        found = []
        for group in group_ids:
            key = group_block_hashes(core, group=group)[0] if scheduler._kv_groups else core[0]
            hit = self._window_blocks.get(key)
            if hit is None or (not scheduler._kv_groups and group != 0):
                return self._cached_by_update_in(block_hash, group_ids)
            found.append(hit)
        return found

    def _cached_by_update_in(self, block_hash: Any, group_ids: Iterable[int]) -> list[int] | None:
        """The blocks the window's update caches under vLLM's ``block_hash`` in each group
        (``cached_by_update``), in the core's ids, or ``None``."""
        if not self._window_cached:
            return None
        found = []
        for group in group_ids:
            block = self._window_keys.get(make_block_hash_with_group_id(block_hash, group))
            if block is None:
                return None
            found.append(block - self._offset)
        return found

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlockView]:
        """vLLM's ``get_new_blocks``: ``num_blocks`` blocks from the front of the free queue
        (evicting what they cached), each held once outside any request, until
        ``free_blocks`` or a block copy queued on them (``_pending_cow_copies``) releases
        it.

        Raises:
            InputError: fewer blocks are free (vLLM raises ``ValueError``; this is one).
            ConfigError: over the radix pool (``prefix_cache="radix"``).
        """
        core_ids = self._scheduler._core.take_loose_blocks(int(num_blocks))
        self._forget_reads()
        return [self._block(b + self._offset) for b in core_ids]

    def asking(self) -> AbstractContextManager[None]:
        """The window of a core call that may ask the KV connector (``schedule``, an
        update, an abort): the core cannot be read or changed until it returns, so the
        connector's ``touch`` and ``free_blocks`` meanwhile are applied, in their order,
        when it does, and the blocks' ``block_hash`` answers as the window began (the
        connector reads the hashes of the blocks of the request it is asked about, which
        a step's update does not change but for ``cached_by_update``). A no-op unless a
        served connector keeps the pool."""
        if not self.kept_by_connector or self._window_hashes is not None:
            return _NO_WINDOW
        return self._window_cm

    def reading(self) -> AbstractContextManager[None]:
        """A stretch where the connector reads the pool but nothing changes the blocks'
        hashes (``build_connector_meta``: its touches and frees keep them; a
        ``get_new_blocks`` or ``evict_blocks`` drops the snapshot): the hashes are read
        from the core once, when first asked, and each block's answer once. A no-op
        unless a served connector keeps the pool, or inside a window."""
        if not self.kept_by_connector or self._window_hashes is not None:
            return _NO_WINDOW
        return self._stretch_cm

    def _begin_stretch(self) -> None:
        self._answers = {}

    def _end_stretch(self) -> None:
        self._read_hashes = self._answers = self._read_refs = None

    def _forget_reads(self) -> None:
        """The core's hashes changed: a reading stretch reads them again."""
        if self._answers is not None and self._window_hashes is None:
            self._read_hashes, self._answers, self._read_refs = None, {}, None

    def _open_window(self) -> None:
        hashes = self._scheduler._core.block_hashes()
        if hashes != self._checked_hashes:
            self._index_cached(hashes)
        self._checked_hashes = hashes
        self._window_hashes = hashes
        self._answers = {}
        if self._chunked:
            self._window_tables = self._live_tables()

    def _close_window(self) -> None:
        self._window_hashes = self._window_blocks = self._answers = None
        if self._window_cached:
            self._window_cached, self._window_keys = {}, {}
        if self._window_tables:
            self._window_tables = {}
        if self._landings or self._waiting_place:
            self._landings, self._waiting_place = [], {}
        if self._finished_in_window:
            # Their hashes stay the blocks' answer once the request has left.
            finished, self._finished_in_window = self._finished_in_window, []
            for request in finished:
                self._scheduler._block_hash_index.index(request)
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            core = self._scheduler._core
            for op, ids in deferred:
                if op == "touch":
                    core.touch_loose_blocks(ids)
                else:
                    core.free_loose_blocks(ids)

    def _live_tables(self) -> dict[str, list[list[int]]]:
        """Every request's block tables in vLLM's ids, by vLLM id (one core read each)."""
        core = self._scheduler._core
        live = {}
        for request_id, core_id in self._scheduler._core_ids.items():
            tables = core.kv_block_tables(core_id)
            if tables is not None:
                live[request_id] = [(t + self._offset).tolist() for t in tables]
        return live

    def expect_landings(self, waiting_order: Sequence[str], landed: Sequence[Any]) -> None:
        """Before a schedule's ``asking`` window: the ``landed`` loads (vLLM requests, in
        ``waiting_order``, vLLM's waiting pass order) that the pass caches as it reaches
        each (vLLM 0.33's ``_update_waiting_for_remote_kv``: ``cache_blocks``, as the core
        does), with their tables as the step begins (the core cannot be read in the
        window). ``landed_before`` enters them. A no-op unless a served connector keeps the
        pool."""
        if not self.kept_by_connector or not landed:
            return
        place = {request_id: i for i, request_id in enumerate(waiting_order)}
        core = self._scheduler._core
        core_ids = self._scheduler._core_ids
        landings = []
        for request in landed:
            tables = core.kv_block_tables(core_ids[request.request_id])
            if tables is not None and request.request_id in place:
                vllm_tables = [(t + self._offset).tolist() for t in tables]
                landings.append((place[request.request_id], request, vllm_tables))
        self._landings, self._waiting_place = landings, place

    def landed_before(self, request_id: str) -> None:
        """Inside a schedule's window, before the KV connector is asked about the waiting
        request ``request_id``: the landed loads ahead of it in the waiting order were
        promoted by then and cached their blocks, which ``block_hash`` and
        ``get_cached_block`` answer with from now on (as ``cached_by_update``; UMBP's
        lookup probes the local cache per group for a request sharing their prefix)."""
        place = self._waiting_place.get(request_id)
        if place is None or not self._landings:
            return
        due = [landing for landing in self._landings if landing[0] < place]
        self._landings = [landing for landing in self._landings if landing[0] >= place]
        for _, request, tables in due:
            self.cached_by_update(request, tables)

    def cached_by_update(self, request: Any, tables: Sequence[Sequence[int]]) -> None:
        """Inside an update's ``asking`` window, before the connector is told ``request``
        finished: its blocks the update caches, as vLLM's ``update_from_output`` does before
        it frees a request whose outputs landed late (``cache_blocks`` up to
        ``num_computed_tokens - num_in_flight_tokens``, for output placeholders or
        speculative tokens), answer ``block_hash`` with vLLM's hash from then on, as the
        core caches them when the update returns. Its whole blocks computed up to the last
        scheduler block boundary (``get_num_cacheable_tokens``), each group's table (vLLM's
        ids) from the front in the group's block size, each block under its last hash
        block's hash (``resolve_block_hashes``), null blocks skipped."""
        window = self._window_hashes
        scheduler = self._scheduler
        if window is None or not scheduler._index_hashes:
            return
        if self._answers:
            self._answers.clear()
        num_tokens = request.num_computed_tokens - request.num_in_flight_tokens
        num_tokens = num_tokens // scheduler.block_size * scheduler.block_size
        vllm_hashes = request.block_hashes
        hash_size = scheduler.hash_block_size
        num_tokens = min(num_tokens, len(vllm_hashes) * hash_size)
        groups = scheduler.kv_cache_config.kv_cache_groups
        before = self._window_tables.get(request.request_id)
        cached = False
        for group, table in enumerate(tables):
            if before is not None:
                # vLLM caches before _connector_finished drops the blocks that left a chunked
                # local attention group's chunk (remove_skipped_blocks): a chunk crossed by
                # the landed tokens is cached whole, then nulled in the tables given here,
                # and the connector stores it from the GPU prefix cache (_cached_gpu_block).
                old = before[group]
                table = [b or (old[i] if i < len(old) else 0) for i, b in enumerate(table)]
            size = (
                groups[group].kv_cache_spec.block_size
                if scheduler._kv_groups
                else scheduler.block_size
            )
            step = size // hash_size
            for i, block_id in enumerate(table[: num_tokens // size]):
                if block_id != 0 and window[self._core_index(block_id)] is None:
                    key = make_block_hash_with_group_id(vllm_hashes[(i + 1) * step - 1], group)
                    self._window_cached[block_id] = (key, (i + 1) * size)
                    self._window_keys.setdefault(key, block_id)
                    cached = True
        if cached:
            self._finished_in_window.append(request)

    def _index_cached(self, hashes: Sequence[Any]) -> None:
        """Enters the live requests' vLLM hashes again if some block caches a hash the
        index does not know (a request's hashes grow with its tokens)."""
        scheduler = self._scheduler
        if not scheduler._index_hashes:
            return
        index = scheduler._block_hash_index
        if not index.knows_all(hashes):
            for request in list(scheduler.requests.values()):
                index.index(request)

    def touch(self, blocks: Iterable[KVCacheBlockView]) -> None:
        """vLLM's ``touch`` called by a KV connector (``SimpleCPUOffloadScheduler`` keeps
        the GPU blocks it stores from and loads into): one reference more on each block
        (the null block skipped, as vLLM does), held until ``free_blocks``; a free block
        leaves the free queue with its cached hash, so it is not evicted meanwhile, and a
        request freeing a touched block leaves it held.

        Raises:
            IndexError: a block id past the pool (nothing changed then).
        """
        ids = [self._core_index(b.block_id) for b in blocks if b.block_id != 0]
        if not ids:
            return
        if self._window_hashes is not None:
            self._deferred.append(("touch", ids))
        else:
            self._read_refs = None
            self._scheduler._core.touch_loose_blocks(ids)

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlockView]) -> None:
        """vLLM's ``free_blocks`` on references from ``get_new_blocks`` or ``touch``: one
        dropped from each block (first evicted first; the null block skipped, as vLLM
        does); a block left unheld rejoins the free queue, a cached one at the back. Blocks
        of a request's table are freed with the request, not here.

        Raises:
            InputError: a block without such a reference left (nothing changed then).
        """
        ids = [self._core_index(b.block_id) for b in ordered_blocks if b.block_id != 0]
        if not ids:
            return
        if self._window_hashes is not None:
            self._deferred.append(("free", ids))
        else:
            self._read_refs = None
            self._scheduler._core.free_loose_blocks(ids)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """vLLM's ``evict_blocks``: each block that caches a hash leaves the prefix cache
        (held or free, it stays so); a block caching none is skipped, as vLLM skips it.
        Served with several KV groups (the core's coordinator); with the single pool only
        where no block given caches a hash (the core already evicted a failed load's blocks:
        ``_vllm_kv_transfers``), ConfigError otherwise. IndexError for an id past the pool
        (nothing changed then)."""
        ids = [int(b) for b in block_ids]
        for block_id in ids:
            if not 0 <= block_id < self.num_gpu_blocks:
                raise IndexError(f"block_id {block_id} is not a block of this pool")
        if not self._scheduler._kv_groups:
            hashes = self._scheduler._core.block_hashes()
            if all(b == 0 or hashes[b - self._offset] is None for b in ids):
                return
        self._scheduler._core.kv_evict_blocks([b - self._offset for b in ids if b >= self._offset])
        self._forget_reads()

    def _block(self, block_id: int) -> KVCacheBlockView:
        view = self._views.get(block_id)
        if view is None:
            view = self._views[block_id] = KVCacheBlockView(self, block_id)
        return view

    def _blocks_of(self, core_ids: np.ndarray) -> list[KVCacheBlockView]:
        """The views of core block ids, in their order."""
        return [self._block(b) for b in (core_ids + self._offset).tolist()]

    def _core_index(self, block_id: int) -> int:
        if not 0 < block_id < self.num_gpu_blocks:
            raise IndexError(f"block_id {block_id} is not a block of this pool")
        return block_id - self._offset

    def _vllm_hash_of(self, block_id: int) -> tuple[Any, int] | int | None:
        """The block's cached hash: vLLM's with group id and the tokens it covers where the
        adapter indexes vLLM's hashes and knows this one (the live requests are entered
        again on a miss: their hashes grow with their tokens), else the core's ``int``;
        ``None`` when it caches none. Given once per window or reading stretch."""
        if block_id == 0:
            return None
        answers = self._answers
        found: tuple[Any, int] | int | None
        if answers is not None and block_id in answers:
            found = answers[block_id]
            return found
        found = self._read_vllm_hash(block_id)
        if answers is not None and not isinstance(found, int):
            answers[block_id] = found
        return found

    def _read_vllm_hash(self, block_id: int) -> tuple[Any, int] | int | None:
        scheduler = self._scheduler
        index = self._core_index(block_id)
        window = self._window_hashes
        in_window = window is not None
        hashes: Sequence[Any]
        if window is not None:
            hashes = window
        elif self._answers is not None:  # a reading stretch
            if self._read_hashes is None:
                self._read_hashes = scheduler._core.block_hashes()
            hashes = self._read_hashes
        else:
            hashes = scheduler._core.block_hashes()
        key: int | None = hashes[index]
        if key is None and in_window:
            return self._window_cached.get(block_id)
        if key is None or not scheduler._index_hashes:
            return key
        resolved = self._resolved
        version = scheduler._block_hash_index.version
        if version != self._resolved_version:
            resolved.clear()
            self._resolved_version = version
        answer = resolved.get(key)
        if answer is not None:
            return answer
        found = self._hash_and_group(key)
        if found is None and not in_window:
            self._index_cached(hashes)
            found = self._hash_and_group(key)
        if found is None:
            return key
        (vllm_hash, num_tokens), group = found
        answer = make_block_hash_with_group_id(vllm_hash, group), num_tokens
        if version == scheduler._block_hash_index.version:
            resolved[key] = answer
        return answer

    def _hash_and_group(self, key: int) -> tuple[tuple[Any, int], int] | None:
        """vLLM's hash and tokens of the block caching ``key`` (the core's hash, keyed by
        its group over the coordinator), and that group; ``None`` where not indexed."""
        hash_index = self._scheduler._block_hash_index
        core_hash, group = (
            hash_index.keyed(key) or (None, 0) if self._scheduler._kv_groups else (key, 0)
        )
        found = None if core_hash is None else hash_index.vllm_hash(core_hash)
        return None if found is None else (found, group)

    def _ref_counts(self) -> np.ndarray:
        """Each block's ref count (the core's ids); read once in a reading stretch."""
        counts = self._read_refs
        if counts is None:
            counts = self._scheduler._core.block_ref_counts()
            if self._answers is not None and self._window_hashes is None:
                self._read_refs = counts
        return counts


class _Window:
    """``BlockPoolView.asking``'s context (a class, not a generator: entered twice a
    step)."""

    __slots__ = ("_pool",)

    def __init__(self, pool: BlockPoolView) -> None:
        self._pool = pool

    def __enter__(self) -> None:
        self._pool._open_window()

    def __exit__(self, *exc: object) -> None:
        self._pool._close_window()


class _Stretch:
    """``BlockPoolView.reading``'s context."""

    __slots__ = ("_pool",)

    def __init__(self, pool: BlockPoolView) -> None:
        self._pool = pool

    def __enter__(self) -> None:
        self._pool._begin_stretch()

    def __exit__(self, *exc: object) -> None:
        self._pool._end_stretch()


_NO_WINDOW = nullcontext()
