"""The ``replica`` section of a simulation config: each replica's model, device, layout (TP,
PP, EP, DP), dtypes, scheduler and per-replica features. ``cluster_config.py`` holds it with
the ``cluster`` section (and re-exports it); the decode pool of a disaggregated cluster
resolves its own from it (``disagg_config.py``).
"""

from __future__ import annotations

import dataclasses

from tokenyard._checks import check_key_choice, check_key_int, fail
from tokenyard.catalog.quant import QUANTIZATION_CHOICES
from tokenyard.simulation.kv_offload_config import KvOffloadConfig
from tokenyard.simulation.lora_config import LoraConfig
from tokenyard.simulation.planner import dtype_bytes
from tokenyard.simulation.scheduler_config import (
    ReplicaSchedulerConfig,
    default_vllm_v1,
    pipeline_parallel,
)
from tokenyard.simulation.speculative import SpeculativeConfig

__all__ = ["ReplicaConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicaConfig:
    model: str = "llama-2-7b"
    device: str = "a100-80gb"
    tensor_parallel_size: int = 1
    num_pipeline_stages: int = 1
    #: EP: 1 splits a MoE model's experts by TP; else vLLM's ``--enable-expert-parallel``,
    #: where it must be ``tensor_parallel_size x data_parallel_size``: each GPU holds
    #: ``num_experts / EP`` experts whole (docs/simulate.md, "Expert and data parallelism").
    expert_parallel_size: int = 1
    #: Attention data parallelism (vLLM ``--data-parallel-size``, SGLang
    #: ``--enable-dp-attention``): a replica is ``DP`` ranks of ``TP`` GPUs, each rank with
    #: its own scheduler and KV cache, sharing the MoE layers: by EP, or without it (EP 1)
    #: as one TP group of ``TP x DP`` GPUs on the DP ranks' gathered tokens.
    data_parallel_size: int = 1
    memory_margin_fraction: float = 0.1
    #: Weights' data type (``bf16``, ``fp16``, ``fp32``, ``fp8``, ``int8``, ``int4``);
    #: ``auto``: the checkpoint's quantization (``quantization``), else bf16.
    dtype: str = "auto"
    #: The weights' quantization scheme (``catalog/quant.py``): ``auto`` is the
    #: checkpoint's ``quantization_config``; ``none`` prices the model unquantized; a scheme
    #: (``fp8``, ``fp8_block``, ``nvfp4``, ``mxfp4``, ``int4_awq``, ``int4_gptq``, ``int4``)
    #: assumes it, which picks the measured kernel family and the bytes per weight.
    quantization: str = "auto"
    #: The KV cache's data type; ``auto`` is the compute dtype (the weights' if 16 or 32
    #: bits, else bf16).
    kv_cache_dtype: str = "auto"
    scheduler: ReplicaSchedulerConfig = dataclasses.field(default_factory=ReplicaSchedulerConfig)
    #: A request longer than a replica can ever serve: ``error`` stops the run naming it
    #: and the limiting setting; ``skip`` leaves it out and counts it in the summary.
    over_length: str = "error"
    #: Multi-LoRA serving (``vllm_v1`` only; ``simulation/lora_config.py``, docs/lora.md).
    lora: LoraConfig | None = None
    #: Speculative decoding (``vllm_v1`` only; off unless ``method`` is set).
    speculative: SpeculativeConfig = dataclasses.field(default_factory=SpeculativeConfig)
    #: A host-memory KV tier (``vllm_v1`` with prefix caching; ``kv_offload_config.py``,
    #: docs/disaggregation.md); the decode pool of a disaggregated cluster has one too.
    kv_offload: KvOffloadConfig | None = None
    #: vLLM's hybrid KV cache manager for a model with windowed or linear-attention layers
    #: (``vllm_v1``; ``simulation/hybrid_kv.py``, docs/catalog.md "KV"): ``true`` gives each
    #: layer kind its own KV cache group over one pool, a sliding-window group freeing the
    #: blocks that leave its window, a Mamba group one state page per request, and sizes
    #: ``num_blocks`` (and, beside Mamba layers, the block) as vLLM does for those groups;
    #: ``false`` is ``--disable-hybrid-kv-cache-manager`` (every attention layer as full
    #: attention; refused with linear-attention layers, which vLLM cannot run so).
    #: Unset: what vLLM 0.33 does for the model and configuration (the banner says which).
    hybrid_kv_cache_manager: bool | None = None

    def check(self, where: str) -> None:
        check_key_int(f"{where}.tensor_parallel_size", self.tensor_parallel_size, low=1, high=512)
        check_key_int(f"{where}.num_pipeline_stages", self.num_pipeline_stages, low=1, high=512)
        self._check_expert_layout(where)
        if not 0 <= self.memory_margin_fraction < 1:
            raise fail(
                f"{where}.memory_margin_fraction",
                f"must be in [0, 1), got {self.memory_margin_fraction}",
                self.memory_margin_fraction,
            )
        dtype_bytes(self.dtype, self.kv_cache_dtype)  # names replica.dtype / .kv_cache_dtype
        check_key_choice(f"{where}.quantization", self.quantization, QUANTIZATION_CHOICES)
        self.scheduler.check(f"{where}.scheduler")
        check_key_choice(f"{where}.over_length", self.over_length, ("error", "skip"))
        policy = self.scheduler.policy
        if self.lora is not None:
            self.lora.check(f"{where}.lora")
            if policy != "vllm_v1":
                raise fail(
                    f"{where}.lora",
                    f"LoRA adapters are simulated on vllm_v1 replicas only, not {policy}",
                    policy,
                )
        self.speculative.check(f"{where}.speculative", policy)
        self._check_draft_knobs(where)
        self._check_kv_offload(where)
        self._check_hybrid_kv(where)
        if self.num_pipeline_stages > 1 and not pipeline_parallel(policy):
            raise fail(
                f"{where}.num_pipeline_stages",
                f"the {policy} scheduler does not support pipeline parallelism "
                f"(num_pipeline_stages must be 1, got {self.num_pipeline_stages})",
                self.num_pipeline_stages,
            )

    def _check_hybrid_kv(self, where: str) -> None:
        """``hybrid_kv_cache_manager = true`` needs what the KV groups' coordinator serves:
        a ``vllm_v1`` replica (the model and a host tier are checked with the plan)."""
        value = self.hybrid_kv_cache_manager
        if value is not None and not isinstance(value, bool):
            raise fail(
                f"{where}.hybrid_kv_cache_manager", f"must be true or false, got {value!r}", value
            )
        if value is not True:
            return
        policy = self.scheduler.policy
        if policy != "vllm_v1":
            raise fail(
                f"{where}.hybrid_kv_cache_manager",
                "vLLM's hybrid KV cache manager is simulated on vllm_v1 replicas only, not "
                f"{policy}",
                value,
            )
        # A host tier is refused with the plan (hybrid_kv.resolve_hybrid), which knows
        # whether the model can run without the groups at all.

    def _check_expert_layout(self, where: str) -> None:
        """EP and attention DP as vLLM serves them: EP is 1 or every GPU of the replica's
        TP x DP (vLLM sets it so). DP without EP is what vLLM 0.33 runs for
        ``--data-parallel-size`` without ``--enable-expert-parallel``: the experts as one
        TP group over DP x TP GPUs (``FusedMoEParallelConfig.make`` with ``use_ep`` false),
        each rank's tokens all-gathered across the DP ranks and reduce-scattered back
        (``AgRsAll2AllManager``); the planner and predictors model it. ``where`` is
        ``replica`` or ``cluster.decode`` (the decode pool's resolved layout). Whether the
        model has experts for EP to split is checked with the model (the planner)."""
        ep, dp, tp = self.expert_parallel_size, self.data_parallel_size, self.tensor_parallel_size
        check_key_int(f"{where}.expert_parallel_size", ep, low=1, high=512)
        check_key_int(f"{where}.data_parallel_size", dp, low=1, high=512)
        if ep > 1 and ep != tp * dp:
            raise fail(
                f"{where}.expert_parallel_size",
                f"must be 1 (experts split by TP) or tensor_parallel_size x data_parallel_size "
                f"= {tp} x {dp} = {tp * dp} (vLLM's --enable-expert-parallel spreads the experts "
                f"over every GPU of the replica), got {ep}",
                ep,
            )

    def _check_draft_knobs(self, where: str) -> None:
        """``pad_spec_decode`` and ``cache_accepted_drafts`` shape speculative steps: on a
        ``vllm_v1`` replica without ``[replica.speculative]`` they would change nothing."""
        if self.scheduler.policy != "vllm_v1" or self.speculative.enabled:
            return
        given, default = self.scheduler.vllm_v1, default_vllm_v1()
        for name in ("pad_spec_decode", "cache_accepted_drafts"):
            value = getattr(given, name)
            if value != getattr(default, name):
                raise fail(
                    f"{where}.scheduler.vllm_v1.{name}",
                    f"shapes speculative steps only: without [replica.speculative] (a method) it "
                    f"would change nothing; leave it at {getattr(default, name)!r}",
                    value,
                )

    def _check_kv_offload(self, where: str) -> None:
        """The tier holds cached blocks of vLLM V1's block pool: it needs ``vllm_v1`` with
        prefix caching on the block-hash pool; its size comes from ``kv_offload``."""
        scheduler = self.scheduler
        if self.kv_offload is None:
            if scheduler.section == "vllm_v1" and scheduler.vllm_v1.host_num_blocks:
                raise fail(
                    f"{where}.scheduler.vllm_v1.host_num_blocks",
                    "sizes a host tier, which needs a [replica.kv_offload] section (its link); "
                    "set kv_offload.host_memory_gb instead",
                    scheduler.vllm_v1.host_num_blocks,
                )
            return
        self.kv_offload.check(f"{where}.kv_offload")
        if scheduler.policy != "vllm_v1":
            raise fail(
                f"{where}.kv_offload",
                f"a host-memory tier is simulated on vllm_v1 replicas only, not {scheduler.policy}",
                scheduler.policy,
            )
        c = scheduler.vllm_v1
        if not c.enable_prefix_caching or c.prefix_cache != "block_hash":
            raise fail(
                f"{where}.kv_offload",
                "a host-memory tier holds cached blocks: it needs "
                "scheduler.vllm_v1.enable_prefix_caching = true with prefix_cache = "
                f"'block_hash', got {c.enable_prefix_caching} / {c.prefix_cache!r}",
                "set",
            )
