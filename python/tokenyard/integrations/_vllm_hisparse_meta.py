"""vLLM 0.33's ``HiSparseConnectorMetadata`` built from the core's HiSparse tables, for the
HiSparse connector with prefix caching off (docs/integrations.md, "vLLM 0.33's
scheduler-side HiSparse rule"). vLLM builds it in
``HiSparseConnectorScheduler.build_connector_meta``
(``distributed/kv_transfer/kv_connector/v1/hisparse/connector.py``) from its
``HiSparseCoordinator`` (``v1/hisparse/coordinator.py``) after ``advance_scheduled``; here the
same fields come from each request's ``(host, indexer, resident, hot)`` tables as the core
keeps them (``kv::DeviceResidency``: the resident row with residency changes applied, 0 for a
page read from host) and the step's planned write-backs:

- ``command``: the write-backs, each ``after_forward`` (``build_offload_command``);
- ``host_block_copies``: none (host copy-on-write comes only with prefix hits);
- ``source_block_ids``: the source group's new blocks in the step's outputs, new requests
  first;
- ``row_mirrors``: per scheduled request, its scheduled rows mapped to resident and host
  rows, a page without a GPU block or a host block skipped (``build_row_mirrors``);
- ``all_context_pages_resident``: every scheduled request's pages allocated and none read
  from host (``all_context_pages_resident``; vLLM's ``_resident_requests`` only caches the
  answer, and with caching off a page read from host never turns resident again);
- ``residency_updates``: per scheduled request, the pages the worker lacks: those lost since
  it was last told (vLLM's ``stale_pages``, recorded by ``_lose_page`` below the synced
  count) and those appended since (``take_residency_updates``), kept per request until it
  is freed (``HiSparseCoordinator.free`` drops its state).

Not a connector: ``_vllm_hisparse_step`` builds the metadata with it each step, over the
tables the step scheduler keeps (``sched::hisparse_step``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Tables = tuple[list[int], list[int], list[int], list[int]]


class ResidencySync:
    """What each request's worker was last told of its resident row (vLLM's
    ``_HiSparseRequestState.synced_pages`` and the row behind its ``stale_pages``)."""

    def __init__(self) -> None:
        self._sent: dict[str, list[int]] = {}

    def forget(self, request_id: str) -> None:
        """The request was freed (finished or preempted): its state goes, as vLLM's."""
        self._sent.pop(request_id, None)

    def take(self, request_id: str, row: list[int]) -> tuple[list[int], list[int]] | None:
        """``(pages, block_ids)`` the worker lacks for ``row``, or None when it lacks none."""
        sent = self._sent.get(request_id, [])
        synced = len(sent)
        stale = [p for p in range(min(synced, len(row))) if row[p] != sent[p]]
        if not stale and synced >= len(row):
            return None
        self._sent[request_id] = list(row)
        pages = [*stale, *range(synced, len(row))]
        return pages, [row[p] for p in stale] + row[synced:]


def row_mirrors(tables: Tables | None, start: int, count: int, block_size: int) -> tuple[Any, ...]:
    """vLLM's ``build_row_mirrors`` for one request and one resident group."""
    from vllm.v1.hisparse.types import SparseKVRowMirror

    if tables is None:
        return ()
    host, _, resident, _ = tables
    mirrors = []
    position, end = start, start + count
    while position < end:
        page, offset = divmod(position, block_size)
        rows = min(block_size - offset, end - position)
        position += rows
        if page >= len(resident) or resident[page] == 0 or page >= len(host) or host[page] == 0:
            continue
        mirrors.append(
            SparseKVRowMirror(
                source_starts=(resident[page] * block_size + offset,),
                destination_start=host[page] * block_size + offset,
                num_rows=rows,
            )
        )
    return tuple(mirrors)


def build_hisparse_metadata(
    out: Any,
    tables: Callable[[str], Tables | None],
    transfers: list[tuple[int, int, int]],
    *,
    source_group: int,
    block_size: int,
    sync: ResidencySync,
) -> Any:
    """``HiSparseConnectorMetadata`` for the step ``out`` (a vLLM ``SchedulerOutput``), with
    ``tables`` the core's tables by request id and ``transfers`` the step's write-backs
    ``(transfer_id, host_block_id, resident_block_id)``. Sets ``has_sync_kv_loads`` on
    ``out`` as vLLM's ``build_connector_meta`` does."""
    from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (
        HiSparseConnectorMetadata,
    )
    from vllm.v1.hisparse.types import (
        SparseKVOffloadCommand,
        SparseKVPageTransfer,
        SparseKVResidencyUpdate,
    )

    out.has_sync_kv_loads = True
    starts = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    command = SparseKVOffloadCommand(
        page_transfers=[
            SparseKVPageTransfer(t, host, (resident,), after_forward=True)
            for t, host, resident in transfers
        ]
    )
    source = [b for r in out.scheduled_new_reqs for b in r.block_ids[source_group]]
    for new_block_ids in cached.new_block_ids:
        if new_block_ids is not None:
            source.extend(new_block_ids[source_group])
    scheduled = {r: tables(r) for r in out.num_scheduled_tokens}
    mirrors = {
        r: row_mirrors(scheduled[r], starts[r], count, block_size)
        for r, count in out.num_scheduled_tokens.items()
    }
    resident = True
    for r, count in out.num_scheduled_tokens.items():
        table = scheduled[r]
        row = table[2] if table is not None else []
        pages = -(-(starts[r] + count) // block_size)
        if len(row) < pages or 0 in row:
            resident = False
            break
    updates = {}
    for r in out.num_scheduled_tokens:
        table = scheduled[r]
        update = sync.take(r, table[2] if table is not None else [])
        if update is not None:
            updates[r] = SparseKVResidencyUpdate(pages=update[0], block_ids=(update[1],))
    return HiSparseConnectorMetadata(command, (), tuple(source), mirrors, resident, updates)
