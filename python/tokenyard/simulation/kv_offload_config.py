"""``[replica.kv_offload]``: a host-memory KV tier on each ``vllm_v1`` replica (vLLM's
offloading connector, LMCache's CPU backend, SGLang's HiCache), and what follows from it
and the replica's layout (``docs/disaggregation.md#host-memory-kv-tier``):

- the tier's size in blocks: ``host_memory_gb`` over the bytes one block takes on every GPU
  of the replica (each GPU offloads its own layers and KV heads);
- the load time per token: one GPU's share of a token's KV over its PCIe link (the GPUs of
  a replica load their shards at once), plus a fixed latency per load.
"""

from __future__ import annotations

import dataclasses

from tokenyard._checks import check_key_number, fail
from tokenyard.catalog import DeviceSpec
from tokenyard.simulation.lora_config import host_to_device_bytes_per_s

__all__ = ["DEFAULT_HOST_HIT_WEIGHT", "KvOffloadConfig"]

#: ``host_hit_weight`` when unset: a host-held token counts half a GPU-held one.
DEFAULT_HOST_HIT_WEIGHT = 0.5


@dataclasses.dataclass(frozen=True, kw_only=True)
class KvOffloadConfig:
    """A host-memory tier that cached KV blocks evicted from the GPUs are offloaded to;
    a prefix hit that continues there waits for those blocks to be copied back."""

    #: Host memory for KV, per replica, in GB (10^9 bytes). Required.
    host_memory_gb: float = 0.0
    #: One GPU's host-to-device bandwidth in GB/s; 0 = the catalog's ``host_link_gbps``
    #: (the PCIe generation's) x 0.8, what a pinned copy reaches.
    host_to_device_gbps: float = 0.0
    #: Fixed cost of one load (a kernel launch and a transfer set-up), in microseconds.
    latency_us: float = 10.0
    #: ``prefix_affinity`` routing: a cached token in host memory is worth this many cached
    #: on a GPU (it still has to cross PCIe, but costs no compute). Unset:
    #: ``DEFAULT_HOST_HIT_WEIGHT``. Refused with another router, which would ignore it.
    host_hit_weight: float | None = None

    def check(self, where: str) -> None:
        check_key_number(f"{where}.host_memory_gb", self.host_memory_gb, low=0, high=1e7)
        if self.host_memory_gb <= 0:
            raise fail(
                f"{where}.host_memory_gb",
                f"must be > 0 (the tier's host memory per replica, in GB), got "
                f"{self.host_memory_gb}",
                self.host_memory_gb,
            )
        check_key_number(f"{where}.host_to_device_gbps", self.host_to_device_gbps, low=0, high=1e6)
        check_key_number(f"{where}.latency_us", self.latency_us, low=0, high=1e9)
        if self.host_hit_weight is not None:
            check_key_number(f"{where}.host_hit_weight", self.host_hit_weight, low=0, high=1)

    def effective_host_hit_weight(self) -> float:
        """``host_hit_weight``, or ``DEFAULT_HOST_HIT_WEIGHT`` when unset."""
        if self.host_hit_weight is None:
            return DEFAULT_HOST_HIT_WEIGHT
        return self.host_hit_weight

    def host_to_device_bytes_per_s(self, device: DeviceSpec) -> float:
        return host_to_device_bytes_per_s(
            self.host_to_device_gbps, device, "replica.kv_offload.host_to_device_gbps"
        )

    def num_host_blocks(
        self, kv_bytes_per_token_per_gpu: float, num_gpus: int, block_size: int
    ) -> int:
        """Blocks of ``block_size`` tokens that ``host_memory_gb`` holds for a replica of
        ``num_gpus`` GPUs (each GPU's share of a token is ``kv_bytes_per_token_per_gpu``)."""
        block_bytes = kv_bytes_per_token_per_gpu * num_gpus * block_size
        blocks = int(self.host_memory_gb * 1e9 // block_bytes)
        if blocks < 1:
            raise fail(
                "replica.kv_offload.host_memory_gb",
                f"holds no block: one block of {block_size} tokens takes "
                f"{block_bytes / 1e9:.6f} GB over the replica's {num_gpus} GPUs",
                self.host_memory_gb,
            )
        return blocks

    def link(self, kv_bytes_per_token_per_gpu: float, device: DeviceSpec) -> dict[str, float]:
        """The core's host link: ``{seconds_per_token, latency_s}``."""
        return {
            "seconds_per_token": kv_bytes_per_token_per_gpu
            / self.host_to_device_bytes_per_s(device),
            "latency_s": self.latency_us * 1e-6,
        }
