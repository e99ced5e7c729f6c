"""The two sides of the scheduler benchmark (``sched_vllm.py``): tokenyard's ``Scheduler``
and vLLM 0.33's, each behind the same ``Side`` interface with the same harness
bookkeeping, so one timed ``step()`` means the same thing on both."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent / "peers")]

BLOCK_SIZE = 16
VOCAB = 32000
SAMPLED_TOKEN = 7  # what the fake runner samples; never an EOS (none is set)


# --- the two sides ----------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool
    max_tokens: int
    # vLLM's KV accounting: one block more (its null block: tokenyard then reserves none)
    # and scheduler_reserve_full_isl (both sides' default True):
    vllm_extra_blocks: int = 0
    vllm_reserve_full_isl: bool = True


class Side(ABC):
    """One scheduler plus the harness bookkeeping; ``step()`` times one iteration."""

    name: str

    def __init__(self) -> None:
        self.ntok: dict[str, int] = {}  # expected num_tokens (prompt + sampled)
        self.comp: dict[str, int] = {}  # computed tokens, after the latest step
        self.prefix_hit_tokens = 0  # computed on first schedule beyond what was scheduled
        self.preempted = 0

    @abstractmethod
    def add_all(
        self, ids: Sequence[str], prompts: Sequence[np.ndarray], max_tokens: int
    ) -> int: ...

    @abstractmethod
    def step(self) -> tuple[tuple[int, int, int], dict[str, int], Any]:
        """One timed iteration: ns spent in (schedule, building the runner output,
        update_from_output), the scheduled tokens, and update_from_output's result."""
        ...

    @abstractmethod
    def finished_ids(self, raw: Any) -> list[str]: ...

    @abstractmethod
    def has_unfinished(self) -> bool: ...


class TokenyardSide(Side):
    name = "tokenyard"

    def __init__(self, sc: Scenario) -> None:
        super().__init__()
        from tokenyard.sched import Scheduler, SchedulerConfig

        self.s = Scheduler(
            SchedulerConfig(
                max_num_seqs=sc.max_num_seqs,
                max_num_batched_tokens=sc.max_num_batched_tokens,
                block_size=BLOCK_SIZE,
                num_blocks=sc.num_blocks,
                max_model_len=sc.max_model_len,
                enable_prefix_caching=sc.enable_prefix_caching,
                enable_chunked_prefill=True,
                long_prefill_token_threshold=0,
                policy="fcfs",
                # The same accounting as the vLLM side (vLLM 0.33's, by default).
                reserve_null_block=sc.vllm_extra_blocks == 0,
                scheduler_reserve_full_isl=sc.vllm_reserve_full_isl,
            )
        )

    def add_all(self, ids: Sequence[str], prompts: Sequence[np.ndarray], max_tokens: int) -> int:
        add = self.s.add_request
        t0 = perf_counter_ns()
        for rid, p in zip(ids, prompts, strict=True):
            add(rid, p, max_tokens)
        elapsed = perf_counter_ns() - t0
        for rid, p in zip(ids, prompts, strict=True):
            self.ntok[rid] = len(p)
        return elapsed

    def step(self) -> tuple[tuple[int, int, int], dict[str, int], Any]:
        s, ntok, comp = self.s, self.ntok, self.comp
        t0 = perf_counter_ns()
        out = s.schedule()
        # SchedulerOutput fields are built when read: count them with schedule().
        nst = out.num_scheduled_tokens
        preempted = out.preempted_req_ids
        t1 = perf_counter_ns()
        for rid in preempted:
            comp.pop(rid, None)
            self.preempted += 1
        sampled = {}
        for rid, n in nst.items():
            c = comp.get(rid)
            if c is None:
                c = s.num_computed_tokens(rid)
                self.prefix_hit_tokens += c - n
            else:
                c += n
            comp[rid] = c
            if c >= ntok[rid]:
                sampled[rid] = [SAMPLED_TOKEN]
                ntok[rid] += 1
        t2 = perf_counter_ns()
        finished = s.update_from_output(sampled)
        t3 = perf_counter_ns()
        return (t1 - t0, t2 - t1, t3 - t2), nst, finished

    def finished_ids(self, raw: Any) -> list[str]:
        return [rid for rid, _reason in raw]

    def has_unfinished(self) -> bool:
        return self.s.has_unfinished_requests()


class TokenyardArraysSide(TokenyardSide):
    """tokenyard through its bulk path: integer request ids, the step's decisions as numpy
    arrays (``num_scheduled_tokens_arrays``), the runner output as arrays
    (``update_from_output_arrays``) and the harness bookkeeping in numpy. What an engine
    that keeps its per-request state in arrays pays per step."""

    name = "tokenyard (arrays)"

    def add_all(self, ids: Sequence[str], prompts: Sequence[np.ndarray], max_tokens: int) -> int:
        self.names = list(ids)
        add = self.s.add_request
        t0 = perf_counter_ns()
        for i, p in enumerate(prompts):
            add(i, p, max_tokens)
        elapsed = perf_counter_ns() - t0
        self.ntok_a = np.array([len(p) for p in prompts], dtype=np.int64)
        self.comp_a = np.full(len(prompts), -1, dtype=np.int64)  # -1: not scheduled yet
        return elapsed

    def step(self) -> tuple[tuple[int, int, int], dict[str, int], Any]:
        s, ntok, comp = self.s, self.ntok_a, self.comp_a
        t0 = perf_counter_ns()
        out = s.schedule()
        ids, n = out.num_scheduled_tokens_arrays()
        preempted = out.preempted_req_ids
        t1 = perf_counter_ns()
        if preempted:
            comp[preempted] = -1
            self.preempted += len(preempted)
        c = comp[ids]
        first = np.flatnonzero(c < 0)
        c += n
        for j in first.tolist():  # first scheduled: read the prefix hit once
            c[j] = s.num_computed_tokens(int(ids[j]))
            self.prefix_hit_tokens += int(c[j] - n[j])
        comp[ids] = c
        sampled = ids[c >= ntok[ids]]
        ntok[sampled] += 1
        tokens = np.full(len(sampled), SAMPLED_TOKEN, dtype=np.int64)
        t2 = perf_counter_ns()
        finished = s.update_from_output_arrays(sampled, tokens)
        t3 = perf_counter_ns()
        names = self.names
        nst = {names[i]: k for i, k in zip(ids.tolist(), n.tolist(), strict=True)}
        return (t1 - t0, t2 - t1, t3 - t2), nst, finished

    def finished_ids(self, raw: Any) -> list[str]:
        return [self.names[rid] for rid, _reason in raw]


class VllmSide(Side):
    name = "vLLM"

    def __init__(self, sc: Scenario) -> None:
        super().__init__()
        import vllm_peer
        from vllm.v1.outputs import ModelRunnerOutput

        self._mro = ModelRunnerOutput
        self.peer = vllm_peer.VllmSchedulerPeer(
            num_blocks=sc.num_blocks + sc.vllm_extra_blocks,
            max_num_seqs=sc.max_num_seqs,
            max_num_batched_tokens=sc.max_num_batched_tokens,
            max_model_len=sc.max_model_len,
            block_size=BLOCK_SIZE,
            enable_prefix_caching=sc.enable_prefix_caching,
            scheduler_reserve_full_isl=sc.vllm_reserve_full_isl,
        )
        self.s = self.peer.scheduler

    def add_all(self, ids: Sequence[str], prompts: Sequence[np.ndarray], max_tokens: int) -> int:
        # vLLM's engine hands the scheduler list[int] prompts: convert outside the clock.
        # Request construction runs the block hasher over the prompt, so it is timed
        # with add_request (tokenyard hashes inside add_request or schedule()).
        lists = [p.tolist() for p in prompts]
        make, add = self.peer.make_request, self.s.add_request
        t0 = perf_counter_ns()
        for rid, p in zip(ids, lists, strict=True):
            add(make(rid, p, max_tokens))
        elapsed = perf_counter_ns() - t0
        for rid, p in zip(ids, lists, strict=True):
            self.ntok[rid] = len(p)
        return elapsed

    def step(self) -> tuple[tuple[int, int, int], dict[str, int], Any]:
        s, ntok, comp, requests = self.s, self.ntok, self.comp, self.s.requests
        t0 = perf_counter_ns()
        so = s.schedule()
        nst = so.num_scheduled_tokens
        preempted = so.preempted_req_ids
        t1 = perf_counter_ns()
        if preempted:
            for rid in preempted:
                comp.pop(rid, None)
                self.preempted += 1
        req_ids = list(nst)
        sampled = []
        for rid, n in nst.items():
            c = comp.get(rid)
            if c is None:
                c = requests[rid].num_computed_tokens
                self.prefix_hit_tokens += c - n
            else:
                c += n
            comp[rid] = c
            if c >= ntok[rid]:
                sampled.append([SAMPLED_TOKEN])
                ntok[rid] += 1
            else:
                sampled.append([])
        mro = self._mro(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        t2 = perf_counter_ns()
        outputs = s.update_from_output(so, mro)
        t3 = perf_counter_ns()
        return (t1 - t0, t2 - t1, t3 - t2), nst, outputs

    def finished_ids(self, raw: Any) -> list[str]:
        return [o.request_id for eco in raw.values() for o in eco.outputs if o.finish_reason]

    def has_unfinished(self) -> bool:
        return self.s.has_unfinished_requests()


SIDES: tuple[type[Side], ...] = (TokenyardSide, VllmSide)


# --- one side through one scenario -------------------------------------------------------
