"""Differential and invariant testing of the step scheduler: the Rust scheduler and the
pure-Python reference (sched_reference.py) get the same random arrivals, outputs and
aborts, and must make identical decisions at every step."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sched_reference import RefScheduler

from tokenyard.errors import TokenyardError
from tokenyard.sched import PLACEHOLDER_DRAFT, Scheduler, SchedulerConfig

PROMPTS = [list(range(100, 140)), list(range(100, 120)) + list(range(300, 320)), [5] * 40]
EOS = 9


def configs() -> st.SearchStrategy[SchedulerConfig]:
    return st.builds(
        SchedulerConfig,
        max_num_seqs=st.integers(0, 4),
        max_num_batched_tokens=st.integers(1, 48),
        long_prefill_token_threshold=st.sampled_from([0, 0, 5]),
        long_prefill_token_threshold_adaptive=st.booleans(),
        enable_chunked_prefill=st.just(True),
        policy=st.sampled_from(["fcfs", "priority"]),
        priority_ties=st.sampled_from(["vllm", "arrival_order"]),
        enable_prefix_caching=st.booleans(),
        prefix_cache=st.sampled_from(["block_hash", "radix"]),
        # Capacity of 52-80 tokens (less vLLM's null block): one request always fits (49
        # slots at most), a few do not.
        block_size=st.just(4),
        num_blocks=st.integers(14, 20),
        reserve_null_block=st.booleans(),
        scheduler_reserve_full_isl=st.booleans(),
        max_model_len=st.just(48),
        prioritize_prefill=st.booleans(),
        num_lookahead_tokens=st.sampled_from([0, 0, 1]),
        max_loras=st.sampled_from([0, 1]),
        num_speculative_tokens=st.sampled_from([0, 0, 2]),
        pad_spec_decode=st.booleans(),
        cache_accepted_drafts=st.booleans(),
        prefill_schedule_interval=st.sampled_from([1, 1, 2, 3]),
    ).filter(
        # A padded admission needs 1 + k tokens of budget (a smaller one is refused).
        lambda c: not c.pad_spec_decode or c.max_num_batched_tokens > c.num_speculative_tokens
    )


class SchedulerMachine(RuleBasedStateMachine):
    @precondition(lambda self: not hasattr(self, "rust"))
    @rule(cfg=configs())
    def build(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.rust = Scheduler(cfg)
        self.ref = RefScheduler(cfg)
        self.next_id = 0
        self.next_token = 1000
        self.arrival_time = 0.0

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(
        prompt=st.sampled_from(PROMPTS),
        cut=st.integers(1, 40),
        max_tokens=st.integers(1, 8),
        priority=st.integers(0, 2),
        lora=st.sampled_from([None, 1, 2]),
        tie=st.booleans(),
    )
    def add(
        self, prompt: list[int], cut: int, max_tokens: int, priority: int, lora: Any, tie: bool
    ) -> None:
        # Ids out of arrival order, and arrival times that tie: priority ties by request id.
        rid: Any = -self.next_id if self.next_id % 2 else f"r{1000 - self.next_id}"
        self.next_id += 1
        self.arrival_time += 0.0 if tie else 1.0
        tokens = prompt[:cut]
        self.rust.add_request(
            rid,
            tokens,
            max_tokens,
            priority=priority,
            eos_token_id=EOS,
            lora_id=lora,
            arrival_time=self.arrival_time,
        )
        self.ref.add_request(rid, tokens, max_tokens, priority, EOS, lora, self.arrival_time)

    @precondition(lambda self: hasattr(self, "rust"))
    @rule(
        eos_every=st.integers(2, 12),
        accept=st.integers(0, 2),
        throttle=st.sampled_from([False, False, True]),
    )
    def step(self, eos_every: int, accept: int = 0, throttle: bool = False) -> None:
        out = self.rust.schedule(throttle_prefills=throttle)
        ref = self.ref.schedule(throttle)
        assert list(out.num_scheduled_tokens.items()) == ref["num_scheduled_tokens"]
        spec = [(rid, d.tolist()) for rid, d in out.scheduled_spec_decode_tokens.items()]
        assert spec == ref["spec"]
        assert [r.req_id for r in out.scheduled_new_reqs] == ref["new"]
        assert [r.req_id for r in out.scheduled_resumed_reqs] == ref["resumed"]
        assert out.preempted_req_ids == ref["preempted"]
        assert out.finished_req_ids == ref["finished"]
        assert out.total_num_scheduled_tokens <= self.cfg.max_num_batched_tokens
        assert all(n >= 1 for n in out.num_scheduled_tokens.values())
        # The fake model samples for requests that caught up, accepting up to `accept` of
        # their drafts (never a placeholder); sometimes it samples EOS. The drafter then
        # proposes k drafts for every scheduled request.
        sampled, rejected, drafts = {}, {}, {}
        verified = dict(spec)
        for rid in out.num_scheduled_tokens:
            r = self.ref.requests[rid]
            if r.num_computed >= len(r.tokens):
                mine = verified.get(rid, [])
                good = next((i for i, t in enumerate(mine) if t == PLACEHOLDER_DRAFT), len(mine))
                accepted = min(accept, good)
                self.next_token += 1
                last = EOS if self.next_token % eos_every == 0 else self.next_token
                sampled[rid] = [*mine[:accepted], last]
                if mine:
                    rejected[rid] = len(mine) - accepted
            for _ in range(self.cfg.num_speculative_tokens):
                self.next_token += 1
                drafts.setdefault(rid, []).append(self.next_token)
        before = dict(self.ref.requests)
        finished = self.rust.update_from_output(
            sampled, num_rejected_tokens=rejected, spec_token_ids=drafts
        )
        assert finished == self.ref.update_from_output(sampled, rejected, drafts)
        for rid, reason in finished:
            # Stopped at EOS (checked first, as vLLM 0.33 does: even at max_tokens), or
            # exactly max_tokens outputs (or max_model_len reached) ending in another token.
            r = before[rid]
            num_outputs = len(r.tokens) - len(r.prompt)
            if reason == "stop":
                assert r.tokens[-1] == EOS
                assert num_outputs <= r.max_tokens
            else:
                assert r.tokens[-1] != EOS or r.eos is None
                assert num_outputs == r.max_tokens or len(r.tokens) == self.cfg.max_model_len

    @precondition(lambda self: hasattr(self, "rust") and self.ref.requests)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.ref.requests, key=str)))
        self.rust.abort([rid])
        self.ref.abort([rid])

    @precondition(lambda self: hasattr(self, "rust"))
    @rule()
    def abort_unknown(self) -> None:
        for side in (lambda: self.rust.abort(["nope"]), lambda: self.ref.abort(["nope"])):
            try:
                side()
                raise AssertionError("aborting an unknown id must fail")
            except TokenyardError:
                pass

    @invariant()
    def agree(self) -> None:
        if not hasattr(self, "rust"):
            return
        self.rust.check_invariants()
        assert self.rust.running_ids() == [r.request_id for r in self.ref.running]
        assert self.rust.waiting_ids() == [r.request_id for r in self.ref.waiting]
        for r in self.ref.running:
            assert self.rust.num_computed_tokens(r.request_id) == r.num_computed
        stats = self.rust.stats()
        assert stats.num_deferred_waiting == len(self.ref.deferred)
        assert self.rust.num_executed_steps == self.ref.num_executed_steps
        assert self.rust.last_prefill_step == self.ref.last_prefill_step
        assert self.rust.prefill_capacity_bound == self.ref.capacity_bound
        # Usage over the blocks that hold KV (vLLM's get_usage leaves the null block out).
        num_kv_blocks = self.cfg.num_blocks - int(self.cfg.reserve_null_block)
        used = num_kv_blocks - self.ref.pool.num_free_blocks
        assert stats.kv_usage == used / num_kv_blocks
        if self.cfg.max_num_seqs:
            assert stats.num_running <= self.cfg.max_num_seqs

    def teardown(self) -> None:
        # With enough memory and no new arrivals, everything finishes.
        if not hasattr(self, "rust"):
            return
        for _ in range(2000):
            if not self.rust.has_unfinished_requests():
                break
            self.step(eos_every=1000)
        if self.rust.has_unfinished_requests() and self.vllm_ties_can_livelock():
            return  # two tied requests preempting each other for good, as in vLLM 0.33
        assert not self.rust.has_unfinished_requests()

    def vllm_ties_can_livelock(self) -> bool:
        """Under priority_ties="vllm" two live requests tied on (priority, arrival time) may
        preempt each other for good (documented); any other unfinished run is a bug."""
        if self.cfg.policy != "priority" or self.cfg.priority_ties != "vllm":
            return False
        keys = [(r.priority, r.arrival_time) for r in self.ref.requests.values()]
        return len(keys) != len(set(keys))


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
