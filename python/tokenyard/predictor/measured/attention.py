"""Measured GQA attention, full or windowed (sliding, chunked): prefill chunks and decodes
from the ``attention`` tables at one TP worker's head layout and KV dtype."""

from __future__ import annotations

import math
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
    """Prefill and decode attention. A sliding layer (``window`` > 0) takes the rows
    measured at ``window_size = window`` for its layout (gpt-oss's 128, Gemma's 1024);
    where the tables lack that window, the full-attention rows at the work the window
    leaves (keys capped, pairs scaled: ``roofline.window_pairs``), said so in the label.
    A chunked layer (``chunked``, Llama 4's chunk of 8192) is priced at the chunk-local
    shapes it runs (``_chunked_attention_ops``)."""
    if window and chunked:
        return _chunked_attention_ops(source, s, kv_dtype, window)
    if window:
        return _windowed_attention_ops(source, s, kv_dtype, window)
    return _full_attention_ops(source, s, kv_dtype)


def chunk_pieces(seq: float, prefix: float, chunk: float) -> list[tuple[float, float, float]]:
    """``(copies, seq, prefix)`` of the virtual requests that a prefill chunk of ``seq``
    tokens after ``prefix`` cached ones becomes under chunked local attention of ``chunk``
    tokens (vLLM 0.33's ``make_local_attention_virtual_batches``,
    ``v1/attention/backends/utils.py``): the rest of the prefix's chunk over that chunk's
    cached part, then whole chunks, then the remainder, each attending only its own
    chunk's keys."""
    start = math.fmod(prefix, chunk)
    first = min(chunk - start, seq)
    pieces = [(1.0, first, start)]
    rest = seq - first
    whole = math.floor(rest / chunk + 1e-9)
    if whole >= 1:
        pieces.append((float(whole), chunk, 0.0))
    tail = rest - whole * chunk
    if tail > 1e-9:
        pieces.append((1.0, tail, 0.0))
    return pieces


def _chunked_attention_ops(
    source: MeasuredSource, s: Shapes, kv_dtype: str, chunk: int
) -> dict[str, Entry]:
    """Chunked local attention priced as what it runs: a prefill chunk as the virtual
    requests vLLM makes of it (``chunk_pieces``), a decode over the keys of its own chunk
    (``roofline.window_keys``: all of them within the first chunk, half a chunk on average
    past it, the mean over a batch at spread positions). Each piece's keys stay within one
    chunk, so the rows at ``window_size = chunk`` (a window that never binds there) price
    it where measured, the full-attention rows otherwise. aiconfigurator 0.12 instead
    prices Llama 4's local layers as a sliding window of the chunk
    (``sdk/utils.py``: ``sliding_window_size = attention_chunk_size``), up to twice the
    keys past the first chunk."""
    folder = source.folders["attention"]
    try:
        context, generation = _attention_times(source, s, kv_dtype, chunk)
        rows = f"window_size {chunk} rows"
    except NotMeasured:
        context, generation = _full_attention_times(source, s, kv_dtype)
        rows = f"full-attention rows (window_size {chunk} not measured for this layout)"
    piece = prefill_seconds(context)

    def prefill(batch: float, seq: float, prefix: float) -> float:
        return sum(piece(batch * n, c, p) for n, c, p in chunk_pieces(seq, prefix, chunk))

    def decode(batch: float, keys: float) -> float:
        return float(generation(batch, window_keys(keys, chunk, True)))

    label = f"measured:attention ({folder.name}) {rows} at {chunk}-token chunk-local shapes"
    return _attention_tables(prefill, decode, label)


def _windowed_attention_ops(
    source: MeasuredSource, s: Shapes, kv_dtype: str, window: int
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
        return whole * window_pairs(seq, prefix, window) / max(full_pairs, 1.0)

    def decode(batch: float, keys: float) -> float:
        return float(generation(batch, window_keys(keys, window)))

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
