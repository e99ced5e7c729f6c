"""Differential check of the multimodal encoder rules: vLLM 0.33's own ``Scheduler`` (its
``_try_schedule_encoder_inputs`` and ``EncoderCacheManager``) against
``tokenyard.sched.Scheduler``, driven with identical random streams of multimodal requests.

The scenarios are ``vllm_sched_diff``'s (budgets, sequence caps, chunked prefill, prefix
caching, tight pools, FCFS or priority, speculative decoding, prefill cadence, aborts), with
multimodal items added to most prompts from a stream of their own: one to three items per
prompt, from a small pool of identifiers (so entries are shared across requests), 4 to 48
placeholder tokens each, some with an ``is_embed`` mask, and a few identifiers reused with
another size (vLLM finishes those requests with an error). An encoder compute budget and
cache size are drawn from the largest item up to roomy, and ``disable_chunked_mm_input`` in
a third of the scenarios where it fits.

vLLM's stub model is text-only, so its scheduler is built with no encoder budget; the
harness then sets what vLLM's ``compute_mm_encoder_budget`` would give a model whose largest
item is the scenario's: ``max_num_encoder_input_tokens``, a fresh ``EncoderCacheManager`` of
``encoder_cache_size``, and ``disable_chunked_mm_input``. vLLM keys prefix blocks by their
items' identifiers too (``_gen_mm_extra_hash_keys``); tokenyard keys them by tokens only, so
the placeholder tokens are made from the item's identifier (both sides get that prompt).

After every step both must agree on the scheduled tokens, drafts, preemptions, finishes
(and reasons), and also on ``scheduled_encoder_inputs`` and ``free_encoder_mm_hashes``.

    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_encoder_diff.py \\
        [--scenarios 200] [--steps 150] [--show 3]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_sched_diff as base


@dataclass(frozen=True)
class Item:
    offset: int
    length: int
    identifier: str
    is_embed: tuple[bool, ...] | None


@dataclass
class EncoderScenario:
    inner: base.Scenario
    budget: int
    cache_size: int
    disable_chunked_mm_input: bool
    items: dict[str, list[Item]] = field(default_factory=dict)


def draw(seed: int, steps: int) -> EncoderScenario:
    inner = base.draw_scenario(seed, steps)
    rng = random.Random(f"{seed}/encoder")
    # The identifier pool: each identifier one size (and mask), a few reused with another.
    pool = []
    for k in range(rng.randrange(2, 8)):
        length = rng.randrange(4, 49)
        mask = None
        if rng.random() < 0.2:
            mask = tuple(rng.random() < 0.6 for _ in range(length))
            if not any(mask):
                mask = (True, *mask[1:])
        pool.append((f"img{seed}-{k}", length, mask))
    largest = 1
    items: dict[str, list[Item]] = {}
    for a in inner.arrivals:
        if rng.random() < 0.25:
            continue
        chosen = []
        at = rng.randrange(0, 12)
        for _ in range(rng.randrange(1, 4)):
            ident, length, mask = rng.choice(pool)
            if rng.random() < 0.03:
                length, mask = length + 1, None  # the same identifier with another size
            if at + length > len(a.prompt):
                break
            chosen.append(Item(at, length, ident, mask))
            at += length + rng.randrange(0, 20)
        if not chosen:
            continue
        items[a.request_id] = chosen
        prompt = list(a.prompt)
        for it in chosen:
            for j in range(it.length):
                token = random.Random(f"{it.identifier}/{j}").randrange(9999)
                prompt[it.offset + j] = 40000 + token
            embeds = sum(it.is_embed) if it.is_embed else it.length
            largest = max(largest, embeds)
        a.prompt = prompt
    budget = rng.choice([largest, largest + 16, 2 * largest, 4 * largest, 8192])
    floor = budget if rng.random() < 0.3 else 0
    cache_size = max(floor, rng.choice([largest, 2 * largest, 3 * largest, 8192]))
    longest = max((it.length for its in items.values() for it in its), default=0)
    disable = rng.random() < 0.33 and longest <= inner.config.max_num_batched_tokens
    return EncoderScenario(inner, budget, cache_size, disable, items)


class TokenyardSide(base.TokenyardSide):
    def __init__(self, es: EncoderScenario) -> None:
        from tokenyard.sched import Scheduler, SchedulerConfig

        c = es.inner.config
        self.items = es.items
        self.s = Scheduler(
            SchedulerConfig(
                max_num_seqs=c.max_num_seqs,
                max_num_batched_tokens=c.max_num_batched_tokens,
                long_prefill_token_threshold=c.long_prefill_token_threshold,
                long_prefill_token_threshold_adaptive=c.long_prefill_token_threshold_adaptive,
                enable_chunked_prefill=c.enable_chunked_prefill,
                policy=c.policy,
                enable_prefix_caching=c.enable_prefix_caching,
                block_size=base.BLOCK_SIZE,
                num_blocks=c.num_blocks,
                max_model_len=c.max_model_len,
                num_speculative_tokens=c.num_speculative_tokens,
                prefill_schedule_interval=c.prefill_schedule_interval,
                max_num_encoder_input_tokens=es.budget,
                encoder_cache_size=es.cache_size,
                disable_chunked_mm_input=es.disable_chunked_mm_input,
            )
        )
        self.num_padded = 0
        self.last: Any = None

    def add(self, a: base.Arrival, arrival_time: float) -> None:
        from tokenyard.sched import MmFeature

        features = [
            MmFeature(it.offset, it.length, it.identifier, it.is_embed)
            for it in self.items.get(a.request_id, ())
        ]
        self.s.add_request(
            a.request_id,
            a.prompt,
            a.max_tokens,
            priority=a.priority,
            arrival_time=arrival_time,
            eos_token_id=base.EOS if a.eos else None,
            stop_token_ids=[base.STOP] if a.stop else None,
            mm_features=features or None,
        )

    def schedule(self, throttle: bool) -> tuple[dict[str, int], list[str], dict[str, list[int]]]:
        from tokenyard.sched import PLACEHOLDER_DRAFT

        out = self.last = self.s.schedule(throttle_prefills=throttle)
        drafts = {
            rid: [-1 if t == PLACEHOLDER_DRAFT else int(t) for t in tokens]
            for rid, tokens in out.scheduled_spec_decode_tokens.items()
        }
        return dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids), drafts

    def encoder(self) -> tuple[dict[str, list[int]], list[str]]:
        return dict(self.last.scheduled_encoder_inputs), list(self.last.free_encoder_mm_hashes)


class VllmSide(base.VllmSide):
    def __init__(self, es: EncoderScenario) -> None:
        from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

        super().__init__(es.inner.config)
        self.items = es.items
        # What compute_mm_encoder_budget gives a model whose largest item fits both.
        self.s.max_num_encoder_input_tokens = es.budget
        self.s.encoder_cache_manager = EncoderCacheManager(cache_size=es.cache_size)
        object.__setattr__(
            self.s.scheduler_config, "disable_chunked_mm_input", es.disable_chunked_mm_input
        )

    def add(self, a: base.Arrival, arrival_time: float) -> None:
        import torch
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        features = [
            MultiModalFeatureSpec(
                data=None,
                modality="image",
                identifier=it.identifier,
                mm_position=PlaceholderRange(
                    offset=it.offset,
                    length=it.length,
                    is_embed=None if it.is_embed is None else torch.tensor(it.is_embed),
                ),
            )
            for it in self.items.get(a.request_id, ())
        ]
        params = SamplingParams(
            max_tokens=a.max_tokens, stop_token_ids=[base.STOP] if a.stop else []
        )
        if a.eos:
            params.update_from_generation_config({}, eos_token_id=base.EOS)
        self.s.add_request(
            Request(
                request_id=a.request_id,
                prompt_token_ids=list(a.prompt),
                sampling_params=params,
                pooling_params=None,
                arrival_time=arrival_time,
                priority=a.priority,
                mm_features=features or None,
                block_hasher=self.peer._block_hasher,
            )
        )

    def encoder(self) -> tuple[dict[str, list[int]], list[str]]:
        return (
            {rid: list(ids) for rid, ids in self.last.scheduled_encoder_inputs.items()},
            list(self.last.free_encoder_mm_hashes),
        )


def run(es: EncoderScenario, steps: int, counts: Counter[str]) -> tuple[int, str] | None:
    """The first step at which the two sides differ and how, or ``None``."""
    scenario = es.inner
    ours, theirs = TokenyardSide(es), VllmSide(es)
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
        our_tokens, our_preempted, our_drafts = ours.schedule(throttle)
        their_tokens, their_preempted, their_drafts = theirs.schedule(throttle)
        if our_tokens != their_tokens:
            return step, f"scheduled tokens: vLLM {their_tokens}, tokenyard {our_tokens}"
        if our_drafts != their_drafts:
            return step, f"scheduled drafts: vLLM {their_drafts}, tokenyard {our_drafts}"
        if our_preempted != their_preempted:
            return step, f"preempted: vLLM {their_preempted}, tokenyard {our_preempted}"
        (our_enc, our_freed), (their_enc, their_freed) = ours.encoder(), theirs.encoder()
        if our_enc != their_enc:
            return step, f"encoder inputs: vLLM {their_enc}, tokenyard {our_enc}"
        if our_freed != their_freed:
            return step, f"freed encoder entries: vLLM {their_freed}, tokenyard {our_freed}"
        counts["encoder inputs"] += sum(len(v) for v in our_enc.values())
        counts["evictions"] += len(our_freed)
        counts["mm requests given fewer tokens than pending"] += sum(
            1
            for rid in ours.items
            if rid in our_tokens and our_tokens[rid] < _pending(ours, rid, our_tokens[rid])
        )
        sampled, rejected = {}, {}
        for rid in our_tokens:
            if ours.caught_up(rid):
                verified = our_drafts.get(rid, [])
                sampled[rid] = base.model_output(scenario, rid, ours.num_tokens(rid), verified)
                if verified:
                    rejected[rid] = len(verified) - (len(sampled[rid]) - 1)
        k = scenario.config.num_speculative_tokens
        drafts = {}
        for rid in our_tokens if k else ():
            start = ours.num_tokens(rid) + len(sampled.get(rid, []))
            drafts[rid] = [base.draft_token(scenario, rid, start + i) for i in range(k)]
        our_finished = dict(ours.update(sampled, rejected, drafts))
        their_finished = {rid: base._reason(r) for rid, r in theirs.update(sampled, drafts).items()}
        counts["error finishes"] += sum(r == "error" for r in our_finished.values())
        if our_finished != their_finished:
            return step, f"finished: vLLM {their_finished}, tokenyard {our_finished}"
        live = [rid for rid in live if rid not in our_finished]
    return None


def _pending(side: TokenyardSide, rid: str, scheduled: int) -> int:
    """Tokens the request had left before this step (computed already advanced)."""
    return side.num_tokens(rid) - (side.s.num_computed_tokens(rid) - scheduled)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=200)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=3)
    args = parser.parse_args()
    kinds: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    agree = shown = 0
    for seed in range(args.first_seed, args.first_seed + args.scenarios):
        es = draw(seed, args.steps)
        diff = run(es, args.steps, counts)
        if diff is None:
            agree += 1
            continue
        step, what = diff
        kinds[what.split(":")[0]] += 1
        if shown < args.show:
            shown += 1
            print(
                f"seed {seed} step {step}: {what}\n  config {es.inner.config}\n  encoder "
                f"budget={es.budget} cache={es.cache_size} "
                f"disable_chunked_mm_input={es.disable_chunked_mm_input}"
            )
    print(
        f"{agree}/{args.scenarios} multimodal scenarios agree on every step (scheduled "
        f"tokens and drafts, preemptions, finishes, encoder inputs, freed entries); first "
        f"differences by kind: {dict(kinds)}; exercised: {dict(counts)}"
    )
    return 0 if agree == args.scenarios else 1


if __name__ == "__main__":
    sys.exit(main())
