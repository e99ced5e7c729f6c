"""Disaggregated serving's config (``docs/disaggregation.md``): ``[cluster.decode]`` makes
``cluster.num_replicas`` the prefill pool and adds a decode pool with its own replicas,
layout and scheduler; ``[cluster.kv_transfer]`` overrides the catalog's link figures.

The decode pool serves the same model with the same dtypes (its KV must be the prefill
pool's); device, TP, PP, EP, attention DP, memory margin and the ``vllm_v1`` scheduler
section may differ.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tokenyard._checks import check_key_int, check_key_number, fail
from tokenyard.simulation.kv_offload_config import KvOffloadConfig
from tokenyard.simulation.planner import (
    KvGroup,
    indexer_bytes_per_token_layer,
    kv_groups,
    kv_values_per_token_layer,
)
from tokenyard.simulation.replica_config import ReplicaConfig
from tokenyard.simulation.scheduler_config import MAX_REPLICAS, ReplicaSchedulerConfig

if TYPE_CHECKING:
    from tokenyard.catalog import DeviceSpec, ModelSpec

__all__ = [
    "DecodePoolConfig",
    "KvTransferConfig",
    "check_head_layouts",
    "decode_schedulers",
    "link_figures",
]

#: Routers a decode pool may use (plugins route arrivals only).
DECODE_ROUTERS = ("round_robin", "lor", "random", "least_kv_load", "power_of_two")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeRouterConfig:
    """Which decode replica takes a request whose prefill finished."""

    policy: str = "least_kv_load"

    def check(self, where: str) -> None:
        if self.policy not in DECODE_ROUTERS:
            raise fail(
                f"{where}.policy",
                f"unknown decode router; expected one of {', '.join(DECODE_ROUTERS)}",
                self.policy,
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodePoolConfig:
    """``[cluster.decode]``: the decode pool. Unset layout keys take the replica's."""

    num_replicas: int = 1
    device: str | None = None
    tensor_parallel_size: int | None = None
    num_pipeline_stages: int | None = None
    #: EP and attention DP as ``replica.expert_parallel_size`` / ``data_parallel_size``
    #: (the same rules: DP needs EP = TP x DP); a decode replica is DP ranks, each its own
    #: scheduler and KV cache, as vLLM's wide-EP decode instances are.
    expert_parallel_size: int | None = None
    data_parallel_size: int | None = None
    memory_margin_fraction: float | None = None
    global_scheduler: DecodeRouterConfig = dataclasses.field(default_factory=DecodeRouterConfig)
    #: The decode replicas' scheduler (``vllm_v1``); unset: the prefill pool's.
    scheduler: ReplicaSchedulerConfig | None = None
    #: The decode replicas' host-memory KV tier (their own host memory and link); unset:
    #: the prefill pool's ``[replica.kv_offload]``, if any.
    kv_offload: KvOffloadConfig | None = None

    def check(self, where: str) -> None:
        check_key_int(f"{where}.num_replicas", self.num_replicas, low=1, high=MAX_REPLICAS)
        if self.tensor_parallel_size is not None:
            check_key_int(
                f"{where}.tensor_parallel_size", self.tensor_parallel_size, low=1, high=512
            )
        for key in ("num_pipeline_stages", "expert_parallel_size", "data_parallel_size"):
            value = getattr(self, key)
            if value is not None:
                check_key_int(f"{where}.{key}", value, low=1, high=512)
        if self.memory_margin_fraction is not None and not 0 <= self.memory_margin_fraction < 1:
            raise fail(
                f"{where}.memory_margin_fraction",
                f"must be in [0, 1), got {self.memory_margin_fraction}",
                self.memory_margin_fraction,
            )
        self.global_scheduler.check(f"{where}.global_scheduler")
        if self.scheduler is not None:
            self.scheduler.check(f"{where}.scheduler")
        if self.kv_offload is not None:
            self.kv_offload.check(f"{where}.kv_offload")
            if self.kv_offload.host_hit_weight is not None:
                # Decode routers place requests whose KV arrives with them: no prefix index.
                raise fail(
                    f"{where}.kv_offload.host_hit_weight",
                    "weighs host-held tokens for prefix_affinity routing, and decode pools are "
                    "not routed by prefix; it would change nothing",
                    self.kv_offload.host_hit_weight,
                )

    def resolve(self, replica: ReplicaConfig) -> ReplicaConfig:
        """``replica`` as the decode pool runs it: the pool's device, layout, margin,
        scheduler and host tier, each unset one the replica's (same model and dtypes)."""

        def either(value: Any, default: Any) -> Any:
            return default if value is None else value

        return dataclasses.replace(
            replica,
            device=either(self.device, replica.device),
            tensor_parallel_size=either(self.tensor_parallel_size, replica.tensor_parallel_size),
            num_pipeline_stages=either(self.num_pipeline_stages, replica.num_pipeline_stages),
            expert_parallel_size=either(self.expert_parallel_size, replica.expert_parallel_size),
            data_parallel_size=either(self.data_parallel_size, replica.data_parallel_size),
            memory_margin_fraction=either(
                self.memory_margin_fraction, replica.memory_margin_fraction
            ),
            scheduler=either(self.scheduler, replica.scheduler),
            kv_offload=either(self.kv_offload, replica.kv_offload),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class KvTransferConfig:
    """``[cluster.kv_transfer]``: the links KV crosses. Unset figures come from the catalog:
    NVLink at half the device's ``interconnect_gbps`` (which counts both directions) and
    its latency; the network at the device's ``network_gbps`` / ``network_latency_us``.
    Bandwidths are one GPU's, in GB/s, one direction."""

    gpus_per_node: int = 8
    nvlink_gbps: float | None = None
    nvlink_latency_us: float | None = None
    network_gbps: float | None = None
    network_latency_us: float | None = None

    def check(self, where: str) -> None:
        check_key_int(f"{where}.gpus_per_node", self.gpus_per_node, low=1, high=1024)
        for key in ("nvlink_gbps", "network_gbps"):
            value = getattr(self, key)
            if value is not None:
                check_key_number(f"{where}.{key}", value, low=1e-9, high=1e6)
        for key in ("nvlink_latency_us", "network_latency_us"):
            value = getattr(self, key)
            if value is not None:
                check_key_number(f"{where}.{key}", value, low=0, high=1e9)


def link_figures(
    transfer: KvTransferConfig, prefill: DeviceSpec, decode: DeviceSpec
) -> dict[str, float]:
    """The link's figures, the catalog's where the config gives none (the slower of the two
    devices). A network bandwidth nobody gives is a ConfigError naming the key."""
    network = transfer.network_gbps
    if network is None:
        known = [d.network_gbps for d in (prefill, decode)]
        if min(known) <= 0:
            raise fail(
                "cluster.kv_transfer.network_gbps",
                f"the catalog has no network bandwidth for {prefill.name} / {decode.name}; "
                "set it (one GPU's NIC in GB/s, e.g. 50 for 400 Gb/s InfiniBand)",
                None,
            )
        network = min(known)

    def pick(given: float | None, catalog: float) -> float:
        return catalog if given is None else given

    return {
        "nvlink_gbps": pick(
            transfer.nvlink_gbps, min(prefill.interconnect_gbps, decode.interconnect_gbps) / 2
        ),
        "nvlink_latency_s": pick(
            transfer.nvlink_latency_us,
            max(prefill.interconnect_latency_us, decode.interconnect_latency_us),
        )
        * 1e-6,
        "network_gbps": network,
        "network_latency_s": pick(
            transfer.network_latency_us,
            max(prefill.network_latency_us, decode.network_latency_us),
        )
        * 1e-6,
    }


def check_head_layouts(model: ModelSpec, prefill_tp: int, decode_tp: int) -> None:
    """KV moves head by head: each side's TP must split the KV heads evenly, or each rank
    must hold whole copies (TP a multiple of the heads), and one TP must divide the other,
    so every receiving rank's heads come whole from the sending ranks."""
    for key, tp in (
        ("replica.tensor_parallel_size", prefill_tp),
        ("cluster.decode.tensor_parallel_size", decode_tp),
    ):
        heads = model.num_kv_heads
        if heads % tp and tp % heads:
            raise fail(
                key,
                f"{model.name}'s {heads} KV heads do not split over TP {tp}, so its KV "
                "cannot be resharded between the pools",
                tp,
            )
    if max(prefill_tp, decode_tp) % min(prefill_tp, decode_tp):
        raise fail(
            "cluster.decode.tensor_parallel_size",
            f"TP {decode_tp} and the prefill pool's TP {prefill_tp}: one must divide the other "
            "for the KV heads to move whole between ranks",
            decode_tp,
        )


def kv_bytes_per_token(model: ModelSpec, kv_bytes: float) -> float:
    """One token's KV, every attention layer and KV head (an MLA layer's one latent; a
    layer's own shape where the model has several): what crosses the link. Linear
    attention layers cache no tokens (their state is per request: refused by
    ``check_transferable``)."""
    values = sum(kv_values_per_token_layer(model, 1, mixer) for mixer in model.mixers())
    indexer = sum(indexer_bytes_per_token_layer(model, mixer) for mixer in model.mixers())
    return kv_bytes * values + indexer


def hybrid_link_terms(model: ModelSpec, kv_bytes: int, block_size: int) -> dict[str, Any]:
    """What crosses the link per request under vLLM's hybrid KV cache manager, whose
    connector (NixlConnector, ``SupportsHMA``) moves each KV cache group's blocks of the
    request: every token of the full-attention layers (``kv_bytes_per_token``), at most a
    window and a block of ``block_size`` tokens of the sliding-window layers (their earlier
    blocks are null blocks; several windows counted at the widest), and the
    linear-attention state once (``state_bytes``, unpadded). One copy of the KV, as
    ``kv_bytes_per_token`` counts it. ``kv_bytes``: bytes per KV value (``dtype_bytes``'
    integer); ``block_size``: the sliding-window groups' block size (with groups of
    different block sizes, Gemma 4's, theirs: ``window_block_size``).

    The connector moves each group's block ids (NixlConnector's
    ``request_finished_all_groups`` hands ``request_finished`` one list per group,
    ``distributed/kv_transfer/kv_connector/v1/nixl/connector.py`` and ``pull_scheduler.py``)
    as whole blocks of the group's page (``block_len_per_layer``, ``nixl/base_worker.py``):
    for an ``L``-token prompt Gemma 4's ``ceil(L / 32)`` full-attention blocks and a
    window's ``ceil((W - 1) / 16) + 1``. The link prices tokens, so the full-attention term
    leaves out the unfilled tail of the last block (under one block a group per request).

    Not modelled: for a model with Mamba layers (and a multi-token MTP lookahead) vLLM
    0.33's NixlConnector has the prefill side stop one prompt token short (the lookahead's
    less one) and the decode side recompute it (``_prefill_backoff``,
    ``distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py``): here the prefill
    pool computes and the link moves the whole prompt, the decode pool computes none."""
    groups = kv_groups(model, 1, 1, kv_bytes)
    windowed = [g for g in groups if g.window]
    return {
        "kv_bytes_per_token": sum(
            g.bytes_per_token for g in groups if not g.window and not g.state_bytes_per_request
        ),
        "window_tokens": max(g.window for g in windowed) + block_size if windowed else 0,
        "window_bytes_per_token": float(sum(g.bytes_per_token for g in windowed)),
        "state_bytes": float(sum(g.state_bytes_per_request for g in groups)),
    }


def window_block_size(groups: tuple[KvGroup, ...], sizes: tuple[int, ...], block_size: int) -> int:
    """The block size of a plan's sliding-window groups: with groups of different block sizes
    (``MemoryPlan.kv_group_block_sizes``) the largest among theirs, else ``block_size``."""
    if not sizes:
        return block_size
    windowed = [size for g, size in zip(groups, sizes, strict=True) if g.window]
    return max(windowed, default=block_size)


def check_transferable(model: ModelSpec) -> None:
    """Without vLLM's hybrid KV cache manager a disaggregated pool moves each request's KV
    per token; a model with linear attention state (GDN, Mamba2: tens of MB per request)
    moves that only as Mamba groups (``hybrid_link_terms``): refused here rather than priced
    without it."""
    if model.linear is not None:
        raise fail(
            "cluster.decode",
            f"{model.name} keeps linear-attention state per request, which moves between "
            "pools only as Mamba groups of vLLM's hybrid KV cache manager (a vllm_v1 "
            "replica with replica.hybrid_kv_cache_manager unset or true, no host tier, no "
            "prefix_affinity routing)",
            model.name,
        )


def describe(pool: DecodePoolConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """The decode pool as the summary's config describes it."""
    return {"num_replicas": pool.num_replicas, "router": pool.global_scheduler.policy, **fields}


def decode_schedulers(described: dict[str, Any]) -> int:
    """The schedulers a run's decode pool ran, from the summary's ``config.decode``: one
    per attention DP rank of each decode replica (``data_parallel_size`` is absent from
    results written before the pool had it: 1)."""
    return int(described["num_replicas"]) * int(described.get("data_parallel_size", 1))
