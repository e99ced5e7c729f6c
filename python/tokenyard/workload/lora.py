"""LoRA adapters for any workload: ``[workload.lora]`` gives each request an adapter drawn
from a popularity model (``docs/lora.md``).

One uniform draw per request, in request order from one seeded generator, picks the base
model (below ``base_fraction``) or an adapter (inverse CDF of the popularity), so the
adapters do not depend on the chunk size and a seed reproduces them exactly. A turn of a
session (``RequestChunk.session_ids``) takes its session's draw instead, a hash of the seed
and the session id: a conversation keeps its adapter, and so its prefix-cache hits (an
adapter's KV is its own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from tokenyard._checks import check_choice, check_int, check_number, check_unset
from tokenyard.workload.chunk import DEFAULT_CHUNK_SIZE, NO_SESSION, RequestChunk, Workload

__all__ = ["POPULARITIES", "LoraPopularity", "LoraWorkload"]

POPULARITIES = ("uniform", "zipf")
#: Adapters a popularity model may name (vLLM serves thousands from disk at most).
MAX_ADAPTERS = 1 << 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraPopularity:
    """Which adapter each request runs with.

    ``num_adapters`` adapters (ids ``0 .. num_adapters - 1``); ``popularity`` ``uniform``
    or ``zipf`` (adapter ``k`` drawn with weight ``1 / (k + 1) ** zipf_exponent``);
    ``base_fraction`` of the requests run on the base model (no adapter).
    """

    num_adapters: int
    popularity: str = "uniform"
    zipf_exponent: float = 1.0
    base_fraction: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        owner = "LoraPopularity"
        check_int(owner, "num_adapters", self.num_adapters, low=1, high=MAX_ADAPTERS)
        check_choice(owner, "popularity", self.popularity, POPULARITIES)
        check_number(owner, "zipf_exponent", self.zipf_exponent, low=0.0, high=10.0)
        check_number(owner, "base_fraction", self.base_fraction, low=0.0, high=1.0)
        check_int(owner, "seed", self.seed, low=0, high=2**64 - 1)
        if self.popularity != "zipf":
            check_unset(owner, "zipf_exponent", self.zipf_exponent, self.popularity, 1.0)

    def cdf(self) -> np.ndarray:
        """Cumulative probabilities of the adapters, the last exactly 1."""
        ranks = np.arange(1, self.num_adapters + 1, dtype=np.float64)
        exponent = self.zipf_exponent if self.popularity == "zipf" else 0.0
        weights = ranks**-exponent
        cdf = np.cumsum(weights / weights.sum())
        cdf[-1] = 1.0
        return cdf

    def assign(self, uniforms: np.ndarray, cdf: np.ndarray) -> np.ndarray:
        """Adapter ids (-1: base model) of uniform draws in [0, 1)."""
        base = uniforms < self.base_fraction
        rest = 1.0 - self.base_fraction
        scaled = (uniforms - self.base_fraction) / rest if rest > 0 else uniforms
        ids = np.searchsorted(cdf, scaled, side="right").astype(np.int64)
        np.minimum(ids, self.num_adapters - 1, out=ids)
        ids[base] = -1
        return ids


@dataclasses.dataclass(frozen=True)
class LoraWorkload:
    """``inner``'s requests, each with an adapter from ``lora`` (its own ids are replaced)."""

    inner: Workload
    lora: LoraPopularity

    @property
    def hash_block_size(self) -> int | None:
        return self.inner.hash_block_size

    def chunks(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[RequestChunk]:
        rng = np.random.Generator(np.random.PCG64(self.lora.seed))
        cdf = self.lora.cdf()
        for chunk in self.inner.chunks(chunk_size):
            uniforms = rng.random(len(chunk))
            if chunk.session_ids is not None:
                turns = chunk.session_ids != np.uint64(NO_SESSION)
                uniforms[turns] = _session_uniforms(chunk.session_ids[turns], self.lora.seed)
            ids = self.lora.assign(uniforms, cdf)
            yield dataclasses.replace(chunk, lora_ids=ids)

    def describe(self) -> dict[str, object]:
        return {**self.inner.describe(), "lora": dataclasses.asdict(self.lora)}


def _session_uniforms(sessions: np.ndarray, seed: int) -> npt.NDArray[np.float64]:
    """A uniform in [0, 1) per session id, from the seed (splitmix64's finalizer)."""
    z: npt.NDArray[np.uint64] = sessions.astype(np.uint64) ^ np.uint64(seed & (2**64 - 1))
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    uniforms: npt.NDArray[np.float64] = (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return uniforms
