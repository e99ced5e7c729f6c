"""A pure-Python reference of the step scheduler, written from docs/embedding.md (vLLM V1
rules) on top of the reference block pool. Slow and obvious; the differential state machine
in test_sched_stateful.py checks the Rust scheduler decides identically step by step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kv_reference import RefBlockPool, RefRadixPool

from tokenyard.errors import InputError, UnknownRequestError
from tokenyard.sched import PLACEHOLDER_DRAFT


@dataclass
class RefRequest:
    request_id: Any
    prompt: list[int]
    max_tokens: int
    priority: int
    arrival_time: float
    seq: int
    eos: int | None = None
    lora_id: int | None = None
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: str = "waiting"
    drafts: list[int] = field(default_factory=list)
    last_scheduled: int = 0
    last_num_drafts: int = 0  # drafts its latest step verified
    prefill_chunk: bool = True  # its latest step did not sample (vLLM's is_prefill_chunk)

    def key(self, by_id: bool = True) -> tuple[int, float, tuple[int, int | str], int]:
        """Waiting order under priority: priority, arrival time, then (vLLM 0.33's
        ``Request.__lt__``, ``by_id``) the request id, tokenyard ordering integer ids before
        string ones, then arrival order."""
        rid = self.request_id
        id_key = ((1, rid) if isinstance(rid, str) else (0, rid)) if by_id else (0, 0)
        return (self.priority, self.arrival_time, id_key, self.seq)

    @property
    def pending(self) -> int:
        return max(len(self.tokens) + len(self.drafts) - self.num_computed, 0)

    @property
    def prefilling(self) -> bool:
        return self.num_computed < len(self.prompt)


class RefScheduler:
    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.pool: Any
        # vLLM's null block is one of num_blocks that never holds KV.
        num_kv_blocks = cfg.num_blocks - int(cfg.reserve_null_block)
        if cfg.enable_prefix_caching and cfg.prefix_cache == "radix":
            self.pool = RefRadixPool(num_kv_blocks, cfg.block_size)
        else:
            self.pool = RefBlockPool(num_kv_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.requests: dict[Any, RefRequest] = {}
        self.waiting: list[RefRequest] = []  # kept in scheduling order
        self.running: list[RefRequest] = []
        self.finished_since: list[Any] = []
        self.seq = 0
        # vLLM 0.33's prefill cadence and DP throttling (scheduler.rs `prefill_gate`).
        self.interval = cfg.prefill_schedule_interval
        self.num_executed_steps = 0
        self.last_prefill_step = -self.interval
        self.capacity_bound = False
        self.deferred: set[Any] = set()  # vLLM's deferred_waiting

    # --- requests in -------------------------------------------------------------------
    def add_request(self, rid: Any, prompt: list[int], max_tokens: int, priority: int = 0,
                    eos: int | None = None, lora_id: int | None = None,
                    arrival_time: float = 0.0) -> None:  # fmt: skip
        if rid in self.requests:
            raise InputError("request_id")
        if not prompt:
            raise InputError("prompt_token_ids")
        if max_tokens < 1:
            raise InputError("max_tokens")
        if len(prompt) > self.cfg.max_model_len - 1:
            raise InputError("prompt_token_ids")
        r = RefRequest(
            rid, list(prompt), max_tokens, priority, arrival_time, self.seq, eos, lora_id
        )
        r.tokens = list(prompt)
        self.seq += 1
        self.requests[rid] = r
        self._enqueue(r, front=False)

    def _enqueue(self, r: RefRequest, front: bool) -> None:
        if self.cfg.policy == "fcfs":
            self.waiting.insert(0, r) if front else self.waiting.append(r)
        else:
            self.waiting.append(r)
            by_id = self.cfg.priority_ties == "vllm"
            self.waiting.sort(key=lambda w: w.key(by_id))

    # --- one step ----------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> dict[str, Any]:
        self.budget = self.cfg.max_num_batched_tokens
        decoding = any(not r.prefill_chunk for r in self.running)
        self.defer = (
            not self.capacity_bound
            and decoding
            and (
                throttle_prefills
                or (
                    self.interval > 1
                    and self.num_executed_steps + 1 - self.last_prefill_step < self.interval
                )
            )
        )
        self.prefill_admitted = False
        # vLLM 0.33: the threshold applies only when more than one request competes.
        eligible = len(self.running) + len(self.waiting)
        self.threshold = self.cfg.long_prefill_token_threshold if eligible > 1 else 0
        if self.threshold and self.cfg.long_prefill_token_threshold_adaptive:
            self.threshold = max(self.threshold, self.cfg.max_num_batched_tokens // eligible)
        self.scheduled: list[tuple[RefRequest, int]] = []
        self.preempted: list[RefRequest] = []
        self.admitted: dict[Any, bool] = {}
        self.loras: set[int] = set()
        self.prefill_scheduled = False  # a running prefill chunk is in the step
        if self.cfg.prioritize_prefill:
            self._running(only_prefills=True)
            if not self.preempted:
                self._waiting()
            self._running(only_prefills=False)
        else:
            self._running(only_prefills=None)
            if not self.preempted:
                self._waiting()
        if self.scheduled:
            self.num_executed_steps += 1
        if self.interval > 1 and (self.prefill_scheduled or self.prefill_admitted):
            self.last_prefill_step = self.num_executed_steps
        spec = []
        for r, n in self.scheduled:
            num_drafts = min(max(n - (len(r.tokens) - r.num_computed), 0), len(r.drafts))
            if num_drafts:
                spec.append((r.request_id, r.drafts[:num_drafts]))
            r.last_num_drafts = num_drafts
            r.prefill_chunk = r.num_computed + n < len(r.tokens)
        out = {
            "num_scheduled_tokens": [(r.request_id, n) for r, n in self.scheduled],
            "spec": spec,
            "new": [
                r.request_id for r, _ in self.scheduled if self.admitted.get(r.request_id) is False
            ],
            "resumed": [r.request_id for r, _ in self.scheduled if self.admitted.get(r.request_id)],
            "preempted": [r.request_id for r in self.preempted],
            "finished": self.finished_since,
        }
        self.finished_since = []
        for r, n in self.scheduled:
            r.drafts = []
            r.num_computed += n
            r.last_scheduled = n
        return out

    def _clamp(self, pending: int, num_computed: int) -> int:
        n = pending
        if self.threshold > 0:
            n = min(n, self.threshold)
        return max(min(n, self.budget, self.cfg.max_model_len - 1 - num_computed), 0)

    def _lookahead(self, num_tokens: int) -> int:
        """vLLM caps a request's slots at max_model_len."""
        return max(min(self.cfg.num_lookahead_tokens, self.cfg.max_model_len - num_tokens), 0)

    def _running(self, only_prefills: bool | None) -> None:
        i = 0
        while i < len(self.running) and self.budget > 0:
            r = self.running[i]
            done = any(s is r for s, _ in self.scheduled)
            n = self._clamp(r.pending, r.num_computed)
            held = self.defer and r.prefill_chunk
            if done or (only_prefills is not None and r.prefilling != only_prefills) or n == 0:
                i += 1
                continue
            if held:
                i += 1
                continue
            while True:
                known = len(self.pool.requests[r.request_id].tokens)  # ids the pool was given
                blocks = self.pool.allocate_slots(
                    r.request_id, n, self._lookahead(r.num_computed + n), r.tokens[known:]
                )
                if blocks is not None:
                    self.prefill_scheduled |= r.prefill_chunk
                    self.scheduled.append((r, n))
                    self.budget -= n
                    break
                victim = self._victim()
                self._preempt(victim)
                if victim is r:
                    break
            i = next((k + 1 for k, s in enumerate(self.running) if s is r), i)

    def _victim(self) -> RefRequest:
        if self.cfg.policy == "fcfs":
            return self.running[-1]
        if self.cfg.priority_ties == "vllm":
            # vLLM 0.33: max by (priority, arrival_time), the first of equals in running order.
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return max(self.running, key=lambda r: r.key(by_id=False))

    def _preempt(self, victim: RefRequest) -> None:
        self.pool.free(victim.request_id)
        self.running.remove(victim)
        for k, (s, n) in enumerate(self.scheduled):
            if s is victim:
                self.budget += n
                del self.scheduled[k]
                break
        self.admitted.pop(victim.request_id, None)
        victim.status, victim.num_computed, victim.drafts = "preempted", 0, []
        self._enqueue(victim, front=True)
        self.preempted.append(victim)

    def _full_sequence_fits(self, r: RefRequest, hit: Any) -> bool:
        """vLLM 0.33's scheduler_reserve_full_isl: the whole sequence (up to max_model_len)
        must fit in free blocks beside the hit (the radix pool, not vLLM's, never refuses)."""
        if not self.cfg.scheduler_reserve_full_isl or isinstance(self.pool, RefRadixPool):
            return True
        pool = self.pool
        num_tokens = min(len(r.tokens), self.cfg.max_model_len)
        needed = max(-(-num_tokens // self.cfg.block_size) - len(hit.block_ids), 0)
        evictable = sum(pool.ref_cnt[b] == 0 for b in hit.block_ids)
        return bool(needed + evictable <= pool.num_free_blocks)

    def _waiting(self) -> None:
        if self.cfg.max_loras:  # every running request's adapter counts (scheduler.rs)
            self.loras |= {r.lora_id for r in self.running if r.lora_id is not None}
        skipped = []
        while self.budget > 0 and self.waiting:
            if self.cfg.max_num_seqs and len(self.running) >= self.cfg.max_num_seqs:
                break
            r = self.waiting[0]
            if (
                r.lora_id is not None
                and self.cfg.max_loras
                and len(self.loras) >= self.cfg.max_loras
                and r.lora_id not in self.loras
            ):
                skipped.append(self.waiting.pop(0))
                self.deferred.add(r.request_id)
                continue
            hit = self.pool.get_computed_blocks(r.tokens, r.lora_id)
            if self.defer and hit.num_computed_tokens < len(r.tokens) - 1:
                break
            if not self._full_sequence_fits(r, hit):
                break
            computed = hit.num_computed_tokens
            n = len(r.tokens) - computed
            # vLLM 0.33's pad_spec_decode: one token left, in a step with no running prefill,
            # beside scheduled running requests or after a hit: 1 + k, k placeholder drafts.
            k, padded = self.cfg.num_speculative_tokens, False
            running_scheduled = len(self.scheduled) > len(self.admitted)
            if (
                n == 1
                and k
                and self.cfg.pad_spec_decode
                and not self.prefill_scheduled
                and (running_scheduled or computed > 0)
                and computed + 1 + k < self.cfg.max_model_len
            ):
                if 1 + k > self.budget:
                    break
                n, padded = 1 + k, True
            if self.threshold > 0 and n > self.threshold:
                n, padded = (1 if padded else self.threshold), False
            if not self.cfg.enable_chunked_prefill and n > self.budget:
                break
            n = min(n, self.budget)
            blocks = self.pool.allocate_slots(
                r.request_id, n, self._lookahead(computed + n), r.tokens, hit, r.lora_id
            )
            if blocks is None:
                break
            self.waiting.pop(0)
            self.running.append(r)
            self.deferred.discard(r.request_id)
            self.prefill_admitted |= hit.num_computed_tokens < len(r.tokens) - 1
            self.admitted[r.request_id] = r.status == "preempted"
            r.status, r.num_computed = "running", hit.num_computed_tokens
            if padded:
                r.drafts = [PLACEHOLDER_DRAFT] * k
            if r.lora_id is not None:
                self.loras.add(r.lora_id)
            self.scheduled.append((r, n))
            self.budget -= n
        for r in reversed(skipped):
            self._enqueue(r, front=True)
        if not self.defer:
            self.capacity_bound = len(self.waiting) > len(self.deferred)

    # --- results back ------------------------------------------------------------------
    def update_from_output(
        self,
        sampled: dict[Any, list[int]],
        rejected: dict[Any, int] | None = None,
        drafts: dict[Any, list[int]] | None = None,
    ) -> list[tuple[Any, str]]:
        rejected, drafts = rejected or {}, drafts or {}
        for rid, tokens in sampled.items():
            if rid not in self.requests:
                raise UnknownRequestError(str(rid))
            if self.requests[rid].status != "running" and tokens:
                raise InputError("request_id")
        finished = []
        for rid in dict.fromkeys([*sampled, *rejected, *drafts]):
            r = self.requests[rid]
            tokens = sampled.get(rid, [])
            self._rewind(r, rejected.get(rid, 0))
            # vLLM's update_draft_token_ids: a prefill chunk keeps no drafts.
            r.drafts = [] if r.prefill_chunk else list(drafts.get(rid, []))
            reason = None
            appended = 0
            for t in tokens:
                r.tokens.append(t)
                appended += 1
                reason = self._stop(r, t)
                if reason:
                    break
            # Tokens after a stop are dropped: computed covers all tokens but the last.
            self._rewind(r, len(tokens) - appended)
            if self.cfg.cache_accepted_drafts and r.last_num_drafts and tokens:
                self._cache_accepted_drafts(r)
            if reason:
                finished.append((rid, reason))
                self._finish(r)
        return finished

    def _rewind(self, r: RefRequest, n: int) -> None:
        if n <= 0 or r.status != "running":
            return
        r.num_computed -= n
        pooled = self.pool.requests[r.request_id]
        if isinstance(self.pool, RefRadixPool):
            pooled.num_computed -= n
        else:
            pooled.num_computed_tokens -= n

    def _cache_accepted_drafts(self, r: RefRequest) -> None:
        """vLLM 0.33 caches the blocks accepted drafts completed in the update (the block
        pool's; the radix pool caches at the end)."""
        if isinstance(self.pool, RefRadixPool):
            return
        pooled = self.pool.requests[r.request_id]
        pooled.tokens += r.tokens[len(pooled.tokens) :]
        self.pool._cache_full_blocks(pooled)

    def _stop(self, r: RefRequest, token: int) -> str | None:
        # vLLM 0.33's check_stop: EOS before length.
        if r.eos is not None and token == r.eos:
            return "stop"
        if len(r.tokens) >= self.cfg.max_model_len or len(r.tokens) - len(r.prompt) >= r.max_tokens:
            return "length"
        return None

    def abort(self, rids: list[Any]) -> None:
        for rid in rids:
            if rid not in self.requests:
                raise UnknownRequestError(str(rid))
        for rid in rids:
            if rid in self.requests:
                self._finish(self.requests[rid])

    def _finish(self, r: RefRequest) -> None:
        if r.status == "running":
            self.running.remove(r)
            self.pool.free(r.request_id)
        else:
            self.waiting.remove(r)
        self.deferred.discard(r.request_id)
        del self.requests[r.request_id]
        self.finished_since.append(r.request_id)
