"""Differential check of the vLLM adapter: vLLM 0.33's own ``Scheduler`` / ``AsyncScheduler``
against tokenyard's ``TokenyardScheduler`` / ``AsyncTokenyardScheduler``, each built with
vLLM's arguments and driven through vLLM's interface with its own ``Request`` objects.

The scenarios are ``vllm_sched_diff.py``'s (configs, arrivals, EOS and stop ids, aborts,
speculative decoding, the prefill cadence and DP throttling), plus, in some, a KV cache
smaller than ``max_model_len`` (vLLM's ``Scheduler`` accepts it). The engine loop is vLLM's:
synchronous (schedule, run, update), or async with a batch queue of depth 2 as vLLM's
``EngineCore.step_with_batch_queue`` runs it (a step is scheduled while the previous one
runs, so a request stops on EOS, a stop id or an abort while its next step is in flight).
The fake model samples, for each request a step caught up with, a token fixed by (request,
position); under speculative decoding it accepts drafts by a seeded draw (async: the
placeholders' count) or by matching its own tokens (sync, drafts handed over after the
update as vLLM's engine does).

After every step both sides must agree, field by field, on the ``SchedulerOutput`` (new
requests with their prompt, block ids and computed tokens; cached requests with their
block ids, computed and output token counts, resumed ids; scheduled tokens and drafts;
finished and preempted ids), on the ``EngineCoreOutputs`` (per request: new tokens, finish
and stop reason), and on the state vLLM's engine reads (each live ``Request``'s status,
computed tokens, placeholders, tokens in flight and stale, output tokens; queue sizes, KV
usage and prefix-cache stats). A scenario agrees when every step does; for one that does
not, the first differing step is printed.

    bash benches/peers/setup.sh    # once: .venv-bench with vLLM 0.33.0
    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_adapter_diff.py \\
        [--mode async|sync] [--scenarios 500] [--steps 200] [--show 3] \\
        [--kinds plain|repetition|embeds|sessions] [--eagle off|lookahead|drop]
        [--layout NAME] [--mtp]

``--kinds repetition``: the fake model samples from 3 tokens (and EOS, STOP), and four
requests in five carry random ``repetition_detection`` with ``min_tokens``. ``--kinds
embeds``: every prompt is given as ``prompt_embeds`` (rows made from its tokens, so
prompts sharing tokens share embeddings and blocks) with no prompt ids; with ``--eagle
lookahead`` their blocks' keys cover the look-ahead rows. ``--kinds sessions``: three
requests in five are streaming-input sessions (``resumable``); each step, each live session
gets its next input chunk (1-12 tokens, new settings) with chance 1/5, or, one time in ten
of those, its end (a request that is not resumable), parked or running. ``--layout``: both
schedulers over one of ``vllm_eagle_layouts``' hybrid KV layouts, some groups flagged as
EAGLE groups (vLLM drops only in those) or beside chunked local attention. ``--mtp`` (with
``--eagle``): vLLM's ``SpeculativeConfig.use_multi_module_mtp`` answers true, so
``num_prefill_lookahead_tokens`` is ``k`` (a multi-module MTP drafter's runway and ``k - 1``
re-prefillable tokens) over the EAGLE stub drafter, on both sides.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections import Counter, deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from vllm_eagle_layouts import LAYOUTS
from vllm_eagle_layouts import install as install_layout
from vllm_sched_diff import (
    BLOCK_SIZE,
    Scenario,
    VllmSide,
    draw_scenario,
    sampled_token,
)


def draw(seed: int, steps: int, eagle: str = "off") -> Scenario:
    """``vllm_sched_diff``'s scenario; in one of six, a KV cache below ``max_model_len``.
    ``eagle`` ``lookahead`` or ``drop``: every scenario runs an EAGLE or EAGLE3 drafter
    (``k`` of 1 to 4) with prefix caching, under vLLM's look-ahead block hashes or, with
    ``disable_lookahead_block_hashes``, its trailing-block drop."""
    scenario = draw_scenario(seed, steps)
    rng = random.Random(f"{seed}/small-cache")
    if rng.random() < 1 / 6:
        c = scenario.config
        least = c.max_model_len // BLOCK_SIZE + 1
        c.num_blocks = max(2, least - rng.randrange(1, least // 2 + 2))
    if eagle != "off":
        eagle_scenario(scenario, seed, steps, drop=eagle == "drop")
    return scenario


def eagle_scenario(scenario: Scenario, seed: int, steps: int, drop: bool) -> None:
    """Turns ``scenario`` into an EAGLE one: drafter, prefix caching, and (for the scenarios
    drawn without speculative decoding) ``k`` and prompts that share blocks."""
    from vllm_sched_diff import _spec_prompts

    c = scenario.config
    rng = random.Random(f"{seed}/eagle")
    c.speculative_method = rng.choice(["eagle", "eagle3"])
    c.disable_lookahead_block_hashes = drop
    c.enable_prefix_caching = True
    if not c.num_speculative_tokens:
        c.num_speculative_tokens = rng.randrange(1, 5)
        c.draft_accept_rate = rng.choice([0.0, 0.5, 0.8, 1.0])
        _spec_prompts(rng, seed, scenario.arrivals, steps, c.max_model_len)
    # vLLM refuses a budget that cannot hold one request's drafts.
    c.max_num_batched_tokens = max(c.max_num_batched_tokens, c.num_speculative_tokens + 2)


class Side(VllmSide):
    """One scheduler class behind vLLM's interface, with its own vLLM requests."""

    def __init__(self, scenario: Scenario, cls: type) -> None:
        super().__init__(scenario.config, scheduler_cls=cls)

    def state(self) -> dict[str, Any]:
        """What vLLM's engine reads between steps."""
        requests = {
            rid: (
                str(r.status),
                r.num_computed_tokens,
                r.num_output_placeholders,
                r.num_in_flight_tokens,
                r.num_stale_output_tokens,
                list(r.output_token_ids),
            )
            for rid, r in sorted(self.s.requests.items())
        }
        return {
            "requests": requests,
            "counts": self.s.get_request_counts(),
            "kv_usage": round(self.s.get_kv_cache_usage(), 9),
            "unfinished": self.s.get_num_unfinished_requests(),
        }


def schedule_fields(out: Any) -> dict[str, Any]:
    cached = out.scheduled_cached_reqs
    return {
        "new": [
            (
                r.req_id,
                list(r.prompt_token_ids or ()),
                [list(b) for b in r.block_ids],
                r.num_computed_tokens,
            )
            for r in out.scheduled_new_reqs
        ],
        "cached": (
            list(cached.req_ids),
            sorted(cached.resumed_req_ids),
            [None if b is None else [list(x) for x in b] for b in cached.new_block_ids],
            list(cached.num_computed_tokens),
            list(cached.num_output_tokens),
            sorted(cached.all_token_ids),
        ),
        "num_scheduled_tokens": dict(out.num_scheduled_tokens),
        "total": out.total_num_scheduled_tokens,
        "spec": {k: list(v) for k, v in out.scheduled_spec_decode_tokens.items()},
        "finished": sorted(out.finished_req_ids),
        "preempted": sorted(out.preempted_req_ids or ()),
    }


def output_fields(outputs: dict[int, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    stats = None
    for client in sorted(outputs):
        eco = outputs[client]
        for o in eco.outputs:
            fields[o.request_id] = (
                list(o.new_token_ids),
                None if o.finish_reason is None else str(o.finish_reason),
                o.stop_reason,
            )
        stats = eco.scheduler_stats or stats
    if stats is not None:
        p = stats.prefix_cache_stats
        fields["<stats>"] = (
            stats.num_running_reqs,
            stats.num_waiting_reqs,
            round(stats.kv_cache_usage, 9),
            None if p is None else (p.requests, p.queries, p.hits),
        )
    return fields


def first_difference(what: str, theirs: Any, ours: Any) -> str | None:
    if theirs == ours:
        return None
    if isinstance(theirs, dict) and isinstance(ours, dict):
        for key in sorted(set(theirs) | set(ours), key=str):
            if theirs.get(key) != ours.get(key):
                return f"{what}[{key!r}]: vLLM {theirs.get(key)!r}, tokenyard {ours.get(key)!r}"
    return f"{what}: vLLM {theirs!r}, tokenyard {ours!r}"


class KindSide(Side):
    """``Side`` whose requests are of one kind (``--kinds``)."""

    def __init__(self, scenario: Scenario, cls: type, kind: str) -> None:
        super().__init__(scenario, cls)
        self.kind = kind
        self.seed = scenario.seed

    def add(self, a: Any, arrival_time: float) -> None:
        if self.kind == "plain":
            return super().add(a, arrival_time)
        import torch
        from vllm.sampling_params import RepetitionDetectionParams, SamplingParams
        from vllm.v1.request import Request
        from vllm_sched_diff import EOS, STOP

        params = SamplingParams(max_tokens=a.max_tokens, stop_token_ids=[STOP] if a.stop else [])
        if a.eos:
            params.update_from_generation_config({}, eos_token_id=EOS)
        prompt: list[int] | None = list(a.prompt)
        embeds = None
        resumable = False
        if self.kind == "sessions":
            resumable = random.Random(f"{self.seed}/session/{a.request_id}").random() < 0.6
        elif self.kind == "repetition":
            rng = random.Random(f"{self.seed}/repetition/{a.request_id}")
            if rng.random() < 0.8:
                size = rng.randint(1, 4)
                params.repetition_detection = RepetitionDetectionParams(
                    max_pattern_size=size,
                    min_pattern_size=rng.randint(0, size),
                    min_count=rng.randint(2, 4),
                )
                params.min_tokens = rng.randint(0, min(6, a.max_tokens))
        elif self.kind == "embeds":
            tokens = torch.tensor(a.prompt, dtype=torch.float32)
            embeds = torch.stack([tokens, (tokens * 7) % 13, -tokens], dim=1)
            prompt = None
        self.s.add_request(
            Request(
                request_id=a.request_id,
                prompt_token_ids=prompt,
                sampling_params=params,
                pooling_params=None,
                arrival_time=arrival_time,
                priority=a.priority,
                prompt_embeds=embeds,
                block_hasher=self.peer._block_hasher,
                resumable=resumable,
            )
        )
        return None


def session_chunks(seed: int, step: int, sides: list[KindSide], ended: set[str]) -> None:
    """``--kinds sessions``: the next input chunk (or, one time in ten, the end) of each
    live session, with chance 1/5 a step, to both sides; ``ended`` gets the ended ones."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request
    from vllm_sched_diff import EOS, STOP

    requests = sides[0].s.requests
    max_model_len = sides[0].s.max_model_len
    for rid in sorted(requests):
        if not requests[rid].resumable or rid in ended or requests[rid].is_finished():
            continue
        rng = random.Random(f"{seed}/chunk/{rid}/{step}")
        if rng.random() >= 0.2:
            continue
        chunk = [rng.randrange(10, 500) for _ in range(rng.randint(1, 12))]
        # A chunk that may leave no room for an output token (the core refuses it by name,
        # vLLM's scheduler takes it): the session ends instead.
        r = requests[rid]
        queued = sum(len(u.prompt_token_ids or ()) + u.max_tokens for u in r.streaming_queue or ())
        longest = r.num_prompt_tokens + r.max_tokens + queued + len(chunk) + 8
        end = rng.random() < 0.1 or longest >= max_model_len
        max_tokens, eos = rng.randint(1, 8), rng.random() < 0.5
        if end:
            ended.add(rid)
        for side in sides:
            params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP])
            if eos:
                params.update_from_generation_config({}, eos_token_id=EOS)
            side.s.add_request(
                Request(
                    request_id=rid,
                    prompt_token_ids=list(chunk),
                    sampling_params=params,
                    pooling_params=None,
                    arrival_time=float(step),
                    block_hasher=side.peer._block_hasher,
                    resumable=not end,
                )
            )


def few_tokens(seed: int, request_id: str, position: int) -> int:
    """``vllm_sched_diff._token`` over 3 tokens (EOS and STOP as often), so outputs repeat."""
    import vllm_sched_diff

    r = random.Random(f"{seed}/{request_id}/{position}").random()
    if r < 0.04:
        return vllm_sched_diff.EOS
    if r < 0.07:
        return vllm_sched_diff.STOP
    return 1000 + int(r * 1e6) % 3


class Runner:
    """The fake model: the same outputs for both sides, from vLLM's side's requests."""

    def __init__(self, scenario: Scenario, is_async: bool) -> None:
        self.scenario = scenario
        self.is_async = is_async

    def output(self, side: Side, out: Any, samples: dict[str, bool], step: int) -> Any:
        from vllm.v1.outputs import ModelRunnerOutput

        req_ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            if not samples[rid]:
                sampled.append([])
                continue
            request = side.s.requests.get(rid)
            position = request.num_tokens if request is not None else 0
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            if self.is_async:
                rate = self.scenario.config.draft_accept_rate
                rng = random.Random(f"{self.scenario.seed}/accept/{rid}/{step}")
                accepted = 0
                while accepted < len(drafts) and rng.random() < rate:
                    accepted += 1
            else:
                accepted = 0
                for i, d in enumerate(drafts):
                    if d != sampled_token(self.scenario, rid, position + i):
                        break
                    accepted = i + 1
            sampled.append(
                [sampled_token(self.scenario, rid, position + i) for i in range(accepted + 1)]
            )
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )


def drafts_for(scenario: Scenario, side: Side, req_ids: list[str]) -> Any:
    """The n-gram drafter's proposals after a sync step: the model's own token at each
    position with the scenario's rate (``vllm_sched_diff.draft_token``)."""
    from vllm.v1.outputs import DraftTokenIds
    from vllm_sched_diff import draft_token

    k = scenario.config.num_speculative_tokens
    ids, drafts = [], []
    for rid in req_ids:
        request = side.s.requests.get(rid)
        if request is None or request.is_finished():
            continue
        ids.append(rid)
        drafts.append([draft_token(scenario, rid, request.num_tokens + i) for i in range(k)])
    return DraftTokenIds(ids, drafts)


def run_scenario(
    scenario: Scenario, steps: int, is_async: bool, kind: str = "plain"
) -> tuple[int, str] | None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

    theirs = KindSide(scenario, AsyncScheduler if is_async else Scheduler, kind)
    ours = KindSide(scenario, AsyncTokenyardScheduler if is_async else TokenyardScheduler, kind)
    runner = Runner(scenario, is_async)
    depth = 2 if is_async else 1
    queue: deque[tuple[int, Any, Any, dict[str, bool]]] = deque()
    live: list[str] = []
    throttle_rng = random.Random(f"{scenario.seed}/throttle")
    last_arrival = max(a.step for a in scenario.arrivals)
    ended: set[str] = set()
    for step in range(steps):
        for a in scenario.arrivals:
            if a.step == step:
                theirs.add(a, float(step))
                ours.add(a, float(step))
                live.append(a.request_id)
        if kind == "sessions":
            session_chunks(scenario.seed, step, [theirs, ours], ended)
        if step in scenario.aborts and live:
            victim = live.pop(scenario.aborts[step] % len(live))
            theirs.abort(victim)
            ours.abort(victim)
        if diff := first_difference("state after arrivals", theirs.state(), ours.state()):
            return step, diff
        busy = theirs.s.has_requests() or ours.s.has_requests()
        if not busy and not queue:
            if step > last_arrival:
                return None
            continue
        scheduled = False
        if busy and len(queue) < depth:
            throttle = throttle_rng.random() < scenario.config.throttle_rate
            out_theirs = theirs.s.schedule(throttle_prefills=throttle)
            out_ours = ours.s.schedule(throttle_prefills=throttle)
            if (
                kind == "sessions"
                and not out_theirs.num_scheduled_tokens
                and not theirs.s.running
                and out_ours.num_scheduled_tokens
            ):
                # Waiting sessions hold the blocks and nothing runs: vLLM's admission
                # breaks at allocate_slots; the core releases their blocks (documented).
                return step, "vLLM stalls with the blocks held by waiting sessions"
            if diff := first_difference(
                "SchedulerOutput", schedule_fields(out_theirs), schedule_fields(out_ours)
            ):
                return step, diff
            samples = {
                rid: not theirs.s.requests[rid].is_prefill_chunk
                for rid in out_theirs.num_scheduled_tokens
            }
            if out_theirs.total_num_scheduled_tokens > 0:
                queue.append((step, out_theirs, out_ours, samples))
                scheduled = True
            else:
                # Nothing to run: vLLM's engine still updates with an empty output.
                from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

                eco_t = theirs.s.update_from_output(out_theirs, EMPTY_MODEL_RUNNER_OUTPUT)
                eco_o = ours.s.update_from_output(out_ours, EMPTY_MODEL_RUNNER_OUTPUT)
                if diff := first_difference(
                    "EngineCoreOutputs (empty step)", output_fields(eco_t), output_fields(eco_o)
                ):
                    return step, diff
        if queue and (len(queue) >= depth or not scheduled):
            sched_step, out_theirs, out_ours, samples = queue.popleft()
            mro = runner.output(theirs, out_theirs, samples, sched_step)
            eco_t = theirs.s.update_from_output(out_theirs, mro)
            eco_o = ours.s.update_from_output(out_ours, mro)
            if diff := first_difference(
                "EngineCoreOutputs", output_fields(eco_t), output_fields(eco_o)
            ):
                return step, diff
            if scenario.config.num_speculative_tokens and not is_async:
                req_ids = list(out_theirs.num_scheduled_tokens)
                theirs.s.update_draft_token_ids(drafts_for(scenario, theirs, req_ids))
                ours.s.update_draft_token_ids(drafts_for(scenario, theirs, req_ids))
            finished = {o for o, f in output_fields(eco_t).items() if f[1] is not None}
            live = [rid for rid in live if rid not in finished]
            if diff := first_difference("state after update", theirs.state(), ours.state()):
                return step, diff
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["async", "sync"], default="async")
    parser.add_argument("--scenarios", type=int, default=500)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=3, help="differing scenarios to print")
    parser.add_argument(
        "--only",
        choices=["all", "no-stops"],
        default="all",
        help="no-stops: no EOS, stop ids or aborts (the caching rule alone)",
    )
    parser.add_argument(
        "--eagle",
        choices=["off", "lookahead", "drop"],
        default="off",
        help="every scenario with an EAGLE/EAGLE3 drafter and prefix caching: look-ahead "
        "block hashes (vLLM's default) or the trailing-block drop",
    )
    parser.add_argument(
        "--layout",
        choices=["single", *sorted(LAYOUTS)],
        default="single",
        help="the KV cache groups: one full-attention group, or a hybrid layout of "
        "vllm_eagle_layouts (EAGLE groups flagged in part, chunked local attention)",
    )
    parser.add_argument(
        "--mtp",
        action="store_true",
        help="with --eagle: vLLM's multi-module MTP prefill look-ahead (k tokens)",
    )
    parser.add_argument(
        "--kinds",
        choices=["plain", "repetition", "embeds", "sessions"],
        default="plain",
        help="the requests' kind: repetition detection (and a 3-token model), prompt "
        "embeddings instead of prompt ids, or streaming-input sessions and their chunks",
    )
    args = parser.parse_args()
    is_async = args.mode == "async"
    if args.layout != "single":
        install_layout(args.layout)
    if args.mtp:
        from vllm.config import SpeculativeConfig

        SpeculativeConfig.use_multi_module_mtp = lambda self: True  # type: ignore[method-assign]
    if args.kinds == "repetition":
        import vllm_sched_diff

        vllm_sched_diff._token = few_tokens
    kinds: Counter[str] = Counter()
    agree = shown = 0
    small = agree_small = spec = agree_spec = 0
    first_diff: tuple[int, int, str] | None = None
    for seed in range(args.first_seed, args.first_seed + args.scenarios):
        scenario = draw(seed, args.steps, args.eagle)
        if args.only == "no-stops":
            scenario.aborts = {}
            for a in scenario.arrivals:
                a.eos = a.stop = False
        c = scenario.config
        is_small = (c.num_blocks - 1) * BLOCK_SIZE < c.max_model_len
        small += is_small
        spec += c.num_speculative_tokens > 0
        try:
            diff = run_scenario(scenario, args.steps, is_async, args.kinds)
        except Exception as err:  # a crash on either side is a difference
            diff = (-1, f"raised {type(err).__name__}: {err}")
        if diff is None:
            agree += 1
            agree_small += is_small
            agree_spec += c.num_speculative_tokens > 0
            continue
        step, what = diff
        kinds[what.split(":")[0].split("[")[0]] += 1
        if first_diff is None:
            first_diff = (seed, step, what)
        if shown < args.show:
            shown += 1
            print(f"seed {seed} step {step}: {what}\n  config {c}")
    eagle = "" if args.eagle == "off" else f" (EAGLE, {args.eagle})"
    eagle += "" if args.kinds == "plain" else f" ({args.kinds})"
    eagle += "" if args.layout == "single" else f" (layout {args.layout})"
    eagle += " (MTP modules)" if args.mtp else ""
    print(
        f"{args.mode}{eagle}: {agree}/{args.scenarios} scenarios agree on every step "
        f"(SchedulerOutput, EngineCoreOutputs, request state), {agree_spec}/{spec} with "
        f"speculative decoding, {agree_small}/{small} with a KV cache below max_model_len; "
        f"first differences by kind: {dict(kinds)}"
    )
    if first_diff is not None:
        print(f"first differing scenario: seed {first_diff[0]}, step {first_diff[1]}")
    return 0 if agree == args.scenarios else 1


if __name__ == "__main__":
    sys.exit(main())
