"""Differential check: vLLM 0.33's own ``Scheduler`` against ``tokenyard.sched.Scheduler``,
driven with identical random streams over many configs.

Each scenario draws, from one seed, a config (token budget, sequence cap, chunked prefill,
long-prefill threshold and its adaptive floor, prefix caching, a tight or roomy KV pool,
FCFS or priority with ties) and a stream: requests arriving at random steps (prompts built
from a few shared token runs, so prefixes are hit; priorities from a small set; EOS and
stop ids; prompts near ``max_model_len``), aborts, and a fake model whose sampled tokens
are a function of (request, position), sometimes EOS or a stop id. Both schedulers get the
same calls; after every step they must agree on the scheduled tokens of each request, the
preempted requests, and the finished requests with their reasons. A scenario agrees when
every step does; for one that does not, the first differing step is printed.

    bash benches/peers/setup.sh    # once: .venv-bench with vLLM 0.33.0
    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_sched_diff.py \\
        [--scenarios 300] [--steps 200] [--show 3]

``--vllm-extra-blocks 1`` gives vLLM one block more than tokenyard (its null block), and
``--no-reserve-full-isl`` turns vLLM's ``scheduler_reserve_full_isl`` off: the two knobs an
earlier comparison lined up by hand. The default is both sides' defaults.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

BLOCK_SIZE = 16
EOS = 2
STOP = 3


@dataclass
class Config:
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int
    long_prefill_token_threshold_adaptive: bool
    enable_prefix_caching: bool
    policy: str


@dataclass
class Arrival:
    step: int
    request_id: str
    prompt: list[int]
    max_tokens: int
    priority: int
    eos: bool
    stop: bool


@dataclass
class Scenario:
    seed: int
    config: Config
    arrivals: list[Arrival]
    aborts: dict[int, int] = field(default_factory=dict)  # step -> which live request


def draw_scenario(seed: int, steps: int) -> Scenario:
    rng = random.Random(seed)
    max_model_len = rng.choice([128, 256, 512])
    chunked = rng.random() < 0.8
    budget = rng.choice([16, 32, 64, 100, 256, 512])
    if not chunked:
        budget = max(budget, max_model_len)
    # Tight pools hold one longest request and little more (both engines refuse less).
    least = max_model_len // BLOCK_SIZE + 1
    config = Config(
        num_blocks=least + rng.choice([0, 2, 8, 24, 400]),
        max_num_seqs=min(rng.choice([1, 2, 4, 8, 32]), budget),  # vLLM refuses more
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=rng.choice([0, 0, 8, 24, 64]),
        long_prefill_token_threshold_adaptive=rng.random() < 0.3,
        enable_prefix_caching=rng.random() < 0.7,
        policy=rng.choice(["fcfs", "priority"]),
    )
    # Prompts open with one of a few shared runs, so prefixes are hit and blocks shared.
    runs = [[rng.randrange(1000, 30000) for _ in range(rng.randrange(8, 80))] for _ in range(4)]
    arrivals = []
    for i in range(rng.randrange(3, 24)):
        prefix = rng.choice(runs)[: rng.randrange(0, 81)] if rng.random() < 0.7 else []
        own = [rng.randrange(1000, 30000) for _ in range(rng.randrange(1, 120))]
        prompt = (prefix + own)[: max_model_len - 2]
        arrivals.append(
            Arrival(
                step=0 if rng.random() < 0.4 else rng.randrange(steps // 2),
                # Ids in no particular order: priority ties are broken by them in vLLM.
                request_id=f"r{rng.randrange(10**6):06d}-{i}",
                prompt=prompt,
                max_tokens=rng.randrange(1, 40),
                priority=rng.choice([0, 0, 1, 2]),
                eos=rng.random() < 0.5,
                stop=rng.random() < 0.3,
            )
        )
    aborts = {rng.randrange(steps // 2): rng.randrange(100) for _ in range(rng.randrange(3))}
    return Scenario(seed, config, arrivals, aborts)


def sampled_token(scenario: Scenario, request_id: str, position: int) -> int:
    """The fake model's token: fixed by the request and position, sometimes EOS or STOP."""
    r = random.Random(f"{scenario.seed}/{request_id}/{position}").random()
    if r < 0.04:
        return EOS
    if r < 0.07:
        return STOP
    return 1000 + int(r * 1e6) % 29000


class TokenyardSide:
    def __init__(self, c: Config) -> None:
        from tokenyard.sched import Scheduler, SchedulerConfig

        self.s = Scheduler(
            SchedulerConfig(
                max_num_seqs=c.max_num_seqs,
                max_num_batched_tokens=c.max_num_batched_tokens,
                long_prefill_token_threshold=c.long_prefill_token_threshold,
                long_prefill_token_threshold_adaptive=c.long_prefill_token_threshold_adaptive,
                enable_chunked_prefill=c.enable_chunked_prefill,
                policy=c.policy,
                enable_prefix_caching=c.enable_prefix_caching,
                block_size=BLOCK_SIZE,
                num_blocks=c.num_blocks,
                max_model_len=c.max_model_len,
            )
        )

    def add(self, a: Arrival, arrival_time: float) -> None:
        self.s.add_request(
            a.request_id,
            a.prompt,
            a.max_tokens,
            priority=a.priority,
            arrival_time=arrival_time,
            eos_token_id=EOS if a.eos else None,
            stop_token_ids=[STOP] if a.stop else None,
        )

    def schedule(self) -> tuple[dict[str, int], list[str]]:
        out = self.s.schedule()
        return dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids)

    def caught_up(self, request_id: str) -> bool:
        return self.s.num_computed_tokens(request_id) >= self.s.num_tokens(request_id)

    def num_tokens(self, request_id: str) -> int:
        return self.s.num_tokens(request_id)

    def update(self, sampled: dict[str, list[int]]) -> dict[str, str]:
        return dict(self.s.update_from_output(sampled))

    def abort(self, request_id: str) -> None:
        self.s.abort([request_id])

    def unfinished(self) -> bool:
        return self.s.has_unfinished_requests()


class VllmSide:
    def __init__(self, c: Config, extra_blocks: int, reserve_full_isl: bool) -> None:
        import vllm_peer
        from vllm.v1.outputs import ModelRunnerOutput

        self.mro = ModelRunnerOutput
        self.peer = vllm_peer.VllmSchedulerPeer(
            num_blocks=c.num_blocks + extra_blocks,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
            max_model_len=c.max_model_len,
            block_size=BLOCK_SIZE,
            enable_prefix_caching=c.enable_prefix_caching,
            enable_chunked_prefill=c.enable_chunked_prefill,
            long_prefill_token_threshold=c.long_prefill_token_threshold,
            long_prefill_token_threshold_adaptive=c.long_prefill_token_threshold_adaptive,
            policy=c.policy,
            scheduler_reserve_full_isl=reserve_full_isl,
        )
        self.s = self.peer.scheduler
        self.last: Any = None

    def add(self, a: Arrival, arrival_time: float) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=a.max_tokens, stop_token_ids=[STOP] if a.stop else [])
        if a.eos:
            params.update_from_generation_config({}, eos_token_id=EOS)
        self.s.add_request(
            Request(
                request_id=a.request_id,
                prompt_token_ids=list(a.prompt),
                sampling_params=params,
                pooling_params=None,
                arrival_time=arrival_time,
                priority=a.priority,
                block_hasher=self.peer._block_hasher,
            )
        )

    def schedule(self) -> tuple[dict[str, int], list[str]]:
        self.last = self.s.schedule()
        return dict(self.last.num_scheduled_tokens), sorted(self.last.preempted_req_ids or ())

    def update(self, sampled: dict[str, list[int]]) -> dict[str, str]:
        req_ids = list(self.last.num_scheduled_tokens)
        mro = self.mro(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[sampled.get(rid, []) for rid in req_ids],
        )
        outputs = self.s.update_from_output(self.last, mro)
        return {
            o.request_id: str(o.finish_reason)
            for eco in outputs.values()
            for o in eco.outputs
            if o.finish_reason is not None
        }

    def abort(self, request_id: str) -> None:
        from vllm.v1.request import RequestStatus

        self.s.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)

    def unfinished(self) -> bool:
        return self.s.has_unfinished_requests()


def run_scenario(
    scenario: Scenario, steps: int, extra_blocks: int, reserve_full_isl: bool
) -> tuple[int, str] | None:
    """The first step at which the two sides differ and how, or ``None`` if none does."""
    ours = TokenyardSide(scenario.config)
    theirs = VllmSide(scenario.config, extra_blocks, reserve_full_isl)
    live: list[str] = []
    for step in range(steps):
        for a in scenario.arrivals:
            if a.step == step:
                ours.add(a, float(step))
                theirs.add(a, float(step))
                live.append(a.request_id)
        if step in scenario.aborts and live:
            victim = live.pop(scenario.aborts[step] % len(live))
            ours.abort(victim)
            theirs.abort(victim)
        if not ours.unfinished() and not theirs.unfinished():
            if step > max(a.step for a in scenario.arrivals):
                return None
            continue
        our_tokens, our_preempted = ours.schedule()
        their_tokens, their_preempted = theirs.schedule()
        if our_tokens != their_tokens:
            return step, f"scheduled tokens: vLLM {their_tokens}, tokenyard {our_tokens}"
        if our_preempted != their_preempted:
            return step, f"preempted: vLLM {their_preempted}, tokenyard {our_preempted}"
        sampled = {
            rid: [sampled_token(scenario, rid, ours.num_tokens(rid))]
            for rid in our_tokens
            if ours.caught_up(rid)
        }
        our_finished = {rid: reason for rid, reason in ours.update(sampled).items()}
        their_finished = {rid: _reason(r) for rid, r in theirs.update(sampled).items()}
        if our_finished != their_finished:
            return step, f"finished: vLLM {their_finished}, tokenyard {our_finished}"
        live = [rid for rid in live if rid not in our_finished]
    return None


def _reason(vllm_reason: str) -> str:
    """vLLM's ``FinishReason`` as tokenyard names it."""
    name = vllm_reason.rsplit(".", 1)[-1].lower()
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(name, name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=300)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=3, help="differing scenarios to print")
    parser.add_argument("--vllm-extra-blocks", type=int, default=0)
    parser.add_argument("--no-reserve-full-isl", action="store_true")
    args = parser.parse_args()
    kinds: Counter[str] = Counter()
    shown = 0
    agree = 0
    for seed in range(args.first_seed, args.first_seed + args.scenarios):
        scenario = draw_scenario(seed, args.steps)
        diff = run_scenario(
            scenario, args.steps, args.vllm_extra_blocks, not args.no_reserve_full_isl
        )
        if diff is None:
            agree += 1
            continue
        step, what = diff
        kinds[what.split(":")[0]] += 1
        if shown < args.show:
            shown += 1
            print(f"seed {seed} step {step}: {what}\n  config {scenario.config}")
    print(
        f"{agree}/{args.scenarios} scenarios agree on every step "
        f"(scheduled tokens, preemptions, finishes and reasons); first differences by kind: "
        f"{dict(kinds)}"
    )
    return 0 if agree == args.scenarios else 1


if __name__ == "__main__":
    sys.exit(main())
