"""Differential check: vLLM 0.33's own ``Scheduler`` against ``tokenyard.sched.Scheduler``,
driven with identical random streams over many configs.

Each scenario draws, from one seed, a config (token budget, sequence cap, chunked prefill,
long-prefill threshold and its adaptive floor, prefix caching, a tight or roomy KV pool,
FCFS or priority with ties) and a stream: requests arriving at random steps (prompts built
from a few shared token runs, so prefixes are hit; priorities from a small set; EOS and
stop ids; prompts near ``max_model_len``), aborts, and a fake model whose sampled tokens
are a function of (request, position), sometimes EOS or a stop id. Half the scenarios run
speculative decoding (vLLM's n-gram method, ``k`` of 1 to 4 drafts): after each step a fake
drafter proposes ``k`` drafts for every scheduled request, each the model's own token at its
position with a seeded chance (so the model accepts a prefix of them, drawn per scenario),
and the model emits the accepted drafts and its own token (vLLM's rejection sampling).
Half the scenarios set a ``prefill_schedule_interval`` (1 to 8) and some schedule a share of
their steps with ``throttle_prefills`` (vLLM's DP prefill balancing).
Both schedulers get the same calls; after every step they must agree on the scheduled
tokens of each request and its scheduled drafts, the preempted requests, and the finished
requests with their reasons. A scenario agrees when every step does; for one that does
not, the first differing step is printed.

    bash benches/peers/setup.sh    # once: .venv-bench with vLLM 0.33.0
    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_sched_diff.py \\
        [--scenarios 300] [--steps 200] [--show 3]

``--vllm-extra-blocks 1`` gives vLLM one block more than tokenyard (its null block), and
``--no-reserve-full-isl`` turns vLLM's ``scheduler_reserve_full_isl`` off: the two knobs an
earlier comparison lined up by hand. ``--tokenyard-before-spec-rules`` runs tokenyard with
``pad_spec_decode`` and ``cache_accepted_drafts`` off (its rules before it followed vLLM 0.33
there). ``--spec only|none`` keeps only the scenarios with (or
without) speculative decoding. The default is both sides' defaults.
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
    num_speculative_tokens: int = 0
    draft_accept_rate: float = 0.0
    prefill_schedule_interval: int = 1
    throttle_rate: float = 0.0
    """Chance that a step is scheduled with ``throttle_prefills`` (DP prefill balancing)."""
    speculative_method: str = "ngram"
    """vLLM's drafter: ``ngram``, or ``eagle`` / ``eagle3`` (the adapter's differential
    test only: a stub draft model, whose prefix-cache rules the core follows)."""
    disable_lookahead_block_hashes: bool = False
    """With an EAGLE drafter: vLLM's trailing-block drop instead of look-ahead hashes."""


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
    # From a stream of its own, so the rest of the scenario is what it was without it.
    spec_rng = random.Random(f"{seed}/spec")
    if spec_rng.random() < 0.5:
        config.num_speculative_tokens = spec_rng.randrange(1, 5)
        config.draft_accept_rate = spec_rng.choice([0.0, 0.5, 0.8, 1.0])
    # The prefill cadence and DP throttling, from a stream of their own too.
    cadence_rng = random.Random(f"{seed}/cadence")
    if cadence_rng.random() < 0.5:
        config.prefill_schedule_interval = cadence_rng.choice([1, 2, 3, 4, 8])
        config.throttle_rate = cadence_rng.choice([0.0, 0.3, 0.6])
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
    if config.num_speculative_tokens:
        _spec_prompts(spec_rng, seed, arrivals, steps, max_model_len)
    return Scenario(seed, config, arrivals, aborts)


def _spec_prompts(
    rng: random.Random, seed: int, arrivals: list[Arrival], steps: int, max_model_len: int
) -> None:
    """Prompts that bring out the spec-decode rules: one-token prompts and repeated prompts
    hit up to their last token (padded admissions), and follow-ups whose prompt is an
    earlier request's prompt and outputs (they hit blocks that accepted drafts completed)."""
    for i, a in enumerate(arrivals):
        r = rng.random()
        if r < 0.15:
            a.prompt = a.prompt[:1]
        elif r < 0.45 and i > 0:
            parent = arrivals[rng.randrange(i)]
            outputs = [
                _token(seed, parent.request_id, len(parent.prompt) + j)
                for j in range(parent.max_tokens)
            ]
            prompt = parent.prompt + outputs
            if rng.random() < 0.5:
                # A whole number of blocks and one token: hit but the last token.
                prompt = prompt[: len(prompt) // BLOCK_SIZE * BLOCK_SIZE + 1]
            else:
                prompt += [rng.randrange(1000, 30000) for _ in range(rng.randrange(1, 20))]
            a.prompt = prompt[: max_model_len - 2]
            a.step = min(max(a.step, parent.step + rng.randrange(1, 60)), steps - 1)


def sampled_token(scenario: Scenario, request_id: str, position: int) -> int:
    """The fake model's token: fixed by the request and position, sometimes EOS or STOP."""
    return _token(scenario.seed, request_id, position)


def _token(seed: int, request_id: str, position: int) -> int:
    r = random.Random(f"{seed}/{request_id}/{position}").random()
    if r < 0.04:
        return EOS
    if r < 0.07:
        return STOP
    return 1000 + int(r * 1e6) % 29000


def draft_token(scenario: Scenario, request_id: str, position: int) -> int:
    """The fake drafter's guess at ``position``: the model's token with the scenario's
    acceptance rate, otherwise a token the model never samples."""
    r = random.Random(f"{scenario.seed}/draft/{request_id}/{position}").random()
    if r < scenario.config.draft_accept_rate:
        return sampled_token(scenario, request_id, position)
    return 999


def model_output(
    scenario: Scenario, request_id: str, num_tokens: int, drafts: list[int]
) -> list[int]:
    """What the model emits for a request that caught up with its ``num_tokens`` tokens and
    verified ``drafts`` (placeholders included): the drafts that match its own tokens, up to
    the first that does not, then its own token there."""
    out = []
    for i, draft in enumerate(drafts):
        token = sampled_token(scenario, request_id, num_tokens + i)
        out.append(token)
        if draft != token:
            return out
    out.append(sampled_token(scenario, request_id, num_tokens + len(drafts)))
    return out


class TokenyardSide:
    def __init__(self, c: Config, spec_rules: bool = True) -> None:
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
                num_speculative_tokens=c.num_speculative_tokens,
                pad_spec_decode=spec_rules,
                cache_accepted_drafts=spec_rules,
                prefill_schedule_interval=c.prefill_schedule_interval,
            )
        )
        self.num_padded = 0

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

    def schedule(self, throttle: bool) -> tuple[dict[str, int], list[str], dict[str, list[int]]]:
        from tokenyard.sched import PLACEHOLDER_DRAFT

        out = self.s.schedule(throttle_prefills=throttle)
        drafts = {
            rid: [-1 if t == PLACEHOLDER_DRAFT else int(t) for t in tokens]
            for rid, tokens in out.scheduled_spec_decode_tokens.items()
        }
        self.num_padded += sum(d[:1] == [-1] for d in drafts.values())
        return dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids), drafts

    def caught_up(self, request_id: str) -> bool:
        return self.s.num_computed_tokens(request_id) >= self.s.num_tokens(request_id)

    def num_tokens(self, request_id: str) -> int:
        return self.s.num_tokens(request_id)

    def update(
        self,
        sampled: dict[str, list[int]],
        rejected: dict[str, int],
        drafts: dict[str, list[int]],
    ) -> dict[str, str]:
        return dict(
            self.s.update_from_output(
                sampled, num_rejected_tokens=rejected or None, spec_token_ids=drafts or None
            )
        )

    def abort(self, request_id: str) -> None:
        self.s.abort([request_id])

    def unfinished(self) -> bool:
        return self.s.has_unfinished_requests()


class VllmSide:
    """vLLM's ``Scheduler`` (or ``scheduler_cls``, built with the same vLLM arguments) with
    its own vLLM requests."""

    def __init__(
        self,
        c: Config,
        extra_blocks: int = 0,
        reserve_full_isl: bool = True,
        scheduler_cls: type | None = None,
    ) -> None:
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
            num_speculative_tokens=c.num_speculative_tokens,
            prefill_schedule_interval=c.prefill_schedule_interval,
            scheduler_cls=scheduler_cls,
            speculative_method=c.speculative_method,
            disable_lookahead_block_hashes=c.disable_lookahead_block_hashes,
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

    def schedule(self, throttle: bool) -> tuple[dict[str, int], list[str], dict[str, list[int]]]:
        self.last = self.s.schedule(throttle_prefills=throttle)
        drafts = {rid: list(t) for rid, t in self.last.scheduled_spec_decode_tokens.items()}
        return (
            dict(self.last.num_scheduled_tokens),
            sorted(self.last.preempted_req_ids or ()),
            drafts,
        )

    def update(self, sampled: dict[str, list[int]], drafts: dict[str, list[int]]) -> dict[str, str]:
        from vllm.v1.outputs import DraftTokenIds

        req_ids = list(self.last.num_scheduled_tokens)
        mro = self.mro(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[sampled.get(rid, []) for rid in req_ids],
        )
        outputs = self.s.update_from_output(self.last, mro)
        if drafts:
            # The engine hands the drafter's proposals over after the update.
            ids = list(drafts)
            self.s.update_draft_token_ids(DraftTokenIds(ids, [list(drafts[r]) for r in ids]))
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
    scenario: Scenario,
    steps: int,
    extra_blocks: int,
    reserve_full_isl: bool,
    spec_rules: bool = True,
    counts: Counter[str] | None = None,
) -> tuple[int, str] | None:
    """The first step at which the two sides differ and how, or ``None`` if none does.
    ``counts`` gathers how often the spec-decode rules came up (steps, drafts verified,
    padded admissions)."""
    ours = TokenyardSide(scenario.config, spec_rules)
    try:
        return _run(
            scenario, steps, ours, VllmSide(scenario.config, extra_blocks, reserve_full_isl), counts
        )
    finally:
        if counts is not None:
            counts["padded admissions"] += ours.num_padded


def _run(
    scenario: Scenario,
    steps: int,
    ours: TokenyardSide,
    theirs: VllmSide,
    counts: Counter[str] | None,
) -> tuple[int, str] | None:
    live: list[str] = []
    throttle_rng = random.Random(f"{scenario.seed}/throttle")
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
        throttle = throttle_rng.random() < scenario.config.throttle_rate
        if counts is not None:
            counts["throttled steps"] += throttle
        our_tokens, our_preempted, our_drafts = ours.schedule(throttle)
        their_tokens, their_preempted, their_drafts = theirs.schedule(throttle)
        if our_tokens != their_tokens:
            return step, f"scheduled tokens: vLLM {their_tokens}, tokenyard {our_tokens}"
        if our_drafts != their_drafts:
            return step, f"scheduled drafts: vLLM {their_drafts}, tokenyard {our_drafts}"
        if our_preempted != their_preempted:
            return step, f"preempted: vLLM {their_preempted}, tokenyard {our_preempted}"
        sampled, rejected = {}, {}
        for rid in our_tokens:
            if ours.caught_up(rid):
                verified = our_drafts.get(rid, [])
                sampled[rid] = model_output(scenario, rid, ours.num_tokens(rid), verified)
                if verified:
                    rejected[rid] = len(verified) - (len(sampled[rid]) - 1)
                    if counts is not None:
                        counts["steps verifying drafts"] += 1
                        counts["drafts accepted"] += len(sampled[rid]) - 1
        # The drafter proposes for every request of the batch (vLLM drops the drafts of a
        # request still prefilling); a request's next token sits after its emitted ones.
        k = scenario.config.num_speculative_tokens
        drafts = {}
        for rid in our_tokens if k else ():
            start = ours.num_tokens(rid) + len(sampled.get(rid, []))
            drafts[rid] = [draft_token(scenario, rid, start + i) for i in range(k)]
        our_finished = dict(ours.update(sampled, rejected, drafts))
        their_finished = {rid: _reason(r) for rid, r in theirs.update(sampled, drafts).items()}
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
    parser.add_argument("--spec", choices=["all", "only", "none"], default="all")
    parser.add_argument("--tokenyard-before-spec-rules", action="store_true")
    args = parser.parse_args()
    kinds: Counter[str] = Counter()
    shown = 0
    agree = 0
    agree_spec = num_spec = num_run = 0
    agree_cadence = num_cadence = 0
    exercised: Counter[str] = Counter()
    for seed in range(args.first_seed, args.first_seed + args.scenarios):
        scenario = draw_scenario(seed, args.steps)
        spec = scenario.config.num_speculative_tokens > 0
        if (args.spec == "only" and not spec) or (args.spec == "none" and spec):
            continue
        num_run += 1
        num_spec += spec
        cadence = scenario.config.prefill_schedule_interval > 1 or scenario.config.throttle_rate > 0
        num_cadence += cadence
        diff = run_scenario(
            scenario,
            args.steps,
            args.vllm_extra_blocks,
            not args.no_reserve_full_isl,
            not args.tokenyard_before_spec_rules,
            exercised,
        )
        if diff is None:
            agree += 1
            agree_spec += spec
            agree_cadence += cadence
            continue
        step, what = diff
        kinds[what.split(":")[0]] += 1
        if shown < args.show:
            shown += 1
            print(f"seed {seed} step {step}: {what}\n  config {scenario.config}")
    print(
        f"{agree}/{num_run} scenarios agree on every step (scheduled tokens and drafts, "
        f"preemptions, finishes and reasons), {agree_spec}/{num_spec} of those with "
        f"speculative decoding, {agree_cadence}/{num_cadence} with a prefill cadence or DP "
        f"throttling; first differences by kind: {dict(kinds)}; "
        f"exercised: {dict(exercised)}"
    )
    return 0 if agree == num_run else 1


if __name__ == "__main__":
    sys.exit(main())
