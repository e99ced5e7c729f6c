"""tokenyard.integrations.vllm: repetition detection and prompt embeddings as vLLM 0.33's
``Scheduler`` serves them. Repetition: ``check_stop`` (``vllm/v1/core/sched/utils.py``)
stops a request whose outputs end in a repeated pattern, after EOS, the stop ids and the
length, from ``min_tokens`` outputs on, per appended token (``update_from_output``), so a
speculative step stops at the token completing it. Prompt embeddings: ``Request`` counts
their rows as prompt tokens (``_all_token_ids`` 0 there), vLLM's block hasher adds a sha256
of each block's embeddings to its extra keys (``_gen_prompt_embeds_extra_hash_keys`` in
``vllm/v1/core/kv_cache_utils.py``), and ``NewRequestData`` carries them. Each stream runs
on vLLM's scheduler and on the adapter with the same requests and sampled tokens, and every
step's decisions, block tables, outputs (tokens, finish and stop reasons) and statuses must
be equal. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.sampling_params import RepetitionDetectionParams, SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm_compare import _BLOCK_HASHERS, block_digest, peer_pair

from tokenyard.errors import InputError
from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

_PAIR = (Scheduler, TokenyardScheduler)


def _pair(**config: Any) -> list[Any]:
    options = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 256}
    options.update(config)
    return peer_pair(_PAIR, num_blocks=options.pop("num_blocks", 64), **options)


def _add(pair: list[Any], make: Any) -> None:
    """``make(block_hasher)`` built once per scheduler (each its own request)."""
    for s in pair:
        s.add_request(make(_BLOCK_HASHERS[id(s)]))


def _outputs(engine_outputs: dict[int, Any]) -> dict[str, Any]:
    return {
        o.request_id: (list(o.new_token_ids), o.finish_reason, o.stop_reason)
        for eco in engine_outputs.values()
        for o in eco.outputs
    }


def _run(
    pair: list[Any],
    arrivals: dict[int, list[Any]],
    rng: random.Random,
    vocab: int = 3,
    num_spec_tokens: int = 0,
    max_steps: int = 400,
) -> dict[str, Any]:
    """Runs both schedulers step by step: ``arrivals[step]`` are ``make(hasher)``s added
    then; each sampling request samples tokens drawn from ``range(1, vocab + 1)`` (with
    drafts, 1 to 1 + its drafts of them), the same on both sides. Returns every request's
    final ``(status, output tokens, stop_reason)`` on vLLM's side, after checking each step
    agrees."""
    theirs, ours = pair
    done: dict[str, Any] = {}
    for step in range(max_steps):
        for make in arrivals.get(step, ()):
            _add(pair, make)
        outs = [s.schedule() for s in pair]
        assert block_digest(outs[1]) == block_digest(outs[0]), step
        ids = list(outs[0].num_scheduled_tokens)
        sampled = []
        for r in ids:
            request = theirs.requests[r]
            if request.num_computed_tokens < request.num_tokens:
                sampled.append([])
                continue
            drafts = outs[0].scheduled_spec_decode_tokens.get(r, ())
            n = rng.randint(1, len(drafts) + 1)
            sampled.append([rng.randint(1, vocab) for _ in range(n)])
        results = []
        for s, out in zip(pair, outs, strict=True):
            runner = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[list(t) for t in sampled],
            )
            results.append(_outputs(s.update_from_output(out, runner)))
        assert results[1] == results[0], step
        for request_id, (_, reason, stop) in results[0].items():
            if reason is not None:
                request = theirs.requests.get(request_id)
                done[request_id] = (str(reason), stop)
                assert request is None or request.is_finished()
        for r in ids:
            if r in theirs.requests:
                a, b = theirs.requests[r], ours.requests[r]
                assert (a.status, a.num_computed_tokens) == (b.status, b.num_computed_tokens)
                assert list(a.output_token_ids) == list(b.output_token_ids), step
                assert a.stop_reason == b.stop_reason
        if num_spec_tokens:
            running = [
                r for r in ids if r in theirs.requests and not theirs.requests[r].is_finished()
            ]
            drafts = DraftTokenIds(
                running, [[rng.randint(1, vocab) for _ in range(num_spec_tokens)] for _ in running]
            )
            for s in pair:
                s.update_draft_token_ids(drafts)
        if step > max(arrivals) and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return done
    raise AssertionError("the stream did not drain")


def _repeating(request_id: str, prompt: list[int], max_tokens: int, rule: Any, min_tokens: int = 0):
    params = SamplingParams(
        max_tokens=max_tokens,
        repetition_detection=rule,
        min_tokens=min_tokens,
        ignore_eos=True,
    )
    return lambda hasher: Request(request_id, list(prompt), params, None, block_hasher=hasher)


def test_pattern_of_two_thrice_stops_at_the_sixth_output_with_vllms_reason():
    # Outputs 1 2 1 2 1 2: [1, 2] x 3 completes at the sixth, both sides stop there with
    # FINISHED_REPETITION and stop_reason "repetition_detected".
    pair = _pair()
    rule = RepetitionDetectionParams(max_pattern_size=2, min_pattern_size=2, min_count=3)
    _add(pair, _repeating("a", list(range(10)), 20, rule))
    tokens = [1, 2, 1, 2, 1, 2, 1]
    finish = None
    for step, token in enumerate(tokens):
        outs = [s.schedule() for s in pair]
        results = []
        for s, out in zip(pair, outs, strict=True):
            runner = ModelRunnerOutput(
                req_ids=["a"], req_id_to_index={"a": 0}, sampled_token_ids=[[token]]
            )
            results.append(_outputs(s.update_from_output(out, runner)))
        assert results[0] == results[1]
        if results[0]["a"][1] is not None:
            finish = step + 1, str(results[0]["a"][1]), results[0]["a"][2]
            break
    assert finish == (6, "repetition", "repetition_detected")
    assert pair[1].requests.get("a") is None or pair[1].requests["a"].status == (
        RequestStatus.FINISHED_REPETITION
    )


def test_min_tokens_defers_the_check_and_disabled_rules_stop_nothing():
    rng = random.Random(0)
    rule = RepetitionDetectionParams(max_pattern_size=1, min_pattern_size=1, min_count=2)
    off = RepetitionDetectionParams(max_pattern_size=0, min_pattern_size=0, min_count=0)
    pair = _pair()
    arrivals = {
        0: [_repeating("deferred", list(range(8)), 30, rule, min_tokens=12)],
        1: [_repeating("off", list(range(9)), 12, off)],
    }
    done = _run(pair, arrivals, rng, vocab=2)
    assert done["off"] == ("length", None)
    assert done["deferred"][1] == "repetition_detected"
    assert len(pair[0].requests) == 0


@pytest.mark.parametrize("num_spec_tokens", [0, 3])
@pytest.mark.parametrize("seed", range(12))
def test_random_streams_stop_where_vllm_stops(seed: int, num_spec_tokens: int):
    # 12 requests, a vocabulary of 3, random rules (some none): repetition, length and
    # stop ids all end some; with drafts a step's accepted tokens are trimmed at the stop.
    rng = random.Random(seed)
    pair = _pair(num_blocks=48, num_speculative_tokens=num_spec_tokens)
    arrivals: dict[int, list[Any]] = {}
    for i in range(12):
        size = rng.randint(1, 4)
        rule = (
            RepetitionDetectionParams(
                max_pattern_size=size,
                min_pattern_size=rng.randint(0, size),
                min_count=rng.randint(2, 4),
            )
            if rng.random() < 0.8
            else None
        )
        params = SamplingParams(
            max_tokens=rng.randint(4, 40),  # min_tokens <= max_tokens (vLLM's)
            repetition_detection=rule,
            min_tokens=rng.randint(0, 4) if rule else 0,
            stop_token_ids=[3] if rng.random() < 0.2 else None,
            ignore_eos=True,
        )
        prompt = [rng.randint(0, 50) for _ in range(rng.randint(4, 60))]
        arrivals.setdefault(rng.randint(0, 20), []).append(
            lambda h, r=f"r{i}", p=prompt, sp=params: Request(r, p, sp, None, block_hasher=h)
        )
    done = _run(pair, arrivals, rng, num_spec_tokens=num_spec_tokens)
    assert len(done) == 12


def _embeds_request(
    request_id: str, embeds: torch.Tensor, max_tokens: int = 4, hasher: Any = None, **kw: Any
):
    """``make(block_hasher)`` of a request with ``embeds``; hashed with ``hasher`` if given
    (else the side's)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return lambda side_hasher: Request(
        request_id,
        None,
        params,
        None,
        prompt_embeds=embeds,
        block_hasher=hasher or side_hasher,
        **kw,
    )


def test_prompt_embeddings_hit_where_vllms_hashes_agree():
    # 40 rows of 4 (blocks of 16): b shares a's first 32 rows, so it hits 2 blocks; c has
    # a's rows with one changed in its second block, so it hits 1; d is a's rows as token
    # ids' placeholders would never tell apart, and hits all a's full blocks.
    torch.manual_seed(0)
    a = torch.randn(40, 4)
    b = torch.cat([a[:32], torch.randn(8, 4)])
    c = a.clone()
    c[20, 0] += 1.0
    pair = _pair()
    arrivals = {
        0: [_embeds_request("a", a)],
        8: [_embeds_request("b", b), _embeds_request("c", c), _embeds_request("d", a.clone())],
    }
    computed = _record_hits(pair[1])
    theirs = _record_hits(pair[0])
    _run(pair, arrivals, random.Random(1))
    assert computed == theirs == {"a": 0, "b": 32, "c": 16, "d": 32}


def test_mixed_prompts_key_blocks_by_tokens_and_embeddings():
    # Mixed mode (prompt_token_ids beside prompt_embeds, prompt_is_token_ids): y repeats x
    # and hits its 2 full blocks; z differs from x in one token of block 2 (same
    # embeddings) and hits 1, as vLLM's hashes (tokens and embeddings' digest) do.
    torch.manual_seed(2)
    embeds = torch.randn(36, 4)
    mask = [i % 3 != 0 for i in range(36)]
    tokens = [7 + i for i in range(36)]
    other = list(tokens)
    other[20] = 99
    params = SamplingParams(max_tokens=3, ignore_eos=True)

    def mixed(request_id: str, prompt: list[int]) -> Any:
        return lambda hasher: Request(
            request_id,
            list(prompt),
            params,
            None,
            prompt_embeds=embeds,
            prompt_is_token_ids=mask,
            block_hasher=hasher,
        )

    pair = _pair()
    computed = _record_hits(pair[0])
    arrivals = {0: [mixed("x", tokens)], 6: [mixed("y", tokens), mixed("z", other)]}
    _run(pair, arrivals, random.Random(3))
    assert computed == {"x": 0, "y": 32, "z": 16}


def _record_hits(scheduler: Any) -> dict[str, int]:
    """The computed tokens each new request of ``scheduler``'s steps starts with."""
    computed: dict[str, int] = {}
    schedule = scheduler.schedule

    def recording() -> Any:
        out = schedule()
        for new in out.scheduled_new_reqs:
            computed[new.req_id] = new.num_computed_tokens
        return out

    scheduler.schedule = recording
    return computed


@pytest.mark.parametrize("seed", range(8))
def test_random_embedding_streams_agree(seed: int):
    # Prompts cut from a few shared embedding prefixes plus random tails, a tight cache
    # (preemptions) and chunked prefills: every step's hits and tables agree.
    rng = random.Random(seed)
    torch.manual_seed(seed)
    bank = [torch.randn(48, 4) for _ in range(3)]
    pair = _pair(num_blocks=24, max_num_batched_tokens=32)
    arrivals: dict[int, list[Any]] = {}
    for i in range(10):
        head = bank[rng.randrange(3)][: rng.randint(0, 48)]
        embeds = torch.cat([head, torch.randn(rng.randint(1, 30), 4)])
        arrivals.setdefault(rng.randint(0, 30), []).append(
            _embeds_request(f"e{i}", embeds, max_tokens=rng.randint(1, 12))
        )
    done = _run(pair, arrivals, rng)
    assert len(done) == 10


def _eagle_pair(**config: Any) -> list[Any]:
    """An EAGLE pair with vLLM's look-ahead block hashes (``num_hash_lookahead_tokens`` 1)."""
    return _pair(num_speculative_tokens=2, speculative_method="eagle", **config)


def test_prompt_embeddings_hit_as_vllms_look_ahead_hashes_agree():
    # EAGLE: each block's hash also covers the row after it (the digest of rows [0, 17)
    # keys block 0). a has 40 rows; b shares its first 33 rows, so both of its blocks hit
    # (32), though its third block differs past that row; c differs at row 32, past block 1
    # but under its look-ahead, so it hits block 0 only (16); e differs at row 16, block
    # 0's look-ahead row, and hits nothing.
    torch.manual_seed(4)
    a = torch.randn(40, 4)
    b = torch.cat([a[:33], torch.randn(7, 4)])
    c = a.clone()
    c[32, 1] += 1.0
    e = a.clone()
    e[16, 2] += 1.0
    pair = _eagle_pair()
    assert pair[1].num_hash_lookahead_tokens == 1
    arrivals = {
        0: [_embeds_request("a", a)],
        8: [_embeds_request("b", b), _embeds_request("c", c), _embeds_request("e", e)],
    }
    computed = _record_hits(pair[1])
    theirs = _record_hits(pair[0])
    _run(pair, arrivals, random.Random(5), num_spec_tokens=2)
    assert computed == theirs == {"a": 0, "b": 32, "c": 16, "e": 0}


@pytest.mark.parametrize("lookahead", [3, 16, 21])
def test_prompt_embeddings_under_longer_look_aheads_hit_as_vllms(lookahead: int):
    # Hashers of a multi-module MTP's look-ahead (L tokens; vLLM hashes with the
    # request's hasher, the core follows it), L past a block or two: a shares x's rows up
    # to 32 + L, so x's blocks 0 and 1 hit where x has their hashes; y differs at row
    # 31 + L, under block 1's look-ahead but past block 0's.
    torch.manual_seed(lookahead)
    x = torch.randn(80, 4)
    a = torch.cat([x[: 32 + lookahead], torch.randn(12, 4)])
    y = x.clone()
    y[31 + lookahead, 0] += 1.0
    pair = _pair()
    hash_fn = get_hash_fn_by_name(pair[0].vllm_config.cache_config.prefix_caching_hash_algo)
    kv_cache_utils.init_none_hash(hash_fn)
    hasher = kv_cache_utils.get_request_block_hasher(16, hash_fn, lookahead)
    arrivals = {
        0: [_embeds_request("x", x, hasher=hasher)],
        12: [_embeds_request("a", a, hasher=hasher), _embeds_request("y", y, hasher=hasher)],
    }
    computed = _record_hits(pair[1])
    theirs = _record_hits(pair[0])
    _run(pair, arrivals, random.Random(6))
    assert pair[1].num_hash_lookahead_tokens == lookahead
    assert computed == theirs
    assert (computed["a"], computed["y"]) == (32, 16)


@pytest.mark.parametrize("seed", range(6))
def test_random_embedding_streams_agree_under_look_ahead_hashes(seed: int):
    # test_random_embedding_streams_agree's streams with EAGLE's look-ahead hashes and
    # drafts: shared prefixes cut anywhere, so hits end in and past look-ahead rows.
    rng = random.Random(seed)
    torch.manual_seed(seed)
    bank = [torch.randn(48, 4) for _ in range(3)]
    pair = _eagle_pair(num_blocks=24, max_num_batched_tokens=32)
    arrivals: dict[int, list[Any]] = {}
    for i in range(10):
        head = bank[rng.randrange(3)][: rng.randint(0, 48)]
        embeds = torch.cat([head, torch.randn(rng.randint(1, 30), 4)])
        arrivals.setdefault(rng.randint(0, 30), []).append(
            _embeds_request(f"e{i}", embeds, max_tokens=rng.randint(1, 12))
        )
    done = _run(pair, arrivals, rng, num_spec_tokens=2)
    assert len(done) == 10


def test_a_session_turn_stopped_by_repetition_parks_and_its_chunk_sets_new_rules():
    # Turn 1 (rule [t] x 3): token 5 three times stops it with "repetition" and parks it
    # (vLLM's _handle_stopped_request); the chunk carries no rule, so turn 2 runs to its
    # max_tokens of 4 on the same token.
    pair = _pair()
    rule = RepetitionDetectionParams(max_pattern_size=1, min_pattern_size=1, min_count=3)

    def add(prompt: list[int], max_tokens: int, rule: Any) -> None:
        params = SamplingParams(max_tokens=max_tokens, repetition_detection=rule)
        _add(pair, lambda h: Request("s", prompt, params, None, block_hasher=h, resumable=True))

    def turn() -> list[Any]:
        reasons = []
        for _ in range(8):
            outs = [s.schedule() for s in pair]
            assert block_digest(outs[1]) == block_digest(outs[0])
            results = []
            for s, out in zip(pair, outs, strict=True):
                ids = list(out.num_scheduled_tokens)
                runner = ModelRunnerOutput(
                    req_ids=ids,
                    req_id_to_index={r: i for i, r in enumerate(ids)},
                    sampled_token_ids=[[5] for _ in ids],
                )
                results.append(_outputs(s.update_from_output(out, runner)))
            assert results[1] == results[0]
            reasons.append(results[0].get("s", (None, None, None))[1:])
            if reasons[-1][0] is not None:
                break
        assert pair[0].requests["s"].status == pair[1].requests["s"].status
        assert pair[0].requests["s"].status == RequestStatus.WAITING_FOR_STREAMING_REQ
        return reasons

    add(list(range(20)), 10, rule)
    reasons = turn()
    assert len(reasons) == 3
    assert (str(reasons[-1][0]), reasons[-1][1]) == ("repetition", "repetition_detected")
    add([30, 31], 4, None)
    reasons = turn()
    assert len(reasons) == 4
    assert str(reasons[-1][0]) == "length"


def _session_turn(pair: list[Any], token: int = 5) -> None:
    """Runs both schedulers until the session "s" parks, each step compared."""
    for _ in range(12):
        outs = [s.schedule() for s in pair]
        assert block_digest(outs[1]) == block_digest(outs[0])
        results = []
        for s, out in zip(pair, outs, strict=True):
            ids = list(out.num_scheduled_tokens)
            runner = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[token] for _ in ids],
            )
            results.append(_outputs(s.update_from_output(out, runner)))
        assert results[1] == results[0]
        if pair[0].requests["s"].status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            break
    assert pair[1].requests["s"].status == RequestStatus.WAITING_FOR_STREAMING_REQ


@pytest.mark.parametrize("is_async", [False, True])
@pytest.mark.parametrize("eagle", [False, True])
def test_a_mixed_embeddings_session_extends_its_prompt_with_ids_as_vllm(
    eagle: bool, is_async: bool
):
    # A session whose first chunk mixes ids and embeddings (36 positions, blocks of 16):
    # vLLM's StreamingUpdate carries ids alone, and the session's embeddings stay its first
    # 36 rows, so the block [32, 48) keys rows 32-35 and then ids; the session's own probe
    # after turn 2 hits its blocks past the rows on both sides, and a fresh mixed request
    # with 48 rows of embeddings shares only the first 32.
    torch.manual_seed(7)
    embeds = torch.randn(36, 4)
    mask = [i % 4 != 0 for i in range(36)]
    tokens = [7 + i for i in range(36)]
    options: dict[str, Any] = {"max_num_seqs": 4, "max_num_batched_tokens": 64}
    if eagle:
        options.update(num_speculative_tokens=2, speculative_method="eagle")
    classes = (AsyncScheduler, AsyncTokenyardScheduler) if is_async else _PAIR
    pair = peer_pair(classes, num_blocks=64, max_model_len=256, **options)

    def add(prompt: list[int], max_tokens: int, **kw: Any) -> None:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        _add(
            pair,
            lambda h: Request(
                "s", list(prompt), params, None, block_hasher=h, resumable=True, **kw
            ),
        )

    add(tokens, 3, prompt_embeds=embeds, prompt_is_token_ids=mask)
    _session_turn(pair)
    add(list(range(100, 120)), 4)
    _session_turn(pair, token=6)
    probes = [s.kv_cache_manager.get_computed_blocks(s.requests["s"])[1] for s in pair]
    assert probes[0] == probes[1] >= 48
    longer = torch.cat([embeds, torch.randn(12, 4)])
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    computed = _record_hits(pair[1])
    theirs = _record_hits(pair[0])
    _add(
        pair,
        lambda h: Request(
            "q",
            [*tokens, *range(200, 212)],
            params,
            None,
            prompt_embeds=longer,
            prompt_is_token_ids=[*mask, *([True] * 12)],
            block_hasher=h,
        ),
    )
    _session_turn_until_done(pair, "q")
    assert computed == theirs == {"q": 32}


def _session_turn_until_done(pair: list[Any], request_id: str) -> None:
    for _ in range(12):
        outs = [s.schedule() for s in pair]
        assert block_digest(outs[1]) == block_digest(outs[0])
        for s, out in zip(pair, outs, strict=True):
            ids = list(out.num_scheduled_tokens)
            runner = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[8] for _ in ids],
            )
            s.update_from_output(out, runner)
        if request_id not in pair[0].requests:
            assert request_id not in pair[1].requests
            return
    raise AssertionError(f"{request_id} did not finish")


def test_an_embeddings_only_session_serves_its_first_chunk_and_refuses_the_next():
    # vLLM's _update_request_as_session asserts the session has prompt ids; the adapter
    # serves the first turn as vLLM does and refuses the next chunk by name.
    pair = _pair()
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    embeds = torch.randn(20, 4)
    _add(
        pair,
        lambda h: Request(
            "s", None, params, None, prompt_embeds=embeds, block_hasher=h, resumable=True
        ),
    )
    _session_turn(pair)
    ours = pair[1]
    chunk = Request(
        "s", [1, 2, 3], params, None, block_hasher=_BLOCK_HASHERS[id(ours)], resumable=True
    )
    with pytest.raises(InputError) as err:
        ours.add_request(chunk)
    assert err.value.field == "prompt_token_ids"
    assert ours.requests["s"].status == RequestStatus.WAITING_FOR_STREAMING_REQ


# ---- cache_salt: vLLM keys the first block by the salt (isolated prefix caches) -----------


def _salted(request_id: str, prompt: list[int], salt: str | None, max_tokens: int = 3) -> Any:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return lambda hasher: Request(
        request_id, list(prompt), params, None, cache_salt=salt, block_hasher=hasher
    )


def test_a_cache_salt_isolates_prefix_hits_as_vllms_first_block_key_does():
    # 40 tokens (2 full blocks of 16): b has a's salt and hits both blocks; c another salt
    # and d none hit nothing; e repeats d (no salt) and hits d's blocks.
    prompt = list(range(1, 41))
    pair = _pair()
    computed = _record_hits(pair[1])
    theirs = _record_hits(pair[0])
    arrivals = {
        0: [_salted("a", prompt, "tenant-1"), _salted("d", prompt, None)],
        8: [_salted("b", prompt, "tenant-1"), _salted("c", prompt, "tenant-2")],
        9: [_salted("e", prompt, None)],
    }
    _run(pair, arrivals, random.Random(4))
    assert computed == theirs == {"a": 0, "d": 0, "b": 32, "c": 0, "e": 32}


@pytest.mark.parametrize("seed", range(6))
def test_random_salted_streams_agree(seed: int):
    # Prompts from a few shared heads, each with a salt of two tenants or none, a tight
    # cache and chunked prefills: every step's hits and tables agree.
    rng = random.Random(seed)
    heads = [[rng.randint(1, 50) for _ in range(48)] for _ in range(2)]
    pair = _pair(num_blocks=24, max_num_batched_tokens=32)
    arrivals: dict[int, list[Any]] = {}
    for i in range(10):
        prompt = heads[rng.randrange(2)][: rng.randint(0, 48)]
        prompt += [rng.randint(1, 50) for _ in range(rng.randint(1, 20))]
        salt = rng.choice([None, "x", "y"])
        arrivals.setdefault(rng.randint(0, 30), []).append(
            _salted(f"s{i}", prompt, salt, max_tokens=rng.randint(1, 10))
        )
    assert len(_run(pair, arrivals, rng)) == 10


def test_a_salted_probe_of_the_kv_cache_manager_finds_what_vllms_finds():
    # kv_cache_manager.get_computed_blocks keys the probe as the request's blocks were
    # keyed: another salt, or none, finds nothing of a salted prompt; the same salt its
    # 2 full blocks.
    prompt = list(range(1, 41))
    pair = _pair()
    _run(pair, {0: [_salted("a", prompt, "tenant-1")]}, random.Random(5))
    found = []
    for s in pair:
        hasher = _BLOCK_HASHERS[id(s)]
        found.append(
            [
                s.kv_cache_manager.get_computed_blocks(_salted(f"p{salt}", prompt, salt)(hasher))[1]
                for salt in ("tenant-1", "tenant-2", None)
            ]
        )
    assert found[1] == found[0] == [32, 0, 0]
