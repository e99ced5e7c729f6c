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
from typing import Any

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
    SlidingWindowMLASpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
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


# --- the V1 step scheduler -------------------------------------------------------------------
#
# Built the way vLLM's own tests/v1/core/utils.py::create_scheduler does, without a model
# or GPU (see /work/shared/peers/NOTES.md, "vLLM V1 scheduler"). One difference: that
# helper points ModelConfig at a hub model, and ModelConfig then inspects the model's
# class in a subprocess that imports vLLM's model code (einops, triton, ... which this
# venv lacks). We register a stub architecture in-process instead: the registry
# inspects a registered class directly, and nothing ever instantiates it.

STUB_ARCH = "TokenyardBenchForCausalLM"
_stub_model_dir: str | None = None


def _stub_model_config_dir(max_model_len: int) -> str:
    """A directory holding only a small decoder's config.json, naming the stub arch."""
    global _stub_model_dir
    import atexit
    import json
    import shutil
    import tempfile

    from torch import nn
    from vllm.model_executor.models.registry import ModelRegistry

    if _stub_model_dir is None:

        class TokenyardBenchForCausalLM(nn.Module):
            """Satisfies the registry's text-generation checks; never built or run."""

            def __init__(self, *, vllm_config: object = None, prefix: str = "") -> None:
                super().__init__()

            def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
                raise NotImplementedError

            def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
                raise NotImplementedError

            def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
                raise NotImplementedError

        ModelRegistry.register_model(STUB_ARCH, TokenyardBenchForCausalLM)
        _stub_model_dir = tempfile.mkdtemp(prefix="tokenyard-vllm-stub-")
        atexit.register(shutil.rmtree, _stub_model_dir, True)
    config = {
        "architectures": [STUB_ARCH],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 32000,
        "max_position_embeddings": max_model_len,
        "torch_dtype": "float16",
    }
    with open(os.path.join(_stub_model_dir, "config.json"), "w") as f:
        json.dump(config, f)
    return _stub_model_dir


_DRAFT_ARCHS = {"eagle": "EagleLlamaForCausalLM", "eagle3": "Eagle3LlamaForCausalLM"}


def _stub_draft_dir(model_dir: str, method: str) -> str:
    """A draft model config beside the stub target's (never loaded): the target's config
    under the EAGLE architecture vLLM registers for a Llama target."""
    import json

    if method not in _DRAFT_ARCHS:
        raise ValueError(f"speculative_method must be ngram, eagle or eagle3, got {method!r}")
    draft_dir = os.path.join(model_dir, f"draft-{method}")
    os.makedirs(draft_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    config["architectures"] = [_DRAFT_ARCHS[method]]
    with open(os.path.join(draft_dir, "config.json"), "w") as f:
        json.dump(config, f)
    return draft_dir


class VllmSchedulerPeer:
    """vLLM V1's synchronous ``Scheduler`` over a ``num_blocks`` KV cache, no model."""

    def __init__(
        self,
        *,
        num_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool = True,
        long_prefill_token_threshold: int = 0,
        long_prefill_token_threshold_adaptive: bool = False,
        policy: str = "fcfs",
        hash_algo: str = DEFAULT_HASH_ALGO,
        scheduler_reserve_full_isl: bool = True,
        num_speculative_tokens: int = 0,
        prefill_schedule_interval: int = 1,
        scheduler_cls: type | None = None,
        speculative_method: str = "ngram",
        disable_lookahead_block_hashes: bool = False,
    ) -> None:
        """``scheduler_reserve_full_isl`` (vLLM's default True): admit a waiting request
        only if its whole prompt fits in free blocks, not just its first chunk.
        ``num_speculative_tokens`` > 0: speculative decoding with vLLM's n-gram method (no
        draft model to load; the caller hands drafts to ``update_draft_token_ids``).
        ``scheduler_cls``: the class to build with vLLM's arguments instead of its
        ``Scheduler`` (its ``AsyncScheduler``, or tokenyard's adapters).
        ``speculative_method`` ``"eagle"`` or ``"eagle3"``: an EAGLE drafter over a stub
        draft model (never loaded), which turns on vLLM's look-ahead block hashes
        (``num_hash_lookahead_tokens``), or with ``disable_lookahead_block_hashes`` its
        trailing-block drop; the requests' block hasher follows the config, as vLLM's
        engine builds it."""
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            ModelConfig,
            ParallelConfig,
            SchedulerConfig,
            SpeculativeConfig,
            VllmConfig,
        )
        from vllm.v1.core.sched.scheduler import Scheduler

        model_dir = _stub_model_config_dir(max_model_len)
        model_config = ModelConfig(
            model=model_dir,
            tokenizer=model_dir,
            skip_tokenizer_init=True,
            max_model_len=max_model_len,
            dtype="float16",
            seed=0,
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
            long_prefill_token_threshold_adaptive=long_prefill_token_threshold_adaptive,
            policy=policy,
            # The synchronous Scheduler (tokenyard's default mode); the engine would
            # pick AsyncScheduler when async scheduling is on.
            async_scheduling=False,
            scheduler_reserve_full_isl=scheduler_reserve_full_isl,
            prefill_schedule_interval=prefill_schedule_interval,
        )
        cache_config = CacheConfig(
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            prefix_caching_hash_algo=hash_algo,
        )
        speculative_config = None
        if num_speculative_tokens and speculative_method != "ngram":
            speculative_config = SpeculativeConfig(
                method=speculative_method,
                model=_stub_draft_dir(model_dir, speculative_method),
                num_speculative_tokens=num_speculative_tokens,
                target_model_config=model_config,
                target_parallel_config=ParallelConfig(),
                disable_lookahead_block_hashes=disable_lookahead_block_hashes,
            )
        elif num_speculative_tokens:
            speculative_config = SpeculativeConfig(
                method="ngram",
                num_speculative_tokens=num_speculative_tokens,
                prompt_lookup_max=3,
                prompt_lookup_min=1,
            )
        self.vllm_config = VllmConfig(
            scheduler_config=scheduler_config,
            model_config=model_config,
            cache_config=cache_config,
            device_config=DeviceConfig(device="cpu"),
            speculative_config=speculative_config,
        )
        spec = FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float16
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layers.0.attn"], spec)],
        )
        cache_config.num_gpu_blocks = num_blocks
        self.scheduler = self.build(scheduler_cls or Scheduler, kv_cache_config)
        # EngineCore gives requests a block hasher only when prefix caching is on.
        self._block_hasher = None
        if enable_prefix_caching:
            hash_fn = get_hash_fn_by_name(hash_algo)
            kv_cache_utils.init_none_hash(hash_fn)
            self._block_hasher = kv_cache_utils.get_request_block_hasher(
                block_size, hash_fn, self.vllm_config.num_hash_lookahead_tokens
            )
        self._sampling_params: dict[int, SamplingParams] = {}

    def build(self, cls: type, kv_cache_config: KVCacheConfig, *, log_stats: bool = True) -> Any:
        """A scheduler of ``cls`` (vLLM's ``Scheduler`` or ``AsyncScheduler``, or tokenyard's
        adapters) built with vLLM's arguments on this peer's ``VllmConfig`` over
        ``kv_cache_config``; ``log_stats`` as the engine passes it (True unless
        ``--disable-log-stats``)."""
        from vllm.v1.structured_output import StructuredOutputManager

        block_size = self.vllm_config.cache_config.block_size
        return cls(
            vllm_config=self.vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=block_size,
            hash_block_size=block_size,
            log_stats=log_stats,
        )

    def effective_config(self) -> dict[str, object]:
        """What vLLM ended up with after its own config post-processing."""
        sc, cc = self.vllm_config.scheduler_config, self.vllm_config.cache_config
        return {
            "max_num_seqs": sc.max_num_seqs,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "enable_chunked_prefill": sc.enable_chunked_prefill,
            "long_prefill_token_threshold": sc.long_prefill_token_threshold,
            "policy": sc.policy,
            "scheduler_reserve_full_isl": sc.scheduler_reserve_full_isl,
            "async_scheduling": sc.async_scheduling,
            "block_size": cc.block_size,
            "enable_prefix_caching": cc.enable_prefix_caching,
            "prefix_caching_hash_algo": cc.prefix_caching_hash_algo,
            "max_model_len": self.vllm_config.model_config.max_model_len,
            "scheduler": type(self.scheduler).__name__,
        }

    def make_request(self, request_id: str, token_ids: Sequence[int], max_tokens: int) -> Request:
        """A waiting request that runs to ``max_tokens`` (no EOS set, like ignore_eos).

        Requests with the same ``max_tokens`` share one ``SamplingParams``."""
        params = self._sampling_params.get(max_tokens)
        if params is None:
            params = self._sampling_params[max_tokens] = SamplingParams(max_tokens=max_tokens)
        return Request(
            request_id=request_id,
            prompt_token_ids=list(token_ids),
            sampling_params=params,
            pooling_params=None,
            block_hasher=self._block_hasher,
        )


def runner_output(
    scheduler: Any, out: Any, samples: set[str] | None = None, token: int = 7
) -> ModelRunnerOutput:
    """A model runner's output for the step ``out``: ``token`` for each request in
    ``samples``, by default those whose known tokens are computed (``schedule()`` advanced
    ``num_computed_tokens`` past the step's tokens) or that have left
    ``scheduler.requests``; none for a prefill chunk."""
    ids = list(out.num_scheduled_tokens)
    if samples is None:
        samples = set()
        for r in ids:
            request = scheduler.requests.get(r)
            if request is None or request.num_computed_tokens >= request.num_tokens:
                samples.add(r)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: n for n, r in enumerate(ids)},
        sampled_token_ids=[[token] if r in samples else [] for r in ids],
    )


def bounded_replay_groups(
    window: int, *, block_size: int = 16, bounded_replay: bool = True
) -> list[KVCacheGroupSpec]:
    """vLLM 0.33's SWA bounded-replay layout (DeepSeek-V4.1): a full-attention group beside
    a ``SlidingWindowMLASpec(bounded_replay=True)`` group of ``window`` tokens (with
    ``bounded_replay`` False, an ordinary cached window group)."""
    full = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    swa = SlidingWindowMLASpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=64,
        dtype=torch.bfloat16,
        sliding_window=window,
        bounded_replay=bounded_replay,
    )
    return [KVCacheGroupSpec(["full"], full), KVCacheGroupSpec(["swa"], swa)]
