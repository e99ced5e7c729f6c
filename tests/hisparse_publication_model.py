"""A pure-Python reference model of vLLM 0.33's HiSparse host pool with prefix caching on, as
its scheduler side runs it under the HiSparse connector (``HiSparseCoordinator`` in
``vllm/v1/hisparse/coordinator.py`` over the host ``BlockPool`` of ``HiSparseSourceManager``;
the rule is written down in docs/integrations.md, "vLLM 0.33's scheduler-side HiSparse
rule"). Prompts are admitted whole or in prefill chunks, decode, and are freed when done
(finished, or
aborted mid-prefill) or preempted and admitted again; what is modelled:

- admission: the hit is the longest run of published pages (never the prompt's last token),
  its host blocks shared (a reference each; a block without one leaves the free queue and
  counts against the free blocks); the rest take new blocks from the free queue's front,
  evicting the page a block was published for; refused when the pool cannot back them;
- write-backs: every sealed page past the ready prefix gets a transfer, which holds a
  reference on its host block;
- acknowledgement: the page becomes valid, the ready prefix advances over valid pages and
  that much is published; the transfer's reference goes;
- free: a finished request with writes pending keeps its pages referenced until the last
  lands, then publishes them (a preempted one publishes nothing more, and is admitted again
  from what was published); its own references go, tail first (blocks without a published
  page to the queue's front, published ones to its tail).

Not modelled: the device side (residency, copies),
copy-on-write for partial hits (block-aligned hashes only) and imports. Used by
tests/test_sched_hisparse_groups.py (its invariants) and
tests/test_hisparse_host_publication.py (against vLLM's own)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

Page = tuple[int, ...]


@dataclass
class _Request:
    tokens: list[int]
    table: list[int] = field(default_factory=list)
    valid: set[int] = field(default_factory=set)
    ready: int = 0
    pending: dict[int, int] = field(default_factory=dict)
    # Published pages (vLLM's num_cached_block) and the tokens the publication covers
    # (None once all is published).
    num_cached: int = 0
    publication: int | None = None
    computed: int = 0
    # Pages a finished request's publication keeps referenced until it lands (0: none).
    lease: int = 0


class HostPublication:
    """The host pool of ``num_blocks`` blocks (block 0 the null block) of ``block_size``
    tokens, with ``max_spill_pages`` write-backs planned at most per step."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free: deque[int] = deque(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.page_of: list[Page | None] = [None] * num_blocks
        self.cached: dict[Page, list[int]] = {}
        self.requests: dict[str, _Request] = {}
        # Requests freed with writes pending, until their publication lands.
        self.detached: dict[str, _Request] = {}
        # transfer id -> (request, page, host block)
        self.transfers: dict[int, tuple[_Request, int, int]] = {}
        self.next_transfer = 0
        # Every (page, block) published, to check that a hit's pages were acknowledged.
        self.acknowledged: set[tuple[Page, int]] = set()
        self._ids: dict[int, str] = {}

    def _page(self, tokens: list[int], index: int) -> Page:
        return tuple(tokens[: (index + 1) * self.block_size])

    def hit_pages(self, tokens: list[int]) -> list[int]:
        """The host blocks of the longest published prefix of ``tokens`` (all but its last
        token)."""
        blocks = []
        for index in range((len(tokens) - 1) // self.block_size):
            cached = self.cached.get(self._page(tokens, index))
            if not cached:
                break
            blocks.append(cached[0])
        return blocks

    def _take(self, n: int) -> list[int]:
        taken = [self.free.popleft() for _ in range(n)]
        for block in taken:
            page = self.page_of[block]
            if page is not None:
                self.cached[page].remove(block)
                if not self.cached[page]:
                    del self.cached[page]
                self.page_of[block] = None
            self.ref[block] = 1
        return taken

    def _touch(self, blocks: list[int]) -> None:
        for block in blocks:
            if self.ref[block] == 0:
                self.free.remove(block)
            self.ref[block] += 1

    def _release(self, blocks: list[int]) -> None:
        """vLLM's ``BlockPool.free_blocks``: blocks reaching no reference go to the front
        (unpublished, in the order given) or the tail (published)."""
        front, tail = [], []
        for block in blocks:
            if self.ref[block] <= 0:
                raise AssertionError(f"host block {block} freed twice")
            self.ref[block] -= 1
            if self.ref[block] == 0:
                (tail if self.page_of[block] is not None else front).append(block)
        self.free.extendleft(reversed(front))
        self.free.extend(tail)

    def admit(
        self, request_id: str, tokens: list[int], max_new_tokens: int | None = None
    ) -> int | None:
        """Admits ``tokens`` (at most ``max_new_tokens`` of them past the hit, a first
        prefill chunk); returns the hit in tokens, or None when the pool cannot back the
        request (nothing changes)."""
        hit = self.hit_pages(tokens)
        num_hit = len(hit) * self.block_size
        new = len(tokens) - num_hit
        if max_new_tokens is not None:
            new = min(new, max_new_tokens)
        need = -(-(num_hit + new) // self.block_size) - len(hit)
        evictable = sum(self.ref[b] == 0 for b in hit)
        if need + evictable > len(self.free):
            return None
        for index, block in enumerate(hit):
            if (self._page(tokens, index), block) not in self.acknowledged:
                raise AssertionError(f"page {index} hit before its write-back landed")
        request = _Request(tokens=list(tokens))
        self._touch(hit)
        request.table = hit + self._take(need)
        request.valid = set(range(len(hit)))
        request.ready = request.num_cached = len(hit)
        self.requests[request_id] = request
        self._ids[id(request)] = request_id
        self._computed(request, num_hit + new)
        return num_hit

    def step(self, request_id: str, num_new_tokens: int) -> bool:
        """The next prefill chunk of a running request, at most ``num_new_tokens``; False
        when the pool cannot back its pages (nothing changes)."""
        request = self.requests[request_id]
        total = min(request.computed + num_new_tokens, len(request.tokens))
        need = -(-total // self.block_size) - len(request.table)
        if need > len(self.free):
            return False
        request.table += self._take(max(need, 0))
        self._computed(request, total)
        return True

    def decode(self, request_id: str, token: int) -> bool:
        """A decode step of a request whose tokens are all computed: ``token`` (sampled by
        its last step) joins its tokens and is computed; False when the pool cannot back its
        page (the token is still appended, as vLLM's request keeps it)."""
        request = self.requests[request_id]
        request.tokens.append(token)
        return self.step(request_id, 1)

    def _computed(self, request: _Request, num_computed: int) -> None:
        """After an allocation: the publication covers ``num_computed`` tokens (vLLM's
        ``publish_when_ready``), and each sealed page past the ready prefix gets a
        write-back holding a reference on its block (``plan_prefix_materialization``)."""
        request.computed = num_computed
        request.publication = num_computed
        self._publish(request)
        for page in range(request.ready, num_computed // self.block_size):
            if page in request.valid or page in request.pending:
                continue
            block = request.table[page]
            self._touch([block])
            request.pending[page] = self.next_transfer
            self.transfers[self.next_transfer] = (request, page, block)
            self.next_transfer += 1

    def _publish(self, request: _Request) -> None:
        if request.publication is None:
            return
        num_pages = request.publication // self.block_size
        upto = min(request.ready, num_pages)
        for index in range(request.num_cached, upto):
            block = request.table[index]
            page = self._page(request.tokens, index)
            self.page_of[block] = page
            self.cached.setdefault(page, []).append(block)
            self.acknowledged.add((page, block))
        request.num_cached = max(request.num_cached, upto)
        if request.ready >= num_pages:
            request.publication = None

    def acknowledge(self, transfer_ids: list[int]) -> None:
        """The workers completed ``transfer_ids`` (vLLM's ``update_spills``): in transfer
        order each page turns valid and its reference goes (a finished request's
        publication lands with its last write); then the live requests publish, in the
        order of vLLM's set of their ids (``_complete_host_writes``; the order picks which
        of two blocks published for one page a hit takes)."""
        completed: set[str] = set()
        for transfer_id in sorted(transfer_ids):
            entry = self.transfers.pop(transfer_id, None)
            if entry is None:
                continue
            request, page, block = entry
            request_id = self._ids[id(request)]
            request.pending.pop(page, None)
            request.valid.add(page)
            if self.requests.get(request_id) is request:
                completed.add(request_id)
            elif request.lease and not request.pending:
                while request.ready in request.valid:
                    request.ready += 1
                self._publish(request)
                request.publication = None
                self._release(list(reversed(request.table[: request.lease])))
                del self.detached[request_id]
            self._release([block])
        for request_id in completed:
            request = self.requests[request_id]
            while request.ready in request.valid:
                request.ready += 1
            self._publish(request)

    def finish(self, request_id: str, *, finished: bool = True) -> None:
        """The request finished (or, ``finished=False``, was preempted): a finished one's
        publication waits for writes pending (holding its pages), a preempted one's is
        dropped (its writes land for no one); its own references go, tail first."""
        request = self.requests.pop(request_id)
        if finished and request.publication is not None and request.pending:
            request.lease = request.publication // self.block_size
            self.detached[request_id] = request
            self._touch(request.table[: request.lease])
        else:
            request.publication = None
        self._release(list(reversed(request.table)))

    def check(self) -> None:
        """Blocks are conserved: each usable block is free (no reference, once) or held by
        as many references as tables, transfers and leases name it."""
        refs = [0] * self.num_blocks
        for request in self.requests.values():
            for block in request.table:
                refs[block] += 1
        for _, _, block in self.transfers.values():
            refs[block] += 1
        for request in self.detached.values():
            for block in request.table[: request.lease]:
                refs[block] += 1
        if refs != self.ref:
            raise AssertionError(f"references {self.ref} but held {refs}")
        free = list(self.free)
        if len(set(free)) != len(free) or any(self.ref[b] for b in free):
            raise AssertionError(f"free queue {free} repeats or holds a referenced block")
        if sorted(free + [b for b in range(1, self.num_blocks) if self.ref[b]]) != list(
            range(1, self.num_blocks)
        ):
            raise AssertionError("a block is neither free nor referenced")
