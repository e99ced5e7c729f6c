"""A pure-Python reference model of the device half of vLLM 0.33's HiSparse connector with
prefix caching off: the device ``BlockPool`` shared by the indexer, resident and hot groups
(one pair), the host pool beside it, and ``HiSparseCoordinator``'s write-backs and GPU
residency as the connector's scheduler side drives them (``advance_scheduled`` after each
allocation, ``update_spills`` on the worker's acknowledgements, ``free``). The rule is
written down in docs/integrations.md ("vLLM 0.33's scheduler-side HiSparse rule", items 2,
3, 7 and 8); with caching off nothing is published, so there are no hits, copies or
adoptions. What is modelled:

- allocation (``KVCacheManager.allocate_slots``): refused when the host pool cannot back the
  pages (the source group's sentinel) or the device pool has fewer free blocks than the
  indexer, resident and (once required) hot groups need; then each group takes its blocks
  in group order (source, indexer, resident, hot) from the free queue's front, and a block
  handed out that was unpinned fires its watcher (``_on_block_reused``): the pages reading
  it lose it (the resident page turns null) and their requests require a hot region;
- write-backs (``plan_prefix_materialization``): each sealed page past the ready prefix,
  neither valid nor pending and resident, gets a transfer holding a reference on its host
  block and its resident block, at most ``max_model_len // block_size`` a step;
- residency (``update_residency``): a request without its hot region requires one once the
  device pool's free blocks fall below ``max(hot blocks, num_blocks // 10)`` or it holds
  ``max_admission_blocks_per_request`` resident blocks; one with it unpins every clean
  pinned page but the last two, tail first (``BlockPool.unpin_blocks``: the reference goes,
  the block joins the free queue's tail, a watcher stays until it is handed out);
- acknowledgement (``update_spills``): in transfer order the resident references go
  (``free_blocks``: to the front when none is left), then each page turns valid and clean,
  unpinned at once if its request can read from host, and the host reference goes;
- free (``HiSparseCoordinator.free`` from the source manager, then each group's own free,
  tail first, to the queue's front): clean resident pages are unpinned and nulled, pending
  ones stay with their transfer, unpinned ones leave their owners.

Used by tests/test_hisparse_residency_model.py (against vLLM's own)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

ACTIVE_TAIL_PAGES = 2
NULL = 0


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
    valid: set[int] = field(default_factory=set)
    ready: int = 0
    pending: dict[int, int] = field(default_factory=dict)
    pinned_clean: set[int] = field(default_factory=set)
    unpinned: set[int] = field(default_factory=set)


class DeviceResidency:
    """``num_blocks`` device blocks and ``host_num_blocks`` host blocks (block 0 of each the
    null block) of ``block_size`` tokens; ``hot_blocks`` blocks per hot region."""

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
        self.max_spill_pages = max_model_len // block_size
        self.watermark = max(hot_blocks, num_blocks // 10)
        self.free: deque[int] = deque(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.host_free: deque[int] = deque(range(1, host_num_blocks))
        self.host_ref = [0] * host_num_blocks
        # Unpinned blocks whose watcher has not fired, and the (request, page) reading each.
        self.watched: set[int] = set()
        self.owners: dict[int, set[tuple[str, int]]] = {}
        self.requests: dict[str, _Request] = {}
        # transfer id -> (request state, request id, page, host block, resident block)
        self.transfers: dict[int, tuple[_Request, str, int, int, int]] = {}
        self.next_transfer = 0
        self.planned: list[tuple[int, int, int]] = []

    # -- the pools ---------------------------------------------------------------------

    def _take(self, n: int) -> list[int]:
        taken = [self.free.popleft() for _ in range(n)]
        for block in taken:
            if block in self.watched:
                self.watched.discard(block)
                for request_id, page in sorted(self.owners.pop(block, ())):
                    self._lose_page(request_id, page)
            self.ref[block] = 1
        return taken

    def _release(self, blocks: list[int]) -> None:
        front = []
        for block in blocks:
            if block == NULL:
                continue
            if self.ref[block] <= 0:
                raise AssertionError(f"device block {block} freed twice")
            self.ref[block] -= 1
            if self.ref[block] == 0:
                front.append(block)
        self.free.extendleft(reversed(front))

    def _unpin(self, block: int) -> None:
        self.ref[block] -= 1
        self.watched.add(block)
        if self.ref[block] == 0:
            self.free.append(block)

    def _host_take(self, n: int) -> list[int]:
        taken = [self.host_free.popleft() for _ in range(n)]
        for block in taken:
            self.host_ref[block] = 1
        return taken

    def _host_release(self, blocks: list[int]) -> None:
        front = []
        for block in blocks:
            if self.host_ref[block] <= 0:
                raise AssertionError(f"host block {block} freed twice")
            self.host_ref[block] -= 1
            if self.host_ref[block] == 0:
                front.append(block)
        self.host_free.extendleft(reversed(front))

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

    def _update_residency(self, request_id: str, request: _Request) -> None:
        if not self._can_read_from_host(request):
            if (
                len(self.free) >= self.watermark
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
            self.host_ref[host_block] += 1
            self.ref[block] += 1
            transfer_id = self.next_transfer
            self.next_transfer += 1
            self.transfers[transfer_id] = (request, request_id, page, host_block, block)
            request.pending[page] = transfer_id
            self.planned.append((transfer_id, host_block, block))
            budget -= 1
        self._update_residency(request_id, request)

    # -- operations --------------------------------------------------------------------

    def _allocate(self, request_id: str, request: _Request, num_tokens: int) -> bool:
        pages = -(-num_tokens // self.block_size)
        if pages - len(request.host) > len(self.host_free):
            return False
        need = 2 * pages - len(request.indexer) - len(request.resident)
        if request.hot_required:
            need += max(self.hot_blocks - len(request.hot), 0)
        if need > len(self.free):
            return False
        request.host += self._host_take(max(pages - len(request.host), 0))
        request.indexer += self._take(max(pages - len(request.indexer), 0))
        request.resident += self._take(max(pages - len(request.resident), 0))
        if request.hot_required and len(request.hot) < self.hot_blocks:
            request.hot += self._take(self.hot_blocks - len(request.hot))
        return True

    def admit(self, request_id: str, tokens: list[int], max_new_tokens: int | None) -> bool:
        new = len(tokens) if max_new_tokens is None else min(len(tokens), max_new_tokens)
        request = _Request(tokens=list(tokens))
        if not self._allocate(request_id, request, new):
            return False
        self.requests[request_id] = request
        request.computed = new
        self._advance(request_id, request)
        return True

    def step(self, request_id: str, num_new_tokens: int) -> bool:
        request = self.requests[request_id]
        total = min(request.computed + num_new_tokens, len(request.tokens))
        if not self._allocate(request_id, request, total):
            return False
        request.computed = total
        self._advance(request_id, request)
        return True

    def decode(self, request_id: str, token: int) -> bool:
        self.requests[request_id].tokens.append(token)
        return self.step(request_id, 1)

    def take_transfers(self) -> list[tuple[int, int, int]]:
        planned, self.planned = self.planned, []
        return planned

    def acknowledge(self, transfer_ids: list[int]) -> None:
        landed = [t for t in sorted(transfer_ids) if t in self.transfers]
        for transfer_id in landed:
            self._release([self.transfers[transfer_id][4]])
        for transfer_id in landed:
            request, request_id, page, host_block, _ = self.transfers.pop(transfer_id)
            request.pending.pop(page, None)
            if self.requests.get(request_id) is request:
                request.valid.add(page)
                request.pinned_clean.add(page)
                if self._can_read_from_host(request):
                    self._unpin_page(request_id, request, page)
                while request.ready in request.valid:
                    request.ready += 1
            self._host_release([host_block])

    def finish(self, request_id: str) -> None:
        """Frees the request (finished or preempted: the same with caching off)."""
        request = self.requests.pop(request_id)
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
        self._host_release(list(reversed(request.host)))
        self._release(list(reversed(request.indexer)))
        self._release(list(reversed(request.resident)))
        self._release(list(reversed(request.hot)))

    def has_pending_reclamation(self) -> bool:
        """vLLM's ``has_pending_reclamation``: a pending write-back whose host block has no
        other reference, or whose request (looked up by id) can read from host."""
        return any(
            self.host_ref[host_block] == 1
            or (request_id in self.requests and self._can_read_from_host(self.requests[request_id]))
            for _, request_id, _, host_block, _ in self.transfers.values()
        )

    def check(self) -> None:
        """Device and host blocks are conserved: free ones once with no reference, held
        ones referenced as often as tables and transfers name them."""
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
        for _, _, _, host_block, block in self.transfers.values():
            refs[block] += 1
            host_refs[host_block] += 1
        if refs[1:] != self.ref[1:] or host_refs[1:] != self.host_ref[1:]:
            raise AssertionError(f"references {self.ref} but held {refs}")
        if any(self.ref[b] for b in self.free) or len(set(self.free)) != len(self.free):
            raise AssertionError("a free block is referenced or repeated")
