"""A pure-Python reference model of vLLM 0.33's HiSparse connector, scheduler side, with
prefix caching on: the device half of ``hisparse_residency_model`` (write-backs, GPU
residency, hot regions, unpinning with reuse watchers, the free order) with the host pool
published as ``HiSparseCoordinator`` publishes it and the prefix hits that publication
makes possible. What caching on adds, read in ``vllm/v1/hisparse/coordinator.py``,
``vllm/v1/core/single_type_kv_cache_manager.py`` (``HiSparseSourceManager``,
``HiSparseResidentManager``, ``HiSparseHotManager``) and ``vllm/v1/core/block_pool.py``:

- hashes: a page's key is the request's tokens up to its end (vLLM chains block hashes,
  the same thing without collisions). The device indexer group caches its full blocks
  at each allocation (``cache_blocks`` over the computed and scheduled tokens); the host
  group publishes only its *ready* prefix (pages whose write-back landed, in order:
  ``publish_when_ready`` at each allocation, again when a write lands, and for a finished
  request with writes pending when its last one lands, ``_publish_detached_blocks``, its
  pages leased meanwhile). Handing out a hashed block evicts its key; a block reaching no
  reference goes to its free queue's tail when hashed, its front otherwise;
- GPU copies (``copies``): publishing a host page records the GPU block its request reads
  it from (resident, not pending), replacing an earlier copy of that key; a copy goes when
  its block's reuse watcher fires (only unpinned blocks have one);
- hits (``get_computed_blocks``): the longest run of full pages (never the last token)
  both published on the host and cached by the indexer, the hit blocks of both referenced
  (one without a reference leaves its free queue, counted against the free blocks when the
  allocation is checked); the resident row starts with null pages for the hit
  (``add_local_computed_blocks``), valid and ready on the host (``commit_computed_blocks``),
  and the request needs its hot region at once (it resumes a host prefix);
- adoption (``update_residency``, first after admission): each hit page whose host block
  has a GPU copy is read from that copy again, the copy's block referenced (``touch``) and
  counted clean and pinned; with the hot region held it is unpinned like any clean page.

Not modelled: copy-on-write for hits ending inside a block (vLLM needs partial hash hits
for that, off here), imports (no KV connector loads into host pages) and the worker's
residency updates (stale pages). ``num_reprefillable_tokens`` is 0.

Used by tests/test_hisparse_caching_model.py (against vLLM's own)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

ACTIVE_TAIL_PAGES = 2
NULL = 0

Key = tuple[int, ...]


@dataclass
class _Publication:
    computed: int
    num_pages: int
    finished: bool = False
    # A finished request's leased host pages and their published count (vLLM's
    # detached_blocks, num_cached_blocks), once detached.
    detached: list[int] | None = None
    num_cached: int = 0


@dataclass
class _Request:
    tokens: list[int]
    computed: int = 0
    host: list[int] = field(default_factory=list)
    indexer: list[int] = field(default_factory=list)
    # The resident table with residency changes applied (NULL: the page is not on the GPU).
    resident: list[int] = field(default_factory=list)
    hot: list[int] = field(default_factory=list)
    hot_required: bool = False
    # Whether the hot group counted this request (vLLM's num_cached_block entry).
    hot_seen: bool = False
    valid: set[int] = field(default_factory=set)
    ready: int = 0
    pending: dict[int, int] = field(default_factory=dict)
    pinned_clean: set[int] = field(default_factory=set)
    unpinned: set[int] = field(default_factory=set)
    host_cached: int = 0
    indexer_cached: int = 0
    publication: _Publication | None = None
    copies_recorded: int = 0
    pages_to_adopt: int = 0

    def key(self, page: int, block_size: int) -> Key:
        return tuple(self.tokens[: (page + 1) * block_size])


class _Pool:
    """One ``BlockPool`` with prefix caching: free queue, references, hashed blocks."""

    def __init__(self, num_blocks: int, name: str) -> None:
        self.name = name
        self.free: deque[int] = deque(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.key: dict[int, Key] = {}
        # key -> the blocks cached under it, first cached first (vLLM's dict of blocks).
        self.cached: dict[Key, dict[int, None]] = {}

    def take(self, n: int) -> list[int]:
        taken = [self.free.popleft() for _ in range(n)]
        for block in taken:
            self.evict(block)
            self.ref[block] = 1
        return taken

    def evict(self, block: int) -> None:
        key = self.key.pop(block, None)
        if key is not None:
            blocks = self.cached[key]
            del blocks[block]
            if not blocks:
                del self.cached[key]

    def insert(self, block: int, key: Key) -> None:
        self.key[block] = key
        self.cached.setdefault(key, {})[block] = None

    def lookup(self, key: Key) -> int | None:
        blocks = self.cached.get(key)
        return None if blocks is None else next(iter(blocks))

    def touch(self, block: int) -> None:
        if self.ref[block] == 0:
            self.free.remove(block)
        self.ref[block] += 1

    def release(self, blocks: list[int]) -> None:
        """``free_blocks``: unhashed blocks reaching no reference to the front (the first
        given first), hashed ones to the tail."""
        front, tail = [], []
        for block in blocks:
            if block == NULL:
                continue
            if self.ref[block] <= 0:
                raise AssertionError(f"{self.name} block {block} freed twice")
            self.ref[block] -= 1
            if self.ref[block] == 0:
                (tail if block in self.key else front).append(block)
        self.free.extendleft(reversed(front))
        self.free.extend(tail)


class CachingResidency:
    """``num_blocks`` device and ``host_num_blocks`` host blocks (block 0 of each the null
    block) of ``block_size`` tokens; ``hot_blocks`` blocks per hot region."""

    def __init__(
        self,
        num_blocks: int,
        host_num_blocks: int,
        block_size: int,
        *,
        max_model_len: int,
        max_admission_blocks: int,
        hot_blocks: int = 2,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.host_num_blocks = host_num_blocks
        self.hot_blocks = hot_blocks
        self.max_admission_blocks = max_admission_blocks
        self.max_model_len = max_model_len
        self.max_spill_pages = max_model_len // block_size
        self.watermark = max(hot_blocks, num_blocks // 10)
        self.device = _Pool(num_blocks, "device")
        self.host = _Pool(host_num_blocks, "host")
        self.watched: set[int] = set()
        self.owners: dict[int, set[tuple[str, int]]] = {}
        self.copies: dict[Key, int] = {}
        self.copy_by_block: dict[int, Key] = {}
        self.requests: dict[str, _Request] = {}
        # States of freed requests whose publication waits on their writes.
        self.detached: list[_Request] = []
        # transfer id -> (request state, request id, page, host block, resident block)
        self.transfers: dict[int, tuple[_Request, str, int, int, int]] = {}
        self.next_transfer = 0
        self.planned: list[tuple[int, int, int]] = []
        # Pages read from GPU copies again, and finished requests whose publication
        # outlived them, so far (counts for the tests).
        self.num_adopted = 0
        self.num_detached = 0

    # -- the device pool's reuse watchers and GPU copies ------------------------------

    def _take(self, n: int) -> list[int]:
        taken = list(self.device.free)[:n]
        for block in taken:
            if block in self.watched:
                self.watched.discard(block)
                key = self.copy_by_block.get(block)
                if key is not None:
                    self._drop_copy(key)
                for request_id, page in sorted(self.owners.pop(block, ())):
                    self._lose_page(request_id, page)
        return self.device.take(n)

    def _unpin(self, block: int) -> None:
        self.device.ref[block] -= 1
        self.watched.add(block)
        if self.device.ref[block] == 0:
            self.device.free.append(block)

    def _drop_copy(self, key: Key) -> None:
        block = self.copies.pop(key, None)
        if block is not None:
            self.copy_by_block.pop(block, None)

    def _record_copy(self, request: _Request, page: int) -> None:
        key = self.host.key.get(request.host[page])
        block = request.resident[page] if page < len(request.resident) else NULL
        if key is None or block == NULL:
            return
        self._drop_copy(key)
        self.copies[key] = block
        self.copy_by_block[block] = key

    # -- publication --------------------------------------------------------------------

    def _publish(self, request: _Request, host: list[int], num_pages: int) -> None:
        """``cache_full_blocks`` on the host pool: pages from the published count on."""
        for page in range(request.host_cached, num_pages):
            if host[page] != NULL:
                self.host.insert(host[page], request.key(page, self.block_size))
        request.host_cached = max(request.host_cached, num_pages)

    def _publish_ready(self, request: _Request) -> None:
        """``_publish_host_blocks_if_ready``."""
        publication = request.publication
        if publication is None:
            return
        num_tokens = min(publication.computed, request.ready * self.block_size)
        full = min(num_tokens, len(request.tokens)) // self.block_size
        if request.host_cached < full:
            self._publish(request, request.host, full)
        num_host = min(num_tokens // self.block_size, len(request.host))
        for page in range(request.copies_recorded, num_host):
            if page not in request.pending:
                self._record_copy(request, page)
        request.copies_recorded = max(request.copies_recorded, num_host)
        if request.ready >= publication.num_pages:
            request.publication = None

    def _publish_detached(self, request: _Request) -> None:
        publication = request.publication
        if publication is None or request.pending or publication.detached is None:
            return
        while request.ready in request.valid:
            request.ready += 1
        blocks = publication.detached
        request.host_cached = publication.num_cached
        self._publish(request, blocks, min(request.ready, publication.num_pages))
        self.host.release(list(reversed(blocks)))
        request.publication = None
        self.detached.remove(request)

    # -- residency ---------------------------------------------------------------------

    def _can_read_from_host(self, request: _Request) -> bool:
        return len(request.hot) == self.hot_blocks

    def _lose_page(self, request_id: str, page: int) -> None:
        request = self.requests.get(request_id)
        if request is None:
            return
        block = request.resident[page]
        if block != NULL:
            request.resident[page] = NULL
            self.owners.get(block, set()).discard((request_id, page))
        request.unpinned.discard(page)
        request.hot_required = True

    def _unpin_page(self, request_id: str, request: _Request, page: int) -> None:
        if page in request.pending or page not in request.valid:
            return
        block = request.resident[page]
        if page >= len(request.resident) - ACTIVE_TAIL_PAGES or block == NULL:
            return
        self.owners.setdefault(block, set()).add((request_id, page))
        self._unpin(block)
        request.pinned_clean.discard(page)
        request.unpinned.add(page)

    def _adopt(self, request: _Request) -> None:
        """``_adopt_copies`` over the hit's host pages."""
        for page, host_block in enumerate(request.host[: request.pages_to_adopt]):
            key = self.host.key.get(host_block)
            block = None if key is None else self.copies.get(key)
            if block is None or page >= len(request.resident) or request.resident[page]:
                continue
            request.resident[page] = block
            self.device.touch(block)
            request.pinned_clean.add(page)
            self.num_adopted += 1
        request.pages_to_adopt = 0

    def _update_residency(self, request_id: str, request: _Request) -> None:
        if request.pages_to_adopt:
            self._adopt(request)
        if not self._can_read_from_host(request):
            if (
                len(self.device.free) >= self.watermark
                and len(request.resident) < self.max_admission_blocks
            ):
                return
            request.hot_required = True
            return
        for page in sorted(request.pinned_clean, reverse=True):
            self._unpin_page(request_id, request, page)

    def _advance(self, request_id: str, request: _Request) -> None:
        """The connector's per-step work: write-backs, then residency."""
        budget = max(self.max_spill_pages - len(self.planned), 0)
        for page in range(request.ready, request.computed // self.block_size):
            if budget == 0:
                break
            if page in request.pending or page in request.valid:
                continue
            block = request.resident[page]
            if block == NULL:
                continue
            host_block = request.host[page]
            self.host.touch(host_block)
            self.device.touch(block)
            transfer_id = self.next_transfer
            self.next_transfer += 1
            self.transfers[transfer_id] = (request, request_id, page, host_block, block)
            request.pending[page] = transfer_id
            self.planned.append((transfer_id, host_block, block))
            budget -= 1
        self._update_residency(request_id, request)

    # -- allocation --------------------------------------------------------------------

    def _hit(self, request: _Request) -> tuple[list[int], list[int]]:
        """The hit blocks of the host and indexer groups (``find_longest_cache_hit``)."""
        host: list[int] = []
        indexer: list[int] = []
        for page in range((len(request.tokens) - 1) // self.block_size):
            key = request.key(page, self.block_size)
            host_block = self.host.lookup(key)
            device_block = self.device.lookup(key)
            if host_block is None or device_block is None:
                break
            host.append(host_block)
            indexer.append(device_block)
        return host, indexer

    def _fits(self, request: _Request, hit: tuple[list[int], list[int]], num_tokens: int) -> bool:
        host_hit, indexer_hit = hit
        local = request.computed + len(indexer_hit) * self.block_size
        pages = -(-num_tokens // self.block_size)
        host_need = pages - len(request.host) - len(host_hit)
        host_need += sum(1 for b in host_hit if self.host.ref[b] == 0)
        if host_need > len(self.host.free):
            return False
        need = pages - len(request.indexer) - len(indexer_hit)
        need += sum(1 for b in indexer_hit if self.device.ref[b] == 0)
        host_pages = -(-local // self.block_size)
        need += max(pages - max(len(request.resident), host_pages), 0)
        if request.hot_required or (local > 0 and not request.hot_seen):
            need += max(self.hot_blocks - len(request.hot), 0)
        return need <= len(self.device.free)

    def _allocate(self, request: _Request, hit: tuple[list[int], list[int]], num_new: int) -> bool:
        """``allocate_slots`` for ``num_new`` tokens past the computed ones and the hit."""
        host_hit, indexer_hit = hit
        total = request.computed + len(indexer_hit) * self.block_size
        num_tokens = min(total + num_new, self.max_model_len)
        if not self._fits(request, hit, num_tokens):
            return False
        if not request.host and not request.indexer:
            self._add_hit(request, host_hit, indexer_hit)
        pages = -(-num_tokens // self.block_size)
        request.host += self.host.take(max(pages - len(request.host), 0))
        request.indexer += self._take(max(pages - len(request.indexer), 0))
        request.resident += self._take(max(pages - len(request.resident), 0))
        request.hot_seen = True
        if request.hot_required and len(request.hot) < self.hot_blocks:
            request.hot += self._take(self.hot_blocks - len(request.hot))
        self._cache(request, min(total + num_new, len(request.tokens)))
        return True

    def _add_hit(self, request: _Request, host_hit: list[int], indexer_hit: list[int]) -> None:
        for block in host_hit:
            self.host.touch(block)
        for block in indexer_hit:
            self.device.touch(block)
        request.host = list(host_hit)
        request.host_cached = len(host_hit)
        request.indexer = list(indexer_hit)
        request.indexer_cached = len(indexer_hit)
        num_pages = len(indexer_hit)
        request.resident = [NULL] * num_pages
        if num_pages:
            request.valid.update(range(num_pages))
            request.ready = max(request.ready, num_pages)
            request.pages_to_adopt = max(request.pages_to_adopt, num_pages)
            request.copies_recorded = max(request.copies_recorded, num_pages)
            request.hot_required = True

    def _cache(self, request: _Request, num_tokens: int) -> None:
        """``cache_blocks``: the indexer's full blocks, the host's publication."""
        full = min(num_tokens, len(request.tokens)) // self.block_size
        for page in range(request.indexer_cached, full):
            self.device.insert(request.indexer[page], request.key(page, self.block_size))
        request.indexer_cached = max(request.indexer_cached, full)
        num_pages = num_tokens // self.block_size
        request.publication = _Publication(computed=num_tokens, num_pages=num_pages)
        self._publish_ready(request)

    # -- operations --------------------------------------------------------------------

    def admit(self, request_id: str, tokens: list[int], max_new_tokens: int | None) -> int | None:
        """Admits the request; returns its hit in tokens, or None when it does not fit."""
        request = _Request(tokens=list(tokens))
        hit = self._hit(request)
        hit_tokens = len(hit[1]) * self.block_size
        rest = len(tokens) - hit_tokens
        new = rest if max_new_tokens is None else min(rest, max_new_tokens)
        if not self._allocate(request, hit, new):
            return None
        self.requests[request_id] = request
        request.computed = hit_tokens + new
        self._advance(request_id, request)
        return hit_tokens

    def step(self, request_id: str, num_new_tokens: int) -> bool:
        request = self.requests[request_id]
        new = min(num_new_tokens, len(request.tokens) - request.computed)
        if not self._allocate(request, ([], []), new):
            return False
        request.computed += new
        self._advance(request_id, request)
        return True

    def decode(self, request_id: str, token: int) -> bool:
        self.requests[request_id].tokens.append(token)
        return self.step(request_id, 1)

    def take_transfers(self) -> list[tuple[int, int, int]]:
        planned, self.planned = self.planned, []
        return planned

    def acknowledge(self, transfer_ids: list[int]) -> None:
        """``update_spills``: the landed writes in transfer order; then the live requests
        they served publish, in the order vLLM's set of their ids iterates."""
        landed = [t for t in sorted(transfer_ids) if t in self.transfers]
        for transfer_id in landed:
            self.device.release([self.transfers[transfer_id][4]])
        completed: set[str] = set()
        for transfer_id in landed:
            request, request_id, page, host_block, _ = self.transfers.pop(transfer_id)
            request.pending.pop(page, None)
            if self.requests.get(request_id) is request:
                request.valid.add(page)
                request.pinned_clean.add(page)
                if self._can_read_from_host(request):
                    self._unpin_page(request_id, request, page)
                completed.add(request_id)
            elif request.publication is not None:
                request.valid.add(page)
                self._publish_detached(request)
            self.host.release([host_block])
        for request_id in completed:
            request = self.requests[request_id]
            while request.ready in request.valid:
                request.ready += 1
            self._publish_ready(request)

    def finish(self, request_id: str, *, finished: bool) -> None:
        """Frees the request: finished (its publication outlives it while writes are
        pending) or preempted (the publication is dropped)."""
        request = self.requests.pop(request_id)
        publication = request.publication
        if publication is not None and finished and request.pending:
            publication.detached = request.host[: publication.num_pages]
            publication.num_cached = request.host_cached
            for block in publication.detached:
                self.host.touch(block)
            self.detached.append(request)
            self.num_detached += 1
        else:
            request.publication = None
        for page in reversed(range(len(request.resident))):
            block = request.resident[page]
            if block == NULL:
                continue
            if page in request.unpinned:
                self.owners.get(block, set()).discard((request_id, page))
            elif page in request.valid and page not in request.pending:
                self._unpin(block)
            else:
                continue
            request.resident[page] = NULL
        self.host.release(list(reversed(request.host)))
        self.device.release(list(reversed(request.indexer)))
        self.device.release(list(reversed(request.resident)))
        self.device.release(list(reversed(request.hot)))

    def has_pending_reclamation(self) -> bool:
        """vLLM's ``has_pending_reclamation``: a pending write-back whose host block has no
        other reference, or whose request (looked up by id) can read from host."""
        return any(
            self.host.ref[host_block] == 1
            or (request_id in self.requests and self._can_read_from_host(self.requests[request_id]))
            for _, request_id, _, host_block, _ in self.transfers.values()
        )

    def check(self) -> None:
        """Device and host blocks are conserved: free ones once with no reference, held
        ones referenced as often as tables, transfers and leases name them."""
        refs = [0] * self.num_blocks
        host_refs = [0] * self.host_num_blocks
        for request in self.requests.values():
            for block in request.indexer + request.hot:
                refs[block] += 1
            for page, block in enumerate(request.resident):
                if block != NULL and page not in request.unpinned:
                    refs[block] += 1
            for block in request.host:
                host_refs[block] += 1
        for request in self.detached:
            assert request.publication is not None
            assert request.publication.detached is not None
            for block in request.publication.detached:
                host_refs[block] += 1
        for _, _, _, host_block, block in self.transfers.values():
            refs[block] += 1
            host_refs[host_block] += 1
        if refs[1:] != self.device.ref[1:] or host_refs[1:] != self.host.ref[1:]:
            raise AssertionError(f"references {self.device.ref} but held {refs}")
