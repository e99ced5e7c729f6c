"""Conversations and agents (``SessionWorkload``) and closed-loop load (``ClosedLoop``).

A session is a chain of turns. Turn ``k + 1`` is sent a think time after turn ``k``
completes, and its prompt is turn ``k``'s prompt, turn ``k``'s output and new input, so the
shared prefix is real: a session's hash ids are one run of ids over its whole conversation,
and each turn carries the ids covering its prompt *and* its output (the simulator then
generates that output as the tokens the next turn's prompt repeats).

The stream lists sessions in order of their start, each session's turns together; every turn
of a session carries the session's start time as ``arrived_at`` (a lower bound: the simulator
sends it when the previous turn completes plus its ``delay_s``).

Sessions are generated in blocks of ``BLOCK`` sessions; block ``b`` of component ``c`` draws
from its own ``Generator(PCG64(SeedSequence(seed, spawn_key=(c, b))))``, so the output does
not depend on ``chunk_size`` and changing one component leaves the others' draws unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, final

import numpy as np

from tokenyard._checks import check_choice, check_int, check_number, field_error
from tokenyard.errors import InputError
from tokenyard.workload.chunk import (
    DEFAULT_CHUNK_SIZE,
    MAX_REQUESTS,
    NO_SESSION,
    RequestChunk,
    Workload,
    check_chunk_size,
    rechunk,
)
from tokenyard.workload.lengths import MAX_REQUEST_TOKENS, LengthDistribution
from tokenyard.workload.synthetic import BLOCK, ArrivalProcess, _Arrivals

__all__ = ["THINK_KINDS", "ClosedLoop", "SessionWorkload", "ThinkTime"]

ThinkKind = Literal["fixed", "exponential", "lognormal"]
THINK_KINDS: tuple[ThinkKind, ...] = ("fixed", "exponential", "lognormal")
#: Longest think time a distribution draws (a day): keeps a heavy tail finite.
MAX_THINK_S = 86400.0

_ARRIVAL, _TURNS, _FIRST, _INPUT, _OUTPUT, _THINK = range(6)
_THINK_PARAMS = {
    "fixed": ("value_s",),
    "exponential": ("mean_s",),
    "lognormal": ("median_s", "sigma"),
}


@final
@dataclass(frozen=True, kw_only=True)
class ThinkTime:
    """The time a user (or an agent's tool call) takes before the next turn, in seconds:
    ``fixed`` (``value_s``), ``exponential`` (``mean_s``) or ``lognormal`` (``median_s``,
    ``sigma``); draws are capped at a day.

    Raises:
        ConfigError: an unknown kind, a parameter missing for the kind, given for another
            kind, or out of range.
    """

    kind: ThinkKind = "fixed"
    value_s: float | None = None
    mean_s: float | None = None
    median_s: float | None = None
    sigma: float | None = None

    def __post_init__(self) -> None:
        owner = "ThinkTime"
        check_choice(owner, "kind", self.kind, THINK_KINDS)
        wanted = _THINK_PARAMS[self.kind]
        for name in ("value_s", "mean_s", "median_s", "sigma"):
            value = getattr(self, name)
            if name in wanted and value is None:
                raise field_error(owner, name, f"is required for kind={self.kind!r}", None)
            if name not in wanted and value is not None:
                raise field_error(owner, name, f"does not apply to kind={self.kind!r}", value)
        if self.value_s is not None:
            check_number(owner, "value_s", self.value_s, low=0.0, high=MAX_THINK_S)
        for name in ("mean_s", "median_s"):
            if getattr(self, name) is not None:
                check_number(owner, name, getattr(self, name), low=0.0, high=MAX_THINK_S)
        if self.sigma is not None:
            check_number(owner, "sigma", self.sigma, low=0.0, high=10.0)

    def describe(self) -> dict[str, object]:
        """The kind and its parameters."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` think times (float64, seconds)."""
        if self.kind == "fixed":
            return np.full(n, float(self.value_s or 0.0))
        if self.kind == "exponential":
            values = rng.exponential(float(self.mean_s or 0.0), n)
        else:
            log_median = math.log(max(float(self.median_s or 0.0), 1e-12))
            logs = np.minimum(
                log_median + float(self.sigma or 0.0) * rng.standard_normal(n),
                math.log(MAX_THINK_S),
            )
            values = np.exp(logs) if self.median_s else np.zeros(n)
        return np.minimum(values, MAX_THINK_S)


@final
@dataclass(frozen=True, kw_only=True)
class SessionWorkload:
    """``num_sessions`` conversations (or agent runs), all from ``seed``.

    Session ``s`` starts at the ``s``-th time of ``arrival`` (all at 0 without one: closed-loop
    load then decides when each starts) and has ``turns`` turns. Turn 1's prompt has
    ``first_prompt_tokens`` tokens; turn ``k + 1``'s prompt is turn ``k``'s prompt and output
    plus ``input_tokens`` new tokens; each turn writes ``output_tokens`` tokens. Turn
    ``k + 1`` is sent ``think_time`` after turn ``k`` completes. A session ends early when a
    turn's prompt and output would pass ``max_context_tokens`` (a model's context window); a
    session whose first turn does not fit is left out (an ``InputError`` if none fits).

    Raises:
        ConfigError: a field of the wrong type or out of range.
    """

    num_sessions: int
    turns: LengthDistribution
    first_prompt_tokens: LengthDistribution
    input_tokens: LengthDistribution
    output_tokens: LengthDistribution
    think_time: ThinkTime
    arrival: ArrivalProcess | None = None
    max_context_tokens: int | None = None
    """Default: no cap beyond the simulator's own."""
    hash_block_size: int = 16
    """Tokens per hash id of the conversation."""
    seed: int = 0

    def __post_init__(self) -> None:
        owner = "SessionWorkload"
        check_int(owner, "num_sessions", self.num_sessions, low=1, high=MAX_REQUESTS)
        check_int(owner, "seed", self.seed, low=0, high=2**64 - 1)
        check_int(owner, "hash_block_size", self.hash_block_size, low=1, high=MAX_REQUEST_TOKENS)
        if self.max_context_tokens is not None:
            check_int(owner, "max_context_tokens", self.max_context_tokens, low=2)
        parts = {
            "turns": LengthDistribution,
            "first_prompt_tokens": LengthDistribution,
            "input_tokens": LengthDistribution,
            "output_tokens": LengthDistribution,
            "think_time": ThinkTime,
        }
        for name, cls in parts.items():
            value = getattr(self, name)
            if not isinstance(value, cls):
                raise field_error(
                    owner, name, f"must be a {cls.__name__}, got {type(value).__name__}", value
                )
        if self.arrival is not None and not isinstance(self.arrival, ArrivalProcess):
            raise field_error(
                owner,
                "arrival",
                f"must be an ArrivalProcess or None, got {type(self.arrival).__name__}",
                self.arrival,
            )

    def chunks(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[RequestChunk]:
        """Every turn of every session, sessions in start order, in chunks of
        ``chunk_size`` (the last may be shorter); the same turns whatever ``chunk_size``.

        Raises:
            InputError: ``chunk_size`` is not an int >= 1.
        """
        return rechunk(self._blocks(), check_chunk_size(chunk_size))

    def describe(self) -> dict[str, object]:
        """The config as a mapping ``load_workload`` accepts (defaults filled in)."""
        found: dict[str, object] = {
            "kind": "sessions",
            "num_sessions": self.num_sessions,
            "seed": self.seed,
            "hash_block_size": self.hash_block_size,
            "turns": self.turns.describe(),
            "first_prompt_tokens": self.first_prompt_tokens.describe(),
            "input_tokens": self.input_tokens.describe(),
            "output_tokens": self.output_tokens.describe(),
            "think_time": self.think_time.describe(),
        }
        if self.arrival is not None:
            found["arrival"] = self.arrival.describe()
        if self.max_context_tokens is not None:
            found["max_context_tokens"] = self.max_context_tokens
        return found

    def _rng(self, component: int, block: int) -> np.random.Generator:
        return np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(component, block)))
        )

    def _blocks(self) -> Iterator[RequestChunk]:
        arrivals = None if self.arrival is None else _Arrivals(self.arrival)
        next_id = kept = 0
        for block, start in enumerate(range(0, self.num_sessions, BLOCK)):
            size = min(BLOCK, self.num_sessions - start)
            starts = (
                np.zeros(size)
                if arrivals is None
                else arrivals.block(self._rng(_ARRIVAL, block), start, size)
            )
            turns = self.turns._sampler()(self._rng(_TURNS, block), BLOCK)[:size]
            chunk, next_id = self._block(block, start, starts, turns, next_id)
            kept += len(chunk)
            yield chunk
        if kept == 0:
            raise InputError(
                f"workload.max_context_tokens: no session's first turn (prompt + output) "
                f"fits in {self.max_context_tokens} tokens, so the workload is empty",
                field="max_context_tokens",
                value=repr(self.max_context_tokens),
            )

    def _block(
        self, block: int, start: int, starts: np.ndarray, turns: np.ndarray, next_id: int
    ) -> tuple[RequestChunk, int]:
        """The turns of sessions ``start .. start + len(starts)``; returns the next free id."""
        total = int(turns.sum())
        first = self.first_prompt_tokens._sampler()(self._rng(_FIRST, block), BLOCK)
        inputs = self.input_tokens._sampler()(self._rng(_INPUT, block), total)
        outputs = self.output_tokens._sampler()(self._rng(_OUTPUT, block), total)
        thinks = self.think_time.draw(self._rng(_THINK, block), total)
        cap = MAX_REQUEST_TOKENS if self.max_context_tokens is None else self.max_context_tokens
        b = self.hash_block_size
        rows: dict[str, list[float | int]] = {k: [] for k in ("at", "p", "d", "s", "delay")}
        offsets: list[int] = [0]
        ids: list[int] = []
        row = 0
        for s, num_turns in enumerate(turns.tolist()):
            prompt = int(first[s])
            for k in range(num_turns):
                if k:
                    prompt += int(inputs[row + k])
                output = int(outputs[row + k])
                if prompt + output > cap:
                    break
                rows["at"].append(float(starts[s]))
                rows["p"].append(prompt)
                rows["d"].append(output)
                rows["s"].append(start + s)
                rows["delay"].append(float(thinks[row + k]))
                # The conversation's ids are one run; this turn covers prompt + output.
                num_ids = -(-(prompt + output) // b)
                ids.extend(range(next_id, next_id + num_ids))
                offsets.append(len(ids))
                prompt += output
            next_id += -(-prompt // b)
            row += num_turns
        chunk = RequestChunk(
            np.asarray(rows["at"], dtype=np.float64),
            np.asarray(rows["p"], dtype=np.uint32),
            np.asarray(rows["d"], dtype=np.uint32),
            np.asarray(offsets, dtype=np.uint64),
            np.asarray(ids, dtype=np.uint64),
            np.asarray(rows["s"], dtype=np.uint64),
            np.asarray(rows["delay"], dtype=np.float64),
        )
        return chunk, next_id


@final
class ClosedLoop:
    """Closed-loop load over ``workload``: ``concurrency`` users each send the next session
    (or request) when their previous one has completed, after a ``think_time``; at most
    ``concurrency`` are in flight, as serving benchmark tools drive a server
    (``--max-concurrency``). The stream's arrival times are lower bounds (with a Poisson
    ``arrival`` this is vLLM's benchmark with both a rate and a concurrency cap).

    ``think_time`` sets the pause before each request on its own or each session's first
    turn (a session keeps its own think times between turns); ``None`` keeps the workload's
    (0 for requests without sessions). Draws come from ``seed`` (default 0), which is
    refused without a ``think_time``: it would draw nothing.

    Raises:
        ConfigError: ``concurrency`` < 1, a bad ``think_time``, or a ``seed`` without one.
    """

    def __init__(
        self,
        workload: Workload,
        *,
        concurrency: int,
        think_time: ThinkTime | None = None,
        seed: int | None = None,
    ) -> None:
        check_int("ClosedLoop", "concurrency", concurrency, low=1, high=MAX_REQUESTS)
        if seed is not None:
            check_int("ClosedLoop", "seed", seed, low=0, high=2**64 - 1)
            if think_time is None:
                raise field_error(
                    "ClosedLoop", "seed", "draws think times: give a think_time or no seed", seed
                )
        if think_time is not None and not isinstance(think_time, ThinkTime):
            raise field_error(
                "ClosedLoop",
                "think_time",
                f"must be a ThinkTime or None, got {type(think_time).__name__}",
                think_time,
            )
        self.workload = workload
        self.concurrency = concurrency
        self.think_time = think_time
        self.seed = 0 if seed is None else seed

    @property
    def hash_block_size(self) -> int | None:
        return self.workload.hash_block_size

    def chunks(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[RequestChunk]:
        """The workload's chunks, with think times set on the leads."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed)))
        previous: int | None = None  # the session of the last request of the chunk before
        for chunk in self.workload.chunks(chunk_size):
            yield self._with_thinks(chunk, rng, previous)
            if len(chunk) and chunk.session_ids is not None:
                previous = int(chunk.session_ids[-1])

    def _with_thinks(
        self, chunk: RequestChunk, rng: np.random.Generator, previous: int | None
    ) -> RequestChunk:
        if self.think_time is None:
            return chunk  # the workload's own think times (none: requests on their own)
        n = len(chunk)
        sessions = chunk.session_ids
        delays = chunk.delay_s
        if sessions is None or delays is None:
            sessions = np.full(n, NO_SESSION, dtype=np.uint64)
            delays = np.zeros(n)
        # Leads: requests on their own, and turns starting a session (a different id
        # from the request before; a session's turns are consecutive under closed loop).
        lead = sessions == np.uint64(NO_SESSION)
        if n:
            starts = np.ones(n, dtype=bool)
            starts[1:] = sessions[1:] != sessions[:-1]
            # A session carried over from the chunk before does not start here.
            starts[0] = previous is None or int(sessions[0]) != previous
            lead |= starts
        delays = delays.copy()
        draws = self.think_time.draw(rng, n)
        delays[lead] = draws[lead]
        return dataclasses.replace(chunk, session_ids=sessions, delay_s=delays)

    def describe(self) -> dict[str, object]:
        """The wrapped workload's description with a ``closed_loop`` table."""
        found = dict(self.workload.describe())
        loop: dict[str, object] = {"concurrency": self.concurrency}
        if self.think_time is not None:
            loop["think_time"] = self.think_time.describe()
            loop["seed"] = self.seed
        found["closed_loop"] = loop
        return found
