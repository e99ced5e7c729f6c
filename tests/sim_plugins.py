"""Simulator plugins for tests, loaded as ``tests.sim_plugins:NAME``."""

from __future__ import annotations

from typing import Any, ClassVar


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


class AlwaysLast:
    """Routes everything to the last replica."""

    def __init__(self, *, num_replicas: int, seed: int):
        self.num_replicas = num_replicas

    def route(self, request: dict[str, Any], replicas: list[dict[str, Any]]) -> int:
        return len(replicas) - 1


class Broken:
    def __init__(self, *, num_replicas: int, seed: int):
        pass

    def route(self, request: dict[str, Any], replicas: list[dict[str, Any]]) -> int:
        return 1 // 0


class WholeRequestAtOnce:
    """Asks for the prompt and the output in one go: more tokens than a step may take."""

    def __init__(self, *, replica_id: int, num_blocks: int, block_size: int):
        self.waiting: list[Any] = []

    def add_request(self, request: Any) -> None:
        self.waiting.append(request)

    def next_batch(self) -> list[tuple[int, int]] | None:
        if not self.waiting:
            return None
        r = self.waiting.pop(0)
        return [(r.request_id, r.num_prefill_tokens + r.num_decode_tokens)]

    def on_batch_end(self, requests: list[Any]) -> None:  # pragma: no cover - never reached
        pass


class Answers:
    """A router whose ``route`` returns ``answer`` (options: ``answer``), whatever it is."""

    def __init__(self, *, num_replicas: int, seed: int, answer: Any):
        self.answer = answer

    def route(self, request: dict[str, Any], replicas: list[dict[str, Any]]) -> Any:
        return self.answer


class BatchAnswers:
    """A replica policy whose ``next_batch`` returns ``answer`` (options: ``answer``) once
    it holds a request."""

    def __init__(self, *, replica_id: int, num_blocks: int, block_size: int, answer: Any):
        self.answer = answer
        self.held = False

    def add_request(self, request: Any) -> None:
        self.held = True

    def next_batch(self) -> Any:
        return self.answer if self.held else None

    def on_batch_end(self, requests: list[Any]) -> None:  # pragma: no cover - never called
        pass


class KvUsageAnswers:
    """Runs each request alone to completion; ``kv_usage`` returns ``answer``."""

    def __init__(self, *, replica_id: int, num_blocks: int, block_size: int, answer: Any):
        self.answer = answer
        self.waiting: list[Any] = []

    def add_request(self, request: Any) -> None:
        self.waiting.append(request)

    def next_batch(self) -> Any:
        return None

    def on_batch_end(self, requests: list[Any]) -> None:  # pragma: no cover - never called
        pass

    def kv_usage(self) -> Any:
        return self.answer


class RecordsIds:
    """A step-scheduler plugin (``tokenyard.sched``'s protocol) that keeps FCFS order and
    records the request ids it is shown."""

    seen: ClassVar[set[Any]] = set()

    def order_waiting(self, waiting: list[Any]) -> list[Any]:
        RecordsIds.seen.update(v.request_id for v in waiting)
        return [v.request_id for v in waiting]

    def preemption_order(self, running: list[Any]) -> list[Any]:
        return [v.request_id for v in reversed(running)]
