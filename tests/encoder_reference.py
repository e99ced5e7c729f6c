"""A pure-Python reference of the encoder cache, written from docs/embedding.md (vLLM 0.33's
``EncoderCacheManager``): entries by identifier, the requests referencing each, lazy
eviction of unreferenced entries oldest first. Slow and obvious; test_sched_encoder.py's
state machine checks ``tokenyard.sched.EncoderCache`` against it call by call."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class RefEncoderCache:
    def __init__(self, cache_size: int) -> None:
        self.cache_size = cache_size
        self.num_free_slots = cache_size
        self.num_freeable_slots = cache_size
        self.refs: dict[str, set[Any]] = {}  # identifier -> requests referencing it
        self.size: dict[str, int] = {}  # identifier -> embeddings held
        self.inputs: dict[Any, dict[int, str]] = {}  # request -> input id -> identifier
        self.freeable: OrderedDict[str, int] = OrderedDict()
        self.freed: list[str] = []

    def _hold(self, request: Any, input_id: int, mm_hash: str) -> None:
        self.inputs.setdefault(request, {})[input_id] = mm_hash

    def check_and_update_cache(self, request: Any, input_id: int, mm_hash: str) -> bool:
        if mm_hash not in self.refs:
            return False
        if not self.refs[mm_hash]:
            self.num_freeable_slots -= self.freeable.pop(mm_hash)
        self.refs[mm_hash].add(request)
        self._hold(request, input_id, mm_hash)
        return True

    def can_allocate(self, num_embeds: int, budget: int, num_embeds_to_schedule: int) -> bool:
        if num_embeds > budget:
            return False
        needed = num_embeds + num_embeds_to_schedule
        if needed <= self.num_free_slots:
            return True
        if needed > self.num_freeable_slots:
            return False
        while needed > self.num_free_slots:
            mm_hash, n = self.freeable.popitem(last=False)
            del self.refs[mm_hash]
            del self.size[mm_hash]
            self.freed.append(mm_hash)
            self.num_free_slots += n
        return True

    def allocate(self, request: Any, input_id: int, mm_hash: str, num_embeds: int) -> None:
        self.refs.setdefault(mm_hash, set()).add(request)
        self.size.setdefault(mm_hash, num_embeds)
        self._hold(request, input_id, mm_hash)
        self.num_free_slots -= num_embeds
        self.num_freeable_slots -= num_embeds

    def free_encoder_input(self, request: Any, input_id: int, mm_hash: str) -> None:
        held = self.inputs.get(request, {})
        held.pop(input_id, None)
        if not held:
            self.inputs.pop(request, None)
        if not self.refs.get(mm_hash):
            return
        # A request repeating an item keeps its one reference until the last occurrence.
        if mm_hash in held.values():
            return
        self.refs[mm_hash].discard(request)
        if not self.refs[mm_hash]:
            self.freeable[mm_hash] = self.size[mm_hash]
            self.num_freeable_slots += self.size[mm_hash]

    def get_cached_input_ids(self, request: Any) -> list[int]:
        return sorted(self.inputs.get(request, {}))

    def get_freed_mm_hashes(self) -> list[str]:
        freed = [h for h in self.freed if h not in self.refs]
        self.freed = []
        return freed
