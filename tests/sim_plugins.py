"""Simulator plugins for tests, loaded as ``tests.sim_plugins:NAME``."""

from __future__ import annotations

from typing import Any


class NeverSchedules:
    """A replica policy that accepts requests and never runs them."""

    def __init__(self, *, replica_id: int, num_blocks: int, block_size: int):
        self.requests: list[Any] = []

    def add_request(self, request: Any) -> None:
        self.requests.append(request)

    def next_batch(self) -> None:
        return None

    def on_batch_end(self, requests: list[Any]) -> None:  # pragma: no cover - never called
        pass
