"""vLLM's KV cache coordinator as ``TokenyardScheduler`` (``tokenyard.integrations.vllm``)
shows it: ``kv_cache_manager.coordinator`` with one single-type manager per KV cache group
(``req_to_blocks``, ``num_cached_block``, the null block, copy-on-write queues), over the
block pool view of ``_vllm_coordinator_view``. vLLM 0.33's names and meaning
(``vllm/v1/core/kv_cache_coordinator.py``, ``single_type_kv_cache_manager.py``), read from
the Rust core each time they are read; nothing can be written through them but the copy
queues. Imported only by ``_vllm_views``, so vLLM is installed when this runs."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
from vllm.v1.core.single_type_kv_cache_manager import CrossAttentionManager

from tokenyard.integrations._vllm_coordinator_view import (
    BlockPoolView,
    CoreState,
    KVCacheBlockView,
)


class _RequestMap(Mapping[str, Any]):
    """A per-request mapping of one KV group, read from the core on each access: keys are
    the vLLM ids of the requests holding a block table there."""

    __slots__ = ("_manager",)

    def __init__(self, manager: SingleTypeManagerView) -> None:
        self._manager = manager

    def _core_id(self, request_id: str) -> Any:
        scheduler = self._manager._scheduler
        core_id = scheduler._core_ids.get(request_id)
        if core_id is None and scheduler._core.kv_outside_tokens(request_id) is not None:
            return request_id  # given blocks outside the scheduler, under its vLLM id
        return core_id

    @abstractmethod
    def _value(self, core_id: Any) -> Any:
        """The request's value in this group, or ``None`` where it holds no entry."""

    def __getitem__(self, request_id: str) -> Any:
        core_id = self._core_id(request_id)
        value = None if core_id is None else self._value(core_id)
        if value is None:
            raise KeyError(request_id)
        return value

    def __contains__(self, request_id: object) -> bool:
        core_id = self._core_id(request_id) if isinstance(request_id, str) else None
        return core_id is not None and self._value(core_id) is not None

    def __iter__(self) -> Iterator[str]:
        scheduler = self._manager._scheduler
        core_ids = scheduler._core.kv_request_ids() if self._present() else []
        vllm_ids = {core: vllm for vllm, core in scheduler._core_ids.items()}
        # Requests given blocks outside the scheduler keep their vLLM ids in the core.
        outside = [c for c in core_ids if c not in vllm_ids]
        vllm_ids.update((c, c) for c in outside if scheduler._core.kv_outside_tokens(c) is not None)
        return iter([vllm_ids[c] for c in core_ids if c in vllm_ids and self._value(c) is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def _present(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"


class _ReqToBlocks(_RequestMap):
    """``req_to_blocks``: each request's block table in this group, as block views (the
    null block where the group no longer attends)."""

    def _value(self, core_id: Any) -> list[KVCacheBlockView] | None:
        manager = self._manager
        tables = manager._scheduler._core.kv_block_tables(core_id)
        if tables is None:
            return None
        return manager.block_pool._blocks_of(tables[manager.kv_cache_group_id])


class _NumCachedBlock(_RequestMap):
    """``num_cached_block``: each request's leading blocks registered in the prefix cache
    in this group. vLLM's manager fills it only with prefix caching on, and enters a
    request with its first cached block (a prefix hit at admission, or ``cache_blocks``
    caching a full block), so a request with none has no entry."""

    def _value(self, core_id: Any) -> int | None:
        if not self._present():
            return None
        counts = self._manager._scheduler._core.num_cached_blocks_of(core_id)
        if counts is None:
            return None
        count = int(counts[self._manager.kv_cache_group_id])
        return count if count > 0 else None

    def _present(self) -> bool:
        return self._manager._scheduler._prefix_caching


class SingleTypeManagerView:
    """vLLM's ``SingleTypeKVCacheManager`` of one KV cache group, read-only:
    ``req_to_blocks``, ``num_cached_block``, the null block, its spec and block size."""

    def __init__(self, scheduler: CoreState, block_pool: BlockPoolView, group_id: int) -> None:
        self._scheduler = scheduler
        self.block_pool = block_pool
        self.kv_cache_group_id = group_id
        group = scheduler.kv_cache_config.kv_cache_groups[group_id]
        self.kv_cache_spec = group.kv_cache_spec
        self.block_size = self.kv_cache_spec.block_size
        self._null_block = block_pool.null_block
        self.req_to_blocks = _ReqToBlocks(self)
        self.num_cached_block = _NumCachedBlock(self)
        # vLLM 0.33's copy-on-write queue, (source, destination) block pairs whose
        # references the copy retains: appended to by hand (vLLM's tests) and drained into
        # the core as the next step is formed (``CoordinatorView.queue_pending_copies``).
        self._pending_cow_copies: list[tuple[KVCacheBlockView, KVCacheBlockView]] = []

    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlockView, KVCacheBlockView]]:
        """vLLM's: drains the copies queued in this group and not yet given to a step."""
        pending = self._pending_cow_copies
        self._pending_cow_copies = []
        return pending


@CrossAttentionManager.register
class CrossAttentionManagerView(SingleTypeManagerView):
    """The manager view of a cross-attention group (an encoder-decoder model): vLLM's
    ``CrossAttentionManager`` (``isinstance`` answers so, as a registered virtual subclass:
    none of vLLM's methods, which would write its state, is inherited). Its
    ``req_to_blocks`` holds each request's blocks for its encoder tokens, allocated when
    its encoder inputs were scheduled."""


def _manager_view(scheduler: CoreState, block_pool: BlockPoolView, group_id: int) -> Any:
    spec = scheduler.kv_cache_config.kv_cache_groups[group_id].kv_cache_spec
    if type(spec).__name__ == "CrossAttentionSpec":
        return CrossAttentionManagerView(scheduler, block_pool, group_id)
    return SingleTypeManagerView(scheduler, block_pool, group_id)


class CoordinatorView:
    """vLLM's ``KVCacheCoordinator`` read-only: one ``single_type_managers`` entry per KV
    cache group, over the one ``block_pool``."""

    def __init__(self, scheduler: CoreState, block_pool: BlockPoolView) -> None:
        self.block_pool = block_pool
        self.kv_cache_config = scheduler.kv_cache_config
        groups = scheduler.kv_cache_config.kv_cache_groups
        self.single_type_managers = tuple(
            _manager_view(scheduler, block_pool, i) for i in range(len(groups))
        )
        self.num_single_type_manager = len(self.single_type_managers)
        self._scheduler = scheduler

    @property
    def enable_caching(self) -> bool:
        return self._scheduler._prefix_caching

    def queue_pending_copies(self) -> None:
        """Gives the core every group's queued copies (vLLM 0.33's
        ``take_kv_cache_block_copies`` order: group by group, each in its order) for the
        step about to be formed, which carries them in ``kv_cache_block_copies`` and keeps
        their endpoints out of the pool until it is processed.

        Raises:
            InputError: an endpoint without a reference taken by ``get_new_blocks`` that
                no queued copy retains; the copies stay queued in their groups then.
        """
        managers = self.single_type_managers
        if not any(m._pending_cow_copies for m in managers):
            return
        pool = self.block_pool
        copies = [
            (pool._core_index(src.block_id), pool._core_index(dst.block_id))
            for m in managers
            for src, dst in m._pending_cow_copies
        ]
        self._scheduler._core.queue_block_copies(copies)
        for manager in managers:
            manager.take_pending_cow_copies()


@HybridKVCacheCoordinator.register
class HybridCoordinatorView(CoordinatorView):
    """The coordinator view of several KV groups with prefix caching (vLLM builds its
    ``HybridKVCacheCoordinator`` then: ``isinstance`` answers so, none of its methods
    inherited): ``full_attention_group_id`` and the per-group lookup besides."""

    @property
    def full_attention_group_id(self) -> int | None:
        """vLLM's: the first full-attention group (full attention is looked up first), or
        ``None`` without one."""
        for i, manager in enumerate(self.single_type_managers):
            if type(manager.kv_cache_spec).__name__ in _FULL_ATTENTION_SPECS:
                return i
        return None

    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[Any], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlockView], ...], tuple[int, ...]]:
        """vLLM 0.33's: each group's own prefix hit over vLLM's ``block_hashes`` (a
        request's), no longer than ``max_cache_hit_length`` tokens, not reconciled. vLLM's
        hashes are mapped to the core's through the adapter's index of the requests it was
        given (``_vllm_aux_outputs.BlockHashIndex``); a hash no request of this scheduler
        had names no block the core caches, so the lookup stops there."""
        scheduler = self._scheduler
        core_hashes = scheduler._block_hash_index.core_hashes(block_hashes)
        blocks, lengths = scheduler._core.kv_hits_per_group(core_hashes, int(max_cache_hit_length))
        views = tuple(self.block_pool._blocks_of(b) for b in blocks)
        return views, tuple(int(n) for n in lengths)


_FULL_ATTENTION_SPECS = ("FullAttentionSpec", "MLAAttentionSpec")
