"""Pure-Python reference models of the KV structures, written from docs/kv.md.

They favour obviousness over speed (linear scans, plain lists) and are driven side by side
with the Rust objects by the hypothesis state machines in test_kv_stateful.py.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count

from tokenyard.errors import CapacityError, InputError, UnknownRequestError


class RefCountingAllocator:
    def __init__(self, num_blocks: int, watermark_fraction: float = 0.0):
        self.num_blocks = num_blocks
        self.watermark_blocks = int(watermark_fraction * num_blocks)
        self.allocation: dict[object, int] = {}

    @property
    def num_allocated_blocks(self) -> int:
        return sum(self.allocation.values())

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_allocated_blocks

    def can_allocate(self, n: int) -> bool:
        return self.num_free_blocks >= n

    def can_admit(self, n: int) -> bool:
        return self.num_free_blocks - n >= self.watermark_blocks

    def allocate(self, request_id: object, n: int) -> None:
        if n < 1:
            raise InputError("num_blocks")
        if n > self.num_free_blocks:
            raise CapacityError("blocks")
        self.allocation[request_id] = self.allocation.get(request_id, 0) + n

    def free(self, *request_ids: object) -> int:
        for i, rid in enumerate(request_ids):
            if rid not in self.allocation:
                raise UnknownRequestError(str(rid))
            if rid in request_ids[:i]:
                raise InputError("request_ids")
        return sum(self.allocation.pop(rid) for rid in request_ids)


@dataclass
class RefHit:
    block_ids: list[int]
    num_computed_tokens: int
    hashes: list[int]
    num_query_tokens: int
    extra_key: int | None
    num_host_blocks: int = 0

    def host_hashes(self) -> list[int]:
        first = len(self.block_ids)
        return self.hashes[first : first + self.num_host_blocks]


@dataclass
class RefRequest:
    block_ids: list[int]
    tokens: list[int]
    num_computed_tokens: int
    num_cached_blocks: int
    extra_key: int | None


class RefBlockPool:
    """vLLM V1's block pool: ref counts, an LRU free queue, every block caching a hash listed
    under it oldest first (a lookup gets the oldest, as vLLM 0.33's map does); with
    ``host_num_blocks`` > 0, a host tier (an LRU of hashes) that evicted hashes go to."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        host_num_blocks: int = 0,
    ):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.cached: dict[int, list[int]] = {}
        self.requests: dict[object, RefRequest] = {}
        self.stats = [0, 0, 0]  # lookups, query tokens, hit tokens
        self.host_num_blocks = host_num_blocks
        self.host: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.host_stats = [0, 0, 0]  # host hit tokens, offloaded blocks, loaded blocks
        # Interning (parent, tokens, extra key) gives exact, collision-free chained hashes.
        self._hash_ids: dict[tuple[object, ...], int] = {}
        self._next_hash = count()

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        return sum(len(blocks) for blocks in self.cached.values())

    def _hashes(self, tokens: list[int], extra_key: int | None) -> list[int]:
        hashes: list[int] = []
        bs = self.block_size
        for i in range(len(tokens) // bs):
            key = (hashes[-1] if hashes else None, tuple(tokens[i * bs : (i + 1) * bs]), extra_key)
            if key not in self._hash_ids:
                self._hash_ids[key] = next(self._next_hash)
            hashes.append(self._hash_ids[key])
        return hashes

    def prefix_of(self, h: int) -> tuple[list[int], int | None]:
        """The token ids whose last full block has hash ``h``, and their extra key."""
        key = next(k for k, v in self._hash_ids.items() if v == h)
        parent, tokens, extra_key = key
        before = [] if parent is None else self.prefix_of(parent)[0]
        return before + list(tokens), extra_key

    def get_computed_blocks(self, tokens: list[int], extra_key: int | None = None) -> RefHit:
        if not self.enable_caching:
            return RefHit([], 0, [], len(tokens), extra_key)
        hashes = self._hashes(tokens, extra_key)
        hit: list[int] = []
        num_host = 0
        # GPU hits first, then the blocks the host tier holds, never the last token.
        for h in hashes[: max(len(tokens) - 1, 0) // self.block_size]:
            if num_host == 0 and h in self.cached:
                hit.append(self.cached[h][0])
            elif h in self.host:
                num_host += 1
            else:
                break
        self.stats[0] += 1
        self.stats[1] += len(tokens)
        self.stats[2] += len(hit) * self.block_size
        self.host_stats[0] += num_host * self.block_size
        return RefHit(hit, len(hit) * self.block_size, hashes, len(tokens), extra_key, num_host)

    def allocate_slots(
        self,
        request_id: object,
        num_new_tokens: int,
        num_lookahead_tokens: int = 0,
        token_ids: list[int] | None = None,
        hit: RefHit | None = None,
        extra_key: int | None = None,
    ) -> list[int] | None:
        if num_new_tokens < 1:
            raise InputError("num_new_tokens")
        if num_lookahead_tokens < 0:
            raise InputError("num_lookahead_tokens")
        return self._allocate(
            request_id, num_new_tokens, num_lookahead_tokens, token_ids, hit, extra_key, True
        )

    def allocate_slots_external(
        self,
        request_id: object,
        num_external_tokens: int,
        token_ids: list[int],
        hit: RefHit | None = None,
        extra_key: int | None = None,
    ) -> list[int] | None:
        """Loaded tokens (the hit's host blocks, then external ones): computed, not cached
        until ``cache_loaded_blocks``."""
        if num_external_tokens < 0:
            raise InputError("num_external_tokens")
        if request_id in self.requests:
            raise InputError("request_id")
        loaded = hit.num_computed_tokens + hit.num_host_blocks * self.block_size if hit else 0
        if loaded + num_external_tokens > len(token_ids):
            raise InputError("num_external_tokens")
        return self._allocate(request_id, num_external_tokens, 0, token_ids, hit, extra_key, False)

    def cache_loaded_blocks(self, request_id: object) -> None:
        if request_id not in self.requests:
            raise UnknownRequestError(str(request_id))
        self._cache_full_blocks(self.requests[request_id])

    def _allocate(
        self,
        request_id: object,
        num_new_tokens: int,
        num_lookahead_tokens: int,
        token_ids: list[int] | None,
        hit: RefHit | None,
        extra_key: int | None,
        cache: bool,
    ) -> list[int] | None:
        token_ids = list(token_ids or [])
        num_loaded = hit.num_host_blocks * self.block_size if hit else 0
        if num_new_tokens + num_loaded < 1:
            raise InputError("num_new_tokens")
        request = self.requests.get(request_id)
        if request is not None:
            if hit is not None:
                raise InputError("new_computed_blocks")
            if extra_key is not None and extra_key != request.extra_key:
                raise InputError("extra_key")
            num_computed, num_held = request.num_computed_tokens, len(request.block_ids)
        else:
            num_computed = num_held = 0
            if hit is not None:
                self._check_hit(hit, len(token_ids), extra_key)
                # Host-hit blocks need fresh blocks: they count as new ones.
                num_computed = hit.num_computed_tokens + num_loaded
                num_held = len(hit.block_ids)
        slots = num_computed + num_new_tokens + num_lookahead_tokens
        num_new_blocks = max(-(-slots // self.block_size) - num_held, 0)
        evictable_hits = sum(self.ref_cnt[b] == 0 for b in hit.block_ids) if hit else 0
        if num_new_blocks + evictable_hits > len(self.free_queue):
            return None
        if request is None:
            request = self._admit(request_id, hit, extra_key)
        new_blocks = [self._take_free_block() for _ in range(num_new_blocks)]
        request.block_ids += new_blocks
        request.tokens += token_ids
        request.num_computed_tokens += num_new_tokens
        if cache:
            self._cache_full_blocks(request)
        return new_blocks

    def _check_hit(self, hit: RefHit, num_tokens: int, extra_key: int | None) -> None:
        if hit.num_query_tokens != num_tokens:
            raise InputError("new_computed_blocks")
        if extra_key is not None and extra_key != hit.extra_key:
            raise InputError("extra_key")
        for b, h in zip(hit.block_ids, hit.hashes, strict=False):
            if self.block_hash[b] != h:
                raise InputError("new_computed_blocks")
        if any(h not in self.host for h in hit.host_hashes()):
            raise InputError("new_computed_blocks")

    def _admit(self, request_id: object, hit: RefHit | None, extra_key: int | None) -> RefRequest:
        request = RefRequest([], [], 0, 0, extra_key)
        if hit is not None:
            for b in hit.block_ids:
                if self.ref_cnt[b] == 0:
                    del self.free_queue[b]
                self.ref_cnt[b] += 1
            # A load is a use of the host entries, before this allocation offloads anything.
            for h in hit.host_hashes():
                self.host.move_to_end(h)
            self.host_stats[2] += hit.num_host_blocks
            num_computed = hit.num_computed_tokens + hit.num_host_blocks * self.block_size
            request = RefRequest(
                list(hit.block_ids), [], num_computed, len(hit.block_ids), hit.extra_key
            )
        self.requests[request_id] = request
        return request

    def _take_free_block(self) -> int:
        block, _ = self.free_queue.popitem(last=False)
        h = self.block_hash[block]
        if h is not None:
            self.cached[h].remove(block)
            if not self.cached[h]:
                del self.cached[h]
            self.block_hash[block] = None
            if self.host_num_blocks > 0:
                self._offload(h)
        self.ref_cnt[block] = 1
        return block

    def _offload(self, h: int) -> None:
        if h in self.host:
            self.host.move_to_end(h)
            return
        if len(self.host) == self.host_num_blocks:
            self.host.popitem(last=False)
        self.host[h] = None
        self.host_stats[1] += 1

    def _cache_full_blocks(self, request: RefRequest) -> None:
        if not self.enable_caching:
            return
        hashes = self._hashes(request.tokens, request.extra_key)
        num_full = min(request.num_computed_tokens, len(request.tokens)) // self.block_size
        for i in range(request.num_cached_blocks, num_full):
            self.cached.setdefault(hashes[i], []).append(request.block_ids[i])
            self.block_hash[request.block_ids[i]] = hashes[i]
        request.num_cached_blocks = max(request.num_cached_blocks, num_full)

    def free(self, request_id: object) -> None:
        if request_id not in self.requests:
            raise UnknownRequestError(str(request_id))
        evict_first = []
        for b in reversed(self.requests.pop(request_id).block_ids):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                if self.block_hash[b] is None:
                    evict_first.append(b)
                else:
                    self.free_queue[b] = None
        for b in reversed(evict_first):
            self.free_queue[b] = None
            self.free_queue.move_to_end(b, last=False)

    def reset_prefix_cache(self) -> bool:
        if self.requests:
            return False
        self.cached.clear()
        self.block_hash = [None] * len(self.block_hash)
        self.host.clear()
        return True


@dataclass(eq=False)
class RefNode:
    key: list[int]
    value: list[int]
    parent: RefNode | None
    children: dict[tuple[int, ...], RefNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    alive: bool = True


class RefRadixCache:
    """SGLang's radix cache with a logical clock ticked once per node touched.

    With ``refresh_before_split`` (SGLang 0.5.23's rule, which the core follows) an edge that
    a walk ends inside is touched before the split, so the remainder keeps that tick and the
    new parent gets the next one; without it (the core's order before issue 15) only the new
    parent is touched and the remainder keeps its old time.
    """

    def __init__(self, page_size: int = 1, refresh_before_split: bool = True):
        self.page_size = page_size
        self.refresh_before_split = refresh_before_split
        self.root = RefNode([], [], None)
        self.clock = 0

    def _nodes(self) -> list[RefNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    @property
    def evictable_size(self) -> int:
        return sum(len(n.key) for n in self._nodes() if n.lock_ref == 0)

    @property
    def protected_size(self) -> int:
        return sum(len(n.key) for n in self._nodes() if n.lock_ref > 0)

    @property
    def num_nodes(self) -> int:
        return len(self._nodes())

    def _touch(self, node: RefNode) -> None:
        self.clock += 1
        node.last_access = self.clock

    def _common(self, a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n // self.page_size * self.page_size

    def _split(self, child: RefNode, at: int) -> RefNode:
        parent = child.parent
        assert parent is not None
        new = RefNode(
            child.key[:at], child.value[:at], parent, {}, child.lock_ref, child.last_access
        )
        child.key, child.value, child.parent = child.key[at:], child.value[at:], new
        new.children[tuple(child.key[: self.page_size])] = child
        parent.children[tuple(new.key[: self.page_size])] = new
        return new

    def _walk(self, key: list[int]) -> tuple[RefNode, int, list[int]]:
        node, matched, values = self.root, 0, []
        while matched < len(key):
            child = node.children.get(tuple(key[matched : matched + self.page_size]))
            if child is None:
                break
            common = self._common(child.key, key[matched:])
            partial = common < len(child.key)
            if partial:
                if self.refresh_before_split:
                    self._touch(child)
                child = self._split(child, common)
            self._touch(child)
            values += child.value
            matched += len(child.key)
            node = child
            if partial:
                break
        return node, matched, values

    def match_prefix(self, tokens: list[int]) -> tuple[int, list[int], RefNode]:
        key = tokens[: len(tokens) // self.page_size * self.page_size]
        node, matched, values = self._walk(key)
        return matched, values, node

    def insert(self, tokens: list[int], values: list[int]) -> int:
        if len(values) != len(tokens):
            raise InputError("values")
        if len(tokens) % self.page_size:
            raise InputError("token_ids")
        node, matched, _ = self._walk(tokens)
        if matched < len(tokens):
            leaf = RefNode(tokens[matched:], values[matched:], node)
            node.children[tuple(leaf.key[: self.page_size])] = leaf
            self._touch(leaf)
        return matched

    def lock(self, node: RefNode) -> int:
        """Returns the change in evictable tokens (SGLang's ``inc_lock_ref`` delta)."""
        if not node.alive:
            raise InputError("handle")
        delta = 0
        while node is not self.root and node is not None:
            if node.lock_ref == 0:
                delta -= len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]
        return delta

    def unlock(self, node: RefNode) -> int:
        """Returns the change in evictable tokens (SGLang's ``dec_lock_ref`` delta)."""
        if not node.alive or (node is not self.root and node.lock_ref == 0):
            raise InputError("handle")
        delta = 0
        while node is not self.root and node is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                delta += len(node.key)
            node = node.parent  # type: ignore[assignment]
        return delta

    def evict(self, num_tokens: int) -> list[int]:
        freed: list[int] = []
        while len(freed) < num_tokens:
            leaves = [n for n in self._nodes() if not n.children and n.lock_ref == 0]
            if not leaves:
                break
            leaf = min(leaves, key=lambda n: n.last_access)
            assert leaf.parent is not None
            del leaf.parent.children[tuple(leaf.key[: self.page_size])]
            leaf.alive = False
            freed += leaf.value
        return freed

    def reset(self) -> None:
        for node in self._nodes():
            node.alive = False
        self.root.children.clear()


@dataclass
class RefPages:
    block_ids: list[int]
    tokens: list[int]
    num_computed: int
    num_tree_pages: int
    handle: RefNode | None
    uses_tree: bool


@dataclass
class RefRadixHit:
    block_ids: list[int]
    num_computed_tokens: int
    handle: RefNode | None


class RefRadixPool:
    """SGLang's cache manager: a LIFO page allocator plus the reference radix tree."""

    def __init__(self, num_pages: int, page_size: int):
        self.p = page_size
        self.num_pages = num_pages
        self.free_pages = list(reversed(range(num_pages)))
        self.tree = RefRadixCache(page_size)
        self.requests: dict[object, RefPages] = {}
        self.stats = [0, 0, 0]

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_pages) + self.tree.evictable_size // self.p

    def get_computed_blocks(self, tokens: list[int], extra_key: int | None = None) -> RefRadixHit:
        if extra_key is not None:
            return RefRadixHit([], 0, None)
        matched, values, node = self.tree.match_prefix(tokens[: max(len(tokens) - 1, 0)])
        self.stats[0] += 1
        self.stats[1] += len(tokens)
        self.stats[2] += matched
        return RefRadixHit([v // self.p for v in values[:: self.p]], matched, node)

    def allocate_slots(
        self,
        request_id: object,
        num_new_tokens: int,
        num_lookahead_tokens: int = 0,
        token_ids: list[int] | None = None,
        hit: RefRadixHit | None = None,
        extra_key: int | None = None,
    ) -> list[int] | None:
        if num_new_tokens < 1:
            raise InputError("num_new_tokens")
        request = self.requests.get(request_id)
        if request is not None and hit is not None:
            raise InputError("new_computed_blocks")
        if request is not None:
            computed, held = request.num_computed, len(request.block_ids)
        elif hit is not None:
            computed, held = hit.num_computed_tokens, len(hit.block_ids)
        else:
            computed = held = 0
        handle = hit.handle if hit is not None else None
        if handle is not None:
            self.tree.lock(handle)
        needed = max(-(-(computed + num_new_tokens + num_lookahead_tokens) // self.p) - held, 0)
        if needed > len(self.free_pages) + self.tree.evictable_size // self.p:
            if handle is not None:
                self.tree.unlock(handle)
            return None
        if needed > len(self.free_pages):
            slots = self.tree.evict((needed - len(self.free_pages)) * self.p)
            self.free_pages += [s // self.p for s in slots[:: self.p]]
        new = [self.free_pages.pop() for _ in range(needed)]
        if request is None:
            tree_pages = list(hit.block_ids) if hit is not None else []
            request = RefPages(tree_pages, [], computed, len(tree_pages), handle, extra_key is None)
            self.requests[request_id] = request
        request.block_ids += new
        request.tokens += list(token_ids or [])
        request.num_computed += num_new_tokens
        return new

    def free(self, request_id: object) -> None:
        if request_id not in self.requests:
            raise UnknownRequestError(str(request_id))
        r = self.requests.pop(request_id)
        kept = r.num_tree_pages
        if r.uses_tree:
            full = min(r.num_computed, len(r.tokens)) // self.p
            slots = [page * self.p + i for page in r.block_ids[:full] for i in range(self.p)]
            already = self.tree.insert(r.tokens[: full * self.p], slots) // self.p
            self.free_pages += reversed(r.block_ids[r.num_tree_pages : max(already, kept)])
            kept = max(full, kept)
        self.free_pages += reversed(r.block_ids[kept:])
        if r.handle is not None:
            self.tree.unlock(r.handle)
