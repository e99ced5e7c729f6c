"""A pure-Python reference of the simulator for Vidur's vLLM and Sarathi replica schedulers
under round-robin routing, written from seed 000 as plainly as possible. The Rust event loop
must produce the same per-request times on any workload (tests/test_sim_reference.py)."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field


@dataclass
class Req:
    id: int
    arrived_at: float
    prefill: int
    decode: int
    original_prefill: int
    processed: int = 0
    prefill_done: bool = False
    completed: bool = False
    restarts: int = 0
    scheduled_at: float = math.nan
    first_token_at: float = math.nan
    completed_at: float = math.nan
    outputs: int = 0

    def total(self) -> int:
        return self.prefill + self.decode

    def batch_end(self, now: float, n: int) -> None:
        self.processed += n
        if not self.prefill_done and self.processed == self.prefill:
            self.prefill_done = True
            self.processed += 1
        produced = max(0, self.processed - self.original_prefill)
        if self.prefill_done and produced > self.outputs:
            if math.isnan(self.first_token_at):
                self.first_token_at = now
            self.outputs = produced
        if self.processed == self.total():
            self.completed = True
            self.completed_at = now

    def restart(self) -> None:
        total = self.total()
        self.prefill = max(self.processed, self.prefill)
        self.decode = total - self.prefill
        self.processed = 0
        self.prefill_done = False
        self.restarts += 1


@dataclass
class Limits:
    num_blocks: int
    block_size: int
    watermark_blocks: int
    batch_size_cap: int
    max_micro_batch_size: int
    max_tokens_in_batch: int
    chunk_size: int


@dataclass
class Replica:
    policy: str
    limits: Limits
    queue: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)
    allocation: dict[int, int] = field(default_factory=dict)
    allocated: int = 0

    def free_blocks(self) -> int:
        return self.limits.num_blocks - self.allocated

    def can_allocate(self, r: Req) -> bool:
        if r.id not in self.allocation:
            need = -(-r.prefill // self.limits.block_size)
            return self.free_blocks() >= need and self.free_blocks() - need >= (
                self.limits.watermark_blocks
            )
        return self.free_blocks() >= 1

    def allocate(self, r: Req) -> None:
        if r.id not in self.allocation:
            n = -(-r.prefill // self.limits.block_size)
        elif r.processed > self.allocation[r.id] * self.limits.block_size:
            n = 1
        else:
            return
        assert self.free_blocks() >= n
        self.allocation[r.id] = self.allocation.get(r.id, 0) + n
        self.allocated += n

    def free(self, r: Req) -> None:
        self.allocated -= self.allocation.pop(r.id, 0)

    def restart_to_front(self, r: Req) -> None:
        r.restart()
        self.free(r)
        self.queue.insert(0, r)

    def next_batch(self) -> list[tuple[Req, int]]:
        return self.vllm() if self.policy == "vllm" else self.sarathi()

    def vllm(self) -> list[tuple[Req, int]]:
        batch: list[tuple[Req, int]] = []
        while self.queue:
            r = self.queue[0]
            n = r.prefill - r.processed
            if not self.can_allocate(r):
                break
            longest = max([t for _, t in batch] + [n])
            if (
                (len(batch) + 1) * longest > self.limits.max_tokens_in_batch
                or len(self.allocation) >= self.limits.batch_size_cap
                or len(batch) >= self.limits.max_micro_batch_size
            ):
                break
            self.queue.pop(0)
            self.allocate(r)
            batch.append((r, n))
        if batch:
            return batch
        self.running.sort(key=lambda r: r.arrived_at)  # stable, as Vidur's
        while self.running:
            if len(batch) >= self.limits.max_micro_batch_size:
                break
            r = self.running.pop(0)
            if self.schedule_with_eviction(r):
                batch.append((r, 1 if r.prefill_done else r.prefill - r.processed))
        return batch

    def schedule_with_eviction(self, r: Req) -> bool:
        while not self.can_allocate(r):
            if self.running:
                self.restart_to_front(self.running.pop())
            else:
                self.restart_to_front(r)
                return False
        self.allocate(r)
        return True

    def sarathi(self) -> list[tuple[Req, int]]:
        batch: list[tuple[Req, int]] = []
        tokens = 0
        skipped: list[Req] = []
        prefills: list[Req] = []

        def next_tokens(r: Req) -> int:
            if r.prefill_done:
                return 1
            return max(0, min(r.prefill - r.processed, self.limits.chunk_size - tokens))

        # Vidur 0.0.26's Sarathi walks its running list as it stands (sorted after the last
        # batch was formed, then each ended batch appended): the victims popped from its back
        # are the latest batch's last requests, not the latest arrivals.
        while self.running:
            if len(batch) >= self.limits.max_micro_batch_size:
                break
            r = self.running.pop(0)
            if not r.prefill_done:
                prefills.append(r)
                continue
            n = next_tokens(r)
            if n == 0:
                skipped.append(r)
                continue
            if self.schedule_with_eviction(r):
                tokens += n
                batch.append((r, n))
        for r in prefills:
            n = next_tokens(r)
            if n == 0:
                skipped.append(r)
                continue
            tokens += n
            batch.append((r, n))
        self.running = sorted(skipped + self.running, key=lambda r: r.arrived_at)
        while self.queue:
            r = self.queue[0]
            if (
                len(self.allocation) >= self.limits.batch_size_cap
                or len(batch) >= self.limits.max_micro_batch_size
                or not self.can_allocate(r)
            ):
                break
            n = next_tokens(r)
            if n == 0:
                break
            self.queue.pop(0)
            self.allocate(r)
            tokens += n
            batch.append((r, n))
        return batch


def simulate(
    arrivals: list[tuple[float, int, int]],
    *,
    policy: str,
    limits: Limits,
    num_replicas: int,
    num_stages: int,
    step_time: tuple[float, float, float],
) -> list[Req]:
    """``step_time = (constant, per prefill token, per decode token)`` per batch, split evenly
    over the stages. Returns the requests in id order."""
    constant, per_prefill, per_decode = step_time
    replicas = [Replica(policy, limits) for _ in range(num_replicas)]
    running_batches = [0] * num_replicas
    stage_queue: list[list[list[int]]] = [[[] for _ in range(num_stages)] for _ in replicas]
    busy = [[False] * num_stages for _ in replicas]
    batches: dict[int, tuple[list[tuple[Req, int, int]], int, int]] = {}
    events: list[tuple[float, int, int, tuple[object, ...]]] = []
    seq = 0

    def push(time: float, kind: tuple[object, ...]) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (time, 0 if kind[0] == "arrival" else 1, seq, kind))

    requests = [Req(i, t, p, d, p) for i, (t, p, d) in enumerate(arrivals)]
    next_arrival = 0
    if requests:
        push(requests[0].arrived_at, ("arrival",))
    batch_ids = 0
    while events:
        now, _, _, kind = heapq.heappop(events)
        if kind[0] == "arrival":
            r = requests[next_arrival]
            next_arrival += 1
            replica = r.id % num_replicas
            replicas[replica].queue.append(r)
            push(now, ("schedule", replica))
            if next_arrival < len(requests):
                push(requests[next_arrival].arrived_at, ("arrival",))
        elif kind[0] == "schedule":
            rep = int(kind[1])  # type: ignore[call-overload]
            while running_batches[rep] < num_stages:
                batch = replicas[rep].next_batch()
                if not batch:
                    break
                for r, _ in batch:
                    if math.isnan(r.scheduled_at):
                        r.scheduled_at = now
                prefill = sum(n for r, n in batch if not r.prefill_done)
                decode = sum(n for r, n in batch if r.prefill_done)
                batches[batch_ids] = ([(r, n, r.restarts) for r, n in batch], prefill, decode)
                running_batches[rep] += 1
                push(now, ("stage_arrival", rep, 0, batch_ids))
                batch_ids += 1
        elif kind[0] == "stage_arrival":
            _, rep, stage, b = kind
            stage_queue[rep][stage].append(b)  # type: ignore[index]
            push(now, ("stage_schedule", rep, stage))
        elif kind[0] == "stage_schedule":
            _, rep, stage = kind
            if busy[rep][stage] or not stage_queue[rep][stage]:  # type: ignore[index]
                continue
            b = stage_queue[rep][stage].pop(0)  # type: ignore[index]
            busy[rep][stage] = True  # type: ignore[index]
            _, prefill, decode = batches[b]
            duration = (constant + per_prefill * prefill + per_decode * decode) / num_stages
            push(now + duration, ("stage_end", rep, stage, b))
        elif kind[0] == "stage_end":
            _, rep, stage, b = kind
            busy[rep][stage] = False  # type: ignore[index]
            push(now, ("stage_schedule", rep, stage))
            if stage + 1 == num_stages:  # type: ignore[operator]
                push(now, ("batch_end", rep, b))
            else:
                push(now, ("stage_arrival", rep, stage + 1, b))  # type: ignore[operator]
        else:
            _, rep, b = kind
            members, _, _ = batches.pop(b)  # type: ignore[call-overload]
            for r, n, epoch in members:
                if r.restarts == epoch:
                    r.batch_end(now, n)
            running_batches[rep] -= 1  # type: ignore[index]
            replica = replicas[rep]  # type: ignore[index]
            for r, _, _ in members:
                if r.completed:
                    replica.free(r)
                else:
                    replica.running.append(r)
            push(now, ("schedule", rep))
    return requests
