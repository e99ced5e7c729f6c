"""vLLM V1 KV-cache manager, built offline for side-by-side benchmarks.

We drive vLLM's own ``KVCacheManager`` (which owns its ``BlockPool``) directly,
the way its ``Scheduler`` does for a newly admitted request: build a ``Request``
(its block hasher runs at construction), ``get_computed_blocks`` for the prefix
hit, ``allocate_slots`` for the rest, and later ``free``. No model, tokenizer,
GPU or ``VllmConfig`` is needed for that path: the manager only reads a
``KVCacheConfig`` with one full-attention group, so we skip the Scheduler and
its config objects and keep the measurement on the block pool itself.

Behaviour worth knowing when comparing hit counts: 0.33's ``BlockPool.free_blocks``
puts freed blocks that carry no hash (a request's partial last block) at the
*front* of the free queue, to be reused first, and hashed blocks at the back in
reverse request order (tail blocks evicted before prefix blocks).

Only runs inside the bench venv made by ``benches/peers/setup.sh``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

# vLLM reads these at import time: pick the CPU platform instead of probing for
# CUDA, stay off the model hub, and keep INFO logging out of the timed loops.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import logging

# vLLM 0.33 registers its custom-op types through torch APIs that torch 2.14.1
# deprecates, and torch logs a warning per call at import. Harmless; silenced.
for _name in ("torch._opaque_base", "torch._library.opaque_object"):
    logging.getLogger(_name).setLevel(logging.ERROR)

import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.request import Request  # noqa: E402

# Names accepted by vLLM's ``--prefix-caching-hash-algo``. "sha256" is the
# default of ``CacheConfig.prefix_caching_hash_algo`` in 0.33, so it is what a
# stock deployment pays; the others are opt-in (xxhash needs the optional
# ``xxhash`` package).
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_HASH_ALGO = "sha256"


class VllmPeer:
    """One vLLM ``KVCacheManager`` plus the request plumbing around it."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        max_model_len: int = 8192,
        hash_algo: str = DEFAULT_HASH_ALGO,
        enable_caching: bool = True,
    ) -> None:
        self.block_size = block_size
        hash_fn = get_hash_fn_by_name(hash_algo)
        # NONE_HASH is a module global seeded per hash function; the engine sets
        # it once at start-up, so must we, or every chain starts from None.
        kv_cache_utils.init_none_hash(hash_fn)
        self._block_hasher = kv_cache_utils.get_request_block_hasher(block_size, hash_fn)
        # The spec's head geometry only matters to the model runner (tensor
        # sizes); the manager looks at block_size and the spec's type alone.
        spec = FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float16
        )
        config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layers.0.attn"], spec)],
        )
        self.manager = KVCacheManager(
            kv_cache_config=config,
            max_model_len=max_model_len,
            scheduler_block_size=block_size,
            hash_block_size=block_size,
            enable_caching=enable_caching,
            # The Scheduler passes log_stats=True in the engine's default
            # configuration (stats are on unless --disable-log-stats).
            log_stats=True,
        )
        # One shared SamplingParams, like an engine serving identical requests;
        # a fresh one per request would add pydantic/msgspec cost we don't study.
        self._sampling_params = SamplingParams(max_tokens=1)

    @property
    def block_pool(self):
        return self.manager.block_pool

    @property
    def num_free_blocks(self) -> int:
        return self.manager.block_pool.get_num_free_blocks()

    def make_request(self, request_id: str, token_ids: Sequence[int]) -> Request:
        """A waiting request; constructing it computes all its full-block hashes."""
        return Request(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=self._sampling_params,
            pooling_params=None,
            block_hasher=self._block_hasher,
        )

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        blocks, num_computed, _shared_prefix_boundary = self.manager.get_computed_blocks(request)
        return blocks, num_computed

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
    ) -> KVCacheBlocks | None:
        return self.manager.allocate_slots(
            request,
            num_new_tokens,
            num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=new_computed_blocks,
        )

    def free(self, request: Request) -> None:
        self.manager.free(request)


def versions() -> dict[str, str]:
    import vllm

    return {"vllm": vllm.__version__}
