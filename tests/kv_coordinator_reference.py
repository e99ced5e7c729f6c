"""A pure-Python reference model of ``tokenyard.kv.KvCoordinator``, written from vLLM
0.33's ``KVCacheManager.allocate_slots``, ``kv_cache_coordinator.py`` and the managers of
``single_type_kv_cache_manager.py`` (FullAttention, SlidingWindow, ChunkedLocalAttention,
Mamba with ``mamba_cache_mode="none"`` or ``"align"``; ``"none"`` with a block covering the
request, kind ``mamba``, or shorter, kind ``mambablocks``: a slot per block plus ``size``
speculative blocks, every block before the last computed token's state freed), restricted
to what tokenyard models: no external (connector) tokens, dense caching, no hash look-ahead.
Groups may differ in block size (``group_block_sizes``, full attention, sliding windows,
uncached ``mambablocks``, ``align`` without partial hash hits and chunked local attention
uncached or on the lcm: vLLM's layouts for models whose layer kinds have different page
sizes): ``block_size`` is then the hash block size, hits land on the lcm of the groups'
sizes (``HybridKVCacheCoordinator``'s ``alignment_tokens``: an ``align`` group's lookup passes
over states off it), only tokens below it are cached
(``_align_cacheable``), and a window finer than the lcm caches only the blocks a hit can
reach (``reachable_block_mask``).

``eagle_drop`` is EAGLE's trailing-block drop in every group (``use_eagle``): each spec
group's hit reads a block past the candidate (``eagle_proof_margin``) and drops it, once per
candidate length (``eagle_verified``); beside differing sizes each group caches a block past
the lcm boundary (``get_num_cacheable_tokens``), a window one block more a block later
(``reachable_block_mask`` with ``use_eagle``), and full attention keys the block holding
the prompt's last hash boundary when not yet cached in full
(``FullAttentionManager._cache_partial_tail_block``: freed as cached).

Obvious rather than fast: the free queue is a list, a block's cache key is the tuple of
every token up to its end plus the group, and a lookup scans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tokenyard.errors import InputError, UnknownRequestError

NULL = 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Spec:
    # "full", "window", "local", "mamba", "mambablocks" (none mode, a slot per block),
    # "align" (Mamba in align mode)
    kind: str
    size: int = 0  # the window or the chunk, in tokens; mambablocks: speculative blocks

    def skipped_tokens(self, num_computed: int) -> int:
        if self.kind == "window":
            return max(0, num_computed - self.size + 1)
        if self.kind == "local":
            return num_computed // self.size * self.size
        if self.kind in ("align", "mambablocks"):
            return max(0, num_computed - 1)
        return 0

    def required_blocks(self, num_slots: int, block_size: int) -> int:
        if self.kind == "mamba":
            return 1 if num_slots > 0 else 0
        if self.kind == "mambablocks":
            # vLLM's none-mode MambaManager: cdiv(num_tokens + block_size * k, block_size).
            return cdiv(num_slots, block_size) + self.size if num_slots > 0 else 0
        return cdiv(num_slots, block_size)

    def max_live_blocks(self, num_added: int, block_size: int) -> int | None:
        """The most non-null blocks right after an allocation of ``num_added`` slots."""
        if self.kind == "window":
            return cdiv(max(0, self.size + num_added - 2), block_size) + 1
        if self.kind == "local":
            if self.size % block_size == 0:
                return cdiv(self.size + num_added - 1, block_size)
            return cdiv(self.size + num_added - 2, block_size) + 1
        if self.kind == "mamba":
            return 1
        if self.kind == "mambablocks":
            # As a window of 2 tokens, and the speculative blocks.
            return cdiv(num_added, block_size) + 1 + self.size
        if self.kind == "align":
            return 2
        return None


@dataclass
class Hit:
    blocks: list[list[int]]
    num_tokens: int
    query: tuple[int, ...]
    keys: list[list[tuple[object, ...] | None]]


@dataclass
class Req:
    tokens: list[int]
    num_computed: int
    tables: list[list[int]]
    num_cached: list[int]
    extra_key: int | None
    # vLLM's num_prompt_tokens (set, else the tokens known when first cached).
    prompt_len: int | None = None


@dataclass
class RefCoordinator:
    specs: list[Spec]
    num_blocks: int
    block_size: int
    caching: bool
    group_block_sizes: list[int] | None = None
    ref: list[int] = field(default_factory=list)
    key_of: dict[int, tuple[object, ...]] = field(default_factory=dict)
    # key -> blocks caching it, oldest first (vLLM answers the first)
    cache: dict[tuple[object, ...], list[int]] = field(default_factory=dict)
    free_queue: list[int] = field(default_factory=list)
    requests: dict[Any, Req] = field(default_factory=dict)
    num_lookups: int = 0
    num_hit_tokens: int = 0
    # Align-mode state blocks cached since the step began (cached_blocks_this_step).
    this_step: set[int] = field(default_factory=set)
    eagle_drop: bool = False
    prompt_tokens: dict[Any, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ref = [0] * self.num_blocks
        self.free_queue = list(range(1, self.num_blocks))  # block 0 is the null block
        if self.group_block_sizes is None:
            self.group_block_sizes = [self.block_size] * len(self.specs)
        self.sizes = list(self.group_block_sizes)
        self.lcm = math.lcm(*self.sizes)

    def aligned(self, num_blocks: int, g: int) -> bool:
        return num_blocks * self.sizes[g] % self.lcm == 0

    def set_num_prompt_tokens(self, rid: object, n: int) -> None:
        self.prompt_tokens[rid] = n
        if rid in self.requests:
            self.requests[rid].prompt_len = n

    # --- the pool (vLLM's BlockPool) ---
    def key(
        self, tokens: list[int] | tuple[int, ...], i: int, g: int, extra: int | None
    ) -> tuple[object, ...]:
        return (g, extra, tuple(tokens[: (i + 1) * self.sizes[g]]))

    def cached_block(self, key: tuple[object, ...]) -> int | None:
        blocks = self.cache.get(key)
        return blocks[0] if blocks else None

    def take_free_block(self) -> int:
        block = self.free_queue.pop(0)
        old = self.key_of.pop(block, None)
        if old is not None:
            self.cache[old].remove(block)
            if not self.cache[old]:
                del self.cache[old]
        self.ref[block] = 1
        return block

    def free_blocks(self, ordered: list[int]) -> None:
        first: list[int] = []
        last: list[int] = []
        for block in ordered:
            if block == NULL:
                continue
            self.ref[block] -= 1
            if self.ref[block] == 0:
                (last if block in self.key_of else first).append(block)
        self.free_queue = first + self.free_queue + last

    # --- lookup (vLLM's HybridKVCacheCoordinator.find_longest_cache_hit) ---
    def spec_groups(self) -> list[tuple[Spec, list[int]]]:
        out: list[tuple[Spec, list[int]]] = []
        for g, spec in enumerate(self.specs):
            for s, ids in out:
                if s == spec and self.sizes[ids[0]] == self.sizes[g]:
                    ids.append(g)
                    break
            else:
                out.append((spec, [g]))
        return sorted(out, key=lambda sg: sg[0].kind != "full")

    def find(
        self,
        spec: Spec,
        ids: list[int],
        tokens: list[int],
        extra: int | None,
        max_length: int,
        drop: bool = False,
    ) -> tuple[list[list[int]], int]:
        bs = self.sizes[ids[0]]
        max_blocks = min(max_length // bs, len(tokens) // bs)

        def lookup(i: int) -> list[int] | None:
            found = [self.cached_block(self.key(tokens, i, g, extra)) for g in ids]
            return [b for b in found if b is not None] if None not in found else None

        tables: list[list[int]] = [[] for _ in ids]
        if spec.kind == "full":
            for i in range(max_blocks):
                found = lookup(i)
                if found is None:
                    break
                for t, b in zip(tables, found, strict=True):
                    t.append(b)
            hit = len(tables[0]) * bs
            if drop and hit > 0:
                hit -= bs  # dropped before rounding down
            hit = hit // self.lcm * self.lcm
            tables = [t[: cdiv(hit, bs)] for t in tables]
            return tables, hit
        elif spec.kind == "window":
            need = cdiv(spec.size - 1, bs) + drop
            tables = [[NULL] * max_blocks for _ in ids]
            run, end = 0, None
            for i in range(max_blocks - 1, -1, -1):
                found = lookup(i)
                if found is None:
                    run = 0
                    continue
                if run == 0 and not self.aligned(i + (not drop), ids[0]):
                    continue  # a run ends only on the alignment (after the drop)
                for t, b in zip(tables, found, strict=True):
                    t[i] = b
                run += 1
                if run >= need:
                    end = i + run
                    break
            if end is None:
                end = run
                while end and not self.aligned(end, ids[0]):
                    end -= 1
            if drop and end:
                end -= 1
                while end and not self.aligned(end, ids[0]):
                    end -= 1
            tables = [t[:end] for t in tables]
        elif spec.kind == "align":
            for i in range(max_blocks - 1, -1, -1):
                if not self.aligned(i + 1, ids[0]):
                    continue  # a state off the lcm grid is passed over (alignment_tokens)
                found = lookup(i)
                if found is not None:
                    tables = [[NULL] * i + [b] for b in found]
                    break
        elif spec.kind == "local":
            first = max_length // spec.size * spec.size // bs
            tables = [[NULL] * first for _ in ids]
            for i in range(first, max_blocks):
                found = lookup(i)
                if found is None:
                    break
                for t, b in zip(tables, found, strict=True):
                    t.append(b)
        return tables, len(tables[0]) * bs

    def get_computed_blocks(self, tokens: list[int], extra_key: int | None = None) -> Hit:
        n = len(self.specs)
        empty = Hit([[] for _ in range(n)], 0, tuple(tokens), [[] for _ in range(n)])
        if not self.caching:
            return empty
        groups = self.spec_groups()
        simple = len(groups) == 2 and groups[0][0].kind == "full"
        hit_length = max(0, len(tokens) - 1)
        found: list[list[int] | None] = [None] * n
        found_len = [0] * n
        hashed = len(tokens) // self.block_size * self.block_size
        verified: set[int] = set()  # vLLM's eagle_verified
        while True:
            current = hit_length
            for idx, (spec, ids) in enumerate(groups):
                if spec.kind == "full" and found[ids[0]] is not None:
                    current = min(current, found_len[ids[0]])
                    continue
                drop = self.eagle_drop and idx not in verified
                length = current
                if drop and spec.kind not in ("mamba", "align"):
                    length = min(current + self.sizes[ids[0]], hashed)
                tables, found_length = self.find(spec, ids, tokens, extra_key, length, drop)
                if drop:
                    verified.add(idx)
                elif found_length < current:
                    verified.clear()
                current = found_length
                for g, t in zip(ids, tables, strict=True):
                    found[g], found_len[g] = t, current
            if current >= hit_length:
                break
            hit_length = current
            if simple:
                break
        blocks = []
        for g, spec in enumerate(self.specs):
            t = found[g] or []
            blocks.append(t[: cdiv(hit_length, self.sizes[g])] if spec.kind == "full" else t)
        keys = [
            [None if b == NULL else self.key(tokens, i, g, extra_key) for i, b in enumerate(t)]
            for g, t in enumerate(blocks)
        ]
        self.num_lookups += 1
        self.num_hit_tokens += hit_length
        return Hit(blocks, hit_length, tuple(tokens), keys)

    # --- allocation (vLLM's KVCacheManager.allocate_slots) ---
    def allocate_slots(
        self,
        rid: object,
        num_new: int,
        lookahead: int = 0,
        token_ids: list[int] | None = None,
        hit: Hit | None = None,
        extra_key: int | None = None,
    ) -> list[list[int]] | None:
        token_ids = list(token_ids or [])
        req = self.requests.get(rid)
        if num_new < 1:
            raise InputError("num_new_tokens")
        if req is not None and hit is not None:
            raise InputError("new_computed_blocks")
        if req is not None and extra_key is not None and extra_key != req.extra_key:
            raise InputError("extra_key")
        if hit is not None:
            if len(hit.query) != len(token_ids):
                raise InputError("new_computed_blocks")
            for g, t in enumerate(hit.blocks):
                for i, b in enumerate(t):
                    if b != NULL and self.key_of.get(b) != hit.keys[g][i]:
                        raise InputError("new_computed_blocks")
        computed = req.num_computed if req else (hit.num_tokens if hit else 0)
        slots = computed + num_new + lookahead
        # Step 1: remove the blocks outside each group's window (remove_skipped_blocks).
        if req is not None:
            for spec, table, bs in zip(self.specs, req.tables, self.sizes, strict=True):
                end = min(spec.skipped_tokens(computed) // bs, len(table))
                freed = []
                for i in range(end - 1, -1, -1):
                    if table[i] == NULL:
                        if spec.kind == "align":
                            continue  # align mode steps over its null gaps
                        break
                    freed.append(table[i])
                    table[i] = NULL
                self.free_blocks(freed)
        # get_num_blocks_to_allocate, summed over groups.
        needed = 0
        main_slots = computed + num_new  # align mode takes no lookahead slots
        for g, spec in enumerate(self.specs):
            bs = self.sizes[g]
            align = spec.kind == "align"
            required = spec.required_blocks(main_slots if align else slots, bs)
            cap = 1 if align else required  # one state block per allocation
            if req is not None:
                needed += min(cap, max(0, required - len(req.tables[g])))
                continue
            hit_blocks = hit.blocks[g] if hit else []
            if align and hit_blocks and hit_blocks[-1] in self.this_step:
                return None  # a state computed in this step: next step
            skipped = spec.skipped_tokens(computed) // bs
            needed += min(cap, max(0, required - max(skipped, len(hit_blocks))))
            needed += sum(1 for b in hit_blocks[skipped:] if b != NULL and self.ref[b] == 0)
        if needed > len(self.free_queue):
            return None
        if req is None:
            n = len(self.specs)
            req = Req([], computed, [[] for _ in range(n)], [0] * n, extra_key)
            req.prompt_len = self.prompt_tokens.get(rid)
            if hit is not None:
                req.tokens = list(token_ids)  # the hit's tokens are the prompt's
                token_ids = []
                for g, spec in enumerate(self.specs):
                    skipped = spec.skipped_tokens(computed) // self.sizes[g]
                    kept = hit.blocks[g][skipped:]
                    for b in kept:
                        if b == NULL:
                            continue
                        if self.ref[b] == 0:
                            self.free_queue.remove(b)
                        self.ref[b] += 1
                    req.tables[g] = [NULL] * skipped + list(kept)
                    req.num_cached[g] = len(req.tables[g])
            self.requests[rid] = req
        new = []
        for spec, table, bs in zip(self.specs, req.tables, self.sizes, strict=True):
            align = spec.kind == "align"
            required = spec.required_blocks(main_slots if align else slots, bs)
            nulls = []
            if align and required > len(table):
                nulls = [NULL] * (required - 1 - len(table))
                table.extend(nulls)
            added = [self.take_free_block() for _ in range(max(0, required - len(table)))]
            table.extend(added)
            new.append(nulls + added)
        req.tokens.extend(token_ids)
        req.num_computed += num_new
        self.cache_full(req)
        return new

    def cache_full(self, req: Req) -> None:
        if not self.caching:
            return
        computed = min(req.num_computed, len(req.tokens))
        aligned = computed // self.lcm * self.lcm
        tails = self.eagle_drop and self.lcm != self.block_size
        for g, spec in enumerate(self.specs):
            bs = self.sizes[g]
            # EAGLE's groups cache a block past the boundary (get_num_cacheable_tokens).
            cacheable = min(computed, aligned + bs) if self.eagle_drop and aligned else aligned
            num_full = cacheable // bs
            # vLLM caches no block of a one-token window (no hit could use one).
            if spec.kind in ("mamba", "mambablocks") or (spec.kind == "window" and spec.size == 1):
                continue
            table = req.tables[g]
            shift = int(self.eagle_drop)
            per_segment, need = self.lcm // bs, cdiv(spec.size - 1, bs) + shift
            masked = spec.kind == "window" and need < per_segment
            for i in range(req.num_cached[g], min(num_full, len(table))):
                reached = i >= shift and (i - shift) % per_segment >= per_segment - need
                if table[i] == NULL or (masked and not reached):
                    continue
                old = self.key_of.get(table[i])
                if old is not None:  # a partial entry, replaced by the full key
                    self.cache[old].remove(table[i])
                    if not self.cache[old]:
                        del self.cache[old]
                key = self.key(req.tokens, i, g, req.extra_key)
                self.key_of[table[i]] = key
                self.cache.setdefault(key, []).append(table[i])
                if spec.kind == "align":
                    self.this_step.add(table[i])
            req.num_cached[g] = max(req.num_cached[g], num_full)
            if tails and spec.kind == "full" and bs != self.block_size:
                self.cache_partial_tail(req, g, cacheable)

    def cache_partial_tail(self, req: Req, g: int, cacheable: int) -> None:
        """vLLM's FullAttentionManager._cache_partial_tail_block under EAGLE's drop: the
        prompt's last hash boundary, keyed on the block holding it if it ends inside it
        and the block caches nothing yet."""
        if req.prompt_len is None:
            req.prompt_len = len(req.tokens)
        h, bs = self.block_size, self.sizes[g]
        boundary = min(req.prompt_len // h, len(req.tokens) // h) * h
        if boundary == 0 or boundary > cacheable or boundary % bs == 0:
            return
        table = req.tables[g]
        if boundary // bs >= len(table):
            return
        block = table[boundary // bs]
        if block == NULL or block in self.key_of:
            return
        key = ("partial", g, req.extra_key, tuple(req.tokens[:boundary]))
        self.key_of[block] = key
        self.cache.setdefault(key, []).append(block)

    def cache_blocks(self, rid: object, token_ids: list[int]) -> None:
        req = self.requests.get(rid)
        if req is None:
            raise UnknownRequestError(str(rid))
        req.tokens.extend(token_ids)
        self.cache_full(req)

    def new_step_starts(self) -> None:
        self.this_step.clear()

    def free(self, rid: object) -> None:
        req = self.requests.pop(rid, None)
        if req is None:
            raise UnknownRequestError(str(rid))
        for table in req.tables:
            self.free_blocks(list(reversed(table)))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)


def fine_grained_hit(
    mamba: bool,
    block_size: int,
    hash_block_size: int,
    cached: list[int | None],
    max_length: int,
    drop_eagle_block: bool = False,
) -> tuple[list[int], int]:
    """vLLM 0.33's fine-grained ``find_longest_cache_hit`` (partial hash hits on:
    ``alignment_tokens`` is the hash block size, below ``block_size``) of one full-attention
    (``FullAttentionManager``, phases 1 and 2) or Mamba ``align`` (``MambaManager``) group:
    ``cached[i]`` is the block cached under hash block ``i``'s hash. Not yet part of
    ``RefCoordinator``: the core's coordinator does not serve partial hits (only its pure
    finder, ``tokenyard._core.fine_grained_hit``, does)."""
    scale = block_size // hash_block_size
    if mamba:
        for fine in reversed(range(min(max_length // hash_block_size, len(cached)))):
            block = cached[fine]
            if block is not None:
                return [NULL] * (fine // scale) + [block], (fine + 1) * hash_block_size
        return [], 0
    full = [cached[(i + 1) * scale - 1] for i in range(len(cached) // scale)]
    blocks: list[int] = []
    for block in full[: max_length // block_size]:
        if block is None:
            break
        blocks.append(block)
    hit = len(blocks) * block_size
    first = len(blocks) * scale
    last = min(first + scale - 1, max_length // hash_block_size, len(cached))
    for fine in reversed(range(first, last)):
        tail = cached[fine]
        if tail is not None:
            blocks.append(tail)
            hit = (fine + 1) * hash_block_size
            break
    if drop_eagle_block and hit > 0:
        hit -= min(hash_block_size, block_size)
    hit -= hit % hash_block_size
    return blocks[: cdiv(hit, block_size)], hit
