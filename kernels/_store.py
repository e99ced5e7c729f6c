"""``store_kv``: scatter new keys/values into their cache slots.

One program per (token, tile of KV heads) copies a ``[heads, head_dim]`` tile. A slot
outside ``[0, num_blocks * block_size)`` is not written: negative slots are padding by
contract, and masking the others keeps a bad slot from writing outside the cache without
a host-side check (which would synchronise with the GPU).
"""

from __future__ import annotations

import torch
import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]

from tokenyard.kernels._common import (
    FLOAT_DTYPES,
    cdiv,
    check_cache,
    check_device,
    check_dim,
    check_same_dtype,
    check_same_shape,
    check_tensor,
    next_pow2,
    on_device,
)


@triton.jit  # type: ignore[untyped-decorator]
def _store_kv_kernel(  # type: ignore[no-untyped-def]
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    num_kv_heads,
    head_dim,
    block_size,
    num_slots,
    stride_k_tok,
    stride_k_head,
    stride_k_dim,
    stride_v_tok,
    stride_v_head,
    stride_v_dim,
    stride_kc_block,
    stride_kc_off,
    stride_kc_head,
    stride_kc_dim,
    stride_vc_block,
    stride_vc_off,
    stride_vc_head,
    stride_vc_dim,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    valid = (slot >= 0) & (slot < num_slots)
    slot = tl.where(valid, slot, 0)
    block = slot // block_size
    off = slot % block_size
    # An invalid slot masks every head (a scalar bool & a tensor mask upsets the interpreter).
    heads_to_write = tl.where(valid, num_kv_heads, 0)
    mask = (h[:, None] < heads_to_write) & (d[None, :] < head_dim)

    src = t * stride_k_tok + h[:, None] * stride_k_head + d[None, :] * stride_k_dim
    dst = (
        block * stride_kc_block
        + off * stride_kc_off
        + h[:, None] * stride_kc_head
        + d[None, :] * stride_kc_dim
    )
    tl.store(k_cache_ptr + dst, tl.load(key_ptr + src, mask=mask), mask=mask)

    src = t * stride_v_tok + h[:, None] * stride_v_head + d[None, :] * stride_v_dim
    dst = (
        block * stride_vc_block
        + off * stride_vc_off
        + h[:, None] * stride_vc_head
        + d[None, :] * stride_vc_dim
    )
    tl.store(v_cache_ptr + dst, tl.load(value_ptr + src, mask=mask), mask=mask)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key[t]`` and ``value[t]`` into cache slot ``slot_mapping[t]``, in place.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``, in the caches' dtype.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        slot_mapping: int32 or int64 ``[num_tokens]``; slot = block_id * block_size +
            offset. A negative slot is padding and is skipped; so is a slot past the
            cache's end (checking for it would need a GPU sync).

    Raises:
        InputError: a rank, shape, dtype or device does not match.
    """
    dims = ("num_tokens", "num_kv_heads", "head_dim")
    key = check_tensor("key", key, dims=dims, dtypes=FLOAT_DTYPES)
    check_device("key", key)
    k_cache, v_cache = check_cache(k_cache, v_cache, key.device)
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    check_dim("key", key, 1, "num_kv_heads", num_kv_heads)
    check_dim("key", key, 2, "head_dim", head_dim)
    check_same_dtype("key", key, k_cache.dtype, "k_cache")
    value = check_tensor("value", value, dims=dims, dtypes=(key.dtype,), device=key.device)
    check_same_shape("value", value, "key", key)
    num_tokens = key.shape[0]
    slots = check_tensor(
        "slot_mapping",
        slot_mapping,
        dims=("num_tokens",),
        dtypes=(torch.int32, torch.int64),
        device=key.device,
    )
    check_dim("slot_mapping", slots, 0, "num_tokens", num_tokens)
    if num_tokens == 0:
        return

    block_d = next_pow2(head_dim)
    block_h = min(next_pow2(num_kv_heads), max(1, 4096 // block_d))
    grid = (num_tokens, cdiv(num_kv_heads, block_h))
    with on_device(key):
        _store_kv_kernel[grid](
            key,
            value,
            k_cache,
            v_cache,
            slots,
            num_kv_heads,
            head_dim,
            block_size,
            num_blocks * block_size,
            *key.stride(),
            *value.stride(),
            *k_cache.stride(),
            *v_cache.stride(),
            BLOCK_H=block_h,
            BLOCK_D=block_d,
            num_warps=4,
        )
