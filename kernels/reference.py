"""Plain-torch references for the kernels, written for clarity, not speed.

Same signatures and conventions as :mod:`tokenyard.kernels` (see its docstring): each
sequence's K/V is gathered through its block table into a contiguous ``[context, kv_heads,
head_dim]`` tensor, KV heads are repeated for GQA, and softmax runs in float32 with an
explicit causal mask. Loops over sequences are in Python. Inputs are not validated.
"""

from __future__ import annotations

import torch

__all__ = ["gather_kv", "paged_decode_attention", "paged_prefill_attention", "store_kv"]


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key[t]``/``value[t]`` at slot ``slot_mapping[t]``; negative slots are skipped."""
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache[slots // block_size, slots % block_size] = key[keep]
    v_cache[slots // block_size, slots % block_size] = value[keep]


def gather_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, context_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's first ``context_len`` keys and values, ``[context_len, kv_heads, dim]``."""
    block_size = k_cache.shape[1]
    positions = torch.arange(context_len, device=k_cache.device)
    blocks = block_table[positions // block_size].long()
    offsets = positions % block_size
    return k_cache[blocks, offsets], v_cache[blocks, offsets]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention in float32; query row i sees keys ``0..positions[i]``.

    q: ``[q_len, heads, dim]``; k, v: ``[context, kv_heads, dim]``.
    """
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    keys = torch.arange(k.shape[0], device=q.device)
    causal = keys[None, :] <= positions[:, None]
    scores = scores.masked_fill(~causal[None, :, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference of :func:`tokenyard.kernels.paged_decode_attention`."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    result = torch.zeros_like(query) if out is None else out
    for s, context_len in enumerate(context_lens.tolist()):
        if context_len == 0:
            result[s] = 0
            continue
        k, v = gather_kv(k_cache, v_cache, block_tables[s], context_len)
        position = torch.tensor([context_len - 1], device=query.device)
        result[s] = _attend(query[s : s + 1], k, v, position, scale)[0].to(query.dtype)
    return result


def paged_prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference of :func:`tokenyard.kernels.paged_prefill_attention`."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    result = torch.zeros_like(query) if out is None else out
    starts = query_start_loc.tolist()
    for s, seq_len in enumerate(seq_lens.tolist()):
        q = query[starts[s] : starts[s + 1]]
        q_len = q.shape[0]
        if q_len == 0:
            continue
        k, v = gather_kv(k_cache, v_cache, block_tables[s], seq_len)
        positions = torch.arange(seq_len - q_len, seq_len, device=query.device)
        result[starts[s] : starts[s + 1]] = _attend(q, k, v, positions, scale).to(query.dtype)
    return result
