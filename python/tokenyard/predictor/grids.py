"""Tabulating operation times on the batch features the simulator computes.

The measured and calibrated predictors know an operation's time as a function of its
shape (a GEMM's rows; ``b`` prompts of ``s`` tokens over ``prefix`` cached ones; ``b``
decodes over ``k`` keys). The simulator sees a batch through a few features
(``compiled.FEATURES``), so each is tabulated on a geometric grid of those features, fine
enough (2^(1/4) apart) that Rust's linear interpolation between grid points stays within a
fraction of a percent of the smooth curve.

**Prefill attention** is tabulated over ``num_prefill_tokens`` (T) and
``prefill_mean_context`` (m, the keys a prefill query attends to on average). A batch of
``b`` whole prompts of ``s`` tokens has ``T = b s`` and ``m = (s + 1) / 2``; a single chunk of
``T`` tokens over ``p`` cached ones has ``m = p + (T + 1) / 2``. So a grid point with
``T >= 2m - 1`` is priced as ``T / (2m - 1)`` prompts of ``2m - 1`` tokens, and one with
``T < 2m - 1`` as one chunk of ``T`` tokens over ``p = m - (T + 1) / 2`` cached tokens. Both
readings agree where they meet (``T = 2m - 1``, ``p = 0``); a batch mixing chunks of different
prefixes is priced as its average.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tokenyard.predictor.compiled import TableCost

__all__ = ["decode_attention_table", "geometric", "prefill_attention_table", "token_table"]


def geometric(high: float, per_octave: int = 4, extra: Iterable[float] = ()) -> tuple[float, ...]:
    """``1, 2^(1/per_octave), ...`` up to ``high`` (and ``extra`` points), increasing."""
    points = set()
    i = 0
    while True:
        value = 2.0 ** (i / per_octave)
        points.add(value)
        if value >= high:
            break
        i += 1
    points.update(float(e) for e in extra if e >= 1.0)
    return tuple(sorted(points))


def token_table(
    feature: str, seconds: Callable[[float], float], high: float, extra: Iterable[float] = ()
) -> TableCost:
    """A one-feature table of ``seconds(x)`` for ``x`` = ``feature`` on a geometric grid."""
    xs = geometric(high, extra=extra)
    return TableCost(x=feature, xs=xs, values=tuple(seconds(x) for x in xs))


def prefill_shape(tokens: float, mean_context: float) -> tuple[float, float, float]:
    """``(batch, seq, prefix)`` of the prefill a grid point stands for (module docstring)."""
    seq = max(1.0, 2.0 * mean_context - 1.0)
    if tokens >= seq:
        return tokens / seq, seq, 0.0
    prefix = max(0.0, mean_context - (tokens + 1.0) / 2.0)
    return 1.0, tokens, prefix


def prefill_attention_table(
    seconds: Callable[[float, float, float], float],
    *,
    max_tokens: float = 2.0**20,
    max_context: float = 2.0**18,
) -> TableCost:
    """``seconds(batch, seq, prefix)`` tabulated over (prefill tokens, mean context)."""
    xs = geometric(max_tokens)
    ys = geometric(max_context)
    values = tuple(seconds(*prefill_shape(t, m)) for t in xs for m in ys)
    return TableCost(x="num_prefill_tokens", xs=xs, values=values, y="prefill_mean_context", ys=ys)


def decode_attention_table(
    seconds: Callable[[float, float], float],
    *,
    max_batch: float = 2.0**12,
    max_context: float = 2.0**18,
) -> TableCost:
    """``seconds(batch, keys per sequence)`` over (decode sequences, mean keys per
    sequence): a request verifying speculative drafts is one sequence."""
    xs = geometric(max_batch)
    ys = geometric(max_context)
    values = tuple(seconds(b, k) for b in xs for k in ys)
    return TableCost(x="decode_sequences", xs=xs, values=values, y="decode_mean_context", ys=ys)
