"""Synthetic workloads: arrival processes, shared-prefix groups and the length
distributions of ``lengths.py``, generated chunk by chunk from one seed.

Requests are generated in fixed blocks of ``BLOCK`` requests, and block ``b`` of component
``c`` (arrivals, prompt lengths, output lengths, prefix membership, prefix group) draws from
its own ``Generator(PCG64(SeedSequence(seed, spawn_key=(c, b))))``, always ``BLOCK`` values.
Hence: the output does not depend on ``chunk_size``; the first N requests are the same
whatever ``num_requests``; changing one component leaves the others' draws unchanged.
Only one block (plus one output chunk) is held at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, final

import numpy as np

from tokenyard._checks import (
    check_choice,
    check_int,
    check_number,
    check_unset,
    field_error,
)
from tokenyard.workload.chunk import (
    DEFAULT_CHUNK_SIZE,
    F64,
    MAX_REQUESTS,
    U64,
    RequestChunk,
    check_chunk_size,
    rechunk,
)
from tokenyard.workload.images import ImageInputs
from tokenyard.workload.lengths import (
    I64,
    LENGTH_KINDS,
    MAX_REQUEST_TOKENS,
    MAX_ZIPF_SIZE,
    LengthDistribution,
    set_fields,
    zipf_ranks,
)

__all__ = [
    "ARRIVAL_KINDS",
    "LENGTH_KINDS",
    "SHARED_ID_BIT",
    "ArrivalProcess",
    "LengthDistribution",
    "SharedPrefix",
    "SyntheticWorkload",
]

ArrivalKind = Literal["poisson", "gamma", "constant", "bursty"]
ARRIVAL_KINDS: tuple[ArrivalKind, ...] = ("poisson", "gamma", "constant", "bursty")

BLOCK = 4096
"""Requests per generation block (fixed: changing it changes every workload)."""
SHARED_ID_BIT = 1 << 63
"""Set in every shared-prefix hash id, never in a request's own ids."""
#: Hash ids of all shared prefixes together.
MAX_PREFIX_IDS = 1 << 24

_ARRIVAL, _PROMPT, _OUTPUT, _SHARE, _GROUP, _IMAGE_SHARE, _IMAGE_COUNT = range(7)


@final
@dataclass(frozen=True, kw_only=True)
class ArrivalProcess:
    """When requests arrive. The first request arrives at 0.

    - ``"poisson"``: exponential gaps of mean ``1 / qps``.
    - ``"gamma"``: gamma gaps of mean ``1 / qps`` and coefficient of variation ``cv``
      (shape ``1 / cv**2``); ``cv=1`` draws exactly the ``"poisson"`` stream, ``cv > 1``
      is burstier, ``cv < 1`` more regular.
    - ``"constant"``: request ``i`` at ``i / qps``.
    - ``"bursty"``: a Poisson process whose rate is ``burst_qps`` for the first
      ``burst_duration_s`` of every ``burst_interval_s`` (from time 0) and ``qps`` (may be
      0) for the rest of it. Mean rate: see ``mean_qps``.

    Raises:
        ConfigError: an unknown kind, a rate or duration out of range, a field of another
            kind set, or a bursty field missing.
    """

    kind: ArrivalKind = "poisson"
    qps: float
    """Requests per second (for ``"bursty"``: between bursts)."""
    cv: float = 1.0
    """Gamma only: standard deviation / mean of the gaps."""
    burst_qps: float | None = None
    """Bursty only: the rate inside a burst."""
    burst_duration_s: float | None = None
    """Bursty only: how long each burst lasts (< ``burst_interval_s``)."""
    burst_interval_s: float | None = None
    """Bursty only: a burst starts every this many seconds."""

    def __post_init__(self) -> None:
        owner = "ArrivalProcess"
        check_choice(owner, "kind", self.kind, ARRIVAL_KINDS)
        bursty = ("burst_qps", "burst_duration_s", "burst_interval_s")
        if self.kind == "bursty":
            check_number(owner, "qps", self.qps, low=0.0)
            for name in bursty:
                if getattr(self, name) is None:
                    raise field_error(owner, name, "required when kind='bursty'", None)
                check_number(owner, name, getattr(self, name), low=0.0, low_open=True)
            duration, interval = self.burst_duration_s, self.burst_interval_s
            if duration is not None and interval is not None and duration >= interval:
                raise field_error(
                    owner,
                    "burst_duration_s",
                    f"must be < burst_interval_s={interval!r}, got {duration!r}",
                    duration,
                )
        else:
            check_number(owner, "qps", self.qps, low=0.0, low_open=True, high=1e9)
            for name in bursty:
                check_unset(owner, name, getattr(self, name), self.kind)
        if self.kind == "gamma":
            check_number(owner, "cv", self.cv, low=0.0, low_open=True, high=1e3)
        else:
            check_unset(owner, "cv", self.cv, self.kind, 1.0)

    @property
    def mean_qps(self) -> float:
        """The long-run arrival rate: ``qps``, or for ``"bursty"``
        ``(burst_qps * burst_duration_s + qps * (burst_interval_s - burst_duration_s))
        / burst_interval_s``."""
        if self.kind != "bursty":
            return float(self.qps)
        burst, duration, interval = _burst(self)
        return (burst * duration + self.qps * (interval - duration)) / interval

    def describe(self) -> dict[str, object]:
        """The fields that apply to this kind."""
        found = set_fields(self)
        if self.kind != "gamma":
            found.pop("cv")
        return found


@final
@dataclass(frozen=True, kw_only=True)
class SharedPrefix:
    """Shared system prompts: each request, with probability ``share_ratio``, starts with
    the ``prefix_tokens`` tokens of one of ``num_groups`` prompts (group ``g`` drawn with
    probability ``∝ (g + 1) ** -zipf_theta``; 0 = uniform). Such a request's prompt length is
    ``max(drawn length, prefix_tokens + 1)``, which may exceed the prompt's ``max_tokens``.

    Hash ids (``hash_block_size`` tokens each): the ``prefix_tokens // hash_block_size``
    full blocks of the shared prompt get ``SHARED_ID_BIT | group << 32 | block_index``; every
    other block (a partial prefix block included, and all blocks of unshared requests) gets
    an id of its own, counting up from 0 through the stream. So a prefix cache hits exactly
    the whole blocks of the shared prompt, and nothing else.

    Raises:
        ConfigError: a value out of range.
    """

    num_groups: int
    prefix_tokens: int
    share_ratio: float
    """Probability, in [0, 1], that a request uses a shared prompt."""
    zipf_theta: float = 0.0
    """Popularity skew of the groups; 0 = uniform."""
    hash_block_size: int = 16
    """Tokens per hash id."""

    def __post_init__(self) -> None:
        owner = "SharedPrefix"
        check_int(owner, "num_groups", self.num_groups, low=1, high=MAX_ZIPF_SIZE)
        check_int(owner, "prefix_tokens", self.prefix_tokens, low=1, high=MAX_REQUEST_TOKENS - 1)
        check_number(owner, "share_ratio", self.share_ratio, low=0.0, high=1.0)
        check_number(owner, "zipf_theta", self.zipf_theta, low=0.0, high=100.0)
        check_int(owner, "hash_block_size", self.hash_block_size, low=1, high=MAX_REQUEST_TOKENS)
        ids = self.num_groups * -(-self.prefix_tokens // self.hash_block_size)
        if ids > MAX_PREFIX_IDS:
            raise field_error(
                owner,
                "prefix_tokens",
                f"num_groups x prefix_tokens / hash_block_size = {ids} hash ids, more than "
                f"the {MAX_PREFIX_IDS} a workload holds; use fewer or shorter prefixes",
                self.prefix_tokens,
            )

    def describe(self) -> dict[str, object]:
        """Every field."""
        return set_fields(self)


@final
@dataclass(frozen=True, kw_only=True)
class SyntheticWorkload:
    """``num_requests`` requests drawn from ``arrival``, ``prompt_tokens``,
    ``output_tokens`` and optionally ``shared_prefix`` and ``images``, all from ``seed``.

    ``images`` (``ImageInputs``): a request's images add their vision tokens to its drawn
    prompt length, before the shared prefix (which then covers text only) is applied.

    Raises:
        ConfigError: a field of the wrong type or out of range.
    """

    num_requests: int
    arrival: ArrivalProcess
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    shared_prefix: SharedPrefix | None = None
    seed: int = 0
    images: ImageInputs | None = None

    def __post_init__(self) -> None:
        owner = "SyntheticWorkload"
        check_int(owner, "num_requests", self.num_requests, low=1, high=MAX_REQUESTS)
        check_int(owner, "seed", self.seed, low=0, high=2**64 - 1)
        for name, cls in (
            ("arrival", ArrivalProcess),
            ("prompt_tokens", LengthDistribution),
            ("output_tokens", LengthDistribution),
        ):
            if not isinstance(getattr(self, name), cls):
                value = getattr(self, name)
                raise field_error(
                    owner, name, f"must be a {cls.__name__}, got {type(value).__name__}", value
                )
        if self.shared_prefix is not None and not isinstance(self.shared_prefix, SharedPrefix):
            value = self.shared_prefix
            raise field_error(
                owner,
                "shared_prefix",
                f"must be a SharedPrefix or None, got {type(value).__name__}",
                value,
            )

        if self.images is not None and not isinstance(self.images, ImageInputs):
            value = self.images
            problem = f"must be an ImageInputs or None, got {type(value).__name__}"
            raise field_error(owner, "images", problem, value)

    @property
    def hash_block_size(self) -> int | None:
        """``shared_prefix.hash_block_size``, or ``None`` without shared prefixes."""
        return None if self.shared_prefix is None else self.shared_prefix.hash_block_size

    def chunks(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[RequestChunk]:
        """The requests in chunks of ``chunk_size`` (the last may be shorter); the same
        requests whatever ``chunk_size``.

        Raises:
            InputError: ``chunk_size`` is not an int >= 1.
        """
        return rechunk(self._blocks(), check_chunk_size(chunk_size))

    def describe(self) -> dict[str, object]:
        """The config as a mapping ``load_workload`` accepts (defaults filled in)."""
        found: dict[str, object] = {
            "kind": "synthetic",
            "num_requests": self.num_requests,
            "seed": self.seed,
            "arrival": self.arrival.describe(),
            "prompt_tokens": self.prompt_tokens.describe(),
            "output_tokens": self.output_tokens.describe(),
        }
        if self.shared_prefix is not None:
            found["shared_prefix"] = self.shared_prefix.describe()
        if self.images is not None:
            found["images"] = self.images.describe()
        return found

    def image_counts(self, block: int, size: int) -> I64:
        """Images of each of the ``size`` requests of block ``block`` (0 without images)."""
        if self.images is None:
            return np.zeros(size, dtype=np.int64)
        has = self._rng(_IMAGE_SHARE, block).random(BLOCK)[:size] < self.images.share
        counts = self.images.count._sampler()(self._rng(_IMAGE_COUNT, block), BLOCK)[:size]
        return np.where(has, counts, 0)

    def _rng(self, component: int, block: int) -> np.random.Generator:
        return np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(component, block)))
        )

    def _blocks(self) -> Iterator[RequestChunk]:
        arrivals = _Arrivals(self.arrival)
        draw_prompt = self.prompt_tokens._sampler()
        draw_output = self.output_tokens._sampler()
        prefix = None if self.shared_prefix is None else _PrefixIds(self.shared_prefix)
        vision_tokens = 0 if self.images is None else self.images.tokens()
        for block, start in enumerate(range(0, self.num_requests, BLOCK)):
            size = min(BLOCK, self.num_requests - start)
            arrived = arrivals.block(self._rng(_ARRIVAL, block), start, size)
            prompt = draw_prompt(self._rng(_PROMPT, block), BLOCK)[:size]
            output = draw_output(self._rng(_OUTPUT, block), BLOCK)[:size]
            if self.images is not None:
                prompt = prompt + self.image_counts(block, size) * vision_tokens
            offsets = ids = None
            if prefix is not None:
                prompt, offsets, ids = prefix.block(
                    self._rng(_SHARE, block), self._rng(_GROUP, block), prompt
                )
            yield RequestChunk(
                arrived, prompt.astype(np.uint32), output.astype(np.uint32), offsets, ids
            )


def _burst(process: ArrivalProcess) -> tuple[float, float, float]:
    return (
        float(process.burst_qps or 0.0),
        float(process.burst_duration_s or 0.0),
        float(process.burst_interval_s or 0.0),
    )


class _Arrivals:
    """Arrival times block after block; carries the clock (or, for bursty, the integrated
    rate) from one block to the next."""

    def __init__(self, process: ArrivalProcess):
        self.process = process
        self.carry = 0.0
        self.last = 0.0

    def block(self, rng: np.random.Generator, start: int, size: int) -> F64:
        p = self.process
        qps = float(p.qps)
        if p.kind == "constant":
            return np.arange(start, start + size, dtype=np.float64) / qps
        if p.kind == "gamma" and p.cv != 1.0:
            shape = 1.0 / float(p.cv) ** 2
            draws = rng.gamma(shape, 1.0 / (shape * qps), BLOCK)
        else:
            draws = rng.exponential(1.0 if p.kind == "bursty" else 1.0 / qps, BLOCK)
        steps = draws[:size]
        if start == 0:
            steps[0] = 0.0
        clock: F64 = self.carry + np.cumsum(steps)
        self.carry = float(clock[-1])
        if p.kind != "bursty":
            return clock
        times = self._invert_bursty(clock)
        self.last = float(times[-1])
        return times

    def _invert_bursty(self, integrated: F64) -> F64:
        """The times at which the integrated rate reaches ``integrated`` (a unit-rate
        Poisson clock mapped through the inverse of the piecewise-linear rate integral)."""
        burst, duration, interval = _burst(self.process)
        quiet = float(self.process.qps)
        per_burst = burst * duration
        per_cycle = per_burst + quiet * (interval - duration)
        cycle = np.floor(integrated / per_cycle)
        into = np.clip(integrated - cycle * per_cycle, 0.0, per_cycle)
        in_burst = into < per_burst
        times = np.full_like(integrated, interval)  # quiet=0: only rounding lands past a burst
        times[in_burst] = into[in_burst] / burst
        if quiet > 0:
            times[~in_burst] = duration + (into[~in_burst] - per_burst) / quiet
        times += cycle * interval
        np.maximum(times, self.last, out=times)
        return np.maximum.accumulate(times)


class _PrefixIds:
    """Shared-prefix membership, prompt lengths and hash ids, block after block; carries the
    next request-own id."""

    def __init__(self, prefix: SharedPrefix):
        self.prefix = prefix
        self.draw_group = zipf_ranks(prefix.num_groups, float(prefix.zipf_theta))
        self.next_own_id = 0

    def block(
        self, share_rng: np.random.Generator, group_rng: np.random.Generator, prompt: I64
    ) -> tuple[I64, U64, U64]:
        p = self.prefix
        size = len(prompt)
        shared = share_rng.random(BLOCK)[:size] < p.share_ratio
        group = self.draw_group(group_rng, BLOCK)[:size].astype(np.uint64)
        prompt = np.where(shared, np.maximum(prompt, p.prefix_tokens + 1), prompt)
        num_blocks = -(-prompt // p.hash_block_size)
        num_shared = np.where(shared, p.prefix_tokens // p.hash_block_size, 0)
        offsets = np.zeros(size + 1, dtype=np.uint64)
        np.cumsum(num_blocks, out=offsets[1:])
        owner = np.repeat(np.arange(size), num_blocks)
        index = np.arange(len(owner), dtype=np.int64) - offsets[:-1].astype(np.int64)[owner]
        in_prefix = index < num_shared[owner]
        ids = np.empty(len(owner), dtype=np.uint64)
        ids[in_prefix] = (
            np.uint64(SHARED_ID_BIT)
            | (group[owner[in_prefix]] << np.uint64(32))
            | index[in_prefix].astype(np.uint64)
        )
        num_own = len(owner) - int(np.count_nonzero(in_prefix))
        ids[~in_prefix] = np.arange(self.next_own_id, self.next_own_id + num_own, dtype=np.uint64)
        self.next_own_id += num_own
        return prompt, offsets, ids
