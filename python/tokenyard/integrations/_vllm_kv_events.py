"""vLLM 0.33's KV cache events, built from the core's cache calls (``TokenyardScheduler``
with ``kv_events_config.enable_kv_cache_events``). Imported only by the adapter, so vLLM
is installed when this runs.

vLLM's ``BlockPool`` (vllm/v1/core/block_pool.py) publishes one ``BlockStored`` per
``cache_full_blocks`` call (``_build_block_stored_event``: the request's blocks
``num_cached_blocks..num_full_blocks``, their hashes, the parent's, the tokens, LoRA,
extra keys, group, session, look-ahead tokens), one ``BlockRemoved`` per evicted block
(``_emit_block_removed_events``) and ``AllBlocksCleared`` on a reset; ``KVCacheManager.
take_events`` adds each group's spec kind and sliding window; with
``kv_cache_report_mode="full"`` a request's prefix hit is published at each lookup too
(``get_computed_blocks`` through ``emit_cached_block_events``). Beside several KV cache
groups the one pool does this per group (each manager's ``cache_blocks``). The core
records which request cached which blocks of which group, and each lookup's hit
(``drain_kv_events_detailed``); this builds the same events from the vLLM request, with
vLLM's own helpers, in the core's order (vLLM's: a step's evictions before the blocks it
caches)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from vllm.distributed.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.v1.core.kv_cache_utils import (
    generate_block_hash_extra_keys,
    generate_lookahead_block_hash_extra_keys,
    maybe_convert_block_hash,
    resolve_block_hashes,
    to_event_extra_keys,
)
from vllm.v1.kv_cache_interface import (
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.request import Request

_log = logging.getLogger(__name__)


class KvEventBuilder:
    """Turns the core's events and cache calls into vLLM's events. It remembers the vLLM
    hash and group of each block hash the core stored (a ``BlockRemoved`` names vLLM's
    hash; the core's events name its own, keyed by group beside several), as many times as
    it is stored."""

    def __init__(
        self,
        *,
        block_size: int,
        hash_block_size: int,
        num_hash_lookahead_tokens: int,
        kv_cache_groups: Sequence[Any],
    ) -> None:
        self._block_size = block_size
        self._hash_block_size = hash_block_size
        self._lookahead = num_hash_lookahead_tokens
        # KVCacheManager.kv_cache_event_metadata: each group's (kind, sliding window).
        self._metadata = [
            (
                get_kv_cache_spec_kind(g.kv_cache_spec).value,
                get_kv_cache_spec_sliding_window(g.kv_cache_spec),
            )
            for g in kv_cache_groups
        ]
        # The core's hash -> [vLLM's external hash, group, blocks storing it].
        self._external: dict[int, list[Any]] = {}
        # Requests the adapter forgot whose cache calls may not be drained yet, by core id.
        self._kept: dict[Any, Request] = {}

    def keep(self, core_id: Any, request: Request) -> None:
        """Keeps a request the adapter is forgetting until the next ``build``."""
        self._kept[core_id] = request

    def build(
        self,
        events: Sequence[tuple[str, int]],
        calls: Sequence[tuple[int, Any, int, int, int, Sequence[int], bool]],
        request_of: Callable[[Any], Request | None],
    ) -> list[KVCacheEvent]:
        """vLLM's events for the core's ``events`` and ``calls`` (as
        ``drain_kv_events_detailed`` gives them, calls in order of ``at``);
        ``request_of`` finds a live request by core id (the kept ones are looked up
        after it)."""
        out: list[KVCacheEvent] = []
        i = next_call = 0
        while i < len(events) or next_call < len(calls):
            if next_call < len(calls) and calls[next_call][0] <= i:
                _, core_id, group, first, end, skipped, reused = calls[next_call]
                next_call += 1
                request = request_of(core_id) or self._kept.get(core_id)
                num_stored = 0 if reused else end - first - len(skipped)
                stored = events[i : i + num_stored]
                i += num_stored
                if request is None:
                    _log.warning("KV events: request %r is gone, its blocks not published", core_id)
                    continue
                if reused:
                    # KVCacheManager.get_computed_blocks: a prefix hit's blocks, published
                    # only for a request asking for the "full" report.
                    if getattr(request, "kv_cache_report_mode", "incremental") == "full":
                        out.append(self._stored(request, group, 0, end, ()))
                    continue
                event = self._stored(request, group, first, end, skipped)
                for (_, core_hash), external in zip(stored, event.block_hashes, strict=True):
                    entry = self._external.setdefault(core_hash, [external, group, 0])
                    entry[2] += 1
                out.append(event)
                continue
            kind, core_hash = events[i]
            i += 1
            if kind == "stored":
                # Every store the core makes comes with its call (the tests check each
                # path); one without would have no request to build the event from.
                _log.warning("KV events: a stored block without its cache call, not published")
            elif kind == "removed":
                removed = self._removed(core_hash)
                if removed is not None:
                    out.append(removed)
            elif kind == "all_cleared":
                self._external.clear()
                out.append(AllBlocksCleared())
        self._kept.clear()
        return out

    def _removed(self, core_hash: int) -> BlockRemoved | None:
        entry = self._external.get(core_hash)
        if entry is None:
            _log.warning("KV events: an evicted block never published as stored, not published")
            return None
        entry[2] -= 1
        if entry[2] == 0:
            del self._external[core_hash]
        return BlockRemoved(block_hashes=[entry[0]], medium=MEDIUM_GPU, group_idx=entry[1])

    def _stored(
        self, request: Request, group: int, first: int, end: int, skipped: Sequence[int]
    ) -> BlockStored:
        """``BlockPool.cache_full_blocks``' event for blocks ``first..end`` of ``request``
        in ``group``, the ``skipped`` (null) blocks left out of its hashes and extra keys
        but not its tokens; with ``first`` 0 and none skipped, also
        ``emit_cached_block_events``' for a hit of ``end`` blocks."""
        block_size = self._block_size
        hashes = resolve_block_hashes(request.block_hashes, self._hash_block_size, block_size)
        left_out = set(skipped)
        cached = [i for i in range(first, end) if i not in left_out]
        extra_keys: list[tuple[Any, ...] | None] = []
        lookahead: list[list[int]] | None = [] if self._lookahead else None
        mm_idx = 0
        for i in cached:
            start, stop = i * block_size, (i + 1) * block_size
            if self._lookahead:
                keys, mm_idx = generate_lookahead_block_hash_extra_keys(
                    request, start, stop, stop + self._lookahead, mm_idx
                )
            else:
                keys, mm_idx = generate_block_hash_extra_keys(request, start, stop, mm_idx)
            extra_keys.append(keys)
            if lookahead is not None:
                lookahead.append(request.all_token_ids[stop : stop + self._lookahead])
        lora = request.lora_request
        event = BlockStored(
            block_hashes=[maybe_convert_block_hash(hashes[i]) for i in cached],
            parent_block_hash=maybe_convert_block_hash(hashes[first - 1]) if first else None,
            token_ids=request.all_token_ids[first * block_size : end * block_size],
            block_size=block_size,
            lora_id=lora.adapter_id if lora else None,
            medium=MEDIUM_GPU,
            lora_name=lora.name if lora else None,
            extra_keys=to_event_extra_keys(extra_keys),
            group_idx=group,
            session_id=request.session_id,
            lookahead_token_ids=lookahead,
        )
        if group < len(self._metadata):
            event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = self._metadata[group]
        return event
