"""From a ``SchedulerOutput`` to the tensors of one model step.

The engine keeps, per request, the tokens it knows, the block table the scheduler handed out
and how many tokens have KV (counting the steps already launched). A scheduled request
computes positions ``num_computed_tokens .. num_computed_tokens + n``; the token at a position
the engine does not know yet (async scheduling: the previous step is still in flight) is a
placeholder, filled on the device from that step's sampled tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenyard.engine.attention import AttentionMetadata
from tokenyard.errors import InternalError

__all__ = ["PreparedBatch", "RequestState", "apply_scheduler_output", "prepare_batch"]

RequestId = int | str


@dataclass
class RequestState:
    """The engine's view of one request."""

    token_ids: list[int]
    num_prompt_tokens: int
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    finished: bool = False
    #: Launched steps whose results have not been processed yet.
    num_in_flight: int = 0


@dataclass
class _Row:
    """One request's part of the step, before it becomes tensors."""

    request_id: RequestId
    start: int  # first position computed this step
    end: int  # one past the last
    state: RequestState


@dataclass
class PreparedBatch:
    """A step's inputs on the model's device, and how to read its outputs."""

    request_ids: list[RequestId]
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    #: Rows whose logits are sampled, and the requests they belong to.
    sample_rows: torch.Tensor
    sampled_request_ids: list[RequestId]
    #: Placeholder input rows and, for each, its index among the previous step's samples.
    placeholder_rows: torch.Tensor
    placeholder_sources: torch.Tensor
    num_padding_rows: int
    num_prefill_tokens: int
    num_decode_tokens: int
    sum_decode_context: int
    sum_prefill_context: int
    #: Σ chunk tokens² over the prefill chunks: with ``sum_prefill_context`` it gives the
    #: causal query-key pairs a predictor prices (``predictor.batch_features``).
    sum_prefill_squared: int = 0


def apply_scheduler_output(out: Any, states: dict[RequestId, RequestState]) -> None:
    """Brings the engine's block tables and computed counts up to date with one step."""
    for req in out.scheduled_new_reqs:
        tokens = req.token_ids.tolist()
        states[req.req_id] = RequestState(
            token_ids=tokens,
            num_prompt_tokens=len(tokens),
            block_ids=req.block_ids.tolist(),
            num_computed_tokens=req.num_computed_tokens,
        )
    for req in out.scheduled_resumed_reqs:
        state = states[req.req_id]
        state.token_ids = req.token_ids.tolist()
        state.block_ids = req.block_ids.tolist()
        state.num_computed_tokens = req.num_computed_tokens
    cached = out.scheduled_cached_reqs
    for req_id, new_blocks, computed in zip(
        cached.req_ids, cached.new_block_ids, cached.num_computed_tokens.tolist(), strict=True
    ):
        state = states[req_id]
        state.block_ids += new_blocks.tolist()
        state.num_computed_tokens = computed
    for req_id in out.preempted_req_ids:
        state = states[req_id]
        state.block_ids = []
        state.num_computed_tokens = 0


def prepare_batch(
    out: Any,
    states: dict[RequestId, RequestState],
    *,
    block_size: int,
    device: torch.device,
    previous: PreparedBatch | None,
    graph_batch_sizes: Sequence[int] = (),
) -> PreparedBatch | None:
    """The step's tensors, decode rows first; ``None`` if nothing was scheduled. Advances each
    scheduled request's ``num_computed_tokens``."""
    rows = []
    for req_id, n in out.num_scheduled_tokens.items():
        state = states[req_id]
        start = state.num_computed_tokens
        rows.append(_Row(req_id, start, start + n, state))
        state.num_computed_tokens = start + n
    if not rows:
        return None
    decodes = [r for r in rows if r.end - r.start == 1]
    prefills = [r for r in rows if r.end - r.start > 1]
    num_padding = 0
    if not prefills and graph_batch_sizes:
        num_padding = _padded_size(len(decodes), graph_batch_sizes) - len(decodes)
    return _build(decodes, prefills, num_padding, block_size, device, previous)


def _padded_size(batch_size: int, graph_batch_sizes: Sequence[int]) -> int:
    """The smallest graph batch size that holds the batch (seed 003); larger ones run as is."""
    return next((size for size in graph_batch_sizes if size >= batch_size), batch_size)


def _build(
    decodes: list[_Row],
    prefills: list[_Row],
    num_padding: int,
    block_size: int,
    device: torch.device,
    previous: PreparedBatch | None,
) -> PreparedBatch:
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    sample_rows: list[int] = []
    sampled_ids: list[RequestId] = []
    placeholder_rows: list[int] = []
    placeholder_sources: list[int] = []
    previous_index = (
        {rid: i for i, rid in enumerate(previous.sampled_request_ids)} if previous else {}
    )
    for row in decodes + prefills:
        known = row.state.token_ids
        input_ids += known[row.start : row.end]
        if row.end > len(known):
            # Async scheduling: the last position is the token the step in flight samples.
            if row.end != len(known) + 1 or row.request_id not in previous_index:
                raise InternalError(
                    f"request {row.request_id!r}: positions {len(known)}..{row.end} are "
                    "neither known nor the output of the step in flight"
                )
            placeholder_rows.append(len(input_ids))
            placeholder_sources.append(previous_index[row.request_id])
            input_ids.append(0)
        positions += range(row.start, row.end)
        slots += _slots(row.state.block_ids, row.start, row.end, block_size)
        if row.end >= len(known):
            sample_rows.append(len(input_ids) - 1)
            sampled_ids.append(row.request_id)
    input_ids += [0] * num_padding
    positions += [0] * num_padding
    slots += [-1] * num_padding

    def ints(values: list[int] | list[list[int]], dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    def tables(group: list[_Row], padding: int = 0) -> torch.Tensor:
        width = max([len(r.state.block_ids) for r in group] + [1])
        padded = [r.state.block_ids + [0] * (width - len(r.state.block_ids)) for r in group]
        return ints(padded + [[0] * width] * padding, torch.int32)

    # For the step's composition, a decode is a one-token row that samples; a one-token
    # prefill chunk runs through the decode kernel but counts as prefill.
    decoding = [r for r in decodes if r.end >= len(r.state.token_ids)]
    chunks = [r for r in decodes if r.end < len(r.state.token_ids)] + prefills
    query_start = [0]
    for r in prefills:
        query_start.append(query_start[-1] + r.end - r.start)
    metadata = AttentionMetadata(
        slot_mapping=ints(slots),
        num_decode_tokens=len(decodes) + num_padding,
        decode_block_tables=tables(decodes, num_padding),
        decode_context_lens=ints([r.end for r in decodes] + [0] * num_padding, torch.int32),
        prefill_block_tables=tables(prefills),
        prefill_query_start_loc=ints(query_start, torch.int32),
        prefill_seq_lens=ints([r.end for r in prefills], torch.int32),
    )
    return PreparedBatch(
        request_ids=[r.request_id for r in decodes + prefills],
        input_ids=ints(input_ids),
        positions=ints(positions),
        metadata=metadata,
        sample_rows=ints(sample_rows),
        sampled_request_ids=sampled_ids,
        placeholder_rows=ints(placeholder_rows),
        placeholder_sources=ints(placeholder_sources),
        num_padding_rows=num_padding,
        num_prefill_tokens=sum(r.end - r.start for r in chunks),
        num_decode_tokens=len(decoding),
        sum_decode_context=sum(r.end for r in decoding),
        sum_prefill_context=sum(_attended_keys(r) for r in chunks),
        sum_prefill_squared=sum((r.end - r.start) ** 2 for r in chunks),
    )


def _slots(block_ids: list[int], start: int, end: int, block_size: int) -> list[int]:
    """KV slots of positions ``start..end``, one contiguous run per block."""
    slots: list[int] = []
    for index in range(start // block_size, (end - 1) // block_size + 1):
        first, last = max(start, index * block_size), min(end, (index + 1) * block_size)
        base = block_ids[index] * block_size - index * block_size
        slots += range(base + first, base + last)
    return slots


def _attended_keys(row: _Row) -> int:
    """Chunk tokens times context (tokens before the chunk + the chunk): the simulator's
    prefill-attention term, so engine profiles and the linear model share features."""
    return (row.end - row.start) * row.end
