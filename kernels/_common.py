"""Shared by the kernel wrappers: argument checks, the interpreter switch, device facts.

Checks look only at metadata (rank, shape, dtype, device): none reads tensor values, so
none synchronises with the GPU. Values the kernels cannot trust (slots, block ids) are
masked inside the kernels instead.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Sequence

import torch

from tokenyard.errors import InputError

# triton.jit reads TRITON_INTERPRET when a kernel is decorated, i.e. when this package is
# imported; read it at the same moment so the two agree.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256

LOG2E = 1.4426950408889634


def dot_fp32(dtype: torch.dtype) -> bool:
    """Whether the kernels upcast ``tl.dot`` operands to float32 (IEEE, no tf32).

    Always in the interpreter (numpy has no bfloat16, so a bf16 dot there is wrong), and for
    float32 inputs so they keep float32 accuracy; bf16/fp16 use the tensor cores natively.
    """
    return INTERPRET or dtype == torch.float32


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def sm_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def _fail(name: str, what: str, value: object) -> InputError:
    return InputError(f"{name} {what}, got {value}", field=name, value=str(value))


def check_tensor(
    name: str,
    t: object,
    *,
    dims: Sequence[str],
    dtypes: Sequence[torch.dtype],
    device: torch.device | None = None,
) -> torch.Tensor:
    """Check ``t`` is a tensor of rank ``len(dims)``, one of ``dtypes``, on ``device``."""
    if not isinstance(t, torch.Tensor):
        raise _fail(name, "must be a torch.Tensor", type(t).__name__)
    if t.dim() != len(dims):
        raise _fail(name, f"must have shape [{', '.join(dims)}]", f"shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise _fail(name, f"must have dtype in ({allowed})", t.dtype)
    if device is not None and t.device != device:
        raise _fail(name, f"must be on {device} like the first argument", t.device)
    return t


def check_device(name: str, t: torch.Tensor) -> None:
    """The compiled kernels need CUDA tensors; the interpreter takes any device."""
    if not INTERPRET and t.device.type != "cuda":
        raise _fail(
            name,
            "must be on a CUDA device (or set TRITON_INTERPRET=1 before importing "
            "tokenyard.kernels to run on the CPU)",
            t.device,
        )


def check_dim(name: str, t: torch.Tensor, axis: int, what: str, expected: int) -> None:
    if t.shape[axis] != expected:
        raise _fail(
            name, f"must have {what} = {expected} (dimension {axis})", f"shape {tuple(t.shape)}"
        )


def check_same_shape(name: str, t: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    if t.shape != other.shape:
        raise _fail(
            name, f"must have the shape of {other_name} {tuple(other.shape)}", tuple(t.shape)
        )


def check_same_dtype(name: str, t: torch.Tensor, dtype: torch.dtype, other: str) -> None:
    if t.dtype != dtype:
        raise _fail(name, f"must have the dtype of {other} ({dtype})", t.dtype)


def check_cache(
    k_cache: object, v_cache: object, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the K/V cache pair; returns them typed."""
    dims = ("num_blocks", "block_size", "num_kv_heads", "head_dim")
    k = check_tensor("k_cache", k_cache, dims=dims, dtypes=FLOAT_DTYPES, device=device)
    v = check_tensor("v_cache", v_cache, dims=dims, dtypes=FLOAT_DTYPES, device=device)
    check_same_shape("v_cache", v, "k_cache", k)
    check_same_dtype("v_cache", v, k.dtype, "k_cache")
    if k.shape[3] > MAX_HEAD_DIM or k.shape[3] == 0:
        raise _fail("k_cache", f"must have 1 <= head_dim <= {MAX_HEAD_DIM}", k.shape[3])
    if k.shape[1] == 0 or k.shape[2] == 0:
        raise _fail("k_cache", "must have block_size >= 1 and num_kv_heads >= 1", tuple(k.shape))
    return k, v


def check_query_heads(query: torch.Tensor, k_cache: torch.Tensor) -> int:
    """Check query's heads against the cache; returns query heads per KV head."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    if head_dim != k_cache.shape[3]:
        raise _fail("query", f"must have head_dim = {k_cache.shape[3]} like k_cache", head_dim)
    if num_heads == 0 or num_heads % num_kv_heads != 0:
        raise _fail(
            "query",
            f"must have num_heads a positive multiple of num_kv_heads {num_kv_heads}",
            num_heads,
        )
    return num_heads // num_kv_heads


def check_out(out: object, query: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty_like(query, memory_format=torch.contiguous_format)
    o = check_tensor(
        "out",
        out,
        dims=("num_tokens", "num_heads", "head_dim"),
        dtypes=(query.dtype,),
        device=query.device,
    )
    check_same_shape("out", o, "query", query)
    return o


def resolve_scale(scale: float | None, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if (
        not isinstance(scale, (int, float))
        or isinstance(scale, bool)
        or not (scale > 0 and math.isfinite(scale))
    ):
        raise _fail("scale", "must be a positive finite float", scale)
    return float(scale)


def on_device(t: torch.Tensor) -> contextlib.AbstractContextManager[object]:
    """Launch on ``t``'s GPU (Triton launches on the current device)."""
    if t.is_cuda:
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()
