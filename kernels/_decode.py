"""``paged_decode_attention``: one query token per sequence over its paged context.

One program handles one (sequence, KV head, split): all ``num_heads // num_kv_heads`` query
heads of the group at once, as the rows of a ``[BLOCK_G, head_dim]`` tile (padded to 16
rows so ``tl.dot`` can run on tensor cores), so each K/V row is read from memory once per
group. Keys come in tiles of ``BLOCK_N`` gathered through the block table, with an online
softmax in float32 (base 2: the scale is folded with log2(e)).

Split-KV (flash-decoding): when there are too few (sequence, KV head) pairs to fill the
GPU, the context is cut into ``num_splits`` ranges; each program writes its unnormalised
partial result with its running max and sum, and a second kernel combines them. The
split count comes from the block table's width (an upper bound on every context, known
without reading ``context_lens`` back from the GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]

from tokenyard.errors import InputError
from tokenyard.kernels._common import (
    FLOAT_DTYPES,
    INTERPRET,
    LOG2E,
    cdiv,
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
    sm_count,
)

# A running max starts here rather than at -inf so that a fully masked tile gives
# exp2(-inf - MIN) = 0 instead of exp2(-inf + inf) = nan.
_M_INIT = tl.constexpr(-1.0e30)


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters of the decode kernel.

    On an H100 (bf16, head_dim 128, block 16) 64-key tiles with 4 warps were the best or
    within 1% of it across the swept shapes; 3 stages, 32/128-key tiles, other split
    thresholds changed nothing or lost up to 16% (benches/kernels_gpu.py --sweep).
    """

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    min_keys_per_split: int = 256
    max_splits: int = 64
    # Split when fewer than this many (sequence, KV head) programs per SM.
    split_below_programs_per_sm: float = 1.0


GPU_CONFIG = DecodeConfig()
# Small tiles in the interpreter, so small test shapes still cross tile boundaries.
INTERPRET_CONFIG = DecodeConfig(block_n=16, num_warps=1, num_stages=1)


@triton.jit  # type: ignore[untyped-decorator]
def _decode_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    qk_scale,
    num_heads,
    queries_per_kv,
    head_dim,
    num_blocks,
    max_blocks_per_seq,
    keys_per_split,
    num_splits,
    stride_q_seq,
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
    stride_o_seq,
    stride_o_head,
    stride_o_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # Never read past the block table row, whatever context_lens says.
    context_len = tl.minimum(tl.load(context_lens_ptr + seq), max_blocks_per_seq * BLOCK_SIZE)
    start = split * keys_per_split
    end = tl.minimum(context_len, start + keys_per_split)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * queries_per_kv + g
    g_mask = g < queries_per_kv
    d_mask = d < head_dim
    q = tl.load(
        q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + d[None, :] * stride_q_dim,
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], _M_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    block_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        block = tl.load(block_row + (n // BLOCK_SIZE) * stride_bt_blk, mask=n_mask, other=0)
        block = tl.where((block >= 0) & (block < num_blocks), block, 0).to(tl.int64)
        off = n % BLOCK_SIZE
        kv_mask = n_mask[:, None] & d_mask[None, :]

        k_rows = block * stride_kc_block + off * stride_kc_off + kv_head * stride_kc_head
        k = tl.load(
            k_cache_ptr + k_rows[:, None] + d[None, :] * stride_kc_dim, mask=kv_mask, other=0.0
        )
        if DOT_FP32:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        # Scores stay unscaled: the scale rides on the max and on one FMA in the exponent.
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)

        v_rows = block * stride_vc_block + off * stride_vc_off + kv_head * stride_vc_head
        v = tl.load(
            v_cache_ptr + v_rows[:, None] + d[None, :] * stride_vc_dim, mask=kv_mask, other=0.0
        )
        if DOT_FP32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if SPLIT:
        # Partials are [num_seqs, num_heads, num_splits(, head_dim)], float32.
        row = (seq * num_heads + heads) * num_splits + split
        tl.store(part_m_ptr + row, m_i, mask=g_mask)
        tl.store(part_l_ptr + row, l_i, mask=g_mask)
        tl.store(
            part_acc_ptr + row[:, None] * head_dim + d[None, :],
            acc,
            mask=g_mask[:, None] & d_mask[None, :],
        )
    else:
        # context_len 0 (a padding row) leaves l_i = 0 and acc = 0: the output is 0.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr
            + seq * stride_o_seq
            + heads[:, None] * stride_o_head
            + d[None, :] * stride_o_dim,
            out.to(out_ptr.dtype.element_ty),
            mask=g_mask[:, None] & d_mask[None, :],
        )


@triton.jit  # type: ignore[untyped-decorator]
def _combine_splits_kernel(  # type: ignore[no-untyped-def]
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    out_ptr,
    num_heads,
    head_dim,
    num_splits,
    stride_o_seq,
    stride_o_head,
    stride_o_dim,
    BLOCK_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_SPLITS)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < num_splits
    row = (seq * num_heads + head) * num_splits + s
    m = tl.load(part_m_ptr + row, mask=s_mask, other=_M_INIT)
    l = tl.load(part_l_ptr + row, mask=s_mask, other=0.0)  # noqa: E741
    acc = tl.load(
        part_acc_ptr + row[:, None] * head_dim + d[None, :],
        mask=s_mask[:, None] & (d[None, :] < head_dim),
        other=0.0,
    )
    # Empty splits carry m = _M_INIT and l = 0, so they weigh nothing.
    m_max = tl.max(m, 0)
    w = tl.exp2(m - m_max)
    total = tl.sum(l * w, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_o_seq + head * stride_o_head + d * stride_o_dim,
        out.to(out_ptr.dtype.element_ty),
        mask=d < head_dim,
    )


def choose_num_splits(
    num_programs: int, max_context: int, device: torch.device, config: DecodeConfig
) -> int:
    """How many ranges to cut each context into (1: no split)."""
    if INTERPRET or device.type != "cuda":
        return 1
    sms = sm_count(device.index if device.index is not None else torch.cuda.current_device())
    if num_programs >= config.split_below_programs_per_sm * sms:
        return 1
    by_occupancy = cdiv(2 * sms, max(1, num_programs))
    by_length = cdiv(max_context, config.min_keys_per_split)
    return max(1, min(by_occupancy, by_length, config.max_splits))


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Attention of one new query token per sequence over its paged K/V.

    Args:
        query: ``[num_seqs, num_heads, head_dim]``; its own K/V already stored.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, query's dtype.
        block_tables: int32 ``[num_seqs, max_blocks_per_seq]``, each row the sequence's
            block ids in order (entries past its context are not read).
        context_lens: int32 ``[num_seqs]``, tokens to attend, the current one included;
            0 marks a padding row, whose output is zeros.
        scale: softmax scale; default ``head_dim ** -0.5``.
        out: optional ``[num_seqs, num_heads, head_dim]`` tensor of query's dtype to write.
        num_splits: ranges to cut each context into (split-KV); default chosen from the
            GPU's SM count and the block table width; 1 disables the split.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in query's dtype (``out`` if given).

    Raises:
        InputError: a rank, shape, dtype, device or value does not match.
    """
    query = check_tensor(
        "query", query, dims=("num_seqs", "num_heads", "head_dim"), dtypes=FLOAT_DTYPES
    )
    check_device("query", query)
    device = query.device
    k_cache, v_cache = check_cache(k_cache, v_cache, device)
    queries_per_kv = check_query_heads(query, k_cache)
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    block_tables = check_tensor(
        "block_tables",
        block_tables,
        dims=("num_seqs", "max_blocks_per_seq"),
        dtypes=(torch.int32,),
        device=device,
    )
    check_dim("block_tables", block_tables, 0, "num_seqs", num_seqs)
    context_lens = check_tensor(
        "context_lens", context_lens, dims=("num_seqs",), dtypes=(torch.int32,), device=device
    )
    check_dim("context_lens", context_lens, 0, "num_seqs", num_seqs)
    check_same_dtype("k_cache", k_cache, query.dtype, "query")
    qk_scale = resolve_scale(scale, head_dim) * LOG2E
    result = check_out(out, query)
    if num_splits is not None and (
        not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1
    ):
        raise InputError(
            f"num_splits must be a positive int, got {num_splits!r}",
            field="num_splits",
            value=repr(num_splits),
        )
    if num_seqs == 0:
        return result

    config = INTERPRET_CONFIG if INTERPRET else GPU_CONFIG
    max_blocks_per_seq = block_tables.shape[1]
    max_context = max_blocks_per_seq * block_size
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs * num_kv_heads, max_context, device, config)
    keys_per_split = cdiv(cdiv(max(max_context, 1), num_splits), config.block_n)
    keys_per_split *= config.block_n
    num_splits = max(1, cdiv(max_context, keys_per_split))
    split = num_splits > 1

    block_d = next_pow2(max(head_dim, 16))
    block_g = max(16, next_pow2(queries_per_kv))
    if split:
        # One allocation for the three partials: acc, then m, then l.
        rows = num_seqs * num_heads * num_splits
        parts = torch.empty(rows * (head_dim + 2), dtype=torch.float32, device=device)
        part_acc = parts[: rows * head_dim]
        part_m = parts[rows * head_dim : rows * (head_dim + 1)]
        part_l = parts[rows * (head_dim + 1) :]
    else:
        part_m = part_l = part_acc = result  # unused

    with on_device(query):
        _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
            query,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            result,
            part_m,
            part_l,
            part_acc,
            qk_scale,
            num_heads,
            queries_per_kv,
            head_dim,
            num_blocks,
            max_blocks_per_seq,
            keys_per_split,
            num_splits,
            *query.stride(),
            *k_cache.stride(),
            *v_cache.stride(),
            *block_tables.stride(),
            *result.stride(),
            BLOCK_SIZE=block_size,
            BLOCK_G=block_g,
            BLOCK_N=config.block_n,
            BLOCK_D=block_d,
            SPLIT=split,
            DOT_FP32=dot_fp32(query.dtype),
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
        if split:
            _combine_splits_kernel[(num_seqs, num_heads)](
                part_m,
                part_l,
                part_acc,
                result,
                num_heads,
                head_dim,
                num_splits,
                *result.stride(),
                BLOCK_SPLITS=next_pow2(num_splits),
                BLOCK_D=block_d,
                num_warps=4,
            )
    return result
