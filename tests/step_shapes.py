"""Step shapes (``batch_features``) for the predictor tests: one prompt, or a batch of
decodes."""

from __future__ import annotations

from tokenyard.predictor import batch_features


def prompt(tokens: int, cached: int = 0) -> dict[str, float]:
    """One prompt of ``tokens`` tokens after ``cached`` prefix tokens."""
    return batch_features(
        num_requests=1,
        num_prefill_tokens=tokens,
        num_decode_tokens=0,
        sum_decode_context=0,
        sum_prefill_context=tokens * (cached + tokens),
        sum_prefill_squared=tokens * tokens,
        num_padding_rows=0,
    )


def decodes(batch: int, context: int) -> dict[str, float]:
    """``batch`` decodes, each over ``context`` tokens already in its cache."""
    return batch_features(
        num_requests=batch,
        num_prefill_tokens=0,
        num_decode_tokens=batch,
        sum_decode_context=batch * context,
        sum_prefill_context=0,
        sum_prefill_squared=0,
        num_padding_rows=0,
    )


def decodes_over(batch: int, keys: int) -> dict[str, float]:
    """``batch`` decodes, each attending ``keys`` keys (its new token's among them)."""
    return decodes(batch, keys - 1)
