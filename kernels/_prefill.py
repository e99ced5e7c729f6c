"""``paged_prefill_attention``: ragged chunks of new tokens, causal over the paged context.

Sequence ``s`` brings ``q_len = query_start_loc[s+1] - query_start_loc[s]`` new tokens and
has ``seq_len`` tokens in all, so its query ``i`` sits at position ``seq_len - q_len + i``
and attends to keys ``0..position``; the first ``seq_len - q_len`` keys are the cached
prefix (earlier chunks or a prefix-cache hit), all read through the block table.

One program handles ``BLOCK_M`` queries of one sequence for one query head. Query tiles
are numbered without reading ``query_start_loc`` on the host: sequence ``s`` owns program
tiles ``query_start_loc[s] // BLOCK_M + s + j`` for ``j < cdiv(q_len, BLOCK_M)``. These
ranges are disjoint, increase with ``s``, and end below ``num_tokens // BLOCK_M +
num_seqs``, so each program finds its sequence by a binary search and a program landing
in a gap writes nothing. Keys before the tile's first position need no causal mask; only
the last few key tiles are masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]

from tokenyard.kernels._common import (
    FLOAT_DTYPES,
    INTERPRET,
    LOG2E,
    check_cache,
    check_device,
    check_dim,
    check_out,
    check_query_heads,
    check_same_dtype,
    check_tensor,
    dot_fp32,
    next_pow2,
    on_device,
    resolve_scale,
)

_M_INIT = tl.constexpr(-1.0e30)  # see _decode.py


@dataclass(frozen=True)
class PrefillConfig:
    """Launch parameters of the prefill kernel (see ``GPU_CONFIG`` for the H100 tuning)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def prefill_config(dtype: torch.dtype, head_dim: int) -> PrefillConfig:
    if INTERPRET:
        # Small tiles, so small test shapes cross tile boundaries.
        return PrefillConfig(block_m=16, block_n=16, num_warps=1, num_stages=1)
    if dtype == torch.float32 or head_dim > 128:
        return PrefillConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    return GPU_CONFIG


# H100 sweep (benches/kernels_gpu.py --sweep, bf16, head_dim 128): 128x32 tiles with 4 warps
# and 3 stages beat 128x64 with 8 warps by 6-16% on 512- and 2048-token chunks.
GPU_CONFIG = PrefillConfig(block_m=128, block_n=32, num_warps=4, num_stages=3)


@triton.jit  # type: ignore[untyped-decorator]
def _attend_key_tile(  # type: ignore[no-untyped-def]
    acc,
    m_i,
    l_i,
    q,
    n0,
    n_end,
    pos,
    k_cache_ptr,
    v_cache_ptr,
    block_row,
    stride_bt_blk,
    kv_head,
    d,
    d_mask,
    num_blocks,
    qk_scale,
    stride_kc_block,
    stride_kc_off,
    stride_kc_head,
    stride_kc_dim,
    stride_vc_block,
    stride_vc_off,
    stride_vc_head,
    stride_vc_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """One online-softmax step over keys ``n0 .. n0 + BLOCK_N`` (masked if CAUSAL)."""
    n = n0 + tl.arange(0, BLOCK_N)
    if CAUSAL:
        n_mask = n < n_end
        block = tl.load(block_row + (n // BLOCK_SIZE) * stride_bt_blk, mask=n_mask, other=0)
    else:
        n_mask = n >= 0
        block = tl.load(block_row + (n // BLOCK_SIZE) * stride_bt_blk)
    block = tl.where((block >= 0) & (block < num_blocks), block, 0).to(tl.int64)
    off = n % BLOCK_SIZE
    kv_mask = n_mask[:, None] & d_mask[None, :]

    k_rows = block * stride_kc_block + off * stride_kc_off + kv_head * stride_kc_head
    k = tl.load(k_cache_ptr + k_rows[:, None] + d[None, :] * stride_kc_dim, mask=kv_mask, other=0.0)
    if DOT_FP32:
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if CAUSAL:
        s = tl.where((n[None, :] <= pos[:, None]) & n_mask[None, :], s, float("-inf"))
    # Scores stay unscaled: the scale rides on the max and on one FMA in the exponent.
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)

    v_rows = block * stride_vc_block + off * stride_vc_off + kv_head * stride_vc_head
    v = tl.load(v_cache_ptr + v_rows[:, None] + d[None, :] * stride_vc_dim, mask=kv_mask, other=0.0)
    if DOT_FP32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@triton.jit  # type: ignore[untyped-decorator]
def _prefill_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    qk_scale,
    num_seqs,
    queries_per_kv,
    head_dim,
    num_blocks,
    max_blocks_per_seq,
    stride_q_tok,
    stride_q_head,
    stride_q_dim,
    stride_kc_block,
    stride_kc_off,
    stride_kc_head,
    stride_kc_dim,
    stride_vc_block,
    stride_vc_off,
    stride_vc_head,
    stride_vc_dim,
    stride_bt_seq,
    stride_bt_blk,
    stride_o_tok,
    stride_o_head,
    stride_o_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    # Heads vary fastest, so the query heads sharing a KV head run together and read its
    # K/V tiles from L2; tiles go last-first, so the longest (latest) tiles start first.
    head = tl.program_id(0)
    tile_id = tl.num_programs(1) - 1 - tl.program_id(1)
    kv_head = head // queries_per_kv

    # The sequence: the largest s with query_start_loc[s] // BLOCK_M + s <= tile_id.
    lo = tile_id * 0
    hi = lo + num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        owns = tl.load(query_start_loc_ptr + mid) // BLOCK_M + mid <= tile_id
        lo = tl.where(owns, mid, lo)
        hi = tl.where(owns, hi, mid)
    seq = lo

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile = tile_id - (q_start // BLOCK_M + seq)
    seq_len = tl.minimum(tl.load(seq_lens_ptr + seq), max_blocks_per_seq * BLOCK_SIZE)
    prefix = seq_len - q_len

    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    m_mask = m < q_len
    d_mask = d < head_dim
    pos = prefix + m
    q_rows = (q_start + m).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_q_tok + head * stride_q_head + d[None, :] * stride_q_dim,
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)

    # Keys below the tile's first position are seen by every row: no mask there. A tile in
    # a gap between sequences (tile * BLOCK_M >= q_len) gets two empty loops.
    tile_valid = tile * BLOCK_M < q_len
    first_pos = tl.maximum(prefix + tile * BLOCK_M, 0)
    full_end = tl.where(tile_valid, (first_pos // BLOCK_N) * BLOCK_N, 0)
    causal_end = tl.where(tile_valid, prefix + tl.minimum((tile + 1) * BLOCK_M, q_len), 0)

    m_i = tl.full([BLOCK_M], _M_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    block_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for n0 in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_key_tile(
            acc, m_i, l_i, q, n0, full_end, pos, k_cache_ptr, v_cache_ptr, block_row,
            stride_bt_blk, kv_head, d, d_mask, num_blocks, qk_scale,
            stride_kc_block, stride_kc_off, stride_kc_head, stride_kc_dim,
            stride_vc_block, stride_vc_off, stride_vc_head, stride_vc_dim,
            BLOCK_SIZE, BLOCK_N, False, DOT_FP32,
        )  # fmt: skip
    for n0 in range(full_end, causal_end, BLOCK_N):
        acc, m_i, l_i = _attend_key_tile(
            acc, m_i, l_i, q, n0, causal_end, pos, k_cache_ptr, v_cache_ptr, block_row,
            stride_bt_blk, kv_head, d, d_mask, num_blocks, qk_scale,
            stride_kc_block, stride_kc_off, stride_kc_head, stride_kc_dim,
            stride_vc_block, stride_vc_off, stride_vc_head, stride_vc_dim,
            BLOCK_SIZE, BLOCK_N, True, DOT_FP32,
        )  # fmt: skip

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + q_rows[:, None] * stride_o_tok + head * stride_o_head + d[None, :] * stride_o_dim,
        out.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


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
    """Causal attention of ragged query chunks over their paged context.

    Args:
        query: ``[num_tokens, num_heads, head_dim]``, the sequences' new tokens back to back.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, query's
            dtype, already holding every key/value up to ``seq_lens`` (new chunk included).
        block_tables: int32 ``[num_seqs, max_blocks_per_seq]``, block ids in order.
        query_start_loc: int32 ``[num_seqs + 1]``, cumulative chunk starts (``[0] == 0``,
            ``[-1] == num_tokens``).
        seq_lens: int32 ``[num_seqs]``, total context per sequence including its chunk.
        scale: softmax scale; default ``head_dim ** -0.5``.
        out: optional tensor shaped like query, of query's dtype, to write.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in query's dtype (``out`` if given).

    Raises:
        InputError: a rank, shape, dtype or device does not match.
    """
    query = check_tensor(
        "query", query, dims=("num_tokens", "num_heads", "head_dim"), dtypes=FLOAT_DTYPES
    )
    check_device("query", query)
    device = query.device
    k_cache, v_cache = check_cache(k_cache, v_cache, device)
    queries_per_kv = check_query_heads(query, k_cache)
    num_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, _, _ = k_cache.shape
    check_same_dtype("k_cache", k_cache, query.dtype, "query")
    block_tables = check_tensor(
        "block_tables",
        block_tables,
        dims=("num_seqs", "max_blocks_per_seq"),
        dtypes=(torch.int32,),
        device=device,
    )
    num_seqs = block_tables.shape[0]
    query_start_loc = check_tensor(
        "query_start_loc",
        query_start_loc,
        dims=("num_seqs + 1",),
        dtypes=(torch.int32,),
        device=device,
    )
    check_dim("query_start_loc", query_start_loc, 0, "num_seqs + 1", num_seqs + 1)
    seq_lens = check_tensor(
        "seq_lens", seq_lens, dims=("num_seqs",), dtypes=(torch.int32,), device=device
    )
    check_dim("seq_lens", seq_lens, 0, "num_seqs", num_seqs)
    qk_scale = resolve_scale(scale, head_dim) * LOG2E
    result = check_out(out, query)
    if num_seqs == 0 or num_tokens == 0:
        return result

    config = prefill_config(query.dtype, head_dim)
    num_tiles = num_tokens // config.block_m + num_seqs
    with on_device(query):
        _prefill_kernel[(num_heads, num_tiles)](
            query,
            k_cache,
            v_cache,
            block_tables,
            query_start_loc,
            seq_lens,
            result,
            qk_scale,
            num_seqs,
            queries_per_kv,
            head_dim,
            num_blocks,
            block_tables.shape[1],
            *query.stride(),
            *k_cache.stride(),
            *v_cache.stride(),
            *block_tables.stride(),
            *result.stride(),
            BLOCK_SIZE=block_size,
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            BLOCK_D=next_pow2(max(head_dim, 16)),
            DOT_FP32=dot_fp32(query.dtype),
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    return result
