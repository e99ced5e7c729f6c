"""vLLM 0.33's Mamba ``align`` boundary-state hand-offs (``KVCacheManager.
take_boundary_state_offloads``) as ``TokenyardScheduler`` answers them.

What vLLM does (``vllm/v1/core/single_type_kv_cache_manager.py``, ``MambaManager``): each
``cache_blocks`` call of an ``align`` group (prefix caching on) appends, for every block it
newly caches (``num_cached_block`` before..after, null blocks and blocks left unhashed by
sparse retention skipped), ``(request_id, group_id, block, block.block_hash_num_tokens)``
to ``_pending_boundary_state_offloads``; ``pop_blocks_for_free`` drops a request's entries
when its blocks go back to the pool (finish, abort, preemption) before they were taken.
``KVCacheManager.take_boundary_state_offloads`` drains every group's list (groups in
order, each in its ``cache_blocks`` order) into ``{request_id: [(group_id, block_id,
boundary_tokens), ...]}``; ``Scheduler.schedule()`` takes it once per step, after the
step's allocations, and hands it to the KV connector in
``SchedulerOutput.kv_connector_block_state`` (its ``req_ids`` gain the requests with a
hand-off). The ``OffloadingConnector`` turns each entry whose boundary is on its chunk
grid and within the request's offloadable tokens into a one-block store job
(``_build_partial_tail_store_jobs`` -> ``_build_aligned_boundary_store_jobs``,
``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``), since its ordinary
store jobs skip ``align`` Mamba groups (their tables are not append-only). A second source,
the copy-on-write copy of a producer's own sub-block partial tail, needs partial hash hits,
which the adapter refuses beside a Mamba ``align`` group; it never arises here.

The core keeps no such list; what vLLM records is what changed in the pool between two
takes: a block of an ``align`` group's table that caches a hash it did not cache at the
last take was cached since (a prefix hit reuses a block already caching its hash; a block
evicted and cached again caches a new one). A request whose blocks were freed holds no
table, so its entries are gone as vLLM drops them. Costs one read of the pool's hashes
(about 1.3 ms at 100,000 blocks) and of the live requests' tables per take, only with an
``align`` group and prefix caching."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm.v1.kv_cache_interface import MambaSpec


class BoundaryStateOffers:
    """The hand-offs since the last ``take`` (see the module doc)."""

    def __init__(self, kv_cache_config: Any, prefix_caching: bool) -> None:
        groups = kv_cache_config.kv_cache_groups
        # (group id, block size) of each Mamba ``align`` group; none without prefix
        # caching (vLLM's cache_blocks never runs then).
        self.groups = tuple(
            (i, g.kv_cache_spec.block_size)
            for i, g in enumerate(groups)
            if prefix_caching
            and isinstance(g.kv_cache_spec, MambaSpec)
            and g.kv_cache_spec.mamba_cache_mode == "align"
        )
        self._hashes: list[int | None] = []
        # The waiting requests in scheduling order as the step began (holding KV first, as
        # vLLM's waiting pass visits them), set by ``schedule()`` for ``cache_order``.
        self.waiting_order: list[str] = []

    def cache_order(self, scheduled: Iterable[str], requests: Iterable[str]) -> list[str]:
        """The requests in vLLM 0.33's ``cache_blocks`` order within ``schedule()``, the
        order its hand-offs keep: the running requests as scheduled (``allocate_slots``),
        then the waiting pass in queue order (a landed asynchronous load is cached as the
        pass promotes it, ``_update_waiting_for_remote_kv``, then admitted or not), then
        any other of ``requests``."""
        waiting = set(self.waiting_order)
        order = [r for r in scheduled if r not in waiting]
        order += self.waiting_order
        seen = set(order)
        order += [r for r in requests if r not in seen]
        return order

    def take(
        self, manager: Any, core: Any, request_ids: Iterable[str]
    ) -> dict[str, list[tuple[int, int, int]]]:
        """Drains the hand-offs: ``{request_id: [(group_id, block_id, boundary_tokens)]}``
        over ``request_ids`` in that order (vLLM's ``cache_blocks`` order), each request's
        entries by group. ``manager`` is the ``kv_cache_manager`` view, ``core`` the
        adapter's core scheduler."""
        if not self.groups:
            return {}
        hashes: list[int | None] = core.block_hashes()
        before = self._hashes
        self._hashes = hashes
        if hashes == before:  # no block newly hashed: nothing to hand off
            return {}
        n = len(before)
        core_index = manager.block_pool._core_index
        tables = {request_id: manager.get_block_ids(request_id) for request_id in request_ids}
        offloads: dict[str, list[tuple[int, int, int]]] = {}
        for group_id, block_size in self.groups:
            for request_id, table in tables.items():
                for idx, block_id in enumerate(table[group_id]):
                    if not block_id:  # the null block: a state no longer kept
                        continue
                    i = core_index(block_id)
                    cached = hashes[i]
                    if cached is not None and (i >= n or before[i] != cached):
                        entry = (group_id, block_id, (idx + 1) * block_size)
                        offloads.setdefault(request_id, []).append(entry)
        return offloads
