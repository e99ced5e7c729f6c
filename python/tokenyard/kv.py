"""KV-cache memory: the three allocators a serving engine or a simulated replica uses.

- :class:`CountingAllocator` — Vidur's block counting (how many blocks each request holds).
- :class:`BlockPool` — vLLM V1's prefix-caching block pool (block ids, ref counts, LRU free
  queue, chained block hashes), optionally with a host-memory tier; :func:`block_hashes`
  computes its hashes.
- :class:`RadixCache` — SGLang's radix prefix cache (token-level tree of KV slot indices).
- :class:`KvCoordinator` — vLLM's KV cache coordinator for hybrid models: one group per
  layer kind (:class:`FullAttentionSpec`, :class:`SlidingWindowSpec`,
  :class:`ChunkedLocalAttentionSpec`, :class:`MambaSpec`, :class:`CrossAttentionSpec`,
  HiSparse's :class:`HiSparseResidentSpec` and :class:`HiSparseHotSpec`) over one shared
  block pool.

See ``docs/kv.md`` for the semantics and a worked example of each.
"""

from tokenyard._core import (
    BlockPool,
    BlockPoolStats,
    ChunkedLocalAttentionSpec,
    ComputedBlocks,
    CountingAllocator,
    CrossAttentionSpec,
    FullAttentionSpec,
    GroupedComputedBlocks,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KvCoordinator,
    MambaSpec,
    MatchResult,
    NodeHandle,
    RadixCache,
    SlidingWindowSpec,
    block_hashes,
)

__all__ = [
    "BlockPool",
    "BlockPoolStats",
    "ChunkedLocalAttentionSpec",
    "ComputedBlocks",
    "CountingAllocator",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "GroupedComputedBlocks",
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
    "KvCoordinator",
    "MambaSpec",
    "MatchResult",
    "NodeHandle",
    "RadixCache",
    "SlidingWindowSpec",
    "block_hashes",
]
