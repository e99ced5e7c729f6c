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
groups the one pool does this per group (each manager's ``cache_blocks``), each group's
events in its own block size; a full-attention group whose block holds several hash
blocks also registers the prompt's last hash boundary inside a block
(``cache_partial_block``: one hash, ``block_size`` the hash block), removed with the
block after its own hash. The core records which request cached which blocks of which
group, its partial entries, and each lookup's hit (``drain_kv_events_detailed``); this
builds the same events from the vLLM request, with vLLM's own helpers, in the core's
order (vLLM's: a step's evictions before the blocks it caches)."""

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
from vllm.multimodal.utils import get_mm_features_in_window
from vllm.v1.core.kv_cache_utils import (
    generate_block_hash_extra_keys,
    generate_lookahead_block_hash_extra_keys,
    make_block_hash_with_group_id,
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
        # Each group's own block size (vLLM's manager.block_size), which its events carry.
        self._group_block_sizes = [g.kv_cache_spec.block_size for g in kv_cache_groups]
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
        # The core's hash -> [vLLM's external hash, group, blocks storing it, and for a
        # partial entry vLLM's key (its BlockHashWithGroupId), else None].
        self._external: dict[int, list[Any]] = {}
        # Requests the adapter forgot whose cache calls may not be drained yet, by core id.
        self._kept: dict[Any, Request] = {}

    def keep(self, core_id: Any, request: Request) -> None:
        """Keeps a request the adapter is forgetting until the next ``build``."""
        self._kept[core_id] = request

    def build(
        self,
        events: Sequence[tuple[str, int]],
        calls: Sequence[tuple[int, Any, int, int, int, Sequence[int], bool, bool]],
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
                _, core_id, group, first, end, skipped, reused, partial = calls[next_call]
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
                if partial:
                    event, key = self._partial_stored(request, group, end)
                else:
                    event, key = self._stored(request, group, first, end, skipped), None
                for (_, core_hash), external in zip(stored, event.block_hashes, strict=True):
                    entry = self._external.setdefault(core_hash, [external, group, 0, key])
                    entry[2] += 1
                out.append(event)
                continue
            kind, core_hash = events[i]
            i += 1
            if kind == "removed":
                # A block's partial entries follow its own hash's removal.
                end = i
                while end < len(events) and self._is_partial(events[end]):
                    if next_call < len(calls) and calls[next_call][0] <= end:
                        break
                    end += 1
                out.extend(self._removed_block(core_hash, events[i:end]))
                i = end
                continue
            if kind == "stored":
                # Every store the core makes comes with its call (the tests check each
                # path); one without would have no request to build the event from.
                _log.warning("KV events: a stored block without its cache call, not published")
            elif kind == "all_cleared":
                self._external.clear()
                out.append(AllBlocksCleared())
        self._kept.clear()
        return out

    def _is_partial(self, event: tuple[str, int]) -> bool:
        entry = self._external.get(event[1]) if event[0] == "removed" else None
        return entry is not None and entry[3] is not None

    def _removed_block(
        self, core_hash: int, partials: Sequence[tuple[str, int]]
    ) -> list[BlockRemoved]:
        """One block's ``BlockRemoved`` events: its hash's, then its partial entries' in
        the order vLLM's ``cached_block_hashes_by_block`` set holds their keys (built by
        adding them in the order they were registered)."""
        out = [] if (first := self._removed(core_hash)) is None else [first]
        by_key = {self._external[h][3]: h for _, h in partials}
        in_set_order = set()
        for _, h in partials:
            in_set_order.add(self._external[h][3])
        for key in in_set_order:
            removed = self._removed(by_key[key])
            if removed is not None:
                out.append(removed)
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

    def _partial_stored(
        self, request: Request, group: int, num_hash_blocks: int
    ) -> tuple[BlockStored, bytes]:
        """``BlockPool.cache_partial_block``'s event for the hash at the end of the
        request's hash block ``num_hash_blocks - 1`` in ``group``, and vLLM's key for it."""
        hash_block_size = self._hash_block_size
        block_hash = request.block_hashes[num_hash_blocks - 1]
        parent = request.block_hashes[num_hash_blocks - 2] if num_hash_blocks > 1 else None
        start, stop = (num_hash_blocks - 1) * hash_block_size, num_hash_blocks * hash_block_size
        mm_idx = 0
        mm_features = request.mm_features
        if start > 0 and mm_features:
            last = mm_features[-1].mm_position
            if last.offset + last.length > start:
                mm_idx, _ = get_mm_features_in_window(mm_features, start, stop)
        if self._lookahead:
            keys, _ = generate_lookahead_block_hash_extra_keys(
                request, start, stop, stop + self._lookahead, mm_idx
            )
        else:
            keys, _ = generate_block_hash_extra_keys(request, start, stop, mm_idx)
        lora = request.lora_request
        event = BlockStored(
            block_hashes=[maybe_convert_block_hash(block_hash)],
            parent_block_hash=None if parent is None else maybe_convert_block_hash(parent),
            token_ids=request.all_token_ids[start:stop],
            block_size=stop - start,
            lora_id=lora.adapter_id if lora else None,
            medium=MEDIUM_GPU,
            lora_name=lora.name if lora else None,
            extra_keys=to_event_extra_keys([keys]),
            group_idx=group,
            session_id=request.session_id,
            lookahead_token_ids=(
                [request.all_token_ids[stop : stop + self._lookahead]] if self._lookahead else None
            ),
        )
        if group < len(self._metadata):
            event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = self._metadata[group]
        return event, make_block_hash_with_group_id(block_hash, group)

    def _group_block_size(self, group: int) -> int:
        if group < len(self._group_block_sizes):
            return int(self._group_block_sizes[group])
        return self._block_size

    def _stored(
        self, request: Request, group: int, first: int, end: int, skipped: Sequence[int]
    ) -> BlockStored:
        """``BlockPool.cache_full_blocks``' event for blocks ``first..end`` of ``request``
        in ``group``, the ``skipped`` (null) blocks left out of its hashes and extra keys
        but not its tokens; with ``first`` 0 and none skipped, also
        ``emit_cached_block_events``' for a hit of ``end`` blocks."""
        block_size = self._group_block_size(group)
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
