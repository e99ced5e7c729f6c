"""Measured GQA attention, full or windowed (sliding, chunked): prefill chunks and decodes
from the ``attention`` tables at one TP worker's head layout and KV dtype."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenyard.errors import ConfigError
from tokenyard.predictor import grids
from tokenyard.predictor.measured.data import MeasuredSource
from tokenyard.predictor.measured.lookup import Entry, Shapes, prefill_seconds, read, table_dtype
from tokenyard.predictor.measured.ops import AttentionTimes, NotMeasured
from tokenyard.predictor.roofline import window_keys, window_pairs


def attention_ops(
    source: MeasuredSource, s: Shapes, kv_dtype: str, window: int = 0, chunked: bool = False
) -> dict[str, Entry]:
    """Prefill and decode attention. A windowed layer (``window`` > 0) takes the rows
    measured at ``window_size = window`` for its layout (gpt-oss's 128, Gemma's 1024,
    Llama 4's chunk of 8192, which aiconfigurator maps to ``sliding_window_size``); where
    the tables lack that window, the full-attention rows at the work the window leaves
    (keys capped, pairs scaled: ``roofline.window_pairs``), said so in the label."""
    if window:
        return _windowed_attention_ops(source, s, kv_dtype, window, chunked)
    return _full_attention_ops(source, s, kv_dtype)


def _windowed_attention_ops(
    source: MeasuredSource, s: Shapes, kv_dtype: str, window: int, chunked: bool
) -> dict[str, Entry]:
    folder = source.folders["attention"]
    try:
        context, generation = _attention_times(source, s, kv_dtype, window)
        label = f"measured:attention window_size {window} ({folder.name})"
        return _attention_tables(prefill_seconds(context), generation, label)
    except NotMeasured:
        pass
    context, generation = _full_attention_times(source, s, kv_dtype)
    full = prefill_seconds(context)

    def prefill(batch: float, seq: float, prefix: float) -> float:
        whole = full(batch, seq, prefix)
        full_pairs = window_pairs(seq, prefix, 0)
        return whole * window_pairs(seq, prefix, window, chunked) / max(full_pairs, 1.0)

    def decode(batch: float, keys: float) -> float:
        return float(generation(batch, window_keys(keys, window, chunked)))

    label = (
        f"measured:attention ({folder.name}) full-attention rows at the work of a "
        f"{window}-token window (window_size {window} not measured for this layout)"
    )
    return _attention_tables(prefill, decode, label)


def _full_attention_ops(source: MeasuredSource, s: Shapes, kv_dtype: str) -> dict[str, Entry]:
    context, generation = _full_attention_times(source, s, kv_dtype)
    label = f"measured:attention ({source.folders['attention'].name})"
    return _attention_tables(prefill_seconds(context), generation, label)


def _full_attention_times(
    source: MeasuredSource, s: Shapes, kv_dtype: str
) -> tuple[AttentionTimes, AttentionTimes]:
    """The full-attention rows of the layout, refused where the tables lack it."""
    try:
        return _attention_times(source, s, kv_dtype)
    except NotMeasured as exc:
        raise ConfigError(
            f"replica.model: the measured attention tables do not cover its layout per GPU "
            f"({s.q_heads} heads, {s.kv_heads} KV heads, head_dim {s.head_dim}): {exc}",
            field="replica.model",
            value=repr((s.q_heads, s.kv_heads, s.head_dim)),
        ) from None


def _attention_times(
    source: MeasuredSource, s: Shapes, kv_dtype: str, window: int = 0
) -> tuple[AttentionTimes, AttentionTimes]:
    """(context, generation) attention at the layout per GPU and ``window_size``.

    Raises:
        NotMeasured: a table lacks the layout or the window.
    """
    folder = source.folders["attention"]
    context_rows = read(source, folder / "context_attention_perf.parquet")
    generation_rows = read(source, folder / "generation_attention_perf.parquet")
    kv_name = table_dtype(kv_dtype, "replica.kv_cache_dtype", context_rows.values("kv_cache_dtype"))
    layout: dict[str, Any] = dict(
        num_heads=s.q_heads,
        num_kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        kv_cache_dtype=kv_name,
        window_size=window,
    )
    context = AttentionTimes(context_rows, generation=False, **layout)
    generation = AttentionTimes(generation_rows, generation=True, **layout)
    return context, generation


def _attention_tables(
    prefill: Callable[[float, float, float], float],
    decode: Callable[[float, float], float],
    label: str,
) -> dict[str, Entry]:
    return {
        "attn_prefill": (grids.prefill_attention_table(prefill), label, ""),
        "attn_decode": (grids.decode_attention_table(decode), label, ""),
    }
