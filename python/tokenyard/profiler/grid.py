"""The shapes ``tokenyard profile`` times: :class:`ProfileGrid` and its presets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenyard.errors import ConfigError

__all__ = ["GRIDS", "ProfileGrid"]


@dataclass(frozen=True)
class ProfileGrid:
    """The shapes to time. Shapes whose tensors would exceed the memory cap are skipped.

    ``num_tokens`` is for the GEMMs, elementwise ops, ``kv_store`` and the embedding /
    LM head (and, times hidden_size and the dtype's bytes, the all-reduce payloads).
    Prefill: every batch size x chunk size x cached-prefix length; decode: every batch size
    x context length.
    """

    num_tokens: tuple[int, ...]
    prefill_batch_sizes: tuple[int, ...]
    prefill_chunk_sizes: tuple[int, ...]
    prefill_context_lens: tuple[int, ...]
    decode_batch_sizes: tuple[int, ...]
    decode_context_lens: tuple[int, ...]

    @staticmethod
    def preset(name: str) -> ProfileGrid:
        """``tiny`` (seconds on a CPU with a small model; for tests) or ``default``."""
        if name not in GRIDS:
            raise ConfigError(
                f"--grid: unknown grid {name!r}; expected one of {', '.join(GRIDS)}",
                field="grid",
                value=repr(name),
            )
        return GRIDS[name]

    def __post_init__(self) -> None:
        for field in (
            "num_tokens",
            "prefill_batch_sizes",
            "prefill_chunk_sizes",
            "prefill_context_lens",
            "decode_batch_sizes",
            "decode_context_lens",
        ):
            values = getattr(self, field)
            low = 0 if field == "prefill_context_lens" else 1
            if any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
                raise ConfigError(
                    f"ProfileGrid.{field}: expected integers >= {low}, got {values!r}",
                    field=f"grid.{field}",
                    value=repr(values),
                )


def _powers_and_midpoints(high: int) -> tuple[int, ...]:
    out = {1}
    p = 1
    while p < high:
        out.update((p, p + p // 2) if p >= 2 else (p,))
        p *= 2
    out.add(high)
    return tuple(sorted(v for v in out if v <= high))


def _powers(low: int, high: int) -> tuple[int, ...]:
    return tuple(2**k for k in range(int(math.log2(low)), int(math.log2(high)) + 1))


GRIDS: dict[str, ProfileGrid] = {
    "tiny": ProfileGrid(
        num_tokens=(1, 8, 32),
        prefill_batch_sizes=(1, 2),
        prefill_chunk_sizes=(8,),
        prefill_context_lens=(0, 16),
        decode_batch_sizes=(1, 4),
        decode_context_lens=(16, 64),
    ),
    "default": ProfileGrid(
        num_tokens=_powers_and_midpoints(16384),
        prefill_batch_sizes=(1, 4),
        prefill_chunk_sizes=_powers(64, 8192),
        prefill_context_lens=(0, *_powers(512, 32768)),
        decode_batch_sizes=_powers(1, 512),
        decode_context_lens=_powers(128, 32768),
    ),
}
