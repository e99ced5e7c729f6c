"""The protocols of Python policy plugins for the simulator (``docs/plugins.md``), and two
small complete examples.

A plugin is named in the config as ``"package.module:Class"``:

- ``cluster.global_scheduler.policy``: a ``GlobalPolicyPlugin``, built once as
  ``Class(num_replicas=..., seed=...)``; ``route`` picks the replica of each new request.
- ``replica.scheduler.policy``: a ``ReplicaPolicyPlugin``, built per replica as
  ``Class(replica_id=..., num_blocks=..., block_size=..., **options)``; it decides each
  batch and manages its own memory. Requests leave the replica once they complete. With
  pipeline stages, ``next_batch`` is called again while earlier batches are still in
  flight: it must not offer a request whose batch has not ended.

Options come from the config: ``cluster.global_scheduler.options`` and
``replica.scheduler.plugin.options`` (tables of keyword arguments).

The Rust event loop calls them (the slow path: one Python call per routing decision or
batch), so a policy can be tried without touching Rust.
"""

from __future__ import annotations

from typing import Any, Protocol

from tokenyard._core import SimRequestView
from tokenyard.kv import CountingAllocator

__all__ = [
    "GlobalPolicyPlugin",
    "LeastQueuedPromptTokens",
    "ReplicaPolicyPlugin",
    "SimRequestView",
    "TokenBudgetFcfs",
]


class GlobalPolicyPlugin(Protocol):
    def route(self, request: dict[str, Any], replicas: list[dict[str, Any]]) -> int:
        """The index of the replica for ``request`` (keys: ``request_id``, ``arrived_at``,
        ``num_prefill_tokens``, ``num_decode_tokens``, ``hash_ids``). Each replica dict has
        ``num_pending``, ``num_outstanding``, ``queued_prefill_tokens`` and ``kv_usage``."""
        ...


class ReplicaPolicyPlugin(Protocol):
    def add_request(self, request: SimRequestView) -> None:
        """A request routed to this replica."""
        ...

    def next_batch(self) -> list[tuple[int, int]] | None:
        """The next batch as ``(request_id, num_tokens)`` pairs, or ``None``. A request whose
        prefill is complete decodes 1 token; otherwise it takes 1 to its remaining prompt
        tokens. A request may be in one batch at a time: with pipeline stages this is called
        while earlier batches are still in flight, and a request in one of them is
        refused (``PolicyError``)."""
        ...

    def on_batch_end(self, requests: list[SimRequestView]) -> None:
        """The batch's requests after it ran (``completed`` ones leave the replica)."""
        ...


class LeastQueuedPromptTokens:
    """Routes to the replica with the fewest prompt tokens waiting (ties: lowest index)."""

    def __init__(self, *, num_replicas: int, seed: int):
        self.num_replicas = num_replicas

    def route(self, request: dict[str, Any], replicas: list[dict[str, Any]]) -> int:
        loads = [r["queued_prefill_tokens"] for r in replicas]
        return loads.index(min(loads))


class TokenBudgetFcfs:
    """Continuous batching in arrival order under a per-batch token budget: running requests
    decode first, then waiting prompts are admitted whole while the budget and the KV blocks
    (a counting allocator sized for each request's full length) allow; a prompt longer than
    the budget runs alone."""

    def __init__(self, *, replica_id: int, num_blocks: int, block_size: int, budget: int = 2048):
        self.memory = CountingAllocator(num_blocks=num_blocks)
        self.block_size = block_size
        self.budget = budget
        self.waiting: list[SimRequestView] = []
        self.running: set[int] = set()
        # With pipeline stages, next_batch is asked again while earlier batches still run.
        self.in_flight: set[int] = set()

    def add_request(self, request: SimRequestView) -> None:
        self.waiting.append(request)

    def next_batch(self) -> list[tuple[int, int]] | None:
        batch = [(rid, 1) for rid in self.running - self.in_flight]
        budget = self.budget - len(batch)
        while self.waiting:
            request = self.waiting[0]
            blocks = -(-(request.num_prefill_tokens + request.num_decode_tokens) // self.block_size)
            too_long = request.num_prefill_tokens > budget and batch
            if too_long or not self.memory.can_allocate(blocks):
                break
            self.waiting.pop(0)
            self.memory.allocate(request.request_id, blocks)
            batch.append((request.request_id, request.num_prefill_tokens))
            budget -= request.num_prefill_tokens
        self.running.update(rid for rid, _ in batch)
        self.in_flight.update(rid for rid, _ in batch)
        return batch or None

    def on_batch_end(self, requests: list[SimRequestView]) -> None:
        for request in requests:
            self.in_flight.discard(request.request_id)
            if request.completed:
                self.running.discard(request.request_id)
                self.memory.free(request.request_id)

    def kv_usage(self) -> float:
        return self.memory.usage
