"""Paged-attention kernels (Triton) over the KV cache that tokenyard's block pool manages.

Layout, per layer: ``k_cache`` and ``v_cache`` are ``[num_blocks, block_size, num_kv_heads,
head_dim]``. Token ``j`` of a request lives in block ``block_table[j // block_size]`` at
offset ``j % block_size``; its *slot* is ``block_id * block_size + offset``. Block ids are
the ones :class:`tokenyard.kv.BlockPool` hands out, in the request's order, so a block table
row is any permutation of pool ids, not a contiguous range.

- :func:`store_kv` writes new keys/values into their slots (a negative slot is padding).
- :func:`paged_decode_attention`: one query token per sequence, attending to its whole
  context through the block table (split-KV for few sequences with long contexts).
- :func:`paged_prefill_attention`: ragged chunks of new query tokens, causal over the paged
  context (chunked prefill and prefix-cache hits: the cached prefix is in the cache too).

Queries use ``num_heads`` heads; K/V use ``num_kv_heads`` (GQA), query head ``h`` reads KV
head ``h // (num_heads // num_kv_heads)``. Softmax runs in float32; outputs take the query's
dtype. :mod:`tokenyard.kernels.reference` holds plain-torch versions with the same
signatures. See ``docs/kernels.md``.

Needs torch and triton (not dependencies of ``tokenyard`` itself). Without a GPU, set
``TRITON_INTERPRET=1`` before importing this module to run the kernels in Triton's
interpreter on CPU tensors (slow; for tests).
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
    import triton  # type: ignore[import-untyped]  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tokenyard.kernels needs torch and triton (pip install torch triton); "
        f"importing them failed: {exc}"
    ) from exc

from tokenyard.kernels import reference
from tokenyard.kernels._decode import paged_decode_attention
from tokenyard.kernels._prefill import paged_prefill_attention
from tokenyard.kernels._store import store_kv

__all__ = ["paged_decode_attention", "paged_prefill_attention", "reference", "store_kv"]
