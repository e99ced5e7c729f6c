"""A pure-Python reference model of vLLM 0.33's KV cache with fine-grained partial hash hits
(``HybridKVCacheCoordinator.enable_partial_hash_hits``: the hash block ``hash_block`` below
the groups' block ``block``), written from ``kv_cache_manager.py`` (``allocate_slots``,
``take_kv_cache_block_copies``), ``kv_cache_coordinator.py``, ``block_pool.py``
(``cache_partial_block``, ``move_block_hashes``, several keys on one block) and the
``FullAttentionManager`` / ``MambaManager`` (``mamba_cache_mode="align"``) of
``single_type_kv_cache_manager.py``. The layout tokenyard's core is to serve (issue 30's
"cowfine"); kv_coordinator_reference.RefCoordinator models the layouts it serves today.

What it holds, as vLLM does:

- **Keys.** A key is the group and the prompt prefix it covers (vLLM's chained block hash at
  that length): a full block's at its end, a partial entry's at a hash boundary inside it.
  A block holds a primary key (with its length) and any further ones; a key may sit on
  several blocks, the first registered answering.
- **Partial entries.** Full attention keys the block holding the prompt's last hash
  boundary below ``len(prompt) - 1`` (``FullAttentionManager._cache_partial_tail_block``);
  Mamba keys its running state block when a chunk ends exactly on the prompt's last hash
  boundary (``MambaManager._cache_partial_tail_block``) and, at the request's next
  allocation, moves the entry to a fresh block, the step copying the state into it
  (``move_block_hashes``; the source retained for the copy).
- **Copy-on-write.** An admission whose hit ends inside a group's block takes a fresh block
  in that slot and the step copies the shared one into it (``_apply_cow``; one more block
  in the fit check). Each copy is ``(source, destination)``; ``take_copies`` drains them
  with their retained endpoints, which the caller frees (vLLM's scheduler frees them at
  the end of ``schedule``, or after the step that runs the copy under async scheduling).

Restricted to the layout: full attention and Mamba ``align`` groups of one block size,
prefix caching on, no EAGLE, no look-ahead, no connector, no prefill checkpoint blocks.
Obvious rather than fast: the free queue is a list and keys are token tuples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kv_coordinator_reference import NULL, cdiv

Key = tuple[int, tuple[int, ...]]


@dataclass
class CowReq:
    tokens: list[int]
    prompt_len: int
    num_computed: int = 0
    tables: list[list[int]] = field(default_factory=list)
    # vLLM's num_cached_block (absent until the first caching or hit: None)
    num_cached: list[int | None] = field(default_factory=list)
    # vLLM's _partial_hit_reqs per group: (slot, the shared block)
    partial: list[tuple[int, int] | None] = field(default_factory=list)
    allocated: bool = False  # MambaManager._allocated_block_reqs
    last_state: int | None = None  # MambaManager.last_state_block_idx
    retired: int = 0  # MambaManager._num_retired_blocks


@dataclass
class CowHit:
    blocks: list[list[int]]
    num_tokens: int


@dataclass
class RefCowCoordinator:
    kinds: list[str]  # "full" or "align" per group
    num_blocks: int
    block: int
    hash_block: int
    ref: list[int] = field(default_factory=list)
    free_queue: list[int] = field(default_factory=list)
    keys_of: dict[int, list[Key]] = field(default_factory=dict)  # primary first
    key_len: dict[int, int] = field(default_factory=dict)  # block_hash_num_tokens
    cache: dict[Key, list[int]] = field(default_factory=dict)
    requests: dict[Any, CowReq] = field(default_factory=dict)
    this_step: set[Key] = field(default_factory=set)  # Mamba's cached_blocks_this_step
    # each group's pending copies (_pending_cow_copies), drained in group order
    copies: list[list[tuple[int, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.block % self.hash_block == 0
        assert self.block > self.hash_block
        self.ref = [0] * self.num_blocks
        self.free_queue = list(range(1, self.num_blocks))
        self.copies = [[] for _ in self.kinds]

    # --- the pool (BlockPool) ---
    def cached_block(self, key: Key) -> int | None:
        blocks = self.cache.get(key)
        return blocks[0] if blocks else None

    def insert_key(self, key: Key, block: int, num_tokens: int) -> None:
        keys = self.keys_of.setdefault(block, [])
        if key in keys:
            return
        if not keys:
            self.key_len[block] = num_tokens
        keys.append(key)
        self.cache.setdefault(key, []).append(block)

    def remove_keys(self, block: int) -> list[Key]:
        keys = self.keys_of.pop(block, [])
        self.key_len.pop(block, None)
        for key in keys:
            self.cache[key].remove(block)
            if not self.cache[key]:
                del self.cache[key]
        return keys

    def take_free_blocks(self, n: int) -> list[int]:
        taken, self.free_queue = self.free_queue[:n], self.free_queue[n:]
        for block in taken:
            self.remove_keys(block)
            self.ref[block] = 1
        return taken

    def touch(self, blocks: list[int]) -> None:
        for block in blocks:
            if block == NULL:
                continue
            if self.ref[block] == 0:
                self.free_queue.remove(block)
            self.ref[block] += 1

    def free_blocks(self, ordered: list[int]) -> None:
        first: list[int] = []
        last: list[int] = []
        for block in ordered:
            if block == NULL:
                continue
            self.ref[block] -= 1
            if self.ref[block] == 0:
                (last if block in self.keys_of else first).append(block)
        self.free_queue = first + self.free_queue + last

    def key(self, req: CowReq | list[int], g: int, num_tokens: int) -> Key:
        tokens = req.tokens if isinstance(req, CowReq) else req
        return (g, tuple(tokens[:num_tokens]))

    def cache_partial(self, req: CowReq, g: int, block: int, num_tokens: int) -> Key | None:
        """BlockPool.cache_partial_block (without replace_existing_hashes)."""
        if block == NULL:
            return None
        key = self.key(req, g, num_tokens)
        already = key in self.keys_of.get(block, [])
        if not already and block in self.keys_of and self.key_len[block] < num_tokens:
            self.remove_keys(block)
        self.insert_key(key, block, num_tokens)
        return key

    # --- lookup (find_longest_cache_hit, fine-grained) ---
    def find(self, g: int, tokens: list[int], max_length: int) -> tuple[list[int], int]:
        h, b = self.hash_block, self.block
        num_hashes = len(tokens) // h
        scale = b // h
        if self.kinds[g] == "align":
            for fine in reversed(range(min(max_length // h, num_hashes))):
                found = self.cached_block(self.key(tokens, g, (fine + 1) * h))
                if found is not None:
                    return [NULL] * (fine // scale) + [found], (fine + 1) * h
            return [], 0
        blocks: list[int] = []
        for i in range(min(max_length // b, num_hashes // scale)):
            found = self.cached_block(self.key(tokens, g, (i + 1) * b))
            if found is None:
                break
            blocks.append(found)
        hit = len(blocks) * b
        first = len(blocks) * scale
        for fine in reversed(range(first, min(first + scale - 1, max_length // h, num_hashes))):
            found = self.cached_block(self.key(tokens, g, (fine + 1) * h))
            if found is not None:
                blocks.append(found)
                hit = (fine + 1) * h
                break
        return blocks[: cdiv(hit, b)], hit

    def get_computed_blocks(self, tokens: list[int], max_length: int | None = None) -> CowHit:
        """HybridKVCacheCoordinator.find_longest_cache_hit on its simple hybrid (one
        full-attention group, then one Mamba group, each looked up once): Mamba's bound is
        full attention's hit, and full attention keeps the blocks of the final length."""
        hit = max(0, len(tokens) - 1) if max_length is None else max_length
        found: list[list[int]] = [[] for _ in self.kinds]
        for g in sorted(self.groups, key=lambda g: self.kinds[g] != "full"):
            found[g], hit = self.find(g, tokens, hit)
        for g in self.groups:
            if self.kinds[g] == "full":
                del found[g][cdiv(hit, self.block) :]
        return CowHit(found, hit)

    # --- allocation (KVCacheManager.allocate_slots) ---
    def allocate_slots(
        self,
        rid: Any,
        num_new: int,
        tokens: list[int],
        prompt_len: int,
        num_computed: int,
        hit: CowHit | None = None,
        processed: int | None = None,
        full_sequence: bool = False,
    ) -> list[list[int]] | None:
        """KVCacheManager.allocate_slots for ``num_new`` tokens past ``num_computed`` (the
        request's computed tokens before the call) and the admission's ``hit``: each
        group's new blocks, or None when they do not fit. ``tokens`` are the request's
        known tokens (vLLM's ``all_token_ids``), ``processed`` the computed tokens already
        processed (less the in-flight ones under async scheduling), ``full_sequence`` the
        admission gate on the whole sequence (``full_sequence_must_fit``)."""
        req = self.requests.get(rid)
        if req is None:
            n = len(self.kinds)
            req = CowReq(list(tokens), prompt_len, tables=[[] for _ in range(n)])
            req.num_cached, req.partial = [None] * n, [None] * n
        req.tokens, req.prompt_len = list(tokens), prompt_len
        hit = hit or CowHit([[] for _ in self.kinds], 0)
        computed = num_computed + hit.num_tokens
        num_tokens = computed + num_new
        if full_sequence:
            whole = len(tokens)
            if sum(self.blocks_needed(req, g, whole, hit, computed) for g in self.groups) > len(
                self.free_queue
            ):
                return None
        if rid in self.requests:
            self.remove_skipped(req, computed if processed is None else processed)
        needed = sum(self.blocks_needed(req, g, num_tokens, hit, computed) for g in self.groups)
        if needed > len(self.free_queue):
            return None
        self.requests[rid] = req
        for g in self.groups:  # allocate_new_computed_blocks, group by group
            if hit.blocks[g]:
                self.add_hit(req, g, hit, computed)
        new = [self.allocate_new(req, g, num_tokens) for g in self.groups]
        req.num_computed = num_tokens
        self.cache_blocks_of(req, min(num_tokens, len(req.tokens)))
        return new

    def cache_blocks(self, rid: Any, tokens: list[int], num_tokens: int) -> None:
        """KVCacheManager.cache_blocks (the scheduler's, after a step's output)."""
        req = self.requests[rid]
        req.tokens = list(tokens)
        self.cache_blocks_of(req, num_tokens)

    def remove_skipped_blocks(self, rid: Any, processed: int) -> None:
        self.remove_skipped(self.requests[rid], processed)

    @property
    def groups(self) -> range:
        return range(len(self.kinds))

    def remove_skipped(self, req: CowReq, processed: int) -> None:
        """MambaManager.remove_skipped_blocks (full attention skips nothing)."""
        b = self.block
        for g in self.groups:
            if self.kinds[g] != "align" or processed - 1 <= 0:
                continue
            table = req.tables[g]
            first, last = req.retired, min((processed - 1) // b, len(table))
            if first < last:
                freed = []
                for i in range(last - 1, first - 1, -1):
                    if table[i] != NULL:
                        freed.append(table[i])
                        table[i] = NULL
                self.free_blocks(freed)
                req.retired = last
            idx = req.last_state
            if idx is not None and idx < cdiv(processed, b) - 1 and table[idx] != NULL:
                self.free_blocks([table[idx]])
                table[idx] = NULL

    def partial_hit(self, hit: CowHit, g: int, computed: int) -> bool:
        return bool(hit.blocks[g]) and computed % self.block != 0

    def blocks_needed(
        self, req: CowReq, g: int, num_tokens: int, hit: CowHit, computed: int
    ) -> int:
        b, table, hit_blocks = self.block, req.tables[g], hit.blocks[g]
        required = cdiv(num_tokens, b)
        evictable = sum(1 for x in hit_blocks if x != NULL and self.ref[x] == 0)
        partial = self.partial_hit(hit, g, computed)
        if self.kinds[g] == "full":
            return max(required - len(hit_blocks) - len(table), 0) + partial + evictable
        last = hit_blocks[-1] if hit_blocks else NULL
        if last in self.keys_of and self.keys_of[last][0] in self.this_step:
            return self.num_blocks + 1  # a state cached this step: next step
        partial = partial or req.partial[g] is not None
        new = required - len(hit_blocks) - len(table)
        if partial:
            new = max(new, 0) + 1
        if new > 0:
            new = min(new, 1 + partial)
        return new + evictable

    def add_hit(self, req: CowReq, g: int, hit: CowHit, computed: int) -> None:
        """add_local_computed_blocks."""
        b = self.block
        skipped = max(0, computed - 1) // b if self.kinds[g] == "align" else 0
        kept = hit.blocks[g][skipped:]
        self.touch(kept)
        req.tables[g] = [NULL] * skipped + list(kept)
        req.num_cached[g] = len(req.tables[g])
        if self.partial_hit(hit, g, computed):
            req.partial[g] = (computed // b, kept[-1])
            req.num_cached[g] = computed // b

    def allocate_new(self, req: CowReq, g: int, num_tokens: int) -> list[int]:
        if self.kinds[g] == "full":
            return self.allocate_new_full(req, g, num_tokens)
        return self.allocate_new_align(req, g, num_tokens)

    def allocate_new_full(self, req: CowReq, g: int, num_tokens: int) -> list[int]:
        cow: list[int] = []
        if req.partial[g] is not None:
            idx, source = req.partial[g]  # type: ignore[misc]
            req.partial[g] = None
            cow = self.take_free_blocks(1)
            self.apply_cow(req, g, idx, source, cow[0])
        table = req.tables[g]
        added = self.take_free_blocks(max(0, cdiv(num_tokens, self.block) - len(table)))
        table.extend(added)
        return cow + added

    def allocate_new_align(self, req: CowReq, g: int, num_tokens: int) -> list[int]:
        table, b = req.tables[g], self.block
        required = cdiv(num_tokens, b)
        partial = req.partial[g]
        if required <= len(table) and partial is None:
            req.allocated = True
            return []
        prev = len(table)
        if req.allocated or prev > 0:
            req.last_state = prev - 1
        if prev < required - 1:
            table.extend([NULL] * (required - 1 - prev))
        num_new = max(required - len(table), 0) + (partial is not None)
        new = self.take_free_blocks(num_new)
        returned = table[prev:]
        if partial is not None:
            idx, source = partial
            cow, new = new[0], new[1:]
            if req.allocated:
                # The running request stays on its block; the entry moves to the copy.
                assert table[idx] == source
                num_tokens = self.key_len.get(source, 0)
                for key in self.remove_keys(source):
                    self.insert_key(key, cow, num_tokens)
                self.copies[g].append((source, cow))
                self.ref[source] += 1
                if cow in self.keys_of:
                    self.this_step.add(self.keys_of[cow][0])
            else:
                self.apply_cow(req, g, idx, source, cow)
                returned = [cow, *returned]
        table.extend(new)
        req.allocated = True
        req.partial[g] = None
        return returned + new

    def apply_cow(self, req: CowReq, g: int, idx: int, source: int, cow: int) -> None:
        assert req.tables[g][idx] == source
        assert self.ref[source] > 0
        req.tables[g][idx] = cow
        self.copies[g].append((source, cow))
        self.ref[cow] += 1

    # --- caching (cache_blocks; no rounding with partial hits on) ---
    def cache_blocks_of(self, req: CowReq, num_tokens: int) -> None:
        for g in self.groups:
            before = req.num_cached[g] or 0
            self.cache_full(req, g, num_tokens)
            after = req.num_cached[g] or 0
            if self.kinds[g] == "full":
                self.cache_tail_full(req, g, num_tokens)
                continue
            key = self.cache_tail_align(req, g, num_tokens)
            if key is not None:
                self.this_step.add(key)
            table = req.tables[g]
            for i in range(before, after):
                if table[i] != NULL and table[i] in self.keys_of:
                    self.this_step.add(self.keys_of[table[i]][0])

    def cache_full(self, req: CowReq, g: int, num_tokens: int) -> None:
        b, table = self.block, req.tables[g]
        start = req.num_cached[g] or 0
        hashed = len(req.tokens) // self.hash_block * self.hash_block
        num_full = min(num_tokens, hashed) // b
        if start >= num_full:
            return
        for i in range(start, num_full):
            block = table[i]
            if block == NULL:
                continue
            if block in self.keys_of:  # a partial entry promoted to the full block
                assert self.key_len[block] < (i + 1) * b
                self.remove_keys(block)
            self.insert_key(self.key(req, g, (i + 1) * b), block, (i + 1) * b)
        req.num_cached[g] = num_full

    def cache_tail_full(self, req: CowReq, g: int, num_tokens: int) -> None:
        h, b = self.hash_block, self.block
        boundary = min((req.prompt_len - 1) // h, len(req.tokens) // h) * h
        if boundary == 0 or boundary > num_tokens or boundary % b == 0:
            return
        table = req.tables[g]
        if boundary // b < len(table):
            self.cache_partial(req, g, table[boundary // b], boundary)

    def cache_tail_align(self, req: CowReq, g: int, num_tokens: int) -> Key | None:
        h, b = self.hash_block, self.block
        if num_tokens <= 0 or num_tokens % h:
            return None
        if num_tokens != (req.prompt_len - 1) // h * h:
            return None
        idx = cdiv(num_tokens, b) - 1
        table = req.tables[g]
        if idx >= len(table) or table[idx] == NULL:
            return None
        source = table[idx]
        if self.key_len.get(source) == num_tokens:
            return None
        key = self.cache_partial(req, g, source, num_tokens)
        if key is not None and num_tokens % b:
            req.partial[g] = (idx, source)
            req.num_cached[g] = idx
        return key

    # --- the step's copies and the end of a request ---
    def take_copies(self) -> tuple[list[tuple[int, int]], list[int]]:
        """KVCacheManager.take_kv_cache_block_copies: the copies, and their endpoints,
        retained until the caller frees them."""
        copies = [pair for group in self.copies for pair in group]
        self.copies = [[] for _ in self.kinds]
        return copies, [block for pair in copies for block in pair]

    def new_step_starts(self) -> None:
        self.this_step.clear()

    def free(self, rid: Any) -> None:
        req = self.requests.pop(rid)
        for table in req.tables:
            head = 0
            while head < len(table) and table[head] == NULL:
                head += 1
            self.free_blocks(list(reversed(table[head:])))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)
