"""``[replica.lora]``: multi-LoRA serving on ``vllm_v1`` replicas, in vLLM's words
(``LoRAConfig``: ``max_loras``, ``max_cpu_loras``, ``max_lora_rank``), and what follows
from it and the model (``docs/lora.md``):

- the bytes one GPU copies to load one adapter (``adapter_bytes``: rank x the adapted
  linears' dimensions, tensor-parallel shards, one pipeline stage's layers, the dtype);
- the LoRA operation every compiled predictor gains (``lora_op``): per adapted linear,
  shrink and expand cost ``2 * max_lora_rank * (d_in + d_out)`` FLOPs per LoRA token, and
  each distinct adapter's weights are read once per batch (punica/SGMV kernels, which run
  at the slot rank ``max_lora_rank``).
"""

from __future__ import annotations

import dataclasses
import math

from tokenyard._checks import check_key_int, check_key_number, fail
from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.predictor.compiled import CompiledOp, RooflineCost
from tokenyard.predictor.roofline import Efficiencies

__all__ = [
    "LORA_MODULES",
    "LoraConfig",
    "adapter_bytes",
    "host_to_device_bytes_per_s",
    "lora_op",
    "slot_bytes",
]

#: The linears an adapter may target (Llama names), each as (d_in, d_out, row_parallel)
#: of the model; row-parallel linears shard their input under tensor parallelism.
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
#: Fraction of the PCIe link a pinned host-to-GPU copy reaches (about 25 of 32 GB/s on
#: Gen4 x16, 50 of 64 on Gen5, as CUDA's bandwidthTest reports).
PCIE_EFFICIENCY = 0.8
#: Bytes per adapter weight by dtype.
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def host_to_device_bytes_per_s(gbps: float, device: DeviceSpec, key: str) -> float:
    """One GPU's host-to-device copy rate: ``gbps`` if set (> 0), else the catalog's
    ``host_link_gbps`` x ``PCIE_EFFICIENCY``; a GPU the catalog gives no host link is a
    ConfigError naming ``key``."""
    if gbps > 0:
        return gbps * 1e9
    if device.host_link_gbps <= 0:
        raise fail(
            key,
            f"the catalog does not know {device.name}'s host link (host_link_gbps); set it, "
            f"got {gbps}",
            gbps,
        )
    return device.host_link_gbps * PCIE_EFFICIENCY * 1e9


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """vLLM's LoRA knobs and the adapters' shape. ``rank`` is the adapters' own (what a
    load copies); ``max_lora_rank`` the GPU slots' (what the kernels compute over)."""

    #: Adapters in GPU slots; a batch never holds more distinct ones (vLLM's gate).
    max_loras: int = 1
    #: Adapters cached in host memory; 0 = ``max_loras`` (vLLM's default).
    max_cpu_loras: int = 0
    max_lora_rank: int = 16
    #: The adapters' rank; 0 = ``max_lora_rank``.
    rank: int = 0
    target_modules: tuple[str, ...] = LORA_MODULES
    #: The adapters' dtype; ``auto`` = the weights' compute dtype (bf16 unless fp16/fp32).
    lora_dtype: str = "auto"
    #: Host-to-GPU copy bandwidth in GB/s; 0 = the device's ``host_link_gbps`` x 0.8.
    host_to_device_gbps: float = 0.0
    #: Disk-to-host read bandwidth in GB/s (an NVMe drive's order of magnitude).
    disk_gbps: float = 2.0

    @property
    def cpu_loras(self) -> int:
        return self.max_cpu_loras or self.max_loras

    @property
    def adapter_rank(self) -> int:
        return self.rank or self.max_lora_rank

    def check(self, where: str) -> None:
        check_key_int(f"{where}.max_loras", self.max_loras, low=1, high=1024)
        check_key_int(f"{where}.max_cpu_loras", self.max_cpu_loras, low=0, high=1 << 20)
        if self.max_cpu_loras and self.max_cpu_loras < self.max_loras:
            raise fail(
                f"{where}.max_cpu_loras",
                f"must be >= max_loras = {self.max_loras} (or 0), got {self.max_cpu_loras}",
                self.max_cpu_loras,
            )
        check_key_int(f"{where}.max_lora_rank", self.max_lora_rank, low=1, high=1024)
        check_key_int(f"{where}.rank", self.rank, low=0, high=self.max_lora_rank)
        modules = self.target_modules
        if not modules or len(set(modules)) != len(modules) or set(modules) - set(LORA_MODULES):
            raise fail(
                f"{where}.target_modules",
                f"must be distinct names among {', '.join(LORA_MODULES)}, got {list(modules)}",
                modules,
            )
        if self.lora_dtype != "auto" and self.lora_dtype not in _DTYPE_BYTES:
            raise fail(
                f"{where}.lora_dtype",
                f"must be auto or one of {', '.join(_DTYPE_BYTES)}, got {self.lora_dtype!r}",
                self.lora_dtype,
            )
        check_key_number(f"{where}.host_to_device_gbps", self.host_to_device_gbps, low=0, high=1e6)
        check_key_number(f"{where}.disk_gbps", self.disk_gbps, low=0, high=1e6, low_open=True)

    def dtype_bytes(self, weight_dtype: str) -> int:
        """Bytes per adapter weight (``auto``: the weights' if 16 or 32 bits, else bf16)."""
        name = self.lora_dtype if self.lora_dtype != "auto" else weight_dtype
        return _DTYPE_BYTES.get(name, 2)

    def host_to_device_bytes_per_s(self, device: DeviceSpec) -> float:
        return host_to_device_bytes_per_s(
            self.host_to_device_gbps, device, "replica.lora.host_to_device_gbps"
        )

    def core(
        self, model: ModelSpec, device: DeviceSpec, weight_dtype: str, tp: int, pp: int
    ) -> dict[str, float]:
        """The mapping ``_core.SimConfig(lora=...)`` takes."""
        return {
            "max_loras": self.max_loras,
            "max_cpu_loras": self.cpu_loras,
            "adapter_bytes": adapter_bytes(self, model, weight_dtype, tp, pp),
            "host_to_device_bytes_per_s": self.host_to_device_bytes_per_s(device),
            "disk_bytes_per_s": self.disk_gbps * 1e9,
        }


def _modules(lora: LoraConfig, model: ModelSpec) -> list[tuple[int, int, bool]]:
    """(d_in, d_out, row_parallel) of each adapted linear of one layer."""
    if model.num_experts > 1 and set(lora.target_modules) & set(_MLP_MODULES):
        raise fail(
            "replica.lora.target_modules",
            f"adapters on the experts of a mixture of experts ({model.name}) are not "
            f"modelled; target the attention projections only, got {list(lora.target_modules)}",
            lora.target_modules,
        )
    h, q, kv = (
        model.hidden_size,
        model.num_heads * model.head_dim,
        model.num_kv_heads * model.head_dim,
    )
    shapes = {
        "q_proj": (h, q, False),
        "k_proj": (h, kv, False),
        "v_proj": (h, kv, False),
        "o_proj": (q, h, True),
        "gate_proj": (h, model.intermediate_size, False),
        "up_proj": (h, model.intermediate_size, False),
        "down_proj": (model.intermediate_size, h, True),
    }
    return [shapes[name] for name in lora.target_modules]


def _per_gpu(d_in: int, d_out: int, row_parallel: bool, tp: int) -> tuple[float, float]:
    """One GPU's share of a linear's (A input, B output) dims: column-parallel linears
    shard B's output, row-parallel ones A's input (vLLM's non-fully-sharded LoRA)."""
    return (d_in / tp, float(d_out)) if row_parallel else (float(d_in), d_out / tp)


def adapter_bytes(
    lora: LoraConfig, model: ModelSpec, weight_dtype: str, tp: int, pp: int, rank: int = 0
) -> float:
    """Bytes one GPU of one pipeline stage copies to load one adapter of rank ``rank``
    (default: the adapters' ``rank``)."""
    per_layer = sum(
        sum(_per_gpu(d_in, d_out, row, tp)) for d_in, d_out, row in _modules(lora, model)
    )
    layers = model.num_layers / pp
    return (rank or lora.adapter_rank) * per_layer * layers * lora.dtype_bytes(weight_dtype)


def slot_bytes(lora: LoraConfig, model: ModelSpec, weight_dtype: str, tp: int, pp: int) -> int:
    """Memory one GPU holds for the ``max_loras`` slots, each sized for ``max_lora_rank``
    (vLLM allocates them before it sizes the KV cache)."""
    one = adapter_bytes(lora, model, weight_dtype, tp, pp, rank=lora.max_lora_rank)
    return math.ceil(lora.max_loras * one)


def lora_op(
    lora: LoraConfig,
    model: ModelSpec,
    device: DeviceSpec,
    weight_dtype: str,
    tp: int,
    efficiencies: Efficiencies,
) -> CompiledOp:
    """The shrink and expand kernels of one layer's adapted linears, as a roofline: FLOPs
    per LoRA token, bytes per distinct adapter (its slot's weights) and per LoRA token (the
    input read, the rank-sized intermediate written and read, the output read and written)."""
    r = lora.max_lora_rank
    b = lora.dtype_bytes(weight_dtype)
    flops = weights = activations = 0.0
    for d_in, d_out, row in _modules(lora, model):
        a_in, b_out = _per_gpu(d_in, d_out, row, tp)
        flops += 2.0 * r * (a_in + b_out)
        weights += r * (a_in + b_out) * b
        activations += (a_in + 2.0 * r + 2.0 * b_out) * b
    cost = RooflineCost(
        flops={"num_lora_tokens": flops},
        bytes={"num_lora_tokens": activations, "num_lora_adapters": weights},
        flops_per_s=device.dense_bf16_tflops * 1e12 * efficiencies.gemm,
        bytes_per_s=device.memory_bandwidth_gbps * 1e9 * efficiencies.memory,
    )
    return CompiledOp("lora", "layer", "num_lora_tokens", cost, 1.0, "roofline (lora)")
